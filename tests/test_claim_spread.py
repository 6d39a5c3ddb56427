"""Claims that do not hang on one sample or one model. Role stability over
resampled evaluation sequences, C within 2 SE, paired per-seed differences between grid
cells, and the 'fragile' status of a published claim."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from selfrepair.core import published
from selfrepair.core.published import Measured
from selfrepair.heroes import claims as heroes_claims
from selfrepair.heroes import grid_tables, spread
from selfrepair.heroes import tables as heroes_tables


def _outcomes(n, flips):
    """Baseline right on all n sequences; component k wrong on the first flips[k]."""
    o = np.ones((n, 1 + len(flips)), bool)
    for k, f in enumerate(flips):
        o[:f, 1 + k] = False
    return o


def _all_resamples(n):
    return np.array(list(itertools.product(range(n), repeat=n)))


def test_role_stability_by_brute_force_over_all_resamples():
    # A flips half the sequences, B none; G ranks A below B. On the full sample
    # rank_C(A) = 2, rank_C(B) = 1: Delta_A = -1 (hero at t=1), Delta_B = +1 (bloat). A
    # resample that draws no flipped sequence ties them (Delta 0.5: both aligned).
    g = [1.0, 2.0]
    boot, info = spread.bootstrap_roles(_outcomes(4, [2, 0]), g, [1], idx=_all_resamples(4))
    assert list(boot["role_t1"]) == ["hero", "bloat"]
    # P(no flipped sequence among 4 draws) = (1/2)^4
    assert list(boot["stability_t1"]) == pytest.approx([15 / 16, 15 / 16])
    assert info["n_boot"] == 256
    # two sequences, one flipped: the role goes with probability (1/2)^2
    boot2, _ = spread.bootstrap_roles(_outcomes(2, [1, 0]), g, [1], idx=_all_resamples(2))
    assert list(boot2["stability_t1"]) == pytest.approx([0.75, 0.75])
    # at t = 2 both are aligned on every resample: stability 1
    boot3, _ = spread.bootstrap_roles(_outcomes(4, [2, 0]), g, [2], idx=_all_resamples(4))
    assert list(boot3["role_t2"]) == ["aligned", "aligned"] and list(boot3["stability_t2"]) == [1.0, 1.0]


def test_role_stability_random_resamples_are_seeded_and_near_the_exact_share():
    o = _outcomes(4, [2, 0])
    a, ia = spread.bootstrap_roles(o, [1.0, 2.0], [1], n_boot=20000, seed=3)
    b, ib = spread.bootstrap_roles(o, [1.0, 2.0], [1], n_boot=20000, seed=3)
    assert a.equals(b) and ia == ib
    assert a["stability_t1"].iloc[0] == pytest.approx(15 / 16, abs=0.01)


def test_resampled_c_equals_the_mean_over_drawn_rows():
    rng = np.random.default_rng(0)
    o = rng.random((7, 4)) < 0.6
    idx = spread.resample_indices(7, 5, seed=1)
    cb = spread.resampled_c(o, idx)
    d = o[:, :1].astype(float) - o[:, 1:]
    for b in range(5):
        assert cb[b] == pytest.approx(d[idx[b]].mean(0))


def test_bootstrap_rho_interval_contains_the_full_sample_rho():
    rng = np.random.default_rng(5)
    n, k = 300, 6
    p = np.linspace(0.05, 0.6, k)  # component i flips with probability p[i]
    o = np.ones((n, 1 + k), bool)
    o[:, 1:] = rng.random((n, k)) >= p
    g = np.arange(k, dtype=float)
    _, info = spread.bootstrap_roles(o, g, [2], n_boot=500, seed=0)
    from scipy.stats import spearmanr

    rho = spearmanr(g, (o[:, :1].astype(float) - o[:, 1:]).mean(0)).statistic
    assert info["rho_boot_lo"] <= rho <= info["rho_boot_hi"]


def test_within_2se_by_hand():
    # 8 sequences: A flips all (C = 1, SE 0), B none (C = 0, SE 0), H flips 4 (C 0.5,
    # SE sqrt(2/7)/sqrt(8) = 0.189), D flips 1 (C 0.125, SE 0.125).
    w = spread.within_se(_outcomes(8, [8, 0, 4, 1]))
    assert list(w["C"]) == pytest.approx([1.0, 0.0, 0.5, 0.125])
    assert w["C_se"].iloc[2] == pytest.approx(math.sqrt(8 / 7 * 0.25) / math.sqrt(8))
    # |C| <= 2 SE: B (0 <= 0) and D (0.125 <= 0.25); not A (1 > 0) nor H (0.5 > 0.378)
    assert list(w["C_within_2se_of_zero"]) == [False, True, False, True]
    # pairs: B-D differ on one sequence (0.125 <= 2 * 0.125): close. A-H: 0.5 vs 2*0.189.
    # H-D: per-sequence difference [0,1,1,1,0,0,0,0]: mean 0.375, SE 0.183 -> not close.
    assert list(w["C_close"]) == [0, 1, 0, 1]
    assert int(w["C_within_2se_of_other"].sum()) == 2


def test_outcomes_give_causal_scores_C(trained_sort_folder):
    """The saved orientation of the outcomes [sequences, 1 + components] gives the C of
    heroes.causal_scores (computed from the ablations themselves)."""
    from selfrepair.core import components as C
    from selfrepair.core import models
    from selfrepair.heroes import scores as heroes
    from selfrepair.tasks import sequences as S

    hf = models.load_hf(trained_sort_folder)
    batch = S.eval_set("sort", 5, 120, seed=3)
    comps = C.all_components(hf.config.n_layer, hf.config.n_head)
    ref = heroes.causal_scores(hf, batch, comps, "zero", None)
    correct = heroes.ablation_correct(hf, batch, [[]] + [[c] for c in comps], "zero", None)
    w = spread.within_se(correct.T.numpy())
    assert list(w["C"]) == pytest.approx(list(ref["C"]), abs=1e-7)  # causal_scores means in float32


# ---- paired differences (protocol grid) ------------------------------------------------


def test_paired_difference_by_hand():
    cell = {1: 0.5, 2: 0.6, 3: 0.7, 5: float("nan")}
    default = {1: 0.4, 2: 0.5, 3: 0.55, 4: 0.9, 5: 0.3}
    r = spread.paired_difference(cell, default, n_boot=2000)
    assert r["n_paired"] == 3 and r["seeds"] == "1 2 3"
    assert r["mean_diff"] == pytest.approx((0.1 + 0.1 + 0.15) / 3)
    assert 0.1 - 1e-12 <= r["ci_lo"] <= r["mean_diff"] <= r["ci_hi"] <= 0.15 + 1e-12
    assert r["decided"] and spread.change_word(3, r["ci_lo"], r["ci_hi"]) == "raises"
    mixed = spread.paired_difference({1: 0.5, 2: 0.3}, {1: 0.4, 2: 0.4})
    assert not mixed["decided"] and spread.change_word(2, mixed["ci_lo"], mixed["ci_hi"]) == "no clear change"
    assert spread.change_word(2, -0.3, -0.1) == "lowers"
    one = spread.paired_difference({1: 0.5}, {1: 0.4})
    assert one["n_paired"] == 1 and not one["decided"] and math.isnan(one["ci_lo"])
    assert spread.change_word(0, float("nan"), float("nan")) == "no paired seeds"


def _grid_inputs():
    seeds = pd.DataFrame(
        {
            "cell": ["default"] * 3 + ["site"] * 2,
            "task": ["sort"] * 5,
            "seed": [1, 2, 3, 1, 2],
            "status": ["kept"] * 5,
            "rho": [0.2, 0.3, 0.4, 0.5, 0.7],
            "heroes": [1, 1, 1, 2, 2],
            "bloats": [1, 1, 1, 1, 1],
        }
    )
    rows = []
    for r in seeds.itertuples():
        for comp, layer, role, g in (
            ("L1H0", 1, "bloat", 0.2),
            ("L1H1", 1, "hero" if r.cell == "site" else "aligned", 0.1),
            ("L0H0", 0, "hero", 0.3),
        ):
            rows.append(
                {
                    "cell": r.cell,
                    "task": r.task,
                    "seed": r.seed,
                    "component": comp,
                    "layer": layer,
                    "role_t6": role,
                    "G": g,
                    "status": "kept",
                }
            )
    return seeds, pd.DataFrame(rows)


def test_grid_paired_table_and_claims_change():
    seeds, comps = _grid_inputs()
    values = grid_tables.seed_values(seeds, comps, 6)
    assert list(values.columns[:3]) == ["cell", "task", "seed"]
    assert values.set_index(["cell", "seed"]).loc[("site", 1), "heroes_layer1"] == 1
    paired = grid_tables.paired_table(values, n_boot=500).set_index("quantity")
    # rho: site - default on seeds 1, 2 = 0.3 and 0.4 (seed 3 has no site value)
    assert paired.loc["rho", "n_paired"] == 2 and paired.loc["rho", "seeds"] == "1 2"
    assert paired.loc["rho", "mean_diff"] == pytest.approx(0.35)
    assert paired.loc["rho", "default_mean"] == pytest.approx(0.25)
    assert bool(paired.loc["rho", "decided"]) and paired.loc["rho", "change"] == "raises"
    assert paired.loc["bloats", "change"] == "no clear change" and not bool(paired.loc["bloats", "decided"])
    # the claims table states the change on the claim's scale
    rho = pd.DataFrame(
        {
            "cell": ["default", "site"],
            "task": ["sort", "sort"],
            "rho_mean": [0.3, 0.6],
            "ci_lo": [0.2, 0.5],
            "ci_hi": [0.4, 0.7],
        }
    )
    layers = pd.DataFrame(
        {
            "cell": ["default", "site"],
            "task": ["sort"] * 2,
            "threshold": [6, 6],
            "layer": [1, 1],
            "hero_per10": [0.0, 10.0],
            "bloat_per10": [10.0, 10.0],
        }
    )
    empty = pd.DataFrame(columns=["cell", "task", "group", "layer", "mean_individual", "mean_joint", "ratio", "G_mean"])
    claims = [
        {"id": "rho_sort", "claim": "s", "value": 0.27, "tolerance": 0.24},
        {"id": "sort_layer1_bloats", "claim": "b", "value": 21, "tolerance": 5},
        {"id": "bloat_superadditivity", "claim": "x", "value": 14.0, "tolerance": 5.0},
    ]
    t = heroes_claims.claims_table(rho, layers, empty, empty, claims, 6, paired.reset_index())
    site = t[t["cell"] == "site"].set_index("id")
    assert site.loc["rho_sort", "paired_diff"] == pytest.approx(0.35)
    assert site.loc["rho_sort", "change"] == "raises" and bool(site.loc["rho_sort", "decided"])
    assert site.loc["sort_layer1_bloats", "paired_diff"] == pytest.approx(0.0)  # 10 x (1 - 1)
    assert site.loc["sort_layer1_bloats", "change"] == "no clear change"
    assert site.loc["bloat_superadditivity", "change"] == "no per-seed value"
    assert (t[t["cell"] == "default"]["change"] == "").all()
    # the unpaired change is kept as it was
    assert site.loc["rho_sort", "change_vs_default"] == pytest.approx(0.3)
    # status from the CI: default [0.2, 0.4] lies inside 0.27 +- 0.24 = [0.03, 0.51];
    # site [0.5, 0.7] straddles 0.51
    d = t[t["cell"] == "default"].set_index("id")
    assert d.loc["rho_sort", "status"] == "reproduced" and site.loc["rho_sort", "status"] == "fragile"
    assert site.loc["rho_sort", "ci_low"] == 0.5


# ---- the fragile status ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, lo, hi, status",
    [
        (0.72, 0.68, 0.76, "reproduced"),  # CI inside [0.64, 0.80]
        (0.49, 0.32, 0.65, "fragile"),  # the reference run's rho_reverse: straddles 0.64
        (0.70, 0.60, 0.85, "fragile"),  # straddles both edges
        (0.62, 0.56, 0.63, "differs"),  # wholly below the band
        (0.90, 0.81, 0.95, "differs"),  # wholly above
        (0.62, float("nan"), float("nan"), "differs"),  # no CI: the value decides
        (0.66, None, None, "reproduced"),
        (0.64, 0.64, 0.80, "reproduced"),  # touching the edges counts as inside
        (float("nan"), 0.1, 0.2, "not run"),
    ],
)
def test_status_from_a_ci(value, lo, hi, status):
    assert published.status_of(0.72, value, 0.08, lo, hi) == status


def test_compare_with_measured_fills_the_ci_columns():
    claims = [
        {"id": "a", "claim": "x", "source": "s", "value": 0.72, "tolerance": 0.08},
        {"id": "b", "claim": "y", "source": "s", "value": 0.72, "tolerance": 0.08},
        {"id": "c", "claim": "z", "source": "s", "value": 0.72, "tolerance": 0.08},
    ]
    t = published.compare(
        "p", claims, {"a": Measured(0.49, 0.32, 0.65, "sd 0.28"), "b": Measured(0.75, 0.70, 0.78), "c": 0.5}
    )
    assert list(t["status"]) == ["fragile", "reproduced", "differs"]
    assert t.loc[0, "ci_low"] == 0.32 and t.loc[0, "ci_high"] == 0.65 and t.loc[0, "note"] == "sd 0.28"
    assert math.isnan(t.loc[2, "ci_low"])
    assert set(t["status"]) <= set(published.STATUSES)


def test_strict_mode_lists_fragile_and_fails_only_on_differs():
    t = pd.DataFrame(
        {
            "paper": ["p", "p"],
            "id": ["a", "b"],
            "published": [0.72, 1.0],
            "tolerance": [0.08, 0.1],
            "reproduced": [0.49, 1.0],
            "ci_low": [0.32, np.nan],
            "ci_high": [0.65, np.nan],
            "status": ["fragile", "reproduced"],
        }
    )
    log = published.summary_report(t, strict=True)  # fragile never fails
    assert "1 fragile" in log and "0.32" in log
    bad = pd.concat([t, t.iloc[[1]].assign(id="c", status="differs")])
    with pytest.raises(SystemExit, match="published numbers differ"):
        published.summary_report(bad, strict=True)
    assert "fragile" in published.summary_report(bad, strict=False)


# ---- paper A's aggregate tables ------------------------------------------------------------


def _roles():
    rows = []
    for seed, stable in ((1, [True, False, True]), (2, [True, True, True])):
        for (comp, layer, role), st in zip((("L1H1", 1, "bloat"), ("L1H3", 1, "bloat"), ("L3H3", 3, "hero")), stable):
            rows.append(
                {
                    "task": "sort",
                    "seed": seed,
                    "component": comp,
                    "layer": layer,
                    "role": role,
                    "role_t6": role,
                    "stable": st,
                    "stable_t6": st,
                    "stability": 1.0 if st else 0.5,
                    "status": "kept",
                    "G": 1.0,
                    "C": 0.1,
                    "C_mean": 0.1,
                    "C_zero": 0.1,
                    "baseline_acc": 0.5,
                    "C_within_2se_of_other": not st,
                    "C_within_2se_of_zero": False,
                    "rho_boot_lo": -0.2,
                    "rho_boot_hi": 0.4,
                }
            )
    return pd.DataFrame(rows)


def test_heroes_tables_count_stable_roles_beside_all_roles():
    roles = _roles()
    by_layer = heroes_tables.roles_by_layer(roles, [6]).set_index("layer")
    assert by_layer.loc[1, "bloat"] == 4 and by_layer.loc[1, "bloat_stable"] == 3
    assert by_layer.loc[3, "hero"] == 2 and by_layer.loc[3, "hero_stable"] == 2
    stab = heroes_tables.role_stability(roles).set_index("component")
    assert stab.loc["L1H3", "bloat"] == 2 and stab.loc["L1H3", "bloat_stable"] == 1
    assert stab.loc["L1H3", "mean_stability"] == pytest.approx(0.75)
    stable = heroes_claims.stable_claims(by_layer.reset_index(), stab.reset_index(), 6)
    assert stable == {
        "sort_layer1_bloats": 3.0,
        "sort_layer3_heroes": 2.0,
        "sort_L3H3_hero": 10.0,
        "sort_L1H1_bloat": 10.0,
        "sort_L1H3_bloat": 5.0,
    }
    ood = [{"task": "sort", "seed": s, "status": "kept", "N": 9, "accuracy_by_length": {"9": 0.5}} for s in (1, 2)]
    train = [
        {
            "steps": 10,
            "reached_target": True,
            "id_accuracy": 0.95,
            "protocol": {"padding": "per_batch", "init": "transformers"},
        }
    ] * 2
    red = pd.DataFrame(columns=["task", "seed", "group", "n", "joint", "mean_individual"])
    seeds = heroes_tables.seeds_table(roles, ood, train, red).set_index("seed")
    assert seeds.loc[1, "n_bloats"] == 2 and seeds.loc[1, "n_bloats_stable"] == 1
    assert seeds.loc[1, "n_C_within_2se_of_other"] == 1 and seeds.loc[2, "n_C_within_2se_of_other"] == 0
    # a kept seed's rho claim carries its resampling interval
    seeds = seeds.reset_index().assign(seed=[456, 2020], rho=[0.1, 0.1])
    rho = heroes_tables.rho_summary(seeds)
    empty = pd.DataFrame(columns=["task", "group", "layer", "n_seeds", "G_mean", "role", "entropy", "sink_mass"])
    m = heroes_claims.measured_claims(
        seeds, rho, by_layer.reset_index(), stab.reset_index(), empty, empty, empty, 6, [6]
    )
    assert isinstance(m["rho_sort_seed456"], Measured) and (m["rho_sort_seed456"].lo, m["rho_sort_seed456"].hi) == (
        -0.2,
        0.4,
    )
    assert isinstance(m["rho_sort"], Measured) and m["rho_sort"].value == pytest.approx(0.1)
    assert "stable roles only: 3" in m["sort_layer1_bloats"].note
