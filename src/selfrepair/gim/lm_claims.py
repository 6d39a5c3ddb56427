"""Paper C's claims about its method, tested on a packaged real LM (rule ``gim_lm``'s
tables): GIM has the best CPR and CMD of the gradient methods; each of its three
modifications matters; its feature attribution is more comprehensive than Gradient x
Input. One row per (claim, solved task) (:mod:`selfrepair.core.real_claims`); the
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
        cid, claim = f"lm_gim_needs_{m.removeprefix('gim-no-')}_{task}", f"{task}: removing {label} lowers GIM's CPR"
        r = c[c["versus"] == m]
        if r.empty:
            rows.append(R.not_run(model, PAPER, cid, claim, PUB_MODS, f"{m} did not run"))
            continue
        r = r.iloc[0]
        rows.append(R.row(model, PAPER, cid, claim, PUB_MODS, r["d_cpr"], (r["d_cpr_lo"], r["d_cpr_hi"]),
                          int(r["n_pairs"]), note=f"CPR of GIM minus {m}, paired bootstrap over pairs",
                          resampled="pairs"))  # fmt: skip
    return rows


def _fa_row(model: str, fa: pd.DataFrame) -> dict:
    cid, claim = (
        "lm_gim_fa_comprehensiveness",
        "ioi: GIM's feature attribution is more comprehensive than Gradient x Input",
    )
    if fa is None or fa.empty or not {"gim", "grad_x_input"} <= set(fa["method"]):
        return R.not_run(model, PAPER, cid, claim, PUB_FA, "feature attribution of GIM or Gradient x Input did not run")
    w = fa.pivot_table(index="example", columns="method", values="comprehensiveness")
    d = (w["gim"] - w["grad_x_input"]).dropna()
    ci = t_interval(d.to_numpy(dtype=float))
    note = f"paired over {len(d)} IOI prompts, Student-t 95% interval"
    return R.row(model, PAPER, cid, claim, PUB_FA, float(np.mean(d)) if len(d) else np.nan, (ci["lo"], ci["hi"]),
                 len(d), note=note, resampled="prompts")  # fmt: skip


def lm_claims(model: str, tasks: pd.DataFrame, contrasts: pd.DataFrame, fa: pd.DataFrame | None) -> list[dict]:
    """Paper C's claim rows on ``model`` from its ``gim_lm`` tables: per solved task the
    contrasts (GIM against each other method), then the feature attribution."""
    rows = []
    for _, t in tasks.iterrows():
        if not bool(t["solved"]):
            continue
        c = contrasts[contrasts["task"] == t["task"]] if len(contrasts) else contrasts
        rows += _task_rows(model, str(t["task"]), c)
    return rows + [_fa_row(model, fa)]
