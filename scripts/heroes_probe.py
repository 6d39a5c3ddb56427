"""Rule heroes_probe: for one seed, (1) joint vs individual ablation of its bloats and of
its heroes, (2) pruning curves (components removed in order of G, or of C), (3) how each
head attends. On the plain Hugging Face modules through the ablation engine
(selfrepair.core.engine), in one call (heroes.probe_ablations): each pruning curve's sets
grow by one component, so every point resumes at the layer of the component it adds; the
component means, the intact model's and the single ablations' outcomes are heroes_scores'
(outcomes.pt), the very ones behind C, and are not measured again."""

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
means = {k: v.to(device) for k, v in heroes.saved_means(outcomes, smk.input.outcomes).items()}

# The intact model and the single ablations were measured by heroes_scores on this very
# batch, mode and means (outcomes.pt): one engine call runs only the joint ablations and
# the pruning curves' points.
outcome_rows = outcomes[p.ablation].T  # [1 + components, sequences]
known = dict(zip(outcomes["columns"], outcome_rows))
groups = {g: [C.parse(n) for n in roles.loc[roles["role"] == g, "component"]] for g in ("bloat", "hero")}
by = {n: C.parse(n) for n in roles["component"]}
orders = {
    "G ascending": roles.sort_values(["G", "component"])["component"],
    "G descending": roles.sort_values(["G", "component"], ascending=[False, True])["component"],
    "C ascending": roles.sort_values(["C", "component"])["component"],
}
orders = {name: [by[n] for n in order] for name, order in orders.items()}
joint, curves = heroes.probe_ablations(model, fresh, groups, orders, p.ablation, means, known)

rows = [
    {
        "task": p.task,
        "seed": p.seed,
        "group": g,
        "members": " ".join(c.name for c in members),
        **joint[g],
        "ablation": p.ablation,
    }
    for g, members in groups.items()
]
pd.DataFrame(rows).reindex(columns=red_cols).to_csv(o.redundancy, index=False)

prows = [
    {
        "task": p.task,
        "seed": p.seed,
        "order": name,
        "k": k,
        "removed": orders[name][k - 1].name if k else "",
        "accuracy": acc,
        "ablation": p.ablation,
    }
    for name, curve in curves.items()
    for k, acc in enumerate(curve)
]
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
