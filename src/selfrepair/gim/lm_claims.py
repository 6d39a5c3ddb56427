"""Paper C's claims about its method, tested on a packaged real LM (rule ``gim_lm``'s
tables): GIM has the best CPR and the best CMD of the gradient methods; each of its
three modifications matters, on CPR and on CMD (MIB's two metrics, each claim with its
own verdict); its feature attribution is more comprehensive than Gradient x Input (on the
IOI prompts the model answers, on the target's logit as paper C defines it and on its
probability). One row per (claim, solved task) (:mod:`selfrepair.core.real_claims`); the
published figures are about MIB's models, which stay *not run* in paper C's own table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core import real_claims as R
from selfrepair.core.stats import t_interval

PAPER = "gim"
OTHERS = ("eap", "eap-ig")  # the gradient methods GIM is set against in the default run
MODIFICATIONS = {"gim-no-tsg": "TSG", "gim-no-ln": "the norm freeze", "gim-no-norm": "gradient normalization"}
PUB_BEST = "GIM has the best mean CPR over EAP, EAP-IG, Hybrid-ens and IFR (MIB: GPT-2, Qwen-2.5, Gemma-2, Llama-3.1)"
PUB_CMD = "none: the paper claims the best CPR; CMD is MIB's second metric (lower is better), reported beside it"
PUB_MODS = "removing any one modification lowers performance in nearly every model-dataset pair (the paper's ablation)"
PUB_FA = "higher comprehensiveness than Gradient x Input, IG, DeepLIFT, TransformerLRP (7 LLMs, 6 datasets)"


def _best_other(c: pd.DataFrame, metric: str) -> pd.Series | None:
    """The contrast row against the strongest other method: the smallest CPR gain (the other
    method with the highest CPR) or the largest CMD difference (the one with the lowest CMD)."""
    o = c[c["versus"].isin(OTHERS)]
    if o.empty:
        return None
    return o.loc[o["d_cpr"].idxmin()] if metric == "cpr" else o.loc[o["d_cmd"].idxmax()]


def _task_rows(model: str, task: str, c: pd.DataFrame) -> list[dict]:
    rows = []
    for metric, side, what, pub in (("cpr", "above", "higher CPR", PUB_BEST), ("cmd", "below", "lower CMD", PUB_CMD)):
        cid, claim = f"lm_gim_best_{metric}_{task}", f"{task}: GIM has a {what} than EAP and EAP-IG"
        r = _best_other(c, metric)
        if r is None:
            rows.append(R.not_run(model, PAPER, cid, claim, pub, "GIM, EAP or EAP-IG did not run"))
            continue
        d = f"d_{metric}"
        note = f"GIM minus {r['versus']} (the strongest other), paired bootstrap over {int(r['n_pairs'])} pairs"
        rows.append(R.row(model, PAPER, cid, claim, pub, r[d], (r[f"{d}_lo"], r[f"{d}_hi"]),
                          int(r["n_pairs"]), side=side, note=note, resampled="pairs"))  # fmt: skip
    for m, label in MODIFICATIONS.items():
        r = c[c["versus"] == m]
        for metric, (cid, claim, side, note) in _modification_claims(task, m, label).items():
            if r.empty:
                rows.append(R.not_run(model, PAPER, cid, claim, PUB_MODS, f"{m} did not run"))
                continue
            d, n = f"d_{metric}", int(r.iloc[0]["n_pairs"])
            rows.append(R.row(model, PAPER, cid, claim, PUB_MODS, r.iloc[0][d], (r.iloc[0][f"{d}_lo"], r.iloc[0][f"{d}_hi"]),
                              n, side=side, note=f"{note}, paired bootstrap over {n} pairs", resampled="pairs"))  # fmt: skip
    return rows


def _modification_claims(task: str, m: str, label: str) -> dict[str, tuple[str, str, str, str]]:
    """{metric: (claim id, claim, side, note)} of the claim that GIM needs the modification
    that ``m`` removes, on CPR (higher is better: GIM's minus the ablation's above 0) and on
    CMD (lower is better: GIM's minus the ablation's below 0, the ablation's CMD higher).
    The contrasts' d_cpr and d_cmd are GIM's value minus the ablation's
    (:func:`selfrepair.gim.lm_pairs.paired_contrast`)."""
    short = m.removeprefix("gim-no-")
    return {
        "cpr": (f"lm_gim_needs_{short}_{task}", f"{task}: removing {label} lowers GIM's CPR", "above",
                f"CPR of GIM minus {m}"),
        "cmd": (f"lm_gim_needs_{short}_cmd_{task}", f"{task}: removing {label} raises GIM's CMD", "below",
                f"CMD of GIM minus {m} (lower is better)"),
    }  # fmt: skip


def metric_pairs(task: str) -> list[tuple[str, str, str]]:
    """(claim, CPR claim id, CMD claim id) of each of GIM's claims on ``task`` that is tested
    on both of MIB's metrics: the best of the gradient methods, and each modification."""
    pairs = [(f"{task}: GIM beats EAP and EAP-IG", f"lm_gim_best_cpr_{task}", f"lm_gim_best_cmd_{task}")]
    for m, label in MODIFICATIONS.items():
        c = _modification_claims(task, m, label)
        pairs.append((f"{task}: GIM needs {label}", c["cpr"][0], c["cmd"][0]))
    return pairs


# the feature-attribution claims: (claim id, column of feature_attribution.csv, what it is)
FA_CLAIMS = (
    ("lm_gim_fa_comprehensiveness", "comprehensiveness", "paper C's comprehensiveness (logit drop over the full logit)"),
    ("lm_gim_fa_comprehensiveness_prob", "comprehensiveness_prob",
     "comprehensiveness on the softmax probability (probability drop over the full probability)"),
)  # fmt: skip
FA_COLUMNS = ("example", "method", "comprehensiveness", "comprehensiveness_prob", "correct")


def fa_answered(fa: pd.DataFrame) -> pd.DataFrame:
    """The feature-attribution rows of the prompts the model answers (the IO name's logit
    above the subject's), the prompts paper C's evaluation keeps (its authors score the
    examples the model predicts correctly)."""
    missing = [c for c in FA_COLUMNS if c not in fa.columns]
    if missing:
        raise ValueError(f"feature_attribution table lacks {missing} (written by an older gim_lm: rerun it)")
    return fa[fa["correct"].astype(bool)]


def _fa_rows(model: str, fa: pd.DataFrame | None) -> list[dict]:
    claim = "ioi: GIM's feature attribution is more comprehensive than Gradient x Input"
    if fa is None or fa.empty or not {"gim", "grad_x_input"} <= set(fa["method"]):
        why = "feature attribution of GIM or Gradient x Input did not run"
        return [R.not_run(model, PAPER, cid, f"{claim} ({what})", PUB_FA, why) for cid, _, what in FA_CLAIMS]
    kept = fa_answered(fa)
    n_all = fa["example"].nunique()
    rows = []
    for cid, col, what in FA_CLAIMS:
        w = kept.pivot_table(index="example", columns="method", values=col)
        d = (
            (w["gim"] - w["grad_x_input"]).dropna()
            if {"gim", "grad_x_input"} <= set(w.columns)
            else pd.Series([], dtype=float)
        )
        ci = t_interval(d.to_numpy(dtype=float))
        note = (f"{what}, GIM minus Gradient x Input, paired over the {len(d)} of {n_all} IOI prompts the model "
                f"answers (IO's logit above S's), Student-t 95% interval")  # fmt: skip
        rows.append(R.row(model, PAPER, cid, f"{claim} ({what.split(' (')[0]})", PUB_FA,
                          float(np.mean(d)) if len(d) else np.nan, (ci["lo"], ci["hi"]), len(d), note=note,
                          resampled="prompts"))  # fmt: skip
    return rows


def lm_claims(model: str, tasks: pd.DataFrame, contrasts: pd.DataFrame, fa: pd.DataFrame | None) -> list[dict]:
    """Paper C's claim rows on ``model`` from its ``gim_lm`` tables: per solved task the
    contrasts (GIM against each other method), then the feature attribution."""
    rows = []
    for _, t in tasks.iterrows():
        if not bool(t["solved"]):
            continue
        c = contrasts[contrasts["task"] == t["task"]] if len(contrasts) else contrasts
        rows += _task_rows(model, str(t["task"]), c)
    return rows + _fa_rows(model, fa)
