"""Rule heroes_roles: ranks, Delta and roles (hero / bloat / aligned) of one seed."""

import pandas as pd

from selfrepair import analysis, runtime
from selfrepair import components as C

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
    df["ablation"] = p.ablation
    df["N"] = ood["N"]
    df["baseline_acc"] = c["baseline_acc"].iloc[0]
    df["status"] = "kept"
df.insert(0, "seed", p.seed)
df.insert(0, "task", p.task)
df.to_csv(smk.output.csv, index=False)
