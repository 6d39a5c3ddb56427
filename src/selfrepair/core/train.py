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

Attention-head dropout (paper B's recipe, which paper C also uses for its toy IOI task):
:func:`head_dropout_logits_fn` zeroes GPT-2 heads at random in training,
:func:`remove_head_dropout` takes it off again, and :func:`train_gpt2_head_dropout` trains
a fresh GPT-2 toy with it, given the task's data functions (``tasks.ioi.toy_training``).
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


# ----------------------------------------------------------------------------------
# Attention-head dropout (GPT-2)
# ----------------------------------------------------------------------------------
def head_dropout_logits_fn(p: float, n_heads: int, seed: int = 0):
    """A ``logits_fn`` for :func:`train` that zeroes each head's output independently
    with probability ``p`` (per example, layer and head) in training.

    GPT-2 only: a pre-hook on each block's ``attn.c_proj``, whose input is the
    concatenation of the heads' outputs z. No rescaling; at test time every head is
    present, so the model learns to tolerate missing heads (self-repair).
    Call :func:`remove_head_dropout` on the model after training.
    """
    g = torch.Generator().manual_seed(seed)

    def pre(module, args):
        m = getattr(module, "_sr_mask", None)
        if m is None or not module.training:
            return None
        x = args[0]
        b, t, d = x.shape
        m = m.to(x.device, x.dtype)
        return ((x.view(b, t, n_heads, d // n_heads) * m[:, None, :, None]).view(b, t, d),) + tuple(args[1:])

    def logits_fn(model, tokens):
        blocks = model.transformer.h
        if p > 0:
            masks = (torch.rand(len(blocks), tokens.shape[0], n_heads, generator=g) >= p).float()
            for i, block in enumerate(blocks):
                if not hasattr(block.attn.c_proj, "_sr_handle"):
                    block.attn.c_proj._sr_handle = block.attn.c_proj.register_forward_pre_hook(pre)
                block.attn.c_proj._sr_mask = masks[i]
        return model(input_ids=tokens).logits

    return logits_fn


def remove_head_dropout(model) -> None:
    """Take :func:`head_dropout_logits_fn`'s hooks and masks off ``model``."""
    for block in model.transformer.h:
        proj = block.attn.c_proj
        if hasattr(proj, "_sr_handle"):
            proj._sr_handle.remove()
            del proj._sr_handle
        proj._sr_mask = None


def train_gpt2_head_dropout(
    shape: dict,
    data: Callable[[int, int], tuple[Callable, Callable]],
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_mlp: int,
    seed: int,
    head_dropout: float,
    lr: float,
    batch_size: int,
    max_steps: int,
    eval_every: int,
    target_accuracy: float | None,
    device: str = "cpu",
):
    """Train a fresh GPT-2 toy (GPT-2's own init, learned positions) with attention-head
    dropout ``head_dropout``; returns (model in eval mode, :class:`TrainResult`).

    ``shape``: the task's ``vocab_size``, ``n_ctx`` and ``bos_token_id``;
    ``data(batch_size, seed) -> (batch_fn, eval_fn)``: the task's training batches and
    its evaluation (``tasks.ioi.TOY_SHAPE`` and ``tasks.ioi.toy_training``). The model is
    built (``seed``) before ``data`` is called, and the dropout masks draw from their own
    generator seeded with ``seed``.
    """
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config  # core.train's import stays light

    cfg = gpt2_toy_config(
        shape["vocab_size"], n_layers, n_heads, d_model, d_mlp, n_ctx=shape["n_ctx"], bos_token_id=shape["bos_token_id"]
    )
    model = build_gpt2_toy(cfg, seed=seed, positional=True)
    batch_fn, eval_fn = data(batch_size, seed)
    res = train(
        model,
        batch_fn,
        eval_fn,
        lr=lr,
        max_steps=max_steps,
        eval_every=eval_every,
        target_accuracy=target_accuracy,
        device=device,
        logits_fn=head_dropout_logits_fn(head_dropout, n_heads, seed),
    )
    remove_head_dropout(model)
    return model.eval(), res
