"""A dataset file of one's own as counterfactual pairs, a malformed row costing that row.

Two formats, told apart row by row:

* plain: fields ``clean``, ``corrupt``, ``answer`` and ``foil`` (strings), one JSON
  object per line of a ``.jsonl`` file, or the columns of a ``.csv`` file;
* MIB's: the rows of MIB's circuit-track datasets, as :mod:`selfrepair.tasks.mib` reads
  them (``prompt`` and a counterfactual field: ``s2_io_flip_counterfactual`` for IOI,
  ``symbol_counterfactual`` for multiple choice, ``random_counterfactual`` for
  arithmetic), in ``.jsonl``, ``.json`` or ``.parquet`` files or a folder of them.

Pairs are tokenized by MIB's convention (:func:`tasks.mib.pair_ids`). A row that cannot
be read, lacks a field, whose prompts tokenize to different lengths, that holds a word
the tokenizer does not know, or a token id the model's embedding does not hold, is
dropped and named (file and row) with its reason; the rest are used, up to ``n`` of them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

PLAIN = ("clean", "corrupt", "answer", "foil")
# MIB's counterfactual field -> a dataset of tasks.mib.SPECS whose row format it is
MIB_FIELDS = {
    "s2_io_flip_counterfactual": "ioi",
    "symbol_counterfactual": "copycolors_mcqa",
    "random_counterfactual": "arithmetic_addition",
}


class NoPairs(ValueError):
    """A dataset file gives no usable pair."""


def _jsonl_rows(path: Path) -> list[dict | str]:
    """Each line of a JSONL file as a dict, or why it is not one (a string). Lines end at
    \\n or \\r\\n only (a U+2028 inside a prompt is no line end); a line that is not UTF-8
    costs that line; a byte order mark is not JSON's and is read past."""
    out = []
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            out.append(
                f"not UTF-8 text (byte 0x{raw[err.start]:02x} at {err.start} of the line): save the file as UTF-8"
            )
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            out.append(f"not valid JSON: {err}")
            continue
        out.append(row if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object")
    return out


def read_rows(path: str | Path) -> list[tuple[str, dict | str]]:
    """(where, row or why it cannot be read) of every row of a dataset file or folder."""
    from selfrepair.tasks import mib

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"dataset {p} does not exist (nothing is downloaded)")
    if p.is_file() and p.suffix == ".jsonl":
        return [(f"{p}: row {i}", r) for i, r in enumerate(_jsonl_rows(p))]
    if p.is_file() and p.suffix == ".csv":
        try:  # utf-8-sig: a spreadsheet's byte order mark is not part of the first column's name
            with open(p, newline="", encoding="utf-8-sig") as f:
                rows = list(csv.DictReader(f))
        except UnicodeDecodeError as err:
            raise NoPairs(f"dataset {p} is not UTF-8 text ({err}): save it as UTF-8") from None
        return [
            (f"{p}: row {i}", r if None not in r else "more cells than the header names") for i, r in enumerate(rows)
        ]
    frame = mib.read_rows(p, split=None)  # .json, .parquet, a folder of MIB files
    return [(f"{r[mib.ROW_FILE]}: row {r[mib.ROW_INDEX]}", r.to_dict()) for _, r in frame.iterrows()]


def texts(where: str, row: dict) -> tuple[str, str, str, str]:
    """(clean, corrupt, answer, foil) of one row of either format; ValueError naming the
    row and the field otherwise."""
    from selfrepair.tasks import mib

    if "clean" in row or not any(k in row for k in MIB_FIELDS):
        for k in PLAIN:
            v = row.get(k)
            if not isinstance(v, str) or not v.strip():
                got = "missing" if v is None else "empty" if isinstance(v, str) else f"{v!r}, not a string"
                raise ValueError(f"{where}: field {k!r} is {got} (plain rows hold clean, corrupt, answer, foil)")
        return tuple(row[k] for k in PLAIN)
    name = next(MIB_FIELDS[k] for k in MIB_FIELDS if k in row)
    if mib.ROW_FILE not in row:
        row = {**row, mib.ROW_FILE: where.rsplit(": row ", 1)[0], mib.ROW_INDEX: where.rsplit(": row ", 1)[-1]}
    return mib.answers(name, row)  # DatasetRowError (a ValueError) naming file, row and field


def _beyond(pair, vocab_size: int | None) -> int | None:
    """The largest token id of a pair that the model's embedding (``vocab_size`` rows)
    does not hold, else None."""
    top = max(max(pair[0]), max(pair[1]), pair[2], pair[3])
    return top if vocab_size is not None and top >= vocab_size else None


def _pad(tokenizer, vocab_size: int | None) -> int:
    """The padding id: the tokenizer's padding token where the model's embedding holds it
    (one added to the tokenizer may not), else 0 (no position after a prompt is read)."""
    t = tokenizer.pad_token_id
    return int(t) if t is not None and (vocab_size is None or t < vocab_size) else 0


def _several_tokens(tokenizer, texts_used: list[tuple[str, str]]) -> list[str]:
    """A note when answers or foils of the pairs used are several tokens long: their first
    token is read (MIB's convention)."""
    from selfrepair.tasks.mib import answer_tokens

    n = sum(1 for a, f in texts_used if len(answer_tokens(tokenizer, a)) > 1 or len(answer_tokens(tokenizer, f)) > 1)
    if not n:
        return []
    return [f"{n} pairs have an answer or foil of several tokens: their first token is read (MIB's convention)"]


def load_pairs(path, tokenizer, n: int, vocab_size: int | None = None, bos: str = "tokenizer"):
    """(CounterfactualBatch of the first ``n`` usable pairs in file order, [dropped rows:
    "where: why"], usable rows, [notes]) of a dataset file or folder: every row is
    checked, so that each malformed one is named; NoPairs when no row is usable. A row
    with a word the tokenizer does not know, or (given the model's ``vocab_size``) a
    token id the model's embedding does not hold, is dropped too; the notes say when
    answers of several tokens were cut to their first. ``bos``: the prompts' BOS
    (:data:`tasks.mib.BOS_MODES`)."""
    from selfrepair.tasks import mib

    pairs, used, dropped, rows = [], [], [], read_rows(path)
    for where, row in rows:
        if isinstance(row, str):
            dropped.append(f"{where}: {row}")
            continue
        try:
            got = mib.pair_ids(tokenizer, *(t := texts(where, row)), bos=bos)
        except ValueError as err:  # DatasetRowError, or a plain row's field
            msg = str(err)
            dropped.append(msg if msg.startswith(where.split(": row ")[0]) else f"{where}: {msg}")
            continue
        if isinstance(got, str):
            dropped.append(f"{where}: {got}")
        elif (top := _beyond(got, vocab_size)) is not None:
            dropped.append(
                f"{where}: token id {top} ({tokenizer.convert_ids_to_tokens(top)!r}) is beyond the model's embedding "
                f"of {vocab_size} tokens: the tokenizer has {len(tokenizer)} (one extended without resizing the "
                "model's embedding, model.resize_token_embeddings, or another model's?)"
            )
        else:
            pairs.append(got)
            used.append((t[2], t[3]))
    if not pairs:
        raise NoPairs(
            f"dataset {path}: no usable pair in {len(rows)} rows" + (f" ({dropped[0]}; ...)" if dropped else "")
        )
    batch = mib.pairs_batch(pairs[:n], tokenizer, pad=_pad(tokenizer, vocab_size))
    return batch, dropped, len(pairs), _several_tokens(tokenizer, used[:n])
