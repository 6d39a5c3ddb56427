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
with a leading space and only their first token is kept (MIB's convention; a
first token that is only the space is skipped, :func:`answer_tokens`). Pairs whose
clean and counterfactual prompts tokenize to different lengths (edge patching needs
aligned positions), or that hold a word the tokenizer does not know, are dropped; the rest are right-padded per length group, and the
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


class DatasetRowError(ValueError):
    """A row of a MIB dataset file lacks a field its dataset needs, or holds it in another
    form; the message names the file, the row and the field."""


SUFFIXES = (".parquet", ".jsonl", ".json")  # a dataset's files
ROW_FILE, ROW_INDEX = "_mib_file", "_mib_row"  # where each row of read_rows came from


def read_rows(folder: Path, split: str | None = None) -> pd.DataFrame:
    """Every row of the dataset's files (``folder`` may be one file; of ``split`` where the file names say), with the
    file and the row's index in it in columns ROW_FILE and ROW_INDEX."""
    folder = Path(folder)
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.suffix in SUFFIXES)
    if split:
        chosen = [p for p in files if split in p.name or split in p.parent.name]
        files = chosen or files
    if not files:
        raise DatasetNotFound(f"no *.parquet / *.jsonl / *.json files in {folder}")
    frames = []
    for p in files:
        if p.suffix != ".parquet" and not p.read_bytes().strip():
            raise DatasetRowError(
                f"{p}: the file is empty: a MIB dataset file holds rows of its dataset's fields. "
                "Copy the dataset's files again (or remove this one)"
            )
        try:
            if p.suffix == ".parquet":
                frame = pd.read_parquet(p)
            elif p.suffix == ".jsonl":
                frame = pd.read_json(p, lines=True)
            else:
                data = json.loads(p.read_text())
                frame = pd.DataFrame(data if isinstance(data, list) else data.get("data", []))
        except Exception as err:  # pyarrow, pandas and json raise several types for a damaged file
            raise DatasetRowError(f"{p}: cannot be read as a MIB dataset file: {err}") from err
        if frame.empty:
            raise DatasetRowError(
                f"{p}: the file is empty (it holds no rows): a MIB dataset file holds rows of its dataset's "
                "fields. Copy the dataset's files again (or remove this one)"
            )
        frames.append(frame.assign(**{ROW_FILE: str(p), ROW_INDEX: range(len(frame))}))
    return pd.concat(frames, ignore_index=True)


def _where(row) -> str:
    return f"{row[ROW_FILE]}: row {row[ROW_INDEX]}" if ROW_FILE in row else "row"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)  # a field absent from one JSON row reads as NaN


def _field(row, key, kinds=None):
    """Field ``key`` of ``row`` (a JSON object stored as a string is decoded), which must
    be present and, when ``kinds`` is given, of one of those types; DatasetRowError
    naming the file, row and field otherwise."""
    v = row[key] if key in row else None
    if isinstance(v, str) and v.startswith("{"):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as err:
            raise DatasetRowError(f"{_where(row)}: field {key!r} is not valid JSON: {err}") from err
    if _missing(v):
        raise DatasetRowError(f"{_where(row)}: field {key!r} is missing")
    if kinds and not isinstance(v, kinds):
        raise DatasetRowError(f"{_where(row)}: field {key!r} is a {type(v).__name__}, not {_kind_names(kinds)}")
    return v


def _kind_names(kinds) -> str:
    names = {str: "a string", dict: "an object", int: "an integer", float: "a number"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _sub(row, key, d: dict, sub: str, kinds=None):
    """``d[sub]``, where ``d`` is field ``key`` of ``row``: present, of ``kinds``."""
    v = d.get(sub) if isinstance(d, dict) else None
    if _missing(v):
        raise DatasetRowError(f"{_where(row)}: field {key + '.' + sub!r} is missing")
    if kinds and not isinstance(v, kinds):
        raise DatasetRowError(
            f"{_where(row)}: field {key + '.' + sub!r} is a {type(v).__name__}, not {_kind_names(kinds)}"
        )
    return v


def _cf_prompt(row, cf_key, cf):
    return cf if isinstance(cf, str) else _sub(row, cf_key, cf, "prompt", (str,))


def _symbol(row, key: str, d) -> str:
    """The answer symbol of the multiple-choice ``d`` (the row itself when key is "")."""
    prefix = f"{key}." if key else ""

    def get(sub):
        return _sub(row, key, d, sub) if key else _field(row, sub)

    choices = get("choices")
    labels = choices.get("label") if isinstance(choices, dict) else choices
    if hasattr(labels, "tolist"):  # a parquet list column reads as a numpy array
        labels = labels.tolist()
    if not isinstance(labels, list) or not labels:
        raise DatasetRowError(f"{_where(row)}: field {prefix + 'choices'!r} has no list of labels")
    answer = get("answerKey")
    if hasattr(answer, "item"):
        answer = answer.item()
    if isinstance(answer, str) and not answer.isdigit():
        if answer not in [str(x) for x in labels]:
            raise DatasetRowError(
                f"{_where(row)}: field {prefix + 'answerKey'!r} is {answer!r}, not one of the labels {labels}"
            )
        return answer
    try:
        i = int(answer)
    except (TypeError, ValueError):
        raise DatasetRowError(
            f"{_where(row)}: field {prefix + 'answerKey'!r} is {answer!r}, neither a label nor an index"
        ) from None
    if not 0 <= i < len(labels):
        raise DatasetRowError(
            f"{_where(row)}: field {prefix + 'answerKey'!r} is {i}, outside the {len(labels)} choices"
        )
    return str(labels[i])


def answers(name: str, row) -> tuple[str, str, str, str]:
    """(clean prompt, counterfactual prompt, answer string, foil string) of one row;
    DatasetRowError naming the file, row and field when the row lacks what ``name``
    needs."""
    cf_key, kind = SPECS[name]
    clean = _field(row, "prompt", (str,))
    cf = _field(row, cf_key, (str, dict))
    corrupt = _cf_prompt(row, cf_key, cf)
    if kind == "ioi":
        meta = _field(row, "metadata", (dict,))
        return (
            clean,
            corrupt,
            _sub(row, "metadata", meta, "indirect_object", (str,)),
            _sub(row, "metadata", meta, "subject", (str,)),
        )
    if not isinstance(cf, dict):
        raise DatasetRowError(
            f"{_where(row)}: field {cf_key!r} is a string; {name} needs an object with its own "
            + ("choices and answerKey" if kind == "mcqa" else "label")
        )
    if kind == "mcqa":
        return clean, corrupt, _symbol(row, "", row), _symbol(row, cf_key, cf)
    label = (str, int, float)
    return clean, corrupt, str(_field(row, "label", label)), str(_sub(row, cf_key, cf, "label", label))


def load(
    name: str,
    tokenizer,
    n: int,
    search_paths: list[str] | None = None,
    split: str | None = "test",
    bos: str = "tokenizer",
) -> CounterfactualBatch:
    """Up to ``n`` aligned counterfactual pairs of MIB dataset ``name``, tokenized (the
    prompts' BOS as ``bos`` says, :data:`BOS_MODES`)."""
    if name not in SPECS:
        raise ValueError(f"unknown MIB dataset {name!r}; one of {sorted(SPECS)}")
    check_bos(bos)
    rows = read_rows(resolve_dataset(name, search_paths), split)
    texts = [answers(name, row) for _, row in rows.iterrows()]  # every row's fields checked before any is used
    pairs = []
    for clean, corrupt, ans, foil in texts:
        ids = pair_ids(tokenizer, clean, corrupt, ans, foil, bos)
        if isinstance(ids, str):
            continue
        pairs.append(ids)
        if len(pairs) >= n:
            break
    if not pairs:
        raise ValueError(f"MIB dataset {name!r}: no usable (aligned) pairs")
    return pairs_batch(pairs, tokenizer)


def answer_tokens(tokenizer, answer: str) -> list[int]:
    """The tokens of `` answer`` by MIB's convention (a leading space, no special tokens;
    :func:`pair_ids` keeps the first), less a first token that is only the space when more
    follow: tokenizers that split digits (SmolLM2, Gemma-3, Qwen2, Llama-3) make " 46" a
    space and the digits, and the answer is read at its first digit."""
    ids = tokenizer(" " + answer.strip(), add_special_tokens=False)["input_ids"]
    if len(ids) > 1 and not tokenizer.decode(ids[:1]).strip():
        ids = ids[1:]
    return ids


# How a prompt's BOS is chosen (config gim.bos): "tokenizer", as the checkpoint's own
# tokenizer's call gives it (Gemma-3's <bos> first, none on GPT-2 or SmolLM2); "mib", as
# MIB's code tokenizes (its tokenize_plus asks TransformerLens for prepend_bos=True): the
# tokenizer's BOS token first, once, whether or not its call adds one (SmolLM2:
# <|im_start|>); a tokenizer without a BOS token gets none under either.
BOS_MODES = ("mib", "tokenizer")


def check_bos(bos: str) -> str:
    """``bos`` if it is one of :data:`BOS_MODES`, else ValueError naming them."""
    if bos not in BOS_MODES:
        raise ValueError(f"unknown bos {bos!r}; one of {BOS_MODES}")
    return bos


def prompt_ids(tokenizer, text: str, bos: str = "tokenizer") -> list[int]:
    """A prompt's tokens with the special tokens the tokenizer puts before the text (a
    BOS), not those it appends after it (an EOS): the logits are read at the prompt's
    last token, which must be the text's. ``bos="mib"``: the tokenizer's BOS token
    first where its call puts none there (:data:`BOS_MODES`)."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    for start in range(len(ids) - len(plain) + 1) if plain else ():
        if ids[start : start + len(plain)] == plain:
            ids = ids[: start + len(plain)]
            break
    first = getattr(tokenizer, "bos_token_id", None)
    if check_bos(bos) == "mib" and first is not None and ids[:1] != [first]:
        ids = [first] + ids
    return ids


def bos_first(tokenizer, bos: str) -> bool:
    """Whether prompts tokenized with ``bos`` (:func:`prompt_ids`) begin with a BOS token:
    what a results table states beside the mode."""
    return prompt_ids(tokenizer, "When", bos)[:1] == [getattr(tokenizer, "bos_token_id", None)]


def unknown_token(tokenizer) -> int | None:
    """The tokenizer's unknown token, where it has one of its own (GPT-2's is its BOS and
    EOS, which no text becomes): the id that text outside its vocabulary becomes."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk in (getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        return None
    return int(unk)


def _unknown_words(tokenizer, text: str, unk: int) -> list[str]:
    """The words (between white space) of ``text`` that become the unknown token, whole or
    in part, by the tokenizer's offsets: not the unknown token's own name written out (a
    word-level vocabulary's first word). Without offsets (a slow tokenizer): '?' for each."""
    import re

    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        pieces = zip(enc["input_ids"], enc["offset_mapping"])
    except (NotImplementedError, KeyError, TypeError):
        return ["?"] * tokenizer(text, add_special_tokens=False)["input_ids"].count(unk)
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    hits = [a for i, (a, b) in pieces if i == unk and text[a:b].strip() != tokenizer.unk_token]
    return list(dict.fromkeys(text[s:e] for a in hits for s, e in spans if s <= a < e))


def pair_ids(tokenizer, clean: str, corrupt: str, answer: str, foil: str, bos: str = "tokenizer"):
    """(clean ids, corrupt ids, answer id, foil id) of one pair by MIB's convention (the
    answers with a leading space, their first token; :func:`answer_tokens`), or why the pair cannot be used (a
    string): prompts of different token lengths, an empty answer, answer and foil alike,
    a word the tokenizer does not know (it would become the unknown token, on a
    word-level tokenizer also its padding: another pair than the one written)."""
    c, r = prompt_ids(tokenizer, clean, bos), prompt_ids(tokenizer, corrupt, bos)
    a, f = answer_tokens(tokenizer, answer), answer_tokens(tokenizer, foil)
    unk = unknown_token(tokenizer)
    if unk is not None:
        for what, text, ids in (("answer", answer, a), ("foil", foil, f), ("clean prompt", clean, c),
                                ("corrupt prompt", corrupt, r)):  # fmt: skip
            if unk in ids and (words := ", ".join(repr(w) for w in _unknown_words(tokenizer, text, unk))):
                return (
                    f"the {what} holds {words}, which the tokenizer does not know (whole or in part it would "
                    f"become the unknown token {tokenizer.unk_token!r}, id {unk})"
                )
    if len(c) != len(r):
        return f"clean and corrupt prompts are {len(c)} and {len(r)} tokens long (edge patching needs equal lengths)"
    if not a or not f:
        return "the answer or the foil is no token"
    if a[0] == f[0]:
        return "the answer and the foil begin with the same token"
    return c, r, a[0], f[0]


def pairs_batch(pairs, tokenizer, pad: int | None = None) -> CounterfactualBatch:
    """The pairs of :func:`pair_ids`, right-padded to the longest (with ``pad``, else the
    tokenizer's padding token, else 0); logits read at each prompt's last token."""
    T = max(len(p[0]) for p in pairs)
    if pad is None:
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
