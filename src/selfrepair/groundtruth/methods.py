"""Every attribution method of the three papers as a node score, on one model, one
metric and one batch, so that all of them can be set against the same Shapley values.

The metric v(logits) is the game's (a differentiable scalar, higher = better); a
component's output a (``hook_z`` slice of a head, ``hook_mlp_out`` of an MLP) is
"ablated" by replacing it with the game's base value b (its mean, or zero). Every
score estimates the component's importance as a drop, v(clean) - v(c ablated), or is a
magnitude where the method has no sign (G, COAX energies):

- ``single``: the exact single-ablation drop of the game (paper A's C, in the game's
  ablation mode); ``single_zero`` / ``single_mean``: the same with the other base;
- ``grad_norm`` / ``grad_norm_raw``: paper A's G, the norm of the weight gradient of
  -v (:func:`selfrepair.core.attribution.gradient_norms`), divided by sqrt(#entries) or
  raw (the authors' code);
- ``atp``: attribution patching at node level (= EAP's score summed over a node's
  outgoing edges, with the ablation as the corrupt activation):
  sum over examples and positions of (a - b) . dv/da at the clean state;
- ``eap_ig``: the same with dv/da averaged over ``steps`` states in which every
  component's output is b + alpha_k (a - b), alpha_k = (k - 1/2) / steps (midpoint
  rule), i.e. integrated gradients on the activations from the all-ablated state to the
  clean one, every component at once (EAP-IG's node form on activations; paper B's
  ``coax.baselines.eap_ig`` follows the COAX release instead: one layer at a time);
- ``gim`` (paper C): ``atp`` with dv/da taken under the GIM backward
  (:func:`selfrepair.gim.backward.gim`: temperature softmax gradient, frozen norm
  scales, gradient normalization);
- ``relp`` (RelP, arXiv 2508.21258): ``atp`` with dv/da taken under the LRP rules of
  :func:`selfrepair.gim.relp.relp` (the authors' default: LN-rule, identity rule for the
  nonlinearity, half-rule for gated products);
- ``eap_gp`` (EAP-GP, arXiv 2502.06852): ``eap_ig`` with the straight path replaced by
  GradPath: from the clean state, ``steps`` steps against the normalized gradient of
  ||logits(state) - logits(all ablated)||^2, per example, in the coordinates of
  ``eap_ig``'s path (every entry of every component output at b + alpha (a - b), alpha
  a tensor starting at 1); the step lengths are the straight path's (the first half a
  step), so along a straight direction the points are ``eap_ig``'s midpoints
  (:func:`eap_gp`);
- ``coax_single``, ``coax_cond``, ``coax_comp`` (paper B): :func:`selfrepair.coax.score.scan`
  with the seed S = the ``n_primary`` heads of largest single drop; components in
  S have no cond / comp (NaN) and are left out of those methods' comparisons. Given the
  model's Hugging Face GPT-2 (``hf_model``), the scan's ablated runs come from paper A's
  ablation engine instead (:func:`coax_scores_engine`: the same energies to float
  rounding, each run resumed at its first ablated layer, the last layer at the
  protocol's positions only).
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from selfrepair.coax import score as coax
from selfrepair.core import attribution, interventions
from selfrepair.core.components import Component
from selfrepair.gim import relp as relp_rules
from selfrepair.gim.backward import GIMConfig, frozen, with_hooks
from selfrepair.groundtruth import games

Metric = Callable[[torch.Tensor], torch.Tensor]
GRADIENT_METHODS = ("grad_norm", "grad_norm_raw", "atp", "eap_ig", "gim", "relp", "eap_gp")
COAX_METHODS = ("coax_single", "coax_cond", "coax_comp")


def _base(hook: str, x: torch.Tensor, mode: str, means: dict | None) -> torch.Tensor:
    return interventions._replacement(hook, x, mode, means)


def activation_gradients(
    bridge,
    tokens: torch.Tensor,
    components: Sequence[Component],
    metric: Metric,
    mode: str = "mean",
    means: dict | None = None,
    alpha: float = 1.0,
    config: GIMConfig | relp_rules.RelPConfig | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """{hook: (a, b, dv/dy)} for every hook of ``components``: a the clean-path output of
    the hook at this state, b its base value (broadcastable), and the gradient of
    ``metric`` with respect to the hook's output y = b + ``alpha`` (a - b), every hook
    interpolated at once (``alpha`` = 1: the clean model). ``config``: the gradient
    under the GIM backward (a :class:`GIMConfig`) or RelP's rules (a
    :class:`~selfrepair.gim.relp.RelPConfig`). Parameters are frozen for the call (no ``.grad`` is filled).
    """
    if mode not in interventions.MODES:
        raise ValueError(f"unknown ablation mode {mode!r}; expected one of {interventions.MODES}")
    hooks = sorted({c.hook for c in components})
    store: dict[str, tuple] = {}

    def keep(name):  # bound to the name asked for (the bridge reports aliases)
        def fn(x, hook):
            b = _base(name, x, mode, means)
            y = x if alpha == 1.0 else b + alpha * (x - b)
            if not y.requires_grad:  # nothing upstream needs a gradient (the first hook)
                y = y.detach().requires_grad_(True)
            store[name] = (x.detach(), b, y)
            return y

        return fn

    with frozen(bridge), torch.enable_grad():
        with relp_rules.modified_backward(bridge, config), with_hooks(bridge, [(h, keep(h)) for h in hooks]):
            value = metric(bridge(tokens))
            grads = torch.autograd.grad(value, [store[h][2] for h in hooks], allow_unused=True)
    return {
        h: (store[h][0], store[h][1], torch.zeros_like(store[h][2]) if g is None else g.detach())
        for h, g in zip(hooks, grads)
    }


def _node_products(state: dict, components: Sequence[Component], clean: dict | None = None) -> dict[str, float]:
    """Per component, sum over examples, positions and dims of (a_clean - b) * g, with
    a_clean from ``clean`` (default: ``state``'s own a) and g from ``state``."""
    clean = clean or state
    out = {}
    for c in components:
        a, b, _ = clean[c.hook]
        g = state[c.hook][2]
        d = (a - b).expand_as(a) * g
        out[c.name] = float((d[:, :, c.head, :] if c.is_head else d).double().sum())
    return out


def atp(bridge, tokens, components, metric, mode="mean", means=None) -> dict[str, float]:
    """Node attribution patching: first-order estimate of each component's drop."""
    return _node_products(activation_gradients(bridge, tokens, components, metric, mode, means), components)


def gim_scores(bridge, tokens, components, metric, mode="mean", means=None, config=None) -> dict[str, float]:
    """``atp`` with the gradient under the GIM backward (default: all three modifications)."""
    state = activation_gradients(bridge, tokens, components, metric, mode, means, config=config or GIMConfig())
    return _node_products(state, components)


def eap_ig(
    bridge, tokens, components, metric, mode="mean", means=None, steps: int = 5, clean: dict | None = None
) -> dict[str, float]:
    """Integrated gradients on the component outputs, ``steps`` midpoints (module doc).
    ``clean``: the clean state's :func:`activation_gradients` of the same call, if the
    caller has it (``atp``'s), so it is not computed twice."""
    if steps < 1:
        raise ValueError("eap_ig needs steps >= 1")
    if clean is None:
        clean = activation_gradients(bridge, tokens, components, metric, mode, means)
    total = dict.fromkeys((c.name for c in components), 0.0)
    for k in range(1, steps + 1):
        state = activation_gradients(bridge, tokens, components, metric, mode, means, alpha=(k - 0.5) / steps)
        for name, v in _node_products(state, components, clean).items():
            total[name] += v / steps
    return total


def relp_scores(bridge, tokens, components, metric, mode="mean", means=None, config=None) -> dict[str, float]:
    """``atp`` with the gradient under RelP's rules (default: the authors' rule set)."""
    state = activation_gradients(
        bridge, tokens, components, metric, mode, means, config=config or relp_rules.RelPConfig()
    )
    return _node_products(state, components)


def _path_state(bridge, tokens, hooks, metric, mode, means, alphas, target=None):
    """One point of :func:`eap_gp`'s path: every hook's output at b + alpha (x - b) with
    ``alphas`` {hook: tensor} (None: all ones, the clean state). Returns ({hook: dv/dy},
    {hook: d||logits - target||^2 / d alpha} or None, {hook: alpha}); ``target`` None:
    no path gradient."""
    store: dict[str, tuple] = {}

    def keep(name):
        def fn(x, hook):
            b = _base(name, x, mode, means)
            a = torch.ones_like(x) if alphas is None else alphas[name]
            a = a.detach().requires_grad_(target is not None)
            y = b + a * (x - b)
            if not y.requires_grad:
                y = y.detach().requires_grad_(True)
            store[name] = (a, y)
            return y

        return fn

    with frozen(bridge), torch.enable_grad(), with_hooks(bridge, [(h, keep(h)) for h in hooks]):
        logits = bridge(tokens)
        value = metric(logits)
        ys = [store[h][1] for h in hooks]
        grads = torch.autograd.grad(value, ys, allow_unused=True, retain_graph=target is not None)
        path = None
        if target is not None:
            obj = (logits.float() - target).pow(2).sum()
            path = torch.autograd.grad(obj, [store[h][0] for h in hooks], allow_unused=True)
    dv = {h: torch.zeros_like(y) if g is None else g.detach() for h, y, g in zip(hooks, ys, grads)}
    alpha = {h: store[h][0].detach() for h in hooks}
    if path is not None:
        path = {h: torch.zeros_like(alpha[h]) if g is None else g.detach() for h, g in zip(hooks, path)}
    return dv, path, alpha


def eap_gp(
    bridge,
    tokens,
    components,
    metric,
    mode="mean",
    means=None,
    steps: int = 5,
    clean: dict | None = None,
    path: str = "gradpath",
) -> dict[str, float]:
    """EAP-GP's node form (module doc): the mean of dv/dy over ``steps`` GradPath points,
    times (a_clean - b). The path lives in the coordinates alpha of ``eap_ig``'s path
    (all hooks' alphas of one example one vector; 1 = clean, 0 = all ablated): from
    alpha = 1, each step goes against the gradient of ||logits(alpha) - logits(0)||^2 by
    the straight path's step length (sqrt(#alphas) / steps, the first half that:
    :func:`selfrepair.gim.relp.step_lengths`). ``path="straight"``: each step along the
    straight direction instead (the points are then ``eap_ig``'s midpoints, the check).
    Costs steps + 2 forwards and 2 steps backwards (``clean``: as in ``eap_ig``)."""
    if steps < 1:
        raise ValueError("eap_gp needs steps >= 1")
    if path not in ("gradpath", "straight"):
        raise ValueError(f"unknown path {path!r}; gradpath or straight")
    if clean is None:
        clean = activation_gradients(bridge, tokens, components, metric, mode, means)
    hooks = sorted({c.hook for c in components})
    with torch.no_grad():  # logits with every component at its base value (alpha = 0)
        zero = {h: torch.zeros_like(clean[h][0]) for h in hooks}
        target = _ablated_logits(bridge, tokens, hooks, mode, means)
    total = dict.fromkeys((c.name for c in components), 0.0)
    n_alpha = sum(clean[h][0][0].numel() for h in hooks)  # alphas per example
    distance = torch.full((tokens.shape[0],), math.sqrt(n_alpha), device=tokens.device)
    shapes = {h: zero[h].shape for h in hooks}
    if path == "gradpath":  # the first direction, at the clean state
        _, grad, alphas = _path_state(bridge, tokens, hooks, metric, mode, means, None, target)
    else:
        alphas = {h: torch.ones_like(zero[h]) for h in hooks}
    lengths = relp_rules.step_lengths(distance, steps, first=0.5)
    for j, length in enumerate(lengths):
        if path == "straight":  # the descent direction of the straight line: every alpha down alike
            grad = {h: torch.ones_like(zero[h]) for h in hooks}
        flat = torch.cat([grad[h].flatten(1) for h in hooks], dim=1)
        moved = relp_rules.gradpath_step(torch.cat([alphas[h].flatten(1) for h in hooks], dim=1), flat, length)
        alphas, start = {}, 0
        for h in hooks:
            n = math.prod(shapes[h][1:])
            alphas[h] = moved[:, start : start + n].reshape(shapes[h])
            start += n
        more = path == "gradpath" and j < steps - 1  # the next direction from the same forward
        dv, grad, _ = _path_state(bridge, tokens, hooks, metric, mode, means, alphas, target if more else None)
        state = {h: (clean[h][0], clean[h][1], dv[h]) for h in hooks}
        for name, v in _node_products(state, components, clean).items():
            total[name] += v / steps
    return total


def _ablated_logits(bridge, tokens, hooks, mode, means) -> torch.Tensor:
    """Logits (float) with every hook's output at its base value."""

    def fn(name):
        return lambda x, hook: _base(name, x, mode, means).expand_as(x).to(x.dtype)

    with with_hooks(bridge, [(h, fn(h)) for h in hooks]):
        return bridge(tokens).float()


def grad_norms(bridge, tokens, components, metric, normalization="sqrt") -> dict[str, float]:
    """Paper A's G on this batch and metric: norm of each component's weight gradient of -v."""

    batch = SimpleNamespace(tokens=tokens)  # gradient_norms reads batch.tokens
    norms = attribution.gradient_norms(bridge, [batch], components, lambda lg, b: -metric(lg), normalization)
    bridge.zero_grad(set_to_none=True)  # leave no .grad behind
    return {k: float(v[0]) for k, v in norms.items()}


def sqrt_normalized(raw: dict[str, float], components: Sequence[Component], cfg) -> dict[str, float]:
    """``grad_norms(..., 'sqrt')`` from the raw norms of the same gradient (one backward
    pass for both): each divided by sqrt(#entries) of the weight G reads, a head's slice of
    W_V (d_model x d_head) or an MLP's W_out (d_mlp x d_model); ``cfg`` the bridge's."""
    numel = {c.name: cfg.d_model * (cfg.d_head if c.is_head else cfg.d_mlp) for c in components}
    return {k: v / math.sqrt(numel[k]) for k, v in raw.items()}


def coax_scores(
    bridge, tokens, components, primaries, mode="mean", means=None, protocol="v2", top_r=192, max_rows=4096
) -> dict[str, dict[str, float]]:
    """COAX's single energy, cond and comp per component, seed S = ``primaries``."""
    t = coax.scan(bridge, tokens, components, primaries, protocol, top_r, mode, means, max_rows=max_rows).table
    t = t.set_index("unit")
    return {f"coax_{k}": {u: float(t.loc[u, k]) for u in t.index} for k in ("single", "cond", "comp")}


def coax_scores_engine(
    hf_model, tokens, components, primaries, mode="mean", means=None, protocol="v2", top_r=192, rows=256
) -> dict[str, dict[str, float]]:
    """:func:`coax_scores` with the scan's runs (the intact model, every single ablation,
    S alone, S + u for every u outside S) on paper A's ablation engine (``hf_model``, the
    Hugging Face GPT-2 LM; ``means`` as the games'), the last layer at the protocol's
    positions only; the support, energies, cond and comp are COAX's own
    (:func:`coax.make_support`, :func:`coax.energy`), as :func:`coax.scan` forms them."""
    components, primaries = list(components), list(primaries)
    t = tokens.shape[1]
    pos = list(range(t - 1)) if protocol == "v1" else [t - 1]  # coax.make_support's positions
    lo = pos[0]
    outside = [u for u in components if u not in primaries]
    sets = [[]] + [[u] for u in components] + ([primaries] + [primaries + [u] for u in outside] if primaries else [])
    eng = games.SdpaEngine(hf_model, mode, means, rows=rows)
    logits = eng.run(tokens, sets, lambda lg, r: lg.float(), slice(lo, pos[-1] + 1))
    support = coax.make_support(logits[0], protocol, top_r, [p - lo for p in pos])
    z0, p0 = support.z0, support.p0
    n = len(components)
    single = {u.name: coax.energy(z0 - support.gather(z), p0) for u, z in zip(components, logits[1 : 1 + n])}
    cond = dict.fromkeys(single, float("nan"))
    if primaries:
        zs = support.gather(logits[1 + n])
        cond.update({u.name: coax.energy(zs - support.gather(z), p0) for u, z in zip(outside, logits[2 + n :])})
    comp = {k: cond[k] - single[k] for k in single}
    return {"coax_single": single, "coax_cond": cond, "coax_comp": comp}


def all_methods(
    bridge,
    tokens: torch.Tensor,
    components: Sequence[Component],
    metric: Metric,
    singles: dict[str, dict[str, float]],
    mode: str = "mean",
    means: dict | None = None,
    n_primary: int = 3,
    ig_steps: int = 5,
    protocol: str = "v2",
    top_r: int = 192,
    max_rows: int = 4096,
    hf_model=None,
) -> pd.DataFrame:
    """Long table ``method``, ``component``, ``score`` of every method of the module doc.

    ``singles``: {``mean``/``zero``: {component: exact single drop}} of the game's metric
    (the ``single`` method is the one of the game's ``mode``; every mode given is also a
    ``single_{mode}`` method). COAX's seed: the ``n_primary`` heads with the largest
    single drop in the game's mode (paper B seeds with heads, the name movers).
    ``hf_model`` (the model's Hugging Face GPT-2): COAX's runs on the ablation engine
    (:func:`coax_scores_engine`, ``max_rows`` sequences per chunk); None: on the bridge.
    ``attrs["timing"]``: {method: {seconds, cpu_s}} of the methods timed on their own
    (``relp``, ``eap_gp``; the rest are the pipeline's ``methods`` part as a whole).
    """
    components = list(components)
    if mode not in singles:
        raise ValueError(f"singles has no {mode!r} drops (the game's mode)")
    names = [c.name for c in components]
    scores: dict[str, dict[str, float]] = {"single": singles[mode]}
    for m, d in singles.items():
        scores[f"single_{m}"] = d
    raw = grad_norms(bridge, tokens, components, metric, "raw")
    scores["grad_norm"] = sqrt_normalized(raw, components, bridge.cfg)
    scores["grad_norm_raw"] = raw
    clean = activation_gradients(bridge, tokens, components, metric, mode, means)  # atp's state, eap_ig's end
    scores["atp"] = _node_products(clean, components)
    scores["eap_ig"] = eap_ig(bridge, tokens, components, metric, mode, means, ig_steps, clean=clean)
    scores["gim"] = gim_scores(bridge, tokens, components, metric, mode, means)
    timing = {}
    for name, fn in (
        ("relp", lambda: relp_scores(bridge, tokens, components, metric, mode, means)),
        ("eap_gp", lambda: eap_gp(bridge, tokens, components, metric, mode, means, ig_steps, clean=clean)),
    ):
        t0, c0 = time.perf_counter(), time.process_time()
        scores[name] = fn()
        timing[name] = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    heads = [c.name for c in components if c.is_head]
    order = sorted(heads, key=lambda n: -singles[mode][n])
    primaries = [c for c in components if c.name in set(order[:n_primary])]
    if hf_model is None:
        scores.update(coax_scores(bridge, tokens, components, primaries, mode, means, protocol, top_r, max_rows))
    else:
        scores.update(
            coax_scores_engine(hf_model, tokens, components, primaries, mode, means, protocol, top_r, max_rows)
        )
    rows = [
        {"method": m, "component": n, "score": float(d[n])}
        for m, d in scores.items()
        for n in names
        if n in d and np.isfinite(d[n])
    ]
    out = pd.DataFrame(rows, columns=["method", "component", "score"])
    out.attrs["primaries"] = [c.name for c in primaries]
    out.attrs["timing"] = timing
    return out
