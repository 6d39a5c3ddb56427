"""Seconds to score every edge by EAP, GIM-EAP and per-edge activation patching."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
import pandas as pd  # noqa: E402

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import load_bridge, resolve_device  # noqa: E402
from selfrepair.gim.attribute import speed  # noqa: E402
from selfrepair.tasks.registry import get_task  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
bridge = load_bridge(snakemake.input.model, resolve_device(p.device))  # noqa: F821
data = get_task(p.task).sample(int(p.n_eval), seed=int(p.data_seed))
res = speed(bridge, data, int(p.batch_size))
res.update(task=p.task, model=p.model_name)
pd.DataFrame([res]).to_csv(snakemake.output[0], index=False)  # noqa: F821
print(res, file=sys.stderr)
