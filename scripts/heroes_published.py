"""Rule heroes_published: paper A's published numbers vs this run's.

``reproduced_stable``: for the role-count claims, the same count over stable roles only
(roles kept in at least heroes.roles.stable_share of the resamples of the evaluation
sequences), beside ``reproduced`` (all roles). rho claims carry their bootstrap CI
(``ci_low``/``ci_high``), which decides reproduced / differs / fragile."""

import pandas as pd

from selfrepair.core import published, runtime
from selfrepair.heroes import tables as T

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
stable = T.stable_claims(pd.read_csv(i.roles_by_layer), pd.read_csv(i.role_stability), p.threshold)
table.insert(table.columns.get_loc("reproduced") + 1, "reproduced_stable", table["id"].map(stable))
table["protocol"] = p.protocol
table.to_csv(smk.output.csv, index=False)
