"""Small statistics shared by the papers: ROC-AUC, top-k recall, paired tests, t-intervals."""

from __future__ import annotations

import numpy as np
from scipy import stats


def roc_auc(scores, labels) -> float:
    """ROC-AUC of ``scores`` for binary ``labels`` (1 positive), ties counting half.

    Equals U / (n_pos n_neg) of the Mann-Whitney test (rank formula, average ranks).
    NaN when a class is empty.
    """
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = stats.rankdata(s)
    u = ranks[y].sum() - n1 * (n1 + 1) / 2
    return float(u / (n1 * n0))


def recall_at_k(ranked: list, positives, k: int) -> tuple[int, float]:
    """How many of ``positives`` are in the first ``k`` of ``ranked``, and the share."""
    pos = set(positives)
    hit = len(pos & set(list(ranked)[:k]))
    return hit, (hit / len(pos) if pos else float("nan"))


def paired_test(a, b) -> dict:
    """One-sided paired tests that ``a`` > ``b``: Wilcoxon signed-rank and paired t."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    out = {"n": len(a), "mean_diff": float(np.mean(a - b)) if len(a) else float("nan")}
    if len(a) < 2 or np.allclose(a, b):
        out.update(p_wilcoxon=float("nan"), p_ttest=float("nan"))
        return out
    out["p_wilcoxon"] = float(stats.wilcoxon(a, b, alternative="greater").pvalue)
    out["p_ttest"] = float(stats.ttest_rel(a, b, alternative="greater").pvalue)
    return out


def t_interval(values, level: float = 0.95) -> dict:
    """Mean and Student-t confidence interval of the mean (NaNs dropped).

    ``{"mean", "lo", "hi", "sd", "n"}``; ``lo``/``hi`` are NaN with fewer than 2 values.
    With the 3-6 models per comparison here a percentile bootstrap under-covers (it
    can only resample the few values there are), so the claims use this interval:
    mean +- t_{(1+level)/2, n-1} * sd / sqrt(n).
    """
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    n = len(v)
    out = {
        "mean": float(v.mean()) if n else float("nan"),
        "lo": float("nan"),
        "hi": float("nan"),
        "sd": float(v.std(ddof=1)) if n > 1 else float("nan"),
        "n": n,
    }
    if n > 1:
        half = float(stats.t.ppf((1 + level) / 2, n - 1)) * out["sd"] / np.sqrt(n)
        out.update(lo=out["mean"] - half, hi=out["mean"] + half)
    return out


def fmt_ci(ci: dict, digits: int = 3) -> str:
    """``0.812 [0.700, 0.924]`` (the interval left out when it is undefined)."""
    s = f"{ci['mean']:.{digits}f}"
    return s + f" [{ci['lo']:.{digits}f}, {ci['hi']:.{digits}f}]" if _finite(ci["lo"]) and _finite(ci["hi"]) else s


def _finite(x) -> bool:
    try:
        return bool(np.isfinite(float(x)))
    except (TypeError, ValueError):  # None, pd.NA
        return False
