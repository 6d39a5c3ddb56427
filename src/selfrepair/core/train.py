"""One training loop for every from-scratch model of the workflow.

The loop trains the Hugging Face module directly (the bridge is for analysis), checks
the loss for NaN/inf at every step, evaluates every ``eval_every`` steps and stops at
``target_accuracy``. ``batch_fn(step) -> Batch`` and ``eval_fn(model) -> float`` make
it task-agnostic.

Long jobs show progress: a line ``train step S/MAX ...`` (last loss, last evaluation
accuracy, steps/s, ETA to ``max_steps``) goes to the ``selfrepair.core.train`` logger at
every evaluation, every ``progress_seconds`` of wall time and every ``progress_steps``
steps, whichever comes first. In a rule script that logger writes to the rule's log file
(``runtime.start``); elsewhere it is silent unless logging is configured, and it never
writes to stdout. It only reads the clock and numbers the loop already has: the weights
and the trajectory are the same with or without it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

LOG = logging.getLogger(__name__)
PROGRESS_SECONDS = 30.0  # default wall-time interval of the progress line


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    steps: int
    reached_target: bool
    final_accuracy: float
    seconds: float
    log: list[dict] = field(default_factory=list)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(
    step: int, max_steps: int, loss: float, accuracy: float, eval_step: int | None, seconds: float
) -> str:
    """One progress line: where the loop is, its last loss and evaluation, its speed
    (steps/s since the start, evaluations included) and the time left to ``max_steps``
    at that speed (an upper bound when a target accuracy can stop it earlier)."""
    rate = step / seconds if seconds > 0 else float("nan")
    eta = (max_steps - step) / rate if rate > 0 else float("nan")
    acc = f"eval acc {accuracy:.4f} at step {eval_step}" if eval_step is not None else "no eval yet"
    return (
        f"train step {step}/{max_steps} ({100 * step / max_steps:.0f}%) | loss {loss:.4f} | {acc} | "
        f"{rate:.1f} steps/s | elapsed {_duration(seconds)} | eta {_duration(eta)} to max_steps"
    )


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
    progress_seconds: float | None = PROGRESS_SECONDS,
    progress_steps: int | None = None,
) -> TrainResult:
    """Adam on the masked LM loss until ``eval_fn`` reaches ``target_accuracy``.

    ``batch_fn(step)`` returns an object with ``tokens``, ``targets`` and ``mask``.
    Raises ``TrainingDiverged`` on a non-finite loss, naming the step.
    A progress line is logged at each evaluation and every ``progress_seconds`` of wall
    time or ``progress_steps`` steps, whichever comes first (``None`` turns either off);
    it does not change what is computed.
    """
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    logits_fn = logits_fn or (lambda m, tokens: m(input_ids=tokens).logits)
    log: list[dict] = []
    t0 = time.perf_counter()
    running = 0.0
    acc = float("nan")
    eval_step = None
    last_line = t0
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
        evaluated = step % eval_every == 0 or step == max_steps
        if evaluated:
            model.eval()
            acc = float(eval_fn(model))
            model.train()
            eval_step = step
            n = eval_every if step % eval_every == 0 else step % eval_every
            row = {"step": step, "loss": running / n, "accuracy": acc, "seconds": time.perf_counter() - t0}
            running = 0.0
            log.append(row)
            if log_fn:
                log_fn(row)
        now = time.perf_counter()
        if (
            evaluated
            or (progress_steps and step % progress_steps == 0)
            or (progress_seconds is not None and now - last_line >= progress_seconds)
        ):
            LOG.info("%s", progress_line(step, max_steps, value, acc, eval_step, now - t0))
            last_line = now
        if evaluated and target_accuracy is not None and acc >= target_accuracy:
            LOG.info("train: stop at step %d: eval accuracy %.4f reached the target %.4f", step, acc, target_accuracy)
            model.eval()
            return TrainResult(step, True, acc, time.perf_counter() - t0, log)
    model.eval()
    reached = target_accuracy is None or acc >= target_accuracy
    return TrainResult(max_steps, reached, acc, time.perf_counter() - t0, log)
