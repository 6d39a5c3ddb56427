"""Where the edge graph's nodes are on a TransformerLens 4 bridge, and the forward
activations of every upstream node.

``use_attn_result``, ``use_split_qkv_input`` and ``use_hook_mlp_in`` are switched on by
``prepared`` for the duration of each call, then back: ``input`` is
``blocks.0.hook_resid_pre``, a head's output is ``blocks.L.attn.hook_result[:, :, H]``,
an MLP's ``blocks.L.hook_mlp_out``; a head's q/k/v input is
``blocks.L.hook_{q,k,v}_input[:, :, H]``, an MLP's input ``blocks.L.hook_mlp_in``, the
logits' input ``ln_final.hook_in`` (:meth:`Graph.backward_slots`).

Post-attention norms (Gemma-2's and Gemma-3's ``ln1_post``): a layer's attention output is
``ln1_post(sum_h result_h + b_O)``, so a head's output reaches the residual stream only
through a norm of the whole layer's sum. As in MIB (EAP-IG, the TransformerLens 2
``use_normalization_before_and_after`` path), a head node is still its pre-norm
``attn.hook_result[:, :, H]``; an MLP node is ``hook_mlp_out``, which on the bridge is
the post-MLP norm's output (``ln2_post.hook_out``), so MLP edges stay additive.
:func:`attn_post_norms` gives each layer's norm, :func:`head_rows` its heads' rows.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from selfrepair.gim.backward import frozen
from selfrepair.gim.graph import Graph

_GRAPH_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")


@contextmanager
def prepared(bridge):
    """For the block: the bridge features the edge graph needs switched on
    (``use_attn_result``, ``use_split_qkv_input``, ``use_hook_mlp_in``; ``use_attn_in``
    off, as it excludes split q/k/v inputs) and every parameter frozen, so that scoring
    never accumulates into the caller's ``.grad``. On exit every flag and every
    parameter's ``requires_grad`` is what it was (nested use is fine)."""
    flags = {f: bool(getattr(bridge.cfg, f, False)) for f in _GRAPH_FLAGS + ("use_attn_in",)}
    if (
        all(flags[f] for f in _GRAPH_FLAGS)
        and not flags["use_attn_in"]
        and not any(p.requires_grad for p in bridge.parameters())
    ):
        yield bridge  # already so (an enclosing call): nothing to change or restore
        return
    try:
        if flags["use_attn_in"]:
            bridge.set_use_attn_in(False)
        bridge.set_use_attn_result(True)
        bridge.set_use_split_qkv_input(True)
        bridge.set_use_hook_mlp_in(True)
        with frozen(bridge):
            yield bridge
    finally:
        bridge.set_use_split_qkv_input(flags["use_split_qkv_input"])  # before use_attn_in: exclusive
        bridge.set_use_attn_result(flags["use_attn_result"])
        bridge.set_use_hook_mlp_in(flags["use_hook_mlp_in"])
        if flags["use_attn_in"]:
            bridge.set_use_attn_in(True)


def on_prepared(fn):
    """Run ``fn(bridge, ...)`` inside :func:`prepared`: no lasting change to the bridge."""

    @functools.wraps(fn)
    def wrapper(bridge, *args, **kwargs):
        with prepared(bridge):
            return fn(bridge, *args, **kwargs)

    return wrapper


def forward_hooks(graph: Graph):
    """(hook name, [(forward index, head slot or None)]) of every upstream node."""
    out = [("blocks.0.hook_resid_pre", [(0, None)])]
    i = 1
    for layer in range(graph.n_layers):
        out.append((f"blocks.{layer}.attn.hook_result", [(i + h, h) for h in range(graph.n_heads)]))
        i += graph.n_heads
        out.append((f"blocks.{layer}.hook_mlp_out", [(i, None)]))
        i += 1
    return out


def node_rows(graph: Graph):
    """(hook name, first forward row, number of rows or None) of every upstream node's
    hook: ``None`` for a [B, T, d] output (one row), n for a [B, T, n, d] one (n rows
    from the first, a layer's heads); :func:`forward_hooks` in contiguous form."""
    out = []
    for name, slots in forward_hooks(graph):
        rows = [i for i, _ in slots]
        assert rows == list(range(rows[0], rows[0] + len(rows)))
        out.append((name, rows[0], None if slots[0][1] is None else len(rows)))
    return out


def activation_recorder(graph: Graph):
    """(hooks, result): forward hooks that write every upstream node's activation
    (detached) in place into one [B, T, n_forward, d_model] buffer, allocated at the first
    hook; ``result()`` returns the buffer once a forward has filled every row."""
    n_forward = len(graph.forward)
    state = {"buf": None, "rows": 0}
    hooks = []
    for name, first, n in node_rows(graph):

        def rec(x, hook, first=first, n=n):
            buf = state["buf"]
            if buf is None:
                shape = (x.shape[0], x.shape[1], n_forward, x.shape[-1])
                buf = state["buf"] = torch.empty(shape, dtype=x.dtype, device=x.device)
            if n is None:
                buf[:, :, first] = x.detach()
            else:
                buf[:, :, first : first + n] = x.detach()[:, :, :n]
            state["rows"] += 1 if n is None else n

        hooks.append((name, rec))

    def result() -> torch.Tensor:
        if state["rows"] != n_forward:
            raise RuntimeError(f"{state['rows']} of {n_forward} node activations were recorded")
        return state["buf"]

    return hooks, result


class _Stopped(Exception):
    """Raised by :func:`forward_activations`' ``stop_after`` hook: the rest is not needed."""


@on_prepared
def forward_activations(
    bridge, graph: Graph, tokens: torch.Tensor, hooks=(), stop_after: str | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Logits and activations of every upstream node, [B, T, n_forward, d_model]
    (:func:`activation_recorder`: one buffer, written in place as the forward goes).
    ``stop_after``: a hook name at which the forward stops once that hook's other hooks
    (``hooks`` first) have run, e.g. ``ln_final.hook_in`` to skip the unembedding; the
    logits are then None (the bridge removes its hooks on the way out)."""
    tokens = tokens.to(next(bridge.parameters()).device)  # host tokens follow the model (a no-op on the CPU)
    fwd, result = activation_recorder(graph)
    stop = []
    if stop_after is not None:

        def halt(x, hook):
            raise _Stopped

        stop = [(stop_after, halt)]
    with torch.no_grad():
        try:
            logits = bridge.run_with_hooks(tokens, fwd_hooks=list(hooks) + fwd + stop)
        except _Stopped:
            logits = None
    return logits, result()


# ---------------------------------------------------------------- post-norms -----
def attn_post_norms(bridge) -> list | None:
    """Each layer's post-attention norm as the plain Hugging Face module (no hook points
    fire when it is called), or None when the model has none (GPT-2, Llama, Qwen-2).

    Gemma-2, Gemma-3: ``blocks.L.ln1_post`` (HF ``post_attention_layernorm``); its input,
    ``blocks.L.ln1_post.hook_in``, is the layer's summed head outputs plus the output bias
    (:data:`POST_NORM_INPUT`), its output ``blocks.L.hook_attn_out``."""
    if f"blocks.0.{POST_NORM}.hook_in" not in bridge.hook_dict:
        return None
    return [getattr(blk, POST_NORM).original_component for blk in bridge.blocks]


POST_NORM = "ln1_post"
POST_NORM_INPUT = "blocks.{layer}.ln1_post.hook_in"


def head_rows(graph: Graph) -> list[list[int]]:
    """Per layer, the forward rows of its heads (the order of :func:`forward_hooks`)."""
    step = graph.n_heads + 1
    return [[1 + layer * step + h for h in range(graph.n_heads)] for layer in range(graph.n_layers)]


def post_norm_shift(norm, pre: torch.Tensor, delta: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """How much the layer's attention output moves when the pre-norm sum ``pre`` moves by
    ``delta``: ``norm(pre + delta) - norm(pre)``, the norm's scale recomputed on the moved
    sum (EAP-IG ``evaluate_graph``'s Gemma case), not frozen at ``pre``'s. ``delta`` may
    carry leading dimensions (several moves of the same ``pre`` at once); ``base``:
    ``norm(pre)`` when the caller has it already."""
    return norm(pre + delta) - (norm(pre) if base is None else base)
