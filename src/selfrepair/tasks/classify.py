"""A classification-style toy task whose relevant tokens are known by construction.

``<bos> w1 ... wL ?`` -> ``pos`` or ``neg``: the words are fillers except for one to
three signal words, all from the positive or all from the negative list; the label is
their class. The signal positions are the ground truth of a token attribution. The
counterfactual (for the generic pipeline) swaps each signal word for one of the other
class, which flips the label.
"""

from __future__ import annotations

import torch

from selfrepair.tasks.counterfactual import CounterfactualBatch

N_FILLER, N_SIGNAL, LENGTH = 24, 6, 12


class Classify:
    name = "classify"
    vocab = (
        ["<pad>", "<bos>", "?", "pos", "neg"]
        + [f"f{i}" for i in range(N_FILLER)]
        + [f"p{i}" for i in range(N_SIGNAL)]
        + [f"n{i}" for i in range(N_SIGNAL)]
    )
    n_ctx = LENGTH + 4

    def __init__(self):
        self.id = {w: i for i, w in enumerate(self.vocab)}

    def sample_with_truth(self, n: int, seed: int) -> tuple[CounterfactualBatch, torch.Tensor]:
        """The pairs, and a bool [n, T] mask of the truly relevant (signal) positions."""
        g = torch.Generator().manual_seed(seed)
        f0, p0, n0 = self.id["f0"], self.id["p0"], self.id["n0"]
        words = f0 + torch.randint(0, N_FILLER, (n, LENGTH), generator=g)
        label = torch.randint(0, 2, (n,), generator=g)  # 1: positive
        k = torch.randint(1, 4, (n,), generator=g)
        truth = torch.zeros(n, LENGTH + 2, dtype=torch.bool)
        cf = words.clone()
        for i in range(n):
            where = torch.randperm(LENGTH, generator=g)[: int(k[i])]
            which = torch.randint(0, N_SIGNAL, (int(k[i]),), generator=g)
            own, other = (p0, n0) if label[i] == 1 else (n0, p0)
            words[i, where] = own + which
            cf[i, where] = other + which
            truth[i, where + 1] = True
        bos = torch.full((n, 1), self.id["<bos>"])
        q = torch.full((n, 1), self.id["?"])
        clean = torch.cat([bos, words, q], 1)
        corrupt = torch.cat([bos, cf, q], 1)
        answer = torch.where(label == 1, self.id["pos"], self.id["neg"])
        foil = torch.where(label == 1, self.id["neg"], self.id["pos"])
        pos = torch.full((n,), clean.shape[1] - 1)
        return CounterfactualBatch(clean, corrupt, answer, foil, pos), truth

    def sample(self, n: int, seed: int) -> CounterfactualBatch:
        return self.sample_with_truth(n, seed)[0]
