"""The forward and backward passes that paper B's gradient baselines share
(:mod:`selfrepair.coax.baselines`): every attention layer's head outputs z kept with
their gradients of the metric, optionally with heads zero-ablated first and, for AtP*
GradDrop, one backward per layer with that layer's outputs cut out of the gradient (the
forward runs once). baselines imports these names back.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from selfrepair.core.components import Component
from selfrepair.core.interventions import make_hooks

Metric = Callable[[torch.Tensor], torch.Tensor]


def _grads(
    bridge,
    tokens,
    layers,
    metric: Metric,
    scale: float = 1.0,
    drop_layer: int | None = None,
    ablate: Sequence[Component] = (),
    logits_to_keep: int = 0,
):
    """z and dL/dz of every ``hook_z`` of ``layers`` (each [B, T, H, D]), with the
    components ``ablate`` zero-ablated (their z is then 0, and so is their score).
    ``logits_to_keep`` = n > 0: the unembedding runs at the last n positions only and
    ``metric`` gets those logits [B, n, V] (for a metric that reads only them)."""
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
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks, **_keep(logits_to_keep))
        value = metric(_kept(logits, logits_to_keep))
        names = list(store)
        grads = torch.autograd.grad(value, [store[n] for n in names], allow_unused=True)
    out = {}
    for n, g in zip(names, grads):
        z = store[n].detach()
        out[n] = (z, torch.zeros_like(z) if g is None else g.detach())
    return out


def _keep(logits_to_keep: int) -> dict:
    """The bridge's keyword for unembedding the last n positions only (none for n = 0)."""
    return {"logits_to_keep": int(logits_to_keep)} if logits_to_keep else {}


def _kept(logits: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """The last ``logits_to_keep`` positions of ``logits`` (a model that ignores the
    keyword returns every position)."""
    n = int(logits_to_keep)
    return logits[:, -n:] if n and logits.shape[1] != n else logits


def _zgrads(store: dict, grads) -> dict:
    out = {}
    for n, g in zip(store, grads):
        z = store[n].detach()
        out[n] = (z, torch.zeros_like(z) if g is None else g.detach())
    return out


class _Gate(torch.autograd.Function):
    """Identity forward; backward passes the gradient unless ``state['drop']`` is this
    layer, where it gives none (as a detach in the forward would: AtP* GradDrop)."""

    @staticmethod
    def forward(ctx, x, layer, state):
        ctx.layer, ctx.state = layer, state
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return (None if ctx.state.get("drop") == ctx.layer else g), None, None


def _backwards(
    bridge,
    tokens,
    layers,
    metric: Metric,
    ablate: Sequence[Component] = (),
    drop_layers: Sequence[int] = (),
    intact: bool = True,
    logits_to_keep: int = 0,
):
    """One forward with ``ablate`` zero-ablated, then its backward passes: yields
    (None, zg) for the plain backward (with ``intact``), then (l, zg) for each l in
    ``drop_layers``: the backward with layer l's attention and MLP outputs cut out of the
    gradient (AtP* GradDrop; the forward is the same for every l, so it runs once).
    zg as :func:`_grads` returns it."""
    store: dict[str, torch.Tensor] = {}
    state: dict = {}

    def keep(name):  # bound to the name asked for (the bridge reports aliases)
        def fn(x, hook):
            y = x if x.requires_grad else x.detach().requires_grad_(True)
            store[name] = y
            return y

        return fn

    def gate(layer):
        return lambda x, hook: _Gate.apply(x, layer, state)

    drop_layers = list(drop_layers)
    hooks = make_hooks([list(ablate)], tokens.shape[0]) if ablate else []
    hooks += [(f"blocks.{layer}.attn.hook_z", keep(f"blocks.{layer}.attn.hook_z")) for layer in layers]
    for d in drop_layers:
        hooks += [(f"blocks.{d}.hook_attn_out", gate(d)), (f"blocks.{d}.hook_mlp_out", gate(d))]
    todo = ([None] if intact else []) + drop_layers
    with torch.enable_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks, **_keep(logits_to_keep))
        value = metric(_kept(logits, logits_to_keep))
        names = list(store)
        for i, d in enumerate(todo):
            state["drop"] = d
            grads = torch.autograd.grad(
                value, [store[n] for n in names], allow_unused=True, retain_graph=i < len(todo) - 1
            )
            yield d, _zgrads(store, grads)
