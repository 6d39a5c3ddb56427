"""Feature-attribution table: mean comprehensiveness, sufficiency and ground-truth hit."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
import pandas as pd  # noqa: E402

from selfrepair.gim.feature_attribution import summarize  # noqa: E402

df = pd.concat([pd.read_csv(f) for f in snakemake.input])  # noqa: F821
table = summarize(df)
table.to_csv(snakemake.output[0], index=False)  # noqa: F821
print(table.to_string(), file=sys.stderr)
