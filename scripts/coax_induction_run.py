"""Rule coax_induction_run: induction heads, COAX sets vs size-matched random sets."""

from selfrepair.coax import induction_experiment
from selfrepair.core import runtime
from selfrepair.core.models import load_bridge

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
bridge = load_bridge(smk.input.model, device)
res = induction_experiment.run_induction(
    bridge,
    tuple(p.T),
    p.vocab,
    p.n_prompts,
    p.data_seed,
    p.ks,
    p.n_primary,
    p.n_random,
    p.protocol,
    p.top_r,
    p.max_rows,
)
res["heads"].to_csv(smk.output.heads, index=False)
sets = res["sets"]
sets["clean_logprob"] = res["clean_logprob"]
sets["primaries"] = " ".join(res["primaries"])
sets.to_csv(smk.output.sets, index=False)
