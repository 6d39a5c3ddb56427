"""Shapley values and pairwise interactions of the players of a cooperative game.

A *game* is a callable ``value(sets) -> v``: ``sets`` is a list of coalitions (each a
list of players, e.g. :class:`selfrepair.core.components.Component`), ``v`` a 1-D array
(or tensor, or list of floats) with ``v[k]`` the metric when the players of ``sets[k]``
are ablated. The empty coalition is the intact model. Games are evaluated in batches:
every function here hands the game many coalitions per call (see
:mod:`selfrepair.groundtruth.games`, where one call is a few batched forwards).

Everything is computed for the *drop* game d(S) = v(empty) - v(S), so a player whose
ablation lowers the metric gets a positive value. The Shapley value of player i is

    phi_i = sum over S of N \\ {i} of |S|! (n - |S| - 1)! / n! * (d(S u {i}) - d(S))
          = the mean over all n! orderings of i's marginal drop v(pre) - v(pre u {i}),

pre being the players before i in the ordering. Efficiency: sum_i phi_i = d(N) =
v(empty) - v(N). Coalitions are bit masks internally: bit i is ``players[i]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import special

Game = Callable[[list[list]], object]
MAX_EXACT_PLAYERS = 20
MIN_PAIRS = 32  # the permutation estimator's fewest antithetic pairs before it may stop


def t_halfwidth(se, n_pairs: int, level: float = 0.95) -> np.ndarray:
    """Half-width of the two-sided Student-t interval of a mean of ``n_pairs`` independent
    pair estimates with standard error ``se``: t_{(1 + level) / 2, n_pairs - 1} x se.
    NaN (as an array shaped like ``se``) with fewer than two pairs."""
    se = np.asarray(se, dtype=np.float64)
    if n_pairs < 2:
        return np.full(se.shape, np.nan)
    # special.stdtrit(df, q) is what scipy.stats.t.ppf(q, df) computes (the same bits),
    # without importing scipy.stats (about 0.6 CPU-s of every ground-truth job)
    return float(special.stdtrit(n_pairs - 1, (1 + level) / 2)) * se


@dataclass
class ShapleyResult:
    """Shapley values ``values[i]`` of ``players[i]`` for the drop v(empty) - v(S).

    ``se``: 0 for exact values; for the permutation estimator the Monte Carlo standard
    error of each estimate (see :func:`permutation_shapley`). It does not include the
    sampling error of v itself (the finite evaluation data). ``n_pairs``: the antithetic
    pairs the estimate and its ``se`` rest on (0 for exact values). :attr:`ci95`: the
    half-width of the 95% interval, Student t with ``n_pairs - 1`` degrees of freedom
    (0 for exact values). ``n_evaluations``: distinct coalitions the game evaluated;
    ``n_truncated``: marginal contributions set to 0 by truncation at the floor, without
    evaluation.
    """

    players: list
    values: np.ndarray
    se: np.ndarray
    v_empty: float
    v_full: float
    method: str
    n_permutations: int = 0
    n_evaluations: int = 0
    n_truncated: int = 0
    converged: bool = True
    n_pairs: int = 0

    @property
    def ci95(self) -> np.ndarray:
        """Half-width of each value's 95% interval (value +- ci95): t_{0.975, n_pairs - 1}
        x ``se`` for the permutation estimator, 0 for exact values."""
        if self.method == "exact":
            return np.zeros(len(self.values))
        return t_halfwidth(self.se, self.n_pairs)

    def to_frame(self) -> pd.DataFrame:
        """One row per player: ``component`` (its name), ``shapley``, ``se``, ``ci95`` (the
        95% half-width) and ``n_pairs``."""
        return pd.DataFrame(
            {
                "component": [str(p) for p in self.players],
                "shapley": self.values,
                "se": self.se,
                "ci95": self.ci95,
                "n_pairs": self.n_pairs,
            }
        )


def evaluate(game: Game, sets: Sequence[Sequence]) -> np.ndarray:
    """``game(sets)`` as a float64 array of length ``len(sets)`` (tensors are moved to the
    CPU); ValueError when the game returns another number of values."""
    out = game([list(s) for s in sets])
    if hasattr(out, "detach"):
        out = out.detach().cpu().numpy()
    v = np.asarray(out, dtype=np.float64).reshape(-1)
    if v.shape[0] != len(sets):
        raise ValueError(f"the game returned {v.shape[0]} values for {len(sets)} coalitions")
    return v


def members(players: Sequence, mask: int) -> list:
    """The players whose bit is set in ``mask`` (bit i is ``players[i]``), in order."""
    return [p for i, p in enumerate(players) if mask >> i & 1]


# ---------------------------------------------------------------- exact -----------
def coalition_values(
    game: Game, players: Sequence, max_players: int = MAX_EXACT_PLAYERS, chunk: int = 4096
) -> np.ndarray:
    """v(S) of all 2^n coalitions: array [2^n] indexed by bit mask (bit i = ``players[i]``).

    The game gets ``chunk`` coalitions per call. ValueError, before any evaluation, when
    n > ``max_players`` (2^20 coalitions is about a million forwards of the batch).
    """
    n = len(players)
    if n > max_players:
        raise ValueError(
            f"exact Shapley over {n} players needs 2^{n} = {2**n} coalitions; the limit is "
            f"{max_players} players (2^{max_players}): use permutation_shapley"
        )
    total = 1 << n
    out = np.empty(total)
    for start in range(0, total, chunk):
        stop = min(total, start + chunk)
        out[start:stop] = evaluate(game, [members(players, m) for m in range(start, stop)])
    return out


def _n_players(values: np.ndarray) -> int:
    n = int(round(math.log2(len(values)))) if len(values) else -1
    if n < 0 or 1 << n != len(values):
        raise ValueError(f"expected 2^n coalition values, got {len(values)}")
    return n


def shapley_from_values(values: np.ndarray) -> np.ndarray:
    """Exact Shapley values [n] of the drop game from all 2^n values v(S) (by bit mask):

    phi_i = sum_{S not containing i} w(|S|) (v(S) - v(S u {i})), w(s) = 1 / (n C(n-1, s)),
    which equals s! (n - s - 1)! / n!.
    """
    values = np.asarray(values, dtype=np.float64)
    n = _n_players(values)
    masks = np.arange(1 << n, dtype=np.int64)
    size = np.bitwise_count(masks)
    w = np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])
    phi = np.empty(n)
    for i in range(n):
        bit = 1 << i
        s = masks[(masks & bit) == 0]
        phi[i] = np.sum(w[size[s]] * (values[s] - values[s | bit]))
    return phi


def exact_shapley(
    game: Game, players: Sequence, max_players: int = MAX_EXACT_PLAYERS, chunk: int = 4096
) -> ShapleyResult:
    """Exact Shapley values of every player (all 2^n coalitions, ``chunk`` per game call)."""
    v = coalition_values(game, players, max_players, chunk)
    return ShapleyResult(
        players=list(players),
        values=shapley_from_values(v),
        se=np.zeros(len(players)),
        v_empty=float(v[0]),
        v_full=float(v[-1]),
        method="exact",
        n_evaluations=len(v),
    )


def interaction_index_from_values(values: np.ndarray) -> np.ndarray:
    """Exact Shapley interaction index [n, n] of the drop game (Grabisch and Roubens 1999):

    I_ij = sum_{S of N \\ {i, j}} |S|! (n - |S| - 2)! / (n - 1)! * D_ij d(S),
    D_ij d(S) = d(S u {i, j}) - d(S u {i}) - d(S u {j}) + d(S)
              = -(v(S u {i, j}) - v(S u {i}) - v(S u {j}) + v(S)),

    the weight being 1 / ((n - 1) C(n - 2, |S|)). Positive: the pair's joint drop exceeds
    the sum of its parts (redundancy, backup); negative: the parts overlap. Diagonal NaN.
    """
    values = np.asarray(values, dtype=np.float64)
    n = _n_players(values)
    out = np.full((n, n), np.nan)
    if n < 2:
        return out
    masks = np.arange(1 << n, dtype=np.int64)
    size = np.bitwise_count(masks)
    w = np.array([1.0 / ((n - 1) * math.comb(n - 2, s)) for s in range(n - 1)])
    for i in range(n):
        for j in range(i + 1, n):
            bi, bj = 1 << i, 1 << j
            s = masks[(masks & (bi | bj)) == 0]
            delta = values[s | bi | bj] - values[s | bi] - values[s | bj] + values[s]
            out[i, j] = out[j, i] = -np.sum(w[size[s]] * delta)
    return out


def shapley_interactions(
    game: Game, players: Sequence, max_players: int = MAX_EXACT_PLAYERS, chunk: int = 4096
) -> pd.DataFrame:
    """Every pair's exact Shapley interaction index (all 2^n coalitions) and, from the
    same table, its joint-minus-individual drop (the index's S = empty term).

    Columns ``u``, ``v`` (names, u before v in ``players``), ``shapley_interaction``,
    ``joint_minus_individual``.
    """
    v = coalition_values(game, players, max_players, chunk)
    inter = interaction_index_from_values(v)
    rows = []
    for i in range(len(players)):
        for j in range(i + 1, len(players)):
            jmi = v[1 << i] + v[1 << j] - v[(1 << i) | (1 << j)] - v[0]
            rows.append(
                {
                    "u": str(players[i]),
                    "v": str(players[j]),
                    "shapley_interaction": float(inter[i, j]),
                    "joint_minus_individual": float(jmi),
                }
            )
    return pd.DataFrame(rows, columns=["u", "v", "shapley_interaction", "joint_minus_individual"])


# ---------------------------------------------------------------- pairs -----------
def pairwise_interactions(game: Game, players: Sequence, chunk: int = 4096) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Single drops and every pair's joint-minus-individual drop, 1 + n + n(n-1)/2
    coalitions (``chunk`` per game call).

    Returns (singles, pairs): singles has ``unit``, ``drop`` = v(empty) - v({i});
    pairs has ``u``, ``v``, ``drop_u``, ``drop_v``, ``drop_uv`` = v(empty) - v({u, v})
    and ``interaction`` = drop_uv - drop_u - drop_v, the layout of
    :func:`selfrepair.coax.ioi_experiment.ground_truth`'s tables.
    """
    players = list(players)
    n = len(players)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    sets = [[]] + [[p] for p in players] + [[players[i], players[j]] for i, j in pairs]
    v = np.concatenate([evaluate(game, sets[a : a + chunk]) for a in range(0, len(sets), chunk)])
    single = v[0] - v[1 : n + 1]
    joint = v[0] - v[n + 1 :]
    singles = pd.DataFrame({"unit": [str(p) for p in players], "drop": single})
    rows = [
        {
            "u": str(players[i]),
            "v": str(players[j]),
            "drop_u": float(single[i]),
            "drop_v": float(single[j]),
            "drop_uv": float(dj),
            "interaction": float(dj - single[i] - single[j]),
        }
        for (i, j), dj in zip(pairs, joint)
    ]
    return singles, pd.DataFrame(rows, columns=["u", "v", "drop_u", "drop_v", "drop_uv", "interaction"])


# ---------------------------------------------------------------- sampling --------
class _Cache:
    """v(S) by bit mask; evaluates the missing masks of a request in one batched pass."""

    def __init__(self, game: Game, players: Sequence, chunk: int):
        self.game, self.players, self.chunk = game, list(players), chunk
        self.values: dict[int, float] = {}

    def fill(self, masks) -> None:
        todo = list(dict.fromkeys(m for m in masks if m not in self.values))
        for a in range(0, len(todo), self.chunk):
            part = todo[a : a + self.chunk]
            for m, x in zip(part, evaluate(self.game, [members(self.players, m) for m in part])):
                self.values[m] = float(x)


def _prefix_masks(perms: np.ndarray) -> list[list[int]]:
    """For each permutation row, the masks of its prefixes of size 0..n."""
    out = []
    for row in perms:
        m, pre = 0, [0]
        for p in row:
            m |= 1 << int(p)
            pre.append(m)
        out.append(pre)
    return out


def _marginals(cache: _Cache, perms: np.ndarray, floor: float | None, block: int) -> tuple[np.ndarray, int]:
    """Marginal drops [P, n] (by player) along each permutation, and the number of
    marginals set to 0 by truncation.

    Without ``floor``: every prefix of every permutation in one batched fill. With it:
    prefix sizes in blocks of ``block``, each block one fill over the permutations still
    above the floor; after the first prefix at or below the floor, v is taken as the
    value of that prefix for every longer one (marginals 0, not evaluated).
    """
    n_perm, n = perms.shape
    pre = _prefix_masks(perms)
    vals = np.empty((n_perm, n + 1))
    n_trunc = 0
    if floor is None:
        cache.fill(m for row in pre for m in row)
        for r, row in enumerate(pre):
            vals[r] = [cache.values[m] for m in row]
    else:
        cache.fill([0])
        vals[:, 0] = cache.values[0]
        hit = np.full(n_perm, -1)  # prefix size at which each permutation reached the floor
        hit[vals[:, 0] <= floor] = 0
        for k0 in range(1, n + 1, block):
            sizes = range(k0, min(n + 1, k0 + block))
            alive = [r for r in range(n_perm) if hit[r] < 0]
            cache.fill(pre[r][k] for r in alive for k in sizes)
            for r in alive:
                for k in sizes:
                    if hit[r] < 0:
                        vals[r, k] = cache.values[pre[r][k]]
                        if vals[r, k] <= floor:
                            hit[r] = k
        for r in range(n_perm):
            if hit[r] >= 0:
                vals[r, hit[r] + 1 :] = vals[r, hit[r]]
                n_trunc += n - int(hit[r])
    marg = np.empty((n_perm, n))
    drops = vals[:, :-1] - vals[:, 1:]  # drop when the k-th player of the permutation joins
    rows = np.arange(n_perm)[:, None]
    marg[rows, perms] = drops
    return marg, n_trunc


def permutation_shapley(
    game: Game,
    players: Sequence,
    max_permutations: int = 1000,
    rel_se: float = 0.05,
    min_pairs: int = MIN_PAIRS,
    pairs_per_round: int = 8,
    seed: int = 0,
    floor: float | None = None,
    block: int | None = None,
    chunk: int = 4096,
) -> ShapleyResult:
    """Shapley values estimated from antithetic pairs of random permutations.

    Each draw is a uniformly random permutation pi (``numpy.random.default_rng(seed)``)
    and its reverse; the pair's estimate for player i is the mean of i's marginal drop
    v(pre) - v(pre u {i}) along pi and along reverse(pi). The estimate is the mean over
    pairs; ``se`` = sd of the pair estimates (ddof 1) / sqrt(number of pairs), the
    standard error of that mean over independent pairs (Monte Carlo error only).
    Reversal makes every pair exact for games with at most pairwise terms; each of the
    two permutations is uniform, so the estimate is unbiased for any game.

    Rounds of ``pairs_per_round`` pairs are evaluated together (all their prefixes in
    one batched game call; coalitions already evaluated are reused from a cache, so
    v(empty), v(N) and repeated prefixes cost one evaluation each). After each round,
    once at least ``min_pairs`` pairs are in: stop when every player's se <= ``rel_se``
    x (max - min of the current estimates); otherwise stop at ``max_permutations``
    (rounded down to an even number; ``converged`` tells which). The estimator never
    stops before ``min_pairs`` pairs (default 32): a standard deviation from a handful
    of pairs can come out far too small (with 4 pairs an estimate was seen 12 SE from
    the exact value), and the rule would then stop on it. The result carries
    ``n_pairs`` and the t-based 95% half-width ``ci95`` (t with n_pairs - 1 degrees of
    freedom), so the interval says how many pairs it rests on.

    ValueError, before any evaluation, when ``min_pairs`` < 2 (a standard error needs
    two pairs), ``pairs_per_round`` < 1, ``rel_se`` < 0 (0: never stop early) or
    ``max_permutations`` < 2 x ``min_pairs`` (the cap would stop it before its minimum).

    ``floor``: truncation. Once a prefix's value is <= ``floor`` (e.g. accuracy 0), the
    remaining players of that permutation get marginal 0 without evaluation (the player
    that reached the floor keeps its evaluated marginal). This is exact (the same
    estimate as without truncation, permutation by permutation) when the floor is
    absorbing: the metric never goes below the floor and every superset of a coalition
    at the floor is at it too (monotone there). Otherwise it is an approximation: a
    metric that would move again after reaching the floor (recover, or fall further) is
    held at the value where it reached it. With a floor, prefixes are evaluated in
    blocks of ``block`` sizes (default ceil(n / 4)), one game call per block, so that
    permutations that reached the floor are dropped from later calls.
    """
    players = list(players)
    n = len(players)
    _check_permutation_args(n, max_permutations, rel_se, min_pairs, pairs_per_round)
    block = block or max(1, -(-n // 4))
    rng = np.random.default_rng(seed)
    cache = _Cache(game, players, chunk)
    full = (1 << n) - 1
    cache.fill([0, full])
    pair_est, est, se, n_trunc, converged = _pair_rounds(
        cache, n, rng, max_permutations // 2, pairs_per_round, min_pairs, rel_se, floor, block
    )
    return ShapleyResult(
        players=players,
        values=est,
        se=se,
        v_empty=cache.values[0],
        v_full=cache.values[full],
        method="permutation",
        n_permutations=2 * len(pair_est),
        n_evaluations=len(cache.values),
        n_truncated=n_trunc,
        converged=converged,
        n_pairs=len(pair_est),
    )


def _check_permutation_args(n: int, max_permutations: int, rel_se: float, min_pairs, pairs_per_round) -> None:
    """The ValueErrors of :func:`permutation_shapley`, raised before any evaluation."""
    if n == 0:
        raise ValueError("no players")
    if not isinstance(min_pairs, (int, np.integer)) or min_pairs < 2:
        raise ValueError(
            f"min_pairs must be an integer >= 2 (a standard error needs two antithetic pairs), got {min_pairs!r}"
        )
    if not isinstance(pairs_per_round, (int, np.integer)) or pairs_per_round < 1:
        raise ValueError(f"pairs_per_round must be an integer >= 1, got {pairs_per_round!r}")
    if not rel_se >= 0:  # also refuses NaN
        raise ValueError(f"rel_se must be >= 0 (0: run to max_permutations), got {rel_se!r}")
    if max_permutations < 2 * min_pairs:
        raise ValueError(
            f"max_permutations = {max_permutations} allows {max_permutations // 2} antithetic pairs, fewer than "
            f"min_pairs = {min_pairs}: set max_permutations >= {2 * min_pairs} (2 x min_pairs) or lower min_pairs"
        )


def _pair_rounds(cache: _Cache, n: int, rng, max_pairs: int, pairs_per_round: int, min_pairs, rel_se, floor, block):
    """The rounds of :func:`permutation_shapley`: (pair estimates, mean, se, n_truncated, converged)."""
    pair_est: list[np.ndarray] = []
    n_trunc = 0
    converged = False
    est = np.zeros(n)
    se = np.full(n, np.nan)
    while len(pair_est) < max_pairs:
        r = min(pairs_per_round, max_pairs - len(pair_est))
        fwd = np.stack([rng.permutation(n) for _ in range(r)])
        perms = np.concatenate([fwd, fwd[:, ::-1]])  # row k and row k + r are antithetic
        marg, t = _marginals(cache, perms, floor, block)
        n_trunc += t
        pair_est.extend((marg[:r] + marg[r:]) / 2)
        est_all = np.stack(pair_est)
        est = est_all.mean(0)
        k = len(pair_est)
        se = est_all.std(0, ddof=1) / math.sqrt(k) if k > 1 else np.full(n, np.nan)
        if k >= min_pairs and bool(np.all(se <= rel_se * (est.max() - est.min()))):
            converged = True
            break
    return pair_est, est, se, n_trunc, converged
