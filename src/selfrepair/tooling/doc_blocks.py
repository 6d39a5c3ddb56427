"""The results pages' per-paper blocks, rendered from results/reference/published_summary.csv:
each paper's verdict counts with the claims that do not reproduce (``verdict_<paper>``).

readme_table.blocks() adds them to the blocks it renders into the documents.
"""

from __future__ import annotations

import pandas as pd

STATUSES = ("reproduced", "fragile", "differs", "not run")


def _status(s: pd.Series) -> pd.Series:
    return s.fillna("not run").astype(str)


def _value(v, lo=None, hi=None) -> str:
    """'0.585 [0.458, 0.698]', a whole number in full, text as it is, '' for none."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "" if v is None or (isinstance(v, float) and v != v) else str(v)
    if x != x:
        return ""
    s = str(int(x)) if x == int(x) and abs(x) < 1e9 else f"{x:.3g}"
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return s
    return s if lo != lo or hi != hi else f"{s} [{lo:.3g}, {hi:.3g}]"


def _is_number(v) -> bool:
    try:
        return float(v) == float(v)
    except (TypeError, ValueError):
        return False


def counts_sentence(status: pd.Series) -> str:
    """'1 reproduced, 4 fragile, 12 differ, 1 not run' (every status, zeros included)."""
    st = _status(status)
    words = {"differs": "differ"}
    return ", ".join(f"{int((st == s).sum())} {words.get(s, s)}" for s in STATUSES)


def verdict_markdown(df: pd.DataFrame, paper: str) -> str:
    """One paper's claims: how many came out each way (per protocol where the authors'-code
    columns are filled), then a table of every claim that is *differs* or *fragile* under
    either protocol, published against reproduced with its 95% interval."""
    g = df[df["paper"] == paper]
    authors = "authors_status" in g.columns and (_status(g["authors_status"]) != "not run").any()
    lines = [f"{len(g)} claims."]
    if authors:
        lines[0] += f" Under the paper's text: {counts_sentence(g['status'])}."
        lines[0] += f" Under the authors' code: {counts_sentence(g['authors_status'])}."
    else:
        lines[0] += f" {counts_sentence(g['status'])}."
    bad = _status(g["status"]).isin(["differs", "fragile"])
    if authors:
        bad |= _status(g["authors_status"]).isin(["differs", "fragile"])
    if not bad.any():
        return lines[0] + " No claim that ran differs from the published value."
    cols = ["claim", "published", "reproduced [95% CI]", "status"] + (
        ["authors' code", "status (authors)"] if authors else []
    )
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in g[bad].itertuples():
        pub = _value(r.published) + (
            f" +- {_value(r.tolerance)}" if _is_number(r.published) and _is_number(r.tolerance) else ""
        )
        cells = [f"`{r.id}`", pub, _value(r.reproduced, r.ci_low, r.ci_high), _status(pd.Series([r.status]))[0]]
        if authors:
            cells += [
                _value(r.authors_reproduced, r.authors_ci_low, r.authors_ci_high),
                _status(pd.Series([r.authors_status]))[0],
            ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def blocks(summary: pd.DataFrame) -> dict[str, str]:
    """{block name: markdown} of this module, from the published summary."""
    papers = [p for p in dict.fromkeys(summary["paper"]) if p != "groundtruth"]
    return {f"verdict_{p}": verdict_markdown(summary, p) for p in papers}
