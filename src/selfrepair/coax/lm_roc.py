"""ROC curves of COAX and the first-order baselines on a packaged real LM: the points of
each method's curve over the candidate heads of ``coax_lm``'s ``ioi_scores.csv``, the
backups (its ``backup`` column, the conditional-ablation ground truth) the positives.
Each method ranks by :data:`selfrepair.coax.baselines.DISCOVERY_METHODS` and its AUC is
:func:`selfrepair.core.stats.roc_auc`, as the real-LM AUC claim takes them
(``coax.lm_claims``), per seeding and prompt set (``data_seed``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.core.files import require_columns
from selfrepair.core.stats import roc_auc

METHODS = ("coax", "single", "atp", "eap_ig", "atp_star")  # COAX and the claim's baselines
COLUMNS = ["model", "seeding", "data_seed", "method", "fpr", "tpr", "auc"]


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rates, true positive rates) from (0, 0) to (1, 1), one point per
    distinct score taken as the threshold from the highest down: heads of tied scores
    enter together (a diagonal step), so the area under the points is the AUC with
    ties counting half. Labels must hold both classes."""
    s = np.asarray(scores, float)
    y = np.asarray(labels).astype(bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        raise ValueError(f"ROC needs backups and other heads: {n1} backups, {n0} others")
    if not np.isfinite(s).all():
        raise ValueError(f"{int((~np.isfinite(s)).sum())} score(s) are not finite")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the last head of each tie
    tp, fp = np.cumsum(y)[last], np.cumsum(~y)[last]
    return np.r_[0.0, fp / n0], np.r_[0.0, tp / n1]


def roc_points(model: str, scores: pd.DataFrame, methods=METHODS) -> pd.DataFrame:
    """The ROC points (:data:`COLUMNS`) of each method of ``methods`` per seeding and prompt
    set of one model's ``ioi_scores`` table; ``auc`` the curve's area by ``roc_auc``. A
    prompt set whose candidates are all backups or none has no curve (and no rows): its
    AUC is undefined, as in the claim."""
    need = ["seeding", "unit", "backup", *{c for m in methods for c in _columns(m)}]
    require_columns(scores, need, f"ioi_scores of {model}")
    rows = []
    by = ["seeding", "data_seed"] if "data_seed" in scores else ["seeding"]
    for key, t in scores.groupby(by, sort=False):
        seeding, data_seed = (key[0], key[1]) if len(by) == 2 else (key[0], 0)
        y = t["backup"].astype(bool).to_numpy()
        if y.all() or not y.any():
            continue
        for m in methods:
            s = DISCOVERY_METHODS[m](t).to_numpy(float)
            fpr, tpr = roc_curve(s, y)
            auc = roc_auc(s, y)
            rows += [
                {
                    "model": model,
                    "seeding": seeding,
                    "data_seed": data_seed,
                    "method": m,
                    "fpr": f,
                    "tpr": p,
                    "auc": auc,
                }
                for f, p in zip(fpr, tpr)
            ]
    return pd.DataFrame(rows, columns=COLUMNS)


def _columns(method: str) -> tuple[str, ...]:
    """The ioi_scores columns a discovery method reads."""
    return {"coax": ("comp",), "atp_2s": ("cond_grad", "atp_mag")}.get(method, (method,))
