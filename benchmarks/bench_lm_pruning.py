"""Paper B's sequential COAX pruning on a packaged real LM (rule coax_lm_pruning): the
first ``--steps`` removals the scan's way (``coax.score.scan`` each step, as
``pruning.coax_order`` runs it: every single ablation again, and S + u resumed from S's
first layer) against ``lm_pruning.coax_order``'s (the singles once, S + u from u's own
layer of one forward with S removed), on the same calibration windows, kept positions
and bridge; timed interleaved in one process (CPU seconds, the fewest of ``--repeats``
rounds), each way's matmul FLOPs counted by torch (one untimed call), and each way's
time against its own executed work at the matmul rate measured here (``over_executed``:
1 would be every FLOP at that rate).

    python benchmarks/bench_lm_pruning.py --model results/lms/gemma-3-270m/model \\
        [--steps 3] [--repeats 1] [--threads 1] [--write]

One row per model goes to ``--out`` (merged with its other rows); ``--write``: also
results/reference/benchmark_lm_pruning.csv.
"""

import sys
from pathlib import Path

import harness

harness.configure()

import pandas as pd  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from selfrepair.coax import lm_pruning  # noqa: E402
from selfrepair.coax import score as coax  # noqa: E402
from selfrepair.core.components import head_components  # noqa: E402
from selfrepair.core.models import load_bridge  # noqa: E402
from selfrepair.tasks import plays  # noqa: E402


def scan_order(bridge, tokens, heads, k, pos, top_r, max_rows):
    """The scan's way (pruning.coax_order's loop at the kept positions ``pos``)."""
    support = coax.clean_support(bridge, tokens, "v1", top_r, positions=pos)
    pruned, remaining = [], list(heads)
    while len(pruned) < k:
        sc = coax.scan(bridge, tokens, remaining, pruned, "v1", top_r, positions=pos, support=support,
                       max_rows=max_rows)  # fmt: skip
        best = sc.table.sort_values("cond" if pruned else "single", kind="stable").iloc[0]["unit"]
        u = next(h for h in remaining if h.name == best)
        pruned.append(u)
        remaining.remove(u)
    return [h.name for h in pruned]


def main(argv=None) -> int:
    ap = harness.arguments(__doc__, "lm_pruning.csv", threads=1)
    ap.add_argument("--model", type=Path, required=True, help="a converted LM folder (rule lm_convert's)")
    ap.add_argument("--steps", type=int, default=3, help="removals timed (the job runs half the heads)")
    ap.add_argument("--n-calib", type=int, default=2)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--top-r", type=int, default=192)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    threads = harness.start(args)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no converted model (config.json) there; run lm_convert first")
    bridge = load_bridge(args.model)
    tok = AutoTokenizer.from_pretrained(str(args.model), local_files_only=True)
    calib = plays.windows(tok, plays.text("othello"), args.n_calib, args.length, tok.bos_token_id is not None)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    pos = lm_pruning.kept_positions(args.length, args.stride)
    k = args.steps

    def scan():
        return scan_order(bridge, calib, heads, k, pos, args.top_r, args.max_rows)

    def given():
        return [h.name for h in lm_pruning.coax_order(bridge, calib, heads, k, pos, args.top_r, args.max_rows)[0]]

    timed = harness.best_of({"scan": scan, "given": given}, args.repeats, harness.cpu_timed)
    best, out = {k: v[0] for k, v in timed.items()}, {k: v[1] for k, v in timed.items()}
    flops = {name: harness.executed_flops(fn) for name, fn in (("scan", scan), ("given", given))}
    rate = harness.matmul_throughput()
    row = {
        "model": args.model.parent.name if args.model.name == "model" else args.model.name,
        "heads": len(heads), "steps": k, "n_calib": args.n_calib, "length": args.length, "kept_positions": len(pos),
        "cpu_s_scan": round(best["scan"], 2), "cpu_s_given": round(best["given"], 2),
        "given_over_scan": round(best["given"] / best["scan"], 3),
        "gflop_scan": round(flops["scan"] / 1e9, 1), "gflop_given": round(flops["given"] / 1e9, 1),
        "matmul_gflop_per_s": round(rate / 1e9, 1),
        "scan_over_executed": round(best["scan"] / (flops["scan"] / rate), 2),
        "given_over_executed": round(best["given"] / (flops["given"] / rate), 2),
        "same_order": out["scan"] == out["given"], "threads": threads, "repeats": args.repeats,
        "numerics": args.numerics, "machine": harness.machine(), "commit": harness.commit(),
    }  # fmt: skip
    print(pd.Series(row).to_string())
    harness.write(pd.DataFrame([row]), args, keys=["model"])
    return 0 if row["same_order"] else 1


if __name__ == "__main__":
    sys.exit(main())
