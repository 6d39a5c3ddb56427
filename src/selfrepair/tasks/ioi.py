"""Indirect object identification (IOI): a toy IOI language and GPT-2 small's prompts.

Toy language: every word is one token. Four templates of 14 words, each in ABBA and
BABA order, e.g. ``When {A} and {B} went to the {P} , {S} gave a {O} to`` -> ``{IO}``,
with the 16 names, 8 places and 8 objects of paper B. A sequence is
``[BOS] template answer``; the model is trained as a language model on all
positions, and the IOI metric is logit[IO] - logit[S] at the last prompt position.

``gpt2_prompts`` builds paper B's GPT-2 prompts ("When {IO} and {S} went to the
{place}, {S} gave a {obj} to") with a tokenizer, in one of two styles:

- ``"authors"`` (default): as COAX release 2.1.0 builds them (``ioi_prompts`` in
  ``src/curvgraph/circuits.py``, tokenized by ``tokenizer(prompt)`` in
  ``backup_recovery_full.py`` with the checkpoint's ``AutoTokenizer``): the tokenizer's
  own special tokens (no BOS from GPT-2's, Pythia's or SmolLM2's; BOS first from
  Gemma's, Llama's, OLMo's), ``numpy.random.default_rng(seed)``, per prompt IO and S
  drawn without replacement from the names, then a place, then an object; every drawn
  prompt is kept, IO/S ids are the first token of " " + name. Pass the checkpoint's
  own tokenizer (``core.models.checkpoint_tokenizer``), not a TransformerLens bridge's:
  the bridge reloads a tokenizer that has a BOS token so that it adds it (GPT-2's
  50256, SmolLM2's ``<|im_start|>``). The release's names are all one token in GPT-2's
  tokenizer; a tokenizer that splits some (none of the 16 in SmolLM2's or Gemma-3's) has
  them drawn from its one-token names only (:func:`single_token_names`, logged);
- ``"bos-torch"`` (this project's earlier default): a BOS first, torch's generator,
  names the tokenizer splits left out and prompts of another length skipped.

The name, place and object lists and the template are the release's (the same as
the toy language's). ``TOY_SHAPE`` and ``toy_training`` are the toy model's shape and
training data, for ``core.train.train_gpt2_head_dropout``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from selfrepair.tasks.sequences import Batch

log = logging.getLogger(__name__)

NAMES = [
    "John",
    "Mary",
    "Tom",
    "James",
    "Dan",
    "Sid",
    "Martin",
    "Anna",
    "Paul",
    "Kate",
    "Mark",
    "Lucy",
    "Peter",
    "Sarah",
    "David",
    "Emma",
]
PLACES = ["store", "park", "school", "office", "garden", "station", "market", "library"]
OBJECTS = ["drink", "book", "ball", "ring", "kiss", "snack", "bone", "note"]
TEMPLATES = [
    "When {A} and {B} went to the {P} , {S} gave a {O} to",
    "After {A} and {B} went to the {P} , {S} handed a {O} to",
    "While {A} and {B} were at the {P} , {S} passed a {O} to",
    "Once {A} and {B} walked to the {P} , {S} threw a {O} to",
]
GPT2_TEMPLATE = "When {IO} and {S} went to the {P}, {S} gave a {O} to"
BOS = "<bos>"


def _vocab() -> list[str]:
    words = [BOS]
    for t in TEMPLATES:
        for w in t.split():
            if not w.startswith("{") and w not in words:
                words.append(w)
    return words + NAMES + PLACES + OBJECTS


VOCAB_WORDS = _vocab()
TOKEN = {w: i for i, w in enumerate(VOCAB_WORDS)}
VOCAB = len(VOCAB_WORDS)
PROMPT_LEN = 1 + 14  # BOS + template


@dataclass
class IOIPrompts:
    """Prompts [N, T] (no answer), with the IO and S token ids [N] of each."""

    tokens: torch.Tensor
    io: torch.Tensor
    s: torch.Tensor

    def __len__(self):
        return self.tokens.shape[0]

    def to(self, device) -> "IOIPrompts":
        return IOIPrompts(self.tokens.to(device), self.io.to(device), self.s.to(device))


def sample_toy(n: int, seed: int) -> IOIPrompts:
    """``n`` toy prompts, deterministic from ``seed``; IO != S, ABBA and BABA halves."""
    g = torch.Generator().manual_seed(seed)
    toks, ios, ss = [], [], []
    for i in range(n):
        t = TEMPLATES[int(torch.randint(len(TEMPLATES), (1,), generator=g))]
        a, b = torch.randperm(len(NAMES), generator=g)[:2].tolist()
        io, s = NAMES[a], NAMES[b]
        p = PLACES[int(torch.randint(len(PLACES), (1,), generator=g))]
        o = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=g))]
        first, second = (io, s) if i % 2 == 0 else (s, io)
        words = [BOS] + t.format(A=first, B=second, P=p, S=s, O=o).split()
        toks.append([TOKEN[w] for w in words])
        ios.append(TOKEN[io])
        ss.append(TOKEN[s])
    return IOIPrompts(torch.tensor(toks), torch.tensor(ios), torch.tensor(ss))


def lm_batch(prompts: IOIPrompts) -> Batch:
    """Teacher-forced LM batch of ``prompt + IO``; loss on every position."""
    full = torch.cat([prompts.tokens, prompts.io[:, None]], 1)
    tokens, targets = full[:, :-1], full[:, 1:]
    return Batch(tokens, targets, torch.ones_like(targets, dtype=torch.bool))


def logit_diff(logits: torch.Tensor, prompts: IOIPrompts, reduce: bool = True) -> torch.Tensor:
    """logit[IO] - logit[S] at the last position (mean over prompts when ``reduce``)."""
    last = logits[:, -1, :]
    idx = torch.arange(last.shape[0], device=last.device)
    d = last[idx, prompts.io.to(last.device)] - last[idx, prompts.s.to(last.device)]
    return d.mean() if reduce else d


def accuracy(logits: torch.Tensor, prompts: IOIPrompts) -> float:
    return float((logit_diff(logits, prompts, reduce=False) > 0).float().mean())


# The toy IOI model's shape and training data, for core.train.train_gpt2_head_dropout
TOY_SHAPE = {"vocab_size": VOCAB, "n_ctx": PROMPT_LEN + 1, "bos_token_id": TOKEN[BOS]}


def toy_training(batch_size: int, seed: int, n_val: int = 256):
    """(batch_fn, eval_fn) of a toy IOI model trained with ``seed``: ``batch_fn(step)``,
    ``batch_size`` fresh prompts per step (seed ``seed * 1_000_003 + step``) as an LM
    batch; ``eval_fn(model)``, the IOI accuracy on ``n_val`` held-out prompts (seed
    ``10_000 + seed``), drawn here."""
    val = sample_toy(n_val, seed=10_000 + seed)

    def batch_fn(step):
        return lm_batch(sample_toy(batch_size, seed=seed * 1_000_003 + step))

    def eval_fn(m):
        with torch.no_grad():
            return accuracy(m(input_ids=val.tokens.to(next(m.parameters()).device)).logits.cpu(), val)

    return batch_fn, eval_fn


PROMPT_STYLES = ("authors", "bos-torch")


def gpt2_prompts(tokenizer, n: int, seed: int, style: str = "authors") -> IOIPrompts:
    """Paper B's GPT-2 prompts (IO != S), ``n`` of them, deterministic from ``seed``.

    ``style`` (see the module docstring): ``"authors"``, the COAX release's prompts
    (numpy's ``default_rng``; the text tokenized with the tokenizer's special tokens, as
    the release's ``tokenizer(prompt)`` does: with the checkpoint's own tokenizer, none on
    GPT-2, BOS first where that tokenizer adds it; names it splits are not drawn;
    ValueError when the tokenizer gives the drawn prompts different lengths, as they
    cannot be stacked), or ``"bos-torch"``, this
    project's earlier prompts (BOS, torch's generator, single-token names only).
    """
    if style == "authors":
        return _authors_prompts(tokenizer, n, seed)
    if style == "bos-torch":
        return _bos_torch_prompts(tokenizer, n, seed)
    raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, not {style!r}")


def _first_token(tokenizer, word: str) -> int:
    return tokenizer.encode(" " + word, add_special_tokens=False)[0]


def single_token_names(tokenizer) -> list[str]:
    """The release's names (:data:`NAMES`, in order) that ``tokenizer`` makes one token
    with the leading space they have in the prompts: all 16 in GPT-2's, SmolLM2's and
    Gemma-3's tokenizers."""
    return [w for w in NAMES if len(tokenizer.encode(" " + w, add_special_tokens=False)) == 1]


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer's own call (``tokenizer(text)``, as the release tokenizes)
    puts its BOS token first: False for GPT-2's and SmolLM2's, True for Gemma-3's."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer.encode("When", add_special_tokens=True)[:1] == [bos]


# Each packaged LM's BOS choice for IOI (True: BOS first), measured by benchmarks/ioi_bos.py
# on 3 x 100 "authors" prompts: the convention its own tokenizer's call has, so no choice
# beyond the tokenizer is needed (adds_bos(tokenizer) == MEASURED_BOS[name]). SmolLM2-135M:
# accuracy 1.00 and mean logit difference 4.70 without BOS, 1.00 and 4.39 with <|im_start|>;
# Gemma-3-270M: 1.00 and 4.66 with <bos>, 0.09 and -3.55 without (docs/papers/paper-b.md).
MEASURED_BOS = {"smollm2-135m": False, "gemma-3-270m": True}


def _authors_names(tokenizer) -> list[str]:
    names = single_token_names(tokenizer)
    if len(names) < 2:
        raise ValueError("the tokenizer splits the IOI names; fewer than 2 are one token")
    if len(names) < len(NAMES):
        log.warning(
            "the tokenizer splits %d of the release's %d names (%s): IOI prompts drawn from the other %d",
            len(NAMES) - len(names), len(NAMES), ", ".join(w for w in NAMES if w not in names), len(names),
        )  # fmt: skip
    return names


def _authors_prompts(tokenizer, n: int, seed: int) -> IOIPrompts:
    # The release draws, for each prompt in turn: two distinct names (the first is IO,
    # the second S), one place, one object, all with Generator.choice on its lists;
    # it keeps every prompt and tokenizes the text as the tokenizer's call does, special
    # tokens included (GPT-2's adds none; Llama's, Gemma's, OLMo's put BOS first).
    # Names the tokenizer splits are left out of the list (none on GPT-2: the release's).
    names = _authors_names(tokenizer)
    rng = np.random.default_rng(seed)
    toks, ios, ss = [], [], []
    for _ in range(n):
        i_io, i_s = (int(k) for k in rng.choice(len(names), size=2, replace=False))
        place = PLACES[int(rng.choice(len(PLACES)))]
        obj = OBJECTS[int(rng.choice(len(OBJECTS)))]
        text = GPT2_TEMPLATE.format(IO=names[i_io], S=names[i_s], P=place, O=obj)
        toks.append(tokenizer.encode(text, add_special_tokens=True))
        ios.append(_first_token(tokenizer, names[i_io]))
        ss.append(_first_token(tokenizer, names[i_s]))
    lengths = sorted({len(t) for t in toks})
    if len(lengths) > 1:
        raise ValueError(
            f"prompt style 'authors' keeps every drawn prompt, but this tokenizer gives them "
            f"{len(lengths)} different lengths {lengths}; they cannot be stacked (use style='bos-torch', "
            "which keeps only prompts of one length)"
        )
    return IOIPrompts(torch.tensor(toks), torch.tensor(ios), torch.tensor(ss))


def _bos_torch_prompts(tokenizer, n: int, seed: int) -> IOIPrompts:
    def one(word):
        ids = tokenizer.encode(" " + word, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    names = [w for w in NAMES if one(w) is not None]
    if len(names) < 2:
        raise ValueError("the tokenizer splits the IOI names; cannot build equal-length prompts")
    g = torch.Generator().manual_seed(seed)
    toks, ios, ss = [], [], []
    length = None
    tries = 0
    while len(toks) < n and tries < 50 * n:
        tries += 1
        a, b = torch.randperm(len(names), generator=g)[:2].tolist()
        p = PLACES[int(torch.randint(len(PLACES), (1,), generator=g))]
        o = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=g))]
        text = GPT2_TEMPLATE.format(IO=names[a], S=names[b], P=p, O=o)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id] + ids
        if length is None:
            length = len(ids)
        if len(ids) != length:
            continue
        toks.append(ids)
        ios.append(one(names[a]))
        ss.append(one(names[b]))
    return IOIPrompts(torch.tensor(toks), torch.tensor(ios), torch.tensor(ss))


# GPT-2 small's IOI circuit (Wang et al. 2022), as listed in SPEC.md
GPT2_NAME_MOVERS = ["L9H9", "L10H0", "L9H6"]
GPT2_BACKUP_NAME_MOVERS = ["L10H10", "L10H6", "L10H2", "L10H1", "L11H2", "L9H7", "L9H0", "L11H9"]
GPT2_NEGATIVE_NAME_MOVERS = ["L10H7", "L11H10"]
GPT2_S_INHIBITION = ["L7H3", "L7H9", "L8H6", "L8H10"]
GPT2_INDUCTION = ["L5H5", "L5H8", "L5H9", "L6H9"]
GPT2_DUPLICATE_TOKEN = ["L0H1", "L0H10", "L3H0"]
GPT2_PREVIOUS_TOKEN = ["L2H2", "L4H11"]
