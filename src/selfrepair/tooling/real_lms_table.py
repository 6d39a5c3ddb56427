"""The documents' tables of claims tested on real language models
(``results/reference/real_lms_claims.csv``, a copy of ``results/published/real_lms.csv``):
one headline row per model, and the full table; and the real-LM rules' cost
(``results/reference/real_lms_cost.csv``, which ``make reference`` makes from the run's
``benchmark:`` files: ``python -m selfrepair.tooling.real_lms_table benchmarks --out FILE``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

MODEL_LABELS = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma-3-270M"}
# the claims a headline row quotes, by claim id, with a short label
HEADLINE = {
    "lm_coax_auc_beats_baselines": "COAX AUC - best baseline",
    "lm_gim_best_cpr_ioi": "IOI GIM CPR - best of EAP, EAP-IG",
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
            value = f" {_v(r['measured'])}{ci}" if _v(r["measured"]) else ""
            keys.append(f"{label}{value} ({r['verdict']})")
        label = MODEL_LABELS.get(model, model)
        out.append(
            f"| B, C on {label} (real LM: holds, inconclusive, fails, not run) | {len(g)} | "
            + " | ".join(map(str, counts))
            + " | "
            + "; ".join(keys)
            + " |"
        )
    return out


def full_markdown(t: pd.DataFrame) -> str:
    cols = [
        "model",
        "paper",
        "claim",
        "measured",
        "ci_low",
        "ci_high",
        "n",
        "resampled",
        "verdict",
        "verdict_holm",
        "published",
        "note",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    t = t.assign(n=pd.array(t["n"], dtype="Int64"))  # a count (a CSV read gives floats where one is empty)
    for r in t[cols].itertuples(index=False):
        cells = [MODEL_LABELS.get(r[0], r[0])] + [_v(x) if i in (3, 4, 5) else str(x) for i, x in enumerate(r)][1:]
        lines.append(
            "| " + " | ".join("" if c in ("nan", "None", "<NA>") else c.replace("|", "/") for c in cells) + " |"
        )
    return "\n".join(lines)


# paper C's claims under an earlier convention, kept beside the run's (the run's are
# real_lms_claims.csv): file name -> what it was measured under
CONVENTIONS = {
    "real_lms_claims_per_group": "per-group key/value inputs, the tokenizer's BOS",
    "real_lms_claims_tokenizer_bos": "per-query-head key/value inputs, the tokenizer's BOS",
}


def _cell(r) -> str:
    ci = f" [{_v(r['ci_low'])}, {_v(r['ci_high'])}]" if _v(r["ci_low"]) else ""
    return f"{_v(r['measured'])}{ci} {r['verdict']}".strip()


def conventions_markdown(now: pd.DataFrame, before: dict[str, pd.DataFrame]) -> str:
    """Paper C's real-LM claims under MIB's conventions (``now``) beside the same claims
    under others (``before``: label -> claims table), one row per (model, claim): the
    measured value, its interval and the verdict under each, and whether a verdict moved."""
    now = now[now["paper"] == "gim"]
    cols = ["model", "claim id", "MIB's (per-query-head key/value, MIB's BOS)", *before, "verdict moved"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in now.itertuples(index=False):
        r = r._asdict()
        cells = [MODEL_LABELS.get(r["model"], r["model"]), r["id"], _cell(r)]
        moved = []
        for t in before.values():
            o = t[(t["model"] == r["model"]) & (t["id"] == r["id"])]
            cells.append(_cell(o.iloc[0]) if len(o) else "(absent)")
            moved.append(bool(len(o)) and o.iloc[0]["verdict"] != r["verdict"])
        cells.append("yes" if any(moved) else "")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def conventions_block(reference: Path) -> dict[str, str]:
    """{"real_lms_conventions": :func:`conventions_markdown`} of the reference folder's
    claims and the earlier conventions' (:data:`CONVENTIONS`), where the files are there."""
    now = reference / "real_lms_claims.csv"
    before = {
        label: pd.read_csv(reference / f"{name}.csv")
        for name, label in CONVENTIONS.items()
        if (reference / f"{name}.csv").exists()
    }
    if not now.exists() or not before:
        return {}
    return {"real_lms_conventions": conventions_markdown(pd.read_csv(now), before)}


def _agreement(a: str, b: str) -> str:
    """How two verdicts on one claim relate: the same, opposite (one holds where the other
    fails), or one decided where the other is not."""
    if a == b:
        return "agree"
    if {a, b} == {"holds", "fails"}:
        return "opposite"
    return "differ"


def metrics_markdown(t: pd.DataFrame) -> str:
    """Paper C's claims that are tested on both of MIB's metrics, CPR beside CMD, a row per
    (model, claim) (the pairs of :func:`selfrepair.gim.lm_claims.metric_pairs`, for each
    task the claims table has): each metric's measure, interval and verdict, and whether
    the verdicts agree, differ (one decided, the other not, or not run) or are opposite."""
    from selfrepair.gim.lm_claims import metric_pairs

    g = t[t["paper"] == "gim"]
    prefix = "lm_gim_best_cpr_"
    lines = ["| model | claim | CPR (higher is better) | CMD (lower is better) | the two |", "|---|---|---|---|---|"]
    for model, m in g.groupby("model", sort=False):
        by_id = {r["id"]: r for r in m.to_dict("records")}
        tasks = [i.removeprefix(prefix) for i in m["id"] if i.startswith(prefix)]
        for task in tasks:
            for claim, cpr_id, cmd_id in metric_pairs(task):
                if cpr_id not in by_id and cmd_id not in by_id:
                    continue
                a, b = by_id.get(cpr_id), by_id.get(cmd_id)
                cells = [_cell(a) if a else "(absent)", _cell(b) if b else "(absent)"]
                how = _agreement(a["verdict"], b["verdict"]) if a and b else ""
                lines.append(f"| {MODEL_LABELS.get(model, model)} | {claim} | {cells[0]} | {cells[1]} | {how} |")
    return "\n".join(lines)


# paper C's feature attribution per IOI prompt: the reference copies of rule gim_lm's
# feature_attribution.csv are named by this prefix and the model; the columns they need
FA_PROMPT = "real_lms_fa_"
FA_NEEDS = ("example", "method", "comprehensiveness", "comprehensiveness_prob", "target_logit", "target_prob",
            "foil_logit", "correct")  # fmt: skip


def fa_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The feature attribution's comprehensiveness per IOI prompt ({model: rule gim_lm's
    feature_attribution.csv}): the IO name's and the subject's logit, whether the prompt is
    answered (IO's above S's), the IO name's probability, and each method's
    comprehensiveness on the logit (paper C's) and on the probability; then per model the
    mean over all prompts and over the answered ones, and the median of the answered."""
    cols = ["model", "prompt", "IO logit", "S logit", "answered", "P(IO)"]
    methods = list(dict.fromkeys(m for t in tables.values() for m in t["method"]))
    cols += [f"{m} comp." for m in methods] + [f"{m} comp. (prob)" for m in methods]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for model, t in tables.items():
        if missing := [c for c in FA_NEEDS if c not in t.columns]:
            raise ValueError(f"{model}'s feature attribution table lacks {missing} (an older gim_lm wrote it: rerun)")
        label = MODEL_LABELS.get(model, model)
        comp, prob = (
            t.pivot_table(index="example", columns="method", values=v).reindex(columns=methods)
            for v in ("comprehensiveness", "comprehensiveness_prob")
        )
        first = t.drop_duplicates("example").set_index("example").sort_index()
        answered = first["correct"].astype(bool)
        for i, r in first.iterrows():
            cells = [label, str(i), _v(r["target_logit"]), _v(r["foil_logit"]), "yes" if answered[i] else "no",
                     _v(r["target_prob"])] + [_v(comp.loc[i, m]) for m in methods] + [_v(prob.loc[i, m]) for m in methods]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        keep = answered[answered].index
        for what, c, p in (
            (f"mean, all {len(first)}", comp.mean(), prob.mean()),
            (f"mean, the {len(keep)} answered", comp.loc[keep].mean(), prob.loc[keep].mean()),
            (f"median, the {len(keep)} answered", comp.loc[keep].median(), prob.loc[keep].median()),
        ):
            cells = [label, what, "", "", "", ""] + [_v(c[m]) for m in methods] + [_v(p[m]) for m in methods]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fa_block(reference: Path) -> dict[str, str]:
    """{"real_lms_fa": :func:`fa_markdown`} of the reference folder's per-model copies of
    gim_lm's feature_attribution.csv (``real_lms_fa_<model>.csv``), where there are any."""
    files = sorted(Path(reference).glob(f"{FA_PROMPT}*.csv"))
    tables = {f.stem.removeprefix(FA_PROMPT): pd.read_csv(f) for f in files}
    order = list(MODEL_LABELS)
    tables = dict(sorted(tables.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    return {"real_lms_fa": fa_markdown(tables)} if tables else {}


# benchmark files of the real-LM rules, relative to benchmarks/: (path parts before the
# model's name, file name) -> the rule that writes it
COST_RULES = {
    (("lms",), "convert.tsv"): "lm_convert",
    (("coax", "lms"), "run.tsv"): "coax_lm",
    (("coax", "lms"), "pruning.tsv"): "coax_lm_pruning",
    (("gim", "lms"), "run.tsv"): "gim_lm",
    (("groundtruth", "lms"), "run.tsv"): "groundtruth_lm",
}
COST_COLUMNS = ["rule", "model", "wall_s", "cpu_s", "peak_rss_gb", "default_run"]
ROOT = Path(__file__).resolve().parents[3]


def pruning_scales(root: Path = ROOT) -> list[str]:
    """The values of ``lms.scale`` at which rule coax_lm_pruning runs: config/config.yaml's
    ``coax.lms.pruning.scales``, the schema's default filled in as the workflow fills it."""
    import yaml

    from selfrepair.core.config_schema import fill_defaults

    coax = (yaml.safe_load((root / "config" / "config.yaml").read_text()) or {}).get("coax") or {}
    schema = yaml.safe_load((root / "workflow" / "schemas" / "coax.schema.yaml").read_text())
    return list(fill_defaults(coax, schema)["lms"]["pruning"]["scales"])


def cost_table(bench: Path, scales: list[str] | None = None) -> pd.DataFrame:
    """Each real-LM job's measured cost from its Snakemake ``benchmark:`` file under
    ``bench`` (the last line of each: the latest run): wall and CPU seconds and peak
    resident memory, a row per (rule, model), and whether the default run has the job
    (``default_run``: coax_lm_pruning only at the scales ``scales`` names, by default
    :func:`pruning_scales`)."""
    scales = pruning_scales() if scales is None else scales
    rows = []
    for f in sorted(Path(bench).rglob("*.tsv")):
        parts = f.relative_to(bench).parts
        rule = COST_RULES.get((parts[:-2], parts[-1])) if len(parts) >= 3 else None
        if rule is None:
            continue
        t = pd.read_csv(f, sep="\t")
        if t.empty:
            continue
        last = t.iloc[-1]
        default = rule != "coax_lm_pruning" or "default" in scales
        rows.append(
            [rule, parts[-2], float(last["s"]), float(last["cpu_time"]), float(last["max_rss"]) / 1024, default]
        )
    order = {r: i for i, r in enumerate(COST_RULES.values())}
    out = pd.DataFrame(rows, columns=COST_COLUMNS)
    return out.sort_values(["rule", "model"], key=lambda c: c.map(order) if c.name == "rule" else c, kind="stable")


def cost_markdown(t: pd.DataFrame) -> str:
    """The cost table: per rule and model, CPU minutes, wall minutes, peak memory; and
    the sum over the default run's jobs (a job outside it, ``default_run`` false, is
    listed, marked, and left out of the sum)."""
    lines = ["| rule | model | CPU | wall | peak memory |", "|---|---|---|---|---|"]
    for r in t.itertuples(index=False):
        mark = "" if r.default_run else " (not in the default run)"
        lines.append(
            f"| `{r.rule}`{mark} | {MODEL_LABELS.get(r.model, r.model)} | {r.cpu_s / 60:.1f} min | "
            f"{r.wall_s / 60:.1f} min | {r.peak_rss_gb:.2f} GB |"
        )
    d = t[t["default_run"].astype(bool)]
    lines.append(
        f"| all of the default run | {d['model'].nunique()} models | {d['cpu_s'].sum() / 60:.1f} min | "
        f"{d['wall_s'].sum() / 60:.1f} min (jobs one after another) | |"
    )
    return "\n".join(lines)


def _n(x) -> str:
    x = float(x)
    return "never" if x != x or x == float("inf") else f"{x:,.0f}"


def power_markdown(t: pd.DataFrame) -> str:
    """The power table (``real_lms_power.csv``, core.real_power): per claim its verdicts
    (plain 95% / Holm), effect, the n it would need, the config size now and needed, and
    the CPU time of the part of the run that grows with it, now and at that size; then per
    model and part the CPU time to decide every claim of the part that is still open."""
    cols = ["model", "claim id", "verdict (95% / Holm)", "effect", "half-width", "n (resampled)",
            "n needed (95% / Holm)", "size now -> needed", "part", "part CPU now -> needed"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in t.itertuples(index=False):
        cells = [
            MODEL_LABELS.get(r.model, r.model), f"`{r.id}`", f"{r.verdict} / {r.verdict_holm}", _v(r.effect),
            _v(r.half_width), f"{r.n} {str(r.resampled).split(' (')[0]}", f"{_n(r.n_needed)} / {_n(r.n_needed_holm)}",
            f"`{r.size_key}` {r.size} -> {_n(r.size_needed)}", r.part,
            f"{r.part_cpu_s / 60:.1f} -> {_n(r.projected_cpu_s / 60)} min" if r.projected_cpu_s >= 600
            else f"{r.part_cpu_s / 60:.1f} -> {r.projected_cpu_s / 60:.1f} min",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    open_ = t[t["verdict"] == "inconclusive"]
    lines += ["", "Per model and part, the CPU time to decide each open (inconclusive) claim of it:", "",
              "| model | part | CPU now | open claims: the size each needs, and the part's CPU at that size |",
              "|---|---|---|---|"]  # fmt: skip
    for (model, part), g in t.groupby(["model", "part"], sort=False):
        o = open_[(open_["model"] == model) & (open_["part"] == part)].sort_values("projected_cpu_s")
        need = "; ".join(f"`{r.id}` {r.size_key} {_n(r.size_needed)}: {_n(r.projected_cpu_s / 60)} min"
                         for r in o.itertuples()) or "none open"  # fmt: skip
        lines.append(f"| {MODEL_LABELS.get(model, model)} | {part} | {g['part_cpu_s'].iloc[0] / 60:.1f} min | {need} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="the real-LM rules' cost table from their benchmark: files")
    p.add_argument("bench", type=Path, help="the benchmarks/ folder of a run")
    p.add_argument("--out", type=Path, required=True, help="the CSV to write")
    a = p.parse_args(argv)
    t = cost_table(a.bench)
    if t.empty:
        raise SystemExit(f"no real-LM benchmark files under {a.bench} (run the real-LM rules first)")
    t.to_csv(a.out, index=False)
    print(f"{a.out}: {len(t)} jobs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
