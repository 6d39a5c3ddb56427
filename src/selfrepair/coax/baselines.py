"""Head-level baselines of paper B, on the same units and data as COAX.

All estimate the change of a task metric ``L`` (a function of the [B, T, V] logits,
averaged over prompts) when a head's output z is zero-ablated:

- AtP: -z . dL/dz (first-order Taylor, one forward and one backward);
- EAP-IG: -z . mean_k dL/dz at the states where every head's z is scaled by
  alpha_k = (k - 1/2) / steps, k = 1..steps (integrated gradients on the activations,
  from the all-ablated state to the clean one; midpoint rule; steps = 5);
- AtP* with GradDrop: for each layer l, AtP recomputed with the gradient through
  layer l's residual contribution (attention and MLP outputs) zeroed, forward
  unchanged; the score is sum_l |AtP_l| / (L - 1) (Kramar et al. 2024);
- single-ablation energy: :func:`selfrepair.coax.single_energies`.

The gradient estimates are summed over positions and averaged over prompts, so they
estimate the mean change of ``L``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch

from selfrepair.core.components import Component

Metric = Callable[[torch.Tensor], torch.Tensor]


def _grads(bridge, tokens, layers, metric: Metric, scale: float = 1.0, drop_layer: int | None = None):
    """z and dL/dz of every ``hook_z`` of ``layers`` (each [B, T, H, D])."""
    store: dict[str, torch.Tensor] = {}

    def keep(name):  # bound to the name asked for (the bridge reports aliases)
        def fn(x, hook):
            y = x * scale if scale != 1.0 else x
            store[name] = y
            return y

        return fn

    def drop(x, hook):
        return x.detach()

    hooks = [(f"blocks.{layer}.attn.hook_z", keep(f"blocks.{layer}.attn.hook_z")) for layer in layers]
    if drop_layer is not None:
        hooks += [(f"blocks.{drop_layer}.hook_attn_out", drop), (f"blocks.{drop_layer}.hook_mlp_out", drop)]
    with torch.enable_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
        value = metric(logits)
        names = list(store)
        grads = torch.autograd.grad(value, [store[n] for n in names], allow_unused=True)
    out = {}
    for n, g in zip(names, grads):
        z = store[n].detach()
        out[n] = (z, torch.zeros_like(z) if g is None else g.detach())
    return out


def _head_scores(zg: dict, heads: Sequence[Component], n_prompts: int, absolute_per_prompt: bool = False) -> dict:
    out = {}
    for h in heads:
        z, g = zg[h.hook]
        prod = (z[:, :, h.head, :] * g[:, :, h.head, :]).sum((-1, -2))  # [B]
        if absolute_per_prompt:  # E|z . dL/dz| (Taylor); gradient of a mean -> rescale
            out[h.name] = float(prod.abs().sum())
        else:
            out[h.name] = float(-prod.sum())
    return out


def atp(bridge, tokens, heads: Sequence[Component], metric: Metric) -> dict[str, float]:
    """AtP estimate of L(z_h := 0) - L(clean) per head."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric)
    return _head_scores(zg, heads, tokens.shape[0])


def eap_ig(bridge, tokens, heads: Sequence[Component], metric: Metric, steps: int = 5) -> dict[str, float]:
    """Integrated-gradients estimate of L(z_h := 0) - L(clean), ``steps`` points.

    The path scales every head's output (all layers at once) by alpha from 0 (every
    head ablated) to 1 (clean); the gradient w.r.t. each scaled z is averaged at the
    midpoints alpha_k = (k - 1/2) / steps and multiplied by -z_clean. For a model
    linear in z this gives a head its direct effect plus the mean over alpha of its
    effect through the (scaled) downstream heads.
    """
    layers = sorted({h.layer for h in heads})
    total: dict[str, torch.Tensor | float] = {h.name: 0.0 for h in heads}
    for k in range(1, steps + 1):
        zg = _grads(bridge, tokens, layers, metric, scale=(k - 0.5) / steps)
        for h in heads:
            total[h.name] = total[h.name] + zg[h.hook][1][:, :, h.head, :]
    names = {h.hook for h in heads}
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = {}
    for h in heads:
        z = cache[h.hook][:, :, h.head, :].detach()
        out[h.name] = float(-(z * total[h.name] / steps).sum())
    return out


def atp_star_graddrop(
    bridge, tokens, heads: Sequence[Component], metric: Metric, n_layers: int | None = None
) -> dict[str, float]:
    """AtP* GradDrop: sum over layers l of |AtP with layer l's gradient dropped| / (L-1)."""
    n_layers = n_layers or bridge.cfg.n_layers
    layers = sorted({h.layer for h in heads})
    acc = {h.name: 0.0 for h in heads}
    for dropped in range(n_layers):
        zg = _grads(bridge, tokens, layers, metric, drop_layer=dropped)
        for name, v in _head_scores(zg, heads, tokens.shape[0]).items():
            acc[name] += abs(v)
    return {k: v / max(n_layers - 1, 1) for k, v in acc.items()}


def all_scores(bridge, tokens, heads, metric: Metric, coax_table: pd.DataFrame, ig_steps: int = 5) -> pd.DataFrame:
    """One table: unit, single (energy), atp, eap_ig, atp_star, cond, comp.

    Ranking scores for discovery use magnitudes: |atp|, |eap_ig|, atp_star (>= 0),
    single and comp as they are.
    """
    a = atp(bridge, tokens, heads, metric)
    ig = eap_ig(bridge, tokens, heads, metric, ig_steps)
    gd = atp_star_graddrop(bridge, tokens, heads, metric)
    t = coax_table.set_index("unit")
    rows = []
    for h in heads:
        rows.append(
            {
                "unit": h.name,
                "single": t.loc[h.name, "single"],
                "atp": a[h.name],
                "eap_ig": ig[h.name],
                "atp_star": gd[h.name],
                "cond": t.loc[h.name, "cond"],
                "comp": t.loc[h.name, "comp"],
            }
        )
    return pd.DataFrame(rows)


DISCOVERY_METHODS = {
    "single": lambda t: t["single"],
    "atp": lambda t: t["atp"].abs(),
    "eap_ig": lambda t: t["eap_ig"].abs(),
    "atp_star": lambda t: t["atp_star"],
    "coax": lambda t: t["comp"],
}
