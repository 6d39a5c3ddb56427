"""Rule heroes_scores: gradient magnitude G and causal importance C (mean and zero
ablation) per component, on the same saved OOD data, on the plain Hugging Face modules
(attribution.gradient_norms_gpt2 and the ablation engine, selfrepair.core.engine).

outcomes.pt keeps the per-sequence exact match behind C: per ablation mode a
bool matrix [n_eval sequences, 1 + components], column 0 the intact model, column 1 + i
the model with component i ablated (``columns`` names them). C is computed from that very
matrix (heroes.causal_table, the arithmetic of heroes.causal_scores). It also keeps the
component means of the mean ablation (``means``), which heroes_probe reuses."""

import numpy as np
import pandas as pd

from selfrepair.core import attribution, engine, models, runtime
from selfrepair.core import components as C
from selfrepair.heroes import scores as heroes
from selfrepair.tasks.sequences import Batch

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
data = runtime.load_tensors(smk.input.batches)
g_cols = ["component", "G", "G_sd", "n_batches", "normalization", "status"]
c_cols = ["component", "mode", "baseline_acc", "ablated_acc", "C", "C_se", "n"]
if data["status"] != "kept":
    pd.DataFrame(columns=g_cols).to_csv(smk.output.gradients, index=False)
    pd.DataFrame(columns=c_cols).to_csv(smk.output.ablations, index=False)
    runtime.save_tensors(smk.output.outcomes, {"status": data["status"]})
else:
    model = models.load_hf(smk.input.model, device)
    comps = C.all_components(model.config.n_layer, model.config.n_head)
    nb = data["tokens"].shape[0]
    batches = [Batch(data["tokens"][i], data["targets"][i], data["mask"][i]).to(device) for i in range(nb)]
    norms = attribution.gradient_norms_gpt2(model, batches, comps, heroes.lm_loss, p.normalization)
    rows = [
        {
            "component": c.name,
            "G": float(np.mean(norms[c.name])),
            "G_sd": float(np.std(norms[c.name], ddof=1)) if nb > 1 else float("nan"),
            "n_batches": nb,
            "normalization": p.normalization,
            "status": "kept",
        }
        for c in comps
    ]
    pd.DataFrame(rows, columns=g_cols).to_csv(smk.output.gradients, index=False)
    fresh = Batch(data["eval_tokens"], data["eval_targets"], data["eval_mask"]).to(device)
    means = engine.means(model, [b.tokens for b in batches], comps)
    names = [c.name for c in comps]
    tables, outcomes = [], {"status": "kept", "columns": ["baseline"] + names, "means": means}
    for mode in ("mean", "zero"):
        correct = heroes.ablation_correct(model, fresh, [[]] + [[c] for c in comps], mode, means)
        tables.append(heroes.causal_table(correct, names, mode))
        outcomes[mode] = correct.T.contiguous().cpu()
    pd.concat(tables)[c_cols].to_csv(smk.output.ablations, index=False)
    runtime.save_tensors(smk.output.outcomes, outcomes)
