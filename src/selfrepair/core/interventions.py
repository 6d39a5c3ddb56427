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


def fit_rows(bridge, length: int, max_rows: int) -> int:
    """Sequences per forward that keep one forward's logits under ~1 GB: ``max_rows`` on a
    small vocabulary, fewer on a 50k-262k one (float32 logits of ``length`` positions)."""
    return max(1, min(max_rows, int(2.5e8 // (length * int(bridge.cfg.d_vocab)))))


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
    tokens = tokens.to(next(bridge.parameters()).device)  # host tokens follow the model (a no-op on the CPU)
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


# ----------------------------------------------------------------------------------
# Prefix reuse through the bridge's own blocks
# ----------------------------------------------------------------------------------
def first_layer(components: Sequence[Component], n_layers: int) -> int:
    """The first layer an ablation set touches (``n_layers`` for the empty set): the
    residual stream entering that layer is the intact model's."""
    return min((c.layer for c in components), default=n_layers)


class Prefix:
    """One intact forward of ``tokens`` through the bridge, kept so that a run with
    components ablated from layer l on can resume from the stream entering layer l.

    An ablation in layer l (a head's z or an MLP's output) leaves the residual stream
    entering block l unchanged, so ``run(start=l, ...)`` calls the bridge's own blocks
    l, l+1, ... (with the hooks that are in force firing inside them, as in a full
    forward), then its final LayerNorm and its unembedding, at only the ``positions``
    asked for (the LayerNorm and unembedding act on each position alone). Each block is
    called with the attention mask and position ids the bridge's own forward gave that
    block (Gemma-3's sliding-window and global layers get different masks and rotary
    embeddings).
    Every kernel computes each row independently of the others, so the logits are those
    of a full forward of the same rows (bit for bit, measured on the CPU; the repeated
    rows of several sets are the same rows). Keeps: the stream entering every block
    (``pre``, [B, T, d_model] each), the stream after the last block (``final``) and,
    with ``keep_z``, every layer's clean ``hook_z``. With ``positions``, the intact run
    stops before the final norm and only those positions are unembedded (a 262k
    vocabulary at every position is gigabytes); :meth:`logits` then serves those only.

    A model without the bridge's block stack (``blocks.{l}.hook_in``, ``ln_final``,
    ``unembed``; e.g. the hand-built toys of the tests) is run whole instead: every run
    from the embedding, its logits sliced at ``positions``.
    """

    def __init__(self, bridge, tokens: torch.Tensor, keep_z: bool = False, positions=None):
        tokens = tokens.to(next(bridge.parameters()).device)  # host tokens follow the model (a no-op on the CPU)
        self.bridge, self.tokens = bridge, tokens
        self.kept = None if positions is None else list(positions)
        self.n_layers = int(bridge.cfg.n_layers)
        self.b = tokens.shape[0]
        self.pre: list = [None] * self.n_layers
        self.z: dict[str, torch.Tensor] = {}
        names = getattr(bridge, "mod_dict", {}) or getattr(bridge, "hook_dict", {})
        self.resumable = all(hasattr(bridge, a) for a in ("ln_final", "unembed", "blocks")) and all(
            f"blocks.{layer}.hook_in" in names for layer in range(self.n_layers)
        )
        if not self.resumable:
            self._whole(keep_z)
            return
        calls: dict = {}

        def grab(layer):
            def fn(module, args, kwargs):
                calls[layer] = (args, kwargs)

            return fn

        def keep_pre(layer):
            def fn(x, hook):
                self.pre[layer] = x.detach()
                return x

            return fn

        def keep_final(x, hook):  # the stream after the last block
            self.final = x.detach()
            if self.kept is not None:  # no unembedding of every position: logits() makes the kept ones
                raise _Stop
            return x

        def keep_z_of(name):
            def fn(x, hook):
                self.z[name] = x.detach().clone()
                return x

            return fn

        hooks = [(f"blocks.{layer}.hook_in", keep_pre(layer)) for layer in range(self.n_layers)]
        hooks.append(("ln_final.hook_in", keep_final))
        if keep_z:
            hooks += [
                (f"blocks.{la}.attn.hook_z", keep_z_of(f"blocks.{la}.attn.hook_z")) for la in range(self.n_layers)
            ]
        handles = [
            bridge.blocks[la].register_forward_pre_hook(grab(la), with_kwargs=True) for la in range(self.n_layers)
        ]
        full = None
        try:
            with torch.no_grad():
                full = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        # the bridge's own call of each block: its attention mask, position ids /
        # embeddings; no key-value cache (it only serves decoding)
        self._calls = [_block_call(*calls[la]) for la in range(self.n_layers)]
        # the intact logits, at every position (or, with ``positions``, at those only)
        self._clean = full if full is not None else self._head_kept()
        # Resuming must give the full forward's bits. Checked once on the intact run (one
        # forward more, without the unembedding): every block called this way (GPT-Neo's
        # alternating local and global attention does not always take block 0's arguments
        # bit for bit). And the head must be the last operation: Gemma-2 caps its logits
        # after the unembedding, outside it. Otherwise every run is a whole forward.
        hf_cfg = getattr(getattr(bridge, "original_model", None), "config", None)
        capped = getattr(hf_cfg, "final_logit_softcapping", None) is not None
        with torch.no_grad():
            self.resumable = not capped and torch.equal(self.blocks(self.pre[0], 0), self.final)
        if self.kept is not None and not self.resumable:  # whole forwards: their logits, every position
            self._clean = self.bridge.run_with_hooks(self.tokens)

    def _head_kept(self) -> torch.Tensor:
        with torch.no_grad():
            return self.head(self.final, self.kept)

    def _whole(self, keep_z: bool) -> None:
        store: dict = {}

        def keep(name):
            def fn(x, hook):
                store[name] = x.detach().clone()
                return x

            return fn

        hooks = [(f"blocks.{la}.attn.hook_z", keep(f"blocks.{la}.attn.hook_z")) for la in range(self.n_layers)]
        with torch.no_grad():
            self._clean = self.bridge.run_with_hooks(self.tokens, fwd_hooks=hooks if keep_z else [])
        self.z = store

    def _for_rows(self, v, k: int):
        """A block argument for k copies of the batch: a tensor with one row per prompt
        (the attention mask) repeated k times; the others as they are (they broadcast)."""
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == self.b and self.b > 1 and k > 1:
            return v.repeat(k, *([1] * (v.dim() - 1)))
        if isinstance(v, (tuple, list)):
            return type(v)(self._for_rows(x, k) for x in v)
        return v

    def logits(self, positions=None) -> torch.Tensor:
        """The intact model's logits [B, P, V] at ``positions`` (default: all). Made with
        ``positions`` kept: those, or a subset of them, only (ValueError otherwise)."""
        if self.kept is None or not self.resumable:
            return self._clean if positions is None else self._clean[:, positions]
        if positions is None or not set(positions) <= set(self.kept):
            raise ValueError(f"this Prefix keeps the intact logits at positions {self.kept} only, not {positions}")
        return self._clean[:, [self.kept.index(p) for p in positions]]

    def head(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """Final LayerNorm and unembedding of the stream ``x`` at ``positions``."""
        h = self.bridge.ln_final(x)
        if positions is not None:
            h = h[:, positions]
        return self.bridge.unembed(h)

    def blocks(self, x: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
        """Blocks ``start`` .. ``stop`` - 1 (default: to the last) on the stream ``x``
        entering block ``start`` ([k B, T, d_model]: k copies of the batch)."""
        stop = self.n_layers if stop is None else stop
        k = x.shape[0] // self.b
        for layer in range(start, stop):
            a, kw = self._calls[layer]
            args = tuple(self._for_rows(v, k) for v in a)
            kwargs = {n: self._for_rows(v, k) for n, v in kw.items()}
            out = self.bridge.blocks[layer](x, *args, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        return x

    def run(self, start: int, k: int = 1, hooks=(), positions=None, stop: int | None = None) -> torch.Tensor:
        """Logits [k B, P, V] at ``positions`` of k copies of the batch resumed at block
        ``start`` with ``hooks`` in force (``stop``: return the stream entering block
        ``stop`` instead of logits). ``start`` = n_layers: no block runs."""
        if not self.resumable:  # the whole model, from the embedding
            logits = self.bridge.run_with_hooks(self.tokens.repeat(k, 1), fwd_hooks=list(hooks))
            return logits if positions is None else logits[:, positions]
        if start >= self.n_layers:
            x = self.final.repeat(k, 1, 1)
        else:
            x = self.pre[start].repeat(k, 1, 1)
        with self.bridge.hooks(fwd_hooks=list(hooks)):
            x = self.blocks(x, start, stop) if start < self.n_layers else x
            if stop is not None:
                return x
            return self.head(x, positions)


class _Stop(Exception):
    """Ends an intact forward at the final LayerNorm (no unembedding of every position)."""


def _block_call(args, kwargs) -> tuple:
    """A block's call without its stream and key-value cache: (args, kwargs)."""
    kwargs = {k: _no_cache(v) for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return tuple(_no_cache(a) for a in args[1:]), kwargs


def _no_cache(v):
    """None for a Hugging Face key-value cache, else ``v``."""
    return None if type(v).__name__.endswith("Cache") and hasattr(v, "update") else v


def run_resumed(
    prefix: Prefix,
    sets: Sequence[Sequence[Component]],
    mode: str = "zero",
    means: dict[str, torch.Tensor] | None = None,
    reduce=None,
    max_rows: int = 4096,
    positions=None,
) -> list:
    """:func:`run_ablated` with prefix reuse: ``reduce(logits)`` per set, where the
    logits [B, P, V] are those at ``positions`` (default: all) of the ablated model.

    Each set resumes at the first layer it ablates (:class:`Prefix`); sets with the same
    first layer share forwards of at most ``max_rows`` sequences; the empty set is the
    intact run itself. ``reduce`` is called set by set in the order of the first layers,
    not of ``sets``; the results come back in the order of ``sets``.
    """
    reduce = reduce or (lambda logits: logits)
    b, nl = prefix.b, prefix.n_layers
    per = max(1, max_rows // b)
    starts = [first_layer(s, nl) for s in sets]
    out: list = [None] * len(sets)
    with torch.no_grad():
        for start in sorted(set(starts)):
            idx = [i for i, s in enumerate(starts) if s == start]
            if start >= nl:
                lg = prefix.logits(positions)
                for i in idx:
                    out[i] = reduce(lg)
                continue
            for c0 in range(0, len(idx), per):
                grp = idx[c0 : c0 + per]
                hooks = make_hooks([sets[i] for i in grp], b, mode, means)
                logits = prefix.run(start, len(grp), hooks, positions)
                for j, i in enumerate(grp):
                    out[i] = reduce(logits[j * b : (j + 1) * b])
    return out
