"""Gradient-based scores per component.

Paper A's gradient magnitude G: for each batch, the Frobenius norm of the loss gradient
with respect to a head's slice of W_V (d_model x d_head) or an MLP's W_out
(d_mlp x d_model), divided by sqrt(number of entries) when normalized; G is the mean
over batches. The weight gradients are formed from hooked activations,
dL/dW_V[h] = X^T dL/dV[h] (X the value projection's input) and
dL/dW_out = post^T dL/d(mlp_out), which is exact for a linear layer and works for any
bridged architecture, whatever layout its fused weights have.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from selfrepair.core.components import Component

NORMALIZATIONS = ("sqrt", "raw")


def _weight_grad_norms(acts: dict, grads: dict, components: Sequence[Component], n_heads: int) -> dict[str, float]:
    out = {}
    for c in components:
        if c.is_head:
            x = acts[f"blocks.{c.layer}.attn.v.hook_in"].flatten(0, 1).double()  # [BT, d_model]
            dv = grads[f"blocks.{c.layer}.attn.hook_v"][:, :, c.head, :].flatten(0, 1).double()  # [BT, d_head]
            gw = x.T @ dv
        else:
            post = acts[f"blocks.{c.layer}.mlp.hook_post"].flatten(0, 1).double()  # [BT, d_mlp]
            dout = grads[f"blocks.{c.layer}.hook_mlp_out"].flatten(0, 1).double()  # [BT, d_model]
            gw = post.T @ dout
        out[c.name] = (float(gw.norm()), gw.numel())
    return out


def gradient_norms(
    bridge,
    batches: Sequence,
    components: Sequence[Component],
    loss_fn: Callable[[torch.Tensor, object], torch.Tensor],
    normalization: str = "sqrt",
) -> dict[str, list[float]]:
    """Per-batch gradient norms of each component's weight; {name: [norm per batch]}.

    ``loss_fn(logits, batch)`` gives the scalar loss of one batch (``batch.tokens`` is
    the input). ``normalization`` 'sqrt' divides each norm by sqrt(#entries).
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"g normalization must be one of {NORMALIZATIONS}, not {normalization!r}")
    act_names, grad_names = set(), set()
    for c in components:
        if c.is_head:
            act_names.add(f"blocks.{c.layer}.attn.v.hook_in")
            grad_names.add(f"blocks.{c.layer}.attn.hook_v")
        else:
            act_names.add(f"blocks.{c.layer}.mlp.hook_post")
            grad_names.add(f"blocks.{c.layer}.hook_mlp_out")
    result: dict[str, list[float]] = {c.name: [] for c in components}
    for batch in batches:
        acts: dict = {}
        grads: dict = {}

        def saver(store, name):
            # Keyed by the name asked for: the bridge may report an alias as hook.name.
            def save(x, hook):
                store[name] = x.detach()

            return save

        bridge.zero_grad(set_to_none=True)
        with bridge.hooks(
            fwd_hooks=[(n, saver(acts, n)) for n in act_names],
            bwd_hooks=[(n, saver(grads, n)) for n in grad_names],
        ):
            logits = bridge(batch.tokens)
            loss = loss_fn(logits, batch)
            loss.backward()
        norms = _weight_grad_norms(acts, grads, components, bridge.cfg.n_heads)
        for name, (norm, numel) in norms.items():
            result[name].append(norm / math.sqrt(numel) if normalization == "sqrt" else norm)
    bridge.zero_grad(set_to_none=True)
    return result
