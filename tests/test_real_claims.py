"""Verdicts of claims tested on real models (core.real_claims): each case worked by hand."""

import math

import pytest

from selfrepair.core import real_claims as R


@pytest.mark.parametrize(
    "lo, hi, threshold, side, want",
    [
        (0.1, 0.3, 0.0, "above", "holds"),  # wholly above 0
        (-0.1, 0.2, 0.0, "above", "inconclusive"),  # straddles 0
        (-0.3, -0.1, 0.0, "above", "fails"),  # wholly below
        (-0.3, 0.0, 0.0, "above", "fails"),  # touching the threshold from below is no evidence for
        (1.01, 1.2, 1.0, "above", "holds"),  # a ratio above 1
        (0.9, 1.0, 1.0, "below", "inconclusive"),  # touches 1 from below: not wholly below
        (-0.3, -0.1, 0.0, "below", "holds"),
        (0.0, 0.4, 0.0, "below", "fails"),
        (math.nan, 0.4, 0.0, "above", "inconclusive"),  # no interval, no verdict
    ],
)
def test_verdict(lo, hi, threshold, side, want):
    assert R.verdict(lo, hi, threshold, side) == want


def test_bad_input():
    with pytest.raises(ValueError, match="side"):
        R.verdict(0, 1, side="left")
    with pytest.raises(ValueError, match="low end"):
        R.verdict(1, 0)


def test_table_and_counts():
    rows = [
        R.row("m1", "coax", "a", "claim a", "0.91 (GPT-2)", 0.2, (0.1, 0.3), 4),
        R.row("m1", "gim", "b", "claim b", "best", -0.2, (-0.3, -0.1), 100),
        R.not_run("m2", "gim", "b", "claim b", "best", "weights absent"),
    ]
    t = R.table(rows)
    assert list(t["verdict"]) == ["holds", "fails", "not run"]
    assert t.loc[2, "note"] == "weights absent"
    c = R.counts(t)
    assert c.loc["m1"].tolist() == [1, 0, 1, 0] and c.loc["m2"].tolist() == [0, 0, 0, 1]
    bad = dict(rows[0], verdict="maybe")
    with pytest.raises(ValueError, match="maybe"):
        R.table([bad])
