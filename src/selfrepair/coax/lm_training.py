"""Training paper B's pruning-study language model on the grammar of
:mod:`selfrepair.tasks.lm`."""

from __future__ import annotations

import torch

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config
from selfrepair.core.train import train
from selfrepair.tasks.lm import BOS, TOKEN, VOCAB, lm_batch, lm_loss, sample


def train_model(
    n_layers,
    n_heads,
    d_model,
    d_mlp,
    seed,
    n_ctx=48,
    lr=1e-3,
    batch_size=32,
    max_steps=1500,
    eval_every=250,
    device="cpu",
):
    """Train a GPT-2 LM on the grammar; returns (model, TrainResult); 'accuracy' logs
    the validation perplexity's reciprocal (higher is better)."""

    cfg = gpt2_toy_config(VOCAB, n_layers, n_heads, d_model, d_mlp, n_ctx=n_ctx, bos_token_id=TOKEN[BOS])
    model = build_gpt2_toy(cfg, seed=seed, positional=True)
    val = sample(64, n_ctx, 70_000 + seed)

    def batch_fn(step):
        return lm_batch(sample(batch_size, n_ctx, seed * 1_000_003 + step))

    def eval_fn(m):
        with torch.no_grad():
            lg = m(input_ids=val.to(next(m.parameters()).device)).logits.cpu()
        return float(torch.exp(-lm_loss(lg, val)))

    res = train(
        model, batch_fn, eval_fn, lr=lr, max_steps=max_steps, eval_every=eval_every, target_accuracy=None, device=device
    )
    return model.eval(), res
