"""Where a model's weights or a MIB dataset lie on this machine, found without torch and
without a download: a path, a folder under a search path, or the local Hugging Face cache.

A GGUF file (``*.gguf``) is a model once the workflow has converted it (rule
``lm_convert``, :mod:`selfrepair.core.gguf_files`) into ``results/lms/<file_key>/model``:
:func:`find_model` gives that folder.

``presence`` summarizes what is there (file names, sizes and modification times) in one
string. The real-model rules (``coax_real``, ``gim_mib``) take it as a parameter, so a
run whose models were absent reruns once their weights (or a dataset) arrive, or when
they change, instead of keeping its cached "not run".
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

MODEL_FILES = ("config.json", "*.safetensors", "pytorch_model*.bin", "tokenizer.json", "tokenizer_config.json")
DATASET_FILES = ("*.parquet", "*.jsonl", "*.json")
LMS_DIR = "results/lms"  # where the workflow converts GGUF files (rule lm_convert), in its working directory


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


# a converted folder's name keeps a file name's letters, digits and ._+- (any other
# character, a brace or a space, becomes _): a path Snakemake can take as a rule's input
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def safe_stem(path: str | Path) -> str:
    """A GGUF file's name without ``.gguf``, each character other than a letter, a digit or
    ``._+-`` replaced by ``_`` (``model{v2}.gguf``: ``model_v2_``)."""
    return _UNSAFE.sub("_", Path(path).stem)


@lru_cache(maxsize=None)
def _key(path: str, size: int, mtime_ns: int) -> str:
    return f"{safe_stem(path)}-{file_sha256(path)[:16]}"


def file_key(path: str | Path) -> str:
    """The name a user's GGUF file is converted under: ``<stem>-<first 16 hex digits of
    its SHA-256>`` (another file, or the same file edited, gets another folder), the stem
    as :func:`safe_stem` gives it."""
    p = Path(path).expanduser()
    st = p.stat()
    return _key(str(p), st.st_size, st.st_mtime_ns)


def converted_folder(path: str | Path, root: str | Path = LMS_DIR) -> Path:
    """Where the workflow converts the GGUF file at ``path``: ``<root>/<file_key>/model``."""
    return Path(root) / file_key(path) / "model"


def is_gguf_path(name: str | Path) -> bool:
    return str(name).lower().endswith(".gguf")


def _gguf_candidates(name: str | Path, search_paths=None) -> list[Path]:
    p = Path(name).expanduser()
    return [p] + ([] if p.is_absolute() else [Path(b).expanduser() / p for b in search_paths or []])


def gguf_file(name: str | Path, search_paths=None) -> Path | None:
    """The GGUF file a model name means, as a model folder is found: the path itself, else
    ``<search path>/<name>``; None when none of them is a file."""
    return next((c for c in _gguf_candidates(name, search_paths) if c.is_file()), None)


def recorded_conversion(name: str | Path, search_paths=None, root: str | Path = LMS_DIR) -> Path | None:
    """The folder the workflow converted a GGUF file into, found by its record
    (``selfrepair.json``'s ``source.file``) when the file itself is gone: the finished
    results made from it stand, and a rerun reads that folder. The newest, when the file
    was converted under several contents; None when there is none."""
    import json

    wanted = {str(c.resolve()) for c in _gguf_candidates(name, search_paths)}
    wanted |= {str(c.absolute()) for c in _gguf_candidates(name, search_paths)}  # a link, by its own path
    found = []
    for folder in Path(root).glob(f"{safe_stem(name)}-*/model"):
        try:
            rec = folder / "selfrepair.json"
            source = json.loads(rec.read_text()).get("source") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(source, dict) and {source.get("file"), source.get("path")} & wanted:
            found.append((rec.stat().st_mtime_ns, str(folder)))
    return Path(max(found)[1]) if found else None


def gguf_key(name: str | Path, search_paths=None) -> str | None:
    """The converted folder's name (:func:`file_key`) of a GGUF model name: of the file, or,
    the file gone, of the folder it was converted into (:func:`recorded_conversion`)."""
    f = gguf_file(name, search_paths)
    if f is not None:
        return file_key(f)
    folder = recorded_conversion(name, search_paths)
    return folder.parent.name if folder is not None else None


def user_files(names, search_paths=None) -> dict[str, str]:
    """{:func:`file_key`: path} of the GGUF files among model names that exist here (as
    paths or under ``search_paths``; the workflow converts each once; an absent one stays
    a name that a rule reports as not found)."""
    out = {}
    for n in names:
        f = gguf_file(n, search_paths) if is_gguf_path(n) else None
        if f is not None:
            out[file_key(f)] = str(f)
    return out


def named_files(named) -> tuple[dict[str, str], list[str]]:
    """({:func:`file_key`: path} of the GGUF files among (name, search paths, config key)
    triples, one line per file that cannot be read, naming its key and the way out): what
    the workflow converts, checked at parse, not a traceback there."""
    files, problems = {}, []
    for name, search_paths, where in named:
        try:
            files.update(user_files([name], search_paths))
        except OSError as err:
            problems.append(
                f"{where}: {name} cannot be read ({err.strerror or err}): make it readable, or name another model"
            )
    return files, problems


def gone_files(named) -> list[str]:
    """One line per GGUF model name, of (name, search paths, config key) triples, whose file
    is gone while the folder it was converted into is kept: what stands in for it."""
    out = []
    for name, search_paths, where in named:
        if not is_gguf_path(name) or gguf_file(name, search_paths) is not None:
            continue
        folder = recorded_conversion(name, search_paths)
        if folder is not None:
            out.append(
                f"{where}: {name} is gone; {folder}, converted from it, stands in for it: the results made "
                "from it are kept, and an analysis that reruns reads that folder (put the file back, or "
                "delete the folder to have the analyses say it is not found)"
            )
    return out


def _hub_snapshot(repo_id: str, repo_type: str | None = None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except Exception:  # not in the cache (or no hub library): absent
        return None


def find_model(name_or_path: str, search_paths=None) -> Path | None:
    """The local folder of a model (an existing path, ``<search path>/<name>``, or the
    Hugging Face cache's snapshot), or None. A GGUF file (``*.gguf``, as a path or under a
    search path): the folder the workflow converted it into (:func:`converted_folder`),
    None until then; the file gone, the folder its record names (:func:`recorded_conversion`)."""
    p = Path(name_or_path).expanduser()
    if is_gguf_path(p) and not p.is_dir():
        f = gguf_file(p, search_paths)
        folder = converted_folder(f) if f is not None else recorded_conversion(p, search_paths)
        return folder if folder is not None and folder.is_dir() else None
    if p.is_dir():
        return p
    for base in search_paths or []:
        q = Path(base).expanduser() / name_or_path
        if q.is_dir():
            return q
    return _hub_snapshot(name_or_path)


def find_dataset(name: str, search_paths=None) -> Path | None:
    """The local folder of MIB dataset ``name`` (``<search path>/<name>`` or
    ``<search path>/mib-bench__<name>``, or the cache's ``mib-bench/<name>``), or None."""
    for base in search_paths or []:
        for cand in (Path(base).expanduser() / name, Path(base).expanduser() / f"mib-bench__{name}"):
            if cand.is_dir():
                return cand
    return _hub_snapshot(f"mib-bench/{name}", repo_type="dataset")


def _files(folder: Path, patterns, recursive: bool = False) -> list[str]:
    out = []
    for pat in patterns:
        for f in sorted(folder.rglob(pat) if recursive else folder.glob(pat)):
            try:
                st = f.stat()
            except OSError:
                continue
            out.append(f"{f.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}")
    return out


def presence(models=(), datasets=(), search_paths=None) -> str:
    """One line per model and dataset: where it is and its files' sizes and modification
    times (a GGUF file's own), or 'absent'. Equal strings: nothing a real-model rule reads has come or gone."""
    lines = []
    for m in models:
        p = Path(str(m)).expanduser()
        if is_gguf_path(p) and not p.is_dir():  # what it converts into (a rule's input, made later)
            key = gguf_key(p, search_paths)  # by content: the same once the file is gone, its folder kept
            lines.append(f"model {m}: " + (f"GGUF {key}" if key else "absent"))
            continue
        f = find_model(str(m), search_paths)
        lines.append(f"model {m}: " + (f"{f} " + " ".join(_files(f, MODEL_FILES)) if f else "absent"))
    for d in datasets:
        f = find_dataset(str(d), search_paths)
        lines.append(
            f"dataset {d}: " + (f"{f} " + " ".join(_files(f, DATASET_FILES, recursive=True)) if f else "absent")
        )
    return "\n".join(lines)
