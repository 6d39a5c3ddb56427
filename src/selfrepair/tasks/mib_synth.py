"""MIB-format counterfactual datasets made here, deterministic from a seed: stand-ins for
MIB's circuit-track datasets (which cannot be downloaded on this project's machines), in
the row format :mod:`selfrepair.tasks.mib` reads, so ``mib.load`` reads them as MIB's.

* ``ioi``: Wang et al.-style templates (``When {IO} and {S} went to the {place}, {S}
  gave a {object} to``, ABBA and BABA orders); counterfactual
  ``s2_io_flip_counterfactual``: the second mention of the subject replaced by the
  indirect object (the answer flips); ``metadata.indirect_object`` / ``metadata.subject``;
* ``copycolors_mcqa``: MIB's copy-colours question (``Question: Bananas are yellow. What
  color are bananas?`` with choices A-D and ``Answer:``), ``answerKey`` the index of
  the right colour; ``symbol_counterfactual``: the same question and colours with the
  labels rotated, so the right colour carries another letter;
* ``arithmetic_addition``: three fixed worked examples, then ``{a}+{b}=`` of two-digit
  operands (sums below 100), ``label`` the sum (zero-shot, both LMs were at chance:
  0.48 on 50 held-out prompts; with the examples 0.70 SmolLM2, 0.82 Gemma-3); ``random_counterfactual``: another random problem whose sum's
  first digit differs (the answers are read at their first digit: MIB's first-token
  convention, :func:`selfrepair.tasks.mib.pair_ids`).

Names, colours and letters are single tokens (with a leading space) in SmolLM2's and
Gemma-3's tokenizers; every clean prompt and its counterfactual have the same words, so
they tokenize to the same length. :func:`write` puts ``test.jsonl`` (scored and
patched) and ``validation.jsonl`` (held out: the accuracy gate) in ``<out>/<task>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TASKS = ("ioi", "copycolors_mcqa", "arithmetic_addition")
CHANCE = {"ioi": 0.5, "copycolors_mcqa": 0.25, "arithmetic_addition": 0.5}  # answer vs foil; MCQA: 1 of 4

NAMES = ["John", "Mary", "Tom", "James", "Paul", "Mark", "Peter", "David", "Sarah", "Anna", "Kate", "Emma",
         "Michael", "Robert", "Lisa", "Daniel", "Laura", "Steve", "Jack", "George"]  # fmt: skip
PLACES = ["store", "park", "school", "office", "garden", "station", "market", "library", "beach", "restaurant"]
OBJECTS = ["drink", "book", "ball", "ring", "snack", "letter", "bag", "gift", "key", "phone"]
IOI_TEMPLATES = [
    "When {A} and {B} went to the {P}, {S} gave a {O} to",
    "After {A} and {B} went to the {P}, {S} handed a {O} to",
    "While {A} and {B} were at the {P}, {S} passed a {O} to",
    "Then, {A} and {B} had a long day at the {P}. {S} gave a {O} to",
    "Friends {A} and {B} found a {O} at the {P}. {S} gave the {O} to",
]
NOUNS = {  # plural noun: its usual colour
    "bananas": "yellow", "strawberries": "red", "leaves": "green", "crows": "black", "clouds": "white",
    "carrots": "orange", "oceans": "blue", "lemons": "yellow", "tomatoes": "red", "frogs": "green",
    "coal pieces": "black", "snowflakes": "white", "pumpkins": "orange", "blueberries": "blue",
    "flamingos": "pink", "elephants": "gray", "chocolate bars": "brown", "eggplants": "purple",
}  # fmt: skip
COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "brown", "pink", "gray", "purple"]
LABELS = ["A", "B", "C", "D"]
FEW_SHOT = "10+13=23\n21+34=55\n42+15=57\n"  # the addition prompts' worked examples
SEED_OFFSET = {"test": 0, "validation": 1_000_003}  # the two splits never share a draw


def ioi_row(rng: np.random.Generator) -> dict:
    """One IOI row: IO and S distinct names, a template in ABBA or BABA order."""
    io, s = rng.choice(NAMES, 2, replace=False).tolist()
    t = IOI_TEMPLATES[int(rng.integers(len(IOI_TEMPLATES)))]
    place, obj = str(rng.choice(PLACES)), str(rng.choice(OBJECTS))
    a, b = (io, s) if rng.integers(2) else (s, io)
    clean = t.format(A=a, B=b, P=place, S=s, O=obj)
    flip = t.format(A=a, B=b, P=place, S=io, O=obj)
    return {"prompt": clean, "s2_io_flip_counterfactual": flip, "metadata": {"indirect_object": io, "subject": s}}


def _mcqa_prompt(noun: str, colors: list[str], labels: list[str]) -> str:
    lines = [f"Question: {noun.capitalize()} are {NOUNS[noun]}. What color are {noun}?"]
    lines += [f"{label}. {c}" for label, c in zip(labels, colors)]
    return "\n".join(lines + ["Answer:"])


def mcqa_row(rng: np.random.Generator) -> dict:
    """One copy-colours row: the noun's colour among 4 distinct colours; the counterfactual
    rotates the labels by 1-3 places (same colours, the right one under another letter)."""
    noun = str(rng.choice(sorted(NOUNS)))
    others = [c for c in COLORS if c != NOUNS[noun]]
    colors = [NOUNS[noun], *rng.choice(others, 3, replace=False).tolist()]
    order = rng.permutation(4)
    colors = [colors[i] for i in order]
    key = colors.index(NOUNS[noun])
    shift = int(rng.integers(1, 4))
    cf_labels = LABELS[shift:] + LABELS[:shift]
    cf_choices = {"label": cf_labels, "text": colors}
    return {
        "prompt": _mcqa_prompt(noun, colors, LABELS),
        "choices": {"label": list(LABELS), "text": colors},
        "answerKey": key,
        "symbol_counterfactual": {
            "prompt": _mcqa_prompt(noun, colors, cf_labels),
            "choices": cf_choices,
            "answerKey": key,
        },  # fmt: skip
    }


def arithmetic_row(rng: np.random.Generator) -> dict:
    """One addition row: operands 10-49; the counterfactual's sum has another tens digit."""
    a, b = (int(x) for x in rng.integers(10, 50, 2))
    while True:
        c, d = (int(x) for x in rng.integers(10, 50, 2))
        if str(c + d)[0] != str(a + b)[0]:
            break
    return {
        "prompt": f"{FEW_SHOT}{a}+{b}=",
        "label": a + b,
        "random_counterfactual": {"prompt": f"{FEW_SHOT}{c}+{d}=", "label": c + d},
    }


ROWS = {"ioi": ioi_row, "copycolors_mcqa": mcqa_row, "arithmetic_addition": arithmetic_row}


def rows(task: str, n: int, seed: int, split: str = "test") -> list[dict]:
    """``n`` rows of ``task``, deterministic from (``seed``, ``split``)."""
    if task not in ROWS:
        raise ValueError(f"unknown task {task!r}; one of {TASKS}")
    rng = np.random.default_rng(seed + SEED_OFFSET[split])
    return [ROWS[task](rng) for _ in range(n)]


def write(out, tasks, n: int, seed: int) -> list[Path]:
    """``<out>/<task>/{test,validation}.jsonl`` of ``n`` rows each; the files written."""
    files = []
    for task in tasks:
        folder = Path(out) / task
        folder.mkdir(parents=True, exist_ok=True)
        for split in SEED_OFFSET:
            path = folder / f"{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows(task, n, seed, split)))
            files.append(path)
    return files
