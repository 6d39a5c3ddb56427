"""Tables of paper A's protocol grid, from the per-model measurements.

Inputs are the concatenated outputs of rule heroes_grid_measure: ``components`` (one row
per cell, task, seed, component), ``joint`` (joint vs individual ablation of each seed's
bloats and heroes per cell) and ``sweep`` (rho on disjoint chunks of n evaluation
sequences, default models).

A cell is compared with the default cell per seed: ``paired_table`` gives, per
(cell, task, quantity), the per-seed differences cell - default over the seeds both kept
(same seed; the same model and sequences where the cell does not retrain), their mean
and a percentile bootstrap CI over seeds; ``decided`` when the CI excludes 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from selfrepair.core import analysis
from selfrepair.heroes import spread
from selfrepair.heroes.grid import CELLS


def _order(df: pd.DataFrame) -> pd.DataFrame:
    cat = pd.Categorical(df["cell"], categories=[c for c in CELLS if c in set(df["cell"])], ordered=True)
    return (
        df.assign(cell=cat)
        .sort_values(["cell", "task"] + (["seed"] if "seed" in df else []), kind="stable")
        .assign(cell=lambda d: d["cell"].astype(str))
    )


def superadditivity(individual: Sequence[float], joint: Sequence[float], n_boot: int = 10000, seed: int = 0) -> dict:
    """Over seeds: joint drop / mean individual drop per component, as a ratio of means,
    with a percentile bootstrap CI over seeds. ``individual`` holds each seed's mean
    individual drop, ``joint`` its joint drop."""
    ind = np.asarray(individual, float)
    jnt = np.asarray(joint, float)
    ok = ~(np.isnan(ind) | np.isnan(jnt))
    ind, jnt = ind[ok], jnt[ok]
    out = {
        "n_seeds": int(len(ind)),
        "mean_individual": float("nan"),
        "mean_joint": float("nan"),
        "ratio": float("nan"),
        "ci_lo": float("nan"),
        "ci_hi": float("nan"),
    }
    if len(ind) == 0:
        return out
    out["mean_individual"] = float(ind.mean())
    out["mean_joint"] = float(jnt.mean())
    out["ratio"] = float(jnt.mean() / ind.mean()) if ind.mean() != 0 else float("nan")
    if len(ind) > 1:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(ind), (n_boot, len(ind)))
        den = ind[idx].mean(1)
        num = jnt[idx].mean(1)
        ratios = np.where(den != 0, num / np.where(den != 0, den, 1), np.nan)
        ratios = ratios[~np.isnan(ratios)]
        if len(ratios):
            out["ci_lo"], out["ci_hi"] = (float(x) for x in np.quantile(ratios, [0.025, 0.975]))
    return out


def kept(components: pd.DataFrame) -> pd.DataFrame:
    return components[components["status"] == "kept"]


def seeds_table(components: pd.DataFrame, joint: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per (cell, task, seed): status, N, n_eval, baseline accuracy, rho, role
    counts at ``threshold``, joint and mean individual drops of bloats and heroes."""
    col = f"role_t{threshold:g}"
    rows = []
    for (cell, task, seed), s in components.groupby(["cell", "task", "seed"], sort=False):
        first = s.iloc[0]
        row = {"cell": cell, "task": task, "seed": int(seed), "status": first["status"]}
        if first["status"] == "kept":
            row.update(
                N=int(first["N"]),
                n_eval=int(first["n_eval"]),
                baseline_acc=float(first["baseline_acc"]),
                rho=float(first["rho"]),
            )
            row["heroes"] = int((s[col] == "hero").sum())
            row["bloats"] = int((s[col] == "bloat").sum())
            j = joint[(joint["cell"] == cell) & (joint["task"] == task) & (joint["seed"] == seed)].set_index("group")
            for g in ("bloat", "hero"):
                if g in j.index:
                    row[f"{g}_mean_individual"] = float(j.loc[g, "mean_individual"])
                    row[f"{g}_joint"] = float(j.loc[g, "joint"])
        else:
            row["reason"] = first.get("reason", "")
        rows.append(row)
    return _order(pd.DataFrame(rows))


def rho_table(seeds: pd.DataFrame, protocols: dict, n_boot: int = 10000) -> pd.DataFrame:
    """Per (cell, task): kept seeds, rho mean, sd and a percentile bootstrap CI over seeds."""
    rows = []
    for (cell, task), s in seeds.groupby(["cell", "task"], sort=False):
        k = s[s["status"] == "kept"]
        mean, sd, n = analysis.mean_sd(k["rho"].astype(float).tolist())
        lo, hi = analysis.bootstrap_ci(k["rho"].astype(float).tolist(), n_boot=n_boot)
        rows.append(
            {
                "cell": cell,
                "task": task,
                "seeds": len(s),
                "kept": n,
                "rho_mean": mean,
                "rho_sd": sd,
                "ci_lo": lo,
                "ci_hi": hi,
                "protocol": protocols.get(cell, ""),
            }
        )
    return _order(pd.DataFrame(rows))


def roles_by_layer(components: pd.DataFrame, thresholds) -> pd.DataFrame:
    """Per (cell, task, threshold, layer): heroes and bloats summed over kept seeds, and
    the same per 10 seeds (cells differ in their number of seeds)."""
    k = kept(components)
    rows = []
    for t in thresholds:
        col = f"role_t{t:g}"
        for (cell, task, layer), s in k.groupby(["cell", "task", "layer"], sort=False):
            n_seeds = s["seed"].nunique()
            h, b = int((s[col] == "hero").sum()), int((s[col] == "bloat").sum())
            rows.append(
                {
                    "cell": cell,
                    "task": task,
                    "threshold": t,
                    "layer": int(layer),
                    "kept": n_seeds,
                    "hero": h,
                    "bloat": b,
                    "hero_per10": 10 * h / n_seeds,
                    "bloat_per10": 10 * b / n_seeds,
                }
            )
    return _order(pd.DataFrame(rows))


def superadditivity_table(joint: pd.DataFrame, n_boot: int = 10000) -> pd.DataFrame:
    """Per (cell, task, group): over seeds with at least one member, mean individual and
    joint drops, their ratio (joint / mean individual; the paper's 14x) with a bootstrap
    CI over seeds, and how many seeds are superadditive (joint > sum of individual)."""
    rows = []
    j = joint[joint["n"] > 0]
    for (cell, task, group), s in j.groupby(["cell", "task", "group"], sort=False):
        out = superadditivity(s["mean_individual"].astype(float), s["joint"].astype(float), n_boot=n_boot)
        out.update(
            cell=cell,
            task=task,
            group=group,
            members_mean=float(s["n"].mean()),
            superadditive_seeds=int((s["joint"] > s["sum_individual"]).sum()),
        )
        rows.append(out)
    cols = [
        "cell",
        "task",
        "group",
        "n_seeds",
        "members_mean",
        "mean_individual",
        "mean_joint",
        "ratio",
        "ci_lo",
        "ci_hi",
        "superadditive_seeds",
    ]
    return _order(pd.DataFrame(rows, columns=cols))


def noise_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """rho vs evaluation-sample count. Per (task, n): the mean over seeds of each seed's
    mean rho over its disjoint chunks, the mean over seeds of the sd of rho across chunks
    (the measurement noise of rho at that n), the fraction of component pairs whose C
    difference is within noise, and the components whose C is within noise of zero."""
    per_seed = sweep.groupby(["task", "seed", "n"], sort=False).agg(
        chunks=("rho", "size"),
        rho=("rho", "mean"),
        rho_sd_chunks=("rho", "std"),
        pairs_within_noise=("pairs_within_noise", "mean"),
        C_within_noise_of_zero=("C_within_noise_of_zero", "mean"),
    )
    per_seed = per_seed.reset_index()
    out = per_seed.groupby(["task", "n"], sort=False).agg(
        seeds=("seed", "nunique"),
        chunks_per_seed=("chunks", "mean"),
        rho_mean=("rho", "mean"),
        rho_sd_seeds=("rho", "std"),
        rho_sd_chunks=("rho_sd_chunks", "mean"),
        pairs_within_noise=("pairs_within_noise", "mean"),
        C_within_noise_of_zero=("C_within_noise_of_zero", "mean"),
    )
    return out.reset_index().sort_values(["task", "n"], kind="stable")


def gradient_by_layer(components: pd.DataFrame) -> pd.DataFrame:
    k = kept(components)
    return _order(
        k.groupby(["cell", "task", "layer"], sort=False).agg(G_mean=("G", "mean"), C_mean=("C", "mean")).reset_index()
    )


SEED_QUANTITIES = (
    "rho",
    "heroes",
    "bloats",
    "baseline_acc",
    "bloat_mean_individual",
    "bloat_joint",
    "hero_mean_individual",
    "hero_joint",
)


def seed_values(seeds: pd.DataFrame, components: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per kept (cell, task, seed): the per-seed quantities of ``seeds_table``
    and, per layer L, the seed's heroes and bloats in L (``heroes_layer{L}``,
    ``bloats_layer{L}``, at ``threshold``) and its mean G over L's components (``G_layer{L}``)."""
    col = f"role_t{threshold:g}"
    k = seeds[seeds["status"] == "kept"]
    out = k[["cell", "task", "seed"] + [q for q in SEED_QUANTITIES if q in k]].copy()
    out["seed"] = out["seed"].astype(int)
    comps = kept(components)
    if comps.empty:
        return out.reset_index(drop=True)
    rows = []
    for (cell, task, seed), s in comps.groupby(["cell", "task", "seed"], sort=False):
        row = {"cell": cell, "task": task, "seed": int(seed)}
        for layer, sl in s.groupby("layer"):
            row[f"heroes_layer{int(layer)}"] = int((sl[col] == "hero").sum())
            row[f"bloats_layer{int(layer)}"] = int((sl[col] == "bloat").sum())
            row[f"G_layer{int(layer)}"] = float(sl["G"].mean())
        rows.append(row)
    return out.merge(pd.DataFrame(rows), on=["cell", "task", "seed"], how="left").reset_index(drop=True)


PAIRED_COLUMNS = [
    "cell",
    "task",
    "quantity",
    "n_paired",
    "seeds",
    "default_mean",
    "cell_mean",
    "mean_diff",
    "sd_diff",
    "ci_lo",
    "ci_hi",
    "decided",
    "change",
]


def paired_table(values: pd.DataFrame, n_boot: int = 10000, seed: int = 0) -> pd.DataFrame:
    """Per (cell other than default, task, quantity of ``seed_values``): the per-seed
    differences cell - default over the seeds both have a value for, their mean, sd and
    percentile bootstrap CI over seeds, ``decided`` (the CI excludes 0) and the change in
    words (raises / lowers / no clear change)."""
    rows = []
    quantities = [c for c in values.columns if c not in ("cell", "task", "seed")]
    default = values[values["cell"] == "default"]
    for (cell, task), s in values[values["cell"] != "default"].groupby(["cell", "task"], sort=False):
        d = default[default["task"] == task].set_index("seed")
        c = s.set_index("seed")
        for q in quantities:
            cv = c[q].dropna().astype(float).to_dict()
            dv = d[q].dropna().astype(float).to_dict()
            r = spread.paired_difference(cv, dv, n_boot=n_boot, seed=seed)
            both = [int(x) for x in r["seeds"].split()]
            r.update(
                cell=cell,
                task=task,
                quantity=q,
                default_mean=float(np.mean([dv[x] for x in both])) if both else float("nan"),
                cell_mean=float(np.mean([cv[x] for x in both])) if both else float("nan"),
                change=spread.change_word(r["n_paired"], r["ci_lo"], r["ci_hi"]),
            )
            rows.append(r)
    return _order(pd.DataFrame(rows, columns=PAIRED_COLUMNS)) if rows else pd.DataFrame(columns=PAIRED_COLUMNS)
