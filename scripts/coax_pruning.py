"""Rule coax_pruning: structured head pruning, perplexity over a sparsity sweep."""

from selfrepair.coax import pruning
from selfrepair.core import runtime
from selfrepair.core.models import load_bridge
from selfrepair.tasks import lm

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
bridge = load_bridge(smk.input.model, device)
calib = lm.sample(p.n_calib, p.n_ctx, 80_000 + p.seed).to(device)
evalset = lm.sample(p.n_eval, p.n_ctx, 90_000 + p.seed).to(device)
sparsities = sorted(set(list(p.sparsities) + [p.headline]))
table, orders = pruning.run_pruning(bridge, calib, evalset, sparsities, p.seed, p.protocol, p.top_r, p.max_rows)
table["is_headline"] = (table["sparsity"] - p.headline).abs() < 1e-9
table.to_csv(smk.output.perplexity, index=False)
orders.to_csv(smk.output.orders, index=False)
