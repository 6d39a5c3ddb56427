"""Paper A speed, measured side by side in one run (ratios, never timed assertions).

For one trained seed, each part of the scoring is timed with this library and with a
naive reference that decodes one sequence at a time, as the original protocol did, on
the same model and sequences (identical accuracies are required), and set against its
compute floor: the FLOPs of one full forward per ablation set (G: forward + backward =
3 forwards) over this machine's matmul throughput, measured here. The ablation parts (C;
the probe's joint ablations and pruning curves when the seed's roles.csv is there) also
run on the TransformerBridge's hooks, the path the library used before its ablation
engine (selfrepair.core.engine), and C also on the engine without prefix reuse, with
identical outcomes required; prefix reuse computes less than the floor's full forwards,
so it can go under it. Each library call is also run once, untimed, with the matmul
FLOPs it executes counted (harness.executed_flops, torch's formulas: linear layers and
lm_head, forward and backward; not the attention kernels on the CPU, about 1-2% here): that
work over the same throughput is its executed floor, so ``library_over_executed`` says
how close a part runs to the cost of the work it does, and ``executed_fraction`` how
much of the full forwards' work it does. Also: training steps/s of the Hugging Face GPT-2 vs an equivalent plain PyTorch module.

    .venv/bin/python benchmarks/bench_heroes.py [--model results/heroes/sort/seed42/model]
        [--task sort] [--n 200] [--reference all|ood|none] [--threads 2] [--out results/benchmarks/heroes.csv] [--write]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from harness import executed_flops, forward_flops, timed  # noqa: E402
from torch import nn  # noqa: E402

from selfrepair.core import attribution, engine, interventions, models, train  # noqa: E402
from selfrepair.core import components as C  # noqa: E402
from selfrepair.heroes import scores as heroes  # noqa: E402
from selfrepair.tasks import sequences as S  # noqa: E402

N_LEN = 9  # the sequence length of G, C and the probe


class PlainBlock(nn.Module):
    def __init__(self, d, h, dm):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, dm), nn.Linear(dm, d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class PlainTransformer(nn.Module):
    """The paper's model in plain PyTorch: pre-LN, GELU, no positional encoding."""

    def __init__(self, vocab, d=128, h=4, layers=4, dm=512):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(PlainBlock(d, h, dm) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.ln(x))


def train_steps_per_second(model, logits_fn, steps: int, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    batches = [S.training_batch("sort", 64, 3, 7, g) for _ in range(steps + 5)]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3)
    model.train()

    def step(b):
        loss = train.masked_lm_loss(logits_fn(model, b.tokens), b.targets, b.mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for b in batches[:5]:
        step(b)
    _, seconds = timed(lambda: [step(b) for b in batches[5:]])
    return steps / seconds


@dataclass
class Bench:
    """One trained seed's models and what the parts share; ``row`` adds a part's row."""

    a: object
    hf: object
    br: object
    flops_per_s: float
    rows: list = field(default_factory=list)

    @property
    def comps(self):
        return C.all_components(self.hf.config.n_layer, self.hf.config.n_head)

    def row(self, part, lib_s, ref_s, flops, note="", executed=float("nan")):
        r = harness.floor_ratios(lib_s, flops, executed, self.flops_per_s)
        self.rows.append({"part": part, "library_s": lib_s, "reference_s": ref_s, "speedup_vs_reference": ref_s / lib_s,
                          "compute_floor_s": r["floor_s"], "library_over_floor": r["over_floor"],
                          "executed_fraction": r["executed_fraction"], "library_over_executed": r["over_executed"],
                          "note": note})  # fmt: skip
        print(self.rows[-1], flush=True)


def bridge_correct(br, batch, sets, mode, means):
    """Exact match on the bridge's hooks, one full forward per set (the library's path
    before the ablation engine)."""
    rows = interventions.run_ablated(
        br,
        batch.tokens,
        sets,
        mode,
        means,
        reduce=lambda lg: heroes.exact_match(lg, batch.targets, batch.mask),
        max_rows=max(1024, len(batch)),
    )
    return torch.stack(rows)


def ood_part(b: Bench) -> None:
    """1. OOD selection: accuracy at each candidate length, against one-at-a-time decoding."""
    a, hf = b.a, b.hf
    lengths = [8, 9, 10, 11]
    sets = {L: S.eval_set(a.task, L, a.n, seed=L) for L in lengths}

    def ood():
        return {L: heroes.correct(hf, s) for L, s in sets.items()}

    lib, lib_s = timed(ood)
    ref_s = float("nan")
    if a.reference in ("all", "ood"):
        ref, ref_s = timed(
            lambda: {
                L: torch.tensor([heroes.greedy_decode_correct(hf, a.task, s.tokens[i, 1 : L + 1]) for i in range(a.n)])
                for L, s in sets.items()
            }
        )
        assert all(torch.equal(lib[L], ref[L]) for L in lengths), "library and reference disagree"
    flops = sum(forward_flops(hf.config, a.n, 2 * L + 2) for L in lengths)
    b.row("OOD selection", lib_s, ref_s, flops, f"{a.n} sequences x {len(lengths)} lengths", executed_flops(ood))


def g_part(b: Bench) -> list:
    """2. G: forward + backward over the OOD batches (no naive counterpart), on the Hugging
    Face modules and on the bridge's hooks; the batches."""
    a, comps = b.a, b.comps
    batches = S.fixed_length_batches(a.task, N_LEN, a.n_batches, 64, seed=1)
    g_flops = 3 * forward_flops(b.hf.config, 64 * a.n_batches, 2 * N_LEN + 2)

    def g_hf():
        return attribution.gradient_norms_gpt2(b.hf, batches, comps, heroes.lm_loss, "sqrt")

    def g_bridge():
        return attribution.gradient_norms(b.br, batches, comps, heroes.lm_loss, "sqrt")

    g_lib, lib_s = timed(g_hf)
    g_br, br_s = timed(g_bridge)
    g_rel = max(abs(sum(g_lib[k]) - sum(g_br[k])) / sum(g_br[k]) for k in g_br)
    assert g_rel < 1e-5, f"G: the two paths differ by {g_rel:.2g} (relative)"
    note = f"{a.n_batches} batches of 64; backward = 2x forward; Hugging Face modules"
    b.row("G", lib_s, float("nan"), g_flops, note, executed_flops(g_hf))
    note = f"the bridge's hooks; G within {g_rel:.1g} relative of the library's"
    b.row("G bridge path", br_s, float("nan"), g_flops, note, executed_flops(g_bridge))
    return batches


def naive_c(b: Bench, fresh, singles, mode, bmeans):
    """C by one-at-a-time greedy decoding on the bridge's hooks (the original protocol)."""
    out = []
    for s in singles:
        hooks = interventions.make_hooks([s], 1, mode, bmeans) if s else []

        class Hooked:
            def run_with_hooks(self):
                pass

            def __call__(self, tokens):
                with b.br.hooks(fwd_hooks=hooks):
                    return b.br(tokens)

        tokens = fresh.tokens
        out.append(torch.tensor([heroes.greedy_decode_correct(Hooked(), b.a.task, tokens[i, 1 : N_LEN + 1])
                                 for i in range(b.a.n)]))  # fmt: skip
    return torch.stack(out)


def c_part(b: Bench, fresh, means, bmeans) -> None:
    """3. C, mean and zero ablation of each component (+ the intact baseline): the engine
    with and without prefix reuse, and the bridge's hooks (one full forward per set)."""
    a, comps = b.a, b.comps
    singles = [[]] + [[c] for c in comps]
    c_flops = len(singles) * forward_flops(b.hf.config, a.n, 2 * N_LEN + 2)
    what = f"{len(comps)} components x {a.n} sequences"
    for mode in ("mean", "zero"):

        def c_engine(reuse=True, mode=mode):
            return heroes.ablation_correct(b.hf, fresh, singles, mode, means, reuse=reuse)

        def c_flat(mode=mode):
            return c_engine(reuse=False, mode=mode)

        def c_bridge(mode=mode):
            return bridge_correct(b.br, fresh, singles, mode, bmeans)

        lib, lib_s = timed(c_engine)
        flat, flat_s = timed(c_flat)
        old, old_s = timed(c_bridge)
        assert torch.equal(lib, flat) and torch.equal(lib, old), f"C ({mode}): engine and bridge path disagree"
        ref_s = float("nan")
        if a.reference == "all":
            ref, ref_s = timed(lambda mode=mode: naive_c(b, fresh, singles, mode, bmeans))
            assert torch.equal(lib, ref), f"C ({mode}): library and reference disagree"
        for part, s, how, fn in (
            (f"C {mode}", lib_s, "engine, prefix reuse", c_engine),
            (f"C {mode} no prefix reuse", flat_s, "engine, full forwards", c_flat),
            (f"C {mode} bridge path", old_s, "bridge hooks, one set per forward", c_bridge),
        ):
            b.row(part, s, ref_s, c_flops, f"{what}; {how}", executed_flops(fn))


def probe_sets(roles: pd.DataFrame) -> tuple[dict, dict]:
    """(bloat and hero groups, the three pruning orders) of a seed's roles.csv."""
    by = {n: C.parse(n) for n in roles["component"]}
    groups = {g: [by[n] for n in roles.loc[roles["role"] == g, "component"]] for g in ("bloat", "hero")}
    orders = {
        name: [by[n] for n in roles.sort_values(cols, ascending=asc)["component"]]
        for name, cols, asc in (
            ("G ascending", ["G", "component"], [True, True]),
            ("G descending", ["G", "component"], [False, True]),
            ("C ascending", ["C", "component"], [True, True]),
        )
    }
    return groups, orders


def probe_part(b: Bench, fresh, means, bmeans) -> None:
    """4. heroes_probe's ablations on the seed's own roles (mean ablation, as the main run):
    the library's one engine call (heroes.probe_ablations, the intact model and single
    ablations taken from C's outcomes, as heroes_probe takes them from outcomes.pt) against
    the bridge path of before (joint vs individual per group with its own singles, then each
    pruning curve, one full forward per set)."""
    roles_csv = Path(b.a.model).parent / "roles.csv"
    if not roles_csv.exists():
        print(f"no {roles_csv}: the probe's part is skipped", flush=True)
        return
    groups, orders = probe_sets(pd.read_csv(roles_csv))
    comps = b.comps
    c_mean = heroes.ablation_correct(b.hf, fresh, [[]] + [[c] for c in comps], "mean", means)
    known = dict(zip(["baseline"] + [c.name for c in comps], c_mean))

    def probe():
        return heroes.probe_ablations(b.hf, fresh, groups, orders, "mean", means, known)

    (joint, curves), lib_s = timed(probe)
    sets = [s for g in groups.values() if g for s in [[]] + [[c] for c in g] + [g]]
    sets += [order[:k] for order in orders.values() for k in range(len(order) + 1)]
    old, old_s = timed(lambda: bridge_correct(b.br, fresh, sets, "mean", bmeans).float().mean(1).tolist())
    i = 0
    for name, g in groups.items():
        if g:
            ref = heroes.joint_drops(old[i], old[i + 1 : i + 1 + len(g)], old[i + 1 + len(g)])
            same = all(ref[k] == joint[name][k] or (ref[k] != ref[k] and joint[name][k] != joint[name][k]) for k in ref)
            assert same and ref.keys() == joint[name].keys(), f"probe: the {name}s' joint ablation disagrees"
            i += len(g) + 2
    for name, order in orders.items():
        assert curves[name] == old[i : i + len(order) + 1], f"probe: pruning curve {name} disagrees"
        i += len(order) + 1
    what = f"{len(sets)} ablation sets x {b.a.n} sequences (joint ablations and 3 pruning curves)"
    flops = len(sets) * forward_flops(b.hf.config, b.a.n, 2 * N_LEN + 2)
    b.row("probe ablations", lib_s, old_s, flops, f"{what}; reference = the bridge path", executed_flops(probe))


def training_part(b: Bench) -> None:
    """5. Training throughput: the Hugging Face module vs plain PyTorch, same batches."""
    cfg = b.hf.config
    plain = PlainTransformer(cfg.vocab_size, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.n_inner)
    fresh_hf = models.build_gpt2_toy(cfg, seed=0)
    hf_sps = train_steps_per_second(fresh_hf, lambda m, t: m(input_ids=t).logits, b.a.train_steps)
    plain_sps = train_steps_per_second(plain, lambda m, t: m(t), b.a.train_steps)
    nan = float("nan")
    b.rows.append({"part": "training steps/s (HF / plain)", "library_s": 1 / hf_sps, "reference_s": 1 / plain_sps,
                   "speedup_vs_reference": hf_sps / plain_sps, "compute_floor_s": nan, "library_over_floor": nan,
                   "executed_fraction": nan, "library_over_executed": nan,
                   "note": f"HF {hf_sps:.1f} steps/s, plain {plain_sps:.1f} steps/s"})  # fmt: skip
    print(b.rows[-1], flush=True)


def parse(argv=None):
    ap = harness.arguments(__doc__, "heroes.csv", threads=2)
    ap.add_argument("--model", default="results/heroes/sort/seed42/model")
    ap.add_argument("--task", default="sort")
    ap.add_argument("--n", type=int, default=200, help="sequences per length / for C (both sides)")
    ap.add_argument("--n-batches", type=int, default=50)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument(
        "--reference",
        choices=["all", "ood", "none"],
        default="all",
        help="which parts also run the naive one-at-a-time reference (C's takes ~20 s per sequence x component at n = 1000); the others report library time and compute floor only",
    )
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    harness.start(a)
    if not Path(a.model).is_dir():
        raise SystemExit(f"no trained model at {a.model}: run `snakemake {a.model}` first")
    b = Bench(a, models.load_hf(a.model), models.load_bridge(a.model), harness.matmul_throughput())
    ood_part(b)
    batches = g_part(b)
    fresh = S.eval_set(a.task, N_LEN, a.n, seed=2)
    means = engine.means(b.hf, [x.tokens for x in batches])
    bmeans = interventions.component_means(b.br, [x.tokens for x in batches], b.comps)
    c_part(b, fresh, means, bmeans)
    probe_part(b, fresh, means, bmeans)
    training_part(b)
    df = pd.DataFrame(b.rows)
    df.insert(0, "threads", a.threads)
    df["matmul_gflops"] = b.flops_per_s / 1e9
    harness.write(df, a)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["note"]).to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
