"""A small synthetic language for the pruning study (no downloads).

A probabilistic grammar with number agreement and nested prepositional phrases:

    S  -> NP[n] VP[n] .          NP[n] -> Det[n] (Adj) N[n] (PP)
    VP[n] -> V[n] NP[m] | Vi[n]  PP -> P NP[m]

Sentences are concatenated into a stream and cut into sequences of ``n_ctx`` tokens,
each starting with BOS. Deterministic from a seed.
"""

from __future__ import annotations

import random

import torch

from selfrepair.tasks.sequences import Batch

DET = {"sg": ["the", "a", "this", "every"], "pl": ["the", "some", "these", "many"]}
NOUN = {
    "sg": ["dog", "cat", "bird", "child", "farmer", "river", "house", "tree", "teacher", "car"],
    "pl": ["dogs", "cats", "birds", "children", "farmers", "rivers", "houses", "trees", "teachers", "cars"],
}
ADJ = ["big", "small", "old", "red", "happy", "quiet", "green", "fast"]
VT = {"sg": ["sees", "likes", "chases", "finds", "helps"], "pl": ["see", "like", "chase", "find", "help"]}
VI = {"sg": ["sleeps", "runs", "sings", "waits"], "pl": ["sleep", "run", "sing", "wait"]}
PREP = ["near", "behind", "with", "under"]
BOS = "<bos>"


def _vocab():
    words = [BOS, "."]
    for group in (DET["sg"], DET["pl"], NOUN["sg"], NOUN["pl"], ADJ, VT["sg"], VT["pl"], VI["sg"], VI["pl"], PREP):
        for w in group:
            if w not in words:
                words.append(w)
    return words


WORDS = _vocab()
TOKEN = {w: i for i, w in enumerate(WORDS)}
VOCAB = len(WORDS)


def _np(r: random.Random, depth: int) -> list[str]:
    n = r.choice(["sg", "pl"])
    out = [r.choice(DET[n])]
    if r.random() < 0.4:
        out.append(r.choice(ADJ))
    out.append(r.choice(NOUN[n]))
    if depth < 2 and r.random() < 0.3:
        out += [r.choice(PREP)] + _np(r, depth + 1)[0]
    return out, n


def sentence(r: random.Random) -> list[str]:
    subj, n = _np(r, 0)
    if r.random() < 0.7:
        obj, _ = _np(r, 1)
        vp = [r.choice(VT[n])] + obj
    else:
        vp = [r.choice(VI[n])]
    return subj + vp + ["."]


def sample(n: int, n_ctx: int, seed: int) -> torch.Tensor:
    """[n, n_ctx] token sequences (BOS + stream of sentences)."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        seq = [TOKEN[BOS]]
        while len(seq) < n_ctx:
            seq += [TOKEN[w] for w in sentence(r)]
        out.append(seq[:n_ctx])
    return torch.tensor(out)


def lm_batch(tokens: torch.Tensor) -> Batch:
    return Batch(tokens[:, :-1], tokens[:, 1:], torch.ones_like(tokens[:, 1:], dtype=torch.bool))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``tokens`` given their logits [B, T, V]."""
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    return -lp.gather(-1, tokens[:, 1:, None].to(lp.device))[..., 0].mean()
