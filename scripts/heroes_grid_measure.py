"""Rule heroes_grid_measure: one model, every protocol cell that uses it.

Measures once (G per batch, exact match of every evaluation sequence with each component
ablated at each site the cells need), then computes each cell's G, C, roles and the
joint ablation of its bloats and heroes, and, on the default models, rho at each
evaluation-sample count over disjoint chunks."""

import logging

import numpy as np
import pandas as pd

from selfrepair.core import analysis, attribution, engine, models, runtime
from selfrepair.core import components as C
from selfrepair.heroes import protocol
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
task, seed = p.task, int(p.seed)
ood = runtime.read_json(smk.input.ood)
joint_cols = [
    "cell",
    "task",
    "seed",
    "group",
    "n",
    "members",
    "baseline_acc",
    "mean_individual",
    "sum_individual",
    "joint",
    "superadditivity",
    "n_eval",
]
sweep_cols = ["task", "seed", "n", "chunk", "rho", "pairs_within_noise", "C_within_noise_of_zero"]
thresholds = list(p.thresholds)

if ood["status"] != "kept":
    logging.info("seed skipped: %s", ood["reason"])
    pd.DataFrame(
        [{"cell": cell, "task": task, "seed": seed, "status": "skipped", "reason": ood["reason"]} for cell in p.cells]
    ).to_csv(smk.output.components, index=False)
    pd.DataFrame(columns=joint_cols).to_csv(smk.output.joint, index=False)
    pd.DataFrame(columns=sweep_cols).to_csv(smk.output.sweep, index=False)
else:
    data = runtime.load_tensors(smk.input.batches)
    # G, the means and every ablation as the main run computes them (heroes_scores): on
    # the Hugging Face modules, ablations on the engine at either site
    hf = models.load_hf(smk.input.model, device)
    cfg = hf.config
    comps = C.all_components(cfg.n_layer, cfg.n_head)
    names = [c.name for c in comps]
    numel = [
        protocol.weight_numel(c, cfg.n_embd, cfg.n_embd // cfg.n_head, cfg.n_inner or 4 * cfg.n_embd) for c in comps
    ]
    nb = data["tokens"].shape[0]
    batches = [S.Batch(data["tokens"][i], data["targets"][i], data["mask"][i]).to(device) for i in range(nb)]
    raw = attribution.gradient_norms_gpt2(hf, batches, comps, heroes.lm_loss, "raw")
    g_raw = np.array([np.mean(raw[n]) for n in names])
    # The same generator seed as heroes_ood's evaluation set: its first n_eval sequences
    # are the ones the main paper-A run scored.
    fresh = S.eval_set(task, ood["N"], p.n_measure, seed=seed + 37).to(device)
    means = engine.means(hf, [b.tokens for b in batches], comps)
    sets = [[]] + [[c] for c in comps]
    # each site on as many sequences as its cells (and, for hook_z, the sweep) need
    need = {}
    for proto in p.cells.values():
        need[proto["site"]] = max(need.get(proto["site"], 0), int(proto["n_eval"]))
    if p.sweep:
        need["hook_z"] = max(need.get("hook_z", 0), max(p.sweep))
    correct = {}
    for site, n in sorted(need.items()):
        sub = S.Batch(fresh.tokens[:n], fresh.targets[:n], fresh.mask[:n])
        correct[site] = heroes.ablation_correct(hf, sub, sets, p.ablation, means, site=site).cpu().numpy()
        logging.info("site %s: %d sequences at N=%d", site, n, ood["N"])

    comp_frames, joint_rows = [], []
    for cell, proto in p.cells.items():
        df = protocol.cell_components(names, g_raw, numel, correct[proto["site"]], proto, thresholds)
        parsed = [C.parse(n) for n in df["component"]]
        df.insert(0, "cell", cell)
        df.insert(1, "task", task)
        df.insert(2, "seed", seed)
        df.insert(4, "layer", [x.layer for x in parsed])
        df.insert(5, "kind", ["head" if x.is_head else "mlp" for x in parsed])
        df["rho"] = analysis.spearman(df["G"], df["C"])
        df["baseline_acc"] = float(correct[proto["site"]][0, : proto["n_eval"]].mean())
        df["N"] = ood["N"]
        df["n_eval"] = proto["n_eval"]
        df["status"] = "kept"
        comp_frames.append(df)
        n_eval = int(proto["n_eval"])
        sub = S.Batch(fresh.tokens[:n_eval], fresh.targets[:n_eval], fresh.mask[:n_eval])
        role = df[f"role_t{p.threshold:g}"]
        for group in ("bloat", "hero"):
            members = [C.parse(n) for n in df.loc[role == group, "component"]]
            row = {
                "cell": cell,
                "task": task,
                "seed": seed,
                "group": group,
                "n": len(members),
                "members": " ".join(m.name for m in members),
                "n_eval": n_eval,
            }
            base = float(correct[proto["site"]][0, :n_eval].mean())
            row["baseline_acc"] = base
            if members:
                ind = df.set_index("component").loc[[m.name for m in members], "C"].astype(float)
                joint_acc = float(
                    heroes.ablation_correct(hf, sub, [members], p.ablation, means, site=proto["site"]).double().mean()
                )
                row.update(mean_individual=float(ind.mean()), sum_individual=float(ind.sum()), joint=base - joint_acc)
                row["superadditivity"] = (
                    row["joint"] / row["sum_individual"] if row["sum_individual"] > 0 else float("nan")
                )
            joint_rows.append(row)
    pd.concat(comp_frames).to_csv(smk.output.components, index=False)
    pd.DataFrame(joint_rows, columns=joint_cols).to_csv(smk.output.joint, index=False)

    if p.sweep:
        g = g_raw / np.sqrt(numel) if p.sweep_normalization == "sqrt" else g_raw
        sweep = protocol.rho_by_sample_size(g, correct["hook_z"], [n for n in p.sweep if n <= p.n_measure])
        sweep.insert(0, "seed", seed)
        sweep.insert(0, "task", task)
        sweep[sweep_cols].to_csv(smk.output.sweep, index=False)
    else:
        pd.DataFrame(columns=sweep_cols).to_csv(smk.output.sweep, index=False)
