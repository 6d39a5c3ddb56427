"""Paper C's faithfulness curves on a packaged real LM (rule gim_lm), every method's
circuits run one method at a time (``lm_pairs.pair_curves``, as gim_lm ran them before)
against all methods' in one run (``lm_pairs.pair_curves_many``, as it runs them now: the
corrupted run of each batch, the whole model, the empty circuit and the circuits two
methods share, run once), on the same scores, pairs and bridge, timed interleaved in the
same process (CPU seconds, the fewest of ``--repeats`` rounds), with the circuits each
way runs and whether every number came back bit for bit.

    python benchmarks/bench_gim_lm_curves.py --model results/lms/gemma-3-270m/model \\
        --data results/gim/lms/data --task ioi [--n 20] [--repeats 1] [--threads 2] [--write]

``--model``: a converted LM folder (rule lm_convert's); ``--data``: rule gim_lm_data's
folder. One row per (model, task) goes to ``--out`` (merged with its other rows);
``--write``: also results/reference/benchmark_gim_lm_curves.csv.
"""

import sys
from pathlib import Path

import harness

harness.configure()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from selfrepair.core.models import folder_tokenizer, load_bridge  # noqa: E402
from selfrepair.gim import lm_pairs  # noqa: E402
from selfrepair.gim.attribute import method_scores  # noqa: E402
from selfrepair.gim.evaluate import FRACTIONS  # noqa: E402
from selfrepair.gim.graph import Graph, n_edges_at, select_edges, selection_rule  # noqa: E402
from selfrepair.tasks import mib  # noqa: E402

METHODS = ["eap", "eap-ig", "gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm"]  # gim_lm's default run


def distinct(graph, scores: dict, selections: dict, fractions) -> tuple[int, int]:
    """(circuits run one method at a time, circuits run once for all): the distinct masks
    of each method's run summed, and the distinct masks of all methods together."""
    each, union = 0, set()
    for m, sc in scores.items():
        own = {graph.valid.numpy().tobytes(), torch.zeros_like(graph.valid).numpy().tobytes()}
        for absolute in (False, True):
            for f in fractions:
                own.add(
                    select_edges(graph, sc, n_edges_at(f, graph.n_edges), absolute, selections[m]).numpy().tobytes()
                )
        each += len(own)
        union |= own
    return each, len(union)


def main(argv=None) -> int:
    ap = harness.arguments(__doc__, "gim_lm_curves.csv", threads=2)
    ap.add_argument("--model", type=Path, required=True, help="a converted LM folder (rule lm_convert's)")
    ap.add_argument("--data", type=Path, required=True, help="rule gim_lm_data's folder")
    ap.add_argument("--task", default="ioi")
    ap.add_argument("--n", type=int, default=20, help="pairs (gim.lms.n_eval's default)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    threads = harness.start(args)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no converted model (config.json) there; run lm_convert first")
    bridge = load_bridge(args.model, ungroup=True)
    data = mib.load(args.task, folder_tokenizer(args.model), args.n, [str(args.data)], split="test", bos="mib")
    graph = Graph.from_bridge(bridge)
    scores = {m: method_scores(bridge, graph, data, m, args.batch_size, 5, "mib") for m in args.methods}
    sel = {m: selection_rule(m) for m in args.methods}
    fr = tuple(FRACTIONS)

    def each():
        return {m: lm_pairs.pair_curves(bridge, graph, data, scores[m], fr, args.batch_size, sel[m]) for m in scores}

    def shared():
        return lm_pairs.pair_curves_many(bridge, graph, data, scores, fr, args.batch_size, sel)

    timed = harness.best_of({"each": each, "shared": shared}, args.repeats, harness.cpu_timed)
    best, out = {k: v[0] for k, v in timed.items()}, {k: v[1] for k, v in timed.items()}
    equal = all(
        np.array_equal(out["each"][m][k], out["shared"][m][k])
        for m in scores
        for k in ("full", "empty", "signed", "absolute")
    )
    n_each, n_shared = distinct(graph, scores, sel, fr)
    row = {
        "model": args.model.parent.name if args.model.name == "model" else args.model.name, "task": args.task,
        "methods": len(scores), "n_pairs": len(data), "n_edges": graph.n_edges, "circuits_each": n_each,
        "circuits_shared": n_shared, "cpu_s_each": round(best["each"], 2), "cpu_s_shared": round(best["shared"], 2),
        "shared_over_each": round(best["shared"] / best["each"], 3), "bit_identical": equal, "threads": threads,
        "repeats": args.repeats, "machine": harness.machine(), "commit": harness.commit(),
    }  # fmt: skip
    print(pd.Series(row).to_string())
    harness.write(pd.DataFrame([row]), args, keys=["model", "task"])
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
