"""Rule coax_ioi_truth: brute-force ground truth (every single and pair ablation)."""

from selfrepair.coax import ioi_experiment
from selfrepair.core import runtime
from selfrepair.core.components import head_components
from selfrepair.core.models import load_bridge
from selfrepair.tasks import ioi

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
bridge = load_bridge(smk.input.model, device)
heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
prompts = ioi.sample_toy(p.n_prompts, p.truth_seed)
table, pairs, _, _ = ioi_experiment.ground_truth(
    bridge, prompts.to(device), heads, p.n_primary, p.backup_frac, p.max_rows
)
table.to_csv(smk.output.heads, index=False)
pairs.to_csv(smk.output.pairs, index=False)
