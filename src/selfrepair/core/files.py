"""Safe file helpers: atomic writes (a crash never leaves half a file), SHA-256 of a
file, JSON and tensor files written atomically and read with errors that name the file.
Importable from :mod:`selfrepair.core.runtime` as the rule scripts call them."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path


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


def sha256_file(path) -> str:
    """The SHA-256 hex digest of the file at ``path``, read in 1 MiB blocks (weights, wheels)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def read_table(path):
    """The CSV a rule wrote at ``path`` as a DataFrame, or None where there is no table:
    the file is absent, or it is a rule's 1-byte not-run placeholder."""
    import pandas as pd

    p = Path(path)
    return pd.read_csv(p) if p.exists() and p.stat().st_size > 1 else None


def require_columns(table, columns, where):
    """``table`` if it has every one of ``columns``; else ValueError naming ``where`` (its
    file or what it is) and the columns it lacks."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{where}: lacks column(s) {', '.join(missing)} (has {', '.join(map(str, table.columns))})")
    return table
