"""The power of the real-LM claims (core.real_power): per claim, the n that would decide it
if its effect stayed, and the measured cost of that n; one table beside the claims."""

import sys

import pandas as pd

from selfrepair.core import files, real_power, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it

read = files.read_table  # None for an absent table or a not-run placeholder


claims = pd.read_csv(smk.input.claims)
coax = [t for k, f in smk.input.items() if k.startswith("coax_status_") and (t := read(f)) is not None]
gim = [t for k, f in smk.input.items() if k.startswith("gim_status_") and (t := read(f)) is not None]
costs = real_power.part_costs(pd.concat(coax) if coax else None, pd.concat(gim) if gim else None)
coax_sizes, gim_sizes = smk.params.coax_sizes, smk.params.gim_sizes
sizes = {}
for lm in smk.params.lms:
    sizes[(lm, "coax")] = {
        "n_prompts": coax_sizes["n_prompts"],
        "n_truth": coax_sizes["n_truth"],
        "induction_prompts": coax_sizes["induction_prompts"],
        "pruning_n_eval": smk.params.pruning_n_eval,
    }
    sizes[(lm, "gim")] = {k: gim_sizes[k] for k in ("n_eval", "fa_examples")}
power = real_power.power_table(claims, costs, sizes)
power.to_csv(smk.output.csv, index=False)
print(power.groupby(["model", "verdict"]).size().to_string(), file=sys.stderr)  # claims per verdict
