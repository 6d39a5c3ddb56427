"""Addition of two numbers 0..19 (MIB ``arithmetic_addition``), as a toy language.

Prompt: ``<bos> a + b =``; the answer is the token of a + b (0..38). The counterfactual
(MIB's ``random_counterfactual``) draws other operands whose sum differs; the foil is
the counterfactual's sum.
"""

from __future__ import annotations

import torch

from selfrepair.tasks.counterfactual import CounterfactualBatch

N = 20


class Arithmetic:
    name = "arithmetic"
    vocab = ["<pad>", "<bos>", "+", "="] + [f"n{i}" for i in range(N)] + [f"s{i}" for i in range(2 * N - 1)]
    n_ctx = 8

    def __init__(self):
        self.id = {w: i for i, w in enumerate(self.vocab)}

    def sample(self, n: int, seed: int) -> CounterfactualBatch:
        g = torch.Generator().manual_seed(seed)
        a = torch.randint(0, N, (n,), generator=g)
        b = torch.randint(0, N, (n,), generator=g)
        a2 = torch.randint(0, N, (n,), generator=g)
        b2 = torch.randint(0, N, (n,), generator=g)
        same = (a2 + b2) == (a + b)
        b2 = torch.where(same, (b2 + 1) % N, b2)
        same = (a2 + b2) == (a + b)  # b2 wrapped from N-1 to 0 with a2 + b2 = a + b: shift a2
        a2 = torch.where(same, (a2 + 1) % N, a2)
        n0, s0 = self.id["n0"], self.id["s0"]

        def prompt(x, y):
            ones = torch.ones_like(x)
            return torch.stack([ones * self.id["<bos>"], n0 + x, ones * self.id["+"], n0 + y, ones * self.id["="]], 1)

        clean, corrupt = prompt(a, b), prompt(a2, b2)
        pos = torch.full((n,), clean.shape[1] - 1)
        return CounterfactualBatch(clean, corrupt, s0 + a + b, s0 + a2 + b2, pos)
