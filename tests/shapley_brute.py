"""Brute-force Shapley values of a model's ablation game (shared by the ground-truth tests):
every coalition from its own run, marginals averaged over all n! orderings."""

from __future__ import annotations

import itertools
import math

import numpy as np

from selfrepair.core import interventions


def brute_force(bridge, tokens, comps, means, reduce, mode: str = "mean"):
    """({frozenset of components: v}, Shapley values [n] of the drop v(empty) - v(S))."""
    value = {}
    for k in range(len(comps) + 1):
        for s in itertools.combinations(comps, k):
            value[frozenset(s)] = float(
                interventions.run_ablated(bridge, tokens, [list(s)], mode, means, reduce=reduce)[0]
            )
    phi = np.zeros(len(comps))
    for order in itertools.permutations(range(len(comps))):
        pre = frozenset()
        for i in order:
            phi[i] += value[pre] - value[pre | {comps[i]}]
            pre = pre | {comps[i]}
    return value, phi / math.factorial(len(comps))
