"""Rule coax_published: paper B's published numbers vs this run's."""

from pathlib import Path

import pandas as pd

from selfrepair.coax import claims, real_models
from selfrepair.core import published, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
i = smk.input
toy = {
    "ioi_summary": pd.read_csv(i.summary),
    "ioi_wake": pd.read_csv(i.wake),
    "ioi_freeze": pd.read_csv(i.freeze),
    "ioi_knockout": pd.read_csv(i.knockout),
    "induction": pd.read_csv(i.induction),
    "pruning": pd.read_csv(i.pruning),
}
status = pd.read_csv(i.real_status).fillna("")
real = real_models.real_tables(i.real_tables)
not_run = {}  # claim -> the reasons of every model x experiment row it needs that did not run
for _, r in status.iterrows():
    if r["status"] != "ran":
        for cid in str(r["claims"]).split():
            reason = r["reason"].replace("not run: failed:", f"not run: {r['model']} failed:")
            not_run[cid] = f"{not_run[cid]}; {reason}" if cid in not_run else reason
not_run.setdefault("limits_mlp_weak", "not run: the greater-than circuit (MLP-dominated) is not part of this workflow")
not_run.setdefault(
    "limits_induction_shared", "not run: a qualitative reading of the paper's induction results; not scored"
)
measured = claims.measured_claims(pd.read_csv(i.synthetic), toy, real, not_run)
wk = Path(i.real_tables) / "wakeup_models.csv"
if "wakeup_scales" not in not_run and wk.exists():
    measured["wakeup_scales"] = claims.wakeup_scales(pd.read_csv(wk))
table = published.compare("coax", published.load_claims(i.claims, "coax"), measured)
table["protocol"] = f"COAX protocol {smk.params.protocol}, zero ablation of hook_z"
files = claims.model_files(status)  # which model files produced each real-model number
table["note"] = [
    f"{n}; model files: {files[c]}" if c in files and n else (f"model files: {files[c]}" if c in files else n)
    for c, n in zip(table["id"], table["note"].fillna(""))
]
table.to_csv(smk.output.csv, index=False)
