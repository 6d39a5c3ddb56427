"""Head-level baselines of paper B, on the same units and data as COAX.

All estimate the change of a task metric ``L`` (a function of the [B, T, V] logits,
averaged over prompts) when a head's output z is zero-ablated:

- AtP: -z . dL/dz (first-order Taylor, one forward and one backward), summed over
  positions and prompts: the signed effect on the mean metric; discovery ranks |AtP|;
- AtP, magnitude convention (``atp_mag``, the COAX authors' release 2.1.0 "AtP averages
  magnitudes"): mean over prompts of |per-prompt AtP|, so opposite per-prompt signs add
  up instead of cancelling;
- EAP-IG: -z . mean_k dL/dz at the states where every head's z is scaled by
  alpha_k = (k - 1/2) / steps, k = 1..steps (integrated gradients on the activations,
  from the all-ablated state to the clean one; midpoint rule; steps = 5), the signed
  aggregate over prompts; discovery ranks its magnitude;
- AtP* with GradDrop: for each layer l, AtP recomputed with the gradient through
  layer l's residual contribution (attention and MLP outputs) zeroed, forward
  unchanged (the residual skip past layer l still carries gradient); the score is
  sum_l |AtP_l| / (L - 1) (Kramar et al. 2024);
- conditional gradient (``cond_grad``): AtP at COAX's conditional state, the primaries S
  zero-ablated, i.e. the first-order estimate of L(S + u ablated) - L(S ablated);
  discovery ranks its magnitude;
- two-state AtP* (``atp_star_2s``): AtP* GradDrop at the S-ablated state minus AtP*
  GradDrop at the clean state, the gradient analogue of COAX's comp = cond - single;
  discovery ranks the signed growth;
- amplification ratio (``amp_ratio``): cond_u / (single_u + eps) from the COAX table,
  eps = ``amp_eps`` x the mean single energy of the candidates (a normalized COAX);
- single-ablation energy: :func:`selfrepair.coax.single_energies`.

The COAX authors' code is not available here: cond_grad, atp_star_2s, amp_ratio and
atp_mag are implemented from the definitions of their release 2.1.0 as we read them
(docs/PAPERS.md, paper B). Heads inside S get NaN for the conditional scores, as COAX's
cond does (they cannot be ablated again).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch

from selfrepair.core.components import Component
from selfrepair.core.interventions import make_hooks

Metric = Callable[[torch.Tensor], torch.Tensor]
AMP_EPS = 1e-3  # amp_ratio's eps as a share of the candidates' mean single energy


def _grads(
    bridge,
    tokens,
    layers,
    metric: Metric,
    scale: float = 1.0,
    drop_layer: int | None = None,
    ablate: Sequence[Component] = (),
):
    """z and dL/dz of every ``hook_z`` of ``layers`` (each [B, T, H, D]), with the
    components ``ablate`` zero-ablated (their z is then 0, and so is their score)."""
    store: dict[str, torch.Tensor] = {}

    def keep(name):  # bound to the name asked for (the bridge reports aliases)
        def fn(x, hook):
            y = x * scale if scale != 1.0 else x
            if not y.requires_grad:  # nothing upstream needs a gradient (a frozen model)
                y = y.detach().requires_grad_(True)
            store[name] = y
            return y

        return fn

    def drop(x, hook):
        return x.detach()

    # the ablation hooks run before the keepers of the same hook point
    hooks = make_hooks([list(ablate)], tokens.shape[0]) if ablate else []
    hooks += [(f"blocks.{layer}.attn.hook_z", keep(f"blocks.{layer}.attn.hook_z")) for layer in layers]
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
    """Per head, -sum over prompts of z_b . g_b (``absolute_per_prompt``: sum of |z_b . g_b|),
    each summed over positions. L is a mean over the B prompts, so g_b = (1/B) dL_b/dz_b
    and both sums are means over prompts: of the signed AtP, or of its magnitude."""
    out = {}
    for h in heads:
        z, g = zg[h.hook]
        prod = (z[:, :, h.head, :] * g[:, :, h.head, :]).sum((-1, -2))  # [B]
        if absolute_per_prompt:
            out[h.name] = float(prod.abs().sum())
        else:
            out[h.name] = float(-prod.sum())
    return out


def _outside(scores: dict, heads: Sequence[Component], ablate: Sequence[Component]) -> dict:
    """NaN for the heads inside ``ablate`` (like COAX's cond: they cannot be ablated again)."""
    inside = {c.name for c in ablate}
    return {h.name: (float("nan") if h.name in inside else scores[h.name]) for h in heads}


def atp(bridge, tokens, heads: Sequence[Component], metric: Metric) -> dict[str, float]:
    """AtP estimate of L(z_h := 0) - L(clean) per head."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric)
    return _head_scores(zg, heads, tokens.shape[0])


def atp_mag(bridge, tokens, heads: Sequence[Component], metric: Metric) -> dict[str, float]:
    """Mean over prompts of |AtP of the prompt| per head (the magnitude convention)."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric)
    return _head_scores(zg, heads, tokens.shape[0], absolute_per_prompt=True)


def cond_grad(
    bridge, tokens, heads: Sequence[Component], primaries: Sequence[Component], metric: Metric
) -> dict[str, float]:
    """AtP at the conditional state: estimate of L(S + h ablated) - L(S ablated) per head,
    S = ``primaries`` zero-ablated as in COAX's cond (NaN for heads in S)."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric, ablate=primaries)
    return _outside(_head_scores(zg, heads, tokens.shape[0]), heads, primaries)


def eap_ig(bridge, tokens, heads: Sequence[Component], metric: Metric, steps: int = 5) -> dict[str, float]:
    """Integrated-gradients estimate of L(z_h := 0) - L(clean), ``steps`` points.

    The path scales every head's output (all layers at once) by alpha from 0 (every
    head ablated) to 1 (clean); the gradient w.r.t. each scaled z is averaged at the
    midpoints alpha_k = (k - 1/2) / steps and multiplied by -z_clean. For a model
    linear in z this gives a head its direct effect plus the mean over alpha of its
    effect through the (scaled) downstream heads. The products are summed over
    positions and prompts with their signs (the signed aggregate over the dataset).
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
    bridge,
    tokens,
    heads: Sequence[Component],
    metric: Metric,
    n_layers: int | None = None,
    ablate: Sequence[Component] = (),
) -> dict[str, float]:
    """AtP* GradDrop: sum over layers l of |AtP with layer l's gradient dropped| / (L-1),
    with the components ``ablate`` zero-ablated (default: none, the clean state)."""
    n_layers = n_layers or bridge.cfg.n_layers
    layers = sorted({h.layer for h in heads})
    acc = {h.name: 0.0 for h in heads}
    for dropped in range(n_layers):
        zg = _grads(bridge, tokens, layers, metric, drop_layer=dropped, ablate=ablate)
        for name, v in _head_scores(zg, heads, tokens.shape[0]).items():
            acc[name] += abs(v)
    return {k: v / max(n_layers - 1, 1) for k, v in acc.items()}


def atp_star_2s(
    bridge,
    tokens,
    heads: Sequence[Component],
    primaries: Sequence[Component],
    metric: Metric,
    clean: dict[str, float] | None = None,
) -> dict[str, float]:
    """Two-state AtP*: AtP* GradDrop with ``primaries`` zero-ablated minus AtP* GradDrop
    on the clean model (``clean``: the latter, when already computed); NaN for heads in S."""
    clean = clean if clean is not None else atp_star_graddrop(bridge, tokens, heads, metric)
    cond = atp_star_graddrop(bridge, tokens, heads, metric, ablate=primaries)
    return _outside({h.name: cond[h.name] - clean[h.name] for h in heads}, heads, primaries)


def amp_ratio(coax_table: pd.DataFrame, amp_eps: float = AMP_EPS) -> dict[str, float]:
    """cond_u / (single_u + eps) per unit of a COAX table (unit, single, cond).

    eps = ``amp_eps`` x the mean single energy over the candidates, the units with a cond
    (the ones outside S; units in S, whose cond is NaN, get NaN). Raises ValueError on a
    negative energy, on ``amp_eps`` <= 0 and when eps is 0 (every candidate's single
    energy is 0).
    """
    if not amp_eps > 0:
        raise ValueError(f"amp_eps must be > 0, not {amp_eps!r}")
    t = coax_table.set_index("unit")[["single", "cond"]].astype(float)
    negative = t.index[(t < 0).any(axis=1)]
    if len(negative):
        raise ValueError(f"energies must be >= 0; negative single or cond for {', '.join(negative)}")
    cand = t[t["cond"].notna()]
    eps = amp_eps * float(cand["single"].mean()) if len(cand) else float("nan")
    if not eps > 0:
        raise ValueError(
            f"eps = amp_eps x mean single energy of the candidates = {eps!r}, must be > 0 "
            "(no unit has a cond: S empty or every unit inside S; or every candidate's single energy is 0)"
        )
    return {u: float(r["cond"] / (r["single"] + eps)) for u, r in t.iterrows()}


def all_scores(
    bridge,
    tokens,
    heads,
    metric: Metric,
    coax_table: pd.DataFrame,
    ig_steps: int = 5,
    *,
    primaries: Sequence[Component],
    amp_eps: float = AMP_EPS,
) -> pd.DataFrame:
    """One table: unit, single (energy), atp, eap_ig, atp_star, cond, comp, then atp_mag,
    cond_grad, atp_star_2s, amp_ratio. ``primaries``: COAX's seed S (the conditional
    scores are taken with S zero-ablated). Discovery ranks: :data:`DISCOVERY_METHODS`.
    """
    heads, primaries = list(heads), list(primaries)
    a = atp(bridge, tokens, heads, metric)
    ig = eap_ig(bridge, tokens, heads, metric, ig_steps)
    gd = atp_star_graddrop(bridge, tokens, heads, metric)
    mag = atp_mag(bridge, tokens, heads, metric)
    cg = cond_grad(bridge, tokens, heads, primaries, metric)
    gd2 = atp_star_2s(bridge, tokens, heads, primaries, metric, clean=gd)
    t = coax_table.set_index("unit")
    amp = amp_ratio(coax_table[coax_table["unit"].isin([h.name for h in heads])], amp_eps)
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
                "atp_mag": mag[h.name],
                "cond_grad": cg[h.name],
                "atp_star_2s": gd2[h.name],
                "amp_ratio": amp[h.name],
            }
        )
    return pd.DataFrame(rows)


# Discovery ranking score per method, from an all_scores table (higher = more likely a
# backup): magnitudes of the signed estimates, the others as they are.
DISCOVERY_METHODS = {
    "single": lambda t: t["single"],
    "atp": lambda t: t["atp"].abs(),
    "eap_ig": lambda t: t["eap_ig"].abs(),
    "atp_star": lambda t: t["atp_star"],
    "coax": lambda t: t["comp"],
    "atp_mag": lambda t: t["atp_mag"],
    "cond_grad": lambda t: t["cond_grad"].abs(),
    "atp_star_2s": lambda t: t["atp_star_2s"],
    "amp_ratio": lambda t: t["amp_ratio"],
}
