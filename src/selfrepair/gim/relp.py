"""RelP: relevance patching (Rezaei Jafari, Eberle, Khakzar, Nanda; arXiv 2508.21258).

Attribution patching with the local gradients of the backward pass replaced by the
propagation coefficients of layer-wise relevance propagation (LRP). Each rule changes
only what flows back; in gradient x input form a rule is a modified local Jacobian (the
identity, half and AH rules keep the forward bit for bit, and so does the LN-rule, GIM's
freeze_norm). The rules and where they come
from (the authors' code is their fork of TransformerLens, github.com/FarnoushRJ/RelP; the
README's table "Propagation Rules for Transformers" names each rule's paper):

1. ``ln_rule`` (LN-rule, Ali et al. 2022): every LayerNorm / RMSNorm scale is a
   constant in backward; the mean subtraction stays differentiated
   (``components/layer_norm.py``, ``rms_norm.py``: the scale detached). This is the
   same modification as GIM's ``freeze_norm``, which it reuses.
2. ``identity_rule`` (Identity-rule, Jafari et al. 2024): the MLP nonlinearity z = f(x)
   passes relevance as if it were the identity: dz/dx := z / x, x stabilised away from
   zero by 1e-6 (``utilities/activation_functions.py``, ``ModifiedAct`` and
   ``lrp_utils.stabilize``). ReLU is left exact there (z / x is its gradient anyway).
3. ``half_rule`` (Half-rule, Jafari et al. 2024; Arras et al. 2019): the product of a
   gated MLP, act(gate) * up, back-propagates half its gradient
   (``components/mlps/gated_mlp.py``: half the product detached), which with the
   product rule gives each branch half the product's relevance.
4. ``ah_rule`` (AH-rule, Ali et al. 2022): the attention weights are constants in
   backward (``components/abstract_attention.py``: the pattern detached), so the head is
   linear in its values and queries and keys get no gradient.
5. Linear layers: the 0-rule, which in gradient x input form is the plain gradient.

The authors' default rule set (``HookedTransformerConfig.LRP_rules`` and the README's and
demo's usage) is LN-rule, Identity-rule and Half-rule; the AH-rule is implemented there
but off by default. :class:`RelPConfig` follows that default; ``ah=True`` adds the
AH-rule. Conservation: each rule conserves relevance locally where its paper says so
(identity: x * dz/dx = z; half: the two branches' relevances sum to the product's;
LN with a frozen scale and AH with frozen weights make the layer linear in its input,
so sum(input * grad) = sum((output - bias) * grad)).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from selfrepair.gim.backward import GIMConfig, _hook_names, freeze_norm, gated_mlp_hooks, gim, with_hooks

STABILIZER = 1e-6  # lrp_utils.stabilize: z + ((z == 0) + sign(z)) * 1e-6


def stabilize(x: torch.Tensor, eps: float = STABILIZER) -> torch.Tensor:
    """``x`` moved ``eps`` away from zero (zero goes to +eps)."""
    return x + ((x == 0).to(x) + x.sign()) * eps


def with_local_grad(y: torch.Tensor, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``y``'s value exactly, with backward d(out)/dx := ``d`` (elementwise), nothing
    flowing through ``y``'s own graph: y.detach() + (x - x.detach()) * d.detach()."""
    return y.detach() + (x - x.detach()) * d.detach()


def identity_grad(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """The identity rule's local gradient of post = f(pre): post / stabilize(pre)."""
    return post / stabilize(pre)


def half(x: torch.Tensor) -> torch.Tensor:
    """Identity forward, half the gradient back (the half-rule)."""
    return x / 2 + (x / 2).detach()


def _mlp_act(bridge, layer: int) -> torch.nn.Module:
    """The activation module of layer ``layer``'s MLP, as the bridge's forward calls it
    (the Hugging Face module's ``act``, GPT-2, or ``act_fn``, gated MLPs)."""
    mlp = bridge.blocks[layer].mlp
    orig = getattr(mlp, "original_component", None)
    act = getattr(orig, "act", None) or getattr(orig, "act_fn", None)
    if not isinstance(act, torch.nn.Module):
        raise NotImplementedError(f"RelP: no activation module found in layer {layer}'s MLP")
    return act


@contextmanager
def ln_rule(bridge):
    """Rule 1: every normalization scale is a constant in backward (GIM's freeze_norm)."""
    with freeze_norm(bridge):
        yield


@contextmanager
def identity_rule(bridge):
    """Rule 2 on every MLP's nonlinearity z = f(x): z's value, with the local gradient
    f(x) / stabilize(x) (a forward hook on the activation module, which sees the tensor
    the module is called with, whatever hooks ran before). ReLU is left as it is."""
    handles = []

    def swap(module, args, out):
        (x,) = args
        return with_local_grad(out, x, identity_grad(x.detach(), out.detach()))

    try:
        for i in range(bridge.cfg.n_layers):
            act = _mlp_act(bridge, i)
            if not isinstance(act, torch.nn.ReLU):
                handles.append(act.register_forward_hook(swap))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def half_rule(bridge):
    """Rule 3: half the gradient of every gated MLP's product act(gate) * up (the
    input of its down projection, ``mlp.hook_post``). No-op on plain MLPs."""
    hooks = [(f"blocks.{g.split('.')[1]}.mlp.hook_post", lambda x, hook: half(x)) for g, _ in gated_mlp_hooks(bridge)]
    with with_hooks(bridge, hooks):
        yield


@contextmanager
def ah_rule(bridge):
    """Rule 4: every attention pattern (``attn.hook_pattern``) is a constant in backward."""
    hooks = [(n, lambda x, hook: x.detach()) for n in _hook_names(bridge, ".attn.hook_pattern")]
    if not hooks:
        raise RuntimeError("AH-rule: the model exposes no attn.hook_pattern")
    with with_hooks(bridge, hooks):
        yield


@dataclass(frozen=True)
class RelPConfig:
    """Which RelP rules are on; the default is the authors' default rule set.
    ``RelPConfig.none()`` is the plain gradient (RelP with identity rules = AtP)."""

    ln: bool = True
    identity: bool = True
    half: bool = True
    ah: bool = False

    @classmethod
    def none(cls) -> "RelPConfig":
        return cls(ln=False, identity=False, half=False, ah=False)

    @classmethod
    def variant(cls, name: str) -> "RelPConfig":
        """``relp`` (the authors' default rules) or ``relp-ah`` (with the AH-rule)."""
        table = {"relp": cls(), "relp-ah": cls(ah=True)}
        if name not in table:
            raise ValueError(f"unknown RelP variant {name!r}; one of {sorted(table)}")
        return table[name]


VARIANTS = ("relp", "relp-ah")


@contextmanager
def relp(bridge, config: RelPConfig | None = None):
    """All switched-on RelP rules at once, for the duration of the block."""
    config = config or RelPConfig()
    with ExitStack() as stack:
        if config.ln:
            stack.enter_context(ln_rule(bridge))
        if config.identity:
            stack.enter_context(identity_rule(bridge))
        if config.half:
            stack.enter_context(half_rule(bridge))
        if config.ah:
            stack.enter_context(ah_rule(bridge))
        yield


def modified_backward(bridge, config: GIMConfig | RelPConfig | None):
    """The backward of ``config``: GIM's (:func:`selfrepair.gim.backward.gim`), RelP's
    (:func:`relp`) or, for None, the plain gradient."""
    if config is None:
        return nullcontext()
    if isinstance(config, RelPConfig):
        return relp(bridge, config)
    return gim(bridge, config)


# ---------------------------------------------------------------- EAP-GP ---------
def gradpath_step(point: torch.Tensor, grad: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """One GradPath step (EAP-GP, arXiv 2502.06852): ``point`` moved against ``grad``
    by ``length``, per example (dim 0): point - length * grad / ||grad||. An example with
    zero gradient stays put. ``length`` [B]."""
    n = grad.flatten(1).norm(dim=1).clamp_min(torch.finfo(grad.dtype).tiny)
    shape = (-1,) + (1,) * (grad.dim() - 1)
    return point - (length / n).view(shape).to(point.dtype) * grad


def step_lengths(distance: torch.Tensor, steps: int, first: float = 1.0) -> list[torch.Tensor]:
    """The lengths of ``steps`` GradPath steps that, along the straight line, visit the
    same points as EAP-IG with ``steps`` steps: each distance / steps, the first one
    ``first`` times that (1: the points 1 - j/steps, j = 1..steps, EAP-IG's left
    Riemann sum from the corrupt end; 1/2: the midpoints)."""
    d = distance / steps
    return [d * first] + [d] * (steps - 1)


def gradpath(fn, start: torch.Tensor, target: torch.Tensor, distance: torch.Tensor, steps: int, first: float = 1.0):
    """The GradPath points after each of ``steps`` steps from ``start``: each step goes
    against the gradient of ||fn(point) - target||^2 (per example), with
    :func:`step_lengths`. ``fn`` maps [B, ...] to [B, ...]; returns [steps] points."""
    point, out = start.detach(), []
    for length in step_lengths(distance, steps, first):
        x = point.clone().requires_grad_(True)
        with torch.enable_grad():
            obj = (fn(x) - target).pow(2).sum()
            (g,) = torch.autograd.grad(obj, x)
        point = gradpath_step(point, g, length).detach()
        out.append(point)
    return out
