"""A model folder's files: the record ``save_model`` writes beside the weights
(``selfrepair.json``: every file's SHA-256 and the workflow job that made the model), the
checks every load makes on a folder (present, unchanged since the save, this folder's own
model, finite weights, weights that fit the architecture), and a folder's identity.

Split from :mod:`selfrepair.core.models`, which imports these names back (``models.X``
works as before).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


class ModelNotFound(FileNotFoundError):
    """Weights of a requested model are not on this machine."""


class CorruptCheckpoint(RuntimeError):
    """A checkpoint exists but cannot be read."""


class NonFiniteWeights(ValueError):
    """A checkpoint holds NaN or infinite values; ``file`` and ``tensor`` name the first."""

    def __init__(self, message: str, file: Path, tensor: str):
        super().__init__(message)
        self.file, self.tensor = file, tensor


MADE_KEY = "made_by"  # selfrepair.json: the workflow job that made the model (rule, wildcards, folder)


def made_by(job: dict, folder: Path) -> dict:
    """The provenance a workflow job records in the model it saves in ``folder``: its rule,
    wildcards and parameters' SHA-256, and the output folder the model is (``folder``, or
    the output it is renamed to: a ``<output>.partial`` folder saved first)."""
    here = os.path.abspath(str(folder))
    target = os.path.normpath(str(folder))
    for out in job.get("outputs", []):
        if here in (os.path.abspath(out), os.path.abspath(out) + ".partial"):
            target = out
            break
    return {
        "rule": job["rule"],
        "wildcards": job["wildcards"],
        "params_sha256": job["params_sha256"],
        "folder": Path(target).as_posix(),
    }


FILES_KEY = "files_sha256"  # selfrepair.json: {file name: SHA-256} of every file save_model wrote
WEIGHTS_KEY = "weights_sha256"  # the older record: the weights files only (folders saved before FILES_KEY)
# The files of a model folder that the record covers (config, weights, tokenizer; the
# tokenizer's chat template, chat_template.jinja, which transformers saves beside it).
_MODEL_FILES = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.jinja")
# A weights file that appears after the save (another shard, a .bin beside the safetensors)
# changes what loads and is refused too; a tokenizer added later (tests and users save one
# beside an existing model) is not in the record and is not checked.
_WEIGHT_FILES = ("*.safetensors", "*.bin")


def _recordable(folder: Path) -> list[Path]:
    return sorted({f for pat in _MODEL_FILES for f in folder.glob(pat) if f.is_file() and f.name != "selfrepair.json"})


def _sha256(f: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


class WeightsChanged(RuntimeError):
    """A file of a model folder (its config, weights or tokenizer) differs from the one
    ``save_model`` wrote there, is gone, or appeared since.

    Not a CorruptCheckpoint: callers that turn an unreadable model into a "not run" status
    must not do so for an edited one."""


def check_unchanged(folder: str | Path) -> None:
    """Raise WeightsChanged, naming the folder, the file and the fix, if a file that
    ``save_model`` recorded in ``selfrepair.json`` no longer has its SHA-256 or is gone,
    or (for a ``files_sha256`` record) a weights file appeared that the save did not write.

    Folders with the older ``weights_sha256`` record have their weights checked only.
    Folders without a record (saved before the record existed, a Hugging Face cache
    snapshot) are not checked: they load as before."""
    folder = Path(folder)
    meta = read_meta(folder)
    key = FILES_KEY if FILES_KEY in meta else WEIGHTS_KEY
    recorded = meta.get(key)
    if recorded is None:
        return  # an older folder, saved before save_model recorded hashes
    if not isinstance(recorded, dict):
        raise CorruptCheckpoint(
            f"{folder / 'selfrepair.json'}: key {key!r} is a {type(recorded).__name__}, "
            "not an object of file names and SHA-256 digests"
        )
    fix = remake_fix(folder, meta)
    for name, want in sorted(recorded.items()):
        f = folder / name
        now = _sha256(f) if f.exists() else "(file missing)"
        if now != want:
            raise WeightsChanged(
                f"model folder {folder} changed since it was saved: {name} sha256 {want} recorded "
                f"in selfrepair.json, {now} now. {fix}"
            )
    if key == FILES_KEY:
        new = sorted({f.name for pat in _WEIGHT_FILES for f in folder.glob(pat)} - set(recorded))
        if new:
            raise WeightsChanged(
                f"model folder {folder} changed since it was saved: {', '.join(new)} appeared "
                f"(not among the files recorded in selfrepair.json). {fix}"
            )


def remake_fix(folder: Path, meta: dict) -> str:
    """The way out for a model folder whose files are not what its save wrote: a folder
    converted from a GGUF file (its record names the file's SHA-256) is converted again,
    a trained one retrained."""
    source = meta.get("source")
    if isinstance(source, dict) and source.get("gguf_sha256"):
        what = source.get("file") or f"package {source.get('package', source.get('name', '?'))}"
        return (
            f"Convert it again: delete {folder} and rerun snakemake (rule lm_convert converts {what} "
            "again); or undo the edit"
        )
    return (
        f"Retrain it: delete {folder} and rerun snakemake (or rerun with --forcerun <its training rule>); "
        "or undo the edit"
    )


class ModelElsewhere(WeightsChanged):
    """A model folder whose record names another folder: a symlink or copy of another
    model where the workflow expects the one its own rule made."""


class NoRecord(WeightsChanged):
    """A model folder that the workflow wrote has no ``selfrepair.json`` (or no hashes in
    it): nothing says it is the model its rule made."""


def _is_job_input(folder: Path) -> bool:
    """Whether ``folder`` is an input of the running workflow job: an output of another
    rule (the models the user brings come through parameters and search paths)."""
    from selfrepair.core import runtime

    if runtime.JOB is None:
        return False
    here = os.path.abspath(str(folder))
    return any(os.path.abspath(f) == here for f in runtime.JOB.get("inputs", []))


def _made_here(want: Path, folder: Path) -> bool:
    """Whether ``folder`` is the folder ``want`` a record names (relative to the working
    directory: the folder's path, symlinks not followed, ends with it)."""
    here = Path(os.path.normpath(os.path.abspath(folder)))
    n = len(want.parts)
    return here == want if want.is_absolute() else here.parts[-n:] == want.parts


def brought_record(folder: str | Path) -> str:
    """What the ``selfrepair.json`` of a folder the user brings (the ``own:`` section's
    models) says against it, as a note ('' when nothing): a copy of a model the workflow
    trained names the folder it was made for, and files changed since (fine-tuned in
    place) differ from its hashes. Such a folder is the user's model as it is now: the
    record is said, and it loads (not ModelElsewhere or WeightsChanged)."""
    folder = Path(folder)
    meta = read_meta(folder)
    made, said = meta.get(MADE_KEY), []
    if isinstance(made, dict) and made.get("folder") and not _made_here(Path(str(made["folder"])), folder):
        said.append(f"rule {made.get('rule')} made it for {made['folder']} (a copy)")
    recorded = meta.get(FILES_KEY, meta.get(WEIGHTS_KEY))
    if isinstance(recorded, dict):
        changed = [
            n for n, want in sorted(recorded.items()) if not (folder / n).exists() or _sha256(folder / n) != want
        ]
        if changed:
            said.append(f"{', '.join(changed)} changed since that save")
    if not said:
        return ""
    return (
        f"model folder {folder}: its selfrepair.json says {'; '.join(said)}; analysed as your own model, as it is now"
    )


def check_provenance(folder: str | Path, required: bool | None = None) -> None:
    """Raise ModelElsewhere when the folder's record names another folder (the model that
    rule R made for folder F is not this folder's; outside a workflow job, a warning: a
    copy loaded by hand on purpose), and NoRecord when ``required`` (by
    default: when ``folder`` is an input of the running workflow job, so a folder another
    rule wrote) and the folder has no record of its files' hashes.

    A record names its folder relative to the working directory: the check holds when the
    folder's path (its symlinks not followed) ends with it, so a whole results tree moved
    elsewhere still loads. Records saved before provenance was recorded (the committed
    golden checkpoints) are checked by their hashes only."""
    folder = Path(folder)
    meta = read_meta(folder)
    made = meta.get(MADE_KEY)
    if required is None:
        required = _is_job_input(folder)
    if isinstance(made, dict) and made.get("folder"):
        want = Path(str(made["folder"]))
        if not _made_here(want, folder):
            wc = ", ".join(f"{k}={v}" for k, v in sorted((made.get("wildcards") or {}).items()))
            what = (
                f"model folder {folder} is not this folder's model: its selfrepair.json says rule "
                f"{made.get('rule')} ({wc}) made it for {want} (a symlink or a copy of another model?)"
            )
            from selfrepair.core import runtime

            if runtime.JOB is None:  # loaded by hand (a notebook, a copy kept on purpose): said, not refused
                import logging

                logging.getLogger(__name__).warning("%s; loading it as asked", what)
                return
            raise ModelElsewhere(
                f"{what}. Delete {folder} and rerun snakemake (or rerun with --forcerun {made.get('rule')}) "
                "to make its own"
            )
    elif required and FILES_KEY not in meta and WEIGHTS_KEY not in meta:
        what = (
            "has no selfrepair.json"
            if not (folder / "selfrepair.json").exists()
            else "has no file hashes in selfrepair.json"
        )
        raise NoRecord(
            f"model folder {folder} {what}: the record that names the model and its files' SHA-256, "
            "written when the workflow saved it, so nothing shows it is the model its rule made. "
            f"Retrain it: delete {folder} and rerun snakemake (or rerun with --forcerun <the rule that writes it>)"
        )


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise ModelNotFound(f"model folder not found: {folder}")
    if not (folder / "config.json").exists():
        hint = ""
        if folder.suffix.lower() == ".gguf":  # a folder named like a GGUF file
            inside = sorted(folder.glob("*.gguf"))
            hint = f": {folder} is a folder, not a GGUF file; name the .gguf file " + (
                f"in it ({inside[0]})" if inside else "itself"
            )
        raise CorruptCheckpoint(f"{folder} has no config.json: not a saved model{hint}")
    weights = list(folder.glob("*.safetensors")) + list(folder.glob("*.bin"))
    if not weights:
        raise CorruptCheckpoint(f"{folder} holds no weights (*.safetensors)")


def _weight_tensors(file: Path):
    """(name, tensor) of one checkpoint file, one tensor at a time for safetensors."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        yield from torch.load(file, weights_only=True, map_location="cpu").items()


def check_finite(folder: str | Path) -> None:
    """Raise NonFiniteWeights, naming the file and tensor, if any floating-point tensor of
    the checkpoint in ``folder`` holds a NaN or an infinity (a diverged or damaged save
    would otherwise flow silently into every score)."""
    folder = Path(folder)
    bad = []
    # the files transformers loads: safetensors when present, else PyTorch .bin (not
    # other pickles such as a Trainer's training_args.bin)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    for file in files:
        try:
            for name, t in _weight_tensors(file):
                if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                    n_nan = int(torch.isnan(t).sum())
                    bad.append((file, name, n_nan, int((~torch.isfinite(t)).sum()) - n_nan, t.numel()))
        except Exception as err:  # safetensors raises several types for a damaged file
            raise CorruptCheckpoint(f"cannot load the checkpoint in {folder}: cannot read {file}: {err}") from err
    if bad:
        lines = [f"  {f}: tensor {n!r} has {a} NaN and {b} inf of {m} values" for f, n, a, b, m in bad[:5]]
        more = f"\n  ... and {len(bad) - 5} more tensors" if len(bad) > 5 else ""
        raise NonFiniteWeights(
            f"non-finite weights in the checkpoint {folder}:\n" + "\n".join(lines) + more, bad[0][0], bad[0][1]
        )


def check_fits(folder, model, info: dict) -> None:
    """CorruptCheckpoint when the checkpoint's tensors do not fit the architecture its
    ``config.json`` names: weights the model has but the checkpoint lacks (transformers
    would leave them randomly initialized) or tensors of another shape. Tensors the model
    does not use are logged, not refused (old checkpoints carry buffers such as GPT-2's
    ``attn.bias``)."""
    import logging

    missing, mismatched = sorted(info.get("missing_keys") or []), sorted(info.get("mismatched_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    if missing or mismatched:
        kind = type(model).__name__
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} weights of {kind} are not in the checkpoint (first: {', '.join(missing[:3])})"
            )
        if mismatched:
            parts.append(f"{len(mismatched)} have another shape (first: {', '.join(map(str, mismatched[:3]))})")
        if unexpected:
            parts.append(f"{len(unexpected)} checkpoint tensors are not {kind}'s (first: {', '.join(unexpected[:3])})")
        raise CorruptCheckpoint(
            f"the weights in {folder} do not fit the architecture its config.json names: "
            + "; ".join(parts)
            + ". Loading would run random weights in their place; check config.json against the weights"
        )
    if unexpected:
        logging.getLogger(__name__).warning(
            "%s: %d checkpoint tensors are not used by %s (first: %s)",
            folder, len(unexpected), type(model).__name__, ", ".join(unexpected[:3]),
        )  # fmt: skip


def read_meta(folder: str | Path) -> dict:
    """The folder's ``selfrepair.json`` ({} when there is none)."""
    f = Path(folder) / "selfrepair.json"
    if not f.exists():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as err:
        raise CorruptCheckpoint(f"{f} is not valid JSON: {err}") from err


def model_identity(folder: str | Path) -> str:
    """A model folder's identity: the SHA-256 (first 16 hex digits) of its ``config.json``
    and of every weights file, by name, read in full (a few seconds for GPT-2 small, about
    a minute for 8B parameters). Two folders with the same identity hold the same model;
    a real model and a random-weight stand-in of its configuration never share one."""
    import hashlib

    folder = Path(folder)
    total = hashlib.sha256()
    files = [folder / "config.json"] + sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    for f in files:
        if f.exists():
            total.update(f"{f.name}\0{_sha256(f)}\n".encode())
    return total.hexdigest()[:16]
