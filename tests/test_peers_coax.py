"""Paper B beside the COAX authors' release on a real LM: the committed table
(results/reference/benchmark_peers_coax_lm.csv, from peers/coax_lm.py) and its
page (docs/results/peers-coax.md) in step, and what the table says held to its claim.
CI has no peer environment: nothing is rerun here; the script's own pieces that need no
peer (the model-folder adapter, the agreement arithmetic) are tested on small inputs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from selfrepair.tooling import peers_table

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "reference" / "benchmark_peers_coax_lm.csv"
PAGE = ROOT / "docs" / "results" / "peers-coax.md"


@pytest.fixture(scope="module")
def table():
    return pd.read_csv(TABLE)


@pytest.fixture(scope="module")
def bench():
    """peers/coax_lm.py, loaded by its path under a name of its own (scripts/coax_lm.py, rule
    coax_lm's script, is a module ``coax_lm`` too)."""
    sys.path.insert(0, str(ROOT / "peers"))  # its peer_harness
    spec = importlib.util.spec_from_file_location("peers_coax_lm", ROOT / "peers" / "coax_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_is_the_committed_table(table):
    assert peers_table.coax_problems(table, PAGE.read_text()) == []


def test_a_changed_figure_or_a_stale_block_is_caught(table):
    page = PAGE.read_text()
    quoted = peers_table.coax_quoted(table)
    figure = quoted["largest relative difference of a score"]
    assert figure in page
    assert any(
        "largest relative difference" in p for p in peers_table.coax_problems(table, page.replace(figure, "9.9e-01"))
    )
    moved = table.copy()
    moved.loc[moved["score"] == "comp", "wall_ours"] *= 2  # the block now renders another number
    assert any("block" in p for p in peers_table.coax_problems(moved, page))
    assert any("mean load" in p for p in peers_table.coax_problems(table.assign(load=table["load"] + 1.0), page))


def test_the_table_holds_what_the_page_says(table):
    """Every score the release computes, within 1e-4 of its largest magnitude, the same
    order and the same AUC; the same prompts token for token; ours at least as fast."""
    s = table[table["score"] != "logits"]
    assert set(s["score"]) == set(peers_table_scores())
    assert (s["max_rel_diff"] < 1e-4).all()
    assert (s["spearman"] > 0.9999).all()
    assert (s["top_k_same"] == s["top_k"]).all()
    assert np.allclose(s["auc_ours"], s["auc_theirs"], rtol=0, atol=1e-9)
    logits = table[table["score"] == "logits"].iloc[0]
    assert logits["max_rel_diff"] < 1e-6
    r = table.iloc[0]
    assert r["prompts_compared"] > 0 and r["prompts_differ_gpt2_prompts"] == 0 and r["prompts_differ_lm_prompts"] == 0
    assert bool(r["data_prompts_identical"])
    assert (s["wall_ratio"] <= 1.0).all() and (s["cpu_ratio"] <= 1.0).all()
    assert table["commit"].nunique() == 1 and len(r["peer_commit"]) == 40


def peers_table_scores():
    return (
        "single",
        "cond",
        "comp",
        "amp_ratio",
        "atp_mag",
        "cond_grad",
        "atp_2s",
        "eap_ig",
        "atp_star",
        "atp_star_2s",
    )


def test_the_script_compares_every_score_the_table_has(bench):
    assert tuple(bench.SCORES) == peers_table_scores()
    assert set(bench.TIMED_AS) == set(bench.SCORES)


def test_adapter_changes_exactly_two_fields(bench, tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    cfg = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "x": 1}
    tc = {"tokenizer_class": "TokenizersBackend", "bos_token": "<s>"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    (src / "model.safetensors").write_bytes(b"weights")
    dest = bench.adapted_folder(src, tmp_path / "adapted")
    got_cfg = json.loads((dest / "config.json").read_text())
    got_tc = json.loads((dest / "tokenizer_config.json").read_text())
    assert got_cfg == {**cfg, "rope_theta": 100000.0}
    assert got_tc == {**tc, "tokenizer_class": "PreTrainedTokenizerFast"}
    assert (dest / "model.safetensors").is_symlink() and (dest / "model.safetensors").read_bytes() == b"weights"
    # a folder transformers 4 already reads is passed through unchanged
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2", "rope_theta": 5.0}))
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    dest = bench.adapted_folder(src, tmp_path / "again")
    assert json.loads((dest / "config.json").read_text()) == {"model_type": "gpt2", "rope_theta": 5.0}
    assert json.loads((dest / "tokenizer_config.json").read_text()) == {"tokenizer_class": "GPT2Tokenizer"}


def test_compare_worked_out_by_hand(bench):
    units = ["a", "b", "c", "d"]
    mine = {"a": 4.0, "b": 3.0, "c": 1.0, "d": 2.0}
    theirs = [4.0, 2.9, 1.1, 2.0]  # largest |theirs| 4.0, largest difference 0.1
    got = bench.compare(mine, theirs, units, [1, 1, 0, 0], k=2)
    assert got["max_abs_diff"] == pytest.approx(0.1)
    assert got["max_rel_diff"] == pytest.approx(0.1 / 4.0)
    assert got["spearman"] == pytest.approx(1.0)  # same order
    assert got["top_k_same"] == 2 and got["auc_ours"] == pytest.approx(1.0)
    swapped = bench.compare(mine, [4.0, 2.9, 3.5, 2.0], units, [1, 1, 0, 0], k=2)  # c now above b
    assert swapped["top_k_same"] == 1
    assert swapped["spearman"] == pytest.approx(0.4)  # ranks (4,3,1,2) vs (4,2,3,1): 1 - 6 * 6 / (4 * 15)


def test_seconds_fewest_round_of_the_calls_together(bench):
    rounds = [
        {"x": {"wall": 3.0, "cpu": 2.0}, "y": {"wall": 1.0, "cpu": 1.0}},
        {"x": {"wall": 1.0, "cpu": 1.0}, "y": {"wall": 4.0, "cpu": 1.5}},
    ]
    assert bench.seconds(rounds, ("x",), "wall") == 1.0
    assert bench.seconds(rounds, ("x", "y"), "wall") == 4.0  # 3 + 1 in round 0, 1 + 4 in round 1
    assert bench.seconds(rounds, ("x", "y"), "cpu") == 2.5
