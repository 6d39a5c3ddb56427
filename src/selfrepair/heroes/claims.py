"""Paper A's published claims: the aggregate tables of :mod:`selfrepair.heroes.tables`
mapped onto the claim ids of config/published.yaml's ``heroes`` section, each a measured
value with its interval (``Measured``), a finding that holds or not (``Holds``), or not
run with the reason (``NotRun``; :mod:`selfrepair.core.published`).

``measured_claims`` is the entry point; it reads one group of claims per table (rho, the
role counts per layer, the roles of named components, redundancy, G per layer,
attention). ``stable_claims`` gives the role-count claims over stable roles only, and
``authors_columns`` each claim under the authors'-code protocol (the protocol grid).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core import analysis
from selfrepair.core.published import Holds, Measured, NotRun
from selfrepair.heroes.grid_claims import (  # noqa: F401  (claims.claims_table, as before)
    CLAIM_PAIRED,
    COMPONENT_ROLE_CLAIMS,
    GRID_CLAIMS,
    claims_table,
)

N_BOOT = 10000  # analysis.bootstrap_ci / bootstrap_stat's default, named in the notes


def _ci_text(lo: float, hi: float, n: int, fmt: str = ".1f") -> str:
    if np.isnan(lo) or np.isnan(hi):
        return f"no CI ({n} seed{'s' if n != 1 else ''}: a bootstrap over seeds needs 2)"
    return f"95% CI [{lo:{fmt}}, {hi:{fmt}}] (bootstrap over {n} seeds)"


def _claim_ci(value: float, note: str, per_seed, fn, fmt: str = ".1f") -> Measured:
    """A claim's value with the percentile bootstrap CI over seeds of ``fn`` of the
    per-seed rows (None: no per-seed table, no CI)."""
    if per_seed is None:
        return Measured(value, note=f"{note}; no CI (no per-seed table)")
    lo, hi, _ = analysis.bootstrap_stat(per_seed, fn)
    return Measured(value, lo, hi, f"{note}, {_ci_text(lo, hi, len(per_seed), fmt)}")


def _per_seed(comps: pd.DataFrame | None, value: pd.Series) -> np.ndarray | None:
    """``value`` (one per row of ``comps``) summed per kept sorting seed (every kept seed,
    zeros included); None without a per-seed table."""
    if comps is None:
        return None
    return value.groupby(comps["seed"]).sum().reindex(comps["seed"].unique(), fill_value=0).to_numpy(float)


def _rho_claims(rho: pd.DataFrame, seeds: pd.DataFrame) -> dict:
    """rho per task (bootstrap CI over seeds) and of the two named sorting seeds (interval
    over resamples of the evaluation sequences)."""
    out: dict = {}
    for task in ("reverse", "sort"):
        r = rho[(rho["task"] == task) & (rho["measure"] == "rho")]
        if r.empty or r["n_kept"].iloc[0] == 0:
            out[f"rho_{task}"] = NotRun(f"no kept seed for {task}")
            continue
        r = r.iloc[0]
        out[f"rho_{task}"] = Measured(
            float(r["mean"]),
            float(r["ci_lo"]),
            float(r["ci_hi"]),
            f"sd {r['sd']:.2f}, 95% CI [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}] (bootstrap over seeds), {int(r['n_kept'])} kept seeds of {int(r['n_seeds'])}",
        )
    for seed, cid in ((456, "rho_sort_seed456"), (2020, "rho_sort_seed2020")):
        s = seeds[(seeds["task"] == "sort") & (seeds["seed"] == seed)]
        if s.empty:
            out[cid] = NotRun(f"seed {seed} not in this run's config")
        elif s["status"].iloc[0] != "kept":
            out[cid] = NotRun(f"seed {seed} skipped: {s['reason'].iloc[0]}")
        elif "rho_boot_lo" in s and not np.isnan(float(s["rho_boot_lo"].iloc[0])):
            lo, hi = float(s["rho_boot_lo"].iloc[0]), float(s["rho_boot_hi"].iloc[0])
            out[cid] = Measured(
                float(s["rho"].iloc[0]),
                lo,
                hi,
                f"95% interval [{lo:.2f}, {hi:.2f}] over resamples of the evaluation sequences",
            )
        else:
            out[cid] = float(s["rho"].iloc[0])
    return out


def _layer_claims(seeds: pd.DataFrame, by_layer: pd.DataFrame, threshold: float, thresholds, comps) -> dict:
    """Sorting's bloats in layer 1 and heroes in layer 3 (counts summed over kept seeds),
    and whether that pattern holds at every threshold."""
    out: dict = {}
    bl = by_layer[(by_layer["task"] == "sort") & (by_layer["threshold"] == threshold)].set_index("layer")
    if bl.empty:
        out["sort_layer1_bloats"] = out["sort_layer3_heroes"] = NotRun("no kept sorting seed")
        return out
    n_kept = int((seeds[(seeds["task"] == "sort")]["status"] == "kept").sum())
    note = f"{n_kept} kept sorting seeds, threshold {threshold:g}"

    def layer_count(col, layer):
        # per seed: its count of `col` roles in `layer`; a resample's statistic is the
        # sum over its seeds (the claim's scale: the count summed over kept seeds)
        rows = None
        if comps is not None:
            hit = (comps[f"role_t{threshold:g}"] == col) & (comps["layer"] == layer)
            rows = _per_seed(comps, hit.astype(float))
        m = _claim_ci(float(bl[col].get(layer, 0)), note, rows, lambda r: r.sum(1))
        if f"{col}_stable" in bl:
            m.note += f"; stable roles only: {int(bl[f'{col}_stable'].get(layer, 0))}"
        return m

    out["sort_layer1_bloats"] = layer_count("bloat", 1)
    out["sort_layer3_heroes"] = layer_count("hero", 3)
    checks = []
    for t in thresholds:
        b = by_layer[(by_layer["task"] == "sort") & (by_layer["threshold"] == t)].set_index("layer")
        top_bloat = int(b["bloat"].idxmax()) if b["bloat"].sum() else None
        top_hero = int(b["hero"].idxmax()) if b["hero"].sum() else None
        checks.append((t, top_bloat, top_hero))
    holds = all(tb == 1 and th == 3 for _, tb, th in checks)
    out["sort_layer_pattern_thresholds"] = Holds(
        holds, "; ".join(f"t={t:g}: most bloats in layer {tb}, most heroes in layer {th}" for t, tb, th in checks)
    )
    return out


def _component_claims(stability: pd.DataFrame, comps) -> dict:
    """How often L3H3 is a hero and L1H1, L1H3 bloats over kept sorting seeds, scaled to 10."""
    st = stability[stability["task"] == "sort"].set_index("component")
    if st.empty:
        return {cid: NotRun("no kept sorting seed") for cid in ("sort_L3H3_hero", "sort_L1H1_bloat", "sort_L1H3_bloat")}

    def frac(comp, col):
        if comp not in st.index:
            return NotRun(f"{comp} not in this model")
        r = st.loc[comp]
        note = f"{int(r[col])}/{int(r['n_seeds'])} kept seeds, scaled to 10"
        rows = None
        if comps is not None:
            c = comps[comps["component"] == comp]
            rows = (c["role"] == col).to_numpy(float)  # one row per kept seed: 0/1
        m = _claim_ci(float(r[col]) / float(r["n_seeds"]) * 10, note, rows, lambda x: 10 * x.mean(1))
        if f"{col}_stable" in r.index:
            m.note += f"; stable {col} in {int(r[f'{col}_stable'])}/{int(r['n_seeds'])}"
        return m

    return {
        "sort_L3H3_hero": frac("L3H3", "hero"),
        "sort_L1H1_bloat": frac("L1H1", "bloat"),
        "sort_L1H3_bloat": frac("L1H3", "bloat"),
    }


def _redundancy_claim(rs: pd.DataFrame | None, task, group, col, scale=100.0, sign=1.0):
    """One redundancy claim from redundancy_summary (indexed by task and group), on the
    claim's scale, with the table's CI over seeds."""
    if rs is None or (task, group) not in rs.index:
        return NotRun(f"no {'heroes' if group == 'hero' else 'bloats'} found in kept {task} seeds")
    r = rs.loc[(task, group)]
    n = int(r["n_seeds"])
    note = f"{n} seeds with {'heroes' if group == 'hero' else 'bloats'}"
    if col == "joint_drop" and n > 1:
        note += f", sd {scale * float(r['joint_drop_sd']):.1f}"
    if np.isnan(float(r[col])):
        if col == "joint_over_mean_individual":
            return NotRun(
                f"undefined: the mean individual drop over the {note} is "
                f"{100 * float(r['mean_individual_drop']):.2f} points (<= 0), so joint / mean individual has no value"
            )
        return NotRun(f"no value ({note})")
    if f"{col}_ci_lo" not in r.index:  # a table from before the CIs over seeds
        return Measured(sign * scale * float(r[col]), note=f"{note}; no CI (no per-seed table)")
    lo, hi = sorted((sign * scale * float(r[f"{col}_ci_lo"]), sign * scale * float(r[f"{col}_ci_hi"])))
    note += f", {_ci_text(lo, hi, n)}"
    if col == "joint_over_mean_individual" and not np.isnan(lo):
        undefined = int(r.get("joint_over_mean_individual_undefined", 0))
        note += (
            f": the ratio of the resampled means, {undefined} of {N_BOOT} resamples undefined "
            "(mean individual drop <= 0) left out"
        )
    return Measured(sign * scale * float(r[col]), lo, hi, note)


def _redundancy_claims(red: pd.DataFrame) -> dict:
    """The bloats' individual and joint drops, their superadditivity, and the heroes' joint drop."""
    rs = red.set_index(["task", "group"]) if not red.empty else None
    return {
        "bloat_individual_drop_pct": _redundancy_claim(rs, "sort", "bloat", "mean_individual_drop"),
        "bloat_joint_drop_pct": _redundancy_claim(rs, "sort", "bloat", "joint_drop"),
        "bloat_superadditivity": _redundancy_claim(rs, "sort", "bloat", "joint_over_mean_individual", scale=1.0),
        "bloat_ablation_pct": _redundancy_claim(rs, "sort", "bloat", "joint_drop", sign=-1.0),
        "hero_ablation_reverse_pct": _redundancy_claim(rs, "reverse", "hero", "joint_drop", sign=-1.0),
    }


def _gradient_claims(grad_layer: pd.DataFrame, comps) -> dict:
    """Sorting's mean G in layers 1 and 3."""
    gl = grad_layer[grad_layer["task"] == "sort"].set_index("layer")
    if gl.empty:
        return {"sort_grad_layer1": NotRun("no kept sorting seed"), "sort_grad_layer3": NotRun("no kept sorting seed")}

    def grad(layer):
        if layer not in gl.index:
            return NotRun(f"no layer {layer}")
        rows = None
        if comps is not None:
            in_layer = comps["layer"] == layer
            # per seed: (sum of G, number of components) in the layer; a resample's
            # statistic is the mean G over its seeds' components, as gradient_by_layer
            rows = np.column_stack(
                [_per_seed(comps, comps["G"].where(in_layer, 0.0)), _per_seed(comps, in_layer.astype(float))]
            )
        note = f"mean G over {int(gl.loc[layer, 'n'])} (seed, component) rows of layer {layer}"
        return _claim_ci(
            float(gl.loc[layer, "G_mean"]), note, rows, lambda r: r[..., 0].sum(1) / r[..., 1].sum(1), ".3g"
        )

    return {"sort_grad_layer1": grad(1), "sort_grad_layer3": grad(3)}


def _attention_claims(attention: pd.DataFrame) -> dict:
    """Heroes attend more sharply than bloats (lower mean attention entropy)."""
    att = attention.dropna(subset=["role"])
    h = att[att["role"] == "hero"]
    b = att[att["role"] == "bloat"]
    if h.empty or b.empty:
        return {"attention_hero_vs_bloat": NotRun("no hero or no bloat head in kept seeds")}
    holds = h["entropy"].mean() < b["entropy"].mean()
    return {
        "attention_hero_vs_bloat": Holds(
            bool(holds),
            f"mean attention entropy heroes {h['entropy'].mean():.3f} vs bloats {b['entropy'].mean():.3f} nats; "
            f"sink mass {h['sink_mass'].mean():.3f} vs {b['sink_mass'].mean():.3f} ({len(h)} hero, {len(b)} bloat heads)",
        )
    }


def measured_claims(
    seeds: pd.DataFrame,
    rho: pd.DataFrame,
    by_layer: pd.DataFrame,
    stability: pd.DataFrame,
    grad_layer: pd.DataFrame,
    red: pd.DataFrame,
    attention: pd.DataFrame,
    threshold: float,
    thresholds,
    components: pd.DataFrame | None = None,
) -> dict:
    """Map claim ids of config/published.yaml (section heroes) to measured values.

    Every numeric claim is a ``Measured`` with a 95% percentile bootstrap CI over seeds
    (models), so that a claim resting on which roles each seed's model happens to have is
    'fragile' rather than flipping between reproduced and differs: the rho claims from
    ``rho`` (and per seed, over resampled evaluation sequences), the redundancy claims from
    ``red``'s CI columns (redundancy_summary), the role counts and G per layer from the
    per-seed ``components`` (components.csv: roles of every component of every seed; None:
    those claims carry no CI)."""
    comps = None
    if components is not None and not components.empty and "status" in components:
        comps = components[(components["status"] == "kept") & (components["task"] == "sort")]
    return {
        **_rho_claims(rho, seeds),
        **_layer_claims(seeds, by_layer, threshold, thresholds, comps),
        **_component_claims(stability, comps),
        **_redundancy_claims(red),
        **_gradient_claims(grad_layer, comps),
        **_attention_claims(attention),
    }


def stable_claims(by_layer: pd.DataFrame, stability: pd.DataFrame, threshold: float) -> dict:
    """The role-count claims of config/published.yaml (heroes) counting stable roles only,
    on the claims' scale: {claim id: value}. Empty when the tables carry no stability."""
    out: dict = {}
    bl = by_layer[(by_layer["task"] == "sort") & (by_layer["threshold"] == threshold)].set_index("layer")
    if not bl.empty and "bloat_stable" in bl:
        out["sort_layer1_bloats"] = float(bl["bloat_stable"].get(1, 0))
        out["sort_layer3_heroes"] = float(bl["hero_stable"].get(3, 0))
    st = stability[stability["task"] == "sort"].set_index("component")
    if not st.empty and "hero_stable" in st:
        for cid, comp, col in (
            ("sort_L3H3_hero", "L3H3", "hero"),
            ("sort_L1H1_bloat", "L1H1", "bloat"),
            ("sort_L1H3_bloat", "L1H3", "bloat"),
        ):
            if comp in st.index:
                out[cid] = float(st.loc[comp, f"{col}_stable"]) / float(st.loc[comp, "n_seeds"]) * 10
    return out


# The authors'-code protocol's columns of paper A's published table (see authors_columns).
AUTHORS_COLUMNS = ("authors_reproduced", "authors_ci_low", "authors_ci_high", "authors_status", "authors_note")


def authors_columns(
    table: pd.DataFrame, grid_claims: pd.DataFrame | None, n_seeds: int, cell: str = "authors"
) -> pd.DataFrame:
    """Paper A's published table with each claim also under the authors'-code protocol.

    ``grid_claims``: the protocol grid's claims table (:func:`claims_table` below; one
    row per claim and cell), or None when the grid did not run. The ``cell`` rows give
    ``authors_reproduced`` (4 digits, as ``reproduced``), its CI and ``authors_status``;
    a claim the grid does not measure, or a grid without that cell, is ``not run`` with
    the reason in ``authors_note``. ``n_seeds``: the cell's seeds per task (the note says
    how many the values rest on)."""
    out = table.copy()
    g = None if grid_claims is None else grid_claims[grid_claims["cell"] == cell].set_index("id")
    rows = []
    for cid in out["id"]:
        if g is None or g.empty:
            why = "the protocol grid did not run" if g is None else f"the protocol grid has no '{cell}' cell"
            rows.append((float("nan"), float("nan"), float("nan"), "not run", why))
        elif cid not in g.index:
            rows.append(
                (float("nan"), float("nan"), float("nan"), "not run", "the protocol grid does not measure this claim")
            )
        else:
            r = g.loc[cid]
            v = float(r["value"])
            note = f"authors'-code protocol (grid cell '{cell}'), {n_seeds} seeds per task"
            rows.append(
                (round(v, 4), round(float(r["ci_low"]), 4), round(float(r["ci_high"]), 4), str(r["status"]), note)
            )
    for k, col in enumerate(AUTHORS_COLUMNS):
        out[col] = [r[k] for r in rows]
    return out
