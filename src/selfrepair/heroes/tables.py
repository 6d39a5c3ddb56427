"""Paper A's aggregate tables, each a pure function of the per-seed tables.

Role counts come twice: all roles, and stable roles only (``*_stable``: the
component keeps its role in at least ``stable_share`` of the resamples of the evaluation
sequences; roles.csv's ``stable_t{t}`` columns, see scripts/heroes_roles.py).
The published claims read them in :mod:`selfrepair.heroes.claims`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core import analysis


def _stable_col(df: pd.DataFrame, t=None) -> pd.Series | None:
    """roles.csv's bool 'stable' column at threshold t (the main one when None), or None
    when the table predates role stability."""
    col = "stable" if t is None else f"stable_t{t:g}"
    if col not in df:
        return None
    return df[col].astype(str) == "True"  # bool, or "True"/"False" read back from a CSV


def seeds_table(roles: pd.DataFrame, ood: list[dict], train: list[dict], redundancy: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, seed): status, N, training, rho, role counts, joint drops."""
    rows = []
    for info, tr in zip(ood, train):
        task, seed = info["task"], info["seed"]
        r = roles[(roles["task"] == task) & (roles["seed"] == seed)]
        row = {
            "task": task,
            "seed": seed,
            "status": info["status"],
            "reason": info.get("reason", ""),
            "N": info["N"],
            "ood_accuracy": info["accuracy_by_length"].get(str(info["N"])) if info["N"] else np.nan,
            "train_steps": tr["steps"],
            "reached_target": tr["reached_target"],
            "id_accuracy": tr["id_accuracy"],
            "padding": tr["protocol"]["padding"],
            "init": tr["protocol"]["init"],
            # how the model's floats came about (src/selfrepair/core/numerics.py); absent in
            # models trained before the numerics mode existed
            "numerics": tr.get("numerics", {}).get("mode", "unrecorded"),
            "cpu_vendor": tr.get("numerics", {}).get("cpu_vendor", "unrecorded"),
        }
        if info["status"] == "kept":
            row.update(
                rho=analysis.spearman(r["G"], r["C"]),
                rho_mean=analysis.spearman(r["G"], r["C_mean"]),
                rho_zero=analysis.spearman(r["G"], r["C_zero"]),
                n_heroes=int((r["role"] == "hero").sum()),
                n_bloats=int((r["role"] == "bloat").sum()),
                baseline_acc=float(r["baseline_acc"].iloc[0]),
            )
            stable = _stable_col(r)
            if stable is not None:
                row.update(
                    n_heroes_stable=int(((r["role"] == "hero") & stable).sum()),
                    n_bloats_stable=int(((r["role"] == "bloat") & stable).sum()),
                    n_components=len(r),
                    n_C_within_2se_of_other=int((r["C_within_2se_of_other"].astype(str) == "True").sum()),
                    n_C_within_2se_of_zero=int((r["C_within_2se_of_zero"].astype(str) == "True").sum()),
                    rho_boot_lo=float(r["rho_boot_lo"].iloc[0]),
                    rho_boot_hi=float(r["rho_boot_hi"].iloc[0]),
                )
            red = redundancy[(redundancy["task"] == task) & (redundancy["seed"] == seed)].set_index("group")
            for g in ("hero", "bloat"):
                if g in red.index and red.loc[g, "n"] > 0:
                    row[f"{g}_joint_drop"] = float(red.loc[g, "joint"])
                    row[f"{g}_mean_individual_drop"] = float(red.loc[g, "mean_individual"])
        rows.append(row)
    return pd.DataFrame(rows)


def rho_summary(seeds: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for task, s in seeds.groupby("task", sort=False):
        kept = s[s["status"] == "kept"]
        for col in ("rho", "rho_mean", "rho_zero"):
            vals = kept[col].dropna().tolist() if col in kept else []
            mean, sd, n = analysis.mean_sd(vals)
            lo, hi = analysis.bootstrap_ci(vals)
            rows.append(
                {
                    "task": task,
                    "measure": col,
                    "mean": mean,
                    "sd": sd,
                    "n_kept": n,
                    "n_seeds": len(s),
                    "ci_lo": lo,
                    "ci_hi": hi,
                }
            )
    return pd.DataFrame(rows)


def roles_by_layer(roles: pd.DataFrame, thresholds) -> pd.DataFrame:
    kept = roles[roles["status"] == "kept"]
    rows = []
    for t in thresholds:
        col = f"role_t{t:g}"
        for (task, layer), s in kept.groupby(["task", "layer"], sort=False):
            row = {
                "task": task,
                "threshold": t,
                "layer": int(layer),
                "hero": int((s[col] == "hero").sum()),
                "bloat": int((s[col] == "bloat").sum()),
                "aligned": int((s[col] == "aligned").sum()),
            }
            stable = _stable_col(s, t)
            if stable is not None:
                for role in ("hero", "bloat", "aligned"):
                    row[f"{role}_stable"] = int(((s[col] == role) & stable).sum())
            rows.append(row)
    return pd.DataFrame(rows)


def role_stability(roles: pd.DataFrame) -> pd.DataFrame:
    kept = roles[roles["status"] == "kept"]
    rows = []
    for (task, comp), s in kept.groupby(["task", "component"], sort=False):
        row = {
            "task": task,
            "component": comp,
            "layer": int(s["layer"].iloc[0]),
            "hero": int((s["role"] == "hero").sum()),
            "bloat": int((s["role"] == "bloat").sum()),
            "aligned": int((s["role"] == "aligned").sum()),
            "n_seeds": len(s),
        }
        stable = _stable_col(s)
        if stable is not None:
            for role in ("hero", "bloat", "aligned"):
                row[f"{role}_stable"] = int(((s["role"] == role) & stable).sum())
            row["mean_stability"] = float(s["stability"].astype(float).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def gradient_by_layer(roles: pd.DataFrame) -> pd.DataFrame:
    kept = roles[roles["status"] == "kept"]
    return (
        kept.groupby(["task", "layer"], sort=False)
        .agg(G_mean=("G", "mean"), C_mean=("C", "mean"), n=("G", "size"))
        .reset_index()
    )


def redundancy_summary(redundancy: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, group), s in redundancy[redundancy["n"] > 0].groupby(["task", "group"], sort=False):
        joint = s["joint"].astype(float)
        mi = s["mean_individual"].astype(float)
        si = s["sum_individual"].astype(float)
        rows.append(
            {
                "task": task,
                "group": group,
                "n_seeds": len(s),
                "members_mean": float(s["n"].mean()),
                "mean_individual_drop": float(mi.mean()),
                "sum_individual_drop": float(si.mean()),
                "joint_drop": float(joint.mean()),
                "joint_drop_sd": float(joint.std(ddof=1)) if len(s) > 1 else np.nan,
                "joint_over_sum": float(joint.sum() / si.sum()) if si.sum() > 0 else np.nan,
                "joint_over_mean_individual": float(joint.mean() / mi.mean()) if mi.mean() > 0 else np.nan,
                "superadditive_seeds": int((joint > si).sum()),
                **_redundancy_cis(joint.to_numpy(), mi.to_numpy()),
            }
        )
    return pd.DataFrame(rows)


def ratio_of_means(r: np.ndarray) -> np.ndarray:
    """Per resample [n_boot, n, 2]: mean of column 0 over mean of column 1; NaN where the
    denominator's mean is <= 0 (no ratio)."""
    num, den = r[..., 0].mean(1), r[..., 1].mean(1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _redundancy_cis(joint: np.ndarray, mi: np.ndarray) -> dict:
    """95% percentile bootstrap CIs over seeds of redundancy_summary's means and of the
    superadditivity (joint drop mean / mean individual drop mean, seeds resampled and the
    ratio recomputed; resamples whose denominator is <= 0 counted as undefined)."""
    out = {}
    for name, v in (("mean_individual_drop", mi), ("joint_drop", joint)):
        out[f"{name}_ci_lo"], out[f"{name}_ci_hi"] = analysis.bootstrap_ci(v)
    pairs = np.column_stack([joint, mi])
    pairs = pairs[~np.isnan(pairs).any(1)]
    lo, hi, undefined = analysis.bootstrap_stat(pairs, ratio_of_means)
    out.update(
        joint_over_mean_individual_ci_lo=lo,
        joint_over_mean_individual_ci_hi=hi,
        joint_over_mean_individual_undefined=undefined,
    )
    return out


def run_summary(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per task: seeds run, kept and skipped, training steps, OOD length and rho."""
    rows = []
    for task, s in seeds.groupby("task", sort=False):
        kept = s[s["status"] == "kept"]
        rows.append(
            {
                "task": task,
                "seeds": len(s),
                "kept": len(kept),
                "skipped": int((s["status"] != "kept").sum()),
                "reached_90pct": int(s["reached_target"].sum()),
                "train_steps_mean": float(s["train_steps"].mean()),
                "train_steps_max": int(s["train_steps"].max()),
                "N_values": " ".join(str(int(n)) for n in kept["N"]),
                "rho_mean": float(kept["rho"].mean()) if len(kept) else np.nan,
                "rho_sd": float(kept["rho"].std(ddof=1)) if len(kept) > 1 else np.nan,
                "rho_zero_mean": float(kept["rho_zero"].mean()) if len(kept) else np.nan,
                "heroes_per_seed": float(kept["n_heroes"].mean()) if len(kept) else np.nan,
                "bloats_per_seed": float(kept["n_bloats"].mean()) if len(kept) else np.nan,
            }
        )
        for col, name in (
            ("n_heroes_stable", "stable_heroes_per_seed"),
            ("n_bloats_stable", "stable_bloats_per_seed"),
            ("n_C_within_2se_of_other", "C_within_2se_of_other_per_seed"),
        ):
            if col in kept and len(kept):
                rows[-1][name] = float(kept[col].mean())
    return pd.DataFrame(rows)
