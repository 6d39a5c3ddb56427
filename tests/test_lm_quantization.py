"""The packaged LMs' quantization per tensor group (tooling/lm_quantization.py), read from a
tiny GGUF file written here (tests/tiny_gguf.py) whose types and sizes are known."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny_gguf  # noqa: E402
from selfrepair.tooling import lm_quantization as Q  # noqa: E402


def test_group_name_leaves_out_the_block_number():
    assert Q.group_name("blk.17.attn_q.weight") == "blk.*.attn_q.weight"
    assert Q.group_name("token_embd.weight") == "token_embd.weight"
    assert Q.group_name("output_norm.weight") == "output_norm.weight"


def test_tensor_groups_of_a_tiny_file(tmp_path):
    from gguf import GGMLQuantizationType

    # file type 3 (llama.cpp's MOSTLY_Q4_1); the embedding (the first 2-D weight) stored as Q8_0
    path = tiny_gguf.write(tiny_gguf.llama(), tmp_path / "t.gguf", file_type=3, tensor_type=GGMLQuantizationType.Q8_0)
    t = Q.tensor_groups(path, "tiny").set_index("group")
    assert list(t.columns) == ["model", "file_quantization", "type", "tensors", "parameters"]
    assert set(t["file_quantization"]) == {"Q4_1"} and set(t["model"]) == {"tiny"}
    vocab = len(tiny_gguf.BPE_TOKENS)
    assert tuple(t.loc["token_embd.weight", ["type", "tensors", "parameters"]]) == ("Q8_0", 1, vocab * 32)
    # 2 layers; hidden 32, 4 query heads and 2 key/value heads of 8, MLP 48
    assert tuple(t.loc["blk.*.attn_q.weight", ["type", "tensors", "parameters"]]) == ("F32", 2, 2 * 32 * 32)
    assert tuple(t.loc["blk.*.attn_k.weight", ["type", "tensors", "parameters"]]) == ("F32", 2, 2 * 16 * 32)
    assert tuple(t.loc["blk.*.ffn_down.weight", ["type", "tensors", "parameters"]]) == ("F32", 2, 2 * 48 * 32)
    assert tuple(t.loc["output_norm.weight", ["type", "tensors", "parameters"]]) == ("F32", 1, 32)
    assert "output.weight" not in t.index  # tied embeddings: no output matrix
    md = Q.summary_markdown(t.reset_index())
    assert f"| tiny | Q4_1 | `token_embd`: Q8_0 (1) | {vocab * 32:,} |" in md.splitlines()


def test_a_group_stored_in_two_types_has_a_row_per_type():
    import pandas as pd

    rows = [["m", "Q4_K_M", "blk.*.ffn_down.weight", "Q6_K", 9, 900], ["m", "Q4_K_M", "blk.*.ffn_down.weight", "Q4_K", 9, 900],
            ["m", "Q4_K_M", "blk.*.ffn_up.weight", "Q5_0", 18, 2000]]  # fmt: skip
    md = Q.summary_markdown(pd.DataFrame(rows, columns=Q.COLUMNS)).splitlines()
    assert md[2:] == ["| m | Q4_K_M | `blk.*.ffn_up`: Q5_0 (18) | 2,000 |",
                      "| m | Q4_K_M | `blk.*.ffn_down`: Q4_K (9), Q6_K (9) | 1,800 |"]  # fmt: skip


def test_not_a_gguf_file_is_refused(tmp_path):
    from selfrepair.core.gguf_files import BadGGUF

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(BadGGUF, match="not a GGUF file"):
        Q.tensor_groups(bad, "x")
