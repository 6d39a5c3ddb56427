"""benchmarks/compare_reference.py: two reference runs compared claim by claim, on tables
built by hand."""

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compare_reference as R  # noqa: E402


def _summary(rows):
    cols = ["paper", "id", "claim", "published", "reproduced", "ci_low", "ci_high", "status"]
    return pd.DataFrame(rows, columns=cols)


def test_claims_changes_statuses_and_cis(tmp_path):
    old = _summary([
        ["heroes", "a", "A", 1.0, 1.48, 0.5, 2.5, "reproduced"],
        ["heroes", "b", "B", 0.3, 0.57, float("nan"), float("nan"), "differs"],
        ["coax", "c", "C", 0.9, "", float("nan"), float("nan"), "not run"],
    ])  # fmt: skip
    new = _summary([
        ["heroes", "a", "A", 1.0, -0.17, -1.0, 1.2, "fragile"],
        ["heroes", "b", "B", 0.3, 0.63, 0.58, 0.68, "differs"],
        ["coax", "c", "C", 0.9, "", float("nan"), float("nan"), "not run"],
    ])  # fmt: skip
    for d, t in (("old", old), ("new", new)):
        (tmp_path / d).mkdir()
        t.to_csv(tmp_path / d / "published_summary.csv", index=False)
    table, s = R.compare(tmp_path / "old", tmp_path / "new", "AMD", "Intel")
    t = table.set_index("id")
    assert t.loc["a", "change"] == pytest.approx(-1.65)
    assert bool(t.loc["a", "status_changed"]) and not bool(t.loc["b", "status_changed"])
    assert t.loc["a", "ci_old_holds_new"] == False  # noqa: E712  -0.17 outside [0.5, 2.5]
    assert t.loc["a", "ci_new_holds_old"] == False  # noqa: E712  1.48 outside [-1.0, 1.2]
    assert pd.isna(t.loc["b", "ci_old_holds_new"]) and t.loc["b", "ci_new_holds_old"] == False  # noqa: E712
    assert s["claims_compared"] == 2 and s["status_changed"] == 1 and s["heroes_status_changed"] == 1
    assert s["old"] == "AMD" and "coax_claims" not in s


def test_localization_counts_moved_values():
    key = {"task": ["t"] * 3, "model": ["m"] * 3, "seed": [0, 1, 0], "method": ["eap", "eap", "gim"]}
    old = pd.DataFrame({**key, "cpr": [0.50, 0.70, 0.90]})
    new = pd.DataFrame({**key, "cpr": [0.505, 0.76, 0.30]})
    s = R.localization(old, new)
    assert s["gim_cpr_values"] == 3 and s["gim_cpr_moved_gt_0.01"] == 2
    assert s["gim_cpr_max_abs_change"] == pytest.approx(0.60)
    # method means: eap 0.60 -> 0.6325, gim 0.90 -> 0.30
    assert s["gim_cpr_method_mean_max_abs_change"] == pytest.approx(0.60)
