"""How well a method's component scores agree with the Shapley values, per model, and a
summary over models.

Scores and Shapley values are pandas Series indexed by component name, higher = more
important (pass magnitudes for a method whose sign is not importance). A method is
compared on the components it scores (COAX leaves out the primaries); every one of
them must have a Shapley value.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

METRICS = ("spearman", "kendall", "top_k_share", "hidden_recall")


def _aligned(scores: pd.Series, shapley: pd.Series) -> tuple[pd.Series, pd.Series]:
    missing = sorted(set(scores.index) - set(shapley.index))
    if missing:
        raise ValueError(f"scores for components without a Shapley value: {missing}")
    if scores.index.has_duplicates:
        raise ValueError("duplicate components in the scores")
    return scores.astype(float), shapley.loc[scores.index].astype(float)


def rank_correlations(scores: pd.Series, shapley: pd.Series) -> dict:
    """Spearman's rho and Kendall's tau-b (scipy, ties averaged) between a method's scores
    and the Shapley values, over the components the method scores; NaN when either is
    constant or fewer than 2 components."""
    s, t = _aligned(scores, shapley)
    if len(s) < 2 or s.nunique() < 2 or t.nunique() < 2:
        return {"spearman": float("nan"), "kendall": float("nan")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho = stats.spearmanr(s.to_numpy(), t.to_numpy()).statistic
        tau = stats.kendalltau(s.to_numpy(), t.to_numpy()).statistic
    return {"spearman": float(rho), "kendall": float(tau)}


def top_k(values: pd.Series, k: int) -> list:
    """The ``k`` components with the largest values; ties keep the Series order (stable)."""
    return list(values.sort_values(ascending=False, kind="stable").index[:k])


def top_k_overlap(scores: pd.Series, shapley: pd.Series, k: int) -> int:
    """|top-k by the method's scores & top-k by Shapley|, over the components scored."""
    s, t = _aligned(scores, shapley)
    return len(set(top_k(s, k)) & set(top_k(t, k)))


def hidden_components(shapley: pd.Series, single: pd.Series, k: int, single_frac: float = 0.1) -> list:
    """The components single ablation misses: in the top ``k`` by Shapley value, with a
    single drop (v(empty) - v({i}), signed) below ``single_frac`` x the largest absolute
    single drop in ``single`` (pass every component of the model, so that the cut does
    not depend on which components a method scores; absolute, so that a model whose
    single ablations all raise the metric still has a scale). Default 0.1: a tenth."""
    single = single.astype(float)
    cut = single_frac * float(single.abs().max())
    return [c for c in top_k(shapley.astype(float), k) if single[c] < cut]


def hidden_recall(scores: pd.Series, shapley: pd.Series, single: pd.Series, k: int, single_frac: float = 0.1) -> dict:
    """Of the hidden components (:func:`hidden_components`, among the components scored),
    how many are in the method's top ``k``: ``n_hidden``, ``hidden_hits``,
    ``hidden_recall`` (NaN when there is none)."""
    s, t = _aligned(scores, shapley)
    hidden = hidden_components(t, single, k, single_frac)
    hits = len(set(hidden) & set(top_k(s, k)))
    return {"n_hidden": len(hidden), "hidden_hits": hits, "hidden_recall": hits / len(hidden) if hidden else np.nan}


def agreement(scores: pd.Series, shapley: pd.Series, single: pd.Series, k: int, single_frac: float = 0.1) -> dict:
    """All agreement measures of one method on one model: ``n_components``, ``spearman``,
    ``kendall``, ``k``, ``top_k_overlap``, ``top_k_share`` (= overlap / min(k, n)),
    ``n_hidden``, ``hidden_hits``, ``hidden_recall``."""
    s, t = _aligned(scores, shapley)
    k_eff = min(k, len(s))
    overlap = top_k_overlap(s, t, k)
    return {
        "n_components": len(s),
        **rank_correlations(s, t),
        "k": k,
        "top_k_overlap": overlap,
        "top_k_share": overlap / k_eff if k_eff else np.nan,
        **hidden_recall(s, t, single, k, single_frac),
    }


def agreement_table(scores: pd.DataFrame, truth: pd.DataFrame, k: int, single_frac: float = 0.1) -> pd.DataFrame:
    """Per (model, family, method): :func:`agreement`.

    ``scores``: long table with ``model``, ``family``, ``method``, ``component``,
    ``score``. ``truth``: ``model``, ``component``, ``shapley``, ``single`` (the single
    drop of the same game the Shapley values are of).
    """
    out = []
    for (model, family, method), g in scores.groupby(["model", "family", "method"], sort=True):
        t = truth[truth["model"] == model].set_index("component")
        if t.empty:
            raise ValueError(f"no Shapley values for model {model!r}")
        s = g.set_index("component")["score"]
        out.append(
            {
                "model": model,
                "family": family,
                "method": method,
                **agreement(s, t["shapley"], t["single"], k, single_frac),
            }
        )
    return pd.DataFrame(out)


def bootstrap_ci(values, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Mean of ``values`` (NaNs dropped) and its percentile bootstrap interval: the
    (1 - level) / 2 and (1 + level) / 2 quantiles of the means of ``n_boot`` resamples
    with replacement (``numpy.random.default_rng(seed)``). ``lo``/``hi`` NaN with fewer
    than 2 values. With few models the interval under-covers (it can only resample the
    values there are)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    out = {"mean": float(v.mean()) if len(v) else np.nan, "lo": np.nan, "hi": np.nan, "n": len(v)}
    if len(v) > 1:
        rng = np.random.default_rng(seed)
        means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(1)
        out["lo"], out["hi"] = (float(q) for q in np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))
    return out


def summarize(
    table: pd.DataFrame,
    metrics: Sequence[str] = METRICS,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Per (family, method) of an :func:`agreement_table`: ``n_models`` and, for each
    metric, ``{metric}``, ``{metric}_lo``, ``{metric}_hi`` (:func:`bootstrap_ci` over the
    models, each metric with the same ``seed``) and ``{metric}_n`` (models with a value)."""
    rows = []
    for (family, method), g in table.groupby(["family", "method"], sort=True):
        row = {"family": family, "method": method, "n_models": g["model"].nunique()}
        for m in metrics:
            ci = bootstrap_ci(g[m], n_boot, level, seed)
            row.update({m: ci["mean"], f"{m}_lo": ci["lo"], f"{m}_hi": ci["hi"], f"{m}_n": ci["n"]})
        rows.append(row)
    return pd.DataFrame(rows)
