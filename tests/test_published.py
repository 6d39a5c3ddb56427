from pathlib import Path

import pandas as pd
import pytest
import yaml

from selfrepair.core import published
from selfrepair.core.published import Holds, NotRun
from selfrepair.tooling import readme_table

ROOT = Path(__file__).resolve().parents[1]


def test_compare_statuses_by_hand():
    claims = [
        {"id": "a", "claim": "x", "source": "s", "value": 0.72, "tolerance": 0.08},
        {"id": "b", "claim": "y", "source": "s", "value": 0.72, "tolerance": 0.08},
        {"id": "c", "claim": "z", "source": "s", "value": 1.0, "tolerance": 0.0},
        {"id": "d", "claim": "w", "source": "s", "kind": "text", "text": "t"},
        {"id": "e", "claim": "v", "source": "s", "value": 3.0, "tolerance": 1.0},
    ]
    t = published.compare("p", claims, {"a": 0.80, "b": (0.81, "n=3"), "d": Holds(False, "ev"), "e": NotRun("no GPU")})
    assert t["status"].tolist() == ["reproduced", "differs", "not run", "differs", "not run"]
    assert list(t.columns) == published.COLUMNS and t["ci_low"].isna().all()  # no CI given
    assert t.loc[1, "note"] == "n=3"
    assert t.loc[2, "note"] == "no rule measures this claim yet"
    assert t.loc[3, "reproduced"] == "does not hold" and t.loc[4, "note"] == "no GPU"


def test_claims_file_is_well_formed():
    for paper in yaml.safe_load((ROOT / "config" / "published.yaml").read_text()):
        claims = published.load_claims(ROOT / "config" / "published.yaml", paper)
        assert all(c["source"] for c in claims)


def test_bad_claims_are_rejected(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("heroes:\n  - {id: a, claim: x, source: s, value: oops}\n")
    with pytest.raises(ValueError, match="needs a number"):
        published.load_claims(f, "heroes")
    f.write_text("heroes:\n  - {id: a, claim: x, source: s, value: 1}\n  - {id: a, claim: y, source: s, value: 2}\n")
    with pytest.raises(ValueError, match="duplicate"):
        published.load_claims(f, "heroes")


def test_claims_file_problems_name_each_claim(tmp_path):
    """file_problems (the workflow's parse-time check): every claim without its finite
    number and tolerance, or its text, named by paper and id; the real file has none."""
    assert published.file_problems(ROOT / "config" / "published.yaml") == []
    f = tmp_path / "p.yaml"
    f.write_text(
        "heroes:\n"
        "  - {id: a, claim: x, source: s, tolerance: 1}\n"
        "  - {id: b, claim: x, source: s, value: 1}\n"
        "  - {id: c, claim: x, source: s, value: .nan, tolerance: -1}\n"
        "coax:\n"
        "  - {id: d, claim: x, source: s, kind: text}\n"
        "  - {id: e, claim: x, source: s, kind: textual, text: t}\n"
        "  - {id: f, claim: x, source: s, value: '1', tolerance: true}\n"
    )
    assert published.file_problems(f) == [
        "numeric claim 'a' of 'heroes' needs a number 'value' (it has none)",
        "numeric claim 'b' of 'heroes' needs a number 'tolerance' (it has none)",
        "numeric claim 'c' of 'heroes': value nan is not a finite number",
        "numeric claim 'c' of 'heroes': tolerance -1 is negative",
        "text claim 'd' of 'coax' needs its 'text'",
        "claim 'e' of 'coax': kind 'textual' is not one of number, text",
        "numeric claim 'f' of 'coax' needs a number 'value' (not '1')",
        "numeric claim 'f' of 'coax' needs a number 'tolerance' (not True)",
    ]
    with pytest.raises(ValueError, match="numeric claim 'b' of 'heroes' needs a number 'tolerance'"):
        published.load_claims(f, "heroes")
    f.write_text("heroes: [1\n")
    assert published.file_problems(f)[0].startswith("not valid YAML")


def test_reference_tables_agree_with_published_yaml():
    """results/reference/ (copied from a full default run) lists every published number of
    config/published.yaml with the same value, and its statuses follow from its numbers."""
    ref = ROOT / "results" / "reference" / "published_summary.csv"
    if not ref.exists():
        pytest.skip("no reference run committed yet")
    table = pd.read_csv(ref)
    data = yaml.safe_load((ROOT / "config" / "published.yaml").read_text())
    findings = table[table["paper"] == "groundtruth"]  # the ground truth's findings: no paper, no published value
    assert set(findings["status"]) <= {"new", "not run"} and findings["published"].isna().all()
    for paper in table["paper"].unique():
        if paper == "groundtruth":
            continue
        claims = {c["id"]: c for c in data[paper]}
        rows = table[table["paper"] == paper]
        assert set(rows["id"]) == set(claims), paper
        for r in rows.itertuples():
            c = claims[r.id]
            if c.get("kind", "number") != "number":
                continue
            assert float(r.published) == pytest.approx(float(c["value"]))
            if r.status != "not run":
                ci = (float(r.ci_low), float(r.ci_high)) if "ci_low" in table else (None, None)
                expect = published.status_of(float(c["value"]), float(r.reproduced), float(c.get("tolerance", 0)), *ci)
                assert r.status == expect, r.id
    assert set(table["status"]) <= set(published.STATUSES)


def test_readme_blocks_match_reference_files():
    assert readme_table.main(["--check"]) == 0
