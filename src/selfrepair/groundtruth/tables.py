"""The ground-truth part's tables: per-model agreement of every method with the Shapley
values, its summary per model family (mean over models, bootstrap CI), the corrected
toy-IOI backup labels with their threshold sweep and each method's recall of the
downstream backups, and the findings (``new`` rows of the published summary).

Inputs are the concatenated per-model tables of :mod:`selfrepair.groundtruth.pipeline`
(columns ``family``, ``model``, ``game`` ...). A method's scores are compared as they
are (higher = a larger estimated drop; G and the COAX energies are magnitudes).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.groundtruth import agreement as ag
from selfrepair.groundtruth import labels as lb

# The methods set against the Shapley values, in display order, with their paper.
METHODS = {
    "single": "A/B/C: single ablation (the game's mode; paper A's C)",
    "single_mean": "single ablation, mean",
    "single_zero": "single ablation, zero",
    "grad_norm": "A: G, weight-gradient norm / sqrt(#entries)",
    "grad_norm_raw": "A: G raw (authors' code)",
    "atp": "AtP = node EAP",
    "eap_ig": "EAP-IG (activations)",
    "gim": "C: GIM (AtP under the GIM backward)",
    "relp": "RelP (AtP under LRP rules)",
    "eap_gp": "EAP-GP (GradPath, activations)",
    "coax_single": "B: COAX single energy",
    "coax_cond": "B: COAX conditional energy",
    "coax_comp": "B: COAX comp",
}
GAME_OF = {"heroes": "accuracy", "ioi": "logit_diff", "gim": "logit_diff"}  # headline game per family


def agreement_models(scores: pd.DataFrame, shapley: pd.DataFrame, k: int, single_frac: float = 0.1) -> pd.DataFrame:
    """Per (group, model, game, method): :func:`agreement.agreement` of the method's scores
    with the Shapley values of that game. ``group`` is the model family a summary pools
    (``family`` and task, e.g. ``heroes/sort``)."""
    out = []
    for game, sg in scores.groupby("game", sort=False):
        truth = shapley[shapley["game"] == game]
        if truth.empty:
            raise ValueError(f"no Shapley values for game {game!r}")
        s = sg.drop(columns=["family"], errors="ignore").rename(columns={"group": "family"})
        t = ag.agreement_table(s[["model", "family", "method", "component", "score"]], truth, k, single_frac)
        out.append(t.rename(columns={"family": "group"}).assign(game=game))
    cols = ["group", "model", "game", "method"]
    t = pd.concat(out, ignore_index=True)
    return t[cols + [c for c in t.columns if c not in cols]]


def agreement_summary(per_model: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per (group, game, method): n_models and every agreement metric's mean over models
    with its percentile bootstrap interval (:func:`agreement.summarize`)."""
    out = []
    for game, g in per_model.groupby("game", sort=False):
        t = ag.summarize(g.rename(columns={"group": "family"}), n_boot=n_boot, seed=seed)
        out.append(t.rename(columns={"family": "group"}).assign(game=game))
    t = pd.concat(out, ignore_index=True)
    order = {m: i for i, m in enumerate(METHODS)}
    t["_o"] = t["method"].map(order).fillna(len(order))
    t = t.sort_values(["group", "game", "_o"]).drop(columns="_o")
    cols = ["group", "game", "method", "n_models"]
    return t[cols + [c for c in t.columns if c not in cols]].reset_index(drop=True)


def paired_difference(per_model: pd.DataFrame, a: str, b: str, metric: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean over models of metric(a) - metric(b) with its bootstrap interval, and in how
    many models a is higher (models where both have a value)."""
    w = per_model.pivot_table(index=["group", "model", "game"], columns="method", values=metric)
    if a not in w or b not in w:
        return {"mean": np.nan, "lo": np.nan, "hi": np.nan, "n": 0, "a_higher": 0}
    d = (w[a] - w[b]).dropna()
    ci = ag.bootstrap_ci(d.to_numpy(), n_boot=n_boot, seed=seed)
    return {**ci, "a_higher": int((d > 0).sum())}


# ---------------------------------------------------------------- toy IOI ---------
def ioi_labels(
    shapley: pd.DataFrame,
    interactions: pd.DataFrame,
    n_primary: int,
    frac: float,
    fracs,
    single_frac: float = 0.1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per toy-IOI model: the corrected labels (:func:`labels.backup_labels`) over its
    heads, primaries = the ``n_primary`` heads of largest single drop, from the ground
    truth's own single and pair drops; and the threshold sweep."""
    lab, sweep = [], []
    for model, s in shapley.groupby("model", sort=True):
        s = s[s["component"].str.match(r"^L\d+H\d+$")]
        singles = s.rename(columns={"component": "unit", "single": "drop"})[["unit", "drop"]].drop_duplicates("unit")
        heads = set(singles["unit"])
        pairs = interactions[
            (interactions["model"] == model) & interactions["u"].isin(heads) & interactions["v"].isin(heads)
        ]
        prim = lb.primaries_by_drop(singles, n_primary)
        lab.append(lb.backup_labels(singles, pairs, prim, frac, single_frac).assign(model=model))
        sweep.append(lb.threshold_sweep(singles, pairs, prim, fracs, single_frac).assign(model=model))
    first = lambda t: t[["model"] + [c for c in t.columns if c != "model"]]  # noqa: E731
    return first(pd.concat(lab, ignore_index=True)), first(pd.concat(sweep, ignore_index=True))


# Which heads count as found, from a labels table: the strict downstream backups (quiet
# alone), every head that repairs an earlier-layer primary (quiet or not), and every head
# that repairs some primary (the published toy labels' rule).
TARGETS = {
    "downstream_backup": lambda lab: lab["role"] == "downstream_backup",
    "downstream_repair": lambda lab: lab["downstream_score"] > lab["threshold"],
    "any_repair": lambda lab: (lab["role"] != "primary") & (lab["backup_score"] > lab["threshold"]),
}


def _recall_rows(ranked: dict, lab: pd.DataFrame) -> list[dict]:
    """Per method (``ranked``: {method: scores by unit, candidates only}) and target set:
    recall in the top k, k = the target set's size."""
    out = []
    for target, sel in TARGETS.items():
        backups = list(lab.loc[sel(lab), "unit"])
        for method, s in ranked.items():
            r = lb.recall_at_n_backups(s, [b for b in backups if b in s.index])
            out.append({"target": target, "method": method, "n_candidates": len(s), **r})
    return out


def backup_recall(scores: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Per (model, target, method): recall of the target heads (:data:`TARGETS`) within
    the method's top k, k = their number (:func:`labels.recall_at_n_backups`; NaN when
    there is none), over the heads outside the primaries that the method scores."""
    out = []
    for model, lab in labels.groupby("model", sort=True):
        cand = set(lab.loc[lab["role"] != "primary", "unit"])
        sc = scores[(scores["model"] == model) & scores["component"].isin(cand)]
        ranked = {m: g.set_index("component")["score"] for m, g in sc.groupby("method", sort=False)}
        out += [{"model": model, **r} for r in _recall_rows(ranked, lab)]
    return pd.DataFrame(out)


def paper_b_recall(coax_scores: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Paper B's own discovery rankings (its scores tables: one per toy model and prompt
    set; :data:`coax.baselines.DISCOVERY_METHODS`) scored against the corrected labels:
    per (model, data_seed, target, method), as :func:`backup_recall`."""
    from selfrepair.coax.baselines import DISCOVERY_METHODS

    out = []
    for (mseed, dseed), t in coax_scores.groupby(["model_seed", "data_seed"], sort=True):
        model = f"ioi/seed{mseed}"
        lab = labels[labels["model"] == model]
        if lab.empty:
            continue
        cand = set(lab.loc[lab["role"] != "primary", "unit"])
        t = t[t["unit"].isin(cand)].set_index("unit")
        ranked = {m: rank(t).astype(float).dropna() for m, rank in DISCOVERY_METHODS.items()}
        out += [{"model": model, "data_seed": int(dseed), **r} for r in _recall_rows(ranked, lab)]
    return pd.DataFrame(out)


# ---------------------------------------------------------------- findings --------
def _fmt(ci: dict) -> str:
    return f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}] over {ci['n']} models"


def findings(per_model: pd.DataFrame, recall: pd.DataFrame | None, n_boot: int = 2000) -> pd.DataFrame:
    """The ``new`` rows of the published summary: what the common ground says about the
    three papers' claims, each a mean over models with its bootstrap interval. ``recall``:
    :func:`paper_b_recall` (paper B's own rankings against the corrected labels)."""
    rows = []

    def add(fid, claim, ci, note):
        rows.append(
            {
                "paper": "groundtruth",
                "id": fid,
                "claim": claim,
                "published": "",
                "reproduced": round(ci["mean"], 4) if np.isfinite(ci["mean"]) else "",
                "ci_low": round(ci["lo"], 4) if np.isfinite(ci["lo"]) else np.nan,
                "ci_high": round(ci["hi"], 4) if np.isfinite(ci["hi"]) else np.nan,
                "tolerance": "",
                "status": "new" if np.isfinite(ci["mean"]) else "not run",
                "note": note,
                "source": "this workflow (the ground truth across the papers): results/groundtruth/tables/agreement.csv",
            }
        )

    def sub(family, game):
        return per_model[per_model["group"].str.startswith(family) & (per_model["game"] == game)]

    a = sub("heroes", GAME_OF["heroes"])
    for m in ("grad_norm", "single", "atp"):
        ci = ag.bootstrap_ci(a.loc[a["method"] == m, "spearman"], n_boot=n_boot)
        add(
            f"gt_heroes_spearman_{m}",
            f"Paper A models: Spearman rho of {m} with the Shapley values of exact-match accuracy",
            ci,
            _fmt(ci),
        )
    d = paired_difference(a, "single", "grad_norm", "spearman", n_boot)
    add(
        "gt_heroes_single_minus_g",
        "Paper A models: single ablation (C) tracks the accuracy Shapley values better than G (paired rho difference)",
        d,
        f"{_fmt(d)}; C higher in {d['a_higher']} of {d['n']}",
    )
    if recall is not None and len(recall):
        strict = recall[(recall["target"] == "downstream_backup") & (recall["method"] == "coax")]
        n_strict = int((strict["k"] > 0).sum())
        for m in ("coax", "atp", "single"):
            g = recall[(recall["target"] == "downstream_repair") & (recall["method"] == m)]
            ci = ag.bootstrap_ci(g["recall"], n_boot=n_boot)
            k = g.loc[g["k"] > 0, "k"]
            add(
                f"gt_ioi_downstream_recall_{m}",
                f"Toy IOI: recall of the heads that repair an earlier-layer primary (corrected labels) in the "
                f"top k of paper B's {m} ranking, k = their number",
                ci,
                f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}] over {ci['n']} (model, prompt set) runs with "
                f"such heads, k {int(k.min()) if len(k) else 0}-{int(k.max()) if len(k) else 0}; strict "
                f"downstream backups (quiet alone) in {n_strict} of {len(strict)} runs",
            )
    c = sub("gim", GAME_OF["gim"])
    d = paired_difference(c, "gim", "atp", "spearman", n_boot)
    add(
        "gt_gim_minus_eap",
        "Paper C toys: GIM tracks the Shapley values better than EAP (node AtP) (paired Spearman difference)",
        d,
        f"{_fmt(d)}; GIM higher in {d['a_higher']} of {d['n']}",
    )
    # the newest methods against GIM and EAP-IG, on every family (paired Spearman differences)
    for family, label in FAMILIES.items():
        f = sub(family, GAME_OF[family])
        for new in NEWEST:
            for ref in ("gim", "eap_ig"):
                d = paired_difference(f, new, ref, "spearman", n_boot)
                add(
                    f"gt_{family}_{new}_minus_{ref}",
                    f"{label}: {METHOD_NAMES[new]} against {METHOD_NAMES[ref]}, Spearman rho with the Shapley "
                    f"values of {GAME_OF[family]} (paired difference)",
                    d,
                    f"{_fmt(d)}; {METHOD_NAMES[new]} higher in {d['a_higher']} of {d['n']}",
                )
    return pd.DataFrame(rows)


FAMILIES = {"heroes": "Paper A models", "ioi": "Toy IOI (paper B)", "gim": "Paper C toys"}
NEWEST = ("relp", "eap_gp")  # set against GIM and EAP-IG in findings()
METHOD_NAMES = {"relp": "RelP", "eap_gp": "EAP-GP", "gim": "GIM", "eap_ig": "EAP-IG"}
