"""Induction data: repeated random sequences and their metric (paper B's induction test;
its attention-only toy models and experiment are in :mod:`selfrepair.coax.induction_experiment`).

A sequence is ``[BOS] x || x || y`` with x uniform over ``vocab`` tokens, of a length
T drawn per sequence from [T_min, T_max], and y fresh random tokens up to the fixed
length 1 + 2 T_max. A varying T keeps a head from solving the task by a fixed
positional offset (with one T, a layer-0 head can attend T - 1 back without any
induction).

Induction score of a head: mean attention from position p of the second half to
p - T + 1 (the token after p's earlier occurrence). Metric: mean log-probability of
the repeated tokens that induction can predict (second half, after its first token).
"""

from __future__ import annotations

import torch

from selfrepair.tasks.sequences import Batch

BOS = 0


def sample(n: int, T, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, 1 + 2 T_max] tokens, [n] lengths T); ``T`` is an int or (T_min, T_max).

    Content tokens are 1..vocab-1.
    """
    lo, hi = (T, T) if isinstance(T, int) else (int(T[0]), int(T[1]))
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    toks = torch.randint(1, vocab, (n, 1 + 2 * hi), generator=g)
    toks[:, 0] = BOS
    for i, t in enumerate(lens.tolist()):
        toks[i, 1 + t : 1 + 2 * t] = toks[i, 1 : 1 + t]
    return toks, lens


def _repeat_mask(lens: torch.Tensor, length: int, offset: int) -> torch.Tensor:
    """[n, length] True at query positions p in [T + 1 + offset, 2T - 1 + offset]."""
    p = torch.arange(length)[None, :]
    t = lens[:, None]
    return (p >= t + 1 + offset) & (p <= 2 * t - 1 + offset)


def lm_batch(tokens: torch.Tensor) -> Batch:
    return Batch(tokens[:, :-1], tokens[:, 1:], torch.ones_like(tokens[:, 1:], dtype=torch.bool))


def repeated_logprob(
    logits: torch.Tensor, tokens: torch.Tensor, lens: torch.Tensor, reduce: bool = True
) -> torch.Tensor:
    """Mean log-prob of the repeated tokens T+2..2T given their prefixes.

    ``logits`` [n, L, V] of ``tokens`` [n, L]; the prediction at p (T+1 <= p <= 2T-1)
    is of token p + 1.
    """
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    v = lp.gather(-1, tokens[:, 1:, None].to(lp.device))[..., 0]  # [n, L-1]
    m = _repeat_mask(lens, v.shape[1], 0).to(v.device)
    per = (v * m).sum(1) / m.sum(1)
    return per.mean() if reduce else per
