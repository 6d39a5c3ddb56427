"""MIB's own code beside ours on SmolLM2 (peers/mib_lm.py): the comparison's
arithmetic on hand-made circuit files, and the committed table kept in step with the
page and the README. No peer environment is needed: the peers' run is the committed
reference file."""

import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "peers"))
import mib_lm as P  # noqa: E402

from selfrepair.tooling import peers_table, readme_table  # noqa: E402

TABLE = ROOT / "results" / "reference" / f"{peers_table.PEERS_MIB}.csv"
PAGE = ROOT / "docs" / "results" / "peers.md"


def _file(scores: dict) -> dict:
    return {"edges": {n: {"score": s, "in_graph": False} for n, s in scores.items()}}


def test_key_value_edges_are_held_against_the_mean_of_mibs_heads_in_their_group():
    # 4 heads in 2 key-value groups: heads 0,1 share one, heads 2,3 the other
    theirs = {"input->a1.h0<k>": 1.0, "input->a1.h1<k>": 3.0, "input->a1.h2<k>": -2.0, "input->a1.h3<k>": 0.0,
              "input->a1.h0<q>": 4.0, "m0->logits": -1.0}  # fmt: skip
    names = list(theirs)
    mean = P.group_mean(names, pd.Series(theirs).to_numpy(), n_heads=4, n_kv=2)
    assert mean.tolist() == [2.0, 2.0, -1.0, -1.0, 4.0, -1.0]
    ours = {**theirs, "input->a1.h0<k>": 2.0, "input->a1.h1<k>": 2.0, "input->a1.h2<k>": -1.0,
            "input->a1.h3<k>": -1.0, "m0->logits": -1.5}  # fmt: skip
    row = P.compare(_file(ours), _file(theirs), n_heads=4, n_kv=2)
    assert row["max_rel_diff"] == pytest.approx(1.0 / 4.0)  # |2 - 1| or |-1 - 0| over max |score| 4
    assert row["max_rel_diff_qmlp"] == pytest.approx(0.5 / 4.0)  # the logits edge
    assert row["max_rel_diff_kv_group"] == 0.0
    assert row["n_edges"] == 6


def test_top_share_by_hand():
    import numpy as np

    a, b = np.array([5.0, 4.0, -9.0, 1.0]), np.array([5.0, 1.0, 4.0, -9.0])
    assert P.top_share(a, b, 2, absolute=False) == 0.5  # {0, 1} vs {0, 2}
    assert P.top_share(a, b, 2, absolute=True) == 0.5  # {2, 0} vs {3, 0}
    assert P.top_share(a, b, 0, absolute=True) == 1.0
    assert P.top_share(a, a, 3, absolute=False) == 1.0


def test_edges_mibs_file_scores_nan_are_counted_and_left_out_of_the_agreement(tmp_path):
    # MIB's IFR on Gemma-3 scores every edge into one MLP NaN: the rest is compared
    theirs = {"input->m1": float("nan"), "m0->m1": float("nan"), "input->m0": 2.0, "m0->logits": -4.0}
    ours = {"input->m1": 7.0, "m0->m1": -3.0, "input->m0": 2.5, "m0->logits": -4.0}
    row = P.compare(_file(ours), _file(theirs), n_heads=1, n_kv=1)
    assert row["n_edges"] == 4 and row["theirs_nonfinite_edges"] == 2
    assert row["max_rel_diff"] == pytest.approx(0.5 / 4.0) and row["spearman"] == pytest.approx(1.0)
    f = tmp_path / "theirs.json"
    f.write_text(__import__("json").dumps(_file(theirs)))
    assert all(x != x for x in P.our_eval_of(None, f, "ifr", None, 1))  # no ranking: NaN, not a crash


def test_different_edge_sets_are_refused():
    with pytest.raises(ValueError, match="different edges"):
        P.compare(_file({"input->m0": 1.0}), _file({"input->m1": 1.0}), 1, 1)


def _circuit(graph, edges):
    import torch

    mask = torch.zeros_like(graph.valid)
    for e in edges:
        u, v = e.split("->")
        i, j = graph.forward.index(u), graph.backward.index(v)
        assert graph.valid[i, j], e
        mask[i, j] = True
    return mask


def test_live_splits_by_hand():
    """Only a key or value edge that one live head of a key-value group keeps and another
    live head of the group lacks is a split; queries are per head, dead heads read nothing."""
    from selfrepair.gim.graph import Graph

    g = Graph.build(2, 4, 8, n_kv_heads=2)  # heads 0,1 share a key-value head; 2,3 the other
    live = ["a1.h0->logits", "a1.h1->logits", "a1.h2->m1", "m1->logits"]  # a1.h3 is dead
    edges = [*live, "input->a1.h0<k>", "m0->a1.h0<v>", "m0->a1.h1<v>", "input->a1.h0<q>",
             "input->a1.h2<v>", "input->a1.h3<k>", "input->m1"]  # fmt: skip
    # h1 lacks the key edge h0 keeps; h2 lacks the key edge the dead h3 keeps (ours then
    # keeps the group's key input clean for h2 too); h3 lacks h2's value edge, but is dead
    assert P.live_splits(g, _circuit(g, edges), 4, 2) == ["input->a1.h1<k>", "input->a1.h2<k>"]
    assert P.live_splits(g, _circuit(g, [*edges, "input->a1.h1<k>", "input->a1.h2<k>"]), 4, 2) == []
    # without grouping (one key-value head per head) nothing is shared
    assert P.live_splits(g, _circuit(g, edges), 4, 4) == []


def test_cross_split_sorts_each_points_difference_by_its_circuit(monkeypatch):
    """The difference of the two curves at a point counts as a split's when that point's
    circuit splits a group between live heads, else as a whole point's."""
    import torch

    from selfrepair.gim.graph import Graph

    g = Graph.build(2, 4, 8, n_kv_heads=2)
    scores = torch.zeros(g.valid.shape)
    top = ["a1.h0->logits", "a1.h1->logits", "input->a1.h0<k>", "input->a1.h1<q>", "input->a1.h0<q>"]
    for rank, e in enumerate(top):
        u, v = e.split("->")
        scores[g.forward.index(u), g.backward.index(v)] = 10.0 - rank
    # 5 edges of g.n_edges: the top five, where a1.h1 is live without input's key edge
    frac = 5 / g.n_edges
    monkeypatch.setattr(P, "FRACTIONS", (frac, 1.0))
    ours = {"faithfulness": {"signed": [0.5, 1.0], "absolute": [0.7, 1.0]}}
    theirs = {"signed": {"faithfulness": [0.25, 1.0]}, "absolute": {"faithfulness": [0.7, 1.0 + 1e-6]}}
    row = P.cross_split(g, scores, "eap", ours, theirs, 4, 2)
    assert row["cross_split_points"] == 2  # the 5-edge circuit of both rankings
    assert row["cross_curve_diff_split"] == 0.25
    assert row["cross_curve_diff_whole"] == pytest.approx(1e-6)  # the full circuit, absolute


@pytest.fixture(scope="module")
def table():
    assert TABLE.exists(), f"{TABLE} is committed by peers/mib_lm.py --write"
    return pd.read_csv(TABLE)


def test_the_page_shows_the_committed_table(table):
    text = PAGE.read_text()
    for name in ("", "_metrics", "_topn", "_time"):
        block = peers_table.PEERS_MIB + name
        assert f"<!-- {block}:start -->" in text, f"{PAGE.name} lacks the block {block}"
    assert readme_table.render(text, readme_table.blocks()) == text, "stale: run peers/mib_lm.py --write"
    assert set(table["method"]) >= {"eap", "eap-ig"}


def test_the_page_and_readme_name_the_run_behind_the_table(table):
    text, readme = PAGE.read_text(), (ROOT / "README.md").read_text()
    first = table.iloc[0]
    for col in ("mib_circuit_track", "eap_ig", "transformerlens", "machine"):
        assert table[col].nunique() == 1, f"one setting behind the table: {col} differs between rows"
    # a method run apart from the others (its row added to the file) is named with its own run
    for col in ("mib_circuit_track", "eap_ig", "transformerlens", "commit", "analysis_commit", "date", "machine"):
        for value in table[col].unique():
            assert str(value) in text, f"{PAGE.name} does not name the run's {col} ({value})"
    assert f"N = {int(first['n'])}" in text and f"batch {int(first['batch_size'])}" in text
    for commit in (first["mib_circuit_track"], first["eap_ig"]):
        assert str(commit) in readme, f"README's peers sentence does not name {commit}"
    assert "SmolLM2" in readme and "docs/results/peers.md" in readme


def test_the_pages_prose_quotes_the_tables_figures(table):
    """Each figure the prose cites (the marked spans) is one the table holds."""
    import re

    text = PAGE.read_text()
    quoted = re.findall(r"<!-- quote ([\w.-]+) ([\w_]+) -->([^<]+)<!-- /quote -->", text)
    assert quoted, "the page quotes no figure of the table"
    rows = table.set_index("method")
    for method, column, shown in quoted:
        value = rows.loc[method, column]
        assert shown.strip() == readme_table._fmt(float(value)), f"{method} {column}: page {shown!r}, table {value}"


def test_recover_takes_the_methods_mib_finished_before_a_stop(tmp_path):
    """A run stopped inside MIB's side: the methods whose MIB run file is written join
    the comparison, with MIB's check; a method MIB never finished stays ours alone."""
    import json

    (tmp_path / "round0").mkdir()
    (tmp_path / "round0" / "eap_run.json").write_text(json.dumps({"cpr": 1.5}))
    (tmp_path / "round0" / "check.json").write_text(json.dumps({"clean": []}))
    runs = {"ours": {"eap": [{"cpr": 1.4}], "ifr": [{"cpr": 0.1}]}, "theirs": {}}
    got, loads, check, meta = P.recover(tmp_path, runs, [2.0], None, {"commit": "c"})
    assert got["theirs"] == {"eap": [{"cpr": 1.5}]} and check == {"clean": []} and loads == [2.0]
    assert meta == {"commit": "c", "recovered": ["eap"]}
    # nothing to take: as it was
    again = P.recover(tmp_path, got, loads, check, meta)
    assert again[0]["theirs"] == {"eap": [{"cpr": 1.5}]} and again[3] == meta


def test_the_gemma3_sections_figures_are_its_tables():
    """The Gemma-3 section's marked figures (``gquote``) are those of its committed table,
    and its agreement is float noise as the page says."""
    import re

    gemma = readme_table.REFERENCE / f"{peers_table.PEERS_MIB_GEMMA3}.csv"
    assert gemma.exists(), f"{gemma} is committed by peers/mib_lm.py --write"
    rows = pd.read_csv(gemma).set_index("method")
    quoted = re.findall(r"<!-- gquote ([\w.-]+) ([\w_]+) -->([^<]+)<!-- /gquote -->", PAGE.read_text())
    assert quoted
    for method, column, shown in quoted:
        assert shown.strip() == readme_table._fmt(float(rows.loc[method, column])), (method, column, shown)
    assert (rows["max_rel_diff"] < 1e-5).all() and (rows["spearman"] > 0.99999).all()
