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


@lru_cache(maxsize=None)
def _key(path: str, size: int, mtime_ns: int) -> str:
    return f"{Path(path).stem}-{file_sha256(path)[:16]}"


def file_key(path: str | Path) -> str:
    """The name a user's GGUF file is converted under: ``<stem>-<first 16 hex digits of
    its SHA-256>`` (another file, or the same file edited, gets another folder)."""
    p = Path(path).expanduser()
    st = p.stat()
    return _key(str(p), st.st_size, st.st_mtime_ns)


def converted_folder(path: str | Path, root: str | Path = LMS_DIR) -> Path:
    """Where the workflow converts the GGUF file at ``path``: ``<root>/<file_key>/model``."""
    return Path(root) / file_key(path) / "model"


def is_gguf_path(name: str | Path) -> bool:
    return str(name).lower().endswith(".gguf")


def user_files(names) -> dict[str, str]:
    """{:func:`file_key`: path} of the GGUF files among model names that exist here (the
    workflow converts each once; an absent one stays a name that a rule reports as not
    found)."""
    return {file_key(n): str(n) for n in names if is_gguf_path(n) and Path(n).expanduser().is_file()}


def _hub_snapshot(repo_id: str, repo_type: str | None = None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except Exception:  # not in the cache (or no hub library): absent
        return None


def find_model(name_or_path: str, search_paths=None) -> Path | None:
    """The local folder of a model (an existing path, ``<search path>/<name>``, or the
    Hugging Face cache's snapshot), or None. A GGUF file (``*.gguf``): the folder the
    workflow converted it into (:func:`gguf_files.converted_folder`), None until then."""
    p = Path(name_or_path).expanduser()
    if is_gguf_path(p):
        folder = converted_folder(p) if p.is_file() else None
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
        if is_gguf_path(p):  # the file itself: its converted folder is a rule's input, made later
            st = p.stat() if p.is_file() else None
            lines.append(f"model {m}: " + (f"{p}:{st.st_size}:{st.st_mtime_ns}" if st else "absent"))
            continue
        f = find_model(str(m), search_paths)
        lines.append(f"model {m}: " + (f"{f} " + " ".join(_files(f, MODEL_FILES)) if f else "absent"))
    for d in datasets:
        f = find_dataset(str(d), search_paths)
        lines.append(
            f"dataset {d}: " + (f"{f} " + " ".join(_files(f, DATASET_FILES, recursive=True)) if f else "absent")
        )
    return "\n".join(lines)
