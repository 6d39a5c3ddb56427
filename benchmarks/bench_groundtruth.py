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
once, untimed, by torch's FLOP formulas, as benchmarks/bench_heroes.py counts them; not
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
        [--out results/benchmarks/groundtruth.csv] [--write]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NUMERICS = harness.configure()  # before torch is imported

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from harness import executed_flops, forward_flops  # noqa: E402

from selfrepair.core import components as C  # noqa: E402
from selfrepair.core import interventions, models  # noqa: E402
from selfrepair.groundtruth import games  # noqa: E402
from selfrepair.groundtruth import shapley as sh  # noqa: E402
from selfrepair.tasks import sequences as S  # noqa: E402

GAMES = {  # name -> (the bridge path's game, the engine's reduction)
    "exact match": (games.exact_match_game, games.exact_match_reduce),
    "log-prob": (games.logprob_game, games.logprob_reduce),
}


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


@dataclass
class Bench:
    """The model, batch and means the parts share; ``row`` adds a row."""

    a: object
    br: object
    hf: object
    batch: object
    means: dict
    flops_per_s: float
    flops_forward: float
    rows: list = field(default_factory=list)

    def row(self, part, path, n_coalitions, seconds, executed, bridge_s=float("nan"), diff=float("nan"), note=""):
        r = harness.floor_ratios(seconds, n_coalitions * self.flops_forward, executed, self.flops_per_s)
        self.rows.append({"part": part, "path": path, "coalitions": n_coalitions, "seconds": seconds,
                          "coalitions_per_s": n_coalitions / seconds, "seconds_per_coalition": seconds / n_coalitions,
                          "over_bridge": seconds / bridge_s, "executed_fraction": r["executed_fraction"],
                          "over_executed": r["over_executed"], "max_abs_diff": diff, "note": note})  # fmt: skip
        print(self.rows[-1], flush=True)

    def engine(self, reduce, **kw):
        return games.EngineGame(self.hf, self.batch.tokens, reduce, self.a.mode, self.means, self.a.rows, **kw)


def timed_game(game, sets):
    """(values, seconds) of ``game(sets)`` after a warm-up on two coalitions."""
    game(sets[:2])
    return harness.timed(lambda: game(sets))


def workload_rows(b: Bench, wname: str, sets: list) -> None:
    """Both games on ``sets``: the bridge path (one coalition per forward, then each
    --max-rows), then the engine in the game's order, in the order given, without reuse."""
    a, br, batch = b.a, b.br, b.batch
    for gname, (bridge_game, reduce) in GAMES.items():
        part = f"{gname}, {wname}"
        ref, ref_s = timed_game(bridge_game(br, batch, a.mode, b.means, a.n), sets)
        flops = executed_flops(lambda: bridge_game(br, batch, a.mode, b.means, a.n)(sets))
        b.row(part, "bridge, one coalition per forward", len(sets), ref_s, flops, ref_s, 0.0)
        for m in a.max_rows:
            v, s = timed_game(bridge_game(br, batch, a.mode, b.means, m), sets)
            flops = executed_flops(lambda m=m: bridge_game(br, batch, a.mode, b.means, m)(sets))
            b.row(part, f"bridge, max_rows {m}", len(sets), s, flops, ref_s, float(np.abs(v - ref).max()))
        for how, kw in (
            ("engine, the game's order", {}),
            ("engine, order given", {"order": False}),
            ("engine, no prefix reuse", {"reuse": False}),
        ):
            v, s = timed_game(b.engine(reduce(batch), **kw), sets)
            flops = executed_flops(lambda kw=kw: b.engine(reduce(batch), **kw)(sets))
            b.row(part, how, len(sets), s, flops, ref_s, float(np.abs(v - ref).max()), f"rows {a.rows}")


def estimator_rows(b: Bench, comps: list, kw: dict) -> None:
    """The permutation estimator end to end on the log-prob game (cache of evaluated
    coalitions, antithetic pairs): the bridge path and the engine."""
    res = {}
    for path, game in (
        ("bridge, one coalition per forward", games.logprob_game(b.br, b.batch, b.a.mode, b.means, b.a.n)),
        ("engine, the game's order", b.engine(games.logprob_reduce(b.batch))),
    ):
        res[path] = harness.timed(lambda game=game: sh.permutation_shapley(game, comps, **kw))
    (rb, sb), _ = res.values()
    part = f"log-prob, permutation Shapley ({rb.n_permutations} permutations, {rb.n_pairs} pairs)"
    note = f"{len(comps)} players; max SE {np.nanmax(rb.se):.3g} on |Shapley| up to {np.abs(rb.values).max():.3g}"
    for path, (r, s) in res.items():
        diff = float(np.abs(r.values - rb.values).max())
        b.row(part, path, r.n_evaluations, s, float("nan"), sb * r.n_evaluations / rb.n_evaluations, diff, note)


def shared_rows(b: Bench, comps: list, kw: dict) -> None:
    """The ground truth's second game: exact match, truncated at 0, after the log-prob game
    on the same EngineGames (its permutations are the log-prob game's: the same seed),
    against exact match on an engine game of its own."""
    reduces = {"log-prob": games.logprob_reduce(b.batch), "exact match": games.exact_match_reduce(b.batch)}
    shared = games.EngineGames(b.hf, b.batch.tokens, reduces, b.a.mode, b.means, b.a.rows)
    sh.permutation_shapley(shared.game("log-prob"), comps, **kw)
    acc = {}
    for path, game in (
        ("engine, a game of its own", b.engine(reduces["exact match"])),
        ("engine, after log-prob on one EngineGames", shared.game("exact match")),
    ):
        run0 = game.shared.n_run
        r, s = harness.timed(lambda game=game: sh.permutation_shapley(game, comps, floor=0.0, **kw))
        acc[path] = r, s, game.shared.n_run - run0
    ra = acc["engine, a game of its own"][0]
    part = f"exact match, permutation Shapley ({ra.n_permutations} permutations, truncated at 0)"
    for path, (r, s, n_run) in acc.items():
        diff = float(np.abs(r.values - ra.values).max())
        b.row(part, path, r.n_evaluations, s, float("nan"), float("nan"), diff, f"{n_run} coalitions run")


def parse(argv=None):
    ap = harness.arguments(__doc__, "groundtruth.csv", threads=2)
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
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    threads = harness.start(a)
    with tempfile.TemporaryDirectory() as tmp:
        br, hf = paper_a_models(Path(tmp) / "model", a.model)
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    batch = S.eval_set(a.task, a.length, a.n, seed=2)
    means = interventions.component_means(br, [batch.tokens], comps)
    flops_per_s = harness.matmul_throughput()
    b = Bench(a, br, hf, batch, means, flops_per_s, forward_flops(hf.config, a.n, batch.tokens.shape[1]))
    before = forward_times(br, batch.tokens, a.reps)  # the floor: timed before and after the rest
    workload_rows(b, "random prefixes", prefix_coalitions(comps, a.coalitions, seed=0))
    workload_rows(b, f"permutation round ({a.pairs} pairs)", round_coalitions(comps, a.pairs, seed=1))
    kw = dict(max_permutations=a.permutations, min_pairs=max(2, a.permutations // 2), rel_se=0.0, seed=0)
    estimator_rows(b, comps, kw)
    shared_rows(b, comps, kw)
    floor_s = statistics.median(before + forward_times(br, batch.tokens, a.reps))
    df = pd.DataFrame(b.rows)
    df["floor_coalitions_per_s"] = 1 / floor_s
    df["over_floor"] = df["seconds_per_coalition"] / floor_s  # time per coalition / one plain forward
    df.insert(0, "threads", threads)
    df.insert(1, "numerics", a.numerics)
    df["n"], df["length"], df["plain_forward_s"] = a.n, a.length, floor_s
    df["matmul_gflops"] = flops_per_s / 1e9
    harness.write(df, a)
    cols = ["part", "path", "coalitions", "seconds_per_coalition", "over_bridge", "over_floor"]
    cols += ["executed_fraction", "over_executed", "max_abs_diff"]
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        print(f"plain forward of {a.n} sequences: {floor_s:.4g} s; matmul {flops_per_s / 1e9:.3g} GFLOP/s")


if __name__ == "__main__":
    main()
