"""Rule heroes_grid_tables: every table of the protocol grid from the per-model files."""

import pandas as pd

from selfrepair.core import published, runtime
from selfrepair.heroes import claims as C
from selfrepair.heroes import grid_tables as T

smk = snakemake  # noqa: F821
runtime.start(smk)
p = smk.params


def concat(files):
    parts = [pd.read_csv(f) for f in files]
    nonempty = [x for x in parts if not x.empty]
    return pd.concat(nonempty or parts, ignore_index=True)


comps = concat(smk.input.components)
if "status" not in comps:
    comps["status"] = "skipped"
joint = concat(smk.input.joint)
sweep = concat(smk.input.sweep)
o = smk.output
seeds = T.seeds_table(comps, joint, p.threshold)
rho = T.rho_table(seeds, p.protocols, p.n_boot)
layers = T.roles_by_layer(comps, p.thresholds)
sup = T.superadditivity_table(joint, p.n_boot)
grad = T.gradient_by_layer(comps)
seeds.to_csv(o.seeds, index=False)
rho.to_csv(o.rho, index=False)
layers.to_csv(o.roles_by_layer, index=False)
sup.to_csv(o.superadditivity, index=False)
T.noise_table(sweep).to_csv(o.noise, index=False)
paired = T.paired_table(T.seed_values(seeds, comps, p.threshold), p.n_boot)
paired.to_csv(o.paired, index=False)
claims = published.load_claims(smk.input.claims, "heroes")
C.claims_table(rho, layers, sup, grad, claims, p.threshold, paired, components=comps).to_csv(o.claims, index=False)
comps.to_csv(o.components, index=False)
