"""The documents' tables of claims tested on real language models
(``results/reference/real_lms_claims.csv``, a copy of ``results/published/real_lms.csv``):
one headline row per model, and the full table."""

from __future__ import annotations

import pandas as pd

MODEL_LABELS = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma-3-270M"}
# the claims a headline row quotes, by claim id, with a short label
HEADLINE = {
    "lm_coax_auc_beats_baselines": "COAX AUC minus best baseline",
    "lm_gim_best_cpr": "GIM CPR minus best other",
}


def _v(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "" if x != x else f"{x:.3g}"


def headline_rows(t: pd.DataFrame) -> list[str]:
    """Rows for the README's headline table (columns: claims, then holds, inconclusive,
    fails, not run in the places of reproduced, fragile, differs, not run; the label says so)."""
    out = []
    for model, g in t.groupby("model", sort=False):
        counts = [int((g["verdict"] == v).sum()) for v in ("holds", "inconclusive", "fails", "not run")]
        keys = []
        for cid, label in HEADLINE.items():
            r = g[g["id"] == cid]
            if r.empty:
                continue
            r = r.iloc[0]
            ci = f" [{_v(r['ci_low'])}, {_v(r['ci_high'])}]" if _v(r["ci_low"]) else ""
            keys.append(f"{label} {_v(r['measured'])}{ci} ({r['verdict']})")
        label = MODEL_LABELS.get(model, model)
        out.append(
            f"| B and C on {label}, a real LM (counts: holds, inconclusive, fails, not run) | {len(g)} | "
            + " | ".join(map(str, counts))
            + " | "
            + "; ".join(keys)
            + " |"
        )
    return out


def full_markdown(t: pd.DataFrame) -> str:
    cols = ["model", "paper", "claim", "measured", "ci_low", "ci_high", "n", "verdict", "published", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in t[cols].itertuples(index=False):
        cells = [MODEL_LABELS.get(r[0], r[0])] + [_v(x) if i in (3, 4, 5) else str(x) for i, x in enumerate(r)][1:]
        lines.append("| " + " | ".join("" if c in ("nan", "None") else c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)
