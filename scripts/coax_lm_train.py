"""Rule coax_lm_train: a small GPT-2 LM trained on the synthetic grammar (pruning study)."""

import logging

import pandas as pd

from selfrepair.coax import lm_training
from selfrepair.core import runtime
from selfrepair.core.models import save_model

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
m, t = dict(p.model), dict(p.train)
model, res = lm_training.train_model(
    m["n_layers"],
    m["n_heads"],
    m["d_model"],
    m["d_mlp"],
    p.seed,
    n_ctx=m["n_ctx"],
    lr=t["lr"],
    batch_size=t["batch_size"],
    max_steps=t["max_steps"],
    eval_every=t["eval_every"],
    device=device,
)
logging.info("trained: %s", res.log[-1])
save_model(model.cpu(), smk.output.model, {"task": "grammar_lm", "seed": p.seed, **m, **t})
pd.DataFrame(res.log).to_csv(smk.output.log_csv, index=False)
