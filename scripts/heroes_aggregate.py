"""Rule heroes_aggregate: every paper-A table from the per-seed tables."""

import pandas as pd

from selfrepair.core import runtime
from selfrepair.heroes import tables as T

smk = snakemake  # noqa: F821
runtime.start(smk)
p = smk.params
ood = [runtime.read_json(f) for f in smk.input.ood]
train = [runtime.read_json(f) for f in smk.input.train]
roles = pd.concat([pd.read_csv(f) for f in smk.input.roles], ignore_index=True)
if "status" not in roles:
    roles["status"] = "skipped"
red_parts = [pd.read_csv(f) for f in smk.input.redundancy]
red = pd.concat([r for r in red_parts if not r.empty] or red_parts, ignore_index=True)
prune_parts = [pd.read_csv(f) for f in smk.input.pruning]
prune = pd.concat([r for r in prune_parts if not r.empty] or prune_parts, ignore_index=True)
att_parts = [pd.read_csv(f) for f in smk.input.attention]
att = pd.concat([r for r in att_parts if not r.empty] or att_parts, ignore_index=True)
pat_parts = [pd.read_csv(f) for f in smk.input.patterns]
pat = pd.concat([r for r in pat_parts if not r.empty] or pat_parts, ignore_index=True)

seeds = T.seeds_table(roles, ood, train, red)
o = smk.output
seeds.to_csv(o.seeds, index=False)
T.rho_summary(seeds).to_csv(o.rho, index=False)
T.run_summary(seeds).to_csv(o.run_summary, index=False)
roles.to_csv(o.components, index=False)
T.roles_by_layer(roles, p.thresholds).to_csv(o.roles_by_layer, index=False)
T.role_stability(roles).to_csv(o.role_stability, index=False)
T.gradient_by_layer(roles).to_csv(o.gradient_by_layer, index=False)
red.to_csv(o.redundancy, index=False)
T.redundancy_summary(red).to_csv(o.redundancy_summary, index=False)
prune.to_csv(o.pruning, index=False)
att.to_csv(o.attention, index=False)
pat.to_csv(o.patterns, index=False)
