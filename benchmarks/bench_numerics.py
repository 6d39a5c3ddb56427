"""What each numerics mode costs, measured side by side in one run.

Each mode runs in a fresh process (its pins must be set before torch is imported), on
the default config's model sizes (config/config.yaml) with the same seeds and data:
paper A's training steps/s and the scoring of one model (G over gradient batches, C by
mean ablation of every component over n OOD-length sequences), then the training
steps/s of paper B's toy IOI model and of paper C's l2h4 model. The modes are run in
turns, `--repeats` times (round r starting at the r-th setup), and the ratios are of the
medians. Setups:

    exact           AVX2 kernels, MKL COMPATIBLE, IEEE sqrt, 1 thread (same bits on Intel and AMD)
    fast            AVX2 kernels, MKL AVX2 branch dispatching as on Intel, 1 thread (same bits on Intel and AMD)
    fast-own-vendor the fast pins with MKL's own vendor dispatch (only on a CPU that is not
                    an Intel one: what fast cost there before MKL's vendor override)
    native-1        this CPU's fastest kernels, 1 thread (the cost of the pins alone)
    native-T        this CPU's fastest kernels, --threads threads (a job of config threads: T)

Then the full default run's CPU time is projected per mode: each part's CPU seconds in
results/reference/runtime.csv (measured under fast) times the ratio that fits it
(training parts: that paper's training ratio; every other step: paper A's scoring
ratio), written to --projection, for the one-thread setups (whose CPU seconds are their
wall seconds; --project-only redoes it from an existing --out). The default mode follows from it (README "Numerics":
both pinned modes give the same bits on Intel and AMD, and the cheaper, fast, is the default).

    .venv/bin/python benchmarks/bench_numerics.py [--steps 150] [--n 500] [--repeats 3]
        [--threads 2] [--out results/benchmarks/numerics.csv]
        [--projection results/benchmarks/numerics_projection.csv] [--write]

--write: also results/reference/benchmark_numerics.csv and benchmark_numerics_projection.csv,
rendered into their doc blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

ROOT = harness.ROOT


# The fast mode's pins with MKL's own vendor dispatch (no override): what fast was before
# the override, on a CPU that is not an Intel one (on Intel the two are the same run).
OWN_VENDOR = "fast-own-vendor"


def child(mode: str, threads: int, steps: int, n: int) -> dict:
    from selfrepair.core import numerics

    if mode == OWN_VENDOR:
        os.environ.update({**numerics.environment("native", 1), **numerics.MODE_PINS["fast"]})
    else:
        numerics.configure(mode, threads)
    import torch
    import yaml

    from selfrepair.core import attribution, engine, models, train
    from selfrepair.core import components as C
    from selfrepair.heroes import scores as heroes
    from selfrepair.tasks import sequences as S

    if mode == OWN_VENDOR:
        torch.set_num_threads(1)
    else:
        numerics.apply(mode, threads)
    cfg_all = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["heroes"]
    m, t = cfg_all["model"], cfg_all["train"]
    max_len = max(cfg_all["ood"]["lengths"])
    cfg = models.gpt2_toy_config(
        S.VOCAB, n_layers=m["n_layers"], n_heads=m["n_heads"], d_model=m["d_model"], d_mlp=m["d_mlp"],
        n_ctx=2 * max_len + 4, bos_token_id=S.START, eos_token_id=S.END,
    )  # fmt: skip
    model = models.build_gpt2_toy(cfg, init=m["init"], seed=42, positional=False)
    gen = torch.Generator().manual_seed(42)
    batch_fn = lambda s: S.training_batch("sort", t["batch_size"], t["min_len"], t["max_len"], gen, t["padding"])  # noqa: E731
    train.train(model, batch_fn, lambda mod: 0.0, lr=t["lr"], max_steps=10, eval_every=10**9, target_accuracy=None)
    t0 = time.perf_counter()
    train.train(model, batch_fn, lambda mod: 0.0, lr=t["lr"], max_steps=steps, eval_every=10**9, target_accuracy=None)
    train_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        models.save_model(model, Path(d) / "model")
        hf = models.load_hf(Path(d) / "model", "cpu")
        comps = C.all_components(m["n_layers"], m["n_heads"])
        batches = S.fixed_length_batches("sort", max_len, 8, 64, seed=1)
        t0 = time.perf_counter()
        attribution.gradient_norms_gpt2(hf, batches, comps, heroes.lm_loss, "sqrt")
        g_s = time.perf_counter() - t0
        fresh = S.eval_set("sort", max_len, n, seed=2)
        t0 = time.perf_counter()
        means = engine.means(hf, [b.tokens for b in batches])
        scores = heroes.causal_scores(hf, fresh, comps, "mean", means)
        c_s = time.perf_counter() - t0
    return {
        "steps_per_s": steps / train_s,
        "g_seconds": g_s,
        "c_seconds": c_s,
        "C_sum": float(scores["C"].sum()),
        "coax_steps_per_s": _coax_train_speed(steps),
        "gim_steps_per_s": _gim_train_speed(steps),
        "numerics": numerics.record("native" if mode == OWN_VENDOR else mode),
    }


def _config(paper: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())[paper]


def _coax_train_speed(steps: int) -> float:
    """Paper B: the default toy IOI model (head-dropout training), steps/s."""
    from selfrepair.coax import ioi_experiment

    c = _config("coax")["ioi"]
    m, t = c["model"], c["train"]

    def run(n):
        ioi_experiment.train_toy(m["n_layers"], m["n_heads"], m["d_model"], m["d_mlp"], seed=1,
                                 head_dropout=t["head_dropout"], lr=t["lr"], batch_size=t["batch_size"],
                                 max_steps=n, eval_every=10**9)  # fmt: skip

    run(5)
    t0 = time.perf_counter()
    run(steps)
    return steps / (time.perf_counter() - t0)


def _gim_train_speed(steps: int) -> float:
    """Paper C: the default l2h4 model on the arithmetic task, steps/s."""
    from selfrepair.gim.training import train_any
    from selfrepair.tasks.registry import get_task

    c = _config("gim")
    m = next(x for x in c["models"] if x["name"] == "l2h4")
    m = {k: v for k, v in m.items() if k != "name"}
    t = {**c["train"], "eval_every": 10**9, "target_accuracy": None}
    with tempfile.TemporaryDirectory() as d:
        train_any(get_task("arithmetic"), Path(d) / "w", device="cpu", seed=0, **m, **{**t, "max_steps": 5})
        t0 = time.perf_counter()
        train_any(get_task("arithmetic"), Path(d) / "m", device="cpu", seed=0, **m, **{**t, "max_steps": steps})
        return steps / (time.perf_counter() - t0)


def run_child(mode: str, threads: int, a) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--threads",
        str(threads),
        "--steps",
        str(a.steps),
        "--n",
        str(a.n),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if mode == OWN_VENDOR:  # no vendor override inherited from a pinned parent
        from selfrepair.core import numerics

        env = numerics.environment("native", 1, base=env)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def speed_vs_fast(med):
    """Per setup: each speed relative to the fast mode (> 1: faster than fast)."""
    out = med.assign(scoring_seconds=med["g_seconds"] + med["c_seconds"])
    base = out.loc["fast"]
    out["train_speed_vs_fast"] = out["steps_per_s"] / base["steps_per_s"]
    out["coax_train_speed_vs_fast"] = out["coax_steps_per_s"] / base["coax_steps_per_s"]
    out["gim_train_speed_vs_fast"] = out["gim_steps_per_s"] / base["gim_steps_per_s"]
    out["scoring_speed_vs_fast"] = base["scoring_seconds"] / out["scoring_seconds"]
    return out


# Which measured ratio scales which part of runtime.csv: (part, step) -> column of
# speed_vs_fast; every step not named here scales by paper A's scoring ratio.
TRAIN_STEPS = {
    ("heroes", "train"): "train_speed_vs_fast",
    ("heroes_grid", "train"): "train_speed_vs_fast",
    ("coax", "ioi_train"): "coax_train_speed_vs_fast",
    ("coax", "induction_train"): "coax_train_speed_vs_fast",
    ("coax", "pruning_train"): "coax_train_speed_vs_fast",
    ("gim", "train"): "gim_train_speed_vs_fast",
}


def project(runtime, speeds):
    """The full default run's CPU seconds per part and setup: runtime.csv's (measured
    under the fast mode) divided by the measured speed ratio that fits each step."""
    import pandas as pd

    steps = runtime[runtime["step"] != "all"]
    rows = []
    # one-thread setups only: there a job's CPU seconds are its wall seconds, so a speed
    # ratio scales them; a T-thread job's CPU time is not its speed's inverse
    for setup, sp in speeds[speeds["threads"] == 1].iterrows():
        for (part, step), r in steps.set_index(["part", "step"]).iterrows():
            col = TRAIN_STEPS.get((part, step), "scoring_speed_vs_fast")
            rows.append({"setup": setup, "part": part, "step": step, "ratio_from": col,
                         "cpu_s_fast": r["cpu_s"], "cpu_s": r["cpu_s"] / sp[col]})  # fmt: skip
    per = pd.DataFrame(rows)
    tot = per.groupby("setup", sort=False)[["cpu_s_fast", "cpu_s"]].sum().reset_index()
    tot = tot.assign(part="all", step="all", ratio_from="", cost_vs_fast=tot["cpu_s"] / tot["cpu_s_fast"])
    return pd.concat([per, tot], ignore_index=True)


def measure(a):
    """Every setup --repeats times, in turns: a DataFrame, one row per run."""
    from selfrepair.core import numerics

    setups = {"exact": ("exact", 1), "fast": ("fast", 1)}
    if numerics.needs_intel_dispatch():  # fast with and without MKL's vendor override
        setups[OWN_VENDOR] = (OWN_VENDOR, 1)
    setups |= {"native-1": ("native", 1), f"native-{a.threads}": ("native", a.threads)}
    calls = {name: (lambda m=mode, t=threads: run_child(m, t, a)) for name, (mode, threads) in setups.items()}
    rows = []
    for rep, name, r in harness.interleaved(calls, a.repeats):
        rows.append({"setup": name, "repeat": rep, "steps_per_s": r["steps_per_s"], "g_seconds": r["g_seconds"],
                     "c_seconds": r["c_seconds"], "coax_steps_per_s": r["coax_steps_per_s"],
                     "gim_steps_per_s": r["gim_steps_per_s"], "C_sum": r["C_sum"],
                     "aten": r["numerics"]["aten_capability"], "threads": r["numerics"]["threads"],
                     "cpu": r["numerics"]["cpu"], "cpu_vendor": r["numerics"]["cpu_vendor"]})  # fmt: skip
        print(rows[-1], flush=True)
    import pandas as pd

    return pd.DataFrame(rows)


def summarize(raw, a):
    """Per setup (in the order of the first round): the medians and the speeds relative to fast."""
    speeds = ["steps_per_s", "coax_steps_per_s", "gim_steps_per_s"]
    by = raw.groupby("setup", sort=False)
    out = speed_vs_fast(by[[*speeds, "g_seconds", "c_seconds"]].median())
    return out.reset_index().assign(
        aten=by["aten"].first().values, threads=by["threads"].first().values, repeats=a.repeats, steps=a.steps,
        n=a.n, cpu=raw["cpu"].iloc[0], cpu_vendor=raw["cpu_vendor"].iloc[0],
    )  # fmt: skip


def main(argv=None):
    ap = harness.arguments(__doc__, "numerics.csv", threads=2, modes=False)
    ap.add_argument("--steps", type=int, default=150, help="timed training steps")
    ap.add_argument("--n", type=int, default=500, help="sequences for C")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--projection", default="results/benchmarks/numerics_projection.csv")
    ap.add_argument("--project-only", action="store_true", help="only redo the projection from an existing --out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.steps, a.n)))
        return
    import pandas as pd

    if a.project_only:
        out = pd.read_csv(a.out)
    else:
        out = summarize(measure(a), a)
        harness.write(out, a)
        print(out.to_string(index=False))
    proj = project(pd.read_csv(ROOT / "results" / "reference" / "runtime.csv"), out.set_index("setup"))
    harness.write(proj, a, out=a.projection)
    print((proj[proj["part"] == "all"] if a.project_only else proj).to_string(index=False))


if __name__ == "__main__":
    main()
