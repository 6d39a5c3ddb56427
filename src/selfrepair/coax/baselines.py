"""Head-level baselines of paper B, on the same units and data as COAX.

The definitions follow the COAX authors' release 2.1.0 (repository
GongZhiren/Conditional-Co-Ablation, commit 33f1f0231debd8800141be32918e05f3d2f11598:
src/curvgraph/baselines.py, experiments/paper/backup_recovery_full.py and
conditional_gradient_contrast.py), re-implemented here. All estimate the change of a
task metric ``L`` (a function of the [B, T, V] logits, the mean over prompts of a
per-prompt metric L_b) when a head's output z is zero-ablated. Prompt b's AtP is
AtP_b = -z_b . dL_b/dz_b, summed over positions and head dims:

- AtP (``atp``, ours): the signed mean over prompts of AtP_b (prompts of opposite sign
  cancel); discovery ranks |atp|;
- AtP (``atp_mag``, the release's AtP): mean over prompts of |AtP_b|;
- EAP-IG (``eap_ig``, activation-space): for each attention layer on its own, that layer's
  z (all its heads) is set to alpha_k z_clean, alpha_k = k / steps, k = 1..steps, with
  everything upstream clean and every later layer recomputed from it; the gradient
  w.r.t. the interpolated z, averaged over the steps, times -z_clean, summed over
  positions, head dims and (signed) prompts, divided by the number of prompts; the score
  is the magnitude of that aggregate. With steps = 1 (alpha = 1, the clean state) it is
  |atp|;
- AtP* GradDrop (``atp_star``): for each layer l, the prompt's AtP recomputed with layer
  l's residual contribution (attention and MLP outputs) detached, forward unchanged (the
  residual skip past layer l still carries gradient); per prompt, sum over l of |AtP_l,b|
  / (L - 1), then the mean over prompts (Kramar et al. 2024);
- conditional gradient (``cond_grad``): ``atp_mag`` at COAX's conditional state, the
  primaries S zero-ablated (their outputs and the gradients through them are 0);
- two-state AtP (``atp_2s``): cond_grad - atp_mag (the release's "AtP two-state
  difference"), ranked signed;
- two-state AtP* (``atp_star_2s``): AtP* GradDrop with S zero-ablated minus AtP*
  GradDrop intact, ranked signed (the gradient analogue of COAX's comp = cond - single);
- amplification ratio (``amp_ratio``): cond_u / single_u from the COAX table where
  single_u > 0, else 0 (the release's NaN, set to 0 before ranking);
- ``amp_ratio_eps`` (ours, not ranked): cond_u / (single_u + eps), eps = ``amp_eps`` x
  the candidates' mean single energy (a ratio that stays finite for tiny singles);
- single-ablation energy: :func:`selfrepair.coax.single_energies`.

Ours differs in one convention: heads inside S get NaN for the conditional scores (as
COAX's cond does: they cannot be ablated again), where the release gives them 0. They are
never candidates (run_ioi scores the heads outside S only), so no ranking sees the NaN.

The batched gradient of the mean metric is g_b = dL/dz_b = (1/B) dL_b/dz_b, so -z_b . g_b
is AtP_b / B: sums over prompts of it (or of its magnitude) are the means over prompts.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch

from selfrepair.coax.head_gradients import _backwards, _grads, _keep, _kept, _zgrads  # noqa: F401
from selfrepair.core.components import Component
from selfrepair.core.interventions import Prefix

Metric = Callable[[torch.Tensor], torch.Tensor]  # as head_gradients.Metric
AMP_EPS = 1e-3  # amp_ratio_eps's eps as a share of the candidates' mean single energy


def _per_prompt(zg: dict, h: Component) -> torch.Tensor:
    """[B]: -z_b . g_b of head ``h`` per prompt b, summed over positions and head dims. L is
    the mean over the B prompts, so g_b = (1/B) dL_b/dz_b and this is AtP_b / B."""
    z, g = zg[h.hook]
    return -(z[:, :, h.head, :] * g[:, :, h.head, :]).sum((-1, -2))


def _signed(zg: dict, heads: Sequence[Component]) -> dict:
    """Per head, the signed mean over prompts of AtP_b."""
    return {h.name: float(_per_prompt(zg, h).sum()) for h in heads}


def _magnitude(zg: dict, heads: Sequence[Component]) -> dict:
    """Per head, the mean over prompts of |AtP_b|."""
    return {h.name: float(_per_prompt(zg, h).abs().sum()) for h in heads}


def _head_scores(zg: dict, heads: Sequence[Component], n_prompts: int, absolute_per_prompt: bool = False) -> dict:
    """:func:`_signed`, or :func:`_magnitude` with ``absolute_per_prompt`` (``n_prompts``
    is unused: g already carries the 1/B of the mean metric). Kept for coax.pruning."""
    return _magnitude(zg, heads) if absolute_per_prompt else _signed(zg, heads)


def _outside(scores: dict, heads: Sequence[Component], ablate: Sequence[Component]) -> dict:
    """NaN for the heads inside ``ablate`` (like COAX's cond: they cannot be ablated again)."""
    inside = {c.name for c in ablate}
    return {h.name: (float("nan") if h.name in inside else scores[h.name]) for h in heads}


def atp(bridge, tokens, heads: Sequence[Component], metric: Metric, logits_to_keep: int = 0) -> dict[str, float]:
    """AtP estimate of L(z_h := 0) - L(clean) per head: the signed mean of AtP_b.
    ``logits_to_keep`` (every baseline here): see :func:`_grads`."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric, logits_to_keep=logits_to_keep)
    return _signed(zg, heads)


def atp_mag(bridge, tokens, heads: Sequence[Component], metric: Metric, logits_to_keep: int = 0) -> dict[str, float]:
    """Mean over prompts of |AtP_b| per head (the release's AtP)."""
    zg = _grads(bridge, tokens, sorted({h.layer for h in heads}), metric, logits_to_keep=logits_to_keep)
    return _magnitude(zg, heads)


def cond_grad(
    bridge,
    tokens,
    heads: Sequence[Component],
    primaries: Sequence[Component],
    metric: Metric,
    logits_to_keep: int = 0,
) -> dict[str, float]:
    """Mean over prompts of |AtP_b| at the conditional state, ``primaries`` (S)
    zero-ablated as in COAX's cond: per prompt, the first-order estimate of
    L_b(S + h ablated) - L_b(S ablated), in magnitude (NaN for heads in S)."""
    layers = sorted({h.layer for h in heads})
    zg = _grads(bridge, tokens, layers, metric, ablate=primaries, logits_to_keep=logits_to_keep)
    return _outside(_magnitude(zg, heads), heads, primaries)


def atp_2s(
    bridge,
    tokens,
    heads: Sequence[Component],
    primaries: Sequence[Component],
    metric: Metric,
    intact: dict[str, float] | None = None,
    cond: dict[str, float] | None = None,
) -> dict[str, float]:
    """Two-state AtP: :func:`cond_grad` minus :func:`atp_mag` (``intact``, ``cond``: the
    two when already computed); NaN for heads in S."""
    intact = intact if intact is not None else atp_mag(bridge, tokens, heads, metric)
    cond = cond if cond is not None else cond_grad(bridge, tokens, heads, primaries, metric)
    return {h.name: cond[h.name] - intact[h.name] for h in heads}


def _ig_layer(bridge, tokens, layer: int, metric: Metric, steps: int, logits_to_keep: int = 0, prefix=None):
    """(z_clean, mean over k = 1..steps of dL/dz) of layer ``layer``'s ``hook_z`` when that
    layer alone is set to (k / steps) z_clean (later layers recomputed from it).

    The ``steps`` states run as copies of the batch in one forward and one backward,
    resumed at block ``layer`` from the intact run (``prefix``, an
    :class:`~selfrepair.core.interventions.Prefix`; made here when not given): upstream
    of the interpolated z everything is clean, and the metric of each copy depends on
    its own rows only, so the gradient of the sum of the copies' metrics is each copy's
    own gradient."""
    pfx = prefix if prefix is not None else Prefix(bridge, tokens)
    b, t = pfx.b, tokens.shape[1]
    name = f"blocks.{layer}.attn.hook_z"
    store: dict[str, torch.Tensor] = {}
    scales = [k / steps for k in range(1, steps + 1)]

    def interpolate(x, hook):
        parts = [x[i * b : (i + 1) * b] for i in range(steps)]
        y = torch.cat([p if s == 1.0 else p * s for p, s in zip(parts, scales)])
        if not y.requires_grad:  # nothing upstream needs a gradient (a frozen model)
            y = y.detach().requires_grad_(True)
        store[name] = y
        return y

    positions = list(range(t - logits_to_keep, t)) if logits_to_keep else None
    with torch.enable_grad():
        logits = pfx.run(layer, steps, [(name, interpolate)], positions)
        value = sum(metric(logits[i * b : (i + 1) * b]) for i in range(steps))
        (g,) = torch.autograd.grad(value, [store[name]], allow_unused=True)
    y = store[name].detach()
    g = torch.zeros_like(y) if g is None else g.detach()
    total = 0.0
    for i in range(steps):
        total = total + g[i * b : (i + 1) * b]
    return y[(steps - 1) * b :], total / steps  # the last step is alpha = 1: z is the clean output


def eap_ig(
    bridge, tokens, heads: Sequence[Component], metric: Metric, steps: int = 5, logits_to_keep: int = 0, prefix=None
) -> dict[str, float]:
    """Activation-space EAP-IG per head (module docstring): |signed mean over prompts of
    -z_clean . mean_k dL/dz|, one attention layer interpolated at a time, ``steps`` right
    endpoints alpha_k = k / steps; steps x (number of layers) forward-backward passes
    (per layer, the steps batched and resumed at that layer: :func:`_ig_layer`)."""
    if steps < 1:
        raise ValueError(f"eap_ig needs steps >= 1, not {steps!r}")
    pfx = prefix if prefix is not None else Prefix(bridge, tokens)
    out = {}
    for layer in sorted({h.layer for h in heads}):
        zg = {f"blocks.{layer}.attn.hook_z": _ig_layer(bridge, tokens, layer, metric, steps, logits_to_keep, pfx)}
        mine = [h for h in heads if h.layer == layer]
        out.update({name: abs(v) for name, v in _signed(zg, mine).items()})
    return {h.name: out[h.name] for h in heads}


def _graddrop_states(
    bridge, tokens, heads, metric, n_layers=None, ablate=(), intact=False, logits_to_keep: int = 0
) -> tuple[dict | None, dict[str, float]]:
    """(zg of the plain backward when ``intact``, else None; AtP* GradDrop per head), from
    one forward with ``ablate`` zero-ablated and its backward passes (:func:`_backwards`)."""
    n_layers = n_layers or bridge.cfg.n_layers
    layers = sorted({h.layer for h in heads})
    acc = {h.name: 0.0 for h in heads}
    plain = None
    for dropped, zg in _backwards(bridge, tokens, layers, metric, ablate, range(n_layers), intact, logits_to_keep):
        if dropped is None:
            plain = zg
            continue
        for name, v in _magnitude(zg, heads).items():
            acc[name] += v
    return plain, {k: v / max(n_layers - 1, 1) for k, v in acc.items()}


def atp_star_graddrop(
    bridge,
    tokens,
    heads: Sequence[Component],
    metric: Metric,
    n_layers: int | None = None,
    ablate: Sequence[Component] = (),
    logits_to_keep: int = 0,
) -> dict[str, float]:
    """AtP* GradDrop: mean over prompts of sum over layers l of |AtP_b with layer l's
    gradient dropped| / (L-1), with the components ``ablate`` zero-ablated (default:
    none, the intact model; an ablated head's z is 0, and so is its score). The forward
    does not depend on l: it runs once, then one backward per l."""
    return _graddrop_states(bridge, tokens, heads, metric, n_layers, ablate, False, logits_to_keep)[1]


def atp_star_2s(
    bridge,
    tokens,
    heads: Sequence[Component],
    primaries: Sequence[Component],
    metric: Metric,
    clean: dict[str, float] | None = None,
    logits_to_keep: int = 0,
    cond: dict[str, float] | None = None,
) -> dict[str, float]:
    """Two-state AtP*: AtP* GradDrop with ``primaries`` zero-ablated minus AtP* GradDrop
    on the intact model (``clean``, ``cond``: the two, when already computed); NaN for
    heads in S."""
    clean = (
        clean if clean is not None else atp_star_graddrop(bridge, tokens, heads, metric, logits_to_keep=logits_to_keep)
    )
    if cond is None:
        cond = atp_star_graddrop(bridge, tokens, heads, metric, ablate=primaries, logits_to_keep=logits_to_keep)
    return _outside({h.name: cond[h.name] - clean[h.name] for h in heads}, heads, primaries)


def _energies(coax_table: pd.DataFrame) -> pd.DataFrame:
    """(single, cond) per unit of a COAX table; ValueError on a negative energy."""
    t = coax_table.set_index("unit")[["single", "cond"]].astype(float)
    negative = t.index[(t < 0).any(axis=1)]
    if len(negative):
        raise ValueError(f"energies must be >= 0; negative single or cond for {', '.join(negative)}")
    return t


def amp_ratio(coax_table: pd.DataFrame) -> dict[str, float]:
    """cond_u / single_u per unit of a COAX table (unit, single, cond) where single_u > 0,
    0 where single_u = 0 (the release's NaN, set to 0 before ranking); NaN for the units
    in S (cond NaN). Raises ValueError on a negative energy."""
    t = _energies(coax_table)
    ratio = (t["cond"] / t["single"].where(t["single"] > 0)).fillna(0.0)
    return ratio.where(t["cond"].notna()).to_dict()


def amp_ratio_eps(coax_table: pd.DataFrame, amp_eps: float = AMP_EPS) -> dict[str, float]:
    """cond_u / (single_u + eps) per unit of a COAX table (unit, single, cond), ours.

    eps = ``amp_eps`` x the mean single energy over the candidates, the units with a cond
    (the ones outside S; units in S, whose cond is NaN, get NaN). Raises ValueError on a
    negative energy, on ``amp_eps`` <= 0 and when eps is 0 (every candidate's single
    energy is 0).
    """
    if not amp_eps > 0:
        raise ValueError(f"amp_eps must be > 0, not {amp_eps!r}")
    t = _energies(coax_table)
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
    logits_to_keep: int = 0,
    prefix=None,
) -> pd.DataFrame:
    """One table: unit, single (energy), atp, eap_ig, atp_star, cond, comp, then atp_mag,
    cond_grad, atp_star_2s, amp_ratio, atp_2s, amp_ratio_eps (``amp_eps``: its eps
    share). ``primaries``: COAX's seed S (the conditional scores are taken with S
    zero-ablated). Discovery ranks: :data:`DISCOVERY_METHODS`. ``logits_to_keep`` = n > 0:
    ``metric`` reads the last n positions only, so only those are unembedded (the same
    scores); ``prefix``: the intact run of ``tokens``
    (:class:`~selfrepair.core.interventions.Prefix`) when already made.
    """
    heads, primaries = list(heads), list(primaries)
    keep = logits_to_keep
    # one forward per state (intact, S ablated); its plain backward gives atp and atp_mag
    # (intact) or cond_grad (S ablated), its GradDrop backwards AtP* in that state
    zg, gd = _graddrop_states(bridge, tokens, heads, metric, intact=True, logits_to_keep=keep)
    zg_s, gd_s = _graddrop_states(bridge, tokens, heads, metric, ablate=primaries, intact=True, logits_to_keep=keep)
    mag = _magnitude(zg, heads)
    cg = _outside(_magnitude(zg_s, heads), heads, primaries)
    mine = coax_table[coax_table["unit"].isin([h.name for h in heads])]
    cols = {
        "atp": _signed(zg, heads),
        "eap_ig": eap_ig(bridge, tokens, heads, metric, ig_steps, keep, prefix),
        "atp_star": gd,
        "atp_mag": mag,
        "cond_grad": cg,
        "atp_star_2s": atp_star_2s(bridge, tokens, heads, primaries, metric, clean=gd, cond=gd_s),
        "amp_ratio": amp_ratio(mine),
        "atp_2s": atp_2s(bridge, tokens, heads, primaries, metric, intact=mag, cond=cg),
        "amp_ratio_eps": amp_ratio_eps(mine, amp_eps),
    }
    t = coax_table.set_index("unit")
    rows = []
    for h in heads:
        row = {"unit": h.name, "single": t.loc[h.name, "single"]}
        row.update({c: cols[c][h.name] for c in ("atp", "eap_ig", "atp_star")})
        row.update({c: t.loc[h.name, c] for c in ("cond", "comp")})
        row.update({c: v[h.name] for c, v in cols.items() if c not in row})
        rows.append(row)
    return pd.DataFrame(rows)


# Discovery ranking score per method, from an all_scores table (higher = more likely a
# backup), the release's scores as they come (atp_mag, cond_grad, atp_star, eap_ig are
# magnitudes; atp_star_2s, atp_2s and COAX's comp signed growths; amp_ratio >= 0); our
# signed atp by its magnitude. atp_2s is computed from its two terms (the same float64
# subtraction as its column), so tables that keep only those two columns rank it too.
DISCOVERY_METHODS = {
    "single": lambda t: t["single"],
    "atp": lambda t: t["atp"].abs(),
    "eap_ig": lambda t: t["eap_ig"],
    "atp_star": lambda t: t["atp_star"],
    "coax": lambda t: t["comp"],
    "atp_mag": lambda t: t["atp_mag"],
    "cond_grad": lambda t: t["cond_grad"],
    "atp_star_2s": lambda t: t["atp_star_2s"],
    "amp_ratio": lambda t: t["amp_ratio"],
    "atp_2s": lambda t: t["cond_grad"] - t["atp_mag"],
}
