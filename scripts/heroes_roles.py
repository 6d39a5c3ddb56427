"""Rule heroes_roles: ranks, Delta and roles (hero / bloat / aligned) of one seed.

With a confidence, from the per-sequence outcomes of heroes_scores: per
threshold t, ``stability_t{t}`` is the share of n_boot resamples of the evaluation
sequences in which the component keeps its role, ``stable_t{t}`` = stability >=
stable_share; ``stability`` / ``stable`` are those at the main threshold.
``C_within_2se_of_zero``: |C| <= 2 SE; ``C_close``: how many other components' C lie
within 2 paired SE of this one's (``C_within_2se_of_other``: at least one).
``rho_boot_lo`` / ``rho_boot_hi``: the 95% interval of rho(G, C) over the resamples."""

import pandas as pd

from selfrepair.core import analysis, runtime
from selfrepair.core import components as C
from selfrepair.heroes import spread

smk = snakemake  # noqa: F821
runtime.start(smk)
p = smk.params
ood = runtime.read_json(smk.input.ood)
g = pd.read_csv(smk.input.gradients)
a = pd.read_csv(smk.input.ablations)
if ood["status"] != "kept":
    df = pd.DataFrame({"status": ["skipped"], "reason": [ood["reason"]]})
else:
    c = a[a["mode"] == p.ablation].set_index("component")
    other = a[a["mode"] != p.ablation].set_index("component")
    g = g.set_index("component").loc[c.index]
    df = analysis.roles_table(list(c.index), g["G"].values, c["C"].values, p.thresholds)
    df["C_se"] = c["C_se"].values
    for mode in sorted(a["mode"].unique()):
        df[f"C_{mode}"] = a[a["mode"] == mode].set_index("component").loc[c.index, "C"].values
    parsed = [C.parse(n) for n in df["component"]]
    df.insert(1, "layer", [x.layer for x in parsed])
    df.insert(2, "kind", ["head" if x.is_head else "mlp" for x in parsed])
    df["role"] = df[f"role_t{p.threshold:g}"]
    out = runtime.load_tensors(smk.input.outcomes)
    cols = list(out["columns"])
    outcomes = out[p.ablation].numpy()[:, [0] + [cols.index(n) for n in c.index]]
    boot, rho_ci = spread.bootstrap_roles(outcomes, df["G"].values, p.thresholds, n_boot=p.n_boot, seed=p.seed)
    for t in p.thresholds:
        if list(boot[f"role_t{t:g}"]) != list(df[f"role_t{t:g}"]):
            raise ValueError(f"roles from outcomes.pt differ from ablations.csv at t={t:g}: stale outcomes?")
        df[f"stability_t{t:g}"] = boot[f"stability_t{t:g}"].values
        df[f"stable_t{t:g}"] = df[f"stability_t{t:g}"] >= p.stable_share
    df["stability"] = df[f"stability_t{p.threshold:g}"]
    df["stable"] = df[f"stable_t{p.threshold:g}"]
    se = spread.within_se(outcomes)
    for col in ("C_within_2se_of_zero", "C_close", "C_within_2se_of_other"):
        df[col] = se[col].values
    df["rho_boot_lo"] = rho_ci["rho_boot_lo"]
    df["rho_boot_hi"] = rho_ci["rho_boot_hi"]
    df["n_boot"] = rho_ci["n_boot"]
    df["ablation"] = p.ablation
    df["N"] = ood["N"]
    df["baseline_acc"] = c["baseline_acc"].iloc[0]
    df["status"] = "kept"
df.insert(0, "seed", p.seed)
df.insert(0, "task", p.task)
df.to_csv(smk.output.csv, index=False)
