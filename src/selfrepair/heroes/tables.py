"""Paper A's aggregate tables, each a pure function of the per-seed tables.

Role counts come twice: all roles, and stable roles only (``*_stable``: the
component keeps its role in at least ``stable_share`` of the resamples of the evaluation
sequences; roles.csv's ``stable_t{t}`` columns, see scripts/heroes_roles.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core import analysis
from selfrepair.core.published import Holds, Measured, NotRun


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
    out: dict = {}
    comps = None
    if components is not None and not components.empty and "status" in components:
        comps = components[(components["status"] == "kept") & (components["task"] == "sort")]

    def per_seed(rows: pd.DataFrame, value: pd.Series) -> np.ndarray | None:
        """``value`` summed per kept sorting seed (every kept seed, zeros included)."""
        if comps is None:
            return None
        return value.groupby(rows["seed"]).sum().reindex(comps["seed"].unique(), fill_value=0).to_numpy(float)

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
    bl = by_layer[(by_layer["task"] == "sort") & (by_layer["threshold"] == threshold)].set_index("layer")
    if bl.empty:
        out["sort_layer1_bloats"] = out["sort_layer3_heroes"] = NotRun("no kept sorting seed")
    else:
        n_kept = int((seeds[(seeds["task"] == "sort")]["status"] == "kept").sum())
        note = f"{n_kept} kept sorting seeds, threshold {threshold:g}"

        def layer_count(col, layer):
            # per seed: its count of `col` roles in `layer`; a resample's statistic is the
            # sum over its seeds (the claim's scale: the count summed over kept seeds)
            rows = None
            if comps is not None:
                hit = (comps[f"role_t{threshold:g}"] == col) & (comps["layer"] == layer)
                rows = per_seed(comps, hit.astype(float))
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
    st = stability[stability["task"] == "sort"].set_index("component")
    if st.empty:
        for cid in ("sort_L3H3_hero", "sort_L1H1_bloat", "sort_L1H3_bloat"):
            out[cid] = NotRun("no kept sorting seed")
    else:

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

        out["sort_L3H3_hero"] = frac("L3H3", "hero")
        out["sort_L1H1_bloat"] = frac("L1H1", "bloat")
        out["sort_L1H3_bloat"] = frac("L1H3", "bloat")
    rs = red.set_index(["task", "group"]) if not red.empty else None

    def red_of(task, group, col, scale=100.0, sign=1.0):
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

    out["bloat_individual_drop_pct"] = red_of("sort", "bloat", "mean_individual_drop")
    out["bloat_joint_drop_pct"] = red_of("sort", "bloat", "joint_drop")
    out["bloat_superadditivity"] = red_of("sort", "bloat", "joint_over_mean_individual", scale=1.0)
    out["bloat_ablation_pct"] = red_of("sort", "bloat", "joint_drop", sign=-1.0)
    out["hero_ablation_reverse_pct"] = red_of("reverse", "hero", "joint_drop", sign=-1.0)
    gl = grad_layer[grad_layer["task"] == "sort"].set_index("layer")
    if gl.empty:
        out["sort_grad_layer1"] = out["sort_grad_layer3"] = NotRun("no kept sorting seed")
    else:

        def grad(layer):
            if layer not in gl.index:
                return NotRun(f"no layer {layer}")
            rows = None
            if comps is not None:
                in_layer = comps["layer"] == layer
                # per seed: (sum of G, number of components) in the layer; a resample's
                # statistic is the mean G over its seeds' components, as gradient_by_layer
                rows = np.column_stack(
                    [per_seed(comps, comps["G"].where(in_layer, 0.0)), per_seed(comps, in_layer.astype(float))]
                )
            note = f"mean G over {int(gl.loc[layer, 'n'])} (seed, component) rows of layer {layer}"
            return _claim_ci(
                float(gl.loc[layer, "G_mean"]), note, rows, lambda r: r[..., 0].sum(1) / r[..., 1].sum(1), ".3g"
            )

        out["sort_grad_layer1"] = grad(1)
        out["sort_grad_layer3"] = grad(3)
    att = attention.dropna(subset=["role"])
    h = att[att["role"] == "hero"]
    b = att[att["role"] == "bloat"]
    if h.empty or b.empty:
        out["attention_hero_vs_bloat"] = NotRun("no hero or no bloat head in kept seeds")
    else:
        holds = h["entropy"].mean() < b["entropy"].mean()
        out["attention_hero_vs_bloat"] = Holds(
            bool(holds),
            f"mean attention entropy heroes {h['entropy'].mean():.3f} vs bloats {b['entropy'].mean():.3f} nats; "
            f"sink mass {h['sink_mass'].mean():.3f} vs {b['sink_mass'].mean():.3f} ({len(h)} hero, {len(b)} bloat heads)",
        )
    return out


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


# The authors'-code protocol's columns of paper A's published table (see authors_columns).
AUTHORS_COLUMNS = ("authors_reproduced", "authors_ci_low", "authors_ci_high", "authors_status", "authors_note")


def authors_columns(
    table: pd.DataFrame, grid_claims: pd.DataFrame | None, n_seeds: int, cell: str = "authors"
) -> pd.DataFrame:
    """Paper A's published table with each claim also under the authors'-code protocol.

    ``grid_claims``: the protocol grid's claims table (heroes/grid_tables.claims_table; one
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
