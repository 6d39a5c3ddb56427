"""What every rule script does first, and safe file helpers."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
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
    device = getattr(smk.params, "device", None)
    if device is not None:
        import torch

        from .models import resolve_device

        torch.set_num_threads(max(1, int(smk.threads)))
        device = resolve_device(device)
    logging.info("rule %s on %s with %d threads", getattr(smk, "rule", "?"), device, smk.threads)
    return device


def write_json(path, obj) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import torch

    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save(tensors, tmp)
    os.replace(tmp, path)


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
