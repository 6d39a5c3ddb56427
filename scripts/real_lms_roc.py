"""Rule real_lms_roc: paper B's ROC curves of COAX and the first-order baselines per real
LM and seeding: the points table (coax.lm_roc, from coax_lm's ioi_scores.csv), then the
figure drawn from it."""

import sys
from pathlib import Path

import pandas as pd

from selfrepair.coax.lm_roc import roc_points
from selfrepair.core import real_lms_figures as F
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
parts, absent = [], []
for lm in smk.params.lms:
    f = Path(smk.input[f"coax_{lm}"]) / "ioi_scores.csv"
    if not f.exists() or f.stat().st_size <= 1:
        absent.append(lm)  # the IOI part did not run (coax_lm's status.csv says why)
        continue
    parts.append(roc_points(lm, pd.read_csv(f)))
points = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=F.ROC_COLUMNS)
points.to_csv(smk.output.csv, index=False)
title = "Backup heads found by COAX and the first-order baselines"
if absent:
    title += f" (IOI not run on {', '.join(absent)})"
    print(f"no ioi_scores.csv: {', '.join(absent)}", file=sys.stderr)
F.save(F.roc_figure(points, title), smk.output.png)
