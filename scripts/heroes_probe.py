"""Rule heroes_probe: for one seed, (1) joint vs individual ablation of its bloats and of
its heroes, (2) pruning curves (components removed in order of G, or of C), (3) how each
head attends. On the plain Hugging Face modules through the ablation engine
(selfrepair.core.engine): each pruning curve's sets grow by one component, so every point
resumes at the layer of the component it adds; the component means are heroes_scores'
(outcomes.pt), the very ones behind C."""

import pandas as pd

from selfrepair.core import components as C
from selfrepair.core import engine, models, runtime
from selfrepair.heroes import scores as heroes
from selfrepair.tasks.sequences import Batch

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
o = smk.output
roles = pd.read_csv(smk.input.roles)
red_cols = [
    "task",
    "seed",
    "group",
    "members",
    "n",
    "baseline_acc",
    "sum_individual",
    "mean_individual",
    "joint",
    "superadditivity",
    "ablation",
]
prune_cols = ["task", "seed", "order", "k", "removed", "accuracy", "ablation"]
att_cols = ["task", "seed", "component", "role", "entropy", "sink_mass", "argmax_distance"]
pat_cols = ["task", "seed", "component", "role", "query", "key", "weight"]
if "status" not in roles or roles["status"].iloc[0] != "kept":
    for path, cols in (
        (o.redundancy, red_cols),
        (o.pruning, prune_cols),
        (o.attention, att_cols),
        (o.patterns, pat_cols),
    ):
        pd.DataFrame(columns=cols).to_csv(path, index=False)
    raise SystemExit(0)

data = runtime.load_tensors(smk.input.batches)
model = models.load_hf(smk.input.model, device)
fresh = Batch(data["eval_tokens"], data["eval_targets"], data["eval_mask"]).to(device)
outcomes = runtime.load_tensors(smk.input.outcomes)
if "means" not in outcomes:
    raise SystemExit(
        f"{smk.input.outcomes} holds no component means (written before the ablation engine): "
        "rerun heroes_scores for this seed (snakemake --forcerun heroes_scores ...)"
    )
means = {k: v.to(device) for k, v in outcomes["means"].items()}

rows = []
for group in ("bloat", "hero"):
    members = [C.parse(n) for n in roles.loc[roles["role"] == group, "component"]]
    r = heroes.joint_vs_individual(model, fresh, members, p.ablation, means)
    rows.append(
        {
            "task": p.task,
            "seed": p.seed,
            "group": group,
            "members": " ".join(c.name for c in members),
            **r,
            "ablation": p.ablation,
        }
    )
pd.DataFrame(rows).reindex(columns=red_cols).to_csv(o.redundancy, index=False)

by = {n: C.parse(n) for n in roles["component"]}
orders = {
    "G ascending": roles.sort_values(["G", "component"])["component"],
    "G descending": roles.sort_values(["G", "component"], ascending=[False, True])["component"],
    "C ascending": roles.sort_values(["C", "component"])["component"],
}
prows = []
for name, order in orders.items():
    order = [by[n] for n in order]
    for k, acc in enumerate(heroes.pruning_curve(model, fresh, order, p.ablation, means)):
        prows.append(
            {
                "task": p.task,
                "seed": p.seed,
                "order": name,
                "k": k,
                "removed": order[k - 1].name if k else "",
                "accuracy": acc,
                "ablation": p.ablation,
            }
        )
pd.DataFrame(prows, columns=prune_cols).to_csv(o.pruning, index=False)

tokens = data["tokens"][0].to(device)
patterns = engine.AblationEngine(model).attention_patterns(tokens)
st = heroes.attention_stats(patterns)
role = roles.set_index("component")["role"]
st["role"] = st["component"].map(role)
st["task"], st["seed"] = p.task, p.seed
st[att_cols].to_csv(o.attention, index=False)
pats = []
for name in st["component"]:
    c = C.parse(name)
    pat = heroes.mean_attention_pattern(patterns, c.layer, c.head)
    pats += [
        (p.task, p.seed, name, role[name], q, k, float(pat[q, k])) for q in range(pat.shape[0]) for k in range(q + 1)
    ]
pd.DataFrame(pats, columns=pat_cols).to_csv(o.patterns, index=False)
