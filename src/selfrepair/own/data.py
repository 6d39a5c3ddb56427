"""A dataset file of one's own as counterfactual pairs, a malformed row costing that row.

Two formats, told apart row by row:

* plain: fields ``clean``, ``corrupt``, ``answer`` and ``foil`` (strings), one JSON
  object per line of a ``.jsonl`` file, or the columns of a ``.csv`` file;
* MIB's: the rows of MIB's circuit-track datasets, as :mod:`selfrepair.tasks.mib` reads
  them (``prompt`` and a counterfactual field: ``s2_io_flip_counterfactual`` for IOI,
  ``symbol_counterfactual`` for multiple choice, ``random_counterfactual`` for
  arithmetic), in ``.jsonl``, ``.json`` or ``.parquet`` files or a folder of them.

Pairs are tokenized by MIB's convention (:func:`tasks.mib.pair_ids`). A row that cannot
be read, lacks a field, or whose prompts tokenize to different lengths is dropped and
named (file and row) with its reason; the rest are used, up to ``n`` of them.
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
    """Each line of a JSONL file as a dict, or why it is not one (a string)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
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
        with open(p, newline="") as f:
            rows = list(csv.DictReader(f))
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
                got = "missing" if v is None or isinstance(v, str) else f"{v!r}, not a string"  # "": an empty cell
                raise ValueError(f"{where}: field {k!r} is {got} (plain rows hold clean, corrupt, answer, foil)")
        return tuple(row[k] for k in PLAIN)
    name = next(MIB_FIELDS[k] for k in MIB_FIELDS if k in row)
    if mib.ROW_FILE not in row:
        row = {**row, mib.ROW_FILE: where.rsplit(": row ", 1)[0], mib.ROW_INDEX: where.rsplit(": row ", 1)[-1]}
    return mib.answers(name, row)  # DatasetRowError (a ValueError) naming file, row and field


def load_pairs(path, tokenizer, n: int):
    """(CounterfactualBatch of the first ``n`` usable pairs in file order, [dropped rows:
    "where: why"], usable rows) of a dataset file or folder: every row is checked, so that
    each malformed one is named; NoPairs when no row is usable."""
    from selfrepair.tasks import mib

    pairs, dropped, rows = [], [], read_rows(path)
    for where, row in rows:
        if isinstance(row, str):
            dropped.append(f"{where}: {row}")
            continue
        try:
            got = mib.pair_ids(tokenizer, *texts(where, row))
        except ValueError as err:  # DatasetRowError, or a plain row's field
            msg = str(err)
            dropped.append(msg if msg.startswith(where.split(": row ")[0]) else f"{where}: {msg}")
            continue
        if isinstance(got, str):
            dropped.append(f"{where}: {got}")
            continue
        pairs.append(got)
    if not pairs:
        raise NoPairs(
            f"dataset {path}: no usable pair in {len(rows)} rows" + (f" ({dropped[0]}; ...)" if dropped else "")
        )
    return mib.pairs_batch(pairs[:n], tokenizer), dropped, len(pairs)
