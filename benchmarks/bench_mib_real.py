"""Paper C's MIB path at GPT-2 small's size (124M, 12 layers x 12 heads, 32,491 edges) on
random weights: seconds of each scoring method (EAP, EAP-IG, GIM, IFR) and of the two
faithfulness curves of ``localize`` (signed and absolute, 10 fractions each), each next
to its executed-work floor, the plain passes it cannot do without, timed in the same run
on the same rows:

- EAP: one forward of the corrupted input, one forward and one backward of the clean one;
- GIM: the same, the backward under GIM's modifications;
- EAP-IG: one forward of each input, ``--ig-steps`` forwards and backwards;
- IFR: one forward of the clean input up to the final norm's input (IFR reads nothing
  later, so it skips the unembedding), plus its own arithmetic: the L1 distances of each
  distinct downstream input to its parents (:func:`selfrepair.gim.attribute.l1_distances`,
  once per distinct set of parents, on tensors of the same shapes);
- curve: one forward of the corrupted input (whose activations are patched in) and one
  of the clean input per distinct circuit evaluated (the whole graph, the empty one and
  those of both rankings at every fraction).

Every pass runs with the edge graph's bridge features on (``hooks.prepared``: split
q/k/v inputs, per-head results), as the methods run them. One row per method and one for
the curve go to ``--out``: seconds, floor seconds and their ratio (min over ``--repeats``).

    python benchmarks/bench_mib_real.py [--model FOLDER] [--n 16] [--tokens 10] [--threads 1]

Without ``--model`` (or with a folder lacking config.json) a random-weight GPT-2 small is
built (transformers' GPT2Config, seed 0) in a temporary folder; the stand-in built by
benchmarks/real_size.py (~/.cache/selfrepair/real_size/models/gpt2) is used when present.
"""

import argparse
import sys
import tempfile
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

from selfrepair.core import numerics

# The numerics mode is put in force before torch is imported (src/selfrepair/core/numerics.py).
NUMERICS = numerics.configure_from_argv(sys.argv)


warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = Path.home() / ".cache" / "selfrepair" / "real_size" / "models" / "gpt2"
METHODS = ("eap", "eap-ig", "gim", "ifr")


def gpt2_small(folder: Path) -> Path:
    """A random-weight GPT-2 small (the published configuration) saved in ``folder``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from selfrepair.core.models import save_model
    from selfrepair.tasks.counterfactual import save_word_tokenizer

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    save_model(GPT2LMHeadModel(cfg), folder)
    save_word_tokenizer(folder, ["<unk>", "<bos>"] + [f"t{i}" for i in range(298)])
    return folder


def pairs(n: int, n_tokens: int, vocab: int, seed: int = 0):
    """``n`` counterfactual pairs of random token ids, all ``n_tokens`` long."""
    import torch

    from selfrepair.tasks.counterfactual import CounterfactualBatch

    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randint(2, vocab, s, generator=g)  # noqa: E731
    return CounterfactualBatch(r(n, n_tokens), r(n, n_tokens), r(n), r(n), torch.full((n,), n_tokens - 1))


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(STAND_IN))
    ap.add_argument("--n", type=int, default=16, help="counterfactual pairs")
    ap.add_argument("--tokens", type=int, default=10, help="tokens per prompt")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--curve-method", default="eap", choices=METHODS, help="whose scores the timed curves use")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--numerics", choices=numerics.MODES, default=numerics.DEFAULT_MODE)
    ap.add_argument("--out", default=str(ROOT / "results" / "reference" / "benchmark_mib_real.csv"))
    args = ap.parse_args()
    numerics.apply(args.numerics, args.threads)
    import pandas as pd
    import torch

    from selfrepair.core.models import load_bridge
    from selfrepair.gim.attribute import l1_distances, method_scores
    from selfrepair.gim.backward import GIMConfig, gim, with_hooks
    from selfrepair.gim.evaluate import FRACTIONS, faithfulness_curves, logit_diff
    from selfrepair.gim.graph import Graph, n_edges_at, select_edges, selection_rule
    from selfrepair.gim.hooks import prepared

    folder = Path(args.model)
    if not (folder / "config.json").exists():
        t = time.perf_counter()
        folder = gpt2_small(Path(tempfile.mkdtemp()) / "gpt2")
        print(f"built a random-weight GPT-2 small in {time.perf_counter() - t:.0f} s ({folder})")
    bridge = load_bridge(folder, "cpu")
    graph = Graph.from_bridge(bridge)
    data = pairs(args.n, args.tokens, min(300, bridge.cfg.d_vocab))
    batches = list(data.batches(args.batch_size))

    def forward(tokens):
        with torch.no_grad():
            bridge(tokens)

    def forward_backward(b, tokens, cfg=None):
        def leaf(x, hook):
            return x.detach().requires_grad_(True)

        with gim(bridge, cfg) if cfg is not None else nullcontext():
            with with_hooks(bridge, [("blocks.0.hook_resid_pre", leaf)]):
                (-logit_diff(bridge(tokens), b).sum()).backward()

    class Halt(Exception):
        pass

    def forward_to(tokens, hook_name):
        def halt(x, hook):
            raise Halt

        with torch.no_grad():
            try:
                bridge.run_with_hooks(tokens, fwd_hooks=[(hook_name, halt)])
            except Halt:
                pass

    parent_sets = [int(c.sum()) if c[: int(c.sum())].all() else c for c in torch.unique(graph.valid.T, dim=0)]
    parent_sets = [p for p in parent_sets if not isinstance(p, int) or p > 0]

    g = torch.Generator().manual_seed(0)
    ifr_operands = {  # per batch shape: node activations [B, T, n_forward, d], one input [B, T, d]
        shape: (torch.randn(*shape, len(graph.forward), bridge.cfg.d_model, generator=g),
                torch.randn(*shape, bridge.cfg.d_model, generator=g))
        for shape in {tuple(b.clean.shape) for b in batches}
    }  # fmt: skip

    def ifr_distances(shape):
        a, y = ifr_operands[tuple(shape)]
        for p in parent_sets:
            l1_distances(a[:, :, :p] if isinstance(p, int) else a[:, :, p], y)

    floors = {
        "eap": ("1 forward (corrupted) + 1 forward and backward (clean) per batch",
                lambda: [(forward(b.corrupt), forward_backward(b, b.clean)) for b in batches]),
        "gim": ("1 forward (corrupted) + 1 forward and GIM backward (clean) per batch",
                lambda: [(forward(b.corrupt), forward_backward(b, b.clean, GIMConfig())) for b in batches]),
        "eap-ig": (f"2 forwards (clean, corrupted) + {args.ig_steps} forwards and backwards per batch",
                   lambda: [(forward(b.clean), forward(b.corrupt),
                             [forward_backward(b, b.clean) for _ in range(args.ig_steps)]) for b in batches]),
        "ifr": ("1 forward (clean) to ln_final's input + the L1 distances to each distinct parent set per batch",
                lambda: [(forward_to(b.clean, "ln_final.hook_in"), ifr_distances(b.clean.shape)) for b in batches]),
    }  # fmt: skip
    rows, scores = [], {}
    base = {"model": str(folder), "n_pairs": args.n, "n_tokens": args.tokens, "n_edges": graph.n_edges,
            "threads": args.threads, "numerics": args.numerics}  # fmt: skip
    print(f"{folder}: {graph.n_edges} edges, {args.n} pairs of {args.tokens} tokens, {args.threads} thread(s)")
    with prepared(bridge):
        forward(batches[0].clean)  # warm-up
        for method in dict.fromkeys([*args.methods, args.curve_method]):
            s, scores[method] = timed(
                lambda: method_scores(bridge, graph, data, method, args.batch_size, args.ig_steps), args.repeats
            )
            what, fn = floors[method]
            f, _ = timed(fn, args.repeats)
            if method in args.methods:
                rows.append({**base, "what": method, "seconds": s, "floor_seconds": f, "ratio": s / f, "floor": what})
                print(f"  {method:8s} {s:8.2f} s   floor {f:8.2f} s   ratio {s / f:5.2f}   ({what})", flush=True)
        # the curves of localize: both rankings, the method's selection rule
        method = args.curve_method
        selection = selection_rule(method)
        t = time.perf_counter()
        circuits = {graph.valid.numpy().tobytes(), torch.zeros_like(graph.valid).numpy().tobytes()}
        for absolute in (False, True):
            for frac in FRACTIONS:
                mask = select_edges(graph, scores[method], n_edges_at(frac, graph.n_edges), absolute, selection)
                circuits.add(mask.numpy().tobytes())
        select_s = time.perf_counter() - t
        s, _ = timed(
            lambda: faithfulness_curves(
                bridge, graph, data, scores[method], FRACTIONS, (False, True), args.batch_size, selection
            ),
            args.repeats,
        )
        what = f"1 forward (corrupted) + {len(circuits)} forwards (clean, one per distinct circuit) per batch"
        f, _ = timed(
            lambda: [(forward(b.corrupt), [forward(b.clean) for _ in circuits]) for b in batches], args.repeats
        )
        rows.append({**base, "what": f"curve ({method} scores, {selection})", "seconds": s, "floor_seconds": f,
                     "ratio": s / f, "floor": what, "selection_seconds": select_s})  # fmt: skip
        print(f"  curve    {s:8.2f} s   floor {f:8.2f} s   ratio {s / f:5.2f}   ({what}; "
              f"choosing the circuits: {select_s:.2f} s of it)")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
