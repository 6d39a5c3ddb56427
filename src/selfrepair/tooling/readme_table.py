"""Render the committed reference tables as the documents' markdown blocks.

    python -m selfrepair.tooling.readme_table          # rewrite the generated blocks of every document
    python -m selfrepair.tooling.readme_table --check  # exit 1 if any document is out of date

A block is the text between `<!-- name:start -->` and `<!-- name:end -->`, rendered into every document
that has its markers (README.md and every markdown file under docs/, subfolders too). Every number in
those blocks comes from files under results/reference/, copies of what a full run of the workflow wrote.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from selfrepair.tooling import coax_lm_tables, doc_blocks, lm_quantization, peers_table, real_lms_table

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "results" / "reference"


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    s = str(v)
    return "" if s == "nan" else s.replace("|", "/")


# models.load_bridge's message for absent weights, with an optional "name: " prefix
# (claims over several models list each one) and, in older runs, the exception's name
_ABSENT = re.compile(
    r"(?:(?P<prefix>[^\s;:]+): )?weights not found for '(?P<model>[^']+)' \((?P<where>[^)]*)\)(?:: (?P<error>\w+))?"
)
_ABSENT_RUN = re.compile(r"weights of \S+ absent(?:; weights of \S+ absent)+")


def absent_models(notes) -> dict[str, tuple[str, int]]:
    """{model: (why, number of notes naming it)} for every model whose weights a note says
    are absent, in order of first mention."""
    out: dict[str, tuple[str, int]] = {}
    for note in notes:
        seen = {}
        for m in _ABSENT.finditer(str(note)):
            error = f": {m['error']}" if m["error"] else ""
            seen.setdefault(m["model"], f"weights not found ({m['where']}){error}")
        for model, why in seen.items():
            first_why, n = out.get(model, (why, 0))
            out[model] = (first_why, n + 1)
    return out


def shorten_note(note: str) -> str:
    """The note with each 'weights not found ...' sentence replaced by 'weights of X absent',
    and a run of those merged into one ('weights of a, b, c absent')."""

    def one(m):
        keep = f"{m['prefix']}: " if m["prefix"] and m["prefix"] != m["model"] else ""  # "not run: " stays
        return f"{keep}weights of {m['model']} absent"

    s = _ABSENT.sub(one, str(note))
    return _ABSENT_RUN.sub(
        lambda m: "weights of " + ", ".join(re.findall(r"weights of (\S+) absent", m.group(0))) + " absent", s
    )


def published_markdown(csv: Path) -> str:
    """The full published-vs-reproduced table; absent models are listed once above it,
    and a row says only 'weights of X absent'."""
    df = pd.read_csv(csv)
    head = []
    groups: dict[str, list[str]] = {}  # one reason (the model's name as *model*) -> its models
    for m, (why, n) in absent_models(df["note"]).items():
        groups.setdefault(why.replace(m, "*model*"), []).append(f"`{m}` ({n} claim{'s' if n > 1 else ''})")
    if groups:
        head = [
            "Models whose weights are absent on the machine of this run; each claim that needs one is *not run*:",
            "",
        ]
        head += [f"- {', '.join(models)}: {why}" for why, models in groups.items()]
        head.append("")
    authors = "authors_status" in df.columns and (df["authors_status"].fillna("not run") != "not run").any()
    cols = (
        ["paper", "claim", "published", "reproduced", "tolerance", "status"]
        + (["authors' code"] if authors else [])
        + ["note"]
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples():
        note = shorten_note(r.note) if isinstance(r.note, str) else r.note
        cells = [r.paper, r.claim, r.published, r.reproduced, r.tolerance, r.status]
        if authors:
            cells.append(authors_cell(r._asdict()))
        lines.append("| " + " | ".join(_fmt(x) for x in cells + [note]) + " |")
    return "\n".join(head + lines)


def authors_cell(r: dict) -> str:
    """A claim under the authors'-code protocol: 'value [lo, hi] (status)', or its status."""
    status = r.get("authors_status")
    if not isinstance(status, str):
        return ""
    v = _num(r.get("authors_reproduced"))
    if not isinstance(v, float) or v != v:
        return status
    lo, hi = _num(r.get("authors_ci_low")), _num(r.get("authors_ci_high"))
    ci = f" [{_short(lo)}, {_short(hi)}]" if isinstance(lo, float) and lo == lo else ""
    return f"{_short(v)}{ci} ({status})"


PAPERS = {
    "heroes": "A. Hidden Heroes and Gradient Bloats",
    "coax": "B. COAX, conditional co-ablation",
    "gim": "C. GIM, gradient interaction modifications",
}
# the claims the headline table quotes, by claim id, with a short label
HEADLINE = {
    "heroes": {
        "rho_reverse": "rho reversal",
        "rho_sort": "rho sorting",
        "bloat_superadditivity": "bloat superadditivity",
        "hero_ablation_reverse_pct": "hero ablation on reversal",
    },
    "coax": {"synthetic_coax_auc": "synthetic COAX AUC", "ioi_auc_coax": "GPT-2 IOI COAX AUC"},
    "gim": {"gim_edges_gpt2": "GPT-2 MIB edges", "gim_best_mean_cpr": "GIM best mean CPR on MIB"},
}


def headline_markdown(csv: Path) -> str:
    """One row per paper: how many published claims came out each way, and a few key
    claims as published -> reproduced (status)."""
    df = pd.read_csv(csv)
    statuses = ["reproduced", "fragile", "differs", "not run"]
    lines = [
        "| paper | claims | " + " | ".join(statuses) + " | key claims: published -> reproduced |",
        "|---|---|" + "---|" * (len(statuses) + 1),
    ]
    for paper, g in df.groupby("paper", sort=False):
        if paper not in PAPERS:  # the ground truth's "new" findings are not a paper's claims
            continue
        protocols = [("", "")]
        if "authors_status" in g.columns and (g["authors_status"].fillna("not run") != "not run").any():
            m = g["authors_note"].dropna().astype(str).str.extract(r"(\d+) seeds")[0].dropna()
            seeds = f", {m.iloc[0]} seeds" if len(m) else ""
            protocols = [(" (the paper's text, v3)", ""), (f" (the authors' code{seeds})", "authors_")]
        for label_suffix, prefix in protocols:
            lines.append(_headline_row(paper, g, statuses, label_suffix, prefix))
    return "\n".join(lines)


def _headline_row(paper: str, g: pd.DataFrame, statuses: list[str], suffix: str = "", prefix: str = "") -> str:
    """One paper's headline row; ``prefix`` 'authors_' reads the authors'-code columns."""
    status = g[f"{prefix}status"].fillna("not run")
    counts = [str(int((status == s).sum())) for s in statuses]
    keys = []
    for cid, label in HEADLINE.get(paper, {}).items():
        r = g[g["id"] == cid]
        if r.empty:
            continue
        r = r.iloc[0]
        pub, rep = _short(r["published"]), _short(r[f"{prefix}reproduced"])
        st = r[f"{prefix}status"] if isinstance(r[f"{prefix}status"], str) else "not run"
        if not isinstance(_num(r["published"]), float):
            keys.append(f"{label} ({rep + ', ' if rep else ''}{st})")
        else:
            keys.append(f"{label} {pub}{' -> ' + rep if rep else ''} ({st})")
    absent = list(absent_models(g["note"]))
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        keys.append("weights absent: " + ", ".join(absent[:3]) + more)
    return f"| {PAPERS.get(paper, paper)}{suffix} | {len(g)} | " + " | ".join(counts) + " | " + "; ".join(keys) + " |"


def _short(v) -> str:
    """A value for the headline: whole numbers in full (32491), others to 3 digits."""
    v = _num(v)
    if isinstance(v, float) and v == v and v == int(v):
        return str(int(v))
    return _fmt(v)


def _num(v):
    """A number as a float (so that _fmt rounds it), anything else as it is."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


# blocks that are a reference file rendered as a plain table
PLAIN = (
    *("heroes_rho", "heroes_run", "benchmark_heroes", "benchmark_heroes_n1000"),
    "heroes_grid_rho",
    "heroes_grid_noise",
    "coax_ioi_summary",
    "gim_localization",
    "gim_localization_summary",
    "benchmark_gim_lm_curves",
    "benchmark_lm_pruning",
    "benchmark_lm_floor",
)


def groundtruth_findings_markdown(summary: pd.DataFrame) -> str:
    """The ground truth's findings (the published summary's ``new`` rows): claim, value,
    95% interval and how it was measured."""
    g = summary[summary["paper"] == "groundtruth"]
    lines = ["| finding | measured | 95% CI | note |", "|---|---|---|---|"]
    for r in g.itertuples():
        ci = "" if pd.isna(r.ci_low) else f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"
        lines.append(f"| {r.claim} | {_short(r.reproduced) or r.status} | {ci} | {r.note} |")
    return "\n".join(lines)


def groundtruth_agreement_markdown(df: pd.DataFrame, metric: str = "spearman") -> str:
    """Method x (group, game): mean ``metric`` over models [bootstrap interval]."""
    df = df.assign(column=df["group"] + " (" + df["game"] + ", " + df["n_models"].astype(str) + ")")
    cols = list(dict.fromkeys(df["column"]))
    methods = list(dict.fromkeys(df["method"]))
    lines = ["| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for m in methods:
        cells = []
        for c in cols:
            r = df[(df["method"] == m) & (df["column"] == c)]
            if r.empty or pd.isna(r[metric].iloc[0]):
                cells.append("")
                continue
            r = r.iloc[0]
            lo, hi = r[f"{metric}_lo"], r[f"{metric}_hi"]
            cells.append(f"{r[metric]:.2f}" + ("" if pd.isna(lo) else f" [{lo:.2f}, {hi:.2f}]"))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# benchmarks/bench_groundtruth.py's ratios (threads, n, the plain forward's seconds and the
# matmul throughput are one value per run: the prose gives them)
GROUNDTRUTH_BENCH_COLUMNS = [
    "part",
    "path",
    "coalitions",
    "seconds_per_coalition",
    "over_bridge",
    "over_floor",
    "executed_fraction",
    "over_executed",
    "max_abs_diff",
    "note",
]
NUMERICS_COLUMNS = [
    "setup",
    "aten",
    "threads",
    "steps_per_s",
    "train_speed_vs_fast",
    "coax_train_speed_vs_fast",
    "gim_train_speed_vs_fast",
    "scoring_seconds",
    "scoring_speed_vs_fast",
]


def _where(column: str, values, columns=None):
    """A renderer of the rows whose ``column`` is in ``values`` (and only ``columns``)."""

    def render(df: pd.DataFrame) -> str:
        rows = df[df[column].isin(values)]
        return _plain(rows if columns is None else rows[columns])

    return render


def _groundtruth_findings(summary: pd.DataFrame) -> str | None:
    return groundtruth_findings_markdown(summary) if (summary["paper"] == "groundtruth").any() else None


def portability_markdown(df: pd.DataFrame) -> str:
    """benchmarks/portability.py's comparison: a count, then what differs, by file name
    and column (files of one name in several seed folders are one row)."""
    files = df.drop_duplicates("file")
    first = df.iloc[0]
    head = (
        f"{first['here']} vs {first['other']}{' on fixed weights' if first['fixed_weights'] else ''}: "
        f"{len(files)} files, {int(files['identical'].sum())} identical byte for byte."
    )
    diff = df[~df["identical"]].copy()
    if diff.empty:
        return head
    diff["name"] = diff["file"].map(lambda f: Path(f).name)
    diff["column"] = diff["column"].fillna("")
    g = diff.groupby(["name", "column", "what"], sort=True, dropna=False).agg(
        files=("file", "nunique"), values=("n_values", "sum"), max_abs=("max_abs", "max"), max_rel=("max_rel", "max")
    )
    return head + "\n\n" + _plain(g.reset_index())


def grid_claims_markdown(df: pd.DataFrame) -> str:
    """One row per published claim, one column per protocol cell: the measured value,
    bold where it is within the claim's tolerance of the published one."""
    cells = list(dict.fromkeys(df["cell"]))
    lines = ["| claim | published | " + " | ".join(cells) + " |", "|---|---|" + "---|" * len(cells)]
    for cid, s in df.groupby("id", sort=False):
        s = s.set_index("cell")
        vals = []
        for c in cells:
            if c not in s.index or s.loc[c, "status"] == "not run":
                vals.append("")
                continue
            v = _fmt(float(s.loc[c, "value"]))
            vals.append(f"**{v}**" if s.loc[c, "status"] == "reproduced" else v)
        first = s.iloc[0]
        lines.append(f"| {cid} | {_fmt(first['published'])} +- {_fmt(first['tolerance'])} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def _plain(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(x) for x in row) + " |")
    return "\n".join(lines)


# block name -> (the reference file it comes from, without .csv; its renderer, table ->
# markdown, or None for no block); besides these, every name of PLAIN renders as it is.
RENDERERS = {
    "published": ("published_summary", None),  # these two read the file themselves
    "headline": ("published_summary", None),
    "portability": ("portability", portability_markdown),
    "portability_native_scoring": ("portability_native_scoring", portability_markdown),
    "benchmark_numerics": ("benchmark_numerics", lambda df: _plain(df[NUMERICS_COLUMNS])),
    "benchmark_groundtruth": ("benchmark_groundtruth", lambda df: _plain(df[GROUNDTRUTH_BENCH_COLUMNS])),
    "benchmark_numerics_projection": (
        "benchmark_numerics_projection",
        _where("part", ["all"], ["setup", "cpu_s_fast", "cpu_s", "cost_vs_fast"]),
    ),
    "heroes_grid_claims": ("heroes_grid_claims", grid_claims_markdown),
    "heroes_grid_superadditivity": ("heroes_grid_superadditivity", _where("group", ["bloat"])),
    "groundtruth_findings": ("published_summary", _groundtruth_findings),
    "groundtruth_agreement": ("groundtruth_agreement", groundtruth_agreement_markdown),
    "real_lms": ("real_lms_claims", real_lms_table.full_markdown),
    "real_lms_cpr_cmd": ("real_lms_claims", real_lms_table.metrics_markdown),
    "real_lms_quantization": ("real_lms_quantization", lm_quantization.summary_markdown),
    "real_lms_cost": ("real_lms_cost", real_lms_table.cost_markdown),
    "real_lms_power": ("real_lms_power", real_lms_table.power_markdown),
    "benchmark_peers_coax_lm": ("benchmark_peers_coax_lm", peers_table.coax_markdown),
    "runtime": ("runtime", _where("step", ["all", "train", "measure", "probe", "scores"])),
    **{
        name.replace(peers_table.PEERS_MIB, table): (table, render)
        for table in peers_table.PEERS_MIB_TABLES
        for name, render in peers_table.renderers(_plain).items()
    },
}

# every block this module renders (one whose reference file is absent keeps its text)
REAL_LMS = {"real_lms_conventions": real_lms_table.conventions_block, "real_lms_fa": real_lms_table.fa_block,
            "real_lms_seeds": coax_lm_tables.seeds_block, "real_lms_pruning": coax_lm_tables.pruning_block}  # fmt: skip
NAMES = ("headline", "published", *REAL_LMS, *PLAIN, *RENDERERS)


def blocks() -> dict[str, str]:
    """{block name: markdown} for every reference file present."""
    out = {}
    f = REFERENCE / "published_summary.csv"
    if f.exists():
        out["published"] = published_markdown(f)
        out["headline"] = headline_markdown(f)
        lms = REFERENCE / "real_lms_claims.csv"  # claims tested on the packaged real LMs: a row per model
        if lms.exists():
            out["headline"] += "\n" + "\n".join(real_lms_table.headline_rows(pd.read_csv(lms)))
        real = REFERENCE / "real_size.csv"
        out.update(doc_blocks.blocks(pd.read_csv(f), pd.read_csv(real) if real.exists() else None))
    for block in REAL_LMS.values():  # the real-LM blocks of real-lms.md, each from its reference copies
        out.update(block(REFERENCE))
    for name in PLAIN:
        f = REFERENCE / f"{name}.csv"
        if f.exists():
            out[name] = _plain(pd.read_csv(f))
    for name, (table, render) in RENDERERS.items():
        f = REFERENCE / f"{table}.csv"
        if render is not None and f.exists():
            text = render(pd.read_csv(f))
            if text is not None:
                out[name] = text
    return out


def render(readme: str, parts: dict[str, str]) -> str:
    for name, md in parts.items():
        pat = re.compile(rf"(^<!-- {name}:start -->\n)(?:.*?\n)?(^<!-- {name}:end -->$)", re.S | re.M)
        readme = pat.sub(lambda m: m.group(1) + md + "\n" + m.group(2), readme)
    return readme


# a marker is a line of its own (a marker quoted inside a sentence is not one)
_MARKER = re.compile(r"^<!-- ([\w-]+):(start|end) -->$", re.M)


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every markdown file under docs/, its subfolders included."""
    docs = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [d for d in docs if d.exists()]


def block_names(text: str) -> list[str]:
    """Names of the blocks a document has (start markers), in order."""
    return [m[1] for m in _MARKER.finditer(text) if m[2] == "start"]


def problems(text: str, known: set[str]) -> list[str]:
    """Markers that no rendering would fill: an unknown name, a start without its end."""
    out = []
    starts = block_names(text)
    ends = [m[1] for m in _MARKER.finditer(text) if m[2] == "end"]
    for n in sorted(set(starts) | set(ends)):
        if n not in known:
            out.append(f"unknown block {n!r}")
        if starts.count(n) != 1 or ends.count(n) != 1:
            out.append(f"block {n!r} needs exactly one start and one end marker")
    return out


def main(argv=None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    parts = blocks()
    known = set(NAMES) | set(parts)
    bad = 0
    for path in documents(root):
        old = path.read_text()
        rel = path.relative_to(root)
        for p in problems(old, known):
            print(f"{rel}: {p}")
            bad = 1
        new = render(old, parts)
        if a.check:
            if new != old:
                print(f"{rel} is out of date with results/reference/: run python -m selfrepair.tooling.readme_table")
                bad = 1
        elif new != old:
            path.write_text(new)
    return bad


if __name__ == "__main__":
    sys.exit(main())
