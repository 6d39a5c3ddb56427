"""The ground truth, speed: time per coalition of paper A's games on paper A's ablation
engine against the bridge path, the plain-forward floor and the executed-work floor, all
measured in the same run (ratios, never timed assertions).

Paths: the bridge's hooks (``games.AblationGame``: the batch repeated once per coalition,
``--max-rows`` sequences per forward, or one coalition per forward, a full forward each)
and paper A's ablation engine (``games.EngineGame``: each coalition resumes from the
intact model or the previous coalition at its first differing layer), with the game's
order (consecutive coalitions share their longest layer prefix), in the order given, and
without prefix reuse. Floors, per coalition: one plain forward of the batch through the
bridge (a full forward per coalition cannot go below it; prefix reuse computes less, so
the engine can), and the executed-work floor: the matmul FLOPs the call executes (counted
once, untimed, by torch's FlopCounterMode, as benchmarks/bench_heroes.py counts them; not
the attention kernels, 1-2% here) over this machine's matmul throughput, measured here.
``over_bridge``: time per coalition over the bridge path's (one coalition per forward) on
the same coalitions; ``max_abs_diff``: the largest |v_engine - v_bridge| over them.

Workloads, on the two paper-A games (exact-match accuracy, mean log-probability of the
targets): random coalitions (prefixes of random permutations, one size each), one round
of the permutation estimator (every prefix of ``--pairs`` antithetic pairs of
permutations, deduplicated, as the estimator's cache asks for them), the permutation
estimator end to end on the log-probability game (``--permutations``, its minimum of
pairs lowered to them here), and then the exact-match game's estimator (truncated at 0)
on an engine game of its own against the same game after the log-prob game on one
``games.EngineGames``, which reruns none of the coalitions the log-prob game ran, as the
ground truth runs them (``note``: how many ran). The model is a randomly initialized
GPT-2 of paper A's size (config.yaml's heroes model: 4 layers, 4 heads, d_model 128,
d_mlp 512), or ``--model``.

    .venv/bin/python benchmarks/bench_groundtruth.py [--n 200] [--length 9] [--coalitions 64]
        [--pairs 8] [--permutations 16] [--mode mean] [--max-rows 1024] [--threads 2]
        [--numerics fast] [--model results/heroes/sort/seed42/model]
        [--out results/benchmarks/groundtruth.csv]
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
from bench_heroes import executed_flops, forward_flops, matmul_throughput

from selfrepair.core import components as C
from selfrepair.core import interventions, models
from selfrepair.groundtruth import games
from selfrepair.groundtruth import shapley as sh
from selfrepair.tasks import sequences as S


def paper_a_models(folder: Path, model: str | None):
    """(bridge, Hugging Face model) of ``model``, or of a random paper-A-sized GPT-2 saved
    in ``folder``."""
    if not model:
        cfg = models.gpt2_toy_config(S.VOCAB, n_layers=4, n_heads=4, d_model=128, d_mlp=512, n_ctx=64)
        models.save_model(models.build_gpt2_toy(cfg, seed=0), folder)
        model = folder
    return models.load_bridge(model), models.load_hf(model)


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


def round_coalitions(components, pairs: int, seed: int) -> list[list]:
    """Every prefix (sizes 1..n-1; the empty and the full set are cached apart) of
    ``pairs`` random permutations and their reverses, each coalition once, in the order
    the permutation estimator's cache hands them to the game."""
    rng = np.random.default_rng(seed)
    n = len(components)
    fwd = [rng.permutation(n) for _ in range(pairs)]
    seen: dict[frozenset, list] = {}
    for perm in fwd + [p[::-1] for p in fwd]:
        for k in range(1, n):
            s = [components[i] for i in perm[:k]]
            seen.setdefault(frozenset(s), s)
    return list(seen.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a trained model folder (default: a random paper-A-sized model)")
    ap.add_argument("--task", default="sort")
    ap.add_argument("--n", type=int, default=200, help="evaluation sequences (the ground truth's n_eval)")
    ap.add_argument("--length", type=int, default=9, help="sequence length (paper A's OOD lengths are 8-11)")
    ap.add_argument("--coalitions", type=int, default=64, help="random coalitions")
    ap.add_argument("--pairs", type=int, default=8, help="antithetic pairs of the permutation round (pairs_per_round)")
    ap.add_argument("--permutations", type=int, default=16, help="permutations of the end-to-end rows (even)")
    ap.add_argument("--mode", choices=interventions.MODES, default="mean")
    ap.add_argument(
        "--max-rows",
        type=int,
        nargs="*",
        default=[1024],
        help="also the bridge path with this many sequences per batched forward (one row each)",
    )
    ap.add_argument("--rows", type=int, default=256, help="sequences per engine chunk (the ground truth's max_rows)")
    ap.add_argument("--reps", type=int, default=10, help="plain forwards timed before and after (median of all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--numerics", choices=numerics.MODES, default=numerics.DEFAULT_MODE)
    ap.add_argument("--out", default=None, help="also write the rows to this CSV")
    a = ap.parse_args()
    threads = numerics.apply(a.numerics, a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        br, hf = paper_a_models(Path(tmp) / "model", a.model)
    cfg = hf.config
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    batch = S.eval_set(a.task, a.length, a.n, seed=2)
    means = interventions.component_means(br, [batch.tokens], comps)
    flops_per_s = matmul_throughput()
    flops_forward = forward_flops(cfg, a.n, batch.tokens.shape[1])
    before = forward_times(br, batch.tokens, a.reps)  # the floor: timed before and after the rest
    workloads = {
        "random prefixes": prefix_coalitions(comps, a.coalitions, seed=0),
        f"permutation round ({a.pairs} pairs)": round_coalitions(comps, a.pairs, seed=1),
    }
    rows = []

    def row(part, path, n_coalitions, seconds, executed, bridge_s=float("nan"), diff=float("nan"), note=""):
        rows.append(
            {
                "part": part,
                "path": path,
                "coalitions": n_coalitions,
                "seconds": seconds,
                "coalitions_per_s": n_coalitions / seconds,
                "seconds_per_coalition": seconds / n_coalitions,
                "over_bridge": seconds / bridge_s,
                "executed_fraction": executed / (n_coalitions * flops_forward),
                "over_executed": seconds / (executed / flops_per_s),
                "max_abs_diff": diff,
                "note": note,
            }
        )
        print(rows[-1], flush=True)

    def timed(game, sets):
        game(sets[:2])  # warm-up
        t0 = time.perf_counter()
        v = game(sets)
        return v, time.perf_counter() - t0

    makers = {
        "exact match": (games.exact_match_game, games.exact_match_reduce),
        "log-prob": (games.logprob_game, games.logprob_reduce),
    }
    for wname, sets in workloads.items():
        for gname, (bridge_game, reduce) in makers.items():
            part = f"{gname}, {wname}"
            ref, ref_s = timed(bridge_game(br, batch, a.mode, means, a.n), sets)
            flops = executed_flops(lambda: bridge_game(br, batch, a.mode, means, a.n)(sets))
            row(part, "bridge, one coalition per forward", len(sets), ref_s, flops, ref_s, 0.0)
            for m in a.max_rows:
                v, s = timed(bridge_game(br, batch, a.mode, means, m), sets)
                flops = executed_flops(lambda m=m: bridge_game(br, batch, a.mode, means, m)(sets))
                diff = float(np.abs(v - ref).max())
                row(part, f"bridge, max_rows {m}", len(sets), s, flops, ref_s, diff)
            for how, kw in (
                ("engine, the game's order", {}),
                ("engine, order given", {"order": False}),
                ("engine, no prefix reuse", {"reuse": False}),
            ):

                def make(kw=kw):
                    return games.EngineGame(hf, batch.tokens, reduce(batch), a.mode, means, a.rows, **kw)

                v, s = timed(make(), sets)
                flops = executed_flops(lambda: make()(sets))
                row(part, how, len(sets), s, flops, ref_s, float(np.abs(v - ref).max()), f"rows {a.rows}")

    # the permutation estimator end to end (cache of evaluated coalitions, antithetic pairs)
    kw = dict(max_permutations=a.permutations, min_pairs=max(2, a.permutations // 2), rel_se=0.0, seed=0)
    res = {}
    for path, game in (
        ("bridge, one coalition per forward", games.logprob_game(br, batch, a.mode, means, a.n)),
        (
            "engine, the game's order",
            games.EngineGame(hf, batch.tokens, games.logprob_reduce(batch), a.mode, means, a.rows),
        ),
    ):
        t0 = time.perf_counter()
        res[path] = sh.permutation_shapley(game, comps, **kw), time.perf_counter() - t0
    (rb, sb), (re, se) = res.values()
    part = f"log-prob, permutation Shapley ({rb.n_permutations} permutations, {rb.n_pairs} pairs)"
    note = f"{len(comps)} players; max SE {np.nanmax(rb.se):.3g} on |Shapley| up to {np.abs(rb.values).max():.3g}"
    for path, (r, s) in res.items():
        diff = float(np.abs(r.values - rb.values).max())
        row(part, path, r.n_evaluations, s, float("nan"), sb * r.n_evaluations / rb.n_evaluations, diff, note)
    # the ground truth's second game: exact match, truncated at 0, after the log-prob game
    # on the same EngineGames (its permutations are the log-prob game's: the same seed),
    # against exact match on an engine game of its own
    reduces = {"log-prob": games.logprob_reduce(batch), "exact match": games.exact_match_reduce(batch)}
    shared = games.EngineGames(hf, batch.tokens, reduces, a.mode, means, a.rows)
    sh.permutation_shapley(shared.game("log-prob"), comps, **kw)
    acc = {}
    for path, game in (
        (
            "engine, a game of its own",
            games.EngineGame(hf, batch.tokens, reduces["exact match"], a.mode, means, a.rows),
        ),
        ("engine, after log-prob on one EngineGames", shared.game("exact match")),
    ):
        run0 = game.shared.n_run
        t0 = time.perf_counter()
        r = sh.permutation_shapley(game, comps, floor=0.0, **kw)
        acc[path] = r, time.perf_counter() - t0, game.shared.n_run - run0
    ra = acc["engine, a game of its own"][0]
    part = f"exact match, permutation Shapley ({ra.n_permutations} permutations, truncated at 0)"
    for path, (r, s, n_run) in acc.items():
        diff = float(np.abs(r.values - ra.values).max())
        row(part, path, r.n_evaluations, s, float("nan"), float("nan"), diff, f"{n_run} coalitions run")
    floor_s = statistics.median(before + forward_times(br, batch.tokens, a.reps))
    df = pd.DataFrame(rows)
    df["floor_coalitions_per_s"] = 1 / floor_s
    df["over_floor"] = df["seconds_per_coalition"] / floor_s  # time per coalition / one plain forward
    df.insert(0, "threads", threads)
    df.insert(1, "numerics", a.numerics)
    df["n"], df["length"], df["plain_forward_s"] = a.n, a.length, floor_s
    df["matmul_gflops"] = flops_per_s / 1e9
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out, index=False)
    cols = ["part", "path", "coalitions", "seconds_per_coalition", "over_bridge", "over_floor"]
    cols += ["executed_fraction", "over_executed", "max_abs_diff"]
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        print(f"plain forward of {a.n} sequences: {floor_s:.4g} s; matmul {flops_per_s / 1e9:.3g} GFLOP/s")


if __name__ == "__main__":
    main()
