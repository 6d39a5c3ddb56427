"""What the portable numerics mode costs, measured side by side in one run.

Each mode runs in a fresh process (its pins must be set before torch is imported), on
paper A's default model size (config/config.yaml heroes.model) with the same seed and
data: training steps/s, then the scoring of one model (G over gradient batches, C by
mean ablation of every component over n OOD-length sequences). The modes are run in
turns, `--repeats` times, and the ratios are of the medians. Modes:

    portable        AVX2 kernels, 1 thread (the default)
    native-1        this CPU's fastest kernels, 1 thread (the cost of the pins alone)
    native-T        this CPU's fastest kernels, --threads threads (a job of config threads: T)

    .venv/bin/python benchmarks/bench_numerics.py [--steps 150] [--n 500] [--repeats 3]
        [--threads 2] [--out results/benchmarks/numerics.csv]
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

ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, threads: int, steps: int, n: int) -> dict:
    from selfrepair.core import numerics

    numerics.configure(mode, threads)
    import torch
    import yaml

    from selfrepair.core import attribution, engine, models, train
    from selfrepair.core import components as C
    from selfrepair.heroes import scores as heroes
    from selfrepair.tasks import sequences as S

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
        "numerics": numerics.record(mode),
    }


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
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150, help="timed training steps")
    ap.add_argument("--n", type=int, default=500, help="sequences for C")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of the native-T mode")
    ap.add_argument("--out", default="results/benchmarks/numerics.csv")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.steps, a.n)))
        return
    import pandas as pd

    setups = [("portable", "portable", 1), ("native-1", "native", 1), (f"native-{a.threads}", "native", a.threads)]
    rows = []
    for rep in range(a.repeats):
        for name, mode, threads in setups:
            r = run_child(mode, threads, a)
            rows.append({"setup": name, "repeat": rep, "steps_per_s": r["steps_per_s"], "g_seconds": r["g_seconds"],
                         "c_seconds": r["c_seconds"], "C_sum": r["C_sum"], "aten": r["numerics"]["aten_capability"],
                         "threads": r["numerics"]["threads"], "cpu": r["numerics"]["cpu"]})  # fmt: skip
            print(rows[-1], flush=True)
    raw = pd.DataFrame(rows)
    med = raw.groupby("setup", sort=False)[["steps_per_s", "g_seconds", "c_seconds"]].median()
    base = med.loc["portable"]
    out = med.assign(
        train_speed_vs_portable=med["steps_per_s"] / base["steps_per_s"],
        scoring_seconds=med["g_seconds"] + med["c_seconds"],
    )
    out["scoring_speed_vs_portable"] = (base["g_seconds"] + base["c_seconds"]) / out["scoring_seconds"]
    out = out.reset_index().assign(
        aten=raw.groupby("setup", sort=False)["aten"].first().values,
        threads=raw.groupby("setup", sort=False)["threads"].first().values,
        repeats=a.repeats, steps=a.steps, n=a.n, cpu=rows[0]["cpu"],
    )  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(a.out, index=False)
    print(out.to_string(index=False))


if __name__ == "__main__":
    main()
