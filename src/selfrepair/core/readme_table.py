"""Render the committed reference tables as the README's markdown blocks.

    python -m selfrepair.core.readme_table          # rewrite README.md's generated blocks
    python -m selfrepair.core.readme_table --check  # exit 1 if README.md is out of date

Every number in those README blocks comes from files under results/reference/, which
are copies of what a full default run of the workflow wrote.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "results" / "reference"


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    s = str(v)
    return "" if s == "nan" else s.replace("|", "/")


def published_markdown(csv: Path) -> str:
    df = pd.read_csv(csv)
    lines = ["| paper | claim | published | reproduced | tolerance | status | note |", "|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append("| " + " | ".join(_fmt(x) for x in (r.paper, r.claim, r.published, r.reproduced, r.tolerance, r.status, r.note)) + " |")
    return "\n".join(lines)


def blocks() -> dict[str, str]:
    """{block name: markdown} for every reference file present."""
    out = {}
    f = REFERENCE / "published_summary.csv"
    if f.exists():
        out["published"] = published_markdown(f)
    for name in ("heroes_rho", "heroes_run", "benchmark_heroes", "benchmark_heroes_n1000", "heroes_grid_rho", "heroes_grid_noise", "coax_ioi_summary", "gim_localization",
                 "gim_localization_summary"):
        f = REFERENCE / f"{name}.csv"
        if f.exists():
            out[name] = _plain(pd.read_csv(f))
    for name in ("portability", "portability_native_scoring"):
        f = REFERENCE / f"{name}.csv"
        if f.exists():
            out[name] = portability_markdown(pd.read_csv(f))
    f = REFERENCE / "benchmark_numerics.csv"
    if f.exists():
        cols = ["setup", "aten", "threads", "steps_per_s", "train_speed_vs_portable", "scoring_seconds", "scoring_speed_vs_portable"]
        out["benchmark_numerics"] = _plain(pd.read_csv(f)[cols])
    f = REFERENCE / "heroes_grid_claims.csv"
    if f.exists():
        out["heroes_grid_claims"] = grid_claims_markdown(pd.read_csv(f))
    f = REFERENCE / "heroes_grid_superadditivity.csv"
    if f.exists():
        sup = pd.read_csv(f)
        out["heroes_grid_superadditivity"] = _plain(sup[sup["group"] == "bloat"])
    f = REFERENCE / "runtime.csv"
    if f.exists():
        rt = pd.read_csv(f)
        out["runtime"] = _plain(rt[rt["step"].isin(["all", "train", "measure", "probe", "scores"])])
    return out


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


def render(readme: str, parts: dict[str, str]) -> str:
    for name, md in parts.items():
        pat = re.compile(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        readme = pat.sub(lambda m: m.group(1) + md + "\n" + m.group(2), readme)
    return readme


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    path = ROOT / "README.md"
    old = path.read_text()
    new = render(old, blocks())
    if a.check:
        if new != old:
            print("README.md is out of date with results/reference/: run python -m selfrepair.core.readme_table")
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
