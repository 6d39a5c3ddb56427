"""Paper A's published claims under each cell of the protocol grid
(:mod:`selfrepair.heroes.grid`): per (claim, cell), the value the cell's tables give
(:func:`claims_table`), next to the published one with its status, its change from the
default cell and, with the paired per-seed differences, whether that change is decided.
:mod:`selfrepair.heroes.claims` imports ``claims_table`` back and turns the ``authors``
cell into the published table's authors'-code columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core.published import status_of
from selfrepair.heroes import spread
from selfrepair.heroes.grid_tables import kept

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


def _get(df: pd.DataFrame, cell: str, col: str, **where) -> float:
    """``col`` of the first row of ``df`` in ``cell`` matching ``where``; NaN if none."""
    s = df[df["cell"] == cell]
    for k, v in where.items():
        s = s[s[k] == v]
    return float(s[col].iloc[0]) if len(s) and col in s else float("nan")


def _cell_value(cid, cell, rho, layers, superadd, grad, components, threshold) -> tuple[float, float, float]:
    """Claim ``cid``'s value in ``cell`` from the grid's tables, and its CI over seeds
    (NaN where the value has none): (value, lo, hi)."""
    lo = hi = float("nan")
    if cid.startswith("rho_sort_seed") or cid in COMPONENT_ROLE_CLAIMS:
        v = _component_claim(components, cell, cid, threshold)
    elif cid.startswith("rho_"):
        v = _get(rho, cell, "rho_mean", task=cid.split("_")[1])
        lo, hi = (
            _get(rho, cell, "ci_lo", task=cid.split("_")[1]),
            _get(rho, cell, "ci_hi", task=cid.split("_")[1]),
        )
    elif cid == "sort_layer1_bloats":
        v = _get(layers, cell, "bloat_per10", task="sort", layer=1, threshold=threshold)
    elif cid == "sort_layer3_heroes":
        v = _get(layers, cell, "hero_per10", task="sort", layer=3, threshold=threshold)
    elif cid == "bloat_individual_drop_pct":
        v = 100 * _get(superadd, cell, "mean_individual", task="sort", group="bloat")
    elif cid == "bloat_joint_drop_pct":
        v = 100 * _get(superadd, cell, "mean_joint", task="sort", group="bloat")
    elif cid == "bloat_superadditivity":
        v = _get(superadd, cell, "ratio", task="sort", group="bloat")
        lo, hi = (
            _get(superadd, cell, "ci_lo", task="sort", group="bloat"),
            _get(superadd, cell, "ci_hi", task="sort", group="bloat"),
        )
    elif cid == "hero_ablation_reverse_pct":
        v = -100 * _get(superadd, cell, "mean_joint", task="reverse", group="hero")
    elif cid == "bloat_ablation_pct":
        v = -100 * _get(superadd, cell, "mean_joint", task="sort", group="bloat")
    else:  # sort_grad_layer{1,3}
        v = _get(grad, cell, "G_mean", task="sort", layer=int(cid[-1]))
    return v, lo, hi


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

    for cid in GRID_CLAIMS:
        if cid not in by_id:
            continue
        c = by_id[cid]
        for cell in cells:
            v, lo, hi = _cell_value(cid, cell, rho, layers, superadd, grad, components, threshold)
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
