"""Train one paper-C toy model on a counterfactual task (thin adapter)."""

import json
import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import resolve_device  # noqa: E402
from selfrepair.gim.training import train_any  # noqa: E402
from selfrepair.tasks.registry import get_task  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
meta = train_any(
    get_task(p.task),
    snakemake.output.model,
    device=resolve_device(p.device),
    seed=int(p.seed),  # noqa: F821
    **p.model,
    **p.train,
)
print(json.dumps(meta), file=sys.stderr)
