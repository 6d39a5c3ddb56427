"""What MIB's processed HookedTransformer changes in the activations that information flow
routes read: the input node's hook (the token embedding) and the weight processing that
``from_pretrained`` applies by default (value biases folded out of the heads, writes
centred under LayerNorm).
"""

from __future__ import annotations

import torch

from selfrepair.gim.graph import Graph
from selfrepair.gim.hooks import head_rows


def input_node_hook(bridge) -> str:
    """The hook whose output is MIB's input node: the token embedding (EAP-IG's graph reads
    ``hook_embed``), which is ``blocks.0.hook_resid_pre`` less the position embedding in a
    model with absolute positions (GPT-2) and all of ``hook_resid_pre`` in a rotary one.
    Patching and gradients cannot tell the two apart (clean and corrupt prompts share
    positions; d/d embed = d/d resid_pre); IFR's proximities can."""
    standard = getattr(bridge.cfg, "positional_embedding_type", "standard") == "standard"
    return "hook_embed" if standard and "hook_embed" in bridge.hook_dict else "blocks.0.hook_resid_pre"


def mib_processing(bridge, graph: Graph) -> tuple[torch.Tensor, bool]:
    """What MIB's HookedTransformer (``from_pretrained``'s default weight processing) does
    to the activations IFR reads, as (value-bias terms [n_forward, d_model], centre):

    * fold_value_biases (after fold_ln has put the attention norm's bias b_ln into b_V):
      a head's values carry the constant b_V + b_ln @ W_V, which reaches its output as
      (b_V + b_ln @ W_V) @ W_O (attention weights sum to 1); folded into the layer's
      output bias, it leaves the head's output and stays in the residual stream. Under
      grouped-query attention head h reads key/value group h // (n_heads / n_kv_heads).
    * center_writing_weights, for LayerNorm models only (TransformerLens skips it under
      RMSNorm): every write to the residual stream, so every part and every input,
      loses its mean over d_model.
    * fold_ln and center_unembed move nothing IFR reads."""
    cfg = bridge.cfg
    centre = getattr(cfg, "normalization_type", None) in ("LN", "LNPre")
    vb = torch.zeros(len(graph.forward), cfg.d_model)
    with torch.no_grad():
        w_o = bridge.W_O.detach().float().cpu()  # [n_layers, n_heads, d_head, d_model]
        w_v = bridge.W_V.detach().float().cpu()  # [n_layers, n_heads or n_kv_heads, d_model, d_head]
        rep = w_o.shape[1] // w_v.shape[1]
        for layer, rows in enumerate(head_rows(graph)):
            b_v = _value_bias(bridge, layer, w_v[layer])  # [n_heads or n_kv_heads, d_head] or None
            if b_v is None:
                continue
            for h, i in enumerate(rows):
                vb[i] = b_v[h // rep] @ w_o[layer, h]
    return vb, centre


def _value_bias(bridge, layer: int, w_v: torch.Tensor) -> torch.Tensor | None:
    """The constant part of layer ``layer``'s values, [n_kv_heads, d_head]: b_V plus the
    attention norm's bias through W_V (fold_ln puts that bias into b_V before
    fold_value_biases moves b_V out); None when there is neither (Llama, Gemma-2)."""
    try:
        b_v = bridge.blocks[layer].attn.b_V.detach().float().cpu()
    except AttributeError:  # bias-free value projections
        b_v = None
    ln = getattr(bridge.blocks[layer], "ln1", None)
    ln_b = getattr(getattr(ln, "original_component", None), "bias", None)
    if ln_b is not None:
        from_ln = torch.einsum("d,hde->he", ln_b.detach().float().cpu(), w_v)
        b_v = from_ln if b_v is None else b_v.reshape(from_ln.shape) + from_ln
    return None if b_v is None else b_v.reshape(w_v.shape[0], w_v.shape[2])
