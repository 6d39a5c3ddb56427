"""Attention self-repair: occurrences per input and single vs joint score ablations."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import load_bridge, resolve_device  # noqa: E402
from selfrepair.gim.selfrepair_attention import attention_selfrepair  # noqa: E402
from selfrepair.tasks.registry import get_task  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
bridge = load_bridge(snakemake.input.model, resolve_device(p.device))  # noqa: F821
data = get_task(p.task).sample(int(p.n_inputs), seed=int(p.data_seed))
per_input, rows = attention_selfrepair(bridge, data, float(p.threshold))
per_input.assign(task=p.task, model=p.model_name).to_csv(snakemake.output.occurrences, index=False)  # noqa: F821
rows.assign(task=p.task, model=p.model_name).to_csv(snakemake.output.ablations, index=False)  # noqa: F821
print(per_input.occurrences.describe(), rows.describe(), file=sys.stderr)
