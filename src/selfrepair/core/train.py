"""One training loop for every from-scratch model of the workflow.

The loop trains the Hugging Face module directly (the bridge is for analysis), checks
the loss for NaN/inf at every step, evaluates every ``eval_every`` steps and stops at
``target_accuracy``. ``batch_fn(step) -> Batch`` and ``eval_fn(model) -> float`` make
it task-agnostic.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    steps: int
    reached_target: bool
    final_accuracy: float
    seconds: float
    log: list[dict] = field(default_factory=list)


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the positions where ``mask`` is True only."""
    return F.cross_entropy(logits[mask].float(), targets[mask])


def train(
    model: torch.nn.Module,
    batch_fn: Callable[[int], "object"],
    eval_fn: Callable[[torch.nn.Module], float],
    lr: float = 1e-3,
    max_steps: int = 15000,
    eval_every: int = 500,
    target_accuracy: float | None = 0.9,
    device: str = "cpu",
    logits_fn: Callable | None = None,
    log_fn: Callable[[dict], None] | None = None,
) -> TrainResult:
    """Adam on the masked LM loss until ``eval_fn`` reaches ``target_accuracy``.

    ``batch_fn(step)`` returns an object with ``tokens``, ``targets`` and ``mask``.
    Raises ``TrainingDiverged`` on a non-finite loss, naming the step.
    """
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    logits_fn = logits_fn or (lambda m, tokens: m(input_ids=tokens).logits)
    log: list[dict] = []
    t0 = time.perf_counter()
    running = 0.0
    acc = float("nan")
    for step in range(1, max_steps + 1):
        batch = batch_fn(step).to(device)
        loss = masked_lm_loss(logits_fn(model, batch.tokens), batch.targets, batch.mask)
        value = loss.item()
        if not math.isfinite(value):
            raise TrainingDiverged(f"loss is {value} at step {step}; training diverged")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += value
        if step % eval_every == 0 or step == max_steps:
            model.eval()
            acc = float(eval_fn(model))
            model.train()
            n = eval_every if step % eval_every == 0 else step % eval_every
            row = {"step": step, "loss": running / n, "accuracy": acc, "seconds": time.perf_counter() - t0}
            running = 0.0
            log.append(row)
            if log_fn:
                log_fn(row)
            if target_accuracy is not None and acc >= target_accuracy:
                model.eval()
                return TrainResult(step, True, acc, time.perf_counter() - t0, log)
    model.eval()
    reached = target_accuracy is None or acc >= target_accuracy
    return TrainResult(max_steps, reached, acc, time.perf_counter() - t0, log)
