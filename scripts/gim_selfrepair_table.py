"""Self-repair summary per task and model (thin adapter)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
import pandas as pd  # noqa: E402

from selfrepair.gim.selfrepair_attention import summarize  # noqa: E402

occ = pd.concat([pd.read_csv(f) for f in snakemake.input.occurrences])  # noqa: F821
abl = pd.concat([pd.read_csv(f) for f in snakemake.input.ablations])  # noqa: F821
occ.to_csv(snakemake.output.occurrences, index=False)  # noqa: F821
abl.to_csv(snakemake.output.ablations, index=False)  # noqa: F821
summarize(occ, abl).to_csv(snakemake.output.summary, index=False)  # noqa: F821
