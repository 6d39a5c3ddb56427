"""Hand-built models with the bridge's hook names, for tests with known answers."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


class _Attn(nn.Module):
    def __init__(self, w_o):
        super().__init__()
        self.W_O = nn.Parameter(w_o, requires_grad=False)  # [H, D=1, d_model]
        self.hook_z = HookPoint()


class _Block(nn.Module):
    def __init__(self, w_o):
        super().__init__()
        self.attn = _Attn(w_o)
        self.hook_attn_out = HookPoint()
        self.hook_mlp_out = HookPoint()


class PlantedBackup(HookedRootModule):
    """Two layers of heads with d_head = 1 and a linear readout to ``vocab`` logits.

    Layer 0: head 0 = primary P (z = a), head 1 = inert unit I (z = 0.3 always, its
    own direction), head 2 = silent (z = 0). Layer 1: head 0 = backup B, dormant:
    z_B = relu(a - z_P) + b0 reads the primary's output and fills in when P is gone.
    Logits = sum_h z_h W_O[h] (a linear readout of the residual, d_model = vocab).
    """

    def __init__(self, vocab: int = 5, a: float = 1.0, b0: float = 0.0):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        u = torch.randn(vocab, generator=g)
        v = torch.randn(vocab, generator=g)
        w0 = torch.stack([u, v, torch.randn(vocab, generator=g)])[:, None, :]
        w1 = torch.stack([u, torch.zeros(vocab)])[:, None, :]
        self.blocks = nn.ModuleList([_Block(w0), _Block(w1)])
        self.a = a
        self.b0 = b0
        self.vocab = vocab
        self.cfg = SimpleNamespace(n_layers=2, n_heads=3, d_head=1)
        self.setup()

    def forward(self, tokens, **kw):
        b, t = tokens.shape
        x = (tokens.float() * 0.0 + 1.0)[..., None]  # [B, T, 1], depends on nothing
        z0 = torch.cat([self.a * x, 0.3 * x, 0.0 * x], -1)[..., None]  # [B, T, 3, 1]
        z0 = self.blocks[0].attn.hook_z(z0)
        out0 = self.blocks[0].hook_attn_out(torch.einsum("bthd,hdm->btm", z0, self.blocks[0].attn.W_O))
        zb = (torch.relu(self.a - z0[:, :, 0, 0]) + self.b0)[..., None]
        z1 = torch.cat([zb, 0.0 * zb], -1)[..., None]
        z1 = self.blocks[1].attn.hook_z(z1)
        out1 = self.blocks[1].hook_attn_out(torch.einsum("bthd,hdm->btm", z1, self.blocks[1].attn.W_O))
        zero = self.blocks[1].hook_mlp_out(torch.zeros_like(out1))
        return out0 + out1 + zero


class LinearHeads(HookedRootModule):
    """Logits linear in every head's z: z_h = x_t * c_h (per token), logits = sum z_h W_O[h],
    where layer 1's heads also read layer 0's attention output linearly."""

    def __init__(self, vocab: int = 4, n_heads: int = 2, d_head: int = 2):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.emb = nn.Parameter(torch.randn(7, n_heads, d_head, generator=g))
        self.read = nn.Parameter(torch.randn(vocab, n_heads, d_head, generator=g) * 0.5)
        self.blocks = nn.ModuleList(
            [
                _Block(torch.randn(n_heads, d_head, vocab, generator=g)),
                _Block(torch.randn(n_heads, d_head, vocab, generator=g)),
            ]
        )
        for blk in self.blocks:
            blk.attn.W_O.requires_grad_(False)
        self.cfg = SimpleNamespace(n_layers=2, n_heads=n_heads, d_head=d_head)
        self.setup()

    def forward(self, tokens, **kw):
        z0 = self.blocks[0].attn.hook_z(self.emb[tokens])  # [B, T, H, D]
        o0 = self.blocks[0].hook_attn_out(torch.einsum("bthd,hdm->btm", z0, self.blocks[0].attn.W_O))
        z1 = self.blocks[1].attn.hook_z(torch.einsum("btm,mhd->bthd", o0, self.read))
        o1 = self.blocks[1].hook_attn_out(torch.einsum("bthd,hdm->btm", z1, self.blocks[1].attn.W_O))
        return o0 + o1 + self.blocks[1].hook_mlp_out(torch.zeros_like(o1))
