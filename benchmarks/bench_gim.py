"""Speed of edge scoring on the toy IOI model: EAP and GIM-EAP (one forward and one
backward per batch) vs per-edge activation patching (one patched forward per edge), and
side by side with TransformerLens 4.3's edge-level attribution patching on all edges
(``attribution_patch``, one example at a time) against our EAP with the same gradient
point (``gradient_at="corrupted"``): the seconds of each, their ratio measured in this
run, and the largest difference of the scores.

    python benchmarks/bench_gim.py [--model results/gim/ioi/l2h4/seed0/model] [--n 50] [--write]

Without a trained model at --model, a toy IOI model is trained first (paper B's recipe,
a few hundred steps) in a temporary folder. The figures go to results/benchmarks/gim.csv
(--out; --write: also results/reference/).
"""

import tempfile
import time
import warnings
from pathlib import Path

import harness

NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402

warnings.filterwarnings("ignore")


def transformer_lens_side_by_side(bridge, data, batch_size: int) -> dict:
    """Seconds of our EAP (gradient on the corrupted run) and of TransformerLens's edge
    attribution patching on the same pairs, and max |difference| of the edge scores
    (TransformerLens's summed over positions and mapped to MIB's names)."""
    from selfrepair.gim.attribute import edge_scores
    from selfrepair.gim.graph import Graph
    from selfrepair.gim.tl_reference import tl_edge_scores

    graph = Graph.from_bridge(bridge)
    ours, ours_s = harness.timed(lambda: edge_scores(bridge, graph, data, "eap", batch_size, gradient_at="corrupted"))
    theirs, tl_s = harness.timed(lambda: tl_edge_scores(bridge, graph, data))
    diff = float((ours - theirs).abs().max())
    return {"ours_s": ours_s, "tl_s": tl_s, "max_abs_diff": diff, "max_abs_score": float(ours.abs().max())}


def main(argv=None):
    ap = harness.arguments(__doc__, "gim.csv")
    ap.add_argument("--model", default="results/gim/ioi/l2h4/seed0/model")
    ap.add_argument("--n", type=int, default=50, help="counterfactual pairs")
    args = ap.parse_args(argv)
    harness.start(args)
    from selfrepair.core.models import load_bridge
    from selfrepair.gim.attribute import speed
    from selfrepair.gim.training import train_any
    from selfrepair.tasks.registry import get_task

    task = get_task("ioi")
    folder = Path(args.model)
    if not (folder / "config.json").exists():
        folder = Path(tempfile.mkdtemp()) / "ioi"
        t = time.perf_counter()
        train_any(
            task,
            folder,
            n_layers=2,
            n_heads=4,
            d_model=64,
            d_mlp=256,
            seed=0,
            lr=3e-3,
            batch_size=128,
            max_steps=1000,
            eval_every=250,
            target_accuracy=0.98,
        )
        print(f"trained a toy IOI model in {time.perf_counter() - t:.1f} s ({folder})")
    bridge = load_bridge(folder, "cpu")
    data = task.sample(args.n, seed=12345)
    res = speed(bridge, data, batch_size=args.n)
    print(f"toy IOI model, {res['n_edges']} edges, {res['n_examples']} pairs, {args.threads} thread(s):")
    print(f"  EAP                      {res['eap_s']:8.2f} s")
    print(f"  GIM-EAP                  {res['gim_s']:8.2f} s")
    print(f"  per-edge patching        {res['patching_s']:8.2f} s")
    print(f"  corr(EAP, patching)      {res['eap_corr_with_patching']:8.3f}")
    print(f"  corr(GIM-EAP, patching)  {res['gim_corr_with_patching']:8.3f}")
    tl = transformer_lens_side_by_side(bridge, data, batch_size=args.n)
    print("EAP on all edges, gradient on the corrupted run, vs TransformerLens attribution_patch:")
    print(f"  ours                     {tl['ours_s']:8.2f} s")
    print(f"  TransformerLens          {tl['tl_s']:8.2f} s  ({tl['tl_s'] / tl['ours_s']:.1f}x ours)")
    print(f"  max |ours - TL|          {tl['max_abs_diff']:8.1e}  (scores up to {tl['max_abs_score']:.2f})")
    figures = {"eap_s": res["eap_s"], "gim_s": res["gim_s"], "patching_s": res["patching_s"],
               "eap_corr_with_patching": res["eap_corr_with_patching"],
               "gim_corr_with_patching": res["gim_corr_with_patching"], "ours_s": tl["ours_s"], "tl_s": tl["tl_s"],
               "tl_over_ours": tl["tl_s"] / tl["ours_s"], "max_abs_diff": tl["max_abs_diff"],
               "max_abs_score": tl["max_abs_score"]}  # fmt: skip
    table = pd.DataFrame({"what": list(figures), "value": list(figures.values())})
    harness.write(table.assign(n_edges=res["n_edges"], n_pairs=res["n_examples"], threads=args.threads), args)


if __name__ == "__main__":
    main()
