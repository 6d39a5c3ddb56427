"""The comparison of paper B's scores with the COAX authors' release on a real LM
(``results/reference/benchmark_peers_coax_lm.csv``, written by
benchmarks/peers_coax_lm.py): the documents' table, and the figures its page's prose
quotes, so that a test holds the page to the committed table."""

from __future__ import annotations

import pandas as pd

# the table's columns; the run's constants (machine, commits, sizes, load) are one value
# per run and the prose gives them
COAX_COLUMNS = [
    "score",
    "max_rel_diff",
    "spearman",
    "top_k_same",
    "auc_ours",
    "auc_theirs",
    "timed_as",
    "wall_ours",
    "wall_theirs",
    "wall_ratio",
    "cpu_ratio",
]


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    return "" if str(v) == "nan" else str(v)


def coax_markdown(t: pd.DataFrame) -> str:
    """The table: one row per score (the clean logits first), :data:`COAX_COLUMNS`."""
    lines = ["| " + " | ".join(COAX_COLUMNS) + " |", "|" + "---|" * len(COAX_COLUMNS)]
    for row in t[COAX_COLUMNS].itertuples(index=False):
        lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(lines)


def coax_quoted(t: pd.DataFrame) -> dict[str, str]:
    """{what: the text the page's prose writes for it}, every figure from the table."""
    s = t[t["score"] != "logits"]
    logits = t[t["score"] == "logits"].iloc[0]
    r = t.iloc[0]
    return {
        "largest relative difference of a score": f"{s['max_rel_diff'].max():.1e}",
        "largest absolute difference of the clean logits": f"{logits['max_abs_diff']:.1e}",
        "fewest wall ratio": f"{s['wall_ratio'].min():.2f}",
        "most wall ratio": f"{s['wall_ratio'].max():.2f}",
        "mean load": f"{s['load'].mean():.1f}",
        "machine": str(r["machine"]),
        "commit": str(r["commit"]),
        "peer commit": str(r["peer_commit"]),
        "date": str(r["date"]),
        "primaries": str(r["primaries"]),
        "prompts": f"{int(r['n_prompts'])} prompts (seed {int(r['data_seed'])})",
        "truth prompts": f"{int(r['n_truth'])} truth prompts (seed {int(r['truth_seed'])})",
        "backups": f"{int(r['n_backups'])} backups among {int(r['n_candidates'])} candidates",
        "token ids compared": f"{int(r['prompts_compared'])} prompts",
        "threads": f"{int(r['threads'])} thread",
    }


def coax_problems(t: pd.DataFrame, page: str, block: str = "benchmark_peers_coax_lm") -> list[str]:
    """What in ``page`` disagrees with the table ``t``: its block not the table's
    rendering, a quoted figure missing."""
    out = []
    if f"<!-- {block}:start -->\n{coax_markdown(t)}\n<!-- {block}:end -->" not in page:
        out.append(f"block {block!r} is not the table's rendering")
    out += [f"{what}: {text!r} not in the page" for what, text in coax_quoted(t).items() if text not in page]
    return out
