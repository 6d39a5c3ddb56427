"""Shared pieces of paper C's MIB-style toy tasks (clean/counterfactual pairs).

:class:`CounterfactualBatch` is the data container of every counterfactual dataset
(the toy tasks here and MIB's, ``tasks.mib``). A task is a word vocabulary plus a
deterministic generator ``sample(n, seed)`` of ``CounterfactualBatch`` rows whose
answer is read at the last position; ``tasks.registry.get_task`` names them. Training a model on a
task is paper C's (``selfrepair.gim.training``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class CounterfactualBatch:
    """A generic counterfactual dataset: clean and corrupted tokens of equal shape, the
    answer and foil ids, and the position (per row) whose logits are read."""

    clean: torch.Tensor
    corrupt: torch.Tensor
    answer: torch.Tensor
    foil: torch.Tensor
    pos: torch.Tensor

    def __len__(self):
        return self.clean.shape[0]

    def slice(self, a, b) -> "CounterfactualBatch":
        return CounterfactualBatch(self.clean[a:b], self.corrupt[a:b], self.answer[a:b], self.foil[a:b], self.pos[a:b])

    def save(self, path):
        from selfrepair.core.runtime import save_tensors

        save_tensors(path, dict(self.__dict__))

    @classmethod
    def load(cls, path) -> "CounterfactualBatch":
        """Load a file written by ``save`` safely (``weights_only=True``: tensors only, no
        pickled code). FileNotFoundError / ValueError naming the path when missing or bad."""
        from selfrepair.core.runtime import load_tensors

        d = load_tensors(path)  # FileNotFoundError or ValueError, naming the path
        fields = ("clean", "corrupt", "answer", "foil", "pos")
        if not isinstance(d, dict) or set(d) != set(fields):
            got = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{path} is not a saved CounterfactualBatch: expected keys {list(fields)}, got {got}")
        return cls(**d)

    def to(self, device) -> "CounterfactualBatch":
        return CounterfactualBatch(
            *(t.to(device) for t in (self.clean, self.corrupt, self.answer, self.foil, self.pos))
        )

    def batches(self, size: int, device=None):
        """Consecutive slices of ``size`` rows; on ``device`` (the model's) where given."""
        for a in range(0, len(self), size):
            b = self.slice(a, a + size)
            yield b if device is None else b.to(device)


@dataclass
class LMBatch:
    tokens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def to(self, device):
        return LMBatch(self.tokens.to(device), self.targets.to(device), self.mask.to(device))


def save_word_tokenizer(folder: str | Path, vocab: list[str]) -> None:
    """A word-level fast tokenizer for ``vocab`` (index = token id), saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token=vocab[0], pad_token=vocab[0], bos_token=vocab[1], eos_token=vocab[1]
    ).save_pretrained(str(folder))


def lm_batch(data: CounterfactualBatch) -> LMBatch:
    """Next-token targets of the clean prompts: only the answer position is trained."""
    tokens = data.clean
    targets = torch.zeros_like(tokens)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    rows = torch.arange(tokens.shape[0])
    targets[rows, data.pos] = data.answer
    mask[rows, data.pos] = True
    return LMBatch(tokens, targets, mask)


class ToyIOI:
    """Paper B's toy IOI language (``tasks/ioi.py``) as a counterfactual task.

    Counterfactual: MIB's ``s2_io_flip_counterfactual`` (the second subject S2 replaced
    by the indirect object, which makes S the expected answer); answer IO, foil S.
    Trained with paper B's own recipe (``selfrepair.core.train.train_gpt2_head_dropout`` on
    ``selfrepair.tasks.ioi.toy_training``, as ``gim.training.train_toy_ioi`` does).
    """

    name = "ioi"
    S2_POS = 10  # [BOS] When A and B went to the P , S ...: S2 is the 11th token

    def __init__(self):
        from selfrepair.tasks import ioi

        self.ioi = ioi
        self.vocab = list(ioi.VOCAB_WORDS)
        self.n_ctx = ioi.PROMPT_LEN + 1

    def sample(self, n: int, seed: int) -> CounterfactualBatch:
        p = self.ioi.sample_toy(n, seed)
        clean = p.tokens
        if not bool((clean[:, self.S2_POS] == p.s).all()):
            raise RuntimeError("toy IOI templates changed: S2 is no longer at position 10")
        corrupt = clean.clone()
        corrupt[:, self.S2_POS] = p.io
        pos = torch.full((n,), clean.shape[1] - 1)
        return CounterfactualBatch(clean, corrupt, p.io, p.s, pos)
