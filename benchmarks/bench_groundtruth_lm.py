"""Seconds and CPU seconds of the ground truth on a real LM (``groundtruth.pipeline.run_on_model``)
with paper B's IOI prompts, the pair's answer the indirect object and its foil the
subject, read at the last position; and of its unit, one coalition (a forward of the
prompts with components mean-ablated), on its own.

    python benchmarks/bench_groundtruth_lm.py --model FOLDER [--bos] [--pairs 8]
        [--players top] [--n-players 7] [--rest player] [--threads 1]

``--bos``: put the tokenizer's BOS first (Gemma needs its ``<bos>``; Llama's SmolLM2
none). One row per part of the pipeline's ``timing`` table, plus ``coalition`` (the
fastest of 3 single evaluations of one coalition) and ``load``; each with the model,
pairs, prompt length, players and component count. A permutation of all n components
costs n + 1 coalitions. Writes results/benchmarks/groundtruth_lm.csv (--out), each
model's rows kept beside the others'.
"""

from __future__ import annotations

import time

import harness

harness.configure()

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from selfrepair.core import components as C  # noqa: E402
from selfrepair.core import interventions, models  # noqa: E402
from selfrepair.gim.evaluate import logit_diff  # noqa: E402
from selfrepair.groundtruth import games, pipeline  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch  # noqa: E402


class _NoBos:
    """A tokenizer seen without its BOS (paper B's prompts then start with the text)."""

    def __init__(self, tok):
        self.tok, self.bos_token_id = tok, None

    def encode(self, *a, **kw):
        return self.tok.encode(*a, **kw)


def pairs(bridge, n: int, bos: bool) -> CounterfactualBatch:
    """``n`` IOI prompts of one length (``tasks.ioi.gpt2_prompts``, style bos-torch) as pairs."""
    pr = ioi.gpt2_prompts(bridge.tokenizer if bos else _NoBos(bridge.tokenizer), n, seed=0, style="bos-torch")
    t = pr.tokens.shape[1]
    return CounterfactualBatch(pr.tokens, pr.tokens, pr.io, pr.s, torch.full((len(pr),), t - 1))


def one_coalition(bridge, data, repeats: int = 3) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest of ``repeats`` evaluations of one coalition."""
    comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [data.clean], comps)
    game = games.AblationGame(bridge, data.clean, lambda lg: logit_diff(lg, data).mean(), "mean", means)
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        game([comps[: len(comps) // 2]])
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


def main() -> None:
    ap = harness.arguments(__doc__, "groundtruth_lm.csv")
    ap.add_argument("--model", required=True)
    ap.add_argument("--bos", action="store_true")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--players", default="top")
    ap.add_argument("--n-players", type=int, default=7)
    ap.add_argument("--rest", default="player")
    args = ap.parse_args()
    harness.start(args)
    t0, c0 = time.perf_counter(), time.process_time()
    bridge = models.load_bridge(args.model, "cpu")
    rows = [{"part": "load", "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}]
    data = pairs(bridge, args.pairs, args.bos)
    wall, cpu = one_coalition(bridge, data)
    rows.append({"part": "coalition", "seconds": wall, "cpu_s": cpu, "coalitions": 1})
    settings = pipeline.Settings(mode="mean", players=args.players, n_players=args.n_players, rest=args.rest)
    t0, c0 = time.perf_counter(), time.process_time()
    out = pipeline.run_on_model(bridge, data, settings, name=args.model)
    rows += out["timing"].to_dict("records")
    rows.append({"part": "run_on_model", "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
    cfg = bridge.cfg
    table = pd.DataFrame(rows).assign(
        model=str(args.model), pairs=len(data), tokens=data.clean.shape[1], players=args.players,
        n_players=args.n_players, rest=args.rest, n_components=cfg.n_layers * (cfg.n_heads + 1),
        threads=args.threads,
    )  # fmt: skip
    print(table.to_string())
    harness.write(table, args, keys=["model", "part"])


if __name__ == "__main__":
    main()
