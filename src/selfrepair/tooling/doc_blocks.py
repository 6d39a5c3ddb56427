"""The results pages' blocks read from results/reference/: each paper's verdict counts with
the claims that do not reproduce (``verdict_<paper>``, from published_summary.csv), and the
*not run* claims grouped by what they need, with the command and the cost measured on the
real-size stand-ins (``not_run``, from published_summary.csv and real_size.csv).

readme_table.blocks() adds them to the blocks it renders into the documents.
"""

from __future__ import annotations

import re

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


LETTER = {"heroes": "A", "coax": "B", "gim": "C"}
_WEIGHTS = re.compile(r"weights not found for '([^']+)'")
# a not-run note that names an experiment this workflow does not implement -> that need
# (checked before the absent weights: such a claim stays not run when they are present)
CODE = (
    (
        "held-out induction completion",
        "the COAX release's held-out induction completion on its 8 models (6 selectors): not implemented here",
    ),
    (
        "no toy analogue: ",
        "figures of the COAX release on GPT-2 small that the IOI tables do not hold (average precision, "
        "freezing a selector's set, circuit completion, knockout distances and sets, the mechanism panel): "
        "not implemented here",
    ),
    ("WikiText-2", "GPT-2 head pruning on WikiText-2 (data, weights and the experiment): not implemented here"),
    (
        "greater-than circuit|qualitative reading",
        "outside this workflow (the greater-than circuit; a qualitative reading)",
    ),
    (
        "not run on MIB models|the claim is about (?:instruction-tuned )?LLMs",
        "paper C's experiments on LLMs (the ablation study, feature attribution, self-repair in attention): "
        "run here on toy models only",
    ),
)
MIB = "MIB models/datasets are not in the local cache"
KINDS = ("weights", "mib", "code", "other", "undefined")
RUN = {
    "coax": "`snakemake --cores all results/published/coax.csv`",
    "gim": "`snakemake --cores all results/published/gim.csv`",
}


def need_of(paper: str, note: str) -> tuple[str, tuple[str, ...]]:
    """(kind, what) a not-run claim needs, read from its note: ('code', (need,)) for an
    experiment this workflow lacks, ('mib', ()) for MIB's models and datasets, ('weights',
    models) for absent weights, ('undefined', ()) for a value that ran but is undefined,
    else ('other', (note,))."""
    note = str(note)
    if note.startswith("undefined"):
        return "undefined", ()
    for pattern, need in CODE:
        if re.search(pattern, note):
            return "code", (need,)
    if MIB in note:
        return "mib", ()
    models = tuple(dict.fromkeys(_WEIGHTS.findall(note)))
    return ("weights", models) if models else ("other", (note,))


def _hours(h: float) -> str:
    """3 significant digits, in full from 100 on (1,261 not 1.26e+03)."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def _cost(real: pd.DataFrame | None, models, mib: bool) -> str:
    """Projected hours on one core at the default config's size, per model and part, from
    the real-size stand-ins; MIB's parts summed per model, EActP left out (it is skipped
    past gim.eactp_max_edges, as on every real MIB graph)."""
    if real is None:
        return ""
    out = []
    for m in models:
        r = real[real["model"] == m]
        r = r[r["part"].str.startswith("mib:") == mib]
        if mib:
            r = r[r["part"] != "mib:eactp"]
            parts = f"{_hours(r['hours_config_projected'].sum())} h" if len(r) else ""
        else:
            parts = ", ".join(f"{p} {_hours(h)} h" for p, h in zip(r["part"], r["hours_config_projected"]))
        if parts:
            out.append(f"`{m}` {parts} ({r['weights_gb_fp32'].iloc[0]:.3g} GB fp32)")
    return "; ".join(out)


def not_run_groups(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per need: kind, what (models or the need), claims, papers; in the order of
    KINDS, then of first mention."""
    rows = summary[summary["status"].fillna("not run") == "not run"]
    keys = [need_of(p, n) for p, n in zip(rows["paper"], rows["note"])]
    df = pd.DataFrame({"kind": [k for k, _ in keys], "what": [w for _, w in keys], "paper": list(rows["paper"])})
    g = df.groupby(["kind", "what"], sort=False)
    out = g.agg(claims=("paper", "size"), papers=("paper", lambda s: list(dict.fromkeys(s)))).reset_index()
    rank = {k: i for i, k in enumerate(KINDS)}  # what runs once present first
    return out.sort_values("kind", key=lambda k: k.map(rank), kind="stable").reset_index(drop=True)


def not_run_markdown(summary: pd.DataFrame, real: pd.DataFrame | None = None) -> str:
    """The not-run claims grouped by what they need: the command that runs them once it is
    present, and the cost measured on the real-size stand-ins (random weights)."""
    groups = not_run_groups(summary)
    n = int(groups["claims"].sum())
    by_paper = groups.explode("papers").groupby("papers")["claims"].sum()
    by_paper = by_paper.sort_index(key=lambda p: p.map(lambda x: LETTER.get(x, x)))
    head = f"{n} claim{' is' if n == 1 else 's are'} *not run* (" + ", ".join(
        f"paper {LETTER.get(p, p)} {int(c)}" for p, c in by_paper.items()
    )
    lines = [head + "). By what they need:", ""]
    lines += [
        "| what they need | claims | paper | once present, run | cost at real size: hours on one core (projected) |",
        "|---|---|---|---|---|",
    ]
    mib_models = [] if real is None else list(dict.fromkeys(real.loc[real["part"].str.startswith("mib:"), "model"]))
    for r in groups.itertuples():
        papers = ", ".join(LETTER.get(p, p) for p in r.papers)
        run, cost = RUN.get(r.papers[0], ""), ""
        if r.kind == "weights":
            need, cost = "weights of " + ", ".join(f"`{m}`" for m in r.what), _cost(real, r.what, False)
        elif r.kind == "mib":
            need, cost = (
                "MIB's models and datasets (`gim.mib.models`, `gim.mib.datasets`)",
                _cost(real, mib_models, True),
            )
        elif r.kind == "undefined":
            need, run = "nothing absent: it ran, and its value is undefined on this run", ""
        else:
            need, run = r.what[0].replace("|", "/"), ""
        lines.append(f"| {need} | {r.claims} | {papers} | {run} | {cost} |")
    return "\n".join(lines)


def blocks(summary: pd.DataFrame, real: pd.DataFrame | None = None) -> dict[str, str]:
    """{block name: markdown} of this module, from the published summary (and the
    real-size stand-ins' table for the costs)."""
    papers = [p for p in dict.fromkeys(summary["paper"]) if p != "groundtruth"]
    out = {f"verdict_{p}": verdict_markdown(summary, p) for p in papers}
    out["not_run"] = not_run_markdown(summary, real)
    for p in papers:  # each paper's page: its own not-run claims
        mine = summary[summary["paper"] == p]
        if (mine["status"].fillna("not run") == "not run").any():
            out[f"not_run_{p}"] = not_run_markdown(mine, real)
    return out
