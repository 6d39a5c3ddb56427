"""Rule heroes_published: paper A's published numbers vs this run's."""

import pandas as pd

from selfrepair import heroes_tables as T
from selfrepair import published, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
p = smk.params
i = smk.input
measured = T.measured_claims(
    pd.read_csv(i.seeds),
    pd.read_csv(i.rho),
    pd.read_csv(i.roles_by_layer),
    pd.read_csv(i.role_stability),
    pd.read_csv(i.gradient_by_layer),
    pd.read_csv(i.redundancy_summary),
    pd.read_csv(i.attention),
    p.threshold,
    p.thresholds,
)
table = published.compare("heroes", published.load_claims(i.claims, "heroes"), measured)
table["protocol"] = p.protocol
table.to_csv(smk.output.csv, index=False)
