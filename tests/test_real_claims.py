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
        ("gim-no-tsg", 0.40, 0.20, 0.60, 0.03, 0.01, 0.05),  # CPR: GIM needs TSG; CMD: GIM's is higher
        ("gim-no-ln", -0.30, -0.50, -0.10, -0.02, -0.04, -0.005),  # CPR: the freeze hurts; CMD: it helps
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
            "example": [0, 0, 1, 1, 2, 2, 3, 3],
            "method": ["gim", "grad_x_input"] * 4,
            "comprehensiveness": [0.5, 0.2, 0.6, 0.4, 0.7, 0.3, 90.0, 10.0],  # differences 0.3, 0.2, 0.4 (80)
            "comprehensiveness_prob": [0.9, 0.5, 0.5, 0.6, 0.4, 0.2, 0.0, 0.0],  # 0.4, -0.1, 0.2 (0)
            "correct": [True, True, True, True, True, True, False, False],  # prompt 3 not answered: left out
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
    # CMD, lower is better: d_cmd = GIM's minus the ablation's; below 0 means removing it raises CMD
    tsg_cmd, ln_cmd = t.loc["lm_gim_needs_tsg_cmd_ioi"], t.loc["lm_gim_needs_ln_cmd_ioi"]
    assert tsg_cmd["measured"] == 0.03 and tsg_cmd["verdict"] == "fails"  # [0.01, 0.05]: removing TSG lowers CMD
    assert ln_cmd["measured"] == -0.02 and ln_cmd["verdict"] == "holds"  # [-0.04, -0.005]: removing it raises CMD
    assert (ln_cmd["ci_low"], ln_cmd["ci_high"], ln_cmd["resampled"]) == (-0.04, -0.005, "pairs")
    assert t.loc["lm_gim_needs_norm_cmd_ioi", "verdict"] == "not run"
    fa_row = t.loc["lm_gim_fa_comprehensiveness"]
    # the 3 answered prompts: mean 0.3, sd 0.1, t_{0.975, 2} = 4.302653: half width 4.302653 * 0.1 / sqrt(3)
    assert fa_row["measured"] == pytest.approx(0.3)
    assert fa_row["ci_low"] == pytest.approx(0.3 - 4.302653 * 0.1 / 3**0.5, rel=1e-5)
    assert fa_row["verdict"] == "holds" and fa_row["n"] == 3 and fa_row["resampled"] == "prompts"
    assert "3 of 4 IOI prompts" in fa_row["note"]
    prob = t.loc["lm_gim_fa_comprehensiveness_prob"]
    # 0.4, -0.1, 0.2: mean 0.5 / 3, sd sqrt(((0.4-m)^2 + (-0.1-m)^2 + (0.2-m)^2) / 2) = 0.2516611
    assert prob["measured"] == pytest.approx(0.5 / 3)
    assert prob["ci_high"] == pytest.approx(0.5 / 3 + 4.302653 * 0.2516611 / 3**0.5, rel=1e-5)
    assert prob["verdict"] == "inconclusive" and prob["n"] == 3
    with pytest.raises(ValueError, match="correct"):  # a table from before the answered column
        lm_claims("m", tasks, _contrasts(), fa.drop(columns="correct"))


def _truth(betas, seeding="name_movers"):
    """ioi_truth for candidates L0H0.. whose conditional effect on each truth prompt is
    ``betas[u][prompt]``: intact 5, primaries 4, each candidate alone 5 (single 0), with
    the primaries 4 - beta; the prompts alternate ABBA and BABA."""
    import numpy as np

    from selfrepair.coax import lm_seeds

    b = np.asarray(betas, float)
    n, k = b.shape
    mat = np.vstack([np.full(k, 5.0), np.full(k, 4.0), np.full((n, k), 5.0), 4.0 - b])
    return lm_seeds.matrix_table(mat, [f"L0H{i}" for i in range(n)], lm_seeds.template_names(k), seeding, n)


def _scores():
    import pandas as pd

    # 6 candidates, the backups L0H0 and L0H1; COAX (comp) ranks both first: AUC 1. Single
    # ablation puts one first and one last: AUC 4/8; AtP 7/8 (the best baseline), EAP-IG
    # and AtP* 0. Wake-up ratios: backups 1.3 and 1.1, the others 1.0, 1.0, 0.9, 1.1
    return pd.DataFrame(
        {
            "seeding": "name_movers",
            "data_seed": 1,
            "unit": [f"L0H{i}" for i in range(6)],
            "comp": [6, 5, 4, 3, 2, 1],
            "single": [6, 0, 5, 4, 3, 2],
            "atp": [6, 3.5, 5, 3, 2, 1],
            "eap_ig": [1, 0, 6, 5, 4, 3],
            "atp_star": [1, 0, 6, 5, 4, 3],
            "wake": [1.3, 1.1, 1.0, 1.0, 0.9, 1.1],
        }
    )


def _prompts():
    import pandas as pd

    # 4 scored prompts: intact 3; the primaries ablated 2, 2, 1, 1 (drops 1, 1, 2, 2: mean
    # 1.5); COAX's set too: 1 lower each (knockout 1 on every prompt); every candidate
    # frozen: 0 (repair = 2, 2, 1, 1 - 0: mean 1.5); the backups frozen: 4/3, 4/3, 2/3,
    # 2/3 (a third of each prompt's repair removed: the share of means is 1/3 on any resample)
    return pd.DataFrame(
        {
            "seeding": "name_movers",
            "data_seed": 1,
            "prompt": range(4),
            "template": ["ABBA", "BABA"] * 2,
            "ld_clean": 3.0,
            "ld_primaries": [2.0, 2.0, 1.0, 1.0],
            "ld_primaries_coax": [1.0, 1.0, 0.0, 0.0],
            "ld_primaries_ground_truth": [1.0, 1.0, 0.0, 0.0],
            "ld_frozen_backups": [4 / 3, 4 / 3, 2 / 3, 2 / 3],
            "ld_frozen_all": 0.0,
        }
    )


def test_coax_lm_claims_from_hand_made_tables():
    import pandas as pd

    from selfrepair.coax.lm_claims import lm_claims

    stable = _truth([[3, 3, 3, 3], [3, 3, 3, 3]] + [[0, 0, 0, 0]] * 4)
    seq = pd.DataFrame(
        {
            "k": [5] * 3 + [10] * 3,
            "sequence": [0, 1, 2] * 2,
            "drop_coax": [2.0, 1.0, 3.0, 1.0, 1.0, 1.0],
            "drop_random": [0.5] * 6,
        }
    )  # per sequence, averaged over k: 1.0, 0.5, 1.5: mean 1.0
    tables = {"ioi_scores": _scores(), "ioi_truth": stable, "ioi_prompts": _prompts(), "induction_sequences": seq}
    t = R.table(lm_claims("m", tables, backup_share=1 / 3)).set_index("id")
    assert list(t.index) == [
        "lm_coax_primaries_damage", "lm_coax_auc_beats_baselines", "lm_coax_backups_wake_up",
        "lm_coax_freeze_removes_repair", "lm_coax_knockout_lowers_logit_diff", "lm_coax_induction_beats_random",
        "lm_coax_pruning_beats_baselines",
    ]  # fmt: skip
    assert t.loc["lm_coax_pruning_beats_baselines", "verdict"] == "not run"  # no pruning table here
    ran = t[t["verdict"] != "not run"]
    assert (ran["n"] >= 2).all() and (ran["resampled"] != "").all()
    d = t.loc["lm_coax_primaries_damage"]
    assert d["measured"] == pytest.approx(1.5) and 1.0 <= d["ci_low"] <= 1.5 <= d["ci_high"] <= 2.0
    assert d["verdict"] == "holds" and d["n"] == 4
    a = t.loc["lm_coax_auc_beats_baselines"]
    assert a["measured"] == pytest.approx(1 - 7 / 8) and a["ci_low"] <= a["measured"] <= a["ci_high"]
    w = t.loc["lm_coax_backups_wake_up"]  # backups 1.2, others 1.0
    assert w["measured"] == pytest.approx(0.2)
    f = t.loc["lm_coax_freeze_removes_repair"]  # 1/3 on every resample: each prompt removes 1/3 of its repair
    assert f["measured"] == pytest.approx(1 / 3) and f["ci_low"] == pytest.approx(1 / 3)
    assert f["ci_high"] == pytest.approx(1 / 3) and f["verdict"] == "holds" and "repair" in f["note"]
    k = t.loc["lm_coax_knockout_lowers_logit_diff"]
    assert k["measured"] == pytest.approx(1.0) and k["ci_low"] == pytest.approx(1.0) and k["verdict"] == "holds"
    assert "accuracy 1.00 -> 0.50" in k["note"]
    i = t.loc["lm_coax_induction_beats_random"]
    assert i["measured"] == pytest.approx(1.0) and 0.5 <= i["ci_low"] <= 1.0 <= i["ci_high"] <= 1.5
    assert i["n"] == 3 and i["resampled"] == "evaluation sequences"
    # nothing ran: every claim is not run, never inconclusive
    assert {r["verdict"] for r in lm_claims("m", {})} == {"not run"}


def test_the_pruning_claim_from_hand_made_windows():
    import numpy as np
    import pandas as pd

    from selfrepair.coax.lm_claims import lm_claims

    # per window NLL at 50%: COAX 2.0 on each; Wanda (the best baseline) 2.5, 2.5, 3.5: mean 2.833;
    # Taylor 4.0 on each; at 10% (not the headline) COAX would lose
    nll = {"coax": [2.0, 2.0, 2.0], "wanda": [2.5, 2.5, 3.5], "taylor": [4.0, 4.0, 4.0]}
    rows = [{"method": m, "sparsity": 0.5, "n_pruned": 36, "window": w, "nll": x} for m, v in nll.items()
            for w, x in enumerate(v)] + [{"method": m, "sparsity": 0.1, "n_pruned": 7, "window": w, "nll": x}
            for m, x in (("coax", 9.0), ("wanda", 1.0)) for w in range(3)]  # fmt: skip
    seq = pd.DataFrame(rows)
    got = {r["id"]: r for r in lm_claims("m", {"pruning_sequences": seq}, headline=0.5)}
    r = got["lm_coax_pruning_beats_baselines"]
    assert r["measured"] == pytest.approx(2.5 + 1 / 3 - 2.0)
    # every resample's best baseline: Wanda's mean over the drawn windows is 2.5 at least
    assert 0.5 - 1e-12 <= r["ci_low"] <= r["measured"] <= r["ci_high"] <= 1.5 + 1e-12
    assert r["verdict"] == "holds" and r["n"] == 3 and r["resampled"].startswith("evaluation windows")
    assert f"coax {np.exp(2.0):.1f}" in r["note"] and "(wanda here)" in r["note"]
    # Taylor alone as the baseline: 2.0 on every resample
    alone = seq[seq["method"] != "wanda"]
    r = {x["id"]: x for x in lm_claims("m", {"pruning_sequences": alone}, headline=0.5)}[
        "lm_coax_pruning_beats_baselines"
    ]
    assert r["measured"] == pytest.approx(2.0) and r["ci_low"] == pytest.approx(2.0) == r["ci_high"]
    with pytest.raises(ValueError, match="no COAX and baseline rows at sparsity 0.3"):
        lm_claims("m", {"pruning_sequences": seq}, headline=0.3)


def test_labels_that_flip_across_truth_prompts_widen_the_auc_interval():
    from selfrepair.coax.lm_claims import _auc_gap, label_bootstrap

    # the same backups on all four truth prompts, against backups that only two prompts
    # (one of each template) pick: on all four, L0H0 and L0H1 (beta 1.5 against 1.45);
    # a resample heavy in prompts 2 and 3 picks L0H2 and L0H3, which COAX ranks lower
    stable = _truth([[3, 3, 3, 3], [3, 3, 3, 3]] + [[0, 0, 0, 0]] * 4)
    flips = _truth([[3, 3, 0, 0], [3, 3, 0, 0], [0, 0, 2.9, 2.9], [0, 0, 2.9, 2.9], [0] * 4, [0] * 4])
    s, f = (label_bootstrap(_scores(), t, 1 / 3, _auc_gap, n_boot=400) for t in (stable, flips))
    assert s["value"] == f["value"] == pytest.approx(1 - 7 / 8)  # the same labels on all prompts
    assert f["hi"] - f["lo"] > (s["hi"] - s["lo"]) + 0.3
    assert f["lo"] < 0 < s["value"]  # the flipped labels put COAX below a baseline


def _p_normal(z: float) -> float:
    """Two-sided normal p-value by the complementary error function (not scipy)."""
    return math.erfc(abs(z) / math.sqrt(2))


def test_interval_p_inverts_the_interval():
    z = 1.959963984540054
    # the half between the estimate and 0 is 0.1, so 1.96 se = 0.1 and z = 0.2 / (0.1 / 1.96)
    assert R.interval_p(0.2, 0.1, 0.3) == pytest.approx(_p_normal(0.2 / (0.1 / z)), rel=1e-9)
    # below the threshold the upper half counts: (hi - m) = 0.05 for an effect of -0.1
    assert R.interval_p(-0.1, -0.4, -0.05) == pytest.approx(_p_normal(0.1 / (0.05 / z)), rel=1e-9)
    # an interval that just touches the threshold: p = 0.05, the plain verdict's edge
    assert R.interval_p(0.2, 0.0, 0.5) == pytest.approx(0.05, abs=1e-12)
    assert R.interval_p(0.5, 0.0, 1.0, threshold=1.0) == pytest.approx(0.05, abs=1e-12)
    assert R.interval_p(0.0, -1.0, 1.0) == 1.0
    assert math.isnan(R.interval_p(0.2, math.nan, 0.3))
    # an estimate outside its own interval: the half-width (0.1) instead
    assert R.interval_p(0.5, 0.1, 0.3) == pytest.approx(_p_normal(0.5 / (0.1 / z)), rel=1e-9)


def test_holm_by_hand():
    # m = 3: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06 (monotone)
    got = R.holm([0.01, 0.04, 0.03, math.nan])
    assert got[:3] == pytest.approx([0.03, 0.06, 0.06]) and math.isnan(got[3])
    assert R.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_table_holm_verdicts():
    # interval p-values by hand (test_interval_p_inverts_the_interval's formula):
    # a, e 8.9e-5; b 0.0294 and c 0.0303 (intervals clearing 0 by a little); d 0.62
    rows = [
        R.row("m", "coax", "a", "a", "", 0.2, (0.1, 0.3), 16, resampled="prompts"),
        R.row("m", "coax", "b", "b", "", 0.2, (0.02, 0.4), 16, resampled="prompts"),
        R.row("m", "gim", "c", "c", "", -0.2, (-0.4, -0.019), 20, side="below", resampled="pairs"),
        R.row("m", "gim", "d", "d", "", 0.1, (-0.3, 0.5), 20, resampled="pairs"),
        R.row("m", "gim", "e", "e", "", -0.2, (-0.3, -0.1), 20, resampled="pairs"),  # fails plainly
        R.not_run("m", "gim", "f", "f", "", "absent"),
    ]
    t = R.table(rows).set_index("id")
    assert list(t["verdict"]) == ["holds", "holds", "holds", "inconclusive", "fails", "not run"]
    assert list(t["threshold"]) == [0.0] * 6 and t.loc["c", "side"] == "below"
    assert math.isnan(t.loc["f", "p"])
    # Holm over the 5 tested rows: a x5, e x4 (4.4e-4, 3.5e-4); b x3 = 0.088; c x2 = 0.061,
    # raised to 0.088; d 0.62: b and c no longer decided
    assert list(t["verdict_holm"]) == ["holds", "inconclusive", "inconclusive", "inconclusive", "fails", "not run"]
