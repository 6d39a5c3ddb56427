"""The blocks of docs/results/peers.md: MIB's own code beside ours on a real LM
(benchmarks/peers_mib_lm.py), rendered from its reference table
results/reference/benchmark_peers_mib_smollm2.csv, one block per question (agreement,
CPR and CMD both ways, top-n identity per fraction, time)."""

from __future__ import annotations

PEERS_MIB = "benchmark_peers_mib_smollm2"
AGREEMENT = ["method", "max_rel_diff", "max_rel_diff_qmlp", "max_rel_diff_kv_group", "spearman",
             "topn_signed_min", "topn_abs_min", "curve_max_diff"]  # fmt: skip
METRICS = ["method", "cpr_ours", "cpr_theirs", "cpr_ours_on_theirs", "cpr_theirs_on_ours",
           "cmd_ours", "cmd_theirs", "cmd_ours_on_theirs", "cmd_theirs_on_ours"]  # fmt: skip
TIME = ["method", "ours_score_wall_s", "mib_score_wall_s", "ours_eval_wall_s", "mib_eval_wall_s",
        "score_wall_ratio", "eval_wall_ratio", "wall_ratio", "score_cpu_ratio", "eval_cpu_ratio",
        "cpu_ratio", "load_min", "load_max"]  # fmt: skip
BLOCKS = (PEERS_MIB, f"{PEERS_MIB}_metrics", f"{PEERS_MIB}_topn", f"{PEERS_MIB}_time")


def renderers(plain) -> dict:
    """{block name: table -> markdown}, each the table's columns of that block through
    ``plain`` (readme_table's plain rendering); the top-n block takes every ``topn_``
    column."""

    def columns(cols: list[str], prefix: str | None = None):
        def render(df):
            keep = [c for c in df.columns if c == "method" or c.startswith(prefix)] if prefix else cols
            return plain(df[[c for c in keep if c in df]])

        return render

    return dict(zip(BLOCKS, (columns(AGREEMENT), columns(METRICS), columns([], "topn_"), columns(TIME))))
