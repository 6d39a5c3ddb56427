"""Toy-IOI backup labels, corrected.

``coax.ioi_experiment.ground_truth`` calls a head a backup when its largest
joint-minus-individual drop with a primary exceeds ``backup_frac`` x the largest primary
drop. That lumps together heads in the primaries' own layer (redundant copies that are
active on their own, which no wake-up filter can find) with heads downstream of a
primary that stay quiet until it is gone (backups in paper B's sense). Here the two are
told apart, and the threshold is swept so that labels on a knife edge are visible.

Inputs are the two tables of ``ground_truth`` or of
:func:`selfrepair.groundtruth.shapley.pairwise_interactions`: ``singles`` with ``unit``
(a head name like ``L1H4``) and ``drop`` (v(empty) - v({unit})); ``pairs`` with ``u``,
``v`` and ``interaction`` = drop({u, v}) - drop(u) - drop(v), in either order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from selfrepair.core.components import parse
from selfrepair.core.stats import recall_at_k

ROLES = ("primary", "downstream_backup", "same_layer_redundancy", "interacting", "other")


def primaries_by_drop(singles: pd.DataFrame, n_primary: int) -> list[str]:
    """The ``n_primary`` units with the largest single drop (ground_truth's primaries)."""
    return list(singles.sort_values("drop", ascending=False, kind="stable")["unit"].head(n_primary))


def _interactions(pairs: pd.DataFrame) -> dict[tuple[str, str], float]:
    out = {}
    for u, v, x in zip(pairs["u"], pairs["v"], pairs["interaction"]):
        out[(u, v)] = out[(v, u)] = float(x)
    return out


def backup_labels(
    singles: pd.DataFrame,
    pairs: pd.DataFrame,
    primaries: Sequence[str],
    frac: float = 0.2,
    single_frac: float = 0.1,
) -> pd.DataFrame:
    """One row per unit with its role, with ref = the largest single drop of a primary,
    threshold = ``frac`` x ref and a unit *repairing* primary p when I(p, unit) > threshold:

    - ``primary``: one of ``primaries``;
    - ``downstream_backup``: repairs a primary in an earlier layer, and its single drop is
      below ``single_frac`` x ref (quiet on its own);
    - ``same_layer_redundancy``: otherwise, repairs a primary of its own layer;
    - ``interacting``: otherwise, repairs some primary (a later-layer one, or an earlier
      one while active on its own);
    - ``other``: repairs none.

    Columns: ``unit``, ``layer``, ``drop``, ``role``, ``partner`` (the primary it repairs
    most within its role, else empty), ``backup_score`` (max I over the primaries, the
    score of ground_truth), ``downstream_score`` / ``same_layer_score`` (max I over
    earlier-layer / same-layer primaries, NaN if none), ``critical_frac`` (=
    backup_score / ref: the unit repairs some primary for every frac below it; a value
    near ``frac`` is a knife-edge label), ``threshold``, ``single_threshold``.
    ValueError when a (primary, unit) pair is missing from ``pairs`` or ref <= 0.
    """
    drop = dict(zip(singles["unit"], singles["drop"].astype(float)))
    prim = list(primaries)
    unknown = [p for p in prim if p not in drop]
    if unknown:
        raise ValueError(f"primaries without a single drop: {unknown}")
    ref = max(drop[p] for p in prim)
    if not ref > 0:
        raise ValueError(f"the primaries' largest single drop is {ref}; thresholds relative to it are undefined")
    inter = _interactions(pairs)
    thr, s_thr = frac * ref, single_frac * ref
    rows = []
    for unit, d in drop.items():
        layer = parse(unit).layer
        row = {"unit": unit, "layer": layer, "drop": d, "role": "other", "partner": ""}
        if unit in prim:
            row.update(role="primary", backup_score=np.nan, downstream_score=np.nan, same_layer_score=np.nan)
            rows.append(row)
            continue
        scores = {}
        for p in prim:
            if (p, unit) not in inter:
                raise ValueError(f"no interaction for the pair ({p}, {unit}) in the pairs table")
            scores[p] = inter[(p, unit)]
        down = {p: x for p, x in scores.items() if parse(p).layer < layer}
        same = {p: x for p, x in scores.items() if parse(p).layer == layer}
        row["backup_score"] = max(scores.values())
        row["downstream_score"] = max(down.values()) if down else np.nan
        row["same_layer_score"] = max(same.values()) if same else np.nan

        def best(d):
            p = max(d, key=d.get)
            return p if d[p] > thr else None

        if down and best(down) and d < s_thr:
            row.update(role="downstream_backup", partner=best(down))
        elif same and best(same):
            row.update(role="same_layer_redundancy", partner=best(same))
        elif best(scores):
            row.update(role="interacting", partner=best(scores))
        rows.append(row)
    out = pd.DataFrame(rows)
    out["critical_frac"] = out["backup_score"] / ref
    out["threshold"] = thr
    out["single_threshold"] = s_thr
    return out


def threshold_sweep(
    singles: pd.DataFrame,
    pairs: pd.DataFrame,
    primaries: Sequence[str],
    fracs: Sequence[float] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5),
    single_frac: float = 0.1,
) -> pd.DataFrame:
    """How the labels move with the threshold: per ``frac``, ``threshold`` and, for each
    non-primary role, ``n_{role}`` and ``{role}`` (its units, space-separated, sorted)."""
    out = []
    for f in fracs:
        lab = backup_labels(singles, pairs, primaries, f, single_frac)
        row = {"frac": float(f), "threshold": float(lab["threshold"].iloc[0])}
        for role in ROLES[1:]:
            units = sorted(lab.loc[lab["role"] == role, "unit"])
            row[f"n_{role}"] = len(units)
            row[role] = " ".join(units)
        out.append(row)
    return pd.DataFrame(out)


def recall_at_n_backups(scores: pd.Series, backups: Sequence[str]) -> dict:
    """Recall of ``backups`` in a method's top k (scores indexed by unit, higher first),
    with k = the number of backups, so that a method cannot score by ranking many
    candidates: ``k``, ``hits``, ``recall`` (NaN without backups)."""
    k = len(backups)
    ranked = list(scores.sort_values(ascending=False, kind="stable").index)
    hits, share = recall_at_k(ranked, backups, k)
    return {"k": k, "hits": hits, "recall": share}
