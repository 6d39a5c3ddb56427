"""Structured head pruning (paper B): COAX (sequential) vs Random, Magnitude, Wanda, Taylor.

Every method yields a removal order of the heads; pruning a fraction s removes the
first round(s * H) heads of that order (zero ablation of their z). Scores (z_h is the
head's output before W_O):

- Random: a seeded permutation;
- Magnitude: ||W_O[h]||_F (smallest first);
- Wanda: sum over W_O[h]'s weights of |W_ij| * ||z_h,i|| (input activation norm over
  the calibration tokens);
- Taylor: E|z_h . dL/dz_h| (per sequence, L the LM loss);
- COAX, sequential: remove the head with the smallest E(dz_u | already pruned) (its
  conditional ablation energy given the pruned set, Fisher metric of the dense
  model's clean outputs), re-score, repeat.
The one-shot baselines score once, on the dense model.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import torch

from selfrepair.core.components import Component, head_components

METHODS = ("random", "magnitude", "wanda", "taylor", "coax")


def magnitude_scores(bridge, heads) -> dict[str, float]:
    return {h.name: float(bridge.blocks[h.layer].attn.W_O[h.head].detach().float().norm()) for h in heads}


def wanda_scores(bridge, tokens, heads) -> dict[str, float]:
    names = {h.hook for h in heads}
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = {}
    for h in heads:
        z = cache[h.hook][:, :, h.head, :].float()  # [B, T, D]
        norm = z.reshape(-1, z.shape[-1]).norm(dim=0)  # [D]
        w = bridge.blocks[h.layer].attn.W_O[h.head].detach().float().abs()  # [D, d_model]
        out[h.name] = float((w * norm[:, None]).sum())
    return out


def taylor_scores(bridge, tokens, heads, loss_fn: Callable) -> dict[str, float]:
    from selfrepair.coax.baselines import _grads, _head_scores

    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), loss_fn)
    return _head_scores(zg, heads, tokens.shape[0], absolute_per_prompt=True)


def coax_order(bridge, tokens, heads, n_remove: int, protocol="v1", top_r=192, max_rows=2048):
    """Sequential COAX: returns the removal order and the number of forward passes."""
    from selfrepair.coax import score as coax

    support = coax.clean_support(bridge, tokens, protocol, top_r)
    passes = 1
    pruned: list[Component] = []
    remaining = list(heads)
    while len(pruned) < n_remove and remaining:
        sc = coax.scan(bridge, tokens, remaining, pruned, protocol, top_r, support=support, max_rows=max_rows)
        passes += sc.forward_passes
        col = "cond" if pruned else "single"
        best = sc.table.sort_values(col, kind="stable").iloc[0]["unit"]
        u = next(h for h in remaining if h.name == best)
        pruned.append(u)
        remaining.remove(u)
    return pruned, passes


def one_shot_orders(bridge, calib, heads, loss_fn, seed: int = 0) -> dict[str, list[Component]]:
    """Random (a permutation seeded by ``seed``), Magnitude, Wanda and Taylor: each scores
    once on the dense model, the smallest score first."""
    rng = np.random.default_rng(seed)
    out = {"random": [heads[i] for i in rng.permutation(len(heads))]}
    for name, sc in (
        ("magnitude", magnitude_scores(bridge, heads)),
        ("wanda", wanda_scores(bridge, calib, heads)),
        ("taylor", taylor_scores(bridge, calib, heads, loss_fn)),
    ):
        out[name] = sorted(heads, key=lambda h: sc[h.name])
    return out


def orders(
    bridge, calib, heads, loss_fn, max_sparsity: float, seed: int = 0, protocol="v1", top_r=192, max_rows=2048
) -> dict[str, list[Component]]:
    """Removal order of each method (COAX only up to ``max_sparsity``)."""
    out = one_shot_orders(bridge, calib, heads, loss_fn, seed)
    n = int(round(max_sparsity * len(heads)))
    out["coax"], _ = coax_order(bridge, calib, heads, n, protocol, top_r, max_rows)
    return out


def perplexity_sweep(bridge, evalset, orders_: dict, sparsities, loss_fn, max_rows=2048) -> pd.DataFrame:
    """Perplexity of the pruned model per method and sparsity (one batched pass each)."""
    from selfrepair.core.interventions import run_ablated

    h = len(next(iter(orders_.values())))
    n_heads = bridge.cfg.n_layers * bridge.cfg.n_heads
    rows = []
    for m, order in orders_.items():
        sets, keep = [], []
        for s in sparsities:
            n = int(round(s * n_heads))
            if n <= len(order):
                sets.append(order[:n])
                keep.append((s, n))
        ppl = run_ablated(bridge, evalset, sets, reduce=lambda lg: float(torch.exp(loss_fn(lg))), max_rows=max_rows)
        rows += [{"method": m, "sparsity": s, "n_pruned": n, "perplexity": p} for (s, n), p in zip(keep, ppl)]
    del h
    return pd.DataFrame(rows)


def run_pruning(bridge, calib, evalset, sparsities, seed=0, protocol="v1", top_r=192, max_rows=2048):
    from selfrepair.tasks.lm import lm_loss

    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    calib_loss = lambda lg: lm_loss(lg, calib)  # noqa: E731
    eval_loss = lambda lg: lm_loss(lg, evalset)  # noqa: E731
    o = orders(bridge, calib, heads, calib_loss, max(sparsities), seed, protocol, top_r, max_rows)
    table = perplexity_sweep(bridge, evalset, o, sparsities, eval_loss, max_rows)
    order_t = pd.DataFrame([{"method": m, "rank": i, "unit": c.name} for m, hs in o.items() for i, c in enumerate(hs)])
    return table, order_t
