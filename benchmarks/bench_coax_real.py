"""Seconds per phase of paper B's real-model experiments (the rule ``coax_real``) on a
GPT-2-small-size model, against each phase's executed-work floor: the IOI experiment
(``ioi_experiment.run_ioi``), the wake-up experiment (``real_models._run_wakeup``) and
the induction experiment (``real_models._run_induction``), one ``part`` each.

    python benchmarks/bench_coax_real.py [--model FOLDER] [--prompts 8] [--threads 1]
        [--parts ioi wakeup induction] [--induction-prompts 4] [--induction-T 16] [--write]

``--model``: a GPT2LMHeadModel folder (default: a random-weight GPT-2 small, 12 x 12
heads, 50,257-token vocabulary: benchmarks/real_size.py's stand-in, built there with a
word-level stand-in tokenizer when absent; results do not depend on the weights, the timings do not either). The
primaries and backups are GPT-2 small's documented heads; the other arguments are
config/config.yaml's ``coax`` section (protocol v2, top_r 192, top_k 20, wake_min 1.05,
ig_steps 5).

Each phase is timed inside one call of ``run_ioi``. Its floor is the time of the
passes its definition requires, each once, measured in the same run on plain bridge
passes of the same rows: ``prefix`` (the intact run) 1 forward; ``scan`` 2|U| + 1
forwards (|U| singles, S alone, |U| S + u); ``wake`` |S| forwards (0..|S| primaries; the
intact norms are the intact run's); ``grad_intact`` / ``grad_s`` 1 forward + (1 + L)
backwards (the plain one for AtP / atp_mag / cond_grad, one per dropped layer for AtP*
GradDrop, whose forward does not depend on the layer); ``eap_ig`` L x steps forwards and
backwards; ``freeze`` 3 forwards; ``knockout`` 4 forwards. Wake-up (its own prompt
set): ``singles`` 1 + |H| forwards (the intact run and each head alone), ``scan`` 2|U| +
1, ``wake`` |S|. Induction (prompts of 2T + 2 tokens): the count its progress line
states, 1 (induction scores) + 2 + 2|U| (the scan) + 2 (clean and primaries runs) +
2 x |ks| x (1 + n_random) (per k the COAX set and the random sets, alone and with the
primaries). A forward's time is the
fastest per row over chunks of 1, 4 and 16 copies of the prompts (full-vocabulary logits
at every position, as a plain forward gives them); a backward's is that of the metric
through a plain forward of the prompts to every layer's z. ``block rows`` counts the
rows each phase runs through the blocks, in prompt-set forward equivalents.
Writes results/benchmarks/coax_real.csv (--out; --write: also
results/reference/benchmark_coax_real.csv), each row with the CPU (model name, vendor,
family) and the numerics mode it ran under.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import harness

NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402
import real_size  # noqa: E402
import torch  # noqa: E402

from selfrepair.coax import baselines, induction_experiment, ioi_experiment, real_models  # noqa: E402
from selfrepair.coax import score as coax  # noqa: E402
from selfrepair.core import numerics  # noqa: E402
from selfrepair.core.components import head_components, parse  # noqa: E402
from selfrepair.core.models import checkpoint_tokenizer, load_bridge  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402


class Phases:
    """Seconds and block rows per phase, by wrapping the functions run_ioi calls."""

    def __init__(self, bridge, b):
        self.sec: dict[str, float] = {}
        self.rows: dict[str, float] = {}
        self.stack: list[str] = []
        self.nl, self.b = bridge.cfg.n_layers, b
        self.handles = [blk.register_forward_pre_hook(self._count, with_kwargs=True) for blk in bridge.blocks]

    def _count(self, mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        if self.stack:
            lab = self.stack[-1]
            self.rows[lab] = self.rows.get(lab, 0.0) + x.shape[0] / (self.nl * self.b)

    def wrap(self, mod, name, label):
        f = getattr(mod, name)

        @functools.wraps(f)
        def g(*a, **k):
            lab = label(*a, **k) if callable(label) else label
            if self.stack:  # inside another phase: counted there
                return f(*a, **k)
            self.stack.append(lab)
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.sec[lab] = self.sec.get(lab, 0.0) + time.perf_counter() - t
                self.stack.pop()

        setattr(mod, name, g)
        return mod, name, f

    def close(self, undo):
        """Put the wrapped functions back and remove the block counters."""
        for mod, name, f in undo:
            setattr(mod, name, f)
        for h in self.handles:
            h.remove()


def plain_forward_per_row(bridge, tokens, chunks=(1, 4, 16)) -> float:
    best = float("inf")
    with torch.no_grad():
        bridge(tokens)
        for c in chunks:
            rep = tokens.repeat(c, 1)
            t = time.perf_counter()
            bridge(rep)
            best = min(best, (time.perf_counter() - t) / rep.shape[0])
    return best


def plain_grad_times(bridge, tokens, metric) -> tuple[float, float]:
    """(forward with a graph, one backward to every layer's z) of the prompts, seconds."""
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(bridge.cfg.n_layers)]
    best_f, best_b = float("inf"), float("inf")
    for _ in range(2):
        store = {}

        def keep(name):
            def fn(x, hook):
                store[name] = x
                return x

            return fn

        with torch.enable_grad():
            t = time.perf_counter()
            value = metric(bridge.run_with_hooks(tokens, fwd_hooks=[(n, keep(n)) for n in names]))
            t1 = time.perf_counter()
            torch.autograd.grad(value, [store[n] for n in names], allow_unused=True)
            t2 = time.perf_counter()
        best_f, best_b = min(best_f, t1 - t), min(best_b, t2 - t1)
    return best_f, best_b


def fit_rows(bridge, t: int) -> int:
    return max(1, min(2048, int(2.5e8 // (t * int(bridge.cfg.d_vocab)))))  # real_models._fit_rows


def phase_rows(ph: Phases, floors: dict, total: float) -> list[dict]:
    """One row per phase (seconds, floor, ratio, block rows), then ``other`` and ``total``."""
    rows = []
    for p, fl in floors.items():
        s = ph.sec.get(p, float("nan"))
        rows.append({"phase": p, "seconds": round(s, 3), "floor_seconds": round(fl, 3),
                     "ratio": round(s / fl, 3), "block_rows": round(ph.rows.get(p, 0.0), 2)})  # fmt: skip
    other = total - sum(ph.sec.values())
    rows.append({"phase": "other", "seconds": round(other, 3), "floor_seconds": 0.0, "ratio": float("nan")})
    fl_total = sum(floors.values())
    rows.append({"phase": "total", "seconds": round(total, 3), "floor_seconds": round(fl_total, 3),
                 "ratio": round(total / fl_total, 3)})  # fmt: skip
    return rows


def ioi_part(bridge, a, heads) -> list[dict]:
    """run_ioi on one prompt set, each phase against its floor."""
    prompts = ioi.gpt2_prompts(a.tokenizer, a.prompts, a.seed)
    nl, nh = bridge.cfg.n_layers, bridge.cfg.n_heads
    if (nl, nh) == (12, 12):
        prim = [parse(n) for n in ioi.GPT2_NAME_MOVERS]
        back = [parse(n) for n in ioi.GPT2_BACKUP_NAME_MOVERS]
    else:
        prim, back = heads[-3:], heads[-6:-3]
    cands = [h for h in heads if h not in prim]
    b, t = prompts.tokens.shape
    steps = 5
    metric = lambda lg: ioi.logit_diff(lg, prompts)  # noqa: E731
    print(f"IOI: {b} prompts x {t} tokens, |U| = {len(cands)}, |S| = {len(prim)}", flush=True)
    ph = Phases(bridge, b)
    states = iter(["grad_intact", "grad_s"])
    undo = [
        ph.wrap(ioi_experiment, "Prefix", "prefix"),
        ph.wrap(coax, "scan", "scan"),
        ph.wrap(coax, "wake_up_curve", "wake"),
        ph.wrap(baselines, "_graddrop_states", lambda *x, **k: next(states)),
        ph.wrap(baselines, "eap_ig", "eap_ig"),
        ph.wrap(ioi_experiment, "_patched_drop", "freeze"),
        ph.wrap(ioi_experiment, "run_resumed", "knockout"),
    ]
    t0 = time.perf_counter()
    ioi_experiment.run_ioi(
        bridge, prompts, heads, prim, back, "v2", 192, 20, len(back), 1.05, steps, fit_rows(bridge, t),
        baselines.AMP_EPS,
    )  # fmt: skip
    total = time.perf_counter() - t0
    ph.close(undo)
    f_set = plain_forward_per_row(bridge, prompts.tokens) * b
    f_grad, b_grad = plain_grad_times(bridge, prompts.tokens, metric)
    floors = {
        "prefix": f_set,
        "scan": (2 * len(cands) + 1) * f_set,
        "wake": len(prim) * f_set,
        "grad_intact": f_grad + (1 + nl) * b_grad,
        "grad_s": f_grad + (1 + nl) * b_grad,
        "eap_ig": nl * steps * (f_grad + b_grad),
        "freeze": 3 * f_set,
        "knockout": 4 * f_set,
    }
    print(f"plain forward {f_set:.3f} s per prompt set; with a graph {f_grad:.3f} s, backward {b_grad:.3f} s")
    return [{"part": "ioi", "prompts": b, **r} for r in phase_rows(ph, floors, total)]


def wakeup_part(bridge, a, heads) -> list[dict]:
    """real_models._run_wakeup (single ablations, the scan, the wake-up curve)."""
    real = {"n_prompts": a.prompts, "prompt_style": "authors"}
    n_primary = 3
    ph = Phases(bridge, a.prompts)
    undo = [
        ph.wrap(ioi_experiment, "ablation_drops", "singles"),
        ph.wrap(real_models, "scan", "scan"),
        ph.wrap(real_models, "wake_up_curve", "wake"),
    ]
    t0 = time.perf_counter()
    real_models._run_wakeup(bridge, a.tokenizer, "gpt2", real, {"n_primary": n_primary}, "v2", 192, "cpu", 2048, 30.0)
    total = time.perf_counter() - t0
    ph.close(undo)
    pr = ioi.gpt2_prompts(a.tokenizer, a.prompts, 21)  # real_models._run_wakeup's prompt set
    f_set = plain_forward_per_row(bridge, pr.tokens) * pr.tokens.shape[0]
    floors = {
        "singles": (1 + len(heads)) * f_set,
        "scan": (2 * (len(heads) - n_primary) + 1) * f_set,
        "wake": n_primary * f_set,
    }
    print(f"wake-up: {pr.tokens.shape[0]} prompts x {pr.tokens.shape[1]} tokens; plain forward {f_set:.3f} s per set")
    return [{"part": "wakeup", "prompts": a.prompts, **r} for r in phase_rows(ph, floors, total)]


def induction_part(bridge, a, heads) -> list[dict]:
    """real_models._run_induction: detection, the scan and the ablation sets, one phase."""
    ind = {"n_prompts": a.induction_prompts, "data_seed": 3, "ks": [5, 10, 20], "n_primary": 4, "n_random": 5,
           "protocol": "v1"}  # coax.induction's schema defaults  # fmt: skip
    ph = Phases(bridge, a.induction_prompts)
    undo = [ph.wrap(induction_experiment, "run_induction", "induction")]
    t0 = time.perf_counter()
    real_models._run_induction(bridge, "gpt2", {"induction_T": a.induction_T}, ind, 192, 2048, 30.0)
    total = time.perf_counter() - t0
    ph.close(undo)
    T = a.induction_T
    toks, _ = induction_experiment.sample(a.induction_prompts, (T, T + 2), min(int(bridge.cfg.d_vocab), 20_000), 3)
    f_set = plain_forward_per_row(bridge, toks) * toks.shape[0]
    passes = 1 + 2 + 2 * (len(heads) - ind["n_primary"]) + 2 + 2 * len(ind["ks"]) * (1 + ind["n_random"])
    print(f"induction: {toks.shape[0]} prompts x {toks.shape[1]} tokens, {passes} passes; {f_set:.3f} s per set")
    return [{"part": "induction", "prompts": a.induction_prompts, **r}
            for r in phase_rows(ph, {"induction": passes * f_set}, total)]  # fmt: skip


PARTS = {"ioi": ioi_part, "wakeup": wakeup_part, "induction": induction_part}


def main(argv=None):
    ap = harness.arguments(__doc__, "coax_real.csv")
    ap.add_argument("--model", default=str(real_size.STAND_INS / "models" / "gpt2"))
    ap.add_argument("--prompts", type=int, default=8, help="IOI and wake-up prompts")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--induction-prompts", type=int, default=4)
    ap.add_argument("--induction-T", type=int, default=16, help="repeated half length (real_size.py's 16)")
    a = ap.parse_args(argv)
    harness.start(a)
    folder = real_size.stand_in(Path(a.model))
    bridge = load_bridge(folder)
    a.tokenizer = checkpoint_tokenizer(folder)  # the prompts' tokenizer, as real_models takes it
    nl, nh = bridge.cfg.n_layers, bridge.cfg.n_heads
    heads = head_components(nl, nh)
    print(f"model {folder}: {nl} layers x {nh} heads, vocabulary {bridge.cfg.d_vocab}, "
          f"{a.threads} thread(s), numerics {a.numerics}", flush=True)  # fmt: skip
    rows = [r for p in a.parts for r in PARTS[p](bridge, a, heads)]
    df = pd.DataFrame(rows)
    df.insert(2, "threads", a.threads)
    df["machine"] = f"{numerics.cpu_model()} ({numerics.cpu_vendor()}, family {numerics.cpu_family()})"
    df["numerics"] = a.numerics
    print(df.to_string(index=False))
    harness.write(df, a)


if __name__ == "__main__":
    main()
