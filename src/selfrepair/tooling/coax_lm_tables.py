"""The documents' table of paper B's seeds on the real LMs: for each model and seeding,
the primaries and the backups chosen on each half of the truth prompts, side by side
(``results/reference/real_lms_seeds_<model>.csv``, copies of rule coax_lm's
``seeds_stability.csv`` that ``make reference`` makes)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PREFIX = "real_lms_seeds_"
MODEL_LABELS = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma-3-270M"}
SEEDING_LABELS = {"name_movers": "name movers", "single_drop": "largest single drops"}


def _share(x) -> str:
    return "" if x != x else f"{float(x):.2f}"


def seeds_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """One row per (model, seeding, role): the units chosen on half A and on half B of the
    truth prompts, the prompts in each, their Jaccard overlap and the share of A's units
    that B chose too."""
    cols = ["model", "seeding", "role", "half A", "half B", "prompts (A, B)", "Jaccard", "A's kept in B"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for model, t in tables.items():
        for r in t.itertuples(index=False):
            cells = [
                MODEL_LABELS.get(model, model),
                SEEDING_LABELS.get(r.seeding, r.seeding),
                r.role,
                str(r.half_a) if r.half_a == r.half_a else "(none)",
                str(r.half_b) if r.half_b == r.half_b else "(none)",
                f"{int(r.n_prompts_a)}, {int(r.n_prompts_b)}",
                _share(r.jaccard),
                _share(r.kept_share),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_block(reference: Path) -> dict[str, str]:
    """{"real_lms_seeds": :func:`seeds_markdown`} of the reference folder's per-model
    copies, where there are any (in :data:`MODEL_LABELS`'s order, then by name)."""
    files = sorted(Path(reference).glob(f"{PREFIX}*.csv"))
    order = list(MODEL_LABELS)
    tables = {f.stem.removeprefix(PREFIX): pd.read_csv(f) for f in files}
    tables = dict(sorted(tables.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    return {"real_lms_seeds": seeds_markdown(tables)} if tables else {}


PRUNING_PREFIX = "real_lms_pruning_"  # + <model>.csv: rule coax_lm_pruning's sequences.csv
PRUNING_STATUS = "real_lms_pruning_status.csv"  # its status rows (the measured cost), a row per model


def pruning_markdown(tables: dict[str, pd.DataFrame], status: pd.DataFrame | None) -> str:
    """Paper B's pruning on the real LMs ({model: per-window NLL}): the perplexity of each
    method at each share of heads removed, the claim (COAX against the best one-shot
    baseline at the headline share, its interval over the windows and verdict), and the
    job's CPU time where its status row is given."""
    from selfrepair.coax.lm_claims import pruning_row
    from selfrepair.coax.lm_pruning import METHODS, summary

    lines = []
    for model, seq in tables.items():
        label = MODEL_LABELS.get(model, model)
        t = summary(seq, 0.0)
        methods = [m for m in METHODS if m in set(t["method"])]
        wide = t.pivot_table(index=["sparsity", "n_pruned"], columns="method", values="perplexity")[methods]
        heads = ", ".join(f"{int(n)}" for _, n in wide.index)
        lines += [f"**{label}** (heads removed at each share: {heads}; {seq['window'].nunique()} windows)", ""]
        lines += ["| heads removed | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
        for (s, _), r in wide.iterrows():
            best = min(r[m] for m in methods)
            cells = [(f"**{r[m]:,.1f}**" if r[m] == best else f"{r[m]:,.1f}") for m in methods]
            lines.append(f"| {s:.0%} | " + " | ".join(cells) + " |")
        headline = float(t["sparsity"].max())
        c = pruning_row(model, seq, headline)
        lines += [
            "",
            f"COAX against the best one-shot baseline at {headline:.0%}: log-perplexity gap {c['measured']:.3f} "
            f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] (95%, {c['n']} windows resampled): **{c['verdict']}**.",
        ]
        if status is not None and (status["model"] == model).any():
            r = status[status["model"] == model].iloc[-1]
            lines.append(f"The job: {r['cpu_s'] / 60:.1f} CPU-min, peak {r['peak_rss_mb'] / 1024:.2f} GB.")
        lines.append("")
    return "\n".join(lines).rstrip()


def pruning_block(reference: Path) -> dict[str, str]:
    """{"real_lms_pruning": :func:`pruning_markdown`} of the reference folder's copies, where
    there are any."""
    files = sorted(Path(reference).glob(f"{PRUNING_PREFIX}*.csv"))
    files = [f for f in files if f.name != PRUNING_STATUS]
    order = list(MODEL_LABELS)
    tables = {f.stem.removeprefix(PRUNING_PREFIX): pd.read_csv(f) for f in files}
    tables = dict(sorted(tables.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    st = Path(reference) / PRUNING_STATUS
    status = pd.read_csv(st) if st.exists() else None
    return {"real_lms_pruning": pruning_markdown(tables, status)} if tables else {}
