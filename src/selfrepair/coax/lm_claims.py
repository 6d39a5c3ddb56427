"""Paper B's claims about its method, tested on a packaged real LM (rule ``coax_lm``'s
tables): ablating the primaries hurts IOI; COAX ranks the backups above every
first-order baseline; the backups wake up when the primaries are ablated; freezing them
removes repair; knocking out COAX's set with the primaries lowers the logit difference;
COAX's induction sets hurt more than random ones. One row per claim and seeding
(:mod:`selfrepair.core.real_claims`); the published figures are GPT-2 small's (and, for
induction, eight larger models'), which stay *not run* in paper B's own table. The
backups are the conditional-ablation ground truth on this model.

Every interval resamples what varies (percentile bootstrap, :data:`N_BOOT` draws):

- the scored prompts, within each prompt set (damage, freezing, knockout);
- for the ROC-AUC and the wake-up, the truth prompts too, with the backups chosen again
  on each resample (:func:`selfrepair.coax.lm_seeds.backups_from`), then the candidate
  heads, backups and others apart: the interval carries the ground truth's own
  uncertainty, not one labelling's;
- for induction, the evaluation sequences (the values of k are nested sets, not samples).

The primaries come from two seedings side by side (:data:`lm_seeds.SEEDINGS`): the
name movers (the paper's rule; the claims' ids as they were) and the largest
single-ablation drops (ids ending ``_single_drop``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.coax import lm_seeds
from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.core import real_claims as R
from selfrepair.core.stats import roc_auc

PAPER = "coax"
N_BOOT = 1000
BASELINES = ("single", "atp", "eap_ig", "atp_star")  # the paper's first-order baselines
PUB = {
    "damage": "GPT-2 small: ablating the primaries lowers the IOI logit difference by 0.22 (by 1.76 with COAX's backups too)",
    "auc": "GPT-2 small IOI: COAX 0.91 against single 0.33, AtP 0.60, EAP-IG 0.70, AtP*+GradDrop 0.82",
    "wake": "GPT-2 small: backups' output-norm ratio 1.00 -> 1.15 with 0 -> 3 primaries ablated, random heads 1.00",
    "freeze": "GPT-2 small: freezing the backups removes 53-55% of the repair",
    "knockout": "GPT-2 small: logit difference down 0.22 with the primaries ablated, 1.76 with COAX's backups too "
    "(accuracy 0.97 and 0.70)",
    "induction": "8 models (Pythia to Llama-3.1-8B): COAX sets lower induction log-prob 2.1x to 12x more than random",
    "pruning": "124M to 7B: sequential COAX beats Random, Magnitude, Wanda and Taylor; at 50% head sparsity GPT-2 "
    "small's WikiText-2 perplexity 80.6 against Taylor's 201",
}
PRUNING = ("lm_coax_pruning_beats_baselines", "sequential COAX's pruned model keeps a lower perplexity than every "
           "one-shot baseline's at the headline head sparsity")  # fmt: skip
SUFFIX = {"name_movers": "", "single_drop": "_single_drop"}
SEEDED = {"name_movers": "primaries: name movers", "single_drop": "primaries: largest single-ablation drops"}


def _percentile(draws, level: float = 0.95) -> tuple[float, float]:
    d = np.asarray(draws, float)
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return float("nan"), float("nan")
    lo, hi = np.percentile(d, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def _resample_within(groups: list[np.ndarray], rng) -> list[np.ndarray]:
    """Each group's indices drawn again with replacement (same size)."""
    return [g[rng.integers(0, len(g), len(g))] for g in groups]


def prompt_bootstrap(prompts: pd.DataFrame, stat, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """``stat(rows)`` of the per-prompt table (:func:`lm_seeds.prompt_table`'s, one
    seeding) and its percentile interval over ``n_boot`` resamples of the prompts within
    each prompt set (``data_seed``)."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(prompts["data_seed"].to_numpy() == d) for d in prompts["data_seed"].unique()]
    point = float(stat(prompts))
    draws = [stat(prompts.iloc[np.concatenate(_resample_within(groups, rng))]) for _ in range(n_boot)]
    lo, hi = _percentile(draws)
    return {"value": point, "lo": lo, "hi": hi, "n": len(prompts)}


def _labels(truth: pd.DataFrame, share: float, cols=None) -> set[str]:
    """The backups chosen on the truth prompts ``cols`` (all by default) of one seeding's
    conditional-ablation matrix (``ioi_truth``)."""
    mat, units, _, n_other = lm_seeds.matrix_from_table(truth)
    t = lm_seeds.backups_from(mat, units, share, cols, n_other)
    return set(t.loc[t["backup"], "unit"])


def _auc_gap(t: pd.DataFrame, backup) -> float:
    aucs = {m: roc_auc(DISCOVERY_METHODS[m](t), backup) for m in ("coax", *BASELINES)}
    return aucs["coax"] - max(aucs[m] for m in BASELINES)


def _wake_gap(t: pd.DataFrame, backup) -> float:
    b = np.asarray(backup, bool)
    return float(t["wake"].to_numpy(float)[b].mean() - t["wake"].to_numpy(float)[~b].mean())


def label_bootstrap(scores: pd.DataFrame, truth: pd.DataFrame, share: float, stat, n_boot=N_BOOT, seed=0) -> dict:
    """``stat(candidates, labels)`` averaged over the prompt sets of ``scores`` (one row per
    candidate head and prompt set, one seeding), with the backups chosen on all truth
    prompts; its percentile interval over ``n_boot`` draws, each resampling the truth
    prompts (within each template) and choosing the backups again on them, then the
    candidates of each prompt set, the backups and the others apart. A draw whose
    labels leave no backup (or no other head) gives no value and is counted
    (``no_labels``)."""
    rng = np.random.default_rng(seed)
    _, _, templates, _ = lm_seeds.matrix_from_table(truth)
    t_groups = [np.flatnonzero(templates == t) for t in dict.fromkeys(templates)]
    sets = [g for _, g in scores.groupby("data_seed")] if "data_seed" in scores else [scores]

    def value(labels, resample):
        per = []
        for g in sets:
            y = g["unit"].isin(labels).to_numpy()
            if y.all() or not y.any():
                return float("nan")
            if resample:
                pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
                pick = np.concatenate(
                    [pos[rng.integers(0, len(pos), len(pos))], neg[rng.integers(0, len(neg), len(neg))]]
                )
                g, y = g.iloc[pick], y[pick]
            per.append(stat(g, y))
        return float(np.mean(per))

    point = value(_labels(truth, share), False)
    draws = [value(_labels(truth, share, np.concatenate(_resample_within(t_groups, rng))), True) for _ in range(n_boot)]
    lo, hi = _percentile(draws)
    return {"value": point, "lo": lo, "hi": hi, "n": len(templates), "no_labels": int(np.sum(~np.isfinite(draws)))}


def _damage(p: pd.DataFrame) -> float:
    return float((p["ld_clean"] - p["ld_primaries"]).mean())


def _knockout(p: pd.DataFrame) -> float:
    return float((p["ld_primaries"] - p["ld_primaries_coax"]).mean())


def _repair(p: pd.DataFrame) -> float:
    """Self-repair: the primaries' direct effect (every candidate frozen) minus their
    total effect (nothing frozen), in logit difference."""
    return float((p["ld_primaries"] - p["ld_frozen_all"]).mean())


def _freeze_share(p: pd.DataFrame) -> float:
    """The share of the repair that freezing the backups removes: (drop with the backups
    frozen - drop with none) / (drop with every candidate frozen - drop with none)."""
    repair = _repair(p)
    return float((p["ld_primaries"] - p["ld_frozen_backups"]).mean() / repair) if repair != 0 else float("nan")


def _prompt_rows(model: str, seeding: str, p: pd.DataFrame) -> list[dict]:
    sfx, seeded = SUFFIX[seeding], SEEDED[seeding]
    what = f"scored prompts ({p['data_seed'].nunique()} prompt set(s), resampled within each)"
    rows = []
    d = prompt_bootstrap(p, _damage)
    clean = float(p["ld_clean"].mean())
    rows.append(
        R.row(model, PAPER, f"lm_coax_primaries_damage{sfx}", "ablating the primaries lowers the IOI logit difference",
              PUB["damage"], d["value"], (d["lo"], d["hi"]), d["n"], resampled=what,
              note=f"{seeded}; logit difference {clean:.3f} intact, mean drop over prompts; percentile bootstrap")
    )  # fmt: skip
    f, r = prompt_bootstrap(p, _freeze_share), prompt_bootstrap(p, _repair)
    note = (f"{seeded}; repair (direct minus total effect of the primaries) {r['value']:.3f} [{r['lo']:.3f}, "
            f"{r['hi']:.3f}]: a share means little where the repair's interval is not above 0; percentile bootstrap")  # fmt: skip
    rows.append(
        R.row(model, PAPER, f"lm_coax_freeze_removes_repair{sfx}", "freezing the backups removes part of the repair",
              PUB["freeze"], f["value"], (f["lo"], f["hi"]), f["n"], resampled=what, note=note)
    )  # fmt: skip
    k = prompt_bootstrap(p, _knockout)
    acc = [float((p[c] > 0).mean()) for c in ("ld_primaries", "ld_primaries_coax")]
    note = (f"{seeded}; logit difference with the primaries ablated minus with COAX's set too; accuracy "
            f"{acc[0]:.2f} -> {acc[1]:.2f}; percentile bootstrap")  # fmt: skip
    rows.append(
        R.row(model, PAPER, f"lm_coax_knockout_lowers_logit_diff{sfx}",
              "ablating COAX's set with the primaries lowers the logit difference further", PUB["knockout"],
              k["value"], (k["lo"], k["hi"]), k["n"], resampled=what, note=note)
    )  # fmt: skip
    return rows


def _label_rows(model: str, seeding: str, scores: pd.DataFrame, truth: pd.DataFrame, share: float) -> list[dict]:
    sfx, seeded = SUFFIX[seeding], SEEDED[seeding]
    n_c = int(scores.groupby("data_seed").size().iloc[0]) if "data_seed" in scores else len(scores)
    what = f"truth prompts (backups chosen again in each resample) and {n_c} candidate heads"
    rows = []
    for cid, claim, pub, stat, lead in (
        ("lm_coax_auc_beats_baselines", "COAX's backup ROC-AUC exceeds every first-order baseline's", PUB["auc"],
         _auc_gap, f"COAX minus the best of {', '.join(BASELINES)}"),
        ("lm_coax_backups_wake_up", "the backups' output norms grow more than the other heads' with the primaries ablated",
         PUB["wake"], _wake_gap, "mean wake-up ratio (all primaries ablated) of the backups minus the others'"),
    ):  # fmt: skip
        g = label_bootstrap(scores, truth, share, stat)
        note = f"{seeded}; {lead}; percentile bootstrap" + (
            f"; {g['no_labels']} of {N_BOOT} resamples chose no backup (left out)" if g["no_labels"] else ""
        )
        rows.append(R.row(model, PAPER, cid + sfx, claim, pub, g["value"], (g["lo"], g["hi"]), g["n"],
                          resampled=what, note=note))  # fmt: skip
    return rows


def _induction_row(model: str, seq: pd.DataFrame | None) -> dict:
    cid, claim = "lm_coax_induction_beats_random", "COAX's induction sets lower the log-prob more than random sets"
    if seq is None or seq.empty:
        return R.not_run(
            model, PAPER, cid, claim, PUB["induction"], "its part did not run (coax_lm's status.csv says why)"
        )
    per = (seq["drop_coax"] - seq["drop_random"]).groupby(seq["sequence"]).mean()
    d = prompt_bootstrap(pd.DataFrame({"v": per.to_numpy(), "data_seed": 0}), lambda t: t["v"].mean())
    ks = ", ".join(str(int(k)) for k in sorted(seq["k"].unique()))
    note = f"drop of COAX's set minus the random sets' mean drop, per sequence averaged over k = {ks}; percentile bootstrap"
    return R.row(model, PAPER, cid, claim, PUB["induction"], d["value"], (d["lo"], d["hi"]), d["n"],
                 resampled="evaluation sequences", note=note)  # fmt: skip


def pruning_row(model: str, seq: pd.DataFrame | None, headline: float | None) -> dict:
    """COAX's mean NLL at the headline sparsity below the best one-shot baseline's: the
    measured value is the baseline's minus COAX's (log-perplexity ratio; above 0 holds),
    the interval resampling the evaluation windows (every method on the same windows)."""
    cid, claim = PRUNING
    if seq is None or seq.empty or headline is None:
        why = "runs at the scales coax.lms.pruning.scales names (rule coax_lm_pruning), not this one"
        return R.not_run(model, PAPER, cid, claim, PUB["pruning"], why)
    at = seq[(seq["sparsity"] - headline).abs() < 1e-9]
    wide = at.pivot(index="window", columns="method", values="nll")
    if "coax" not in wide or wide.shape[1] < 2:
        raise ValueError(f"{model}: the pruning windows hold no COAX and baseline rows at sparsity {headline}")
    others = [m for m in wide.columns if m != "coax"]
    best = min(others, key=lambda m: wide[m].mean())

    def gap(t):  # the best baseline of each resample
        return float(min(t[m].mean() for m in others) - t["coax"].mean())

    d = prompt_bootstrap(wide.reset_index(drop=True).assign(data_seed=0), gap)
    ppl = np.exp(wide.mean())
    said = ", ".join(f"{m} {ppl[m]:.1f}" for m in ["coax", *sorted(others)])
    note = (f"{headline:.0%} of the heads removed; the lowest log perplexity of the one-shot baselines "
            f"({best} here) minus COAX's; perplexities {said}; percentile bootstrap")  # fmt: skip
    return R.row(model, PAPER, cid, claim, PUB["pruning"], d["value"], (d["lo"], d["hi"]), d["n"],
                 resampled="evaluation windows (the same windows for every method)", note=note)  # fmt: skip


def lm_claims(model: str, tables: dict, backup_share: float = 0.06, headline: float | None = None) -> list[dict]:
    """Paper B's claim rows on ``model`` from its ``coax_lm`` tables (``ioi_scores``,
    ``ioi_truth``, ``ioi_prompts``, ``induction_sequences``; those present), per seeding
    found in them; ``backup_share``: coax.lms.backup_share, the rule the backups were
    chosen by (chosen again in each resample); ``pruning_sequences`` (rule
    coax_lm_pruning's per-window NLL, where it ran) at the ``headline`` sparsity."""
    sc, truth, prompts = (tables.get(k) for k in ("ioi_scores", "ioi_truth", "ioi_prompts"))
    rows = []
    ran = [] if sc is None or sc.empty or "seeding" not in sc else list(dict.fromkeys(sc["seeding"]))
    for seeding in ran or ["name_movers"]:
        sfx = SUFFIX.get(seeding)
        if sfx is None:
            raise ValueError(f"unknown seeding {seeding!r} in ioi_scores; one of {lm_seeds.SEEDINGS}")
        have = (
            seeding in ran
            and truth is not None
            and prompts is not None
            and (truth["seeding"] == seeding).any()
            and (prompts["seeding"] == seeding).any()
        )
        if not have:
            why = "the IOI part did not run, or its tables (ioi_scores, ioi_truth, ioi_prompts) are missing"
            for cid, claim, pub in (
                ("lm_coax_primaries_damage", "ablating the primaries lowers the IOI logit difference", PUB["damage"]),
                ("lm_coax_auc_beats_baselines", "COAX's backup ROC-AUC exceeds every first-order baseline's", PUB["auc"]),
                ("lm_coax_backups_wake_up", "the backups' output norms grow more than the other heads'", PUB["wake"]),
                ("lm_coax_freeze_removes_repair", "freezing the backups removes part of the repair", PUB["freeze"]),
                ("lm_coax_knockout_lowers_logit_diff", "ablating COAX's set with the primaries lowers the logit "
                 "difference further", PUB["knockout"]),
            ):  # fmt: skip
                rows.append(R.not_run(model, PAPER, cid + sfx, claim, pub, why))
            continue
        p = prompts[prompts["seeding"] == seeding]
        damage, *rest = _prompt_rows(model, seeding, p)
        rows += [damage, *_label_rows(model, seeding, sc[sc["seeding"] == seeding],
                                      truth[truth["seeding"] == seeding], backup_share), *rest]  # fmt: skip
    rows.append(_induction_row(model, tables.get("induction_sequences")))
    rows.append(pruning_row(model, tables.get("pruning_sequences"), headline))
    return rows
