"""Rule groundtruth_model: one trained model's Shapley values, pairwise interactions and
every method's node scores, all on one evaluation batch (thin adapter over
selfrepair.groundtruth.pipeline).

Families: ``heroes`` (paper A; the first ``n_eval`` of the fresh OOD sequences behind
C; games: mean log-probability of the targets, exact-match accuracy), ``ioi`` (paper
B's toy IOI; the truth prompt set; logit difference), ``gim`` (paper C's toy tasks; the
clean prompts of the scoring pairs; logit difference)."""

import json

import pandas as pd

from selfrepair.core import components as C
from selfrepair.core import interventions, models, runtime
from selfrepair.gim import evaluate
from selfrepair.groundtruth import games, pipeline
from selfrepair.tasks import ioi
from selfrepair.tasks.registry import get_task
from selfrepair.tasks.sequences import Batch

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
out = smk.output
status = "kept"
if p.family == "heroes":
    data = runtime.load_tensors(smk.input.data)
    status = data["status"]
    if status == "kept":
        n = min(int(p.n_eval), data["eval_tokens"].shape[0])
        batch = Batch(data["eval_tokens"][:n], data["eval_targets"][:n], data["eval_mask"][:n]).to(device)
        tokens = batch.tokens
        specs = pipeline.heroes_specs(batch, p.games)  # each with its engine form
elif p.family == "ioi":
    prompts = ioi.sample_toy(int(p.n_eval), int(p.data_seed)).to(device)
    tokens = prompts.tokens
    specs = [pipeline.GameSpec("logit_diff", lambda lg: ioi.logit_diff(lg, prompts), engine=games.ioi_reduce(prompts))]
elif p.family == "gim":
    cf = get_task(p.task).sample(int(p.n_eval), seed=int(p.data_seed))
    cf = type(cf)(*(t.to(device) for t in (cf.clean, cf.corrupt, cf.answer, cf.foil, cf.pos)))
    tokens = cf.clean
    specs = [
        pipeline.GameSpec(
            "logit_diff", lambda lg: evaluate.logit_diff(lg, cf).mean(), engine=games.counterfactual_reduce(cf)
        )
    ]
else:
    raise ValueError(f"unknown ground-truth family {p.family!r}")

info = {"family": p.family, "group": p.group, "model": p.model_id, "status": status, "mode": p.mode}
if status != "kept":
    for name in ("shapley", "interactions", "scores", "timing"):
        pd.DataFrame().to_csv(out[name], index=False)
else:
    bridge = models.load_bridge(smk.input.model, device)
    comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [tokens], comps)  # both modes' single drops are scored
    settings = pipeline.Settings(mode=p.mode, **p.settings)
    # every coalition value comes from paper A's ablation engine (core/engine.py, prefix
    # reuse; every model here is a Hugging Face GPT-2); the methods run on the bridge
    hf = models.load_hf(smk.input.model, device)
    tables = pipeline.model_tables(bridge, tokens, specs, comps, means, settings, hf_model=hf)
    for name in ("shapley", "interactions", "scores", "timing"):
        t = tables[name].copy()
        t.insert(0, "model", p.model_id)
        t.insert(0, "group", p.group)
        t.insert(0, "family", p.family)
        t.to_csv(out[name], index=False)
    info.update(n_eval=int(tokens.shape[0]), n_components=len(comps), primaries=tables["primaries"])
with open(out.info, "w") as f:
    json.dump(info, f, indent=1)
