"""What every rule script does first, and safe file helpers."""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path


def start(smk) -> str | None:
    """Log to the rule's log file; for a rule with ``params.device`` (one that computes),
    use the rule's threads in torch and resolve the device ('cpu' or 'cuda').

    Rules without a device (tables, figures) never import torch, so they start fast.
    """
    if smk.log:
        Path(smk.log[0]).parent.mkdir(parents=True, exist_ok=True)
        sys.stderr = open(smk.log[0], "w", buffering=1)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    device = compute_setup(smk)
    logging.info("rule %s on %s with %d threads", getattr(smk, "rule", "?"), device, smk.threads)
    return device


def compute_setup(smk) -> str | None:
    """For a rule with ``params.device`` (one that computes): resolve the device, put the
    rule's numerics mode in force (``params.numerics``; it fails loudly when the pins are
    not), set torch's threads, and log what decided the job's floats."""
    device = getattr(smk.params, "device", None)
    if device is None:
        return None
    from selfrepair.core import numerics
    from selfrepair.core.models import resolve_device

    mode = getattr(smk.params, "numerics", None)
    if mode is None:
        raise ValueError(f"rule {getattr(smk, 'rule', '?')} computes (params.device) but has no params.numerics")
    device = resolve_device(device)
    numerics.apply(mode, smk.threads, device)
    global NUMERICS_RECORD
    NUMERICS_RECORD = numerics.record(mode, device)
    print("numerics:", json.dumps(NUMERICS_RECORD, sort_keys=True), file=sys.stderr, flush=True)
    return device


NUMERICS_RECORD: dict | None = None  # set by start() in a compute job: what decided its floats


def numerics_record() -> dict:
    """The numerics record of this compute job (stored beside its results)."""
    if NUMERICS_RECORD is None:
        raise RuntimeError("runtime.start() has not run in a compute job")
    return NUMERICS_RECORD


def cuda_available() -> bool:
    """Whether torch will find CUDA on this machine (what device 'auto' resolves to),
    cheaply: without a GPU device node (NVIDIA, WSL's dxg, ROCm's kfd) no, without
    importing torch; with one, torch decides (it honours CUDA_VISIBLE_DEVICES). Where
    torch is not importable (snakemake in its own env, jobs in conda), a node means yes.
    """
    dev = Path("/dev")
    if not any(next(dev.glob(p), None) for p in ("nvidia[0-9]*", "dxg", "kfd")):
        return False
    try:
        import torch
    except ImportError:
        return True
    return bool(torch.cuda.is_available())


@contextmanager
def atomic_path(path):
    """A fresh temporary path beside ``path`` that replaces ``path`` when the block ends
    without an error (a crash never leaves half a file; on an error it is removed).

    The file gets the permissions a plain ``open(path, "w")`` gives (0o666 less the
    umask, and any default ACL), not ``tempfile.mkstemp``'s 0o600, which would hide
    results from the other users of a shared cluster. Every atomic write goes through here.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:  # mode 0o666: the kernel applies the umask, as for open()
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path, obj) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"missing file: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"corrupted JSON file {path}: {err}") from err


def save_tensors(path, tensors: dict) -> None:
    """torch.save of a dict of tensors (and plain values), atomically."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: the archive's
        torch.save(tensors, f)  # inner name is fixed, not the random temporary name


def load_tensors(path) -> dict:
    """Load a file written by ``save_tensors`` with ``weights_only=True`` (safe)."""
    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing file: {path}")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise ValueError(f"corrupted tensor file {path}: {err}") from err
