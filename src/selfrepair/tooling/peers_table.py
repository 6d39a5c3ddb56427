"""The peers' own code beside ours on a real LM: the documents' tables and the figures
their pages quote, so that a test holds each page to its committed table.

- Paper B: the COAX authors' release (``results/reference/benchmark_peers_coax_lm.csv``,
  written by peers/coax_lm.py; docs/results/peers-coax.md).
- Paper C: MIB's own code (``results/reference/benchmark_peers_mib_smollm2.csv``, written
  by peers/mib_lm.py; docs/results/peers.md), one block per question
  (agreement, CPR and CMD both ways, top-n identity per fraction, time).
"""

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


# ---- MIB beside ours ----
PEERS_MIB = "benchmark_peers_mib_smollm2"
# the first run (N = 2), under the grouped key/value convention (gim.kv_inputs: per_group)
PEERS_MIB_PER_GROUP = f"{PEERS_MIB}_per_group"
PEERS_MIB_GEMMA3 = "benchmark_peers_mib_gemma3"  # Gemma-3-270M, MIB's side on TransformerLens 2.18
PEERS_MIB_TABLES = (PEERS_MIB, PEERS_MIB_PER_GROUP, PEERS_MIB_GEMMA3)  # each with the blocks of BLOCKS
AGREEMENT = ["method", "max_rel_diff", "max_rel_diff_qmlp", "max_rel_diff_kv_group", "spearman",
             "topn_signed_min", "topn_abs_min", "curve_max_diff", "theirs_nonfinite_edges"]  # fmt: skip
METRICS = ["method", "cpr_ours", "cpr_theirs", "cpr_ours_on_theirs", "cpr_theirs_on_ours",
           "cmd_ours", "cmd_theirs", "cmd_ours_on_theirs", "cmd_theirs_on_ours"]  # fmt: skip
TIME = ["method", "ours_score_wall_s", "mib_score_wall_s", "ours_eval_wall_s", "mib_eval_wall_s",
        "score_wall_ratio", "eval_wall_ratio", "wall_ratio", "score_cpu_ratio", "eval_cpu_ratio",
        "cpu_ratio", "load_min", "load_max"]  # fmt: skip
# the remaining differences taken apart: MIB's evaluation of our file at the points where
# the circuit splits a key-value group between live heads and at the others; IFR's tie order
PARTS = ["method", "curve_max_diff", "cross_split_points", "cross_curve_diff_split", "cross_curve_diff_whole",
         "tie_orders", "tie_points_differ", "tie_curve_spread"]  # fmt: skip
BLOCKS = (PEERS_MIB, f"{PEERS_MIB}_metrics", f"{PEERS_MIB}_topn", f"{PEERS_MIB}_time", f"{PEERS_MIB}_parts")


def renderers(plain) -> dict:
    """{block name: table -> markdown}, each the table's columns of that block through
    ``plain`` (readme_table's plain rendering); the top-n block takes every ``topn_``
    column."""

    def columns(cols: list[str], prefix: str | None = None):
        def render(df):
            keep = [c for c in df.columns if c == "method" or c.startswith(prefix)] if prefix else cols
            return plain(df[[c for c in keep if c in df]])

        return render

    blocks = (columns(AGREEMENT), columns(METRICS), columns([], "topn_"), columns(TIME), columns(PARTS))
    return dict(zip(BLOCKS, blocks))
