"""Sum the Snakemake ``benchmark:`` files of a run per paper and step.

    python benchmarks/runtime_summary.py [--root benchmarks] [--out results/benchmarks/runtime.csv] [--write]

Each compute rule writes one TSV per job (``s``: the job's wall seconds, ``cpu_time``).
The table has, per part (heroes, heroes grid, coax, gim, groundtruth) and step (the file's stem: train,
ood, scores, measure, localize, ...): jobs, summed wall seconds and CPU seconds, the
longest job, and a row ``all`` per part. Summed job seconds are the serial time of the
part: on c cores a part takes at least max(longest job, sum / c). --write: also
results/reference/runtime.csv, rendered into its doc block.
"""

from __future__ import annotations

import re
from pathlib import Path

import harness
import pandas as pd


def part_and_step(path: Path, root: Path) -> tuple[str, str]:
    rel = path.relative_to(root)
    part = rel.parts[0]
    if part == "heroes" and len(rel.parts) > 1 and rel.parts[1] == "grid":
        part = "heroes_grid"
    step = re.sub(r"_(arithmetic|ioi|mcqa|classify)?_?(l\d+h\d+|tiny)?$", "", path.stem) or path.stem
    step = "run" if re.fullmatch(r"data\d+", step) else step
    if len(rel.parts) > 3 and rel.parts[1] == "lms":  # {part}/lms/{lm}/run.tsv: the packaged real LMs
        return part, f"lms_{path.stem}"
    if part == "coax" and len(rel.parts) > 2:  # coax/{ioi,induction,pruning}/.../{train,run}.tsv
        step = f"{rel.parts[1]}_{step}"
    if part == "groundtruth" and len(rel.parts) > 2:  # groundtruth/{heroes,gim}/{task}.tsv (ioi.tsv: its stem)
        step = rel.parts[1]
    return part, step


def summarize(root: Path) -> pd.DataFrame:
    rows = []
    for f in sorted(root.rglob("*.tsv")):
        t = pd.read_csv(f, sep="\t")
        if t.empty or "s" not in t:
            continue
        part, step = part_and_step(f, root)
        rows.append(
            {
                "part": part,
                "step": step,
                "s": float(t["s"].iloc[-1]),
                "cpu_s": float(t["cpu_time"].iloc[-1]),
                "file": str(f),
            }
        )
    if not rows:
        raise SystemExit(f"no benchmark files under {root}")
    df = pd.DataFrame(rows)
    agg = dict(jobs=("s", "size"), wall_s=("s", "sum"), cpu_s=("cpu_s", "sum"), longest_job_s=("s", "max"))
    steps = df.groupby(["part", "step"]).agg(**agg).reset_index()
    total = df.groupby("part").agg(**agg).reset_index().assign(step="all")
    out = pd.concat([steps, total], ignore_index=True).sort_values(
        ["part", "step"], key=lambda s: s.map(lambda v: (v == "all", v))
    )
    out["wall_min"] = out["wall_s"] / 60
    return out.round(1)


def main() -> None:
    ap = harness.arguments(__doc__, "runtime.csv", threads=None, modes=False)
    ap.add_argument("--root", default="benchmarks")
    a = ap.parse_args()
    out = summarize(Path(a.root))
    harness.write(out, a, reference="runtime")
    print(out.to_string(index=False))


if __name__ == "__main__":
    main()
