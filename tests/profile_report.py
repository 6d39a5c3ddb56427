"""Where a pytest run's time went, from the per-test lines that
SELFREPAIR_TEST_PROFILE=<file> makes tests/conftest.py write (one JSON object per test:
test, worker, wall, cpu_self, cpu_children, snakemake).

    python tests/profile_report.py FILE [--top N]

prints the totals, each worker's wall seconds, the modules by CPU seconds (the pytest
process and the children it waited for: Snakemake runs and their jobs, training
subprocesses; a SLURM job's CPU is the cluster's, not counted) and the N tests with the
most CPU.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                row["cpu"] = row["cpu_self"] + row["cpu_children"]
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{n}: not a test profile line ({e}): {line[:120]}")
            rows.append(row)
    return rows


def by_module(rows: list[dict]) -> list[dict]:
    """One row per test module: tests, wall, cpu and Snakemake starts summed; most CPU first."""
    acc: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "snakemake": 0})
    for r in rows:
        m = acc[r["test"].split("::")[0]]
        m["tests"] += 1
        m["wall"] += r["wall"]
        m["cpu"] += r["cpu"]
        m["snakemake"] += r["snakemake"]
    return sorted(({"module": k, **v} for k, v in acc.items()), key=lambda m: -m["cpu"])


def report(rows: list[dict], top: int = 30) -> str:
    workers: dict[str, float] = defaultdict(float)
    for r in rows:
        workers[r["worker"]] += r["wall"]
    cpu = sum(r["cpu"] for r in rows)
    lines = [
        f"{len(rows)} tests: {cpu:.0f} s of CPU, {sum(r['snakemake'] for r in rows)} Snakemake starts; "
        + ", ".join(f"worker {w} {s:.0f} s of wall" for w, s in sorted(workers.items())),
        "",
        "| module | tests | CPU s | wall s | Snakemake starts |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {m['module']} | {m['tests']} | {m['cpu']:.0f} | {m['wall']:.0f} | {m['snakemake']} |"
        for m in by_module(rows)
    ]
    lines += ["", "| CPU s | wall s | Snakemake starts | test |", "|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        lines.append(f"| {r['cpu']:.1f} | {r['wall']:.1f} | {r['snakemake']} | {r['test']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    print(report(read(args.file), args.top))


if __name__ == "__main__":
    main()
