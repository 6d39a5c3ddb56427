"""Rules groundtruth_{heroes,ioi,gim}: for each trained model of one group, its Shapley
values, pairwise interactions and every method's node scores, all on the model's
evaluation batch (thin adapter over selfrepair.groundtruth.pipeline).

Families: ``heroes`` (paper A; a task's seeds; the first ``n_eval`` of the fresh OOD
sequences behind C; games: mean log-probability of the targets, exact-match accuracy),
``ioi`` (paper B's toy IOI; every seed; the truth prompt set; logit difference), ``gim``
(paper C's toy tasks; a task's models and seeds; the clean prompts of the scoring pairs;
logit difference). The models run one after another in this one process, so the
imports are paid once per group; each model's tables are those of a job of its own.

``timing.csv`` per model: every part's wall ``seconds`` and ``cpu_s`` (this process's
CPU seconds in it, ``time.process_time``: exact, where Snakemake's benchmark samples),
``load`` (checkpoint, bridge, means), and in the group's first model with tables ``job start``: the
process's CPU seconds before its first model (interpreter, imports)."""

import json
import time
from pathlib import Path

import pandas as pd
import psutil

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
TABLES = ("shapley", "interactions", "scores", "timing")


def outputs(model_id: str) -> dict[str, str]:
    """{table or 'info': path} of ``model_id`` among the rule's outputs."""
    d = {Path(f).stem: f for f in smk.output if Path(f).parent.as_posix().endswith(f"models/{model_id}")}
    missing = set(TABLES + ("info",)) - set(d)
    if missing:
        raise ValueError(f"rule {smk.rule} declares no {sorted(missing)} output for {model_id}")
    return d


def inputs(m: dict):
    """(status, tokens, game specs) of one model's evaluation batch."""
    if p.family == "heroes":
        data = runtime.load_tensors(m["data"])
        if data["status"] != "kept":
            return data["status"], None, None
        n = min(int(p.n_eval), data["eval_tokens"].shape[0])
        batch = Batch(data["eval_tokens"][:n], data["eval_targets"][:n], data["eval_mask"][:n]).to(device)
        return "kept", batch.tokens, pipeline.heroes_specs(batch, p.games)  # each with its engine form
    if p.family == "ioi":
        prompts = ioi.sample_toy(int(p.n_eval), int(p.data_seed)).to(device)
        spec = pipeline.GameSpec("logit_diff", lambda lg: ioi.logit_diff(lg, prompts), engine=games.ioi_reduce(prompts))
        return "kept", prompts.tokens, [spec]
    if p.family == "gim":
        cf = get_task(p.task).sample(int(p.n_eval), seed=int(p.data_seed))
        cf = type(cf)(*(t.to(device) for t in (cf.clean, cf.corrupt, cf.answer, cf.foil, cf.pos)))
        spec = pipeline.GameSpec(
            "logit_diff", lambda lg: evaluate.logit_diff(lg, cf).mean(), engine=games.counterfactual_reduce(cf)
        )
        return "kept", cf.clean, [spec]
    raise ValueError(f"unknown ground-truth family {p.family!r}")


def run(m: dict, start: list) -> None:
    """One model's tables; ``start``: the job-start row, until a model's timing takes it."""
    out = outputs(m["id"])
    t0, c0 = time.perf_counter(), time.process_time()
    status, tokens, specs = inputs(m)
    info = {"family": p.family, "group": p.group, "model": m["id"], "status": status, "mode": p.mode}
    if status != "kept":
        for name in TABLES:
            pd.DataFrame().to_csv(out[name], index=False)
    else:
        bridge = models.load_bridge(m["model"], device)
        comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
        means = interventions.component_means(bridge, [tokens], comps)  # both modes' single drops are scored
        settings = pipeline.Settings(mode=p.mode, **p.settings)
        # every coalition value comes from paper A's ablation engine (core/engine.py, prefix
        # reuse; every model here is a Hugging Face GPT-2); the methods run on the bridge
        hf = models.load_hf(m["model"], device)
        load = {"part": "load", "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        tables = pipeline.model_tables(bridge, tokens, specs, comps, means, settings, hf_model=hf)
        tables["timing"] = pd.concat([pd.DataFrame(start), pd.DataFrame([load]), tables["timing"]], ignore_index=True)
        start.clear()
        for name in TABLES:
            t = tables[name].copy()
            t.insert(0, "model", m["id"])
            t.insert(0, "group", p.group)
            t.insert(0, "family", p.family)
            t.to_csv(out[name], index=False)
        info.update(n_eval=int(tokens.shape[0]), n_components=len(comps), primaries=tables["primaries"])
    with open(out["info"], "w") as f:
        json.dump(info, f, indent=1)


# what the process spent before its first model: the interpreter, the imports
age = time.time() - psutil.Process().create_time()
start = [{"part": "job start", "seconds": age, "cpu_s": time.process_time()}]
for m in p.models:
    run(m, start)
