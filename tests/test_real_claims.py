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
        R.row("m1", "coax", "a", "claim a", "0.91 (GPT-2)", 0.2, (0.1, 0.3), 4, resampled="prompts"),
        R.row("m1", "gim", "b", "claim b", "best", -0.2, (-0.3, -0.1), 100, resampled="pairs"),
        R.not_run("m2", "gim", "b", "claim b", "best", "weights absent"),
    ]
    t = R.table(rows)
    assert list(t["verdict"]) == ["holds", "fails", "not run"]
    assert t.loc[2, "note"] == "weights absent"
    c = R.counts(t)
    assert c.loc["m1"].tolist() == [1, 0, 1, 0] and c.loc["m2"].tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="resampled"):  # an interval over nothing named
        R.row("m1", "coax", "a", "claim a", "", 0.2, (0.1, 0.3), 4)
    bad = dict(rows[0], verdict="maybe")
    with pytest.raises(ValueError, match="maybe"):
        R.table([bad])


def _contrasts(task="ioi"):
    import pandas as pd

    # GIM against each other method on one task: CPR gains and CMD differences with intervals
    rows = [
        ("eap", 0.30, 0.10, 0.50, -0.010, -0.020, -0.001),
        ("eap-ig", -0.05, -0.20, 0.10, 0.002, -0.004, 0.008),  # the strongest other by CPR and by CMD
        ("gim-no-tsg", 0.40, 0.20, 0.60, 0.0, 0.0, 0.0),
        ("gim-no-ln", -0.30, -0.50, -0.10, 0.0, 0.0, 0.0),
    ]
    cols = ["versus", "d_cpr", "d_cpr_lo", "d_cpr_hi", "d_cmd", "d_cmd_lo", "d_cmd_hi"]
    t = pd.DataFrame(rows, columns=cols)
    return t.assign(task=task, method="gim", n_pairs=20)


def test_gim_lm_claims_from_hand_made_tables():
    import pandas as pd

    from selfrepair.gim.lm_claims import lm_claims

    tasks = pd.DataFrame({"task": ["ioi", "copycolors_mcqa"], "solved": [True, False]})
    fa = pd.DataFrame(
        {
            "example": [0, 0, 1, 1, 2, 2],
            "method": ["gim", "grad_x_input"] * 3,
            "comprehensiveness": [0.5, 0.2, 0.6, 0.4, 0.7, 0.3],  # differences 0.3, 0.2, 0.4
        }
    )
    t = R.table(lm_claims("m", tasks, _contrasts(), fa)).set_index("id")
    assert not any("copycolors" in i for i in t.index)  # an unsolved task has no claims
    best = t.loc["lm_gim_best_cpr_ioi"]  # against EAP-IG, the smallest gain: straddles 0
    assert best["measured"] == -0.05 and best["verdict"] == "inconclusive" and "eap-ig" in best["note"]
    cmd = t.loc["lm_gim_best_cmd_ioi"]  # against EAP-IG, the largest CMD difference: straddles 0
    assert cmd["measured"] == 0.002 and cmd["verdict"] == "inconclusive"
    assert t.loc["lm_gim_needs_tsg_ioi", "verdict"] == "holds"
    assert t.loc["lm_gim_needs_ln_ioi", "verdict"] == "fails"
    assert t.loc["lm_gim_needs_norm_ioi", "verdict"] == "not run"
    fa_row = t.loc["lm_gim_fa_comprehensiveness"]
    # mean 0.3, sd 0.1, t_{0.975, 2} = 4.302653: half width 0.3 * ... = 4.302653 * 0.1 / sqrt(3)
    assert fa_row["measured"] == pytest.approx(0.3)
    assert fa_row["ci_low"] == pytest.approx(0.3 - 4.302653 * 0.1 / 3**0.5, rel=1e-5)
    assert fa_row["verdict"] == "holds" and fa_row["n"] == 3


def test_coax_lm_claims_from_hand_made_tables():
    import numpy as np
    import pandas as pd

    from selfrepair.coax.lm_claims import auc_gap, lm_claims

    # 6 candidates, 2 backups; COAX (comp) ranks both first: AUC 1. Single ablation puts one
    # backup first and one last: AUC 4/8 = 0.5; AtP 7/8 (the best baseline), EAP-IG and AtP* 0
    backup = [True, True, False, False, False, False]
    scores = pd.DataFrame(
        {
            "unit": [f"L0H{i}" for i in range(6)],
            "backup": backup,
            "comp": [6, 5, 4, 3, 2, 1],
            "single": [6, 0, 5, 4, 3, 2],
            "atp": [6, 3.5, 5, 3, 2, 1],  # backups beat 4 and 3 of the 4 others: 7/8
            "eap_ig": [1, 0, 6, 5, 4, 3],
            "atp_star": [1, 0, 6, 5, 4, 3],
            "data_seed": 1,
        }
    )
    g = auc_gap(scores, n_boot=200)
    assert g["gap"] == pytest.approx(1 - 7 / 8) and g["lo"] <= g["gap"] <= g["hi"]
    wake = pd.DataFrame(
        {
            "n_ablated": [3] * 5 + [0] * 5,
            "group": ["backup", "backup", "other", "other", "other"] * 2,
            "ratio": [1.2, 1.4, 1.0, 1.1, 0.9, 1, 1, 1, 1, 1],
        }
    )
    freeze = pd.DataFrame({"data_seed": [1, 2], "repair_removed_share": [0.5, 0.7]})
    ko = pd.DataFrame(
        {"data_seed": [1, 1, 2, 2], "set": ["primaries", "primaries+coax"] * 2, "accuracy": [1.0, 0.6, 0.9, 0.7]}
    )
    ind = pd.DataFrame({"k": [5, 10], "drop_coax": [2.0, 1.0], "drop_random": [0.5, 0.5]})
    tables = {"ioi_scores": scores, "ioi_wake": wake, "ioi_freeze": freeze, "ioi_knockout": ko, "induction": ind}
    t = R.table(lm_claims("m", tables)).set_index("id")
    w = t.loc["lm_coax_backups_wake_up"]  # at 3 ablated: backups 1.3 (sd 0.1414), others 1.0 (sd 0.1)
    se = np.sqrt(0.02 / 2 + 0.01 / 3)
    assert w["measured"] == pytest.approx(0.3) and w["ci_low"] == pytest.approx(0.3 - 1.96 * se)
    assert w["verdict"] == "holds"
    f = t.loc["lm_coax_freeze_removes_repair"]  # mean 0.6, sd 0.1414, t_{0.975,1} = 12.7062
    assert f["measured"] == pytest.approx(0.6) and f["ci_low"] == pytest.approx(0.6 - 12.7062 * 0.1, rel=1e-4)
    assert f["verdict"] == "inconclusive"
    assert t.loc["lm_coax_knockout_costs_accuracy", "measured"] == pytest.approx(0.3)
    assert t.loc["lm_coax_induction_beats_random", "measured"] == pytest.approx(1.0)
    assert {r["verdict"] for r in lm_claims("m", {})} == {"not run"}  # no table: not run, never inconclusive
