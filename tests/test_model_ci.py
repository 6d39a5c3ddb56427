"""Claims over several independently trained models: mean, t-interval, paired
differences and win counts, checked on hand-made tables whose answers are worked out by hand.

t_{0.975, 2} = 4.302653; with three values of sd 0.1 the half-width is
4.302653 * 0.1 / sqrt(3) = 0.248414.
"""

import math

import pandas as pd
import pytest

from selfrepair.coax import claims as coax_claims
from selfrepair.coax import score as coax
from selfrepair.core.published import Measured
from selfrepair.core.stats import fmt_ci, t_interval
from selfrepair.gim.claims import claims_evidence
from selfrepair.gim.localization import localization_summary

HALF = 4.302653 * 0.1 / math.sqrt(3)  # 0.248414


def test_t_interval_by_hand():
    ci = t_interval([0.7, 0.8, 0.9])
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(0.8) and ci["sd"] == pytest.approx(0.1)
    assert (ci["lo"], ci["hi"]) == pytest.approx((0.8 - HALF, 0.8 + HALF), abs=1e-6)
    one = t_interval([0.5, float("nan")])  # NaN dropped; one value: no interval
    assert one["n"] == 1 and one["mean"] == 0.5 and math.isnan(one["lo"]) and math.isnan(one["hi"])
    assert fmt_ci(one) == "0.500"
    assert fmt_ci(ci) == "0.800 [0.552, 1.048]"
    same = t_interval([0.3, 0.3, 0.3])
    assert same["lo"] == pytest.approx(0.3) and same["hi"] == pytest.approx(0.3)


def _loc():
    rows = []
    # task a: three models (two seeds of l2, one of l3)
    models = [("l2", 0), ("l2", 1), ("l3", 0)]
    cpr = {"eap": [0.5, 0.6, 0.7], "gim": [0.6, 0.8, 1.0], "eap-ig": [0.6, 0.9, 0.9]}
    cmd = {"eap": [0.3, 0.3, 0.3], "gim": [0.2, 0.3, 0.1], "eap-ig": [0.2, 0.2, 0.2]}
    for method in cpr:
        for i, (model, seed) in enumerate(models):
            rows.append(
                {
                    "task": "a",
                    "model": model,
                    "seed": seed,
                    "method": method,
                    "cpr": cpr[method][i],
                    "cmd": cmd[method][i],
                }
            )
    # task b: one model
    for method, c, d in (("eap", 0.4, 0.5), ("gim", 0.3, 0.4), ("eap-ig", 0.5, 0.6)):
        rows.append({"task": "b", "model": "l2", "seed": 0, "method": method, "cpr": c, "cmd": d})
    return pd.DataFrame(rows)


def test_localization_summary_by_hand():
    s = localization_summary(_loc()).set_index(["task", "method"])
    assert list(s.columns[:1]) == ["row"]
    eap = s.loc[("a", "eap")]
    assert eap.row == "method" and eap.n_models == 3
    assert eap.cpr_mean == pytest.approx(0.6)
    assert (eap.cpr_lo, eap.cpr_hi) == pytest.approx((0.6 - HALF, 0.6 + HALF), abs=1e-6)
    assert (eap.cmd_lo, eap.cmd_hi) == pytest.approx((0.3, 0.3))  # no spread, no width
    gim = s.loc[("a", "gim")]  # 0.6, 0.8, 1.0: sd 0.2
    assert gim.cpr_mean == pytest.approx(0.8) and gim.cpr_hi == pytest.approx(0.8 + 2 * HALF, abs=1e-6)
    d = s.loc[("a", "gim - eap")]  # CPR diffs 0.1, 0.2, 0.3; CMD diffs -0.1, 0, -0.2
    assert d.row == "difference" and d.n_models == 3
    assert d.cpr_mean == pytest.approx(0.2)
    assert (d.cpr_lo, d.cpr_hi) == pytest.approx((0.2 - HALF, 0.2 + HALF), abs=1e-6)
    assert d.cmd_mean == pytest.approx(-0.1) and d.cpr_wins == 3 and d.cmd_wins == 2
    d = s.loc[("a", "gim - eap-ig")]  # CPR diffs 0, -0.1, 0.1 (a tie wins nothing); CMD diffs 0, 0.1, -0.1
    assert d.cpr_mean == pytest.approx(0.0, abs=1e-12)
    assert (d.cpr_lo, d.cpr_hi) == pytest.approx((-HALF, HALF), abs=1e-6)
    assert d.cpr_wins == 1 and d.cmd_wins == 1
    # one model: a mean, no interval, the win counted
    b = s.loc[("b", "gim - eap")]
    assert b.n_models == 1 and b.cpr_mean == pytest.approx(-0.1) and math.isnan(b.cpr_lo)
    assert b.cpr_wins == 0 and b.cmd_wins == 1
    assert math.isnan(s.loc[("b", "gim"), "cpr_hi"])
    # all tasks pooled: four models; GIM - EAP CPR diffs 0.1, 0.2, 0.3, -0.1 -> mean 0.125
    pooled = s.loc[("all", "gim - eap")]
    assert pooled.n_models == 4 and pooled.cpr_mean == pytest.approx(0.125) and pooled.cpr_wins == 3
    assert s.loc[("all", "eap"), "n_models"] == 4


def test_localization_summary_one_task_one_model():
    loc = _loc()
    one = loc[(loc.task == "a") & (loc.model == "l3")].drop(columns="seed")  # old table: no seed column
    s = localization_summary(one)
    assert set(s.task) == {"a"} and (s.n_models == 1).all()  # no 'all' rows for one task
    assert s[s.method == "gim - eap"].cpr_mean.iloc[0] == pytest.approx(0.3)
    assert s[["cpr_lo", "cpr_hi", "cmd_lo", "cmd_hi"]].isna().all().all()


def test_claims_note_quotes_mean_and_ci():
    loc = _loc()
    ev = claims_evidence(loc)
    note = ev["gim_best_mean_cpr"].reason
    assert "mean over 4 models" in note and "GIM - EAP per model: 0.125 [" in note
    assert "GIM higher in 3/4 models" in note and "a 0.200 [-0.048, 0.448] (3/3)" in note
    # the summary read back from its CSV gives the same note
    from io import StringIO

    buf = StringIO()
    localization_summary(loc).to_csv(buf, index=False)
    buf.seek(0)
    assert claims_evidence(loc, summary=pd.read_csv(buf))["gim_best_mean_cpr"].reason == note

    four = pd.concat(
        [loc] + [loc[loc.method == "gim"].assign(method=m) for m in ("gim-no-tsg", "gim-no-ln", "gim-no-norm")]
    )
    assert claims_evidence(four)["gim_ablation_each_modification"].reason.endswith(
        "lowered CPR in 0/12 (task, model, seed, modification) cases"
    )


def _discovery():
    # runs: 3 models x 2 prompt sets. COAX per model 0.7, 0.8, 0.9; AtP 0.6, 0.8, 0.7
    coax_auc = {(1, 10): 0.6, (1, 20): 0.8, (2, 10): 0.8, (2, 20): 0.8, (3, 10): 0.9, (3, 20): 0.9}
    atp_auc = {(1, 10): 0.5, (1, 20): 0.7, (2, 10): 0.9, (2, 20): 0.7, (3, 10): 0.7, (3, 20): 0.7}
    rows = []
    for method, aucs in (("atp", atp_auc), ("coax", coax_auc)):
        for (ms, ds), a in aucs.items():
            rows.append(
                {
                    "model_seed": ms,
                    "data_seed": ds,
                    "method": method,
                    "roc_auc": a,
                    "hits": 2,
                    "n_backups": 3,
                    "top_k": 20,
                }
            )
    return pd.DataFrame(rows)


def test_ioi_summary_ci_over_models_by_hand():
    s = coax.ioi_summary(_discovery()).set_index("method")
    c = s.loc["coax"]
    assert c.roc_auc == pytest.approx(0.8) and c.n_runs == 6 and c.n_models == 3
    assert (c.roc_auc_ci_lo, c.roc_auc_ci_hi) == pytest.approx((0.8 - HALF, 0.8 + HALF), abs=1e-6)
    a = s.loc["atp"]
    assert a.roc_auc == pytest.approx(0.7)
    assert (a.roc_auc_ci_lo, a.roc_auc_ci_hi) == pytest.approx((0.7 - HALF, 0.7 + HALF), abs=1e-6)
    # COAX - AtP per run 0.1, 0.1 | -0.1, 0.1 | 0.2, 0.2 -> per model 0.1, 0, 0.2
    assert a.coax_minus_mean == pytest.approx(0.1)
    assert (a.coax_minus_ci_lo, a.coax_minus_ci_hi) == pytest.approx((0.1 - HALF, 0.1 + HALF), abs=1e-6)
    assert a.coax_wins == 5
    assert pd.isna(c.coax_minus_mean)
    # the existing columns keep their order and meaning
    assert list(s.reset_index().columns[:9]) == [
        "method",
        "roc_auc",
        "roc_auc_sd",
        "n_runs",
        "hits",
        "n_backups",
        "top_k",
        "p_wilcoxon_coax_gt",
        "p_ttest_coax_gt",
    ]
    got = coax_claims._claims_from({"ioi_summary": s.reset_index()}, "toy")
    m = got["ioi_auc_atp"]  # a published row with a CI: Measured(value, lo, hi, note)
    assert isinstance(m, Measured) and m.value == pytest.approx(0.7)
    assert (m.lo, m.hi) == pytest.approx((0.7 - HALF, 0.7 + HALF), abs=1e-6)
    assert "95% t-CI over 3 models [0.452, 0.948]" in m.note
    assert "COAX - atp = 0.100 [-0.148, 0.348] (95% t-CI over 3 models), COAX higher in 5/6 runs" in m.note
    assert "COAX - " not in got["ioi_auc_coax"].note
    assert coax_claims._fmt(m).startswith("0.700 (toy; mean of 6 runs; 95% t-CI")  # the toy analogue of a not-run row
    # one model (GPT-2 itself, or the tiny config): no interval, a plain (value, note)
    one = coax.ioi_summary(_discovery()[lambda d: d.model_seed == 1])
    value, note = coax_claims._claims_from({"ioi_summary": one}, "toy")["ioi_auc_atp"]
    assert value == pytest.approx(0.6) and "t-CI" not in note and "COAX - atp = 0.100, COAX higher in 2/2 runs" in note


def test_claims_note_names_the_first_method_of_each_pair_as_the_winner():
    """A pair a - b counts the models where a's CPR is higher: the note names a (relp - gim:
    RELP), not GIM for every pair."""
    loc = _loc()
    relp = loc[loc.method == "gim"].assign(method="relp", cpr=lambda d: d.cpr - 0.05)
    relp.loc[relp.index[0], "cpr"] += 0.1  # higher than GIM on exactly one model
    note = claims_evidence(pd.concat([loc, relp], ignore_index=True))["gim_best_mean_cpr"].reason
    assert "RELP - GIM per model: " in note and "RELP higher in 1/4 models" in note
    assert "GIM higher in 3/4 models" in note  # gim - eap is unchanged
