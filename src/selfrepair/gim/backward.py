"""GIM: the backward-pass modifications of Edin et al. (arXiv 2505.17630).

Three modifications, each a small piece, composed in one context manager (``gim``),
each switchable on its own (the paper's ablation study). The forward pass is
unchanged; only gradients differ.

1. ``temperature_softmax``: attention softmaxes back-propagate with
   s = softmax(x / T): g_in = s * (g_out - <g_out, s>), no 1/T factor. Only the
   softmax inside attention modules is changed (a softmax in the metric stays exact).
2. ``freeze_norm``: every normalization's scale (LayerNorm std, RMSNorm rms; the
   final norm included) is a constant in backward (``hook_scale`` detached); the
   forward stays the model's own bit for bit. Query-key norms (Gemma-3's q_norm and
   k_norm, an RMSNorm over each head's q and k before RoPE) are norms too, and frozen:
   the paper freezes every norm, and gim-explain detaches every ``hook_scale``, theirs
   included. Local (sliding-window) layers need nothing of their own: their mask is in
   the scores the softmax's backward reads.
3. ``normalize_gradients``: gradients of queries and keys x0.25, of values x0.5;
   in gated MLPs the gate and up branches x0.5 each. A plain (GELU) MLP is not scaled.
   q and k are scaled at the projections' outputs, before any q/k norm and RoPE:
   backward is linear in the incoming gradient (a frozen norm's Jacobian a constant),
   so this is the scaling of what enters the attention scores.

All three act on a TransformerLens 4 ``TransformerBridge`` through its hook points
and forward hooks of its attention modules; nothing in the model is edited.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_STATE = threading.local()


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = float(scale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward; gradient multiplied by ``scale`` in backward."""
    return _ScaleGrad.apply(x, scale)


class _TemperatureSoftmax(torch.autograd.Function):
    """softmax(x) forward; backward as if the softmax were softmax(x / T), no 1/T."""

    @staticmethod
    def forward(ctx, x, dim, T):
        ctx.dim, ctx.T = dim, float(T)
        ctx.save_for_backward(x)
        return torch.softmax(x, dim=dim)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.softmax(x / ctx.T, dim=ctx.dim)
        s = torch.nan_to_num(s)  # fully masked rows (all -inf) carry no gradient
        return s * (g - (g * s).sum(ctx.dim, keepdim=True)), None, None


def tsg_softmax(x: torch.Tensor, dim: int = -1, T: float = 2.0) -> torch.Tensor:
    return _TemperatureSoftmax.apply(x, dim, T)


def _attention_modules(bridge):
    return [blk.attn for blk in bridge.blocks]


@contextmanager
def temperature_softmax(bridge, T: float = 2.0):
    """Modification 1: temperature-adjusted softmax gradients in attention only.

    ``torch.nn.functional.softmax`` is replaced by a version that is exact outside
    attention modules and uses the temperature backward inside them (a depth counter
    set by forward pre/post hooks of each attention module).
    """
    orig = F.softmax

    def patched(input, dim=None, _stacklevel=3, dtype=None):
        if getattr(_STATE, "depth", 0) > 0:
            x = input if dtype is None else input.to(dtype)
            return tsg_softmax(x, -1 if dim is None else dim, T)
        return orig(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    def enter(module, args, kwargs=None):
        _STATE.depth = getattr(_STATE, "depth", 0) + 1

    def leave(module, args, output):
        _STATE.depth -= 1

    handles = []
    for attn in _attention_modules(bridge):
        handles.append(attn.register_forward_pre_hook(enter))
        handles.append(attn.register_forward_hook(leave, always_call=True))
    F.softmax = patched
    try:
        yield
    finally:
        F.softmax = orig
        _STATE.depth = 0
        for h in handles:
            h.remove()


@contextmanager
def frozen(model):
    """Every parameter of ``model`` with ``requires_grad`` off for the block (a backward
    through the model then fills no ``.grad``), each restored to what it was on exit."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        yield model
    finally:
        for p, rg in saved:
            p.requires_grad_(rg)


def _hook_names(bridge, suffix: str) -> list[str]:
    """Names ending in ``suffix``, one per hook point (aliases share a hook point)."""
    seen, out = set(), []
    for n, hp in bridge.hook_dict.items():
        if n.endswith(suffix) and id(hp) not in seen:
            seen.add(id(hp))
            out.append(n)
    return out


@contextmanager
def with_hooks(bridge, hooks):
    """Forward hooks ``(hook name, fn(x, hook))`` for the block; removes only its own."""
    added, points = [], bridge.hook_dict  # a bridge builds this dict anew on every access
    try:
        for name, fn in hooks:
            hp = points[name]
            added.append((hp, hp.add_hook(fn, dir="fwd")))
        yield
    finally:
        for hp, handle in added:
            handle.hook.remove()
            hp.fwd_hooks = [h for h in hp.fwd_hooks if h is not handle]


class _FrozenScaleLayerNorm(torch.autograd.Function):
    """``F.layer_norm``'s value bit for bit (the model's own forward); in backward the
    scale s = sqrt(var + eps) is a constant and the mean subtraction stays
    differentiated: dL/dx = a - mean(a), a = g * weight / s, the gradient of
    (x - mean(x)) / s.detach() * weight + bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        centred = x - x.mean(-1, keepdim=True)
        s = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        ctx.save_for_backward(centred, s, weight)
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def backward(ctx, g):
        centred, s, weight = ctx.saved_tensors
        a = (g if weight is None else g * weight) / s
        dx = a - a.mean(-1, keepdim=True)
        lead = tuple(range(g.dim() - 1))
        dw = (g * (centred / s)).sum(lead) if ctx.needs_input_grad[1] else None
        db = g.sum(lead) if ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class _FrozenScaleNorm:
    """LayerNorm / RMSNorm with the normalization scale detached, the forward the
    module's own bit for bit (LayerNorm: :class:`_FrozenScaleLayerNorm`; RMSNorm: the
    Hugging Face forward's own operations, the rsqrt detached). Gemma's RMSNorm (weight
    stored as an offset from 1, product in float32) as its own forward computes it."""

    def __init__(self, norm):
        self.norm = norm

    def forward(self, x):
        n = self.norm
        if isinstance(n, torch.nn.LayerNorm):
            if len(n.normalized_shape) != 1:
                raise NotImplementedError(f"freeze_norm: LayerNorm over {tuple(n.normalized_shape)} (one dim only)")
            return _FrozenScaleLayerNorm.apply(x, n.weight, n.bias, n.eps)
        eps = getattr(n, "variance_epsilon", getattr(n, "eps", None))
        kind = type(n).__name__
        if eps is None or (kind.startswith("Gemma") and kind not in _GEMMA_RMS_NORMS):
            raise NotImplementedError(f"freeze_norm: unsupported norm {kind}")
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).detach()
        if kind in _GEMMA_RMS_NORMS:
            return (y * (1.0 + n.weight.float())).type_as(x)
        return n.weight * y.to(x.dtype)


# x * rsqrt(mean x^2 + eps) * (1 + w), in float32 (transformers' modeling_gemma*.py); Gemma-3's q_norm and
# k_norm are this norm too, over each head's d_head
_GEMMA_RMS_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")


def _native_norm(component) -> bool:
    """Whether a TransformerLens normalization bridge returns its Hugging Face module's
    own forward (``use_native_layernorm_autograd``, or under ``layer_norm_folding``):
    there ``hook_scale`` is only observed, and a hook editing it (a detach) would
    rebuild the output from the bridge's own formula, other bits than the module's."""
    folding = getattr(getattr(component, "config", None), "layer_norm_folding", False)
    return bool(getattr(component, "use_native_layernorm_autograd", False) or folding)


@contextmanager
def freeze_norm(bridge):
    """Modification 2: every normalization scale is a constant in backward, the forward
    the model's own bit for bit.

    A norm the bridge computes from scratch has its ``hook_scale`` detached. A norm the
    bridge hands to its Hugging Face module (RMSNorm models) and, with split q/k/v
    inputs, the ln1 the bridge re-applies per head through the raw module (no
    ``hook_scale``) have that module swapped for a frozen-scale copy
    (:class:`_FrozenScaleNorm`, the module's own forward bits).
    """
    names = _hook_names(bridge, "hook_scale")
    if not names:
        raise RuntimeError("freeze_norm: the model exposes no hook_scale")
    modules, hooks = [], []
    for name in names:
        component = bridge.get_submodule(name.rsplit(".", 1)[0])
        if _native_norm(component) and getattr(component, "original_component", None) is not None:
            modules.append(component.original_component)
        else:
            hooks.append((name, lambda x, hook: x.detach()))
    # the bridge re-wires _ln1_module every forward, so the norm itself is patched
    modules += [a._ln1_module for a in _attention_modules(bridge) if getattr(a, "_ln1_module", None) is not None]
    patched = []
    try:
        for norm in dict.fromkeys(modules):
            if "forward" not in norm.__dict__:
                norm.forward = _FrozenScaleNorm(norm).forward
                patched.append(norm)
        with with_hooks(bridge, hooks):
            yield
    finally:
        for norm in patched:
            del norm.forward


def gated_mlp_hooks(bridge) -> list[tuple[str, str]]:
    """(gate hook, up hook) of each gated MLP: ``mlp.hook_pre`` and ``mlp.hook_pre_linear``."""
    out, points = [], bridge.hook_dict
    for i in range(bridge.cfg.n_layers):
        up = f"blocks.{i}.mlp.hook_pre_linear"
        if up in points:
            out.append((f"blocks.{i}.mlp.hook_pre", up))
    return out


@contextmanager
def normalize_gradients(
    bridge, q: float = 0.25, k: float = 0.25, v: float = 0.5, gate: float = 0.5, up: float = 0.5, gated_mlp: bool = True
):
    """Modification 3: gradient normalization of multiplicative interactions."""
    hooks = []
    for suffix, s in ((".attn.hook_q", q), (".attn.hook_k", k), (".attn.hook_v", v)):
        hooks += [(n, (lambda s: lambda x, hook: scale_grad(x, s))(s)) for n in _hook_names(bridge, suffix)]
    if gated_mlp:
        for g, u in gated_mlp_hooks(bridge):
            hooks.append((g, lambda x, hook: scale_grad(x, gate)))
            hooks.append((u, lambda x, hook: scale_grad(x, up)))
    with with_hooks(bridge, hooks):
        yield


@dataclass(frozen=True)
class GIMConfig:
    """Which modifications are on. ``GIMConfig.none()`` is the plain gradient."""

    tsg: bool = True
    freeze_norm: bool = True
    normalize: bool = True
    temperature: float = 2.0
    q_scale: float = 0.25
    k_scale: float = 0.25
    v_scale: float = 0.5
    mlp_scale: float = 0.5
    gated_mlp: bool = True  # False: gim-explain 0.1.4's behaviour (gated MLPs unscaled)

    @classmethod
    def none(cls) -> "GIMConfig":
        return cls(tsg=False, freeze_norm=False, normalize=False)

    @classmethod
    def variant(cls, name: str) -> "GIMConfig":
        """``gim``, ``gim-no-tsg``, ``gim-no-ln``, ``gim-no-norm``, or ``plain``."""
        table = {
            "gim": cls(),
            "gim-no-tsg": cls(tsg=False),
            "gim-no-ln": cls(freeze_norm=False),
            "gim-no-norm": cls(normalize=False),
            "plain": cls.none(),
        }
        if name not in table:
            raise ValueError(f"unknown GIM variant {name!r}; one of {sorted(table)}")
        return table[name]


VARIANTS = ("gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm")


@contextmanager
def gim(bridge, config: GIMConfig | None = None):
    """All switched-on modifications at once, for the duration of the block."""
    config = config or GIMConfig()
    with ExitStack() as stack:
        if config.freeze_norm:
            stack.enter_context(freeze_norm(bridge))
        if config.tsg and config.temperature != 1.0:
            stack.enter_context(temperature_softmax(bridge, config.temperature))
        if config.normalize:
            stack.enter_context(
                normalize_gradients(
                    bridge,
                    config.q_scale,
                    config.k_scale,
                    config.v_scale,
                    config.mlp_scale,
                    config.mlp_scale,
                    config.gated_mlp,
                )
            )
        yield
