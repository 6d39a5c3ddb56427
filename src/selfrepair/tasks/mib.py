"""MIB's circuit-track datasets, read offline from a local folder or the Hugging Face cache.

A dataset is a folder of ``*.parquet``, ``*.jsonl`` or ``*.json`` files (a snapshot of
``mib-bench/<name>`` in the hub cache, or any folder given in the config) whose rows
have MIB's fields:

* ``ioi``: clean ``prompt``; counterfactual ``s2_io_flip_counterfactual``; answer
  `` metadata.indirect_object``, foil `` metadata.subject``;
* ``copycolors_mcqa`` and ``arc_easy`` (``arc_challenge``): clean ``prompt``,
  ``choices.label`` and ``answerKey``; counterfactual ``symbol_counterfactual`` with its
  own ``choices``/``answerKey``: answer is the clean answer symbol, foil the
  counterfactual's answer symbol;
* ``arithmetic_addition`` (``arithmetic_subtraction``): clean ``prompt`` and ``label``;
  counterfactual ``random_counterfactual`` with its own ``label``: answer vs foil label.

A counterfactual field is either a prompt string or a dict with ``prompt`` (and, where
the answer comes from it, ``choices``/``answerKey``/``label``). Answers are tokenized
with a leading space and only their first token is kept (MIB's convention). Pairs whose
clean and counterfactual prompts tokenize to different lengths are dropped (edge
patching needs aligned positions); the rest are right-padded per length group, and the
logits are read at each prompt's last token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch

from selfrepair.tasks.counterfactual import CounterfactualBatch

SPECS = {
    "ioi": ("s2_io_flip_counterfactual", "ioi"),
    "copycolors_mcqa": ("symbol_counterfactual", "mcqa"),
    "arc_easy": ("symbol_counterfactual", "mcqa"),
    "arc_challenge": ("symbol_counterfactual", "mcqa"),
    "arithmetic_addition": ("random_counterfactual", "arithmetic"),
    "arithmetic_subtraction": ("random_counterfactual", "arithmetic"),
}


class DatasetNotFound(FileNotFoundError):
    """A MIB dataset is not on this machine."""


def resolve_dataset(name: str, search_paths: list[str] | None = None) -> Path:
    """A local folder for MIB dataset ``name``: under ``search_paths``, or the hub cache
    (:func:`local_files.find_dataset`); DatasetNotFound otherwise (nothing is downloaded)."""
    from selfrepair.core.local_files import find_dataset

    found = find_dataset(name, search_paths)
    if found is None:
        raise DatasetNotFound(
            f"MIB dataset {name!r} not found under {search_paths or []} nor in the local Hugging Face cache "
            "(nothing is downloaded)"
        )
    return found


def read_rows(folder: Path, split: str | None = None) -> pd.DataFrame:
    files = sorted([p for p in Path(folder).rglob("*") if p.suffix in (".parquet", ".jsonl", ".json")])
    if split:
        chosen = [p for p in files if split in p.name or split in p.parent.name]
        files = chosen or files
    if not files:
        raise DatasetNotFound(f"no *.parquet / *.jsonl / *.json files in {folder}")
    frames = []
    for p in files:
        if p.suffix == ".parquet":
            frames.append(pd.read_parquet(p))
        elif p.suffix == ".jsonl":
            frames.append(pd.read_json(p, lines=True))
        else:
            data = json.loads(p.read_text())
            frames.append(pd.DataFrame(data if isinstance(data, list) else data.get("data", [])))
    return pd.concat(frames, ignore_index=True)


def _field(row, key):
    v = row[key] if key in row else None
    return json.loads(v) if isinstance(v, str) and v.startswith("{") else v


def _cf_prompt(cf):
    return cf["prompt"] if isinstance(cf, dict) else cf


def _symbol(d):
    choices = d["choices"]
    key = d["answerKey"]
    labels = choices["label"] if isinstance(choices, dict) else choices
    return labels[int(key)] if not isinstance(key, str) or key.isdigit() else key


def answers(name: str, row) -> tuple[str, str, str, str]:
    """(clean prompt, counterfactual prompt, answer string, foil string) of one row."""
    cf_key, kind = SPECS[name]
    cf = _field(row, cf_key)
    clean, corrupt = row["prompt"], _cf_prompt(cf)
    if kind == "ioi":
        meta = _field(row, "metadata")
        return clean, corrupt, meta["indirect_object"], meta["subject"]
    if kind == "mcqa":
        return clean, corrupt, str(_symbol(row)), str(_symbol(cf))
    return clean, corrupt, str(row["label"]), str(cf["label"])


def load(
    name: str, tokenizer, n: int, search_paths: list[str] | None = None, split: str | None = "test"
) -> CounterfactualBatch:
    """Up to ``n`` aligned counterfactual pairs of MIB dataset ``name``, tokenized."""
    if name not in SPECS:
        raise ValueError(f"unknown MIB dataset {name!r}; one of {sorted(SPECS)}")
    rows = read_rows(resolve_dataset(name, search_paths), split)
    pairs = []
    for _, row in rows.iterrows():
        clean, corrupt, ans, foil = answers(name, row)
        c = tokenizer(clean, add_special_tokens=True)["input_ids"]
        r = tokenizer(corrupt, add_special_tokens=True)["input_ids"]
        a = tokenizer(" " + ans.strip(), add_special_tokens=False)["input_ids"]
        f = tokenizer(" " + foil.strip(), add_special_tokens=False)["input_ids"]
        if len(c) != len(r) or not a or not f or a[0] == f[0]:
            continue
        pairs.append((c, r, a[0], f[0]))
        if len(pairs) >= n:
            break
    if not pairs:
        raise ValueError(f"MIB dataset {name!r}: no usable (aligned) pairs")
    T = max(len(p[0]) for p in pairs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    clean = torch.full((len(pairs), T), pad)
    corrupt = torch.full((len(pairs), T), pad)
    for i, (c, r, _, _) in enumerate(pairs):
        clean[i, : len(c)] = torch.tensor(c)
        corrupt[i, : len(r)] = torch.tensor(r)
    return CounterfactualBatch(
        clean,
        corrupt,
        torch.tensor([p[2] for p in pairs]),
        torch.tensor([p[3] for p in pairs]),
        torch.tensor([len(p[0]) - 1 for p in pairs]),
    )
