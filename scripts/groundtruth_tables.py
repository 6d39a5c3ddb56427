"""Rule groundtruth_tables: the per-model ground-truth tables merged, every method's
agreement with the Shapley values (per model and per group: mean over models with a
bootstrap CI), the corrected toy-IOI backup labels, and the findings ("new" rows of the
published summary). Thin: the computation is selfrepair.groundtruth.tables."""

import pandas as pd

from selfrepair.core import runtime
from selfrepair.groundtruth import tables as gt

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
p = smk.params
out = smk.output


def merged(files):
    frames = []
    for f in files:
        try:
            frames.append(pd.read_csv(f))
        except pd.errors.EmptyDataError:  # a paper-A model without a usable OOD length
            continue
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


shapley = merged(smk.input.shapley)
inter = merged(smk.input.interactions)
scores = merged(smk.input.scores)
timing = merged(smk.input.timing)
if shapley.empty:
    raise ValueError("no model has a ground truth (every paper-A model skipped and no other family)")
per_model = gt.agreement_models(scores, shapley, int(p.top_k), float(p.hidden_single_frac))
summary = gt.agreement_summary(per_model, int(p.n_boot))
is_ioi = shapley["family"] == "ioi"
recall = None
if is_ioi.any():
    labels, sweep = gt.ioi_labels(
        shapley[is_ioi], inter[inter["family"] == "ioi"], int(p.n_primary), float(p.backup_frac), p.label_fracs
    )
    recall = gt.backup_recall(scores[scores["family"] == "ioi"], labels).assign(source="groundtruth")
    paper_b = gt.paper_b_recall(pd.concat([pd.read_csv(f) for f in smk.input.coax_scores]), labels)
    recall = pd.concat([recall, paper_b.assign(source="paper B scores")], ignore_index=True)
else:
    labels = sweep = pd.DataFrame()
    paper_b = None
for name, t in (
    ("agreement", summary),
    ("agreement_models", per_model),
    ("shapley", shapley),
    ("interactions", inter),
    ("scores", scores),
    ("ioi_labels", labels),
    ("ioi_label_sweep", sweep),
    ("ioi_backup_recall", recall if recall is not None else pd.DataFrame()),
    ("runtime", timing),
):
    t.to_csv(out[name], index=False)
gt.findings(per_model, paper_b, int(p.n_boot)).to_csv(out.published, index=False)
