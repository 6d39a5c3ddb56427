"""Does a pinned numerics mode give the same bits under another machine's settings? The
check on one machine (across CPU vendors: benchmarks/fingerprint.py and the golden
training test).

Runs paper A's tiny configuration (config/test.yaml, training and scoring) twice from
scratch, in two temporary folders, side by side:

    here     this machine's environment, --cores 2
    other    the environment of another CPU and another machine's settings: every
             library asked for its newest kernels (ATen AVX-512, MKL AUTO, oneDNN AMX,
             numpy's AVX-512 loops), 2 OpenMP threads, config threads 2, --cores 1

both under `numerics: fast` (or the modes given). Then every file the two runs wrote
is compared byte for byte, CSV tables value by value and JSON files without their wall
times, and each difference is listed with what differs and by how much.

    .venv/bin/python benchmarks/portability.py [--numerics exact|fast|native]
        [--other-numerics MODE] [--fixed-weights] [--papers heroes] [--out results/benchmarks/portability.csv]
        [--write]

--other-numerics native --fixed-weights: both runs score the committed checkpoints of
tests/golden (no training), the second with this CPU's own kernels and 2 threads: which
scores move when nothing is pinned, and by how much (the tolerances of the golden tests).
--write: also results/reference/<--out's name> (portability.csv, portability_native_scoring.csv),
rendered into its doc block.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import ROOT

from selfrepair.core.numerics import MODES  # imports no torch
from selfrepair.core.numerics import OTHER_CPU_ENV as OTHER

# Columns that hold wall times: expected to differ between any two runs.
TIME_FIELDS = {"seconds", "train_seconds", "wall_s", "s", "time"}


def run(d: Path, mode: str, papers: str, env: dict, cores: int, threads: int, fixed: bool) -> float:
    (d / "config").mkdir(parents=True)
    shutil.copy(ROOT / "config" / "published.yaml", d / "config" / "published.yaml")
    if fixed:
        sys.path.insert(0, str(ROOT / "tests"))
        import golden_suite

        golden_suite.seed_checkpoints(d, papers.split(","))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(d),
        "--cores", str(cores), "--configfile", str(ROOT / "config/config.yaml"), str(ROOT / "config/test.yaml"),
        "--config", f"papers=[{papers}]", "device=cpu", f"numerics={mode}", f"threads={threads}",
    ]  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run in {d} failed:\n{r.stderr[-4000:]}")
    return time.perf_counter() - t0


def compare_csv(a: Path, b: Path) -> list[dict]:
    """One row per column that differs: how many values, by how much."""
    import numpy as np
    import pandas as pd

    x, y = pd.read_csv(a), pd.read_csv(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return [{"what": "shape or columns differ"}]
    out = []
    for c in x.columns:
        if x[c].equals(y[c]):
            continue
        row = {"column": c}
        if c in TIME_FIELDS or c.endswith("_seconds"):
            row["what"] = "wall time"
        elif pd.api.types.is_numeric_dtype(x[c]) and pd.api.types.is_numeric_dtype(y[c]):
            d = np.abs(x[c].to_numpy(float) - y[c].to_numpy(float))
            rel = d / np.maximum(np.abs(x[c].to_numpy(float)), 1e-30)
            row.update(
                what="values",
                n_values=int(np.nansum(d > 0)),
                max_abs=float(np.nanmax(d)),
                max_rel=float(np.nanmax(rel)),
            )
        else:
            row.update(what="values", n_values=int((x[c].astype(str) != y[c].astype(str)).sum()))
        out.append(row)
    return out or [{"what": "bytes differ, values equal"}]


def compare_json(a: Path, b: Path) -> list[dict]:
    import json

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k not in TIME_FIELDS}
        return [strip(v) for v in o] if isinstance(o, list) else o

    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    if strip(x) == strip(y):
        return [{"what": "wall time"}]
    keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k)) if isinstance(x, dict) else []
    return [{"column": k, "what": "values"} for k in keys] or [{"what": "values"}]


def main():
    ap = harness.arguments(__doc__, "portability.csv", threads=None)
    ap.add_argument("--other-numerics", choices=MODES, help="the second run's mode (default: --numerics)")
    ap.add_argument("--fixed-weights", action="store_true", help="score the committed tiny checkpoints, no training")
    ap.add_argument("--papers", default="heroes", help="comma-separated papers of the tiny config")
    ap.add_argument("--keep", help="keep the two runs' folders under this folder")
    a = ap.parse_args()
    import pandas as pd

    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp())
    here, other = base / "here", base / "other"
    for d in (here, other):
        shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ)
    other_mode = a.other_numerics or a.numerics
    wall = {
        "here": run(here, a.numerics, a.papers, env, cores=2, threads=1, fixed=a.fixed_weights),
        "other": run(other, other_mode, a.papers, {**env, **OTHER}, cores=1, threads=2, fixed=a.fixed_weights),
    }
    files = sorted({p.relative_to(here) for p in (here / "results").rglob("*") if p.is_file()}
                   | {p.relative_to(other) for p in (other / "results").rglob("*") if p.is_file()})  # fmt: skip
    rows = []
    for f in files:
        x, y = here / f, other / f
        if not (x.exists() and y.exists()):
            rows.append({"file": str(f), "identical": False, "what": "only in one run"})
        elif x.read_bytes() == y.read_bytes():
            rows.append({"file": str(f), "identical": True})
        else:
            diff = {".csv": compare_csv, ".json": compare_json}.get(f.suffix, lambda x, y: [{"what": "bytes differ"}])(
                x, y
            )
            rows.extend({"file": str(f), "identical": False, **d} for d in diff)
    cols = ["file", "identical", "column", "what", "n_values", "max_abs", "max_rel"]
    t = pd.DataFrame(rows, columns=cols).assign(
        here=a.numerics, other=other_mode, fixed_weights=a.fixed_weights,
        wall_here_s=round(wall["here"], 1), wall_other_s=round(wall["other"], 1),
    )  # fmt: skip
    harness.write(t, a, reference=Path(a.out).stem)
    diff = t[~t["identical"]]
    print(f"numerics {a.numerics} vs {other_mode}: {t['file'].nunique()} files, {int(t['identical'].sum())} identical; "
          f"wall here {wall['here']:.0f} s, other {wall['other']:.0f} s")  # fmt: skip
    print(diff.to_string(index=False) if len(diff) else "every file identical")
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
