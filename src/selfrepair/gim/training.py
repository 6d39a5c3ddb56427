"""Training paper C's toy models on the counterfactual tasks of
:mod:`selfrepair.tasks.counterfactual`: a small GPT-2 from scratch on the clean prompts
(next-token loss at the answer position only), saved with a word-level tokenizer, so
that ``models.load_bridge`` boots it like any local Hugging Face model. The toy IOI task
is trained with paper B's own recipe, attention-head dropout
(``core.train.train_gpt2_head_dropout`` on ``tasks.ioi.toy_training``).
"""

from __future__ import annotations

import torch

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, save_model
from selfrepair.core.train import train, train_gpt2_head_dropout
from selfrepair.tasks.counterfactual import CounterfactualBatch, ToyIOI, lm_batch, save_word_tokenizer
from selfrepair.tasks.ioi import TOY_SHAPE, toy_training


def accuracy(model, data: CounterfactualBatch) -> float:
    device = next(model.parameters()).device  # the held-out set follows the model
    with torch.no_grad():
        logits = model(input_ids=data.clean.to(device)).logits
    rows = torch.arange(len(data))
    return float((logits[rows, data.pos].argmax(-1) == data.answer.to(device)).float().mean())


def train_task_model(
    task,
    folder,
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_mlp: int,
    seed: int,
    lr: float,
    batch_size: int,
    max_steps: int,
    eval_every: int = 200,
    target_accuracy: float = 0.99,
    device: str = "cpu",
) -> dict:
    """Train a GPT-2 toy on ``task`` and save it (with tokenizer and metadata) in ``folder``."""
    cfg = gpt2_toy_config(
        vocab_size=len(task.vocab), n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_mlp=d_mlp, n_ctx=task.n_ctx
    )
    model = build_gpt2_toy(cfg, init="transformers", seed=seed, positional=True)
    held_out = task.sample(500, seed=10_000 + seed)

    def batch_fn(step):
        return lm_batch(task.sample(batch_size, seed=seed * 1_000_003 + step))

    res = train(
        model,
        batch_fn,
        lambda m: accuracy(m, held_out),
        lr=lr,
        max_steps=max_steps,
        eval_every=eval_every,
        target_accuracy=target_accuracy,
        device=device,
    )
    return _save(model, folder, task, seed, res)


def _save(model, folder, task, seed: int, res) -> dict:
    """Save a trained task model with its tokenizer and metadata; return the metadata."""
    meta = {"task": task.name, "seed": seed, "steps": res.steps, "accuracy": res.final_accuracy, "seconds": res.seconds}
    save_model(model.cpu(), folder, meta, tokenizer=lambda f: save_word_tokenizer(f, task.vocab))
    return meta


def train_toy_ioi(
    task: ToyIOI,
    folder,
    n_layers,
    n_heads,
    d_model,
    d_mlp,
    seed,
    lr,
    batch_size,
    max_steps,
    eval_every=250,
    target_accuracy=0.99,
    device="cpu",
    head_dropout=0.1,
) -> dict:
    """The toy IOI task, trained with paper B's recipe (attention-head dropout, 0.1 as
    paper B's ``coax.ioi_experiment.train_toy``)."""
    model, res = train_gpt2_head_dropout(
        TOY_SHAPE, toy_training, n_layers, n_heads, d_model, d_mlp, seed, head_dropout, lr, batch_size,
        max_steps, eval_every, target_accuracy, device,
    )  # fmt: skip
    return _save(model, folder, task, seed, res)


def train_any(task, folder, **kw) -> dict:
    """Train and save a model for any task of ``tasks.registry.get_task``."""
    if isinstance(task, ToyIOI):
        return train_toy_ioi(task, folder, **kw)
    return train_task_model(task, folder, **kw)
