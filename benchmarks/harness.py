"""What every benchmark repeats, in one place; a benchmark says only what it measures.

- :func:`configure`: the numerics mode's pins, from ``--numerics`` on the command line,
  put in force before torch is imported (call it before importing torch);
- :func:`arguments`: the options every benchmark takes: ``--threads``, ``--numerics``,
  ``--out`` (its one CSV, under results/benchmarks/) and ``--write`` (also copy that CSV
  into results/reference/ and render its doc block into README.md and docs/*.md with
  :mod:`selfrepair.tooling.readme_table`); :func:`start` applies them;
- :func:`timed`, :func:`cpu_timed`, :func:`best_of`, :func:`interleaved`: seconds of calls; repeats run
  interleaved (round r runs every variant once, the order rotated by r), so a slow
  stretch of the machine falls on every variant alike;
- the compute floor: :func:`matmul_throughput` (FLOP/s measured here),
  :func:`forward_flops` (one GPT-2 forward), :func:`executed_flops` (what a call executes,
  counted by torch) and :func:`floor_ratios` (seconds against both floors);
- :func:`write`: the CSV, and with ``--write`` its reference copy and the doc blocks
  (:func:`merged`: a table measured a few rows at a time);
- :func:`machine` and :func:`commit`: where and on what code a table was measured (its
  ``machine`` and ``commit`` columns).

The peers' side-by-side comparisons (peers/) take the same shape through
peers/peer_harness.py, which imports this file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # a checkout without the package installed
from selfrepair.core import numerics  # noqa: E402  imports no torch

BENCHMARKS = ROOT / "results" / "benchmarks"


def configure(argv: list[str] | None = None) -> str:
    """The ``--numerics`` mode of ``argv`` (default: sys.argv) put in force; torch must not
    be imported yet (its kernels are chosen when it loads)."""
    return numerics.configure_from_argv(sys.argv if argv is None else argv)


def arguments(doc: str | None, out: str, threads: int | None = 1, modes: bool = True) -> argparse.ArgumentParser:
    """A parser with the shared options: ``--out`` (default results/benchmarks/``out``),
    ``--write``, ``--threads`` unless ``threads`` is None, ``--numerics`` if ``modes``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads, help=f"threads (default {threads})")
    if modes:
        ap.add_argument("--numerics", choices=numerics.MODES, default=numerics.DEFAULT_MODE)
    ap.add_argument("--out", default=str(BENCHMARKS / out), help=f"the CSV (default results/benchmarks/{out})")
    ap.add_argument("--write", action="store_true", help="also copy --out into results/reference/, render the docs")
    return ap


def start(args: argparse.Namespace) -> int:
    """Torch's threads for ``args.threads`` under ``args.numerics`` (the pins verified);
    the thread count in force."""
    return numerics.apply(args.numerics, args.threads)


def timed(fn: Callable) -> tuple[object, float]:
    """(``fn()``, its seconds)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def cpu_timed(fn: Callable) -> tuple[object, float]:
    """(``fn()``, the process CPU seconds it took: every thread's, not the wall clock)."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def interleaved(calls: dict[str, Callable], repeats: int) -> Iterator[tuple[int, str, object]]:
    """(round, name, result) of every call ``repeats`` times: round r runs each call once,
    starting at the (r mod n)-th, so that no call always runs first or after the same one."""
    names = list(calls)
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            yield r, name, calls[name]()


def best_of(calls: dict[str, Callable], repeats: int, timer: Callable | None = None) -> dict[str, tuple[float, object]]:
    """{name: (fewest seconds, the result of that call's last run)} over ``repeats``
    interleaved rounds (``timer``: :func:`timed` by default, wall seconds, or :func:`cpu_timed`)."""
    timer = timer or timed
    best: dict[str, tuple[float, object]] = {}
    for _, name, (out, s) in interleaved({n: (lambda f=f: timer(f)) for n, f in calls.items()}, repeats):
        best[name] = (min(s, best.get(name, (s,))[0]), out)
    return best


def matmul_throughput(seconds: float = 1.0, rows: int = 8192, k: int = 128, n: int = 512) -> float:
    """FLOP/s of float32 matmuls [rows, k] x [k, n] (paper A's width and MLP) on this
    machine, over about ``seconds`` (after 3 warm-up products)."""
    import torch

    a, b = torch.randn(rows, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return count * 2 * rows * k * n / (time.perf_counter() - t0)


def forward_flops(cfg, n_seq: int, t: int) -> float:
    """Matmul FLOPs of one forward pass of a GPT-2 config over ``n_seq`` sequences of ``t``
    tokens: per token and layer QKV (2*3*d*d), the output (2*d*d) and the MLP (2*2*d*d_mlp),
    the unembedding (2*d*vocab), and per layer QK^T and AV over the causal half."""
    d, layers, dm, v = cfg.n_embd, cfg.n_layer, cfg.n_inner, cfg.vocab_size
    per_token = layers * (2 * 3 * d * d + 2 * d * d + 2 * 2 * d * dm) + 2 * d * v
    attn = layers * 2 * 2 * t * t * d / 2
    return n_seq * (t * per_token + attn)


def executed_flops(fn: Callable) -> float:
    """Matmul FLOPs that ``fn()`` executes (one untimed call; linear layers and the
    unembedding, forward and backward, not the CPU's attention kernels), counted as the
    workflow's jobs count them (:func:`selfrepair.core.flops.executed`)."""
    from selfrepair.core.flops import executed

    return executed(fn)


def floor_ratios(seconds: float, flops: float, executed: float, flops_per_s: float) -> dict[str, float]:
    """A call's ``seconds`` against its compute floor (``flops`` at ``flops_per_s``) and
    against the work it executed (``executed`` FLOPs): floor_s, over_floor,
    executed_fraction (executed / flops) and over_executed."""
    floor = flops / flops_per_s
    return {
        "floor_s": floor,
        "over_floor": seconds / floor,
        "executed_fraction": executed / flops,
        "over_executed": seconds / (executed / flops_per_s),
    }


def merged(path: Path, table, keys: list[str] | None):
    """``table`` after the rows of the CSV at ``path`` (if any) whose ``keys`` it does not
    have: measuring some rows again replaces those rows only."""
    import pandas as pd

    if not keys or not path.exists():
        return table
    old = pd.read_csv(path)
    keep = ~old.set_index(keys).index.isin(table.set_index(keys).index)
    return pd.concat([old[keep], table], ignore_index=True)


def write(table, args: argparse.Namespace, out=None, reference: str | None = None, root: Path = ROOT, keys=None):
    """``table`` (a DataFrame) to ``out`` (default ``args.out``); with ``args.write`` also
    to results/reference/``reference``.csv (default benchmark_<out's stem>) and every doc
    block rendered from results/reference/. With ``keys`` (columns), each file keeps its
    rows of other keys (:func:`merged`). The CSV's path."""
    out = Path(out or args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    merged(out, table, keys).to_csv(out, index=False)
    print(f"wrote {out}")
    if getattr(args, "write", False):
        from selfrepair.tooling import readme_table

        ref = root / "results" / "reference" / f"{reference or 'benchmark_' + out.stem}.csv"
        ref.parent.mkdir(parents=True, exist_ok=True)
        merged(ref, table, keys).to_csv(ref, index=False)
        print(f"wrote {ref}")
        if readme_table.main([], root):
            raise SystemExit("the documents' blocks have problems (printed above)")
    return out


def commit() -> str:
    """The checkout's commit, with '+changes' when the tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except OSError:
        return ""


def machine() -> str:
    """The CPU's model name with its family/model numbers ('AMD EPYC (26/2)': a KVM guest
    names Zen 3 and Zen 5 alike)."""
    return f"{numerics.cpu_model()} ({numerics.cpu_family()})"
