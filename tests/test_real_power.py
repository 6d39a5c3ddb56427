"""The power table of the real-LM claims (core.real_power): n needed, sizes and costs
worked out by hand on hand-made claims and status tables."""

import math

import pandas as pd
import pytest

from selfrepair.core import real_claims as R
from selfrepair.core import real_power as P


def test_n_needed_by_hand():
    # half-width 0.4 at n = 16 against an effect of 0.2: (0.4 / 0.2)^2 = 4 times the units
    assert P.n_needed(16, 0.4, 0.2) == 64
    assert P.n_needed(16, 0.4, -0.2) == 64  # the sign of the effect does not matter
    assert P.n_needed(16, 0.1, 0.2) == 4  # decided already: a quarter would do
    assert P.n_needed(20, 0.3, 0.2) == 45  # 20 x 2.25
    assert P.n_needed(10, 0.3, 0.2, z_ratio=2.0) == 90  # a quantile twice as wide: 4 x 22.5
    assert math.isinf(P.n_needed(16, 0.4, 0.0))
    with pytest.raises(ValueError, match="finite"):
        P.n_needed(16, 0.4, math.nan)


def _claims():
    rows = [
        # paper B, scored prompts over 2 data seeds of 8: n 16, half 0.4 (measured - lo), effect 0.2
        R.row("m", "coax", "damage", "damage", "", 0.2, (-0.2, 0.5), 16, resampled="scored prompts (2 prompt set(s))"),
        # paper B, truth prompts: n 16, half 0.2999 (hi - measured, below 0), effect -0.3: fails (side above)
        R.row("m", "coax", "auc", "auc", "", -0.3, (-0.5, -0.0001), 16, resampled="truth prompts (backups ...)"),
        # paper C on ioi: 20 pairs, half 0.3, effect 0.2
        R.row("m", "gim", "cpr_ioi", "ioi: GIM beats", "", 0.2, (-0.1, 0.6), 20, resampled="pairs"),
        # paper C's feature attribution: 4 answered prompts of 5, half 0.2, effect 0.1
        R.row("m", "gim", "fa", "ioi: GIM's FA", "", 0.1, (-0.1, 0.2), 4, resampled="prompts"),
        R.not_run("m", "gim", "x", "addition: GIM beats", "", "task not solved"),
    ]
    return R.table(rows)


def _costs():
    coax = pd.DataFrame({"model": ["m", "m"], "experiment": ["ioi", "induction"], "cpu_s": [100.0, 50.0]})
    gim = pd.DataFrame({
        "model": ["m"] * 4, "task": ["ioi", "ioi", "arithmetic", "ioi"],
        "part": ["localization", "localization", "localization", "feature_attribution"],
        "method": ["gim", "eap", "gim", "gim"], "cpu_s": [30.0, 10.0, 99.0, 5.0],
    })  # fmt: skip
    return P.part_costs(coax, gim)


SIZES = {
    ("m", "coax"): {"n_prompts": 8, "n_truth": 16, "induction_prompts": 6},  # 2 data seeds of 8 prompts
    ("m", "gim"): {"n_eval": 20, "fa_examples": 5},
}


def test_power_table_by_hand():
    t = P.power_table(_claims(), _costs(), SIZES).set_index("id")
    assert "x" not in t.index  # not run: no interval, no power
    d = t.loc["damage"]
    # n 16 -> 64 prompts over 2 seeds: n_prompts 8 -> 32; the ioi part 100 s -> 400 s
    assert (d.n_needed, d.size_key, d["size"], d.size_needed) == (64, "n_prompts", 8, 32)  # d.size: pandas
    assert d.projected_cpu_s == pytest.approx(400.0) and d.half_width == pytest.approx(0.4)
    a = t.loc["auc"]
    # half 0.2999 against 0.3: decided; (0.2999 / 0.3)^2 x 16 = 15.99 -> 16 truth prompts
    assert (a.verdict, a.n_needed, a.size_needed) == ("fails", 16, 16) and a.effect == pytest.approx(-0.3)
    c = t.loc["cpr_ioi"]
    # 20 x (0.3 / 0.2)^2 = 45 pairs; the ioi localization 30 + 10 s (not arithmetic's 99) -> x 45 / 20
    assert (c.n_needed, c.size_needed, c.part) == (45, 45, "localization (ioi)")
    assert c.part_cpu_s == pytest.approx(40.0) and c.projected_cpu_s == pytest.approx(90.0)
    f = t.loc["fa"]
    # 4 x (0.2 / 0.1)^2 = 16 answered prompts; 4 of 5 answered -> 20 examples; 5 s -> 20 s
    assert (f.n_needed, f.size_needed, f.projected_cpu_s) == (16, 20, pytest.approx(20.0))
    # Holm's bound: the quantile of 0.05 / (2 x 4 tested rows) over 1.96
    from statistics import NormalDist

    ratio = NormalDist().inv_cdf(1 - 0.05 / 8) / NormalDist().inv_cdf(0.975)
    assert d.n_needed_holm == math.ceil(64 * ratio**2)


def test_the_pruning_claim_grows_with_its_evaluation_windows():
    claims = R.table([R.row("m", "coax", "prune", "prune", "", 0.1, (-0.1, 0.3), 48,
                            resampled="evaluation windows (the same windows for every method)")])  # fmt: skip
    # coax_lm's pruning row (not run there, 0 s) and rule coax_lm_pruning's (600 s) side by side
    status = pd.DataFrame({"model": ["m", "m"], "experiment": ["pruning", "pruning"], "cpu_s": [0.0, 600.0]})
    t = P.power_table(claims, P.part_costs(status, None), {("m", "coax"): {"pruning_n_eval": 48}}).iloc[0]
    # 48 x (0.2 / 0.1)^2 = 192 windows; the part's 600 s x 192 / 48
    assert (t.size_key, t.n_needed, t.size_needed, t.part) == ("pruning_n_eval", 192, 192, "pruning")
    assert t.projected_cpu_s == pytest.approx(2400.0)


def test_power_table_bad_input():
    claims = _claims()
    with pytest.raises(ValueError, match="threshold"):
        P.power_table(claims.drop(columns="threshold"), _costs(), SIZES)
    odd = claims.copy()
    odd.loc[0, "resampled"] = "heads"
    with pytest.raises(ValueError, match="no config size is known for an interval over 'heads'"):
        P.power_table(odd, _costs(), SIZES)
    with pytest.raises(ValueError, match="no size 'n_eval' given for m"):
        P.power_table(claims, _costs(), {("m", "coax"): SIZES[("m", "coax")], ("m", "gim"): {"fa_examples": 5}})
    with pytest.raises(ValueError, match="cpu_s"):
        P.part_costs(pd.DataFrame({"model": ["m"], "experiment": ["ioi"]}), None)
    with pytest.raises(ValueError, match="names no task"):
        P.task_of("GIM beats")


def test_power_markdown_says_each_size_and_what_is_open():
    from selfrepair.tooling.real_lms_table import power_markdown

    md = power_markdown(P.power_table(_claims(), _costs(), SIZES))
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| m | `")}
    # damage: inconclusive, 64 prompts needed, n_prompts 8 -> 32, the ioi part 100 s -> 400 s
    assert "| 16 scored prompts | 64 / " in rows["`damage`"] and "`n_prompts` 8 -> 32" in rows["`damage`"]
    assert rows["`damage`"].endswith("| ioi | 1.7 -> 6.7 min |")
    assert "| fails / " in rows["`auc`"]
    # the per-part summary lists only the open claims, cheapest first
    assert "| m | ioi | 1.7 min | `damage` n_prompts 32: 7 min |" in md
    assert "| m | localization (ioi) | 0.7 min | `cpr_ioi` n_eval 45: 2 min |" in md
