"""Rule coax_ioi_train: a toy IOI GPT-2 trained from scratch with attention-head dropout."""

import logging

import pandas as pd

from selfrepair.coax import ioi_experiment
from selfrepair.core import runtime
from selfrepair.core.models import save_model

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
m, t = dict(p.model), dict(p.train)
model, res = ioi_experiment.train_toy(
    m["n_layers"],
    m["n_heads"],
    m["d_model"],
    m["d_mlp"],
    seed=int(p.seed),
    head_dropout=t["head_dropout"],
    lr=t["lr"],
    batch_size=t["batch_size"],
    max_steps=t["max_steps"],
    eval_every=t["eval_every"],
    device=device,
)
logging.info("trained: %s", res.log[-1])
save_model(
    model.cpu(),
    smk.output.model,
    {"task": "ioi_toy", "seed": int(p.seed), "steps": res.steps, "accuracy": res.final_accuracy, **m, **t},
)
pd.DataFrame(res.log).to_csv(smk.output.log_csv, index=False)
