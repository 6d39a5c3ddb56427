"""Paper A's tasks: sequence reversal and sorting of integers 1..99.

Tokens: values 1..99, PAD=100, START=101, SEP=102, END=103 (vocabulary 104).
Prompt ``[START] x1..xN [SEP]``, target ``y1..yN [END]``. The decoder input is
prompt + target[:-1]; the loss covers target positions only.

Two padding schemes (a protocol switch, see SPEC.md):
- ``per_batch``: one length per batch, no PAD anywhere (the v3 protocol).
- ``per_example``: the authors' public code: a length per example, each prompt
  right-padded to the batch's longest, so a shorter example has PAD tokens between
  SEP and its target; there is no padding mask. Target PAD positions carry no loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, START, SEP, END = 100, 101, 102, 103
VOCAB = 104
MIN_VALUE, MAX_VALUE = 1, 99
TASKS = ("reverse", "sort")


@dataclass
class Batch:
    """A teacher-forced batch.

    ``tokens`` [B, T] is the decoder input; ``targets`` [B, T] holds the token each
    position must predict, and ``mask`` [B, T] is True exactly at target positions.
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(self.tokens.to(device), self.targets.to(device), self.mask.to(device))

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "targets": self.targets, "mask": self.mask}


def solve(task: str, values: torch.Tensor) -> torch.Tensor:
    """The target values for ``values`` [B, N] (without END)."""
    if task == "reverse":
        return values.flip(-1)
    if task == "sort":
        return values.sort(dim=-1).values
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def sample_values(n: int, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(MIN_VALUE, MAX_VALUE + 1, (n, length), generator=generator)


def make_batch(task: str, values: torch.Tensor) -> Batch:
    """Teacher-forced batch for equal-length ``values`` [B, N] (no padding)."""
    b, n = values.shape
    y = solve(task, values)
    start = torch.full((b, 1), START)
    sep = torch.full((b, 1), SEP)
    end = torch.full((b, 1), END)
    prompt = torch.cat([start, values, sep], dim=1)  # N + 2
    target = torch.cat([y, end], dim=1)  # N + 1
    full = torch.cat([prompt, target], dim=1)  # 2N + 3
    tokens = full[:, :-1]  # 2N + 2
    targets = torch.full_like(tokens, PAD)
    # Position p predicts full[p + 1]; the target begins at index N + 2 of ``full``,
    # so the first target position is the SEP position N + 1.
    targets[:, n + 1 :] = target
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, n + 1 :] = True
    return Batch(tokens, targets, mask)


def make_padded_batch(task: str, lengths: list[int], generator: torch.Generator) -> Batch:
    """The authors' scheme: per-example lengths, prompt right-padded, no padding mask."""
    lmax = max(lengths)
    b = len(lengths)
    t = 2 * lmax + 2
    tokens = torch.full((b, t), PAD)
    targets = torch.full((b, t), PAD)
    mask = torch.zeros((b, t), dtype=torch.bool)
    for i, n in enumerate(lengths):
        x = sample_values(1, n, generator)[0]
        y = solve(task, x[None])[0]
        prompt = torch.cat([torch.tensor([START]), x, torch.tensor([SEP]), torch.full((lmax - n,), PAD)])
        target = torch.cat([y, torch.tensor([END]), torch.full((lmax - n,), PAD)])
        full = torch.cat([prompt, target])
        tokens[i] = full[:-1]
        targets[i, lmax + 1 :] = target
        mask[i, lmax + 1 : lmax + 1 + n + 1] = True
    return Batch(tokens, targets, mask)


def training_batch(
    task: str,
    batch_size: int,
    min_len: int,
    max_len: int,
    generator: torch.Generator,
    padding: str = "per_batch",
) -> Batch:
    """One training batch with lengths uniform in [min_len, max_len]."""
    if padding == "per_batch":
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        return make_batch(task, sample_values(batch_size, n, generator))
    if padding == "per_example":
        lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator).tolist()
        return make_padded_batch(task, lengths, generator)
    raise ValueError(f"unknown padding scheme {padding!r}; expected 'per_batch' or 'per_example'")


def fixed_length_batches(task: str, length: int, n_batches: int, batch_size: int, seed: int) -> list[Batch]:
    """``n_batches`` batches of equal length, deterministic from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [make_batch(task, sample_values(batch_size, length, g)) for _ in range(n_batches)]


def eval_set(task: str, length: int, n: int, seed: int) -> Batch:
    """One batch of ``n`` sequences of one length, for exact-match accuracy."""
    g = torch.Generator().manual_seed(seed)
    return make_batch(task, sample_values(n, length, g))
