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
