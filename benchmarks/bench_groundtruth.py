"""The ground truth, speed: coalitions evaluated per second on a paper-A-sized model,
against the floor, one plain forward pass of the same batch, measured in the same run.

A coalition costs at least one forward of the evaluation batch (its copy of the batch
in the repeated forward of ``interventions.run_ablated``), so the floor is
1 / (time of one plain forward) coalitions per second. Rows: the two paper-A games
(exact-match accuracy, mean log-probability of the targets) on random coalitions
(prefixes of random permutations, the permutation estimator's coalitions), batched
(``--max-rows``) and one coalition per forward; and the permutation estimator end to
end (antithetic pairs, cache of evaluated coalitions) on the log-probability game.
The model is a randomly initialized GPT-2 of paper A's size (config.yaml's heroes
model: 4 layers, 4 heads, d_model 128, d_mlp 512), or ``--model`` (a trained folder).

    .venv/bin/python benchmarks/bench_groundtruth.py [--n 500] [--length 9] [--coalitions 64]
        [--permutations 16] [--mode mean] [--max-rows 4096 1024] [--threads 2] [--numerics fast]
        [--model results/heroes/sort/seed42/model] [--out results/benchmarks/groundtruth.csv]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from selfrepair.core import numerics

# The numerics mode is put in force before torch is imported (src/selfrepair/core/numerics.py).
NUMERICS = numerics.configure_from_argv(sys.argv)

import numpy as np
import pandas as pd
import torch

from selfrepair.core import components as C
from selfrepair.core import interventions, models
from selfrepair.groundtruth import games
from selfrepair.groundtruth import shapley as sh
from selfrepair.tasks import sequences as S


def paper_a_bridge(folder: Path, model: str | None):
    """The bridge of ``model``, or of a random paper-A-sized GPT-2 saved in ``folder``."""
    if model:
        return models.load_bridge(model)
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=4, n_heads=4, d_model=128, d_mlp=512, n_ctx=64)
    models.save_model(models.build_gpt2_toy(cfg, seed=0), folder)
    return models.load_bridge(folder)


def forward_times(bridge, tokens: torch.Tensor, reps: int) -> list[float]:
    """Times of ``reps`` plain forwards of ``tokens`` (after one warm-up)."""
    times = []
    with torch.no_grad():
        bridge(tokens)
        for _ in range(reps):
            t0 = time.perf_counter()
            bridge(tokens)
            times.append(time.perf_counter() - t0)
    return times


def prefix_coalitions(components, count: int, seed: int) -> list[list]:
    """``count`` coalitions: prefixes of random permutations, sizes 1..n-1 in turn."""
    rng = np.random.default_rng(seed)
    n = len(components)
    out = []
    while len(out) < count:
        perm = rng.permutation(n)
        size = len(out) % (n - 1) + 1
        out.append([components[i] for i in sorted(perm[:size])])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a trained model folder (default: a random paper-A-sized model)")
    ap.add_argument("--task", default="sort")
    ap.add_argument("--n", type=int, default=500, help="evaluation sequences")
    ap.add_argument("--length", type=int, default=9, help="sequence length (paper A's OOD lengths are 8-11)")
    ap.add_argument("--coalitions", type=int, default=64)
    ap.add_argument("--permutations", type=int, default=16, help="permutations of the end-to-end row (even)")
    ap.add_argument("--mode", choices=interventions.MODES, default="mean")
    ap.add_argument(
        "--max-rows",
        type=int,
        nargs="+",
        default=[4096, 1024],
        help="sequences per batched forward, one row each (the end-to-end row uses the first)",
    )
    ap.add_argument("--reps", type=int, default=10, help="plain forwards timed before and after (median of all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--numerics", choices=numerics.MODES, default=numerics.DEFAULT_MODE)
    ap.add_argument("--out", default=None, help="also write the rows to this CSV")
    a = ap.parse_args()
    threads = numerics.apply(a.numerics, a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        br = paper_a_bridge(Path(tmp) / "model", a.model)
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    batch = S.eval_set(a.task, a.length, a.n, seed=2)
    means = interventions.component_means(br, [batch.tokens], comps)
    before = forward_times(br, batch.tokens, a.reps)  # the floor: timed before and after the rest
    sets = prefix_coalitions(comps, a.coalitions, seed=0)
    rows = []

    def row(part, n_coalitions, seconds, note):
        rows.append(
            {
                "part": part,
                "coalitions": n_coalitions,
                "seconds": seconds,
                "coalitions_per_s": n_coalitions / seconds,
                "note": note,
            }
        )
        print(rows[-1], flush=True)

    for name, make in (("exact match", games.exact_match_game), ("log-prob", games.logprob_game)):
        sizes = [(m, f"batched, max_rows {m}") for m in a.max_rows] + [(a.n, "one coalition per forward")]
        for max_rows, how in sizes:
            game = make(br, batch, a.mode, means, max_rows)
            game(sets[:2])  # warm-up
            t0 = time.perf_counter()
            game(sets)
            row(f"{name}, {how}", len(sets), time.perf_counter() - t0, f"{a.mode} ablation")

    game = games.logprob_game(br, batch, a.mode, means, a.max_rows[0])
    t0 = time.perf_counter()
    res = sh.permutation_shapley(game, comps, max_permutations=a.permutations, rel_se=0.0, seed=0)
    max_se = float(np.nanmax(res.se)) if np.isfinite(res.se).any() else float("nan")  # NaN with one pair
    row(
        f"permutation Shapley, {res.n_permutations} permutations ({res.n_permutations // 2} antithetic pairs)",
        res.n_evaluations,
        time.perf_counter() - t0,
        f"max_rows {a.max_rows[0]}; {len(comps)} players; max SE {max_se:.3g}"
        f" on |Shapley| up to {np.abs(res.values).max():.3g}",
    )
    floor_s = statistics.median(before + forward_times(br, batch.tokens, a.reps))
    df = pd.DataFrame(rows)
    df["floor_coalitions_per_s"] = 1 / floor_s
    df["over_floor"] = df["seconds"] / df["coalitions"] / floor_s  # time per coalition / one plain forward
    df.insert(0, "threads", threads)
    df.insert(1, "numerics", a.numerics)
    df["n"], df["length"], df["plain_forward_s"] = a.n, a.length, floor_s
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["note"]).to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
