"""What the packaged real LMs' weights are: each GGUF file's quantization type per tensor
group, read from the file itself (``gguf``'s reader). The packaged files are llama.cpp
quantizations (SmolLM2 Q4_1, Gemma-3 Q4_K_M), which ``lm_convert`` expands to float32:
the models the workflow runs are these quantized weights, not the released bf16 ones.

    python -m selfrepair.tooling.lm_quantization --out results/reference/real_lms_quantization.csv

A tensor group is a tensor's name with its block number left out (``blk.7.attn_q.weight``
is the group ``blk.*.attn_q.weight``); a group whose blocks are stored in several types
has a row per type.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pandas as pd

COLUMNS = ["model", "file_quantization", "group", "type", "tensors", "parameters"]
_BLOCK = re.compile(r"^blk\.\d+\.")


def group_name(tensor: str) -> str:
    """The tensor group of a GGUF tensor name: its block number replaced by ``*``."""
    return _BLOCK.sub("blk.*.", tensor)


def tensor_groups(path: str | Path, model: str) -> pd.DataFrame:
    """:data:`COLUMNS` of one GGUF file: per (tensor group, ggml type) the number of
    tensors and of parameters, and the file's own quantization name (``general.file_type``);
    BadGGUF for a file that is not GGUF or is cut short (:func:`gguf_files.gguf_info`)."""
    from gguf import GGUFReader

    from selfrepair.core.gguf_files import gguf_info

    info = gguf_info(path)  # checks the file first, with a clear error
    counts: dict[tuple[str, str], list[int]] = {}
    for t in GGUFReader(str(path)).tensors:
        c = counts.setdefault((group_name(t.name), t.tensor_type.name), [0, 0])
        c[0] += 1
        c[1] += int(t.n_elements)
    rows = [[model, info["quantization"], g, k, n, p] for (g, k), (n, p) in counts.items()]
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["group", "type"], ignore_index=True)


def packaged_table(names=None) -> pd.DataFrame:
    """:func:`tensor_groups` of every packaged model's GGUF (``core.packaged_lms``), the
    chunked ones joined in a temporary folder and every file checked against its pinned
    SHA-256."""
    from selfrepair.core import packaged_lms

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or packaged_lms.PACKAGED:
            out.append(tensor_groups(packaged_lms.packaged_gguf(name, tmp), name))
    return pd.concat(out, ignore_index=True)


def summary_markdown(t: pd.DataFrame) -> str:
    """Per model: the file's quantization, and each tensor group's type(s) with the number
    of tensors in each, the largest groups (by parameters) first; groups of the same types
    are listed together."""
    from selfrepair.tooling.real_lms_table import MODEL_LABELS

    lines = ["| model | file | tensor groups and their types (tensors) | parameters |", "|---|---|---|---|"]
    for model, m in t.groupby("model", sort=False):
        kinds = m.groupby("group").apply(
            lambda g: ", ".join(f"{r.type} ({r.tensors})" for r in g.sort_values("type").itertuples()),
            include_groups=False,
        )
        size = m.groupby("group")["parameters"].sum()
        by_kind: dict[str, list[str]] = {}
        for g in size.sort_values(ascending=False, kind="stable").index:
            by_kind.setdefault(kinds[g], []).append(f"`{g.removesuffix('.weight')}`")
        for kind, groups in by_kind.items():
            n = int(size[[g for g in size.index if kinds[g] == kind]].sum())
            lines.append(
                f"| {MODEL_LABELS.get(model, model)} | {m['file_quantization'].iloc[0]} | "
                f"{', '.join(groups)}: {kind} | {n:,} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="the packaged real LMs' quantization per tensor group, from their GGUFs")
    p.add_argument("--out", type=Path, required=True, help="the CSV to write")
    a = p.parse_args(argv)
    t = packaged_table()
    t.to_csv(a.out, index=False)
    print(f"{a.out}: {t['model'].nunique()} models, {len(t)} (group, type) rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
