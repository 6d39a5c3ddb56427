"""Rule coax_ioi_run: COAX vs the baselines, wake-up, freezing, recovery, knockout."""

import pandas as pd

from selfrepair.coax import ioi_experiment
from selfrepair.core import runtime
from selfrepair.core.components import head_components, parse
from selfrepair.core.models import load_bridge
from selfrepair.tasks import ioi

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
bridge = load_bridge(smk.input.model, device)
heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
truth = pd.read_csv(smk.input.truth)
primaries = [parse(u) for u in truth.sort_values("drop", ascending=False).query("role == 'primary'")["unit"]]
backups = [parse(u) for u in truth.query("role == 'backup'")["unit"]]
prompts = ioi.sample_toy(p.n_prompts, int(p.data_seed)).to(device)
res = ioi_experiment.run_ioi(
    bridge,
    prompts,
    heads,
    primaries,
    backups,
    p.protocol,
    p.top_r,
    p.top_k,
    p.k_recovered,
    p.wake_min,
    p.ig_steps,
    p.max_rows,
    p.amp_eps,
)
for name in ("scores", "discovery", "wake", "freeze", "knockout"):
    t = res[name].copy()
    t.insert(0, "data_seed", int(p.data_seed))
    t.insert(0, "model_seed", int(p.seed))
    t["protocol"] = p.protocol
    t.to_csv(smk.output[name], index=False)
