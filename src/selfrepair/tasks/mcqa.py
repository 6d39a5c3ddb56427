"""Multiple-choice symbols, copycolors-style (MIB ``copycolors_mcqa``), as a toy language.

Prompt: ``<bos> c1 A c2 B c3 C ? cq``: three colours, each followed by its answer
symbol (always ``A B C`` in this order), then the question colour ``cq``, one of the
three; the answer is the symbol after ``cq``. The counterfactual keeps the question and
the set of colours and rotates the colours over the slots, so that the symbol of the
right colour changes (MIB's ``symbol_counterfactual`` changes which symbol is right while
the content stays); the foil is the counterfactual's answer.

(A version with shuffled symbols, where the model must copy the token after the
matching colour, needs an induction circuit; at this scale it stayed at chance for
5,000 steps, so the fixed-order version is the workflow's default task.)
"""

from __future__ import annotations

import torch

from selfrepair.tasks.counterfactual import CounterfactualBatch

COLOURS = ["red", "blue", "green", "yellow", "black", "white", "pink", "brown"]
SYMBOLS = ["A", "B", "C"]
N_CHOICES = 3


class MCQA:
    name = "mcqa"
    vocab = ["<pad>", "<bos>", "?"] + COLOURS + SYMBOLS
    n_ctx = 16

    def __init__(self):
        self.id = {w: i for i, w in enumerate(self.vocab)}

    def sample(self, n: int, seed: int) -> CounterfactualBatch:
        g = torch.Generator().manual_seed(seed)
        col = torch.stack([torch.randperm(len(COLOURS), generator=g)[:N_CHOICES] for _ in range(n)])
        q = torch.randint(0, N_CHOICES, (n,), generator=g)
        shift = torch.randint(1, N_CHOICES, (n,), generator=g)
        slots = torch.arange(N_CHOICES)
        col_cf = torch.gather(col, 1, (slots[None, :] + shift[:, None]) % N_CHOICES)
        q_cf = (q - shift) % N_CHOICES  # the slot of the question colour in the counterfactual
        c0, s0 = self.id[COLOURS[0]], self.id[SYMBOLS[0]]
        rows = torch.arange(n)
        cq = col[rows, q]

        def prompt(c):
            t = [torch.full((n,), self.id["<bos>"])]
            for j in range(N_CHOICES):
                t += [c0 + c[:, j], torch.full((n,), s0 + j)]
            t += [torch.full((n,), self.id["?"]), c0 + cq]
            return torch.stack(t, 1)

        clean, corrupt = prompt(col), prompt(col_cf)
        assert bool((col_cf[rows, q_cf] == cq).all())
        pos = torch.full((n,), clean.shape[1] - 1)
        return CounterfactualBatch(clean, corrupt, s0 + q, s0 + q_cf, pos)
