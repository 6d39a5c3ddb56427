"""Paper A's published table under both protocols: the paper's text (v3) and the authors'
code (the protocol grid's 'authors' cell), and the headline row for each."""

import math

import pandas as pd

from selfrepair.heroes import claims as heroes_claims
from selfrepair.tooling import readme_table


def _published():
    return pd.DataFrame(
        {
            "paper": ["heroes"] * 3,
            "id": ["rho_reverse", "rho_sort", "attention_hero_vs_bloat"],
            "claim": ["rho reversal", "rho sorting", "attention"],
            "published": [0.72, 0.27, "sharper"],
            "reproduced": [0.6171, 0.5688, "does not hold"],
            "tolerance": [0.08, 0.24, ""],
            "ci_low": [0.48, 0.53, float("nan")],
            "ci_high": [0.73, 0.61, float("nan")],
            "status": ["fragile", "differs", "differs"],
            "note": ["", "", ""],
        }
    )


def _grid():
    # rho_reverse measured in both cells; rho_sort only in the default cell
    return pd.DataFrame(
        {
            "id": ["rho_reverse", "rho_reverse", "rho_sort"],
            "cell": ["default", "authors", "default"],
            "value": [0.61, 0.712345, 0.57],
            "ci_low": [0.47, 0.66, 0.52],
            "ci_high": [0.73, 0.77, 0.61],
            "status": ["fragile", "reproduced", "differs"],
        }
    )


def test_authors_columns_take_the_authors_cell_and_say_what_is_not_measured():
    t = heroes_claims.authors_columns(_published(), _grid(), n_seeds=5)
    r = t.set_index("id")
    assert r.loc["rho_reverse", "authors_reproduced"] == 0.7123  # rounded to 4 digits, as 'reproduced'
    assert (r.loc["rho_reverse", "authors_ci_low"], r.loc["rho_reverse", "authors_ci_high"]) == (0.66, 0.77)
    assert r.loc["rho_reverse", "authors_status"] == "reproduced"
    assert "5 seeds" in r.loc["rho_reverse", "authors_note"]
    for cid in ("rho_sort", "attention_hero_vs_bloat"):  # no 'authors' row for them
        assert r.loc[cid, "authors_status"] == "not run"
        assert math.isnan(r.loc[cid, "authors_reproduced"])
        assert "does not measure" in r.loc[cid, "authors_note"]
    # the text protocol's columns are untouched
    assert list(t["status"]) == ["fragile", "differs", "differs"]


def test_authors_columns_without_the_grid_or_its_cell():
    none = heroes_claims.authors_columns(_published(), None, n_seeds=5)
    assert set(none["authors_status"]) == {"not run"}
    assert set(none["authors_note"]) == {"the protocol grid did not run"}
    no_cell = heroes_claims.authors_columns(_published(), _grid()[_grid()["cell"] == "default"], n_seeds=5)
    assert set(no_cell["authors_note"]) == {"the protocol grid has no 'authors' cell"}


def test_headline_shows_paper_a_under_both_protocols(tmp_path):
    t = heroes_claims.authors_columns(_published(), _grid(), n_seeds=5)
    csv = tmp_path / "summary.csv"
    t.to_csv(csv, index=False)
    rows = readme_table.headline_markdown(csv).splitlines()[2:]
    assert len(rows) == 2
    text, authors = (r.split(" | ") for r in rows)
    assert text[0] == "| A. Hidden Heroes and Gradient Bloats (the paper's text, v3)"
    assert authors[0] == "| A. Hidden Heroes and Gradient Bloats (the authors' code, 5 seeds)"
    # claims, reproduced, fragile, differs, not run
    assert text[1:6] == ["3", "0", "1", "2", "0"]
    assert authors[1:6] == ["3", "1", "0", "0", "2"]
    assert "rho reversal 0.72 -> 0.712 (reproduced)" in authors[6]
    assert "rho sorting 0.27 (not run)" in authors[6]


def test_full_table_has_an_authors_column_only_when_filled(tmp_path):
    csv = tmp_path / "summary.csv"
    heroes_claims.authors_columns(_published(), _grid(), n_seeds=5).to_csv(csv, index=False)
    md = readme_table.published_markdown(csv).splitlines()
    assert md[0].split(" | ")[6] == "authors' code"
    assert "| 0.712 [0.66, 0.77] (reproduced) |" in md[2]
    assert "| not run |" in md[3]
    heroes_claims.authors_columns(_published(), None, n_seeds=5).to_csv(csv, index=False)
    assert "authors' code" not in readme_table.published_markdown(csv)
