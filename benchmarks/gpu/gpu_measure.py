"""What the GPU run (benchmarks/gpu/gpu_bench.py run) measures, and its table gpu_run.csv:
nvidia-smi in the background (Sampler: pmon's SM utilisation per process, the device's
utilization.gpu and memory.used), the probe's records (probe/sitecustomize.py: each job's
rule and torch.cuda.max_memory_allocated / max_memory_reserved), the rules' benchmark
files (wall and CPU seconds per job) and results/reference/runtime.csv (the same steps on
the CPU). Per-step utilisation needs pmon's pids to be the jobs' (a container may hide
them); the phase rows have the device's in any case."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "benchmarks" / "gpu"


class Sampler:
    """nvidia-smi in the background: the device's utilisation and memory every 0.5 s,
    and per process (pmon) SM utilisation and frame-buffer memory every second."""

    def __init__(self, out: Path):
        self.device_file, self.pmon_file = out / "nvidia_smi.csv", out / "nvidia_pmon.txt"
        q = ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        self.procs, self.files = [], []
        for cmd, path in (
            (q + ["-lms", "500"], self.device_file),
            (["nvidia-smi", "pmon", "-s", "um"], self.pmon_file),
        ):
            f = open(path, "w")
            self.files.append(f)
            try:
                self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))
            except OSError as err:
                f.write(f"# not started: {err}\n")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.files:
            f.close()


def benchmark_files(root: Path = ROOT / "benchmarks") -> set[Path]:
    return {p for p in root.rglob("*.tsv") if HERE not in p.parents}


def read_benchmarks(files, phase: str, root: Path = ROOT / "benchmarks") -> list[dict]:
    """One row per job of the rules' benchmark files: phase, part, step, s, cpu_s."""
    import pandas as pd

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_summary import part_and_step

    rows = []
    for f in sorted(files):
        t = pd.read_csv(f, sep="\t")
        if t.empty or "s" not in t:
            continue
        part, step = part_and_step(f, root)
        rows.append({"phase": phase, "part": part, "step": step, "s": float(t["s"].iloc[-1]),
                     "cpu_s": float(t["cpu_time"].iloc[-1])})  # fmt: skip
    return rows


RULE_STEPS = {
    "coax_lm_train": ("coax", "pruning_train"),
    "coax_pruning": ("coax", "pruning_run"),
    # the packaged real LMs: benchmarks/{part}/lms/{lm}/run.tsv, benchmarks/lms/{lm}/convert.tsv
    "lm_convert": ("lms", "convert"),
    "coax_lm": ("coax", "lms_run"),
    "coax_lm_pruning": ("coax", "lms_pruning"),  # benchmarks/coax/lms/{lm}/pruning.tsv
    "gim_lm": ("gim", "lms_run"),
    "groundtruth_lm": ("groundtruth", "lms_run"),
}


def rule_step(rule: str) -> tuple[str, str]:
    """(part, step) of a rule as results/reference/runtime.csv names it (from the rule's
    benchmark file: benchmarks/runtime_summary.py)."""
    if rule in RULE_STEPS:
        return RULE_STEPS[rule]
    if rule.startswith("heroes_grid_"):
        return "heroes_grid", rule.removeprefix("heroes_grid_")
    part, _, step = rule.partition("_")
    return part, step


def read_probe(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_pmon(text: str) -> list[dict]:
    """Samples of ``nvidia-smi pmon -s um``: pid, sm (%), fb (MiB); '-' as None. The
    columns are read from the header (they differ between drivers)."""
    cols, out = None, []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if "pid" in words and cols is None:
                cols = words
            continue
        words = line.split()
        if cols is None or len(words) < len(cols) - 1:
            continue
        rec = dict(zip(cols, words))
        if not rec.get("pid", "-").isdigit():
            continue

        def num(k):
            v = rec.get(k, "-")
            return float(v) if re.fullmatch(r"[\d.]+", v) else None

        out.append({"pid": int(rec["pid"]), "sm": num("sm"), "fb": num("fb")})
    return out


def parse_device(text: str) -> list[dict]:
    """Samples of ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used``."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append({"t": t, "util": float(parts[1]), "mem": float(parts[2])})
        except ValueError:
            continue
    return out


# gpu_run.csv. A step row (phase step1/step2): its jobs done (benchmark files), their
# summed, mean and longest wall seconds and summed CPU seconds; the largest
# max_memory_allocated / max_memory_reserved of its jobs (MiB); the mean and largest SM
# utilisation pmon saw for its processes (a sample of '-' counts as 0); ref_*: the same
# step in results/reference/runtime.csv (the CPU run), per job, and times this run's jobs;
# speedup: the reference's wall per job / this run's. A phase's `all` row (and install):
# its elapsed seconds, the device's utilization.gpu and memory.used (MiB) over it.
TABLE_COLUMNS = [
    "phase", "part", "step", "status", "jobs", "wall_s", "wall_per_job_s", "longest_job_s", "cpu_s",
    "gpu_mem_peak_mib", "gpu_mem_reserved_peak_mib", "gpu_util_mean_pct", "gpu_util_max_pct", "util_from",
    "ref_jobs", "ref_wall_per_job_s", "ref_cpu_per_job_s", "ref_wall_same_jobs_s", "speedup",
]  # fmt: skip


def build_table(phases: list[dict], bench: list[dict], probes: list[dict], pmon: list[dict], device: list[dict],
                reference):  # fmt: skip
    """One row per (phase, part, step) with jobs done, then one per phase: see the module's
    docstring. ``phases``: name, start, end, status; ``reference``: runtime.csv."""
    import pandas as pd

    ref = reference.set_index(["part", "step"])
    rows = []
    for ph in phases:
        in_phase = [p for p in probes if p.get("cuda") and ph["start"] <= p["start"] <= ph["end"]]
        samples = [d for d in device if ph["start"] <= d["t"] <= ph["end"]]
        steps = sorted({(b["part"], b["step"]) for b in bench if b["phase"] == ph["name"]})
        jobs_ref = 0.0
        for part, step in steps:
            b = [x["s"] for x in bench if x["phase"] == ph["name"] and (x["part"], x["step"]) == (part, step)]
            c = [x["cpu_s"] for x in bench if x["phase"] == ph["name"] and (x["part"], x["step"]) == (part, step)]
            pr = [p for p in in_phase if rule_step(p["rule"] or "") == (part, step)]
            sm = [s["sm"] or 0.0 for s in pmon if s["pid"] in {p["pid"] for p in pr}]
            row = {"phase": ph["name"], "part": part, "step": step, "status": ph["status"], "jobs": len(b),
                   "wall_s": sum(b), "wall_per_job_s": sum(b) / len(b), "longest_job_s": max(b), "cpu_s": sum(c),
                   "gpu_mem_peak_mib": max((p["max_allocated"] for p in pr), default=None),
                   "gpu_mem_reserved_peak_mib": max((p["max_reserved"] for p in pr), default=None),
                   "gpu_util_mean_pct": sum(sm) / len(sm) if sm else None, "gpu_util_max_pct": max(sm, default=None),
                   "util_from": "pmon sm% of the step's processes" if sm else ""}  # fmt: skip
            for k in ("gpu_mem_peak_mib", "gpu_mem_reserved_peak_mib"):
                row[k] = row[k] / 2**20 if row[k] is not None else None
            if (part, step) in ref.index:
                r = ref.loc[(part, step)]
                row.update(ref_jobs=int(r["jobs"]), ref_wall_per_job_s=r["wall_s"] / r["jobs"],
                           ref_cpu_per_job_s=r["cpu_s"] / r["jobs"])  # fmt: skip
                row["ref_wall_same_jobs_s"] = row["ref_wall_per_job_s"] * len(b)
                row["speedup"] = row["ref_wall_per_job_s"] / row["wall_per_job_s"] if row["wall_per_job_s"] else None
                jobs_ref += row["ref_wall_same_jobs_s"]
            rows.append(row)
        util = [d["util"] for d in samples]
        total = {"phase": ph["name"], "part": "all", "step": "all", "status": ph["status"],
                 "jobs": sum(r["jobs"] for r in rows if r["phase"] == ph["name"] and r["part"] != "all"),
                 "wall_s": ph["end"] - ph["start"], "cpu_s": sum(x["cpu_s"] for x in bench if x["phase"] == ph["name"]),
                 "gpu_mem_peak_mib": max((d["mem"] for d in samples), default=None),
                 "gpu_util_mean_pct": sum(util) / len(util) if util else None, "gpu_util_max_pct": max(util, default=None),
                 "util_from": "nvidia-smi utilization.gpu (device); memory: memory.used" if util else "",
                 "ref_wall_same_jobs_s": jobs_ref or None}  # fmt: skip
        rows.append(total)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    numeric = [c for c in TABLE_COLUMNS if c not in ("phase", "part", "step", "status", "util_from")]
    table[numeric] = table[numeric].apply(pd.to_numeric)
    return table.round(2)


def write_table(out: Path, phases: list[dict], bench: list[dict], sampler: Sampler, reference: Path):
    """out/gpu_run.csv from the run's phases, benchmark rows, probe and samplers; printed."""
    import pandas as pd

    pmon = parse_pmon(sampler.pmon_file.read_text()) if sampler.pmon_file.exists() else []
    device = parse_device(sampler.device_file.read_text()) if sampler.device_file.exists() else []
    table = build_table(phases, bench, read_probe(out / "probe.jsonl"), pmon, device, pd.read_csv(reference))
    table.to_csv(out / "gpu_run.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.to_string(index=False))
    return table
