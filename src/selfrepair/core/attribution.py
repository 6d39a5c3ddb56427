"""Gradient-based scores per component.

Paper A's gradient magnitude G: for each batch, the Frobenius norm of the loss gradient
with respect to a head's slice of W_V (d_model x d_head) or an MLP's W_out
(d_mlp x d_model), divided by sqrt(number of entries) when normalized; G is the mean
over batches. The weight gradients are formed from hooked activations,
dL/dW_V[h] = X^T dL/dV[h] (X the value projection's input) and
dL/dW_out = post^T dL/d(mlp_out), which is exact for a linear layer and works for any
bridged architecture, whatever layout its fused weights have.

Grouped-query attention (``n_key_value_heads`` < ``n_heads``): the heads of one group
share one W_V, so a head has no value weight of its own. A head's G is then the norm of
the gradient with respect to its own copy of the group's W_V, as if ``repeat_kv`` were
made explicit (the same model with the key/value weights duplicated per head, which has
the same outputs): X^T dL/dV_h with dL/dV_h = A_h^T dL/dz_h, the gradient that reaches
the shared values through head h's attention pattern A_h alone. The heads of a group sum
to the shared W_V's gradient; a model without grouped-query attention keeps the path
above (dL/dV from ``hook_v``), unchanged.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from selfrepair.core.components import Component

NORMALIZATIONS = ("sqrt", "raw")


def _check_normalization(normalization: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"g normalization must be one of {NORMALIZATIONS}, not {normalization!r}")


def _normalized(norm: float, numel: int, normalization: str) -> float:
    """A weight-gradient norm as G reports it: divided by sqrt(#entries) under 'sqrt'."""
    return norm / math.sqrt(numel) if normalization == "sqrt" else norm


def grouped(cfg) -> bool:
    """Whether the model's attention is grouped-query (fewer key/value heads than heads)."""
    kv = getattr(cfg, "n_key_value_heads", None)
    return bool(kv) and kv < cfg.n_heads


def _head_value_grad(acts: dict, grads: dict, c: Component, gqa: bool) -> torch.Tensor:
    """dL/dV of head ``c`` [B, T, d_head] (float64): its slice of ``hook_v``'s gradient, or
    under grouped-query attention its own share A_h^T dL/dz_h (module doc)."""
    if not gqa:
        return grads[f"blocks.{c.layer}.attn.hook_v"][:, :, c.head, :].double()
    pattern = acts[f"blocks.{c.layer}.attn.hook_pattern"][:, c.head].double()  # [B, T_query, T_key]
    dz = grads[f"blocks.{c.layer}.attn.hook_z"][:, :, c.head, :].double()  # [B, T_query, d_head]
    return torch.einsum("bqk,bqd->bkd", pattern, dz)


def _weight_grad_norms(acts: dict, grads: dict, components: Sequence[Component], gqa: bool) -> dict[str, float]:
    out = {}
    for c in components:
        if c.is_head:
            x = acts[f"blocks.{c.layer}.attn.v.hook_in"].flatten(0, 1).double()  # [BT, d_model]
            dv = _head_value_grad(acts, grads, c, gqa).flatten(0, 1)  # [BT, d_head]
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
    the input). ``normalization`` 'sqrt' divides each norm by sqrt(#entries). Under
    grouped-query attention a head's weight is its own copy of its group's W_V (module doc).
    """
    _check_normalization(normalization)
    gqa = grouped(bridge.cfg)
    act_names, grad_names = set(), set()
    for c in components:
        if c.is_head:
            act_names.add(f"blocks.{c.layer}.attn.v.hook_in")
            if gqa:  # each head's own share of the shared values (module doc)
                act_names.add(f"blocks.{c.layer}.attn.hook_pattern")
                grad_names.add(f"blocks.{c.layer}.attn.hook_z")
            else:
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
        norms = _weight_grad_norms(acts, grads, components, gqa)
        for name, (norm, numel) in norms.items():
            result[name].append(_normalized(norm, numel, normalization))
    bridge.zero_grad(set_to_none=True)
    return result


def gradient_norms_gpt2(
    model,
    batches: Sequence,
    components: Sequence[Component],
    loss_fn: Callable[[torch.Tensor, object], torch.Tensor],
    normalization: str = "sqrt",
) -> dict[str, list[float]]:
    """:func:`gradient_norms` on the plain Hugging Face GPT-2 modules (``model`` a
    GPT2LMHeadModel from ``models.load_hf``, not a bridge), the same weight-gradient norms from the same
    hooked quantities: the value projection's input (``ln_1``'s output) and dL/dV (the
    value third of ``c_attn``'s output gradient), the MLP's GELU output (``mlp.c_proj``'s
    input) and dL/d(MLP output).

    The backward pass computes activation gradients only (the weights are frozen for its
    duration and the embedding output is the leaf that asks for gradients): the weight
    gradients are formed here from the hooked pairs, so the weights' own ``.grad`` is
    never needed, and nothing is left in ``.grad``: a third of the backward FLOPs saved.
    The products X^T dL/dV (all heads of a layer in one) and post^T dL/d(out) are float32
    (the bridge path's are float64, 2.7x slower here), the norms float64. Values equal the
    bridge path's up to float rounding (~1e-6 relative; the bridge also runs attention
    its own way; tests/test_engine.py)."""
    from selfrepair.core.engine import hf_model

    _check_normalization(normalization)
    hf = hf_model(model)
    d = hf.config.n_embd
    n_heads = hf.config.n_head
    layers = sorted({c.layer for c in components})
    result: dict[str, list[float]] = {c.name: [] for c in components}
    flags = [(p, p.requires_grad) for p in hf.parameters()]
    handles = []
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        for batch in batches:
            acts: dict = {}
            grads: dict = {}
            handles = []  # filled as each hook is registered: the finally below removes them
            _register_gpt2_hooks(hf, layers, acts, grads, handles)
            logits = hf(input_ids=batch.tokens).logits
            loss_fn(logits, batch).backward()
            for h in handles:
                h.remove()
            handles = []
            _add_gpt2_norms(result, acts, grads, layers, components, d, n_heads, normalization)
    finally:
        for h in handles:
            h.remove()
        for p, flag in flags:
            p.requires_grad_(flag)
    return result


def _register_gpt2_hooks(hf, layers, acts: dict, grads: dict, handles: list) -> None:
    """The hooks of :func:`gradient_norms_gpt2` on the GPT-2 modules, registered: the
    embedding output made the leaf, and per layer the value projection's input and
    output gradient, the MLP's GELU output and output gradient, kept in ``acts`` and
    ``grads``; their handles go into ``handles`` as each is registered."""

    def leaf(module, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_(True)
        return ((x,) + tuple(args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def keep_grad(store, name):
        def hook(g):
            store[name] = g.detach()

        return hook

    def qkv_hook(layer):
        def fn(module, args, out):
            acts[f"v_in{layer}"] = args[0].detach()
            out.register_hook(keep_grad(grads, f"qkv{layer}"))

        return fn

    def post_hook(layer):
        def fn(module, args):
            acts[f"post{layer}"] = args[0].detach()

        return fn

    def mlp_hook(layer):
        def fn(module, args, out):
            out.register_hook(keep_grad(grads, f"mlp{layer}"))

        return fn

    blocks = hf.transformer.h
    handles.append(blocks[0].register_forward_pre_hook(leaf, with_kwargs=True))
    for layer in layers:
        handles.append(blocks[layer].attn.c_attn.register_forward_hook(qkv_hook(layer)))
        handles.append(blocks[layer].mlp.c_proj.register_forward_pre_hook(post_hook(layer)))
        handles.append(blocks[layer].mlp.register_forward_hook(mlp_hook(layer)))


def _add_gpt2_norms(result: dict, acts: dict, grads: dict, layers, components, d: int, n_heads: int, normalization):
    """Append to ``result`` each component's weight-gradient norm of one batch, formed
    from the hooked pairs (float32 products, float64 norms)."""
    dh = d // n_heads
    for layer in layers:
        x = acts[f"v_in{layer}"].flatten(0, 1)
        gv = x.T @ grads[f"qkv{layer}"][..., 2 * d :].flatten(0, 1)  # [d_model, n_heads * d_head]
        gout = acts[f"post{layer}"].flatten(0, 1).T @ grads[f"mlp{layer}"].flatten(0, 1)
        for c in (c for c in components if c.layer == layer):
            gw = gv[:, c.head * dh : (c.head + 1) * dh] if c.is_head else gout
            norm = float(gw.double().norm())
            result[c.name].append(_normalized(norm, gw.numel(), normalization))
