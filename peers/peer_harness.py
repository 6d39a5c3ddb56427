"""What the side-by-side comparisons of peers/ share: ``mib_lm.py`` (MIB's code) and
``coax_lm.py`` (the COAX release), each of which runs the peers' own code in a process of
its own environment beside ours.

The shape of a comparison is a benchmark's: the options (``--threads``, ``--numerics``,
``--out``, ``--write``), the numerics pins, the table under results/benchmarks/ with its
reference copy and doc block, the run's machine and commit. That is benchmarks/harness.py,
imported from there (not copied): :func:`configure`, :func:`arguments`, :func:`start`,
:func:`write`, :func:`machine`, :func:`commit`, ``ROOT`` and ``BENCHMARKS``. This file adds
what only the peers need: where their checkouts and environments live
(:data:`CHECKOUTS`, ignored by git; peers/README.md says how to set them up), a check that
a run's peer files are there before anything is measured (:func:`need`), and the
environment a peer's process runs in (:func:`peer_env`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from harness import BENCHMARKS, ROOT, arguments, commit, configure, machine, start, write  # noqa: E402

__all__ = [
    "BENCHMARKS",
    "CHECKOUTS",
    "ROOT",
    "arguments",
    "commit",
    "configure",
    "machine",
    "need",
    "peer_env",
    "start",
    "write",
]

CHECKOUTS = ROOT / "peers" / "work"  # the peers' clones and virtual environments (in .gitignore)


def need(*paths) -> None:
    """SystemExit naming each of ``paths`` that does not exist (a peer's checkout or
    interpreter), before a run spends minutes on our side."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: peers/README.md says how to set up the peers' code")


def peer_env(threads: int, **extra: str) -> dict[str, str]:
    """This process's environment for a peer's process: offline (``HF_HUB_OFFLINE``),
    ``threads`` threads for OpenMP and MKL, and ``extra`` (e.g. its PYTHONPATH)."""
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **extra)
