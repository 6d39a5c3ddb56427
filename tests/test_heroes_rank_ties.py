"""Paper A's rank deltas with ties (issue 51): Delta = rank(G) - rank(C), ascending ranks
with ties averaged (scipy's rankdata default, as in the authors' pipeline). C is an
accuracy drop k/n, so components tie often. Every expected value below is worked out by
hand; each check fails if the ranks become ordinal (or min/max/dense).

Six components, C from 10 sequences (k of them broken by the ablation, C = k/10):
    component   0    1    2    3    4    5
    G          0.1  0.2  0.2  0.4  0.5  0.6   rank_G  1  2.5  2.5  4  5  6
    k           2    2    2    0    5    1    rank_C  4  4    4    1  6  2
    (C = 0.2 three times: ranks 3, 4, 5 -> 4 each; G = 0.2 twice: ranks 2, 3 -> 2.5)
    Delta      -3  -1.5 -1.5   3   -1    4
Roles (hero: Delta <= -t inclusive / < -t strict; bloat: Delta >= t / > t):
    t = 3:   inclusive  hero aligned aligned bloat aligned bloat
             strict     aligned aligned aligned aligned aligned bloat
    t = 1.5: inclusive  hero hero hero bloat aligned bloat   (1 and 2 sit on -1.5)
             strict     hero aligned aligned bloat aligned bloat
Ordinal ranks would give rank_C 3 4 5 1 6 2, rank_G 1 2 3 4 5 6, Delta -2 -2 -2 3 -1 4.
"""

import numpy as np
import pytest
from scipy import stats

from selfrepair.core import analysis
from selfrepair.heroes import protocol, spread

NAMES = ["L0H0", "L0H1", "L0H2", "L0H3", "L0MLP", "L1MLP"]
G = [0.1, 0.2, 0.2, 0.4, 0.5, 0.6]
K = [2, 2, 2, 0, 5, 1]
RANK_G = [1, 2.5, 2.5, 4, 5, 6]
RANK_C = [4, 4, 4, 1, 6, 2]
DELTA = [-3, -1.5, -1.5, 3, -1, 4]
ROLES = {
    ("inclusive", 3): ["hero", "aligned", "aligned", "bloat", "aligned", "bloat"],
    ("strict", 3): ["aligned", "aligned", "aligned", "aligned", "aligned", "bloat"],
    ("inclusive", 1.5): ["hero", "hero", "hero", "bloat", "aligned", "bloat"],
    ("strict", 1.5): ["hero", "aligned", "aligned", "bloat", "aligned", "bloat"],
}


def _correct(n_seq=10):
    """Exact-match rows [1 + 6, n_seq]: row 0 intact (all right), component i's row wrong
    on its first K[i] sequences."""
    rows = np.ones((1 + len(K), n_seq), dtype=int)
    for i, k in enumerate(K):
        rows[1 + i, :k] = 0
    return rows


def test_hand_values_are_not_what_ordinal_ranks_give():
    """The case discriminates: other tie methods move Delta on the tied components."""
    c = np.array(K) / 10
    for method in ("ordinal", "min", "max", "dense"):
        other = stats.rankdata(G, method=method) - stats.rankdata(c, method=method)
        assert not np.array_equal(other, DELTA), method


def test_rank_delta_averages_tied_ranks():
    c = [k / 10 for k in K]
    np.testing.assert_array_equal(analysis.rank_delta(G, c), DELTA)
    df = analysis.roles_table(NAMES, G, c, [3, 1.5])
    np.testing.assert_array_equal(df["rank_G"], RANK_G)
    np.testing.assert_array_equal(df["rank_C"], RANK_C)
    np.testing.assert_array_equal(df["delta"], DELTA)
    assert list(df["role_t3"]) == ROLES[("inclusive", 3)]  # analysis.role is the inclusive rule
    assert list(df["role_t1.5"]) == ROLES[("inclusive", 1.5)]


@pytest.mark.parametrize("boundary", ["inclusive", "strict"])
def test_cell_roles_at_the_threshold_under_both_boundaries(boundary):
    """From exact-match rows to C = k/10, tied ranks, Delta and the cell's roles."""
    proto = {"g_normalization": "raw", "n_eval": 10, "role_boundary": boundary}
    df = protocol.cell_components(NAMES, G, [1] * 6, _correct(), proto, [3, 1.5])
    np.testing.assert_allclose(df["C"], np.array(K) / 10)
    np.testing.assert_array_equal(df["rank_C"], RANK_C)
    np.testing.assert_array_equal(df["delta"], DELTA)
    assert list(df["role_t3"]) == ROLES[(boundary, 3)]
    assert list(df["role_t1.5"]) == ROLES[(boundary, 1.5)]


def test_bootstrap_full_sample_roles_use_averaged_ranks():
    """spread.bootstrap_roles' full-sample roles (inclusive rule) on the same outcomes;
    the identity resample keeps every role (stability 1)."""
    outcomes = _correct().T  # [sequences, 1 + components]
    idx = np.arange(10)[None, :]
    df, _ = spread.bootstrap_roles(outcomes, G, [3, 1.5], idx=idx)
    assert list(df["role_t3"]) == ROLES[("inclusive", 3)]
    assert list(df["role_t1.5"]) == ROLES[("inclusive", 1.5)]
    assert (df["stability_t3"] == 1).all() and (df["stability_t1.5"] == 1).all()
