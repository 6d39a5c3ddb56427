"""Rule coax_induction_train: an attention-only GPT-2 trained on repeated random sequences."""

import logging

import pandas as pd

from selfrepair.coax import induction_experiment
from selfrepair.core import runtime
from selfrepair.core.models import save_model

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
s, t = dict(p.spec), dict(p.train)
model, res = induction_experiment.train_model(
    s["n_layers"],
    s["n_heads"],
    s["d_model"],
    s["seed"],
    T=tuple(p.T),
    vocab=p.vocab,
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
    {"task": "induction", **s, **t, "T": list(p.T), "vocab": p.vocab, "accuracy": res.final_accuracy},
)
pd.DataFrame(res.log).to_csv(smk.output.log_csv, index=False)
