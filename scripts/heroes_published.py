"""Rule heroes_published: paper A's published numbers vs this run's.

``reproduced_stable``: for the role-count claims, the same count over stable roles only
(roles kept in at least heroes.roles.stable_share of the resamples of the evaluation
sequences), beside ``reproduced`` (all roles). Every numeric claim carries a 95% bootstrap
CI over seeds (``ci_low``/``ci_high``; the per-seed rho claims over resampled evaluation
sequences), which decides reproduced / differs / fragile; the role counts and G per layer
take theirs from the per-seed components table, the redundancy claims from
redundancy_summary's CI columns (claims.measured_claims). ``authors_*``: each claim
under the authors'-code protocol, from the protocol grid's 'authors' cell when the grid
runs it (claims.authors_columns; ``not run`` otherwise)."""

import pandas as pd

from selfrepair.core import published, runtime
from selfrepair.heroes import claims

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
p = smk.params
i = smk.input
measured = claims.measured_claims(
    pd.read_csv(i.seeds),
    pd.read_csv(i.rho),
    pd.read_csv(i.roles_by_layer),
    pd.read_csv(i.role_stability),
    pd.read_csv(i.gradient_by_layer),
    pd.read_csv(i.redundancy_summary),
    pd.read_csv(i.attention),
    p.threshold,
    p.thresholds,
    components=pd.read_csv(i.components),
)
table = published.compare("heroes", published.load_claims(i.claims, "heroes"), measured)
stable = claims.stable_claims(pd.read_csv(i.roles_by_layer), pd.read_csv(i.role_stability), p.threshold)
table.insert(table.columns.get_loc("reproduced") + 1, "reproduced_stable", table["id"].map(stable))
table["protocol"] = p.protocol
grid = pd.read_csv(i.grid_claims) if "grid_claims" in i.keys() else None
table = claims.authors_columns(table, grid, p.authors_seeds)
table.to_csv(smk.output.csv, index=False)
