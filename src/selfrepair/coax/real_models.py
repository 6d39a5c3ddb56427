"""Paper B's rules on the papers' own models (GPT-2 ...), when their weights are on this
machine: IOI with GPT-2 small's documented heads, wake-up across model sizes, induction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from selfrepair.coax import induction_experiment, ioi_experiment
from selfrepair.coax.score import IOI_AUC_CLAIMS, ioi_summary, scan, wake_up_curve
from selfrepair.core.components import head_components, parse
from selfrepair.core.models import CorruptCheckpoint, ModelNotFound, load_bridge
from selfrepair.core.published import Holds
from selfrepair.tasks import ioi

IOI_CLAIMS = list(IOI_AUC_CLAIMS) + [
    "ioi_top20_hits",
    "ioi_coax_beats_atp_star",
    "freeze_repair_removed",
    "recovery_drop_primaries",
    "recovery_drop_with_coax",
    "knockout_clean",
    "knockout_primaries",
    "knockout_coax",
    "knockout_oracle",
    "knockout_own_topk",
    "wakeup_ratio_0",
    "wakeup_ratio_1",
    "wakeup_ratio_2",
    "wakeup_ratio_3",
    "wakeup_random_flat",
]
WAKEUP_CLAIMS = ["wakeup_scales"]
INDUCTION_CLAIMS = ["induction_ratio_range"]
PRUNING_CLAIMS = ["pruning_beats_baselines", "pruning_coax_ppl_50", "pruning_taylor_ppl_50"]
PRUNING_NOT_RUN = (
    "WikiText-2 and GPT-2 pruning need data and weights that are not on this machine (no downloads); "
    "the toy grammar LM stands in"
)


def _ioi_heads_for(bridge, prompts, heads, n_primary=3, backup_frac=0.2, max_rows=2048):
    """GPT-2 small's documented name movers and backups when the model has those heads,
    else the brute-force ground truth (tiny test models)."""
    nl, nh = bridge.cfg.n_layers, bridge.cfg.n_heads
    doc_p = [parse(n) for n in ioi.GPT2_NAME_MOVERS]
    doc_b = [parse(n) for n in ioi.GPT2_BACKUP_NAME_MOVERS]
    if nl == 12 and nh == 12:
        return doc_p, doc_b, "documented (Wang et al. 2022)"
    _, _, p, b = ioi_experiment.ground_truth(bridge, prompts, heads, n_primary, backup_frac, max_rows)
    return p, b, "brute force"


def run_real_models(
    real: dict, ioi_cfg: dict, ind_cfg: dict, protocol: str, top_r: int, out_dir, device="cpu", max_rows: int = 2048
) -> pd.DataFrame:
    """Paper B's rules on the papers' own models, each loaded offline if present.

    Writes tables under ``out_dir`` (same formats as the toy tables) and returns the
    status table: model, experiment, status ('ran' | 'not run'), reason, claims.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    cache: dict = {}

    def fit_rows(b, length):  # keep one forward's logits under ~1 GB (50k-token vocabularies)
        return max(1, min(max_rows, int(2.5e8 // (length * int(b.cfg.d_vocab)))))

    def boot(name):
        if name not in cache:
            try:
                cache[name] = load_bridge(name, device, real.get("search_paths") or [])
            except (ModelNotFound, CorruptCheckpoint) as err:
                cache[name] = err
        return cache[name]

    # IOI on GPT-2 small (documented heads)
    name = real["ioi_model"]
    b = boot(name)
    if isinstance(b, Exception):
        rows.append(
            {
                "model": name,
                "experiment": "ioi",
                "status": "not run",
                "reason": f"not run: {b}",
                "claims": " ".join(IOI_CLAIMS),
            }
        )
    else:
        heads = head_components(b.cfg.n_layers, b.cfg.n_heads)
        parts: dict[str, list] = {k: [] for k in ("discovery", "wake", "freeze", "knockout")}
        truth_prompts = ioi.gpt2_prompts(b.tokenizer, real["n_prompts"], 5).to(device)
        mr = fit_rows(b, truth_prompts.tokens.shape[1])
        prim, back, how = _ioi_heads_for(b, truth_prompts, heads, ioi_cfg["n_primary"], ioi_cfg["backup_frac"], mr)
        for ds in real["data_seeds"]:
            pr = ioi.gpt2_prompts(b.tokenizer, real["n_prompts"], ds).to(device)
            res = ioi_experiment.run_ioi(
                b,
                pr,
                heads,
                prim,
                back,
                protocol,
                top_r,
                ioi_cfg["top_k"],
                ioi_cfg["k_recovered"] or len(back),
                ioi_cfg["wake_min"],
                ioi_cfg["ig_steps"],
                mr,
                ioi_cfg["amp_eps"],
            )
            for k in parts:
                t = res[k].copy()
                t.insert(0, "data_seed", ds)
                t.insert(0, "model_seed", 0)
                parts[k].append(t)
        cat = {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}
        ioi_summary(cat["discovery"]).to_csv(out_dir / "ioi_summary.csv", index=False)
        for k, t in cat.items():
            t.to_csv(out_dir / f"ioi_{k}.csv", index=False)
        rows.append(
            {
                "model": name,
                "experiment": "ioi",
                "status": "ran",
                "reason": f"heads: {how}; primaries {' '.join(h.name for h in prim)}",
                "claims": " ".join(IOI_CLAIMS),
            }
        )

    # wake-up across model sizes
    wake_rows, missing = [], []
    for name in real["wakeup_models"]:
        b = boot(name)
        if isinstance(b, Exception):
            missing.append(f"{name}: {b}")
            continue
        heads = head_components(b.cfg.n_layers, b.cfg.n_heads)
        pr = ioi.gpt2_prompts(b.tokenizer, real["n_prompts"], 21).to(device)
        mr = fit_rows(b, pr.tokens.shape[1])
        drops = ioi_experiment.ablation_drops(b, pr, [[h] for h in heads], max_rows=mr)
        order = sorted(range(len(heads)), key=lambda i: -drops[i])
        prim = [heads[i] for i in order[: ioi_cfg["n_primary"]]]
        cands = [h for h in heads if h not in prim]
        sc = scan(b, pr.tokens, cands, prim, protocol, top_r, max_rows=mr)
        watch_names = list(sc.table.sort_values("comp", ascending=False)["unit"].head(8))
        rng = np.random.default_rng(0)
        rand = [cands[i] for i in rng.choice(len(cands), min(8, len(cands)), replace=False)]
        watch = [h for h in cands if h.name in watch_names]
        wc = wake_up_curve(
            b, pr.tokens, prim, watch + [h for h in rand if h not in watch], positions=[pr.tokens.shape[1] - 1]
        )
        wc["group"] = wc["unit"].map(lambda u: "coax_top8" if u in watch_names else "random")
        wc.insert(0, "model", name)
        wake_rows.append(wc)
    if wake_rows:
        pd.concat(wake_rows, ignore_index=True).to_csv(out_dir / "wakeup_models.csv", index=False)
    rows.append(
        {
            "model": " ".join(real["wakeup_models"]),
            "experiment": "wakeup",
            "status": "ran" if not missing else "not run",
            "reason": "" if not missing else "not run: " + "; ".join(missing),
            "claims": " ".join(WAKEUP_CLAIMS),
        }
    )

    # induction on the papers' models
    ind_tabs, missing = {}, []
    T = int(real["induction_T"])
    for name in real["induction_models"]:
        b = boot(name)
        if isinstance(b, Exception):
            missing.append(f"{name}: {b}")
            continue
        vocab = min(int(b.cfg.d_vocab), 20_000)
        res = induction_experiment.run_induction(
            b,
            (T, T + 2),
            vocab,
            ind_cfg["n_prompts"],
            ind_cfg["data_seed"],
            ind_cfg["ks"],
            ind_cfg["n_primary"],
            ind_cfg["n_random"],
            ind_cfg["protocol"],
            top_r,
            fit_rows(b, 2 * T + 5),
        )
        ind_tabs[name] = res["sets"]
    if ind_tabs:
        induction_experiment.ratio_table(ind_tabs).to_csv(out_dir / "induction.csv", index=False)
    rows.append(
        {
            "model": " ".join(real["induction_models"]),
            "experiment": "induction",
            "status": "ran" if not missing else "not run",
            "reason": "" if not missing else "not run: " + "; ".join(missing),
            "claims": " ".join(INDUCTION_CLAIMS),
        }
    )
    rows.append(
        {
            "model": "gpt2 ... 7B",
            "experiment": "pruning",
            "status": "not run",
            "reason": f"not run: {PRUNING_NOT_RUN}",
            "claims": " ".join(PRUNING_CLAIMS),
        }
    )
    return pd.DataFrame(rows)


def real_tables(folder) -> dict:
    """The tables :func:`run_real_models` wrote (the ones present)."""
    folder = Path(folder)
    names = {
        "ioi_summary": "ioi_summary.csv",
        "ioi_wake": "ioi_wake.csv",
        "ioi_freeze": "ioi_freeze.csv",
        "ioi_knockout": "ioi_knockout.csv",
        "induction": "induction.csv",
    }
    return {k: pd.read_csv(folder / f) for k, f in names.items() if (folder / f).exists()}


def wakeup_scales(table: pd.DataFrame):
    """Holds when the COAX-top heads' wake-up ratio grows with the primaries ablated in
    every model, and random heads stay within 2% of 1."""
    ev, ok = [], True
    for m, g in table.groupby("model", sort=False):
        c = g[g.group == "coax_top8"].groupby("n_ablated")["ratio"].mean()
        r = g[g.group == "random"].groupby("n_ablated")["ratio"].mean()
        grows = bool((np.diff(c.to_numpy()) >= -1e-6).all() and c.iloc[-1] > 1.0)
        ok &= grows
        ev.append(f"{m}: {' '.join(f'{x:.2f}' for x in c)} (random {' '.join(f'{x:.2f}' for x in r)})")
    return Holds(bool(ok), "; ".join(ev))
