"""Each real-LM rule's CPU time against its executed-work floor: the matmul FLOPs the
job runs, at the matmul rate measured on the same machine in the same run.

Every rule named (``coax_lm``, ``gim_lm``, ``groundtruth_lm``) runs twice on each packaged
model, through the workflow itself (the same Snakefile, rules and scripts as a run), in a
scratch folder (``--workdir``) at the sizes of ``--sizes`` (a config file merged over
config/config.yaml; default: this script's small sizes, a few CPU-minutes per job):

1. plainly, ``snakemake --cores 1 --forcerun``: the job's CPU seconds from its
   ``benchmark:`` file, kept in ``plain_cpu.json`` (the counted run writes that file again);
2. again, forced too, with ``SELFREPAIR_FLOPS_OUT`` set, so that each job counts
   every matmul FLOP it runs (``runtime.count_flops``: torch's FLOP formulas; linear
   layers, matmuls and the unembedding, forward and backward, not the CPU's fused
   attention kernels) and appends them to a file.

Then ``floor_s`` = FLOPs / the matmul rate (``harness.matmul_throughput``) and
``over_floor`` = CPU seconds / floor_s: 1 would be every counted FLOP at the rate of a
large float32 matmul; what is above is the model's small matmuls, attention, Python,
hooks and whatever else the job does besides matmuls.

    python benchmarks/bench_lm_floor.py [--models smollm2-135m gemma-3-270m]
        [--rules coax_lm gim_lm groundtruth_lm] [--sizes FILE] [--workdir DIR] [--reuse]
        [--before REV] [--write]

``--reuse``: the two runs are already in ``--workdir`` (an earlier call's); only measure
the matmul rate again and write the rows (when something shared the machine during the
first call's rate).

``--before REV``: also run each job plainly on the code of git revision ``REV`` (its
tree unpacked into ``--workdir``/code-before, its ``src`` first on the jobs' path; its
outputs in ``--workdir``/before), each job's two plain runs one after the other, the
order alternating from one job to the next, so that both sides share the machine's
state: ``cpu_s_before``, ``over_floor_before`` (the same FLOPs: a change that moves the
FLOPs is not a before and after of one job) and ``after_over_before``.

One row per (rule, model) goes to ``--out`` (merged with its other rows); ``--write``:
also results/reference/benchmark_lm_floor.csv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness

harness.configure()

import pandas as pd  # noqa: E402

ROOT = harness.ROOT
RULES = {  # rule: an output the rule writes for model {m}
    "coax_lm": "results/coax/lms/{m}/status.csv",
    "gim_lm": "results/gim/lms/{m}/status.csv",
    "groundtruth_lm": "results/groundtruth/lms/{m}/shapley.csv",
}
# a few CPU-minutes per job on 2 cores; every part of each rule still runs
SMALL = """\
coax:
  lms:
    default: {n_bos: 4, n_truth: 4, n_prompts: 4, data_seeds: [1], induction_T: 48, induction_prompts: 2}
gim:
  lms:
    n_eval: 4
    batch_size: 4
    fa_examples: 2
groundtruth:
  lms: {n_pairs: 4}
"""


def snakemake(workdir: Path, configs: list[Path], targets: list[str], extra: list[str], env: dict,
              code: Path = ROOT) -> None:  # fmt: skip
    """One run of the workflow of the tree ``code`` in ``workdir`` (one job at a time);
    raises on failure."""
    cmd = [
        sys.executable, "-m", "snakemake", "--snakefile", str(code / "Snakefile"), "--directory", str(workdir),
        "--configfile", *map(str, configs), "--cores", "1", *extra, "--", *targets,
    ]  # fmt: skip
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def flops_lines(path: Path) -> dict[tuple[str, str], dict]:
    """The counted jobs' lines, by (rule, model)."""
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        r = json.loads(line)
        out[(r["rule"], r["wildcards"].get("lm", ""))] = r
    return out


def code_at(rev: str, into: Path) -> Path:
    """This repository's tree at git revision ``rev``, unpacked into ``into`` (once)."""
    if not (into / "Snakefile").exists():
        into.mkdir(parents=True, exist_ok=True)
        tree = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=tree, check=True)
    return into


def short(rev: str) -> str:
    """The abbreviated commit hash of git revision ``rev``; SystemExit naming it when this
    repository has no such commit."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}"],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"--before {rev}: no such commit in {ROOT}")
    return r.stdout.strip()


def plain_runs(sides: dict, configs: dict, rules, models, env: dict) -> dict:
    """{side: {(rule, model): CPU seconds}}: each job run plainly (forced) on each side
    ({side: (code tree, workdir, extra environment)}), a job's sides one after the other,
    their order turned by one from one job to the next."""
    names, out = list(sides), {s: {} for s in sides}
    for i, (rule, m) in enumerate((r, m) for r in rules for m in models):
        for side in names[i % len(names) :] + names[: i % len(names)]:
            code, work, extra = sides[side]
            snakemake(work, configs[side], [RULES[rule].format(m=m)], ["--forcerun", rule], {**env, **extra}, code)
            out[side].update(plain_cpu(work, [rule], [m]))
    return out


def plain_cpu(workdir: Path, rules, models) -> dict[tuple[str, str], float]:
    """Each job's CPU seconds from its ``benchmark:`` file, read after the plain run (the
    counted run writes the same files again), as the cost table reads them
    (:func:`selfrepair.tooling.real_lms_table.cost_table`)."""
    from selfrepair.tooling.real_lms_table import cost_table

    t = cost_table(workdir / "benchmarks", scales=[]).set_index(["rule", "model"])["cpu_s"]
    missing = [(r, m) for r in rules for m in models if (r, m) not in t.index]
    if missing:
        raise SystemExit(f"{workdir}: no benchmark: file of {missing} (did the run fail?)")
    return {(r, m): float(t[(r, m)]) for r in rules for m in models}


def floor_rows(rules, models, cpu: dict, counted: dict, rate: float, before: dict | None = None) -> list[dict]:
    """One row per (rule, model): the plain run's CPU seconds (``cpu``), the counted FLOPs,
    the floor; with ``before`` (the CPU seconds of the same jobs on earlier code), those,
    their ratio to the floor, and the plain run's ratio to them."""
    rows = []
    for rule in rules:
        for m in models:
            c = counted.get((rule, m))
            if c is None:
                raise SystemExit(f"{rule} on {m}: the counted run wrote no FLOP line")
            floor = c["flops"] / rate
            rows.append(
                {
                    "rule": rule,
                    "model": m,
                    "cpu_s": round(cpu[(rule, m)], 1),
                    "gflop": round(c["flops"] / 1e9, 1),
                    "matmul_gflop_per_s": round(rate / 1e9, 1),
                    "floor_s": round(floor, 1),
                    "over_floor": round(cpu[(rule, m)] / floor, 2),
                    "cpu_s_counting": round(c["cpu_s"], 1),
                }  # fmt: skip
            )
            if before is not None:
                b = before[(rule, m)]
                rows[-1].update(cpu_s_before=round(b, 1), over_floor_before=round(b / floor, 2),
                                after_over_before=round(cpu[(rule, m)] / b, 3))  # fmt: skip
    return rows


def main(argv=None) -> int:
    ap = harness.arguments(__doc__, "lm_floor.csv", threads=1)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    ap.add_argument("--sizes", type=Path, help="a config file merged over config/config.yaml (default: small sizes)")
    ap.add_argument("--workdir", type=Path, help="scratch folder of the two runs (default: a new temporary one)")
    ap.add_argument("--reuse", action="store_true", help="the two runs already in --workdir: measure the rate, write")
    ap.add_argument("--before", metavar="REV", help="also run each job plainly on git revision REV, side by side")
    args = ap.parse_args(argv)
    if args.reuse and not args.workdir:
        ap.error("--reuse needs the --workdir of the earlier runs")
    before_rev = short(args.before) if args.before else None  # a bad revision stops here, before any run
    threads = harness.start(args)  # the matmul rate under the jobs' numerics and threads
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="selfrepair-floor-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = args.sizes.resolve() if args.sizes else workdir / "sizes.yaml"
    if not args.sizes:
        sizes.write_text(SMALL)
    models = {"lms": {"models": list(args.models), "scale": "default"}, "numerics": args.numerics,
              "threads": args.threads, "device": "cpu"}  # fmt: skip
    (workdir / "models.yaml").write_text(json.dumps(models))
    configs = [ROOT / "config" / "config.yaml", sizes, workdir / "models.yaml"]
    targets = [RULES[r].format(m=m) for r in args.rules for m in args.models]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("SELFREPAIR_FLOPS_OUT", None)
    flops, plain = workdir / "flops.jsonl", workdir / "plain_cpu.json"
    if not args.reuse:  # every run forced: a workdir's earlier outputs would leave stale benchmark: files
        sides, side_configs = {"after": (ROOT, workdir, {})}, {"after": configs}
        if args.before:
            code = code_at(before_rev, workdir / "code-before")
            sides["before"] = (code, workdir / "before", {"PYTHONPATH": str(code / "src")})
            side_configs["before"] = [code / "config" / "config.yaml", *configs[1:]]
        cpu = plain_runs(sides, side_configs, args.rules, args.models, env)
        plain.write_text(json.dumps({s: [[r, m, v] for (r, m), v in c.items()] for s, c in cpu.items()}))
        flops.unlink(missing_ok=True)
        counted = {**env, "SELFREPAIR_FLOPS_OUT": str(flops)}
        snakemake(workdir, configs, targets, ["--forcerun", *args.rules], counted)
    rate = harness.matmul_throughput()
    kept = json.loads(plain.read_text())
    kept = kept if isinstance(kept, dict) else {"after": kept}  # an earlier call's file: one side
    cpu = {s: {(r, m): v for r, m, v in c} for s, c in kept.items()}
    if args.before and "before" not in cpu:
        raise SystemExit(f"{plain}: no runs on earlier code there (call without --reuse)")
    before = cpu.get("before") if args.before else None
    rows = floor_rows(args.rules, args.models, cpu["after"], flops_lines(flops), rate, before)
    sized = "small" if not args.sizes else args.sizes.name  # the small sizes: SMALL above
    meta = {"sizes": sized, "threads": threads, "numerics": args.numerics, "machine": harness.machine(),
            "commit": harness.commit(), **({"before": before_rev} if before_rev else {})}  # fmt: skip
    table = pd.DataFrame([{**r, **meta} for r in rows])
    print(table.to_string(index=False))
    harness.write(table, args, keys=["rule", "model"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
