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
from selfrepair.core.published import status_of
from selfrepair.heroes import spread
from selfrepair.heroes.grid import CELLS

# Claims of paper A that every cell can test; the layer counts are scaled to 10 seeds.
GRID_CLAIMS = (
    "rho_reverse",
    "rho_sort",
    "sort_layer1_bloats",
    "sort_layer3_heroes",
    "bloat_individual_drop_pct",
    "bloat_joint_drop_pct",
    "bloat_superadditivity",
    "hero_ablation_reverse_pct",
    "sort_grad_layer1",
    "sort_grad_layer3",
    # with the per-component table (claims_table's ``components``)
    "bloat_ablation_pct",
    "rho_sort_seed456",
    "rho_sort_seed2020",
    "sort_L3H3_hero",
    "sort_L1H1_bloat",
    "sort_L1H3_bloat",
)
# per-component role claims: claim id -> (task, component, role)
COMPONENT_ROLE_CLAIMS = {
    "sort_L3H3_hero": ("sort", "L3H3", "hero"),
    "sort_L1H1_bloat": ("sort", "L1H1", "bloat"),
    "sort_L1H3_bloat": ("sort", "L1H3", "bloat"),
}


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


# claim id -> (task, per-seed quantity of seed_values, scale onto the claim's units);
# bloat_superadditivity is a ratio of means over seeds: it has no per-seed value.
CLAIM_PAIRED = {
    "rho_reverse": ("reverse", "rho", 1.0),
    "rho_sort": ("sort", "rho", 1.0),
    "sort_layer1_bloats": ("sort", "bloats_layer1", 10.0),
    "sort_layer3_heroes": ("sort", "heroes_layer3", 10.0),
    "bloat_individual_drop_pct": ("sort", "bloat_mean_individual", 100.0),
    "bloat_joint_drop_pct": ("sort", "bloat_joint", 100.0),
    "hero_ablation_reverse_pct": ("reverse", "hero_joint", -100.0),
    "sort_grad_layer1": ("sort", "G_layer1", 1.0),
    "sort_grad_layer3": ("sort", "G_layer3", 1.0),
}
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


def claims_table(
    rho: pd.DataFrame,
    layers: pd.DataFrame,
    superadd: pd.DataFrame,
    grad: pd.DataFrame,
    claims: list[dict],
    threshold: float,
    paired: pd.DataFrame | None = None,
    components: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (claim, cell): the value measured in that cell next to the published one, and
    reproduced / differs / fragile within the claim's tolerance (config/published.yaml),
    decided by the value's CI over seeds where it has one (rho, superadditivity).

    With ``components`` (one row per cell, task, seed, component: status, rho, role_t*),
    also the per-seed rho claims (``not run`` where the cell has not kept that seed) and
    the per-component role counts, scaled to 10 kept seeds as in the main table. The
    joint bloat ablation's accuracy change is minus the joint bloat drop.

    ``change_vs_default`` is the difference of the cell's and the default's values (each
    over its own kept seeds); with ``paired`` (``paired_table``), the change is also
    stated from the per-seed paired differences: ``paired_seeds``, ``paired_diff`` and
    its CI ``paired_ci_lo``/``paired_ci_hi`` (on the claim's scale), ``decided`` and
    ``change`` (raises / lowers / no clear change)."""
    by_id = {c["id"]: c for c in claims}
    cells = list(dict.fromkeys(rho["cell"]))
    rows = []

    def get(df, cell, col, **where):
        s = df[df["cell"] == cell]
        for k, v in where.items():
            s = s[s[k] == v]
        return float(s[col].iloc[0]) if len(s) and col in s else float("nan")

    for cid in GRID_CLAIMS:
        if cid not in by_id:
            continue
        c = by_id[cid]
        for cell in cells:
            lo = hi = float("nan")
            if cid.startswith("rho_sort_seed") or cid in COMPONENT_ROLE_CLAIMS:
                v = _component_claim(components, cell, cid, threshold)
            elif cid.startswith("rho_"):
                v = get(rho, cell, "rho_mean", task=cid.split("_")[1])
                lo, hi = (
                    get(rho, cell, "ci_lo", task=cid.split("_")[1]),
                    get(rho, cell, "ci_hi", task=cid.split("_")[1]),
                )
            elif cid == "sort_layer1_bloats":
                v = get(layers, cell, "bloat_per10", task="sort", layer=1, threshold=threshold)
            elif cid == "sort_layer3_heroes":
                v = get(layers, cell, "hero_per10", task="sort", layer=3, threshold=threshold)
            elif cid == "bloat_individual_drop_pct":
                v = 100 * get(superadd, cell, "mean_individual", task="sort", group="bloat")
            elif cid == "bloat_joint_drop_pct":
                v = 100 * get(superadd, cell, "mean_joint", task="sort", group="bloat")
            elif cid == "bloat_superadditivity":
                v = get(superadd, cell, "ratio", task="sort", group="bloat")
                lo, hi = (
                    get(superadd, cell, "ci_lo", task="sort", group="bloat"),
                    get(superadd, cell, "ci_hi", task="sort", group="bloat"),
                )
            elif cid == "hero_ablation_reverse_pct":
                v = -100 * get(superadd, cell, "mean_joint", task="reverse", group="hero")
            elif cid == "bloat_ablation_pct":
                v = -100 * get(superadd, cell, "mean_joint", task="sort", group="bloat")
            else:  # sort_grad_layer{1,3}
                v = get(grad, cell, "G_mean", task="sort", layer=int(cid[-1]))
            tol = float(c.get("tolerance", 0.0))
            status = "not run" if np.isnan(v) else status_of(float(c["value"]), v, tol, lo, hi)
            rows.append(
                {
                    "id": cid,
                    "claim": c["claim"],
                    "cell": cell,
                    "published": c["value"],
                    "tolerance": tol,
                    "value": v,
                    "ci_low": lo,
                    "ci_high": hi,
                    "status": status,
                }
            )
    out = pd.DataFrame(
        rows, columns=["id", "claim", "cell", "published", "tolerance", "value", "ci_low", "ci_high", "status"]
    )
    # what flipping the cell's switch(es) does to the default cell's value
    default = out[out["cell"] == "default"].set_index("id")["value"]
    base = out["id"].map(default)
    out["change_vs_default"] = out["value"] - base
    gap = (out["value"] - out["published"].astype(float)).abs()
    gap_default = (base - out["published"].astype(float)).abs()
    out["closer_than_default"] = (gap < gap_default) & out["value"].notna() & base.notna()
    if paired is not None:
        _add_paired(out, paired)
    return out


def _component_claim(components: pd.DataFrame | None, cell: str, cid: str, threshold: float) -> float:
    """A per-seed rho claim (that seed's rho) or a per-component role claim (kept seeds in
    which the component has the role at ``threshold``, per 10 kept seeds) in ``cell``;
    NaN (not run) without the table, the seed or any kept seed."""
    if components is None:
        return float("nan")
    k = kept(components[components["cell"] == cell])
    if cid.startswith("rho_sort_seed"):
        s = k[(k["task"] == "sort") & (k["seed"] == int(cid.removeprefix("rho_sort_seed")))]
        return float(s["rho"].iloc[0]) if len(s) else float("nan")
    task, comp, role = COMPONENT_ROLE_CLAIMS[cid]
    k = k[k["task"] == task]
    n = k["seed"].nunique()
    if n == 0:
        return float("nan")
    has = k[(k["component"] == comp) & (k[f"role_t{threshold:g}"] == role)]["seed"].nunique()
    return 10 * has / n


def _add_paired(out: pd.DataFrame, paired: pd.DataFrame) -> None:
    """The paired (cell - default) change of each claim, on the claim's scale."""
    cols = {"paired_seeds": [], "paired_diff": [], "paired_ci_lo": [], "paired_ci_hi": [], "decided": [], "change": []}
    for r in out.itertuples():
        vals = (0, float("nan"), float("nan"), float("nan"), False, "")
        if r.cell != "default":
            m = CLAIM_PAIRED.get(r.id)
            p = (
                paired[(paired["cell"] == r.cell) & (paired["task"] == m[0]) & (paired["quantity"] == m[1])]
                if m
                else paired.iloc[:0]
            )
            if m is None:
                vals = (0, float("nan"), float("nan"), float("nan"), False, "no per-seed value")
            elif p.empty:
                vals = (0, float("nan"), float("nan"), float("nan"), False, "no paired seeds")
            else:
                p = p.iloc[0]
                scale = m[2]
                lo, hi = sorted((scale * float(p["ci_lo"]), scale * float(p["ci_hi"])))
                n = int(p["n_paired"])
                vals = (n, scale * float(p["mean_diff"]), lo, hi, bool(p["decided"]), spread.change_word(n, lo, hi))
        for k, v in zip(cols, vals):
            cols[k].append(v)
    for k, v in cols.items():
        out[k] = v
