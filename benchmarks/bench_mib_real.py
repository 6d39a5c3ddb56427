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
the curve go to ``--out``: seconds, floor seconds and their ratio (the fewest seconds of
``--repeats`` rounds, each method and its floor interleaved).

    python benchmarks/bench_mib_real.py [--model FOLDER] [--n 16] [--tokens 10] [--threads 1] [--write]

Without ``--model`` (or with a folder lacking config.json) the random-weight GPT-2 small
of benchmarks/real_size.py (~/.cache/selfrepair/real_size/models/gpt2) is used, built
there first when absent. ``--write``: also results/reference/benchmark_mib_real.csv.
"""

import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import harness

NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402
import real_size  # noqa: E402
import torch  # noqa: E402

from selfrepair.core.models import load_bridge  # noqa: E402
from selfrepair.gim.attribute import l1_distances, method_scores  # noqa: E402
from selfrepair.gim.backward import GIMConfig, gim, with_hooks  # noqa: E402
from selfrepair.gim.evaluate import FRACTIONS, faithfulness_curves, logit_diff  # noqa: E402
from selfrepair.gim.graph import Graph, n_edges_at, select_edges, selection_rule  # noqa: E402
from selfrepair.gim.hooks import prepared  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch  # noqa: E402

warnings.filterwarnings("ignore")
METHODS = ("eap", "eap-ig", "gim", "ifr")


def pairs(n: int, n_tokens: int, vocab: int, seed: int = 0):
    """``n`` counterfactual pairs of random token ids, all ``n_tokens`` long."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randint(2, vocab, s, generator=g)  # noqa: E731
    return CounterfactualBatch(r(n, n_tokens), r(n, n_tokens), r(n), r(n), torch.full((n,), n_tokens - 1))


class Halt(Exception):
    pass


class Passes:
    """The plain passes of the floors on one bridge: a forward, a forward and a (GIM)
    backward of the metric, a forward halted at a hook, and IFR's L1 distances."""

    def __init__(self, bridge, graph, batches):
        self.bridge = bridge
        sets = [int(c.sum()) if c[: int(c.sum())].all() else c for c in torch.unique(graph.valid.T, dim=0)]
        self.parent_sets = [p for p in sets if not isinstance(p, int) or p > 0]
        g = torch.Generator().manual_seed(0)
        self.ifr_operands = {  # per batch shape: node activations [B, T, n_forward, d], one input [B, T, d]
            shape: (torch.randn(*shape, len(graph.forward), bridge.cfg.d_model, generator=g),
                    torch.randn(*shape, bridge.cfg.d_model, generator=g))
            for shape in {tuple(b.clean.shape) for b in batches}
        }  # fmt: skip

    def forward(self, tokens):
        with torch.no_grad():
            self.bridge(tokens)

    def forward_backward(self, b, tokens, cfg=None):
        def leaf(x, hook):
            return x.detach().requires_grad_(True)

        with gim(self.bridge, cfg) if cfg is not None else nullcontext():
            with with_hooks(self.bridge, [("blocks.0.hook_resid_pre", leaf)]):
                (-logit_diff(self.bridge(tokens), b).sum()).backward()

    def forward_to(self, tokens, hook_name):
        def halt(x, hook):
            raise Halt

        with torch.no_grad():
            try:
                self.bridge.run_with_hooks(tokens, fwd_hooks=[(hook_name, halt)])
            except Halt:
                pass

    def ifr_distances(self, shape):
        a, y = self.ifr_operands[tuple(shape)]
        for p in self.parent_sets:
            l1_distances(a[:, :, :p] if isinstance(p, int) else a[:, :, p], y)


def floors(p: Passes, batches, ig_steps: int) -> dict:
    """{method: (what its floor is, the floor's passes)}."""
    fwd, fb = p.forward, p.forward_backward
    return {
        "eap": ("1 forward (corrupted) + 1 forward and backward (clean) per batch",
                lambda: [(fwd(b.corrupt), fb(b, b.clean)) for b in batches]),
        "gim": ("1 forward (corrupted) + 1 forward and GIM backward (clean) per batch",
                lambda: [(fwd(b.corrupt), fb(b, b.clean, GIMConfig())) for b in batches]),
        "eap-ig": (f"2 forwards (clean, corrupted) + {ig_steps} forwards and backwards per batch",
                   lambda: [(fwd(b.clean), fwd(b.corrupt), [fb(b, b.clean) for _ in range(ig_steps)])
                            for b in batches]),
        "ifr": ("1 forward (clean) to ln_final's input + the L1 distances to each distinct parent set per batch",
                lambda: [(p.forward_to(b.clean, "ln_final.hook_in"), p.ifr_distances(b.clean.shape)) for b in batches]),
    }  # fmt: skip


def method_rows(p: Passes, graph, data, batches, args, base: dict) -> tuple[list[dict], dict]:
    """One row per method of --methods (seconds, floor, ratio) and every method's scores."""
    rows, scores, fl = [], {}, floors(p, batches, args.ig_steps)
    for method in dict.fromkeys([*args.methods, args.curve_method]):
        what, floor = fl[method]
        score = lambda m=method: method_scores(p.bridge, graph, data, m, args.batch_size, args.ig_steps)  # noqa: E731
        best = harness.best_of({"method": score, "floor": floor}, args.repeats)
        (s, scores[method]), (f, _) = best["method"], best["floor"]
        if method in args.methods:
            rows.append({**base, "what": method, "seconds": s, "floor_seconds": f, "ratio": s / f, "floor": what})
            print(f"  {method:8s} {s:8.2f} s   floor {f:8.2f} s   ratio {s / f:5.2f}   ({what})", flush=True)
    return rows, scores


def curve_row(p: Passes, graph, data, batches, scores, args, base: dict) -> dict:
    """The curves of localize: both rankings, the method's selection rule, against one
    corrupted forward and one clean forward per distinct circuit."""
    method = args.curve_method
    selection = selection_rule(method)
    t = time.perf_counter()
    circuits = {graph.valid.numpy().tobytes(), torch.zeros_like(graph.valid).numpy().tobytes()}
    for absolute in (False, True):
        for frac in FRACTIONS:
            mask = select_edges(graph, scores[method], n_edges_at(frac, graph.n_edges), absolute, selection)
            circuits.add(mask.numpy().tobytes())
    select_s = time.perf_counter() - t
    calls = {
        "curve": lambda: faithfulness_curves(
            p.bridge, graph, data, scores[method], FRACTIONS, (False, True), args.batch_size, selection
        ),
        "floor": lambda: [(p.forward(b.corrupt), [p.forward(b.clean) for _ in circuits]) for b in batches],
    }
    best = harness.best_of(calls, args.repeats)
    s, f = best["curve"][0], best["floor"][0]
    what = f"1 forward (corrupted) + {len(circuits)} forwards (clean, one per distinct circuit) per batch"
    print(f"  curve    {s:8.2f} s   floor {f:8.2f} s   ratio {s / f:5.2f}   ({what}; "
          f"choosing the circuits: {select_s:.2f} s of it)")  # fmt: skip
    return {**base, "what": f"curve ({method} scores, {selection})", "seconds": s, "floor_seconds": f,
            "ratio": s / f, "floor": what, "selection_seconds": select_s}  # fmt: skip


def main(argv=None):
    ap = harness.arguments(__doc__, "mib_real.csv")
    ap.add_argument("--model", default=str(real_size.STAND_INS / "models" / "gpt2"))
    ap.add_argument("--n", type=int, default=16, help="counterfactual pairs")
    ap.add_argument("--tokens", type=int, default=10, help="tokens per prompt")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--curve-method", default="eap", choices=METHODS, help="whose scores the timed curves use")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    harness.start(args)
    folder = real_size.stand_in(Path(args.model))
    bridge = load_bridge(folder, "cpu")
    graph = Graph.from_bridge(bridge)
    data = pairs(args.n, args.tokens, min(300, bridge.cfg.d_vocab))
    batches = list(data.batches(args.batch_size))
    passes = Passes(bridge, graph, batches)
    base = {"model": str(folder), "n_pairs": args.n, "n_tokens": args.tokens, "n_edges": graph.n_edges,
            "threads": args.threads, "numerics": args.numerics}  # fmt: skip
    print(f"{folder}: {graph.n_edges} edges, {args.n} pairs of {args.tokens} tokens, {args.threads} thread(s)")
    with prepared(bridge):
        passes.forward(batches[0].clean)  # warm-up
        rows, scores = method_rows(passes, graph, data, batches, args, base)
        rows.append(curve_row(passes, graph, data, batches, scores, args, base))
    harness.write(pd.DataFrame(rows), args)


if __name__ == "__main__":
    main()
