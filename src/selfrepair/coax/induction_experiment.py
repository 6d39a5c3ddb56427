"""Paper B's induction experiment: attention-only GPT-2 toys trained on the repeated
sequences of :mod:`selfrepair.tasks.induction`, the heads' induction scores, COAX
against random sets, and the ratio table.

Attention-only models are GPT-2 configurations whose MLPs are switched off exactly:
``d_mlp = 1`` and the MLP's output projection (weight and bias) zeroed and frozen, so
``hook_mlp_out`` is identically 0 and the model saves and loads as a plain GPT-2.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from selfrepair.coax import score as coax
from selfrepair.core.components import head_components, parse
from selfrepair.core.interventions import run_ablated
from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config
from selfrepair.core.train import train
from selfrepair.tasks.induction import BOS, _repeat_mask, lm_batch, repeated_logprob, sample


def make_attention_only(model) -> None:
    """Switch the MLPs of a GPT-2 model off: c_proj weight and bias zeroed, frozen."""
    for block in model.transformer.h:
        with torch.no_grad():
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
        for p in block.mlp.parameters():
            p.requires_grad_(False)


def train_model(
    n_layers,
    n_heads,
    d_model,
    seed,
    T=20,
    vocab=64,
    lr=1e-3,
    batch_size=32,
    max_steps=1500,
    eval_every=250,
    device="cpu",
):
    """Train an attention-only GPT-2 on repeated sequences; returns (model, TrainResult).

    Accuracy for the log is the share of predictable repeated tokens predicted right.
    """

    t_max = T if isinstance(T, int) else int(T[1])
    cfg = gpt2_toy_config(vocab, n_layers, n_heads, d_model, 1, n_ctx=2 * t_max + 1, bos_token_id=BOS)
    model = build_gpt2_toy(cfg, seed=seed, positional=True)
    make_attention_only(model)
    val, val_lens = sample(128, T, vocab, 50_000 + seed)
    vmask = _repeat_mask(val_lens, val.shape[1] - 1, 0)

    def batch_fn(step):
        return lm_batch(sample(batch_size, T, vocab, seed * 1_000_003 + step)[0])

    def eval_fn(m):
        with torch.no_grad():
            lg = m(input_ids=val.to(next(m.parameters()).device)).logits.cpu()
        hit = lg[:, :-1].argmax(-1) == val[:, 1:]
        return float(hit[vmask].float().mean())

    res = train(
        model, batch_fn, eval_fn, lr=lr, max_steps=max_steps, eval_every=eval_every, target_accuracy=None, device=device
    )
    return model.eval(), res


def induction_scores(bridge, tokens: torch.Tensor, lens: torch.Tensor) -> dict[str, float]:
    """Mean attention from p to p - T + 1 over p in T+1..2T (the repeated half)."""

    tokens = tokens.to(next(bridge.parameters()).device)  # host tokens follow the model (a no-op on the CPU)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    rows, qs, ks = [], [], []
    for i, t in enumerate(lens.tolist()):
        for p in range(t + 1, 2 * t + 1):
            rows.append(i)
            qs.append(p)
            ks.append(p - t + 1)
    rows, qs, ks = map(torch.tensor, (rows, qs, ks))
    out = {}
    for h in head_components(bridge.cfg.n_layers, bridge.cfg.n_heads):
        pat = cache[f"blocks.{h.layer}.attn.hook_pattern"][:, h.head].float().cpu()  # [B, q, k]
        out[h.name] = float(pat[rows, qs, ks].mean())
    return out


def run_induction(
    bridge,
    T,
    vocab: int,
    n_prompts: int,
    seed: int,
    ks=(5, 10, 20),
    n_primary: int = 4,
    n_random: int = 5,
    protocol: str = "v1",
    top_r: int = 192,
    max_rows: int = 2048,
) -> dict:
    """Detect (data seed), calibrate COAX (seed+1), evaluate (seed+2) on disjoint data.

    COAX runs label-free on the calibration sequences (protocol v1: every position but
    the last; v2: the last), seeded with the top ``n_primary`` heads by induction score.

    Returns DataFrames: heads (induction score, single, cond, comp, primary), sets
    (k, method, drop of the repeated-token log-prob with the set ablated alone and
    together with the primaries; the random rows are means over ``n_random`` sets) and
    sequences (the same drops per evaluation sequence, which an interval resamples).
    """

    det, det_lens = sample(n_prompts, T, vocab, seed)
    cal, _ = sample(n_prompts, T, vocab, seed + 1)
    ev, ev_lens = sample(n_prompts, T, vocab, seed + 2)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    ind = induction_scores(bridge, det, det_lens)
    prim = [parse(n) for n in sorted(ind, key=lambda n: -ind[n])[:n_primary]]
    cands = [h for h in heads if h not in prim]
    sc = coax.scan(bridge, cal, cands, prim, protocol, top_r, max_rows=max_rows)
    htab = _heads_table(heads, ind, prim, sc.table)
    ranked = [parse(u) for u in sc.table.sort_values("comp", ascending=False)["unit"]]
    rng = np.random.default_rng(seed)
    # per sequence (a [n] tensor); the sets' figures are its mean, repeated_logprob's own
    metric = lambda lg: repeated_logprob(lg.cpu(), ev, ev_lens, reduce=False)  # noqa: E731
    base_seq = run_ablated(bridge, ev, [[], prim], reduce=metric, max_rows=max_rows)
    base = [float(v.mean()) for v in base_seq]
    rows, seqs = [], []
    for k in ks:
        r, q = _set_rows(bridge, ev, metric, base_seq, prim, cands, ranked, k, rng, n_random, max_rows)
        rows, seqs = rows + r, seqs + [q]
    sets_t = pd.DataFrame(rows)
    return {
        "heads": htab,
        "sets": sets_t,
        "sequences": pd.concat(seqs, ignore_index=True),
        "clean_logprob": base[0],
        "primaries_logprob": base[1],
        "primaries": [p.name for p in prim],
    }


def _heads_table(heads, ind: dict, prim, scan_table: pd.DataFrame) -> pd.DataFrame:
    """Per head: its induction score, whether it is a primary, and COAX's single, cond
    and comp (NaN for the primaries, which are not scanned)."""
    t = scan_table.set_index("unit")
    return pd.DataFrame(
        [
            {
                "unit": h.name,
                "induction_score": ind[h.name],
                "primary": h in prim,
                "single": t["single"].get(h.name, np.nan),
                "cond": t["cond"].get(h.name, np.nan),
                "comp": t["comp"].get(h.name, np.nan),
            }
            for h in heads
        ]
    )


def _set_rows(bridge, ev, metric, base_seq, prim, cands, ranked, k, rng, n_random: int, max_rows: int):
    """The two rows of one ``k``: the drop of the metric with COAX's top k ablated, alone
    and with the primaries, and the mean drops of ``n_random`` random sets of k
    candidates (drawn from ``rng``); and the same per sequence (a table).
    ``metric`` gives a value per sequence, ``base_seq`` the intact and the primaries'."""
    k_eff = min(k, len(cands))
    coax_set = ranked[:k_eff]
    rand_sets = [[cands[i] for i in rng.choice(len(cands), k_eff, replace=False)] for _ in range(n_random)]
    sets = [coax_set] + rand_sets
    alone_seq = run_ablated(bridge, ev, sets, reduce=metric, max_rows=max_rows)
    withs_seq = run_ablated(bridge, ev, [prim + s for s in sets], reduce=metric, max_rows=max_rows)
    base = [float(v.mean()) for v in base_seq]
    d_alone = [base[0] - float(v.mean()) for v in alone_seq]
    d_with = [base[1] - float(v.mean()) for v in withs_seq]
    per_alone = [(base_seq[0] - v).double().numpy() for v in alone_seq]
    per_with = [(base_seq[1] - v).double().numpy() for v in withs_seq]
    seq = pd.DataFrame(
        {
            "k": k,
            "sequence": np.arange(len(per_alone[0])),
            "drop_coax": per_alone[0],
            "drop_random": np.mean(per_alone[1:], axis=0),
            "drop_coax_with_primaries": per_with[0],
            "drop_random_with_primaries": np.mean(per_with[1:], axis=0),
        }
    )
    return [
        {
            "k": k,
            "k_eff": k_eff,
            "n_candidates": len(cands),
            "method": "coax",
            "units": " ".join(c.name for c in coax_set),
            "drop_alone": d_alone[0],
            "drop_with_primaries": d_with[0],
        },
        {
            "k": k,
            "k_eff": k_eff,
            "n_candidates": len(cands),
            "method": "random",
            "units": "",
            "drop_alone": float(np.mean(d_alone[1:])),
            "drop_with_primaries": float(np.mean(d_with[1:])),
        },
    ], seq


def ratio_table(sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per model and k: drop of the COAX set, mean drop of the random sets, their ratio."""
    rows = []
    for model, t in sets.items():
        for k, g in t.groupby("k"):
            c = g[g.method == "coax"].iloc[0]
            r = g[g.method == "random"].iloc[0]
            rows.append(
                {
                    "model": model,
                    "k": int(k),
                    "k_eff": int(c.k_eff),
                    "n_candidates": int(c.n_candidates),
                    "drop_coax": c.drop_alone,
                    "drop_random": r.drop_alone,
                    "ratio_alone": c.drop_alone / r.drop_alone if r.drop_alone > 0 else float("nan"),
                    "drop_coax_with_primaries": c.drop_with_primaries,
                    "drop_random_with_primaries": r.drop_with_primaries,
                    "ratio_with_primaries": (
                        c.drop_with_primaries / r.drop_with_primaries if r.drop_with_primaries > 0 else float("nan")
                    ),
                    "degenerate": bool(c.k_eff >= c.n_candidates),
                }
            )
    return pd.DataFrame(rows)
