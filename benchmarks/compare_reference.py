"""What another CPU's reference run changes: two results/reference/ folders compared claim
by claim (and model by model for paper C's localization and paper B's toy IOI AUCs).

Under the fast numerics mode two CPUs of different vendors train other weights, so every
number downstream may move; this says how far, in the terms a reader checks: which
published claims change status, by how much each value moves, whether a claim's CI on one
run contains the other run's value.

    .venv/bin/python benchmarks/compare_reference.py OLD_DIR NEW_DIR [--out results/benchmarks/vendor_comparison.csv] [--write]
    git show REV:results/reference/published_summary.csv > old/published_summary.csv   # an old copy

OLD_DIR and NEW_DIR each hold published_summary.csv, numerics.csv (or say their CPU with
--old-label / --new-label), and optionally gim_localization.csv and coax_ioi_summary.csv.
Writes --out and beside it <name>_summary.csv; --write: also both into results/reference/.
"""

from __future__ import annotations

from pathlib import Path

import harness
import pandas as pd

TOL_CPR = 0.01  # a per-model CPR "moves" when it changes by more than this


def _label(d: Path, given: str | None) -> str:
    if given:
        return given
    f = d / "numerics.csv"
    if f.exists():
        p = pd.read_csv(f).set_index("table")
        if "published_summary.csv" in p.index:
            r = p.loc["published_summary.csv"]
            return f"{r['cpu_vendor']} ({r['numerics']})"
    return d.name


def claims(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Per claim of both summaries: both values, CIs and statuses, the change, and whether
    each run's CI holds the other's value."""
    key = ["paper", "id"]
    cols = ["reproduced", "ci_low", "ci_high", "status"]
    m = old[key + ["claim", "published"] + cols].merge(new[key + cols], on=key, suffixes=("_old", "_new"))
    for side in ("old", "new"):
        m[f"reproduced_{side}"] = pd.to_numeric(m[f"reproduced_{side}"], errors="coerce")
    m["change"] = m["reproduced_new"] - m["reproduced_old"]
    m["status_changed"] = m["status_old"] != m["status_new"]
    for a, b in (("old", "new"), ("new", "old")):
        lo, hi, v = m[f"ci_low_{a}"], m[f"ci_high_{a}"], m[f"reproduced_{b}"]
        m[f"ci_{a}_holds_{b}"] = ((lo <= v) & (v <= hi)).where(lo.notna() & hi.notna() & v.notna())
    return m


def localization(old: pd.DataFrame, new: pd.DataFrame) -> dict:
    key = ["task", "model", "seed", "method"]
    m = old[key + ["cpr"]].merge(new[key + ["cpr"]], on=key, suffixes=("_old", "_new"))
    d = (m["cpr_new"] - m["cpr_old"]).abs()
    means = m.groupby("method")[["cpr_old", "cpr_new"]].mean()
    return {"gim_cpr_values": len(m), f"gim_cpr_moved_gt_{TOL_CPR}": int((d > TOL_CPR).sum()),
            "gim_cpr_max_abs_change": float(d.max()),
            "gim_cpr_method_mean_max_abs_change": float((means["cpr_new"] - means["cpr_old"]).abs().max())}  # fmt: skip


def coax_auc(old: pd.DataFrame, new: pd.DataFrame) -> dict:
    m = old[["method", "roc_auc"]].merge(new[["method", "roc_auc"]], on="method", suffixes=("_old", "_new"))
    d = (m["roc_auc_new"] - m["roc_auc_old"]).abs()
    return {"coax_auc_methods": len(m), "coax_auc_max_abs_change": float(d.max())}


def compare(old_dir: Path, new_dir: Path, old_label: str | None = None, new_label: str | None = None):
    """(per-claim table, summary dict)."""
    c = claims(pd.read_csv(old_dir / "published_summary.csv"), pd.read_csv(new_dir / "published_summary.csv"))
    run = c[~c["status_old"].isin(["not run"]) | ~c["status_new"].isin(["not run"])]
    summary = {"old": _label(old_dir, old_label), "new": _label(new_dir, new_label), "claims_compared": len(run),
               "status_changed": int(run["status_changed"].sum())}  # fmt: skip
    for paper, g in run.groupby("paper"):
        summary[f"{paper}_claims"] = len(g)
        summary[f"{paper}_status_changed"] = int(g["status_changed"].sum())
    for name, fn in (("gim_localization.csv", localization), ("coax_ioi_summary.csv", coax_auc)):
        if (old_dir / name).exists() and (new_dir / name).exists():
            summary.update(fn(pd.read_csv(old_dir / name), pd.read_csv(new_dir / name)))
    return c.assign(old=summary["old"], new=summary["new"]), summary


def main() -> None:
    ap = harness.arguments(__doc__, "vendor_comparison.csv", threads=None, modes=False)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--old-label")
    ap.add_argument("--new-label")
    a = ap.parse_args()
    table, summary = compare(a.old, a.new, a.old_label, a.new_label)
    out = harness.write(table, a, reference=Path(a.out).stem)
    summary_csv = out.with_name(out.stem + "_summary.csv")
    harness.write(pd.DataFrame([summary]), a, out=summary_csv, reference=summary_csv.stem)
    for k, v in summary.items():
        print(f"{k}: {v}")
    moved = table[table["status_changed"]]
    if len(moved):
        print(
            moved[["paper", "id", "reproduced_old", "status_old", "reproduced_new", "status_new"]].to_string(
                index=False
            )
        )


if __name__ == "__main__":
    main()
