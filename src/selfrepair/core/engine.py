"""The ablation engine of paper A: many ablation sets over one batch, computing only what
each ablation changes, on the plain Hugging Face GPT-2 modules.

An ablation replaces head outputs z (the input of ``attn.c_proj``, a head's slice of it;
or, at the authors' site, a slice of the attention output, see ``SITES``) or an MLP's
output by their mean over reference data, or by zero. Three savings, none of
which changes a bit of the logits:

- Prefix reuse. An ablation in layer l leaves the residual stream entering layer l
  unchanged, and ablating a head leaves its layer's attention (queries, keys, values,
  pattern, z) unchanged. Per chunk of rows the engine keeps, for the intact model and for
  the set it ran last, the stream entering every layer, every layer's clean z and the
  stream after every attention block. A set resumes from whichever of the two agrees
  with it on more layers: at the first layer where they differ, from z (a different head
  set: only ``c_proj`` and the MLP of that layer run) or from the stream after attention
  (only the MLP differs). Single ablations start at their own layer; a pruning curve,
  whose sets grow by one component, costs per point only the layers from the component
  just added; a set seen before costs nothing.
- Positions. With ``positions`` (a slice of the sequence), the last layer's ``c_proj``,
  MLP, final LayerNorm and unembedding run only on those positions (exact match reads
  the target positions only); the last attention still sees every key.
- Rows in chunks of ``rows`` sequences (256 by default; on this 2-core machine a forward
  of 1,000 sequences in one piece takes 1.5x as long as in chunks of 250, measured).

Every step is the Hugging Face module's own operation on the same rows (``ln_1``,
``attn`` with its ``c_proj`` input replaced, ``ln_2``, ``mlp``, ``ln_f``, ``lm_head``,
and the two residual additions), and these kernels compute each row independently of the
others, so the logits equal those of one full forward of the ablated model up to float
rounding: bit for bit under MKL's AVX2 branch (the fast mode) on the CPUs measured, 9e-8
apart (measured) under its COMPATIBLE branch (the exact mode), where a GEMM's result
depends on how many rows it is given (tests/test_engine.py checks it against forward hooks on the full model). They are not
the TransformerBridge's bits: the bridge runs attention its own way (logits differ by
~1e-5); the exact-match outcomes of the trained models agree (tests, benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from selfrepair.core.components import Component

MODES = ("zero", "mean")
# Where a head is ablated: its slice of z (the input of ``attn.c_proj``, the head's own
# contribution), or, as paper A's authors' code does, the d_head-wide slice h of the
# attention output after ``c_proj`` and its bias (that slice is not head h's contribution:
# after W_O every head writes to all of d_model). MLPs are ablated at their output.
SITES = ("hook_z", "attn_out_slice")


def hf_model(model):
    """``model`` itself, checked to be a Hugging Face GPT-2 LM (GPT2LMHeadModel)."""
    if hasattr(model, "original_model") or hasattr(model, "run_with_hooks"):
        raise TypeError(
            "pass the Hugging Face model (models.load_hf), not a TransformerBridge: booting a bridge "
            "replaces the model's modules with its own, so the engine would not run the model's operations"
        )
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) != "gpt2" or not hasattr(model, "transformer") or not hasattr(model, "lm_head"):
        kind = getattr(cfg, "model_type", type(model).__name__)
        raise TypeError(f"the ablation engine runs Hugging Face GPT-2 LMs (GPT2LMHeadModel), not {kind!r}")
    return model


def _hook_names(layer: int) -> tuple[str, str]:
    return f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.hook_mlp_out"


@dataclass
class _States:
    """What one set's forward leaves per layer: the stream entering it (``pre``), the
    clean head outputs z ([rows, T, d_model], before any head of this layer is replaced)
    and the stream after attention (``mid``; the last layer's at ``positions`` only)."""

    key: frozenset
    pre: list = field(default_factory=list)
    z: list = field(default_factory=list)
    mid: list = field(default_factory=list)
    logits: torch.Tensor | None = None


class AblationEngine:
    """Exact logits of a GPT-2 LM with sets of components ablated, many sets per batch.

    ``model``: a GPT2LMHeadModel (``models.load_hf``; not a bridge, which replaces its
    modules). ``mode``: 'mean' or 'zero'.
    ``means``: {hook name: mean} as :meth:`means` or ``interventions.component_means``
    give them (``blocks.{l}.attn.hook_z`` [n_heads, d_head], ``blocks.{l}.hook_mlp_out``
    [d_model]); needed for mean ablation. ``reuse=False`` runs every set from the
    embedding (the same bits, more time: the benchmark's comparison). ``site``: where
    heads are ablated (``SITES``): 'hook_z' (the default), or 'attn_out_slice', the
    authors' site, where the attention output's slice h is replaced by zero or by head
    h's mean z (paper A's protocol grid); the savings and the exactness are the same.
    """

    def __init__(
        self,
        model,
        mode: str = "zero",
        means: dict | None = None,
        rows: int = 256,
        reuse: bool = True,
        site: str = "hook_z",
    ):
        if mode not in MODES:
            raise ValueError(f"unknown ablation mode {mode!r}; expected one of {MODES}")
        if site not in SITES:
            raise ValueError(f"unknown ablation site {site!r}; expected one of {SITES}")
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self.hf = hf_model(model)
        cfg = self.hf.config
        self.n_layers, self.n_heads, self.d_model = cfg.n_layer, cfg.n_head, cfg.n_embd
        self.d_head = self.d_model // self.n_heads
        self.mode, self.rows, self.reuse, self.site = mode, rows, reuse, site
        self.means = means
        if mode == "mean":
            if means is None:
                raise ValueError(
                    "mean ablation needs means: pass engine.means(model, batches) or interventions.component_means(...)"
                )
            for layer in range(self.n_layers):
                z, m = _hook_names(layer)
                for name, shape in ((z, (self.n_heads, self.d_head)), (m, (self.d_model,))):
                    if name in means and tuple(means[name].shape) != shape:
                        raise ValueError(f"mean of {name} has shape {tuple(means[name].shape)}, expected {shape}")

    # ---- the pieces of one forward, each the Hugging Face module's own operation ----

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        tr = self.hf.transformer
        tokens = tokens.to(tr.wte.weight.device)  # host token ids follow the model (a no-op on the CPU)
        pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
        return tr.drop(tr.wte(tokens) + tr.wpe(pos))

    def _attention_z(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Clean z of ``layer`` ([rows, T, d_model]) from the stream entering it."""
        blk = self.hf.transformer.h[layer]
        got = {}

        def grab(module, args):
            got["z"] = args[0]
            raise _Stop

        handle = blk.attn.c_proj.register_forward_pre_hook(grab)
        try:
            blk.attn(blk.ln_1(x))
        except _Stop:
            pass
        finally:
            handle.remove()
        return got["z"]

    def _replacement(self, name: str, like: torch.Tensor) -> torch.Tensor:
        if self.mode == "zero":
            return torch.zeros((), dtype=like.dtype, device=like.device)
        if name not in self.means:
            raise ValueError(f"mean ablation needs the mean of {name}; compute the means first")
        return self.means[name].to(like.device, like.dtype)

    def _replace_heads(self, layer: int, z: torch.Tensor, heads: Sequence[int]) -> torch.Tensor:
        """``z`` (or, at the slice site, the attention output) [rows, T, d_model] with the
        d_head-wide slice of every head in ``heads`` replaced."""
        if not heads:
            return z
        z4 = z.reshape(*z.shape[:2], self.n_heads, self.d_head).clone()
        rep = self._replacement(_hook_names(layer)[0], z4)
        for h in heads:
            z4[:, :, h, :] = rep if rep.dim() == 0 else rep[h]
        return z4.reshape(z.shape)

    def _attention_out(self, layer: int, z: torch.Tensor, heads: Sequence[int], sl: slice) -> torch.Tensor:
        """The attention block's output at positions ``sl`` with ``heads`` ablated at the site."""
        c_proj = self.hf.transformer.h[layer].attn.c_proj
        if self.site == "hook_z":
            return c_proj(self._replace_heads(layer, z, heads)[:, sl].contiguous())
        return self._replace_heads(layer, c_proj(z[:, sl].contiguous()), heads)

    def _mlp_out(self, layer: int, mid: torch.Tensor, ablated: bool) -> torch.Tensor:
        blk = self.hf.transformer.h[layer]
        if not ablated:
            return blk.mlp(blk.ln_2(mid))
        return self._replacement(_hook_names(layer)[1], mid).expand_as(mid)

    # ---- one set, resumed from a base whose states it shares below ``start`` ----

    def _run_set(self, tokens, key: frozenset, base: _States | None, start: int, positions: slice) -> _States:
        heads = {layer: sorted(c.head for c in key if c.layer == layer and c.is_head) for layer in range(self.n_layers)}
        mlps = {c.layer for c in key if not c.is_head}
        st = _States(key)
        if base is not None:
            st.pre, st.z, st.mid = base.pre[:start], base.z[:start], base.mid[:start]
        last = self.n_layers - 1
        x = base.pre[start] if base is not None else self._embed(tokens)
        for layer in range(start, self.n_layers):
            sl = positions if layer == last else slice(None)
            same_attention = base is not None and layer == start
            z = base.z[layer] if same_attention else self._attention_z(layer, x)
            if same_attention and heads[layer] == sorted(c.head for c in base.key if c.layer == layer and c.is_head):
                mid = base.mid[layer]
            else:
                mid = self._attention_out(layer, z, heads[layer], sl) + x[:, sl]
            st.pre.append(x)
            st.z.append(z)
            st.mid.append(mid)
            x = mid + self._mlp_out(layer, mid, layer in mlps)
        st.logits = self.hf.lm_head(self.hf.transformer.ln_f(x))
        return st

    def _first_difference(self, key: frozenset, base: _States) -> int:
        diff = key ^ base.key
        return min((c.layer for c in diff), default=self.n_layers)

    def _check(self, sets) -> list[frozenset]:
        keys = []
        for s in sets:
            for c in s:
                if not isinstance(c, Component):
                    raise TypeError(f"ablation sets hold Components, got {c!r}")
                if not 0 <= c.layer < self.n_layers or (c.is_head and not 0 <= c.head < self.n_heads):
                    raise ValueError(
                        f"{c.name} is not a component of this model ({self.n_layers} layers, {self.n_heads} heads)"
                    )
            keys.append(frozenset(s))
        return keys

    def run(
        self,
        tokens: torch.Tensor,
        sets: Sequence[Sequence[Component]],
        reduce: Callable[[torch.Tensor, slice], object] | None = None,
        positions: slice | None = None,
    ) -> list:
        """``reduce(logits, rows)`` for every set, over all rows of ``tokens`` [B, T].

        ``logits`` is [chunk rows, positions, vocab] for the rows ``rows`` (a slice of the
        batch); the per-chunk results are concatenated along dim 0 (default reduce: the
        logits themselves). An empty set is the intact model.
        """
        keys = self._check(sets)
        positions = positions or slice(None)
        reduce = reduce or (lambda logits, rows: logits)
        out: list[list] = [[] for _ in keys]
        with torch.no_grad():
            for r0 in range(0, tokens.shape[0], self.rows):
                rows = slice(r0, min(r0 + self.rows, tokens.shape[0]))
                chunk = tokens[rows]
                clean = self._run_set(chunk, frozenset(), None, 0, positions)
                prev = clean
                for i, key in enumerate(keys):
                    if not self.reuse:
                        st = self._run_set(chunk, key, None, 0, positions) if key else clean
                    else:
                        starts = [(self._first_difference(key, b), b) for b in (clean, prev)]
                        start, base = max(starts, key=lambda sb: sb[0])
                        st = base if start == self.n_layers else self._run_set(chunk, key, base, start, positions)
                    out[i].append(reduce(st.logits, rows))
                    prev = st
        return [torch.cat(parts) if isinstance(parts[0], torch.Tensor) else parts for parts in out]

    def _intact_layers(self, tokens: torch.Tensor):
        """The intact forward, layer by layer: yields (layer, stream entering it, z, MLP
        output)."""
        x = self._embed(tokens)
        for layer in range(self.n_layers):
            z = self._attention_z(layer, x)
            mid = self.hf.transformer.h[layer].attn.c_proj(z) + x
            mlp = self._mlp_out(layer, mid, False)
            yield layer, x, z, mlp
            x = mid + mlp

    def means_of(self, batches, components: Sequence[Component] | None = None) -> dict[str, torch.Tensor]:
        """Mean z of every head ([n_heads, d_head] per layer) and mean output of every MLP
        ([d_model]) over all batches, examples and positions, keyed by hook name as
        ``interventions.component_means`` keys them (summed per chunk of ``rows``
        sequences, chunks and batches in order)."""
        layers = range(self.n_layers) if components is None else {c.layer for c in components}
        sums: dict[str, torch.Tensor] = {}
        count = 0
        with torch.no_grad():
            for tokens in batches:
                for r0 in range(0, tokens.shape[0], self.rows):
                    chunk = tokens[r0 : r0 + self.rows]
                    for layer, _, z, mlp in self._intact_layers(chunk):
                        if layer not in layers:
                            continue
                        zname, mname = _hook_names(layer)
                        for name, v in (
                            (zname, z.reshape(-1, self.n_heads, self.d_head)),
                            (mname, mlp.reshape(-1, self.d_model)),
                        ):
                            s = v.float().sum(0)
                            sums[name] = sums[name] + s if name in sums else s
                    count += chunk.shape[0] * chunk.shape[1]
        return {name: s / count for name, s in sums.items()}

    def attention_patterns(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's attention pattern of the intact model, [B, n_heads, T, T] each:
        softmax(q k^T * scaling) under the causal mask, q and k from the layer's own
        ``c_attn`` (what the model's attention computes; its fused kernel keeps no
        pattern)."""
        out = []
        t = tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=self.hf.transformer.wte.weight.device).tril()
        with torch.no_grad():
            for layer, x, _, _ in self._intact_layers(tokens):
                blk = self.hf.transformer.h[layer]
                q, k, _ = blk.attn.c_attn(blk.ln_1(x)).split(self.d_model, dim=2)
                q = q.view(*q.shape[:2], self.n_heads, self.d_head).transpose(1, 2)
                k = k.view(*k.shape[:2], self.n_heads, self.d_head).transpose(1, 2)
                scores = torch.matmul(q, k.transpose(2, 3)) * blk.attn.scaling
                out.append(scores.masked_fill(~causal, float("-inf")).softmax(-1))
        return out


class _Stop(Exception):
    """Raised inside the attention module once z is known (c_proj is run by the engine)."""


def means(model, batches, components=None, rows: int = 256) -> dict[str, torch.Tensor]:
    """Component means over ``batches`` (a sequence of token tensors); see AblationEngine.means_of."""
    return AblationEngine(model, "zero", rows=rows).means_of(batches, components)
