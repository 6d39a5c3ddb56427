"""Reference for the ablation engine's tests: one full forward of a Hugging Face GPT-2
with the ablation written into its modules by hooks, nothing reused (shared by tests)."""

from __future__ import annotations

import torch


def hooked_logits(hf, tokens, ablated, mode, means, site="hook_z"):
    """Logits of ``hf`` on ``tokens`` with the components ``ablated`` replaced by zero or
    their mean: a head at its slice of c_proj's input (``site`` 'hook_z') or at its
    d_head-wide slice of the attention module's output, after c_proj and its bias
    ('attn_out_slice'); an MLP at its output."""
    n_heads, d = hf.config.n_head, hf.config.n_embd
    dh = d // n_heads
    handles = []
    for c in ablated:
        blk = hf.transformer.h[c.layer]
        value = 0.0 if mode == "zero" else means[c.hook][c.head] if c.is_head else means[c.hook]
        if c.is_head and site == "hook_z":

            def pre(module, args, c=c, value=value):
                z = args[0].reshape(*args[0].shape[:2], n_heads, dh).clone()
                z[:, :, c.head] = value
                return (z.reshape(args[0].shape),)

            handles.append(blk.attn.c_proj.register_forward_pre_hook(pre))
        elif c.is_head:

            def post_attn(module, args, out, c=c, value=value):
                a = out[0].clone()
                a[..., c.head * dh : (c.head + 1) * dh] = value
                return (a,) + tuple(out[1:])

            handles.append(blk.attn.register_forward_hook(post_attn))
        else:

            def post(module, args, out, value=value):
                return torch.zeros_like(out) + value

            handles.append(blk.mlp.register_forward_hook(post))
    try:
        with torch.no_grad():
            return hf(input_ids=tokens).logits
    finally:
        for h in handles:
            h.remove()
