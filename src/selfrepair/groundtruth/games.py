"""Ablation games: v(S) = a task metric with the components of S ablated, through the
workflow's own intervention layers.

Two ways to evaluate a game, the same values to float rounding:

- :class:`AblationGame`, any TransformerLens bridge: one call runs
  :func:`selfrepair.core.interventions.run_ablated`: the batch is repeated once per
  coalition (at most ``max_rows`` sequences per forward), each copy with its own mask,
  and each copy's logits are reduced to one number (one full forward per coalition).
- :class:`EngineGame`, any Hugging Face GPT-2 LM (``models.load_hf``; every model the
  papers train here is one): paper A's own ablation engine (:mod:`selfrepair.core.engine`),
  which resumes each coalition from the intact model's or the previous coalition's
  residual stream at the first layer where they differ. The game puts each call's
  coalitions in the order that makes consecutive ones share their longest layer prefix
  (:func:`engine_order`), so a permutation's prefixes, and sets that differ only in late
  layers, cost only the layers from their first difference (:class:`SdpaEngine`: the
  engine with the attention kernel called directly, the same bits). Its metric is an
  :class:`EngineReduce` (:func:`exact_match_reduce`, :func:`logprob_reduce`,
  :func:`ioi_reduce`, :func:`counterfactual_reduce`). Games that differ only in their
  metric share one :class:`EngineGames`: each coalition runs once for all of them.

``mode`` is ``'mean'`` or ``'zero'``. Mean ablation sets each ablated hook (a head's z,
an MLP's output) to its mean from :func:`interventions.component_means`, passed as
``means``. The ground truth computes those means on the evaluation batch itself
(``scripts/groundtruth_model.py``), pooled over every example and every position, the
first token (paper A's START, the others' ``<bos>``) included: one mean vector per
component, the same at every position (the sum over all B x T positions over B x T).
Paper A's own C takes its means from the OOD batches behind G instead (heroes_scores),
with the same pooling. Tokens and targets must be on the model's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from selfrepair.core import engine, interventions
from selfrepair.core.components import Component
from selfrepair.gim import evaluate
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import ioi
from selfrepair.tasks.counterfactual import CounterfactualBatch
from selfrepair.tasks.sequences import Batch


@dataclass
class AblationGame:
    """v(S) = float(``reduce``(logits of ``tokens`` with S ablated)), S a list of Components.

    ``n_coalitions`` and ``n_calls`` count the coalitions evaluated and the calls made.
    """

    bridge: object
    tokens: torch.Tensor
    reduce: Callable[[torch.Tensor], object]
    mode: str = "mean"
    means: dict | None = None
    max_rows: int = 4096
    n_coalitions: int = 0
    n_calls: int = 0

    def __post_init__(self):
        if self.mode not in interventions.MODES:
            raise ValueError(f"unknown ablation mode {self.mode!r}; expected one of {interventions.MODES}")
        if self.mode == "mean" and self.means is None:
            raise ValueError("mean ablation needs means: pass interventions.component_means(bridge, ...)")

    def __call__(self, sets: Sequence[Sequence[Component]]) -> np.ndarray:
        vals = interventions.run_ablated(
            self.bridge, self.tokens, sets, self.mode, self.means, reduce=self.reduce, max_rows=self.max_rows
        )
        self.n_coalitions += len(sets)
        self.n_calls += 1
        return np.array([float(v) for v in vals], dtype=np.float64)


# ---------------------------------------------------------------- engine ----------
def engine_order(sets: Sequence[Sequence[Component]]) -> list[int]:
    """Indices of ``sets`` in the order the ablation engine runs them cheapest.

    The engine resumes a set from the previous one (or the intact model) at the first
    layer where the two differ, and within that layer reuses the attention output when
    the layer's ablated heads agree. A set's key is, layer by layer, (its ablated heads
    there, whether the layer's MLP is ablated); sorting the keys lexicographically puts
    every set next to the one sharing its longest layer prefix (sorted strings: a
    string's longest common prefix with any string before it is the one with its
    predecessor), so each layer state of the batch is computed once: the fewest layers
    any order of these sets runs. Stable: equal sets keep their order and run once.
    """
    n_layers = 1 + max((c.layer for s in sets for c in s), default=-1)

    def key(s):
        heads = [set() for _ in range(n_layers)]
        mlps = [False] * n_layers
        for c in s:
            if c.is_head:
                heads[c.layer].add(c.head)
            else:
                mlps[c.layer] = True
        return tuple((tuple(sorted(h)), m) for h, m in zip(heads, mlps))

    keys = [key(s) for s in sets]
    return sorted(range(len(sets)), key=keys.__getitem__)


class SdpaEngine(engine.AblationEngine):
    """Paper A's ablation engine with each layer's attention computed as the model's own
    SDPA attention computes it, called directly: ``c_attn``, the same views of q, k and v,
    ``torch.nn.functional.scaled_dot_product_attention`` with the module's scaling and
    the causal flag, the same reshape (``transformers``' ``sdpa_attention_forward`` on a
    GPT-2 without cache or mask), skipping the module's wrapper, which costs about as much
    as the attention kernel itself on these small models (toy IOI: 2.4 against 3.2 ms a
    layer; paper A's: 13.4 against 15.3 ms, measured).

    The same bits by construction, and checked: the first call at each layer also runs
    the module's own path and keeps the direct one only if the two are equal in every
    bit (else the module's path for good). A model not on SDPA (eager attention,
    ``reorder_and_upcast_attn``) always takes the module's path.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.hf.config
        usable = cfg._attn_implementation == "sdpa" and not getattr(cfg, "reorder_and_upcast_attn", False)
        self.direct: dict[int, bool] = {} if usable else dict.fromkeys(range(self.n_layers), False)

    def _direct_z(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        blk = self.hf.transformer.h[layer]
        q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(self.d_model, dim=2)
        shape = (*x.shape[:2], -1, self.d_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        z = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=0.0, scale=blk.attn.scaling, is_causal=q.shape[2] > 1
        )
        return z.transpose(1, 2).contiguous().reshape(*x.shape[:2], -1).contiguous()

    def _attention_z(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        ok = self.direct.get(layer)
        if ok is False:
            return super()._attention_z(layer, x)
        z = self._direct_z(layer, x)
        if ok is None:
            ref = super()._attention_z(layer, x)
            self.direct[layer] = torch.equal(z, ref)
            return ref
        return z


@dataclass
class EngineReduce:
    """How an :class:`EngineGame` turns logits into v.

    ``positions``: the slice of sequence positions whose logits are needed (the engine
    runs its last layer there only). ``per_rows(logits, rows)``: a [len(rows), k] tensor
    of per-sequence partial results for the batch rows ``rows`` (a slice), ``logits``
    [rows, positions, vocab]. ``finish(parts)``: v from the [B, k] partial results of all
    rows."""

    positions: slice | None
    per_rows: Callable[[torch.Tensor, slice], torch.Tensor]
    finish: Callable[[torch.Tensor], object]


def exact_match_reduce(batch: Batch) -> EngineReduce:
    """Paper A's exact-match accuracy (:func:`exact_match_game`'s v) on the engine: the
    share of sequences right at every target position, read at the target positions."""
    pos = heroes.target_positions(batch.mask)
    targets, mask = batch.targets[:, pos], batch.mask[:, pos]
    return EngineReduce(
        pos,
        lambda lg, r: heroes.exact_match(lg, targets[r], mask[r]).float()[:, None],
        lambda parts: parts[:, 0].mean(),
    )


def logprob_reduce(batch: Batch) -> EngineReduce:
    """:func:`logprob_game`'s v on the engine: the mean log-probability of the target over
    all target positions of all sequences (minus the masked cross-entropy), from each
    sequence's sum (float64) and count of target log-probabilities."""
    pos = heroes.target_positions(batch.mask)
    mask = batch.mask[:, pos]
    targets = torch.where(mask, batch.targets[:, pos], 0)  # any index where no target is read

    def per_rows(lg, r):
        logp = torch.log_softmax(lg.float(), -1).gather(-1, targets[r][..., None])[..., 0]
        m = mask[r]
        return torch.stack([torch.where(m, logp, 0.0).double().sum(1), m.double().sum(1)], 1)

    return EngineReduce(pos, per_rows, lambda parts: parts[:, 0].sum() / parts[:, 1].sum())


def ioi_reduce(prompts: ioi.IOIPrompts) -> EngineReduce:
    """:func:`ioi_game`'s v on the engine: the mean over prompts of logit[IO] - logit[S]
    at the last position (:func:`tasks.ioi.logit_diff`; the engine's last layer runs
    there only)."""

    def per_rows(lg, r):
        rows = ioi.IOIPrompts(prompts.tokens[r], prompts.io[r], prompts.s[r])
        return ioi.logit_diff(lg, rows, reduce=False)[:, None]

    return EngineReduce(slice(-1, None), per_rows, lambda parts: parts[:, 0].mean())


def counterfactual_reduce(data: CounterfactualBatch) -> EngineReduce:
    """:func:`counterfactual_game`'s v on the engine: the mean over rows of logit(answer) -
    logit(foil) at the row's ``pos`` of the clean prompt; the last layer runs on the
    positions from the smallest ``pos`` to the largest only."""
    lo, hi = int(data.pos.min()), int(data.pos.max()) + 1

    def per_rows(lg, r):  # the rows r, their positions counted from lo
        rows = CounterfactualBatch(data.clean[r], data.corrupt[r], data.answer[r], data.foil[r], data.pos[r] - lo)
        return evaluate.logit_diff(lg, rows)[:, None]

    return EngineReduce(slice(lo, hi), per_rows, lambda parts: parts[:, 0].mean())


def _span(positions: slice | None, length: int) -> tuple[int, int]:
    """(start, stop) of a positions slice (None: all) on sequences of ``length`` tokens."""
    start, stop, step = (positions or slice(None)).indices(length)
    if step != 1:
        raise ValueError(f"engine positions must be a contiguous slice, got {positions}")
    return start, stop


class EngineGames:
    """Several games that differ only in how they read the logits, over one batch, on
    paper A's ablation engine (``model``: the Hugging Face GPT-2 LM, ``models.load_hf``;
    not a bridge): each coalition is run once and every game's value read from its logits.

    ``reduces``: {game name: :class:`EngineReduce`}. ``game(name)`` is that game, a
    callable on lists of coalitions (v in the order given). A call runs only the
    coalitions that no game of this object has asked for before (in :func:`engine_order`;
    ``order=False``: in the order first asked), each once, and keeps every game's value of
    them: paper A's accuracy game then reads the coalitions of the log-probability game's
    permutations (the same seed draws the same permutations) without running them again.
    The logits of a coalition do not depend on which other coalitions a call runs (rows are
    chunked the same way each time), so the values are those of one game alone.

    ``mode``, ``means`` as :class:`AblationGame` (the same means dict serves both);
    ``rows``: sequences per engine chunk; ``reuse=False`` runs every coalition from the
    embedding (the same values; the benchmark's comparison). ``n_run``: coalitions run on
    the engine, ``n_engine_calls``: engine calls made.
    """

    def __init__(
        self,
        model,
        tokens: torch.Tensor,
        reduces: dict[str, EngineReduce],
        mode: str = "mean",
        means: dict | None = None,
        rows: int = 256,
        order: bool = True,
        reuse: bool = True,
    ):
        if mode not in interventions.MODES:
            raise ValueError(f"unknown ablation mode {mode!r}; expected one of {interventions.MODES}")
        if mode == "mean" and means is None:
            raise ValueError("mean ablation needs means: pass interventions.component_means(bridge, ...)")
        if not reduces:
            raise ValueError("no games: pass at least one EngineReduce")
        self.engine = SdpaEngine(model, mode, means, rows=rows, reuse=reuse)
        self.tokens, self.order = tokens, order
        self.names = list(reduces)
        self.reduces = [reduces[k] for k in self.names]
        spans = [_span(r.positions, tokens.shape[1]) for r in self.reduces]
        self.start, stop = min(a for a, _ in spans), max(b for _, b in spans)
        self.positions = slice(self.start, stop)
        self.slices = [slice(a - self.start, b - self.start) for a, b in spans]
        self.cache: dict[frozenset, np.ndarray] = {}
        self.n_run = self.n_engine_calls = 0

    def _per_rows(self, logits: torch.Tensor, rows: slice) -> list[torch.Tensor]:
        return [r.per_rows(logits[:, sl], rows) for r, sl in zip(self.reduces, self.slices)]

    def _run(self, keys: list[frozenset]) -> None:
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))  # first-asked order, once each
        if not todo:
            return
        sets = [list(k) for k in todo]
        idx = engine_order(sets) if self.order else list(range(len(sets)))
        parts = self.engine.run(self.tokens, [sets[i] for i in idx], self._per_rows, self.positions)
        for i, chunks in zip(idx, parts):  # chunks: per row chunk, one tensor per game
            self.cache[todo[i]] = np.array(
                [float(red.finish(torch.cat([c[g] for c in chunks]))) for g, red in enumerate(self.reduces)],
                dtype=np.float64,
            )
        self.n_run += len(todo)
        self.n_engine_calls += 1

    def values(self, name: str, sets: Sequence[Sequence[Component]]) -> np.ndarray:
        """v of game ``name`` for every coalition of ``sets``, in the order given."""
        g = self.names.index(name)
        keys = [frozenset(s) for s in sets]
        self._run(keys)
        return np.array([self.cache[k][g] for k in keys], dtype=np.float64)

    def game(self, name: str) -> "EngineGame":
        if name not in self.names:
            raise ValueError(f"no game {name!r} here; games: {self.names}")
        return EngineGame(shared=self, name=name)


class EngineGame:
    """v(S) = ``reduce`` of the logits of ``tokens`` with S ablated, on paper A's ablation
    engine (``model``: the Hugging Face GPT-2 LM, ``models.load_hf``; not a bridge): one
    game of an :class:`EngineGames` (``EngineGame(model, tokens, reduce, ...)`` makes one
    of its own; ``EngineGames.game`` one that shares its coalitions with other games).

    ``mode``, ``means``, ``rows``, ``order``, ``reuse`` as :class:`EngineGames`. Each call
    returns the values in the order given. ``n_coalitions`` and ``n_calls`` count the
    coalitions asked for and the calls made.
    """

    def __init__(
        self,
        model=None,
        tokens: torch.Tensor | None = None,
        reduce: EngineReduce | None = None,
        mode: str = "mean",
        means: dict | None = None,
        rows: int = 256,
        order: bool = True,
        reuse: bool = True,
        *,
        shared: EngineGames | None = None,
        name: str = "v",
    ):
        if shared is None:
            if model is None or tokens is None or reduce is None:
                raise TypeError("EngineGame needs model, tokens and reduce (or shared= and name=)")
            shared = EngineGames(model, tokens, {name: reduce}, mode, means, rows, order, reuse)
        self.shared, self.name = shared, name
        self.n_coalitions = self.n_calls = 0

    def __call__(self, sets: Sequence[Sequence[Component]]) -> np.ndarray:
        sets = [list(s) for s in sets]
        if not sets:
            return np.empty(0, dtype=np.float64)
        out = self.shared.values(self.name, sets)
        self.n_coalitions += len(sets)
        self.n_calls += 1
        return out


def exact_match_game(
    bridge, batch: Batch, mode: str = "mean", means: dict | None = None, max_rows: int = 4096
) -> AblationGame:
    """Paper A: v(S) = exact-match accuracy over ``batch`` (the share of sequences whose
    argmax is the target at every target position, :func:`heroes.scores.exact_match`,
    which equals greedy decoding's exact match). In [0, 1]; floor 0."""
    return AblationGame(
        bridge,
        batch.tokens,
        lambda lg: heroes.exact_match(lg, batch.targets, batch.mask).float().mean(),
        mode,
        means,
        max_rows,
    )


def logprob_game(
    bridge, batch: Batch, mode: str = "mean", means: dict | None = None, max_rows: int = 4096
) -> AblationGame:
    """Paper A's smooth companion: v(S) = mean log-probability of the target token over
    all target positions of ``batch`` (= minus :func:`heroes.scores.lm_loss`, the masked
    cross-entropy, positions of all sequences pooled)."""
    return AblationGame(bridge, batch.tokens, lambda lg: -heroes.lm_loss(lg, batch), mode, means, max_rows)


def ioi_game(
    bridge, prompts: ioi.IOIPrompts, mode: str = "mean", means: dict | None = None, max_rows: int = 4096
) -> AblationGame:
    """Toy IOI: v(S) = mean over prompts of logit[IO] - logit[S] at the last position
    (:func:`tasks.ioi.logit_diff`)."""
    return AblationGame(bridge, prompts.tokens, lambda lg: ioi.logit_diff(lg, prompts), mode, means, max_rows)


def counterfactual_game(
    bridge, data: CounterfactualBatch, mode: str = "mean", means: dict | None = None, max_rows: int = 4096
) -> AblationGame:
    """Paper C's toy tasks: v(S) = mean over rows of logit(answer) - logit(foil) at the
    row's ``pos`` on the clean prompts (:func:`gim.evaluate.logit_diff`)."""
    return AblationGame(bridge, data.clean, lambda lg: evaluate.logit_diff(lg, data).mean(), mode, means, max_rows)
