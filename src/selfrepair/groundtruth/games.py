"""Ablation games of a TransformerLens bridge: v(S) = a task metric with the components
of S ablated, through the workflow's own intervention layer.

One call of a game runs :func:`selfrepair.core.interventions.run_ablated`: the batch is
repeated once per coalition (at most ``max_rows`` sequences per forward), each copy with
its own mask, and each copy's logits are reduced to one number. ``mode`` is ``'mean'``
(each ablated hook set to its mean from :func:`interventions.component_means`, passed
as ``means``) or ``'zero'``. Tokens and targets must be on the bridge's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from selfrepair.core import interventions
from selfrepair.core.components import Component
from selfrepair.gim import circuits
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
    row's ``pos`` on the clean prompts (:func:`gim.circuits.logit_diff`)."""
    return AblationGame(bridge, data.clean, lambda lg: circuits.logit_diff(lg, data).mean(), mode, means, max_rows)
