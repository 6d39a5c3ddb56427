"""Paper B's claims about its method, tested on a packaged real LM (rule ``coax_lm``'s
tables): COAX ranks the backups above every first-order baseline; the backups wake up
when the primaries are ablated; freezing them removes repair; knocking out COAX's set
with the primaries costs accuracy; COAX's induction sets hurt more than random ones. One
row per claim (:mod:`selfrepair.core.real_claims`); the published figures are GPT-2
small's (and, for induction, eight larger models'), which stay *not run* in paper B's
own table. The backups are the conditional-ablation ground truth on this model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.core import real_claims as R
from selfrepair.core.stats import roc_auc, t_interval

PAPER = "coax"
BASELINES = ("single", "atp", "eap_ig", "atp_star")  # the paper's first-order baselines
PUB = {
    "auc": "GPT-2 small IOI: COAX 0.91 against single 0.33, AtP 0.60, EAP-IG 0.70, AtP*+GradDrop 0.82",
    "wake": "GPT-2 small: backups' output-norm ratio 1.00 -> 1.15 with 0 -> 3 primaries ablated, random heads 1.00",
    "freeze": "GPT-2 small: freezing the backups removes 53-55% of the repair",
    "knockout": "GPT-2 small: accuracy 0.97 with the primaries removed, 0.70 with COAX's backups too",
    "induction": "8 models (Pythia to Llama-3.1-8B): COAX sets lower induction log-prob 2.1x to 12x more than random",
}


def auc_gap(scores: pd.DataFrame, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """COAX's ROC-AUC minus the best first-order baseline's on the candidates of each
    prompt set (``ioi_scores``: one row per candidate head, ``backup`` the label), pooled
    over the prompt sets; its percentile interval over ``n_boot`` stratified resamples of
    the heads (backups and the others resampled apart, every method on the same resample)."""
    rng = np.random.default_rng(seed)

    def gap(t: pd.DataFrame) -> float:
        aucs = {m: roc_auc(DISCOVERY_METHODS[m](t), t["backup"]) for m in ("coax", *BASELINES)}
        return aucs["coax"] - max(aucs[m] for m in BASELINES)

    groups = [g for _, g in scores.groupby("data_seed")] if "data_seed" in scores else [scores]
    if not all(g["backup"].any() and (~g["backup"]).any() for g in groups):
        return {"gap": np.nan, "lo": np.nan, "hi": np.nan, "n": len(scores)}
    point = float(np.mean([gap(g) for g in groups]))
    draws = []
    for _ in range(n_boot):
        per = []
        for g in groups:
            pos, neg = g[g["backup"]], g[~g["backup"]]
            pick = pd.concat(
                [pos.iloc[rng.integers(0, len(pos), len(pos))], neg.iloc[rng.integers(0, len(neg), len(neg))]]
            )
            per.append(gap(pick))
        draws.append(np.mean(per))
    lo, hi = np.percentile(draws, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return {"gap": point, "lo": float(lo), "hi": float(hi), "n": len(scores)}


def _wake_row(model: str, wake: pd.DataFrame) -> dict:
    cid, claim = (
        "lm_coax_backups_wake_up",
        "the backups' output norms grow more than the other heads' with the primaries ablated",
    )
    if wake is None or wake.empty or not (wake["group"] == "backup").any():
        return R.not_run(model, PAPER, cid, claim, PUB["wake"], "no wake-up table or no backup")
    w = wake[wake["n_ablated"] == wake["n_ablated"].max()]
    b, o = w[w["group"] == "backup"]["ratio"].to_numpy(float), w[w["group"] == "other"]["ratio"].to_numpy(float)
    d = float(b.mean() - o.mean())
    se = float(np.sqrt(b.var(ddof=1) / len(b) + o.var(ddof=1) / len(o))) if len(b) > 1 and len(o) > 1 else np.nan
    note = f"mean ratio, all primaries ablated: backups {b.mean():.3f} ({len(b)}), others {o.mean():.3f} ({len(o)}); ~95% interval +-1.96 SE"
    return R.row(model, PAPER, cid, claim, PUB["wake"], d, (d - 1.96 * se, d + 1.96 * se), len(b) + len(o), note=note,
                 resampled="candidate heads")


def _seeds_row(model, cid, claim, pub, values, side, what) -> dict:
    if not len(values):
        return R.not_run(model, PAPER, cid, claim, pub, "its part did not run (coax_lm's status.csv says why)")
    ci = t_interval(np.asarray(values, float))
    note = f"{what}; Student-t 95% interval over {ci['n']} prompt sets" + ("" if ci["n"] > 1 else " (one: no interval)")
    return R.row(model, PAPER, cid, claim, pub, ci["mean"], (ci["lo"], ci["hi"]), ci["n"], side=side, note=note,
                 resampled="prompt sets")


def _knockout_values(ko: pd.DataFrame) -> list[float]:
    p = ko.pivot_table(index="data_seed", columns="set", values="accuracy")
    return list(p["primaries"] - p["primaries+coax"]) if {"primaries", "primaries+coax"} <= set(p.columns) else []


def lm_claims(model: str, tables: dict) -> list[dict]:
    """Paper B's claim rows on ``model`` from its ``coax_lm`` tables (``ioi_scores``,
    ``ioi_wake``, ``ioi_freeze``, ``ioi_knockout``, ``induction``; those present)."""
    rows = []
    cid, claim = "lm_coax_auc_beats_baselines", "COAX's backup ROC-AUC exceeds every first-order baseline's"
    sc = tables.get("ioi_scores")
    if sc is None or sc.empty:
        rows.append(R.not_run(model, PAPER, cid, claim, PUB["auc"], "the IOI part did not run"))
    else:
        g = auc_gap(sc)
        note = f"COAX minus the best of {', '.join(BASELINES)}; stratified bootstrap over {g['n']} candidate heads"
        rows.append(R.row(model, PAPER, cid, claim, PUB["auc"], g["gap"], (g["lo"], g["hi"]), g["n"], note=note,
                          resampled="candidate heads"))
    rows.append(_wake_row(model, tables.get("ioi_wake")))
    fr, ko, ind = tables.get("ioi_freeze"), tables.get("ioi_knockout"), tables.get("induction")
    rows.append(
        _seeds_row(model, "lm_coax_freeze_removes_repair", "freezing the backups removes part of the repair",
                   PUB["freeze"], [] if fr is None else fr["repair_removed_share"], "above", "share of the repair removed")
    )  # fmt: skip
    rows.append(
        _seeds_row(model, "lm_coax_knockout_costs_accuracy", "ablating COAX's set with the primaries lowers IOI accuracy",
                   PUB["knockout"], [] if ko is None else _knockout_values(ko), "above",
                   "accuracy with the primaries ablated minus with COAX's set too")
    )  # fmt: skip
    rows.append(
        _seeds_row(model, "lm_coax_induction_beats_random", "COAX's induction sets lower the log-prob more than random sets",
                   PUB["induction"], [] if ind is None else ind["drop_coax"] - ind["drop_random"], "above",
                   "drop of COAX's set minus the random sets' mean drop, per k (not independent: an indication)")
    )  # fmt: skip
    return rows
