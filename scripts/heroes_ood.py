"""Rule heroes_ood: choose the OOD length, then generate the OOD batches and the fresh
evaluation set once, so that G and C see the same data."""

import logging

import torch

from selfrepair.core import models, runtime
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
model = models.load_hf(smk.input.model, device)
task, seed = p.task, int(p.seed)
accs = heroes.ood_accuracies(model, task, p.lengths, p.n_select, seed=seed + 11)
n = heroes.select_ood_length(accs, p.lengths, p.window)
info = {
    "task": task,
    "seed": seed,
    "accuracy_by_length": {str(k): v for k, v in accs.items()},
    "window": list(p.window),
    "n_select": p.n_select,
    "status": "kept" if n is not None else "skipped",
    "N": n,
    "reason": "" if n is not None else f"no length in {list(p.lengths)} has accuracy in [{p.window[0]}, {p.window[1]}]",
}
logging.info("%s", info)
tensors = {"status": info["status"]}
if n is not None:
    batches = S.fixed_length_batches(task, n, p.n_batches, p.batch_size, seed=seed + 23)
    fresh = S.eval_set(task, n, p.n_eval, seed=seed + 37)
    tensors.update(
        N=n,
        tokens=torch.stack([b.tokens for b in batches]),
        targets=torch.stack([b.targets for b in batches]),
        mask=torch.stack([b.mask for b in batches]),
        eval_tokens=fresh.tokens,
        eval_targets=fresh.targets,
        eval_mask=fresh.mask,
    )
runtime.save_tensors(smk.output.batches, tensors)
runtime.write_json(smk.output.ood, info)
