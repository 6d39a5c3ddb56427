"""Mean, zero and counterfactual ablation of any set of components, by hook name.

Many ablations share one forward pass: the batch is repeated once per ablation set and
each copy gets its own mask, so scoring 20 components is a handful of large forwards.
Works on any TransformerLens 4 bridged model (``hook_z`` [B, T, H, D],
``hook_mlp_out`` [B, T, d_model]).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import torch

from selfrepair.core.components import Component

MODES = ("zero", "mean")


def component_means(
    bridge, batches: Iterable[torch.Tensor], components: Sequence[Component]
) -> dict[str, torch.Tensor]:
    """Mean output of each hook over all batches, examples and positions.

    Returns {hook name: mean}, [H, D] for ``hook_z`` and [d_model] for an MLP output.
    """
    hooks = sorted({c.hook for c in components})
    sums: dict[str, torch.Tensor] = {}
    count = 0
    with torch.no_grad():
        for tokens in batches:
            _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in hooks)
            for h in hooks:
                x = cache[h].float()
                s = x.reshape(-1, *x.shape[2:]).sum(0)
                sums[h] = sums[h] + s if h in sums else s
            count += tokens.shape[0] * tokens.shape[1]
    return {h: s / count for h, s in sums.items()}


def _replacement(hook: str, x: torch.Tensor, mode: str, means: dict | None) -> torch.Tensor:
    if mode == "zero":
        return torch.zeros((), dtype=x.dtype, device=x.device)
    if mode == "mean":
        if means is None or hook not in means:
            raise ValueError(f"mean ablation needs the mean of {hook}; compute component_means first")
        return means[hook].to(x.dtype).to(x.device)
    if mode == "patch":
        if means is None or hook not in means:
            raise ValueError(f"patching needs a counterfactual activation for {hook}")
        return means[hook]
    raise ValueError(f"unknown ablation mode {mode!r}; expected one of {MODES}")


def make_hooks(
    sets: Sequence[Sequence[Component]],
    batch_size: int,
    mode: str = "zero",
    means: dict[str, torch.Tensor] | None = None,
) -> list[tuple[str, callable]]:
    """Forward hooks for a batch repeated ``len(sets)`` times, copy k ablating ``sets[k]``.

    ``mode`` is 'zero' or 'mean'. With 'patch', ``means[hook]`` must be a tensor of the
    repeated batch's activation shape (counterfactual activations).
    """
    if mode not in MODES + ("patch",):
        raise ValueError(f"unknown ablation mode {mode!r}; expected one of {MODES}")
    k = len(sets)
    head_masks: dict[str, torch.Tensor] = {}
    mlp_masks: dict[str, torch.Tensor] = {}
    n_heads: dict[str, int] = defaultdict(int)
    for s in sets:
        for c in s:
            if c.is_head:
                n_heads[c.hook] = max(n_heads[c.hook], c.head + 1)
    for i, s in enumerate(sets):
        for c in s:
            if c.is_head:
                m = head_masks.setdefault(c.hook, torch.zeros(k, 0))
                if m.shape[1] < n_heads[c.hook]:
                    m = torch.cat([m, torch.zeros(k, n_heads[c.hook] - m.shape[1])], 1)
                m[i, c.head] = 1.0
                head_masks[c.hook] = m
            else:
                m = mlp_masks.setdefault(c.hook, torch.zeros(k))
                m[i] = 1.0

    # Hooks are bound to the name asked for: the bridge reports aliases (hook_z is
    # attn.o.hook_in) as hook.name.
    def head_hook(name):
        def fn(x, hook):
            m = head_masks[name]
            h = x.shape[2]
            if m.shape[1] < h:
                m = torch.cat([m, torch.zeros(k, h - m.shape[1])], 1)
            m = m.to(x.device, x.dtype).repeat_interleave(batch_size, 0)[:, None, :, None]
            return x * (1 - m) + m * _replacement(name, x, mode, means)

        return fn

    def mlp_hook(name):
        def fn(x, hook):
            m = mlp_masks[name].to(x.device, x.dtype).repeat_interleave(batch_size, 0)[:, None, None]
            return x * (1 - m) + m * _replacement(name, x, mode, means)

        return fn

    return [(h, head_hook(h)) for h in head_masks] + [(h, mlp_hook(h)) for h in mlp_masks]


def run_ablated(
    bridge,
    tokens: torch.Tensor,
    sets: Sequence[Sequence[Component]],
    mode: str = "zero",
    means: dict[str, torch.Tensor] | None = None,
    reduce=None,
    max_rows: int = 4096,
) -> list:
    """Run ``tokens`` once per ablation set; return ``reduce(logits)`` for each set.

    Sets are grouped so that one forward holds at most ``max_rows`` sequences.
    ``reduce`` maps the [B, T, V] logits of one set to whatever is kept (default: the
    logits themselves). An empty set is the intact model.
    """
    reduce = reduce or (lambda logits: logits)
    b = tokens.shape[0]
    per = max(1, max_rows // b)
    out: list = []
    with torch.no_grad():
        for start in range(0, len(sets), per):
            group = list(sets[start : start + per])
            rep = tokens.repeat(len(group), 1)
            hooks = make_hooks(group, b, mode, means)
            logits = bridge.run_with_hooks(rep, fwd_hooks=hooks) if hooks else bridge(rep)
            for i in range(len(group)):
                out.append(reduce(logits[i * b : (i + 1) * b]))
    return out
