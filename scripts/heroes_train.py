"""Rule heroes_train: train paper A's model on one task from one seed."""

import logging
import shutil
from pathlib import Path

import pandas as pd
import torch

from selfrepair.core import models, runtime, train
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
task, seed = p.task, int(p.seed)
m, t = p.model, p.train

config = models.gpt2_toy_config(
    S.VOCAB,
    n_layers=m["n_layers"],
    n_heads=m["n_heads"],
    d_model=m["d_model"],
    d_mlp=m["d_mlp"],
    n_ctx=2 * p.max_length + 4,
    bos_token_id=S.START,
    eos_token_id=S.END,
)
model = models.build_gpt2_toy(config, init=m["init"], seed=seed, positional=False)
gen = torch.Generator().manual_seed(seed)


def batch_fn(step):
    return S.training_batch(task, t["batch_size"], t["min_len"], t["max_len"], gen, t["padding"])


def eval_fn(mod):
    return heroes.id_accuracy(
        mod, task, t["min_len"], t["max_len"], t["eval_size"], seed=seed + 7, padding=t["padding"]
    )


result = train.train(
    model,
    batch_fn,
    eval_fn,
    lr=t["lr"],
    max_steps=t["max_steps"],
    eval_every=t["eval_every"],
    target_accuracy=t["target_accuracy"],
    device=device,
    log_fn=lambda row: logging.info("%s", row),
)
meta = {
    "task": task,
    "seed": seed,
    "steps": result.steps,
    "reached_target": result.reached_target,
    "id_accuracy": result.final_accuracy,
    "train_seconds": result.seconds,
    "protocol": {"padding": t["padding"], "init": m["init"]},
    "numerics": runtime.numerics_record(),
    "model": dict(m),
    "train": dict(t),
}
out = Path(smk.output.model)
tmp = out.with_name(out.name + ".partial")
shutil.rmtree(tmp, ignore_errors=True)
models.save_model(model.cpu(), tmp, meta)
shutil.rmtree(out, ignore_errors=True)
tmp.rename(out)
pd.DataFrame(result.log).assign(task=task, seed=seed).to_csv(smk.output.log_csv, index=False)
runtime.write_json(smk.output.meta, meta)
logging.info("done: %s", meta)
