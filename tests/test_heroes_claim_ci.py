"""Paper A's claims carry a 95% percentile bootstrap CI over seeds (models), so that a
claim resting on which roles each seed's model happens to have shows as 'fragile'.

Expected values are worked out independently: with 2 or 3 seeds every resample's statistic
is enumerated by hand, and an extreme value whose probability exceeds 2.5% is the CI's
bound whatever the 10,000 random draws (its share among them is ~25% or ~3.7%: far above
the 250 draws a percentile needs); elsewhere the CI is recomputed directly with numpy from
the same generator (seed 0)."""

import math

import numpy as np
import pandas as pd
import pytest

from selfrepair.core import analysis, published
from selfrepair.core.published import Measured, NotRun
from selfrepair.heroes import claims as heroes_claims
from selfrepair.heroes import tables as T

# ---- analysis.bootstrap_stat ----------------------------------------------------------


def test_bootstrap_stat_of_the_mean_is_bootstrap_ci():
    v = np.random.default_rng(4).normal(size=7)
    lo, hi, undefined = analysis.bootstrap_stat(v, lambda r: r.mean(1))
    assert (lo, hi) == analysis.bootstrap_ci(v) and undefined == 0


def test_bootstrap_stat_ratio_against_a_direct_loop_with_the_same_draws():
    # 5 seeds, two with a negative denominator: some resamples have mean <= 0 (undefined);
    # no 5 draws sum to 0 (the nearest: 0.01), so rounding cannot move a resample across
    rows = np.array([[0.4, 0.13], [0.2, -0.31], [0.6, 0.05], [0.1, -0.22], [0.3, 0.21]])
    lo, hi, undefined = analysis.bootstrap_stat(rows, T.ratio_of_means)
    idx = np.random.default_rng(0).integers(0, 5, (10000, 5))
    ratios = []
    for draw in idx:
        num = sum(rows[i, 0] for i in draw) / 5
        den = sum(rows[i, 1] for i in draw) / 5
        if den > 0:
            ratios.append(num / den)
    assert undefined == 10000 - len(ratios) and 0 < undefined < 10000
    assert (lo, hi) == pytest.approx(tuple(np.quantile(ratios, [0.025, 0.975])), rel=1e-12)


def test_bootstrap_stat_few_rows_or_no_defined_resample():
    assert all(math.isnan(x) for x in analysis.bootstrap_stat([1.0], lambda r: r.mean(1))[:2])
    lo, hi, undefined = analysis.bootstrap_stat([[1.0, -1.0], [2.0, 0.0]], T.ratio_of_means, n_boot=500)
    assert math.isnan(lo) and math.isnan(hi) and undefined == 500


# ---- redundancy_summary ---------------------------------------------------------------

OLD_REDUNDANCY_COLUMNS = [
    "task",
    "group",
    "n_seeds",
    "members_mean",
    "mean_individual_drop",
    "sum_individual_drop",
    "joint_drop",
    "joint_drop_sd",
    "joint_over_sum",
    "joint_over_mean_individual",
    "superadditive_seeds",
]


def _red(rows):
    return pd.DataFrame(rows, columns=["task", "seed", "group", "n", "joint", "mean_individual", "sum_individual"])


def test_redundancy_summary_keeps_its_columns_and_adds_cis_by_hand():
    # sorting bloats, 3 seeds: joint 0.3, 0.6, 0.9 and mean individual 0.1 each. The ratio
    # of means is 10 x the resampled joint mean: its 27 resamples range from 3 (seed 1
    # three times, p = 1/27 > 2.5%) to 9 (p = 1/27): CI [3, 9]; the joint drop's [0.3, 0.9].
    red = _red(
        [
            ("sort", 1, "bloat", 2, 0.3, 0.1, 0.2),
            ("sort", 2, "bloat", 2, 0.6, 0.1, 0.2),
            ("sort", 3, "bloat", 2, 0.9, 0.1, 0.2),
            ("sort", 4, "bloat", 0, np.nan, np.nan, np.nan),  # no bloats: not a row
        ]
    )
    s = T.redundancy_summary(red)
    assert list(s.columns[: len(OLD_REDUNDANCY_COLUMNS)]) == OLD_REDUNDANCY_COLUMNS
    r = s.iloc[0]
    assert r["n_seeds"] == 3 and r["joint_over_mean_individual"] == pytest.approx(6.0)
    assert (r["joint_drop_ci_lo"], r["joint_drop_ci_hi"]) == pytest.approx((0.3, 0.9))
    assert (r["mean_individual_drop_ci_lo"], r["mean_individual_drop_ci_hi"]) == pytest.approx((0.1, 0.1))
    assert (r["joint_over_mean_individual_ci_lo"], r["joint_over_mean_individual_ci_hi"]) == pytest.approx((3, 9))
    assert r["joint_over_mean_individual_undefined"] == 0
    # the CI columns are the bootstrap of the per-seed values, directly
    assert (r["joint_drop_ci_lo"], r["joint_drop_ci_hi"]) == analysis.bootstrap_ci([0.3, 0.6, 0.9])


# ---- measured_claims ------------------------------------------------------------------

# Two kept sorting seeds (roles at threshold 6 = role), one skipped sorting seed and one
# reversal seed that must not count:
#   seed 1: L1H1 bloat, L1H3 bloat, L3H3 hero; G layer 1: 0.1, 0.1; layer 3: 0.05
#   seed 2: L1H1 aligned, L1H3 bloat, L3H3 hero; G layer 1: 0.3, 0.3; layer 3: 0.05
ROLES = {
    ("sort", 1): {"L0H0": "aligned", "L1H1": "bloat", "L1H3": "bloat", "L3H3": "hero"},
    ("sort", 2): {"L0H0": "aligned", "L1H1": "aligned", "L1H3": "bloat", "L3H3": "hero"},
    ("reverse", 7): {"L0H0": "aligned", "L1H1": "bloat", "L1H3": "hero", "L3H3": "bloat"},
}
G = {1: {0: 0.2, 1: 0.1, 3: 0.05}, 2: {0: 0.2, 1: 0.3, 3: 0.05}, 7: {0: 0.5, 1: 0.5, 3: 0.5}}


def _components():
    rows = []
    for (task, seed), roles in ROLES.items():
        for comp, role in roles.items():
            layer = int(comp[1])
            rows.append(
                {"task": task, "seed": seed, "component": comp, "layer": layer, "G": G[seed][layer], "C": 0.1}
                | {"role": role, "role_t6": role, "status": "kept"}
            )
    rows.append({"task": "sort", "seed": 3, "status": "skipped"})  # a skipped seed's row
    return pd.DataFrame(rows)


def _claims(components="default", red=None):
    if isinstance(components, str):
        components = _components()
    if red is None:
        red = _red(
            [
                ("sort", 1, "bloat", 2, 0.4, 0.1, 0.2),
                ("sort", 2, "bloat", 1, 0.2, 0.1, 0.1),
                ("reverse", 7, "hero", 1, 0.5, 0.5, 0.5),
            ]
        )
    comps = _components()
    seeds = pd.DataFrame(
        {
            "task": ["sort", "sort", "sort", "reverse"],
            "seed": [1, 2, 3, 7],
            "status": ["kept", "kept", "skipped", "kept"],
            "reason": ["", "", "no N", ""],
            "rho": [0.1, 0.2, np.nan, 0.5],
        }
    )
    empty_att = pd.DataFrame(columns=["role", "entropy", "sink_mass"])
    return heroes_claims.measured_claims(
        seeds,
        T.rho_summary(seeds),
        T.roles_by_layer(comps, [6]),
        T.role_stability(comps),
        T.gradient_by_layer(comps),
        T.redundancy_summary(red),
        empty_att,
        6,
        [6],
        components=components,
    )


def _ci(m):
    assert isinstance(m, Measured), m
    return m.value, m.lo, m.hi


def test_role_count_claims_by_hand():
    m = _claims()
    # layer-1 bloats per seed: 2 and 1; summed over the 2 kept seeds: 3. Resampled sums:
    # 4 (seed 1 twice, p 1/4), 3, 2 (p 1/4): CI [2, 4]
    assert _ci(m["sort_layer1_bloats"]) == (3.0, 2.0, 4.0)
    assert "2 kept sorting seeds" in m["sort_layer1_bloats"].note
    assert "95% CI [2.0, 4.0] (bootstrap over 2 seeds)" in m["sort_layer1_bloats"].note
    # layer-3 heroes: 1 in each seed, constant: lo == hi == value
    assert _ci(m["sort_layer3_heroes"]) == (2.0, 2.0, 2.0)
    # per 10 seeds: L1H1 a bloat in 1 of 2 -> 5, resampled shares 0, 1/2, 1 -> [0, 10]
    assert _ci(m["sort_L1H1_bloat"]) == (5.0, 0.0, 10.0)
    assert _ci(m["sort_L1H3_bloat"]) == (10.0, 10.0, 10.0)
    assert _ci(m["sort_L3H3_hero"]) == (10.0, 10.0, 10.0)


def test_gradient_claims_by_hand():
    m = _claims()
    # layer 1: seed means 0.1 and 0.3 -> 0.2; resamples 0.1, 0.2, 0.3 -> [0.1, 0.3]
    assert _ci(m["sort_grad_layer1"]) == pytest.approx((0.2, 0.1, 0.3))
    # layer 3: 0.05 in every seed
    assert _ci(m["sort_grad_layer3"]) == pytest.approx((0.05, 0.05, 0.05))


def test_redundancy_claims_by_hand():
    m = _claims()
    # bloat joint drops 0.4 and 0.2 (mean 30 points), resampled means 40, 30, 20
    assert _ci(m["bloat_joint_drop_pct"]) == pytest.approx((30.0, 20.0, 40.0))
    # the ablation claims are the same drop as an accuracy change: sign flipped, lo <= hi
    assert _ci(m["bloat_ablation_pct"]) == pytest.approx((-30.0, -40.0, -20.0))
    assert _ci(m["bloat_individual_drop_pct"]) == pytest.approx((10.0, 10.0, 10.0))
    # joint / mean individual: 0.3 / 0.1 = 3; resamples 4, 3, 2 -> [2, 4]
    sup = m["bloat_superadditivity"]
    assert _ci(sup) == pytest.approx((3.0, 2.0, 4.0))
    assert "0 of 10000 resamples undefined" in sup.note
    # one reversal seed with heroes: a value, no CI (a bootstrap over seeds needs 2)
    v, lo, hi = _ci(m["hero_ablation_reverse_pct"])
    assert v == pytest.approx(-50.0) and math.isnan(lo) and math.isnan(hi)
    assert "no CI (1 seed" in m["hero_ablation_reverse_pct"].note


def test_superadditivity_undefined_point_estimate_and_resamples():
    # mean individual drops 0.1 and -0.1: mean 0 -> no ratio at all. Resamples: seed 1
    # twice gives 0.4 / 0.1 = 4; any draw of seed 2 has a mean <= 0 (undefined).
    red = _red([("sort", 1, "bloat", 2, 0.4, 0.1, 0.2), ("sort", 2, "bloat", 2, 0.2, -0.1, -0.2)])
    s = T.redundancy_summary(red).iloc[0]
    assert math.isnan(s["joint_over_mean_individual"])
    idx = np.random.default_rng(0).integers(0, 2, (10000, 2))
    assert s["joint_over_mean_individual_undefined"] == int((idx != 0).any(1).sum())
    assert (s["joint_over_mean_individual_ci_lo"], s["joint_over_mean_individual_ci_hi"]) == pytest.approx((4, 4))
    sup = _claims(red=red)["bloat_superadditivity"]
    assert isinstance(sup, NotRun) and sup.reason.startswith("undefined")
    assert "0.00 points (<= 0)" in sup.reason


def test_a_ci_across_the_band_makes_the_claim_fragile():
    m = _claims()
    claims = [
        {"id": "sort_L1H1_bloat", "claim": "x", "source": "s", "value": 6, "tolerance": 2},  # [0, 10] vs [4, 8]
        {"id": "sort_L1H3_bloat", "claim": "x", "source": "s", "value": 6, "tolerance": 2},  # [10, 10]
        {"id": "sort_layer3_heroes", "claim": "x", "source": "s", "value": 2, "tolerance": 1},  # [2, 2]
        {"id": "bloat_joint_drop_pct", "claim": "x", "source": "s", "value": 43.8, "tolerance": 10.4},  # [20, 40]
    ]
    table = published.compare("heroes", claims, m).set_index("id")
    assert table.loc["sort_L1H1_bloat", "status"] == "fragile"
    assert table.loc["sort_L1H3_bloat", "status"] == "differs"
    assert table.loc["sort_layer3_heroes", "status"] == "reproduced"
    assert table.loc["bloat_joint_drop_pct", "status"] == "fragile"
    assert (table.loc["sort_L1H1_bloat", "ci_low"], table.loc["sort_L1H1_bloat", "ci_high"]) == (0.0, 10.0)


def test_without_the_per_seed_table_the_values_stay_and_no_ci():
    m = _claims(components=None)
    for cid, value in (("sort_layer1_bloats", 3.0), ("sort_L1H1_bloat", 5.0), ("sort_grad_layer1", 0.2)):
        v, lo, hi = _ci(m[cid])
        assert v == pytest.approx(value) and math.isnan(lo) and math.isnan(hi)
        assert "no CI (no per-seed table)" in m[cid].note
