import math

import pytest

from selfrepair.core import analysis
from selfrepair.heroes import scores as heroes


def test_ranks_average_ties_and_roles_at_exact_threshold():
    # G ranks: a=1, b=2.5, c=2.5, d=4 ; C ranks: a=4, b=1, c=2, d=3
    t = analysis.roles_table(list("abcd"), [0.1, 0.2, 0.2, 0.9], [9, 1, 2, 3], thresholds=[1.5, 3])
    assert t["rank_G"].tolist() == [1, 2.5, 2.5, 4]
    assert t["delta"].tolist() == [-3, 1.5, 0.5, 1]
    assert t["role_t3"].tolist() == ["hero", "aligned", "aligned", "aligned"]  # -3 <= -3
    assert t["role_t1.5"].tolist() == ["hero", "bloat", "aligned", "aligned"]  # 1.5 >= 1.5


def test_role_at_plus_minus_six():
    assert analysis.role(-6, 6) == "hero"
    assert analysis.role(6, 6) == "bloat"
    assert analysis.role(-5.5, 6) == "aligned"
    assert analysis.role(5.5, 6) == "aligned"


def test_twenty_components_delta_extremes():
    g = list(range(20))
    c = g[::-1]  # fully inverted
    t = analysis.roles_table([str(i) for i in g], g, c, [6])
    assert t["delta"].tolist() == [2 * i - 19 for i in range(20)]
    assert (t["role_t6"] == "hero").sum() == 7  # delta <= -6: i = 0..6 (-19..-7)
    assert (t["role_t6"] == "bloat").sum() == 7


def test_spearman_and_constant():
    assert analysis.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert analysis.spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)
    assert math.isnan(analysis.spearman([1, 2, 3], [0, 0, 0]))


@pytest.mark.parametrize(
    "accs, expect",
    [
        ({8: 0.80, 9: 0.75, 10: 0.3, 11: 0.1}, 9),  # upper edge included
        ({8: 0.9, 9: 0.76, 10: 0.20, 11: 0.1}, 10),  # lower edge included
        ({8: 0.9, 9: 0.751, 10: 0.199, 11: 0.0}, None),  # just outside both: skipped
        ({8: 0.5, 9: 0.4, 10: 0.3, 11: 0.2}, 8),  # first in window wins
    ],
)
def test_ood_selection_window_edges(accs, expect):
    assert heroes.select_ood_length(accs, [8, 9, 10, 11], [0.20, 0.75]) == expect


def test_bootstrap_ci_contains_mean():
    lo, hi = analysis.bootstrap_ci([0.1, 0.2, 0.3, 0.4, 0.5])
    assert lo < 0.3 < hi
