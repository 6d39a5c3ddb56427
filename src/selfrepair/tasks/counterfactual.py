"""Shared pieces of paper C's MIB-style toy tasks (clean/counterfactual pairs).

A task is a word vocabulary plus a deterministic generator ``sample(n, seed)`` of
:class:`selfrepair.circuits.CounterfactualBatch` rows whose answer is read at the last
position. ``train_task_model`` trains a small GPT-2 from scratch on the clean prompts
(next-token loss at the answer position only) and saves it with a word-level tokenizer,
so that ``models.load_bridge`` boots it like any local Hugging Face model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..circuits import CounterfactualBatch


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


def accuracy(model, data: CounterfactualBatch) -> float:
    with torch.no_grad():
        logits = model(input_ids=data.clean).logits
    rows = torch.arange(len(data))
    return float((logits[rows, data.pos].argmax(-1) == data.answer).float().mean())


def train_task_model(task, folder, n_layers: int, n_heads: int, d_model: int, d_mlp: int, seed: int, lr: float, batch_size: int, max_steps: int, eval_every: int = 200, target_accuracy: float = 0.99, device: str = "cpu") -> dict:
    """Train a GPT-2 toy on ``task`` and save it (with tokenizer and metadata) in ``folder``."""
    from ..models import build_gpt2_toy, gpt2_toy_config, save_model
    from ..train import train

    cfg = gpt2_toy_config(
        vocab_size=len(task.vocab), n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_mlp=d_mlp, n_ctx=task.n_ctx
    )
    model = build_gpt2_toy(cfg, init="transformers", seed=seed, positional=True)
    held_out = task.sample(500, seed=10_000 + seed)

    def batch_fn(step):
        return lm_batch(task.sample(batch_size, seed=seed * 1_000_003 + step))

    res = train(
        model, batch_fn, lambda m: accuracy(m, held_out), lr=lr, max_steps=max_steps, eval_every=eval_every,
        target_accuracy=target_accuracy, device=device,
    )
    meta = {"task": task.name, "seed": seed, "steps": res.steps, "accuracy": res.final_accuracy, "seconds": res.seconds}
    save_model(model.cpu(), folder, meta)
    save_word_tokenizer(folder, task.vocab)
    return meta


class ToyIOI:
    """Paper B's toy IOI language (``tasks/ioi.py``) as a counterfactual task.

    Counterfactual: MIB's ``s2_io_flip_counterfactual`` (the second subject S2 replaced
    by the indirect object, which makes S the expected answer); answer IO, foil S.
    Trained with paper B's own recipe (``ioi.train_toy``).
    """

    name = "ioi"
    S2_POS = 10  # [BOS] When A and B went to the P , S ...: S2 is the 11th token

    def __init__(self):
        from . import ioi

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

    def train(self, folder, n_layers, n_heads, d_model, d_mlp, seed, lr, batch_size, max_steps, eval_every=250, target_accuracy=0.99, device="cpu") -> dict:
        from ..models import save_model

        model, res = self.ioi.train_toy(n_layers, n_heads, d_model, d_mlp, seed, lr=lr, batch_size=batch_size,
                                        max_steps=max_steps, eval_every=eval_every,
                                        target_accuracy=target_accuracy, device=device)
        meta = {"task": self.name, "seed": seed, "steps": res.steps, "accuracy": res.final_accuracy, "seconds": res.seconds}
        save_model(model.cpu(), folder, meta)
        save_word_tokenizer(folder, self.vocab)
        return meta


def get_task(name: str):
    """A counterfactual task by name: ``mcqa``, ``arithmetic``, ``ioi`` or ``classify``."""
    if name == "mcqa":
        from .mcqa import MCQA

        return MCQA()
    if name == "arithmetic":
        from .arithmetic import Arithmetic

        return Arithmetic()
    if name == "ioi":
        return ToyIOI()
    if name == "classify":
        from .classify import Classify

        return Classify()
    raise ValueError(f"unknown task {name!r}; one of mcqa, arithmetic, ioi, classify")


def train_any(task, folder, **kw) -> dict:
    if hasattr(task, "train"):
        return task.train(folder, **kw)
    return train_task_model(task, folder, **kw)
