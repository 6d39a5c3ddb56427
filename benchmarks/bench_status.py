"""`make status`, speed: seconds of `python -m selfrepair.tooling.status` on a running and
on a finished tiny run, the count (snakemake --summary) started as before (plain
Snakemake, which imports every installed executor plugin first: ``--plain-summary``) and
as now (Snakemake with its built-in executors only), and without the count
(``--no-summary``), all measured in the same run, interleaved (ratios, never timed
assertions). For each: seconds to the first line printed (the directory's own files:
state, jobs, logs) and to the end, and the seconds the count reports for itself. The
counts of the two ways of starting Snakemake are compared.

Starts paper A's tiny run (config/test.yaml, ``snakemake --cores 2 ... papers=[heroes]``,
about 145 s on 2 cores) in a temporary folder; while a job of it runs, times each variant
``--repeats`` times (the run keeps both cores busy meanwhile, as when one asks where a
run stands); then waits for the run to end and times them again on the finished run.
``--directory DIR``: time DIR as it is instead (a run's folder, running or not).

Where SLURM's tools are installed (``scontrol``), the time of ``scontrol show config`` is
printed too: importing Snakemake's SLURM executor plugin runs it, and it waits about 9 s
where no SLURM controller answers.

    .venv/bin/python benchmarks/bench_status.py [--repeats 3] [--papers heroes] [--directory DIR] [--write]

--write: also writes the measurements to results/reference/benchmark_status.csv.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from selfrepair.tooling import status  # noqa: E402

BIN = Path(sys.executable).parent
OUT = ROOT / "results" / "reference" / "benchmark_status.csv"
TINY = ["--configfile", str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "test.yaml")]
VARIANTS = {  # name -> the status options
    "before: plain snakemake --summary": ["--plain-summary"],
    "now: built-in executors only": [],
    "files only (--no-summary)": ["--no-summary"],
}
COUNT = re.compile(r"^  (\d+ of \d+ output files exist.*)$", re.M)
SECONDS = re.compile(r"^Default target \(snakemake --summary, ([\d.]+) s", re.M)


def time_status(directory: Path, options: list[str]) -> dict:
    """One `python -m selfrepair.tooling.status`: seconds to its first line and to its
    end, the state word of its head line, the count's own seconds and its count line."""
    cmd = [sys.executable, "-m", "selfrepair.tooling.status", "--directory", str(directory), *options]
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        first = p.stdout.readline()
        t_first = time.perf_counter() - t0
        rest = p.stdout.read()  # not communicate(): it would skip what readline buffered
        p.wait()
        total = time.perf_counter() - t0
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read()[-2000:]}")
    out = first + rest
    head = out.splitlines()[1] if len(out.splitlines()) > 1 else ""
    count, seconds = COUNT.search(out), SECONDS.search(out)
    return {
        "state": head.split(":")[0].split(" (")[0].lower(),
        "first_line_s": t_first,
        "total_s": total,
        "summary_s": float(seconds.group(1)) if seconds else None,
        "count": count.group(1) if count else "",
    }


def measure(directory: Path, repeats: int, phase: str, still: callable = lambda: True) -> list[dict]:
    """Every variant ``repeats`` times, interleaved (a round runs each once, in a rotated
    order), while ``still()`` holds."""
    rows, names = [], list(VARIANTS)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if not still():
                return rows
            m = time_status(directory, VARIANTS[name])
            rows.append({"phase": phase, "variant": name, "repeat": r} | m)
            print(
                f"  {phase:9s} {name:34s} #{r}: first line {m['first_line_s']:5.2f} s, "
                f"all {m['total_s']:6.2f} s ({m['state']})",
                flush=True,
            )
    return rows


def slurm_probe() -> str:
    """How long `scontrol show config` takes here (the SLURM plugin runs it on import)."""
    if not shutil.which("scontrol"):
        return "no scontrol on PATH (the SLURM plugin's probe returns at once)"
    t0 = time.perf_counter()
    try:
        r = subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=30)
        code = f"exit {r.returncode}"
    except subprocess.TimeoutExpired:
        code = "timed out"
    return f"{shutil.which('scontrol')}: scontrol show config {time.perf_counter() - t0:.1f} s ({code})"


def start_run(d: Path, papers: str) -> subprocess.Popen:
    (d / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "config" / "published.yaml", d / "config" / "published.yaml")
    cmd = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--cores", "2", "--directory", str(d), *TINY]
    cmd += ["--config", f"papers=[{papers}]", "device=cpu"]
    log = open(d / "bench_run.log", "w")
    return subprocess.Popen(
        cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), stdout=log, stderr=log, start_new_session=True
    )


def table(rows: list[dict]) -> list[str]:
    lines = [
        f"{'phase':9s} {'variant':34s} {'n':>2s} {'first line s':>12s} {'all s':>7s} {'count s':>8s} {'x now':>6s}"
    ]
    for phase in dict.fromkeys(r["phase"] for r in rows):
        med = {}
        for name in VARIANTS:
            got = [r for r in rows if r["phase"] == phase and r["variant"] == name]
            if got:
                counts = [r["summary_s"] for r in got if r["summary_s"] is not None]
                med[name] = (
                    len(got),
                    statistics.median(r["first_line_s"] for r in got),
                    statistics.median(r["total_s"] for r in got),
                    statistics.median(counts) if counts else None,
                )
        now = med.get("now: built-in executors only")
        for name, (n, first, total, count) in med.items():
            ratio = f"{total / now[2]:6.2f}" if now else "     -"
            c = f"{count:8.2f}" if count is not None else "       -"
            lines.append(f"{phase:9s} {name:34s} {n:2d} {first:12.2f} {total:7.2f} {c} {ratio}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--papers", default="heroes", help="the tiny run's papers (default heroes)")
    ap.add_argument("--directory", type=Path, default=None, help="time this folder as it is (no run started)")
    ap.add_argument("--write", action="store_true", help=f"also write {OUT.relative_to(ROOT)}")
    a = ap.parse_args()
    probe = slurm_probe()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; SLURM tools: {probe}", flush=True)
    rows = []
    if a.directory is not None:
        rows += measure(a.directory, a.repeats, "as is")
    else:
        with tempfile.TemporaryDirectory(prefix="bench_status_") as tmp:
            d = Path(tmp)
            run = start_run(d, a.papers)
            try:
                deadline = time.monotonic() + 600
                while not (list((d / ".snakemake" / "locks").glob("*.lock")) and status.job_processes(d)):
                    if run.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the tiny run started no job: see {d / 'bench_run.log'}")
                    time.sleep(0.5)
                print(f"tiny run (papers={a.papers}) running in {d}; timing while it runs", flush=True)
                rows += measure(d, a.repeats, "running", still=lambda: run.poll() is None)
                print("waiting for the run to end", flush=True)
                if run.wait(timeout=3600) != 0:
                    raise RuntimeError(f"the tiny run failed: see {d / 'bench_run.log'}")
                rows += measure(d, a.repeats, "finished")
            finally:
                if run.poll() is None:
                    os.killpg(run.pid, signal.SIGTERM)
                    run.wait()
    print()
    print("\n".join(table(rows)))
    x_now = "x now: all s over that of `now` in the same phase"
    print(
        f"(medians; first line: the directory's files, printed before the count; count s: as status reports it; {x_now})"
    )
    for phase in dict.fromkeys(r["phase"] for r in rows):
        counts = {r["variant"]: r["count"] for r in rows if r["phase"] == phase and r["count"]}
        same = len(set(counts.values())) <= 1
        print(
            f"{phase}: counts {'the same' if same else 'DIFFER'}: " + "; ".join(f"{k}: {v}" for k, v in counts.items())
        )
    if a.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        with open(OUT, "w", newline="") as f:
            fields = ["phase", "variant", "repeat", "state", "first_line_s", "total_s", "summary_s", "count", "slurm"]
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} | {"slurm": probe})
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
