"""Paper C's regression table: every published claim, reproduced / differs / not run."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
runtime.check_inputs(snakemake)  # noqa: F821  TableChanged on a table not as its rule wrote it
import pandas as pd  # noqa: E402

from selfrepair.core.published import compare, load_claims  # noqa: E402
from selfrepair.gim.claims import claims_evidence  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402

claims = load_claims(snakemake.input.claims, "gim")  # noqa: F821
loc = pd.read_csv(snakemake.input.localization)  # noqa: F821
measured = claims_evidence(
    loc,
    pd.read_csv(snakemake.input.selfrepair),  # noqa: F821
    pd.read_csv(snakemake.input.fa),  # noqa: F821
    pd.read_csv(snakemake.input.mib),  # noqa: F821
    summary=pd.read_csv(snakemake.input.summary),  # noqa: F821
)
measured["gim_edges_gpt2"] = (Graph.build(12, 12, 768).n_edges, "edge graph of GPT-2 small (12 layers x 12 heads)")
table = compare("gim", claims, measured)
table.to_csv(snakemake.output.csv, index=False)  # noqa: F821
print(table.to_string(), file=sys.stderr)
