"""Paper B on the packaged real language models (SmolLM2-135M, Gemma-3-270M: config
``lms``): IOI with the name movers found as Wang et al. (2022) define them and the
backups by conditional ablation (:mod:`selfrepair.coax.name_movers`; these models have
no documented circuit), COAX against every baseline, wake-up, freezing, knockout; and
induction on repeated random tokens. One model folder per call (rule coax_lm).

Prompts are tokenized with the checkpoint's own tokenizer (``AutoTokenizer`` of the
folder), BOS first or not as :func:`bos_table` finds the model solves IOI better.
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd

from selfrepair.coax import induction_experiment, ioi_experiment, lm_seeds, name_movers
from selfrepair.coax.score import ioi_summary, release_vocab
from selfrepair.core.components import head_components, parse
from selfrepair.core.interventions import Prefix, fit_rows
from selfrepair.core.models import check_context, load_bridge, model_identity
from selfrepair.core.progress import Progress
from selfrepair.tasks import ioi

log = logging.getLogger(__name__)

STATUS_COLUMNS = ["model", "experiment", "status", "reason", "cpu_s", "peak_rss_mb", "folder", "identity"]
PARTS = ("bos", "ioi", "induction", "pruning")


class _Encoder:
    """The checkpoint's tokenizer with BOS first or not, whatever its own default:
    ``encode(text, add_special_tokens=True)`` as :func:`ioi.gpt2_prompts` calls it."""

    def __init__(self, tokenizer, bos: bool):
        self.tok, self.bos = tokenizer, bos

    def encode(self, text, add_special_tokens=True):
        ids = self.tok.encode(text, add_special_tokens=False)
        if add_special_tokens and self.bos:
            if self.tok.bos_token_id is None:
                raise ValueError("this tokenizer has no BOS token")
            ids = [int(self.tok.bos_token_id)] + ids
        return ids


def lm_prompts(tokenizer, n: int, seed: int, bos: bool, bridge=None, templates=("ABBA",)) -> ioi.IOIPrompts:
    """Paper B's IOI prompts (the COAX release's draw, :func:`ioi.gpt2_prompts`) in the
    checkpoint's own tokenizer, with or without BOS first, prompt i in the template
    ``templates[i % len]`` (:func:`lm_seeds.draw`; the release's is ABBA alone); on
    ``bridge``'s device when given (the prompts enter the model there)."""
    pr, _ = lm_seeds.draw(ioi.gpt2_prompts(_Encoder(tokenizer, bos), n, seed, style="authors"), templates)
    return pr if bridge is None else pr.to(next(bridge.parameters()).device)


def bos_table(bridge, tokenizer, n: int, seed: int) -> pd.DataFrame:
    """IOI accuracy and mean logit difference with and without BOS first (one forward
    each, the last position unembedded); ``chosen``: the better (accuracy, then logit
    difference); without BOS when the tokenizer has none."""
    rows = []
    for bos in (False, True):
        if bos and tokenizer.bos_token_id is None:
            continue
        pr = lm_prompts(tokenizer, n, seed, bos, bridge)
        last = [pr.tokens.shape[1] - 1]
        lg = Prefix(bridge, pr.tokens, positions=last).logits(last).cpu()
        rows.append(
            {
                "bos": bos,
                "n_prompts": n,
                "length": pr.tokens.shape[1],
                "accuracy": ioi.accuracy(lg, pr),
                "logit_diff": float(ioi.logit_diff(lg, pr)),
            }
        )
    t = pd.DataFrame(rows)
    best = t.sort_values(["accuracy", "logit_diff"], ascending=False, kind="stable").index[0]
    t["chosen"] = t.index == best
    return t


def truth_seeds(bridge, truth, templates, n_primary: int, share: float, max_rows: int, seedings) -> dict:
    """Each seeding's primaries and backups on the truth prompts (:mod:`lm_seeds`):
    {seeding: (primaries, candidates, backups)}, and the tables: heads (one row per
    (seeding, head): attention to IO and S, direct logit attribution, single-ablation
    drop, role and how it was chosen, the conditional-ablation effects of the
    candidates), truth (the per-prompt conditional-ablation matrix) and stability (the
    seeds chosen on each half of the truth prompts)."""
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    units = [h.name for h in heads]
    last = [truth.tokens.shape[1] - 1]
    pfx = Prefix(bridge, truth.tokens, positions=last)
    half_a, half_b = lm_seeds.halves(templates)
    nm = name_movers.name_mover_table(bridge, truth)
    drops = lm_seeds.drop_matrix(pfx, truth, heads, max_rows)
    base = nm.merge(lm_seeds.top_drops(drops, units, n_primary)[["unit", "drop"]], on="unit")

    def pick(seeding, cols):
        if seeding == "name_movers":
            t = nm if cols is None else name_movers.name_mover_table(bridge, lm_seeds.subset(truth, cols))
            t = name_movers.pick_primaries(t, n_primary)
            return list(t[t["primary"]].sort_values("dla", ascending=False, kind="stable")["unit"]), t
        t = lm_seeds.top_drops(drops, units, n_primary, cols)
        t["how"] = t["primary"].map({True: "largest single-ablation drop of logit[IO] - logit[S]", False: ""})
        return list(t[t["primary"]].sort_values("drop", ascending=False, kind="stable")["unit"]), t

    seeds, tables = {}, {"heads": [], "truth": [], "stability": []}
    for seeding in seedings:
        prim_names, picked = pick(seeding, None)
        prim = [parse(u) for u in prim_names]
        cands, upstream = lm_seeds.downstream(heads, prim)
        if not cands:
            raise ValueError(
                f"{seeding}: no head lies after the earliest primary ({' '.join(prim_names)}): no backup candidate"
            )
        cn = [c.name for c in cands]
        mat = lm_seeds.truth_matrix(pfx, truth, prim, cands, max_rows, drops, heads)
        n_other = len(heads) - len(prim)
        cb = lm_seeds.backups_from(mat, cn, share, None, n_other)
        back = [parse(u) for u in cb[cb["backup"]].sort_values("beta", ascending=False, kind="stable")["unit"]]
        t = base.merge(picked[["unit", "primary", "how"]], on="unit").merge(cb, on="unit", how="left")
        t["backup"] = t["backup"].astype("boolean").fillna(False).astype(bool)
        up = t["unit"].isin({h.name for h in upstream})
        t["role"] = np.select([t["primary"], t["backup"], up], ["primary", "backup", "upstream"], "other")
        t.loc[t["backup"], "how"] = "conditional ablation: top beta = drop with primaries ablated - drop alone"
        t.loc[up, "how"] = (
            "not a candidate: at or before the earliest primary's layer, it cannot respond to their ablation"
        )
        t.insert(0, "seeding", seeding)
        t.insert(0, "task", "ioi")
        tables["heads"].append(t)
        tables["truth"].append(lm_seeds.matrix_table(mat, cn, templates, seeding, n_other))
        pa, pb = pick(seeding, half_a)[0], pick(seeding, half_b)[0]
        tables["stability"].append(lm_seeds.stability(mat, cn, share, n_other, templates, pa, pb, seeding))
        seeds[seeding] = (prim, cands, back)
    return seeds, {k: pd.concat(v, ignore_index=True) for k, v in tables.items()}


def run_ioi_part(bridge, tokenizer, bos: bool, s: dict, ioi_cfg: dict, protocol: str, out: Path, prog) -> str:
    """Each seeding's primaries and backups on the truth prompts (:func:`truth_seeds`),
    then COAX and the baselines on each data seed's prompts, the candidates those after
    the earliest primary (:func:`ioi_experiment.run_ioi`), and the per-prompt logit
    differences (:func:`lm_seeds.prompt_table`); writes heads_ioi.csv, ioi_truth.csv,
    seeds_stability.csv, ioi_prompts.csv and ioi_*.csv, each with a ``seeding`` column."""
    templates = list(s["templates"])
    truth = lm_prompts(tokenizer, int(s["n_truth"]), int(s["truth_seed"]), bos, bridge, templates)
    t_names = lm_seeds.template_names(len(truth), templates)
    max_rows = int(s["max_rows"])
    with prog.stage("seeds: name movers, single drops and conditional backups"):
        seeds, tabs = truth_seeds(bridge, truth, t_names, int(ioi_cfg["n_primary"]), float(s["backup_share"]),
                                  max_rows, list(s["seedings"]))  # fmt: skip
    tabs["heads"].to_csv(out / "heads_ioi.csv", index=False)
    tabs["truth"].to_csv(out / "ioi_truth.csv", index=False)
    tabs["stability"].to_csv(out / "seeds_stability.csv", index=False)
    parts: dict[str, list] = {k: [] for k in ("scores", "discovery", "wake", "freeze", "knockout", "prompts")}
    for ds in s["data_seeds"]:
        pr = lm_prompts(tokenizer, int(s["n_prompts"]), int(ds), bos, bridge, templates)
        p_names = lm_seeds.template_names(len(pr), templates)
        for seeding, (prim, cands, back) in seeds.items():
            with prog.stage(f"IOI data seed {ds}, {seeding} seeds"):
                res = ioi_experiment.run_ioi(
                    bridge, pr, prim + cands, prim, back, protocol, int(s["top_r"]), int(ioi_cfg["top_k"]),
                    ioi_cfg.get("k_recovered") or len(back), float(ioi_cfg["wake_min"]), int(ioi_cfg["ig_steps"]),
                    max_rows, float(ioi_cfg["amp_eps"]), release_vocab(bridge), last_only=True,
                )  # fmt: skip
                res["prompts"] = lm_seeds.prompt_table(
                    bridge, pr, p_names, prim, back, cands, [parse(u) for u in res["recovered"]], max_rows
                )
            for k in parts:
                t = res[k].copy()
                t.insert(0, "seeding", seeding)
                t.insert(0, "data_seed", int(ds))
                t.insert(0, "model_seed", 0)  # one pretrained model: the toy tables' columns
                parts[k].append(t)
    cat = {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}
    cat["discovery"]["ground_truth"] = "conditional ablation on this model (no documented circuit)"
    summary = [ioi_summary(g).assign(seeding=k) for k, g in cat["discovery"].groupby("seeding", sort=False)]
    pd.concat(summary, ignore_index=True).to_csv(out / "ioi_summary.csv", index=False)
    for k, t in cat.items():
        t.to_csv(out / f"ioi_{k}.csv", index=False)
    said = []
    for seeding, (prim, _, back) in seeds.items():
        said.append(f"{seeding}: primaries {' '.join(h.name for h in prim)}, {len(back)} backups")
    return "; ".join(said) + " (backups by conditional ablation)"


def run_induction_part(bridge, name: str, s: dict, ind_cfg: dict, out: Path, prog) -> str:
    """Induction on repeated random tokens (:func:`induction_experiment.run_induction`):
    induction.csv (COAX top-k sets against random sets), induction_sequences.csv (the
    same drops per evaluation sequence) and heads_induction.csv."""
    T = int(s["induction_T"])
    check_context(bridge, 2 * T + 2, "the induction sequences", name)
    with prog.stage("induction"):
        res = induction_experiment.run_induction(
            bridge, (T, T + 2), min(int(bridge.cfg.d_vocab), 20_000), int(s["induction_prompts"]),
            int(ind_cfg["data_seed"]), list(ind_cfg["ks"]), int(ind_cfg["n_primary"]), int(ind_cfg["n_random"]),
            str(s["induction_protocol"]), int(s["top_r"]), fit_rows(bridge, 2 * T + 2, int(s["max_rows"])),
        )  # fmt: skip
    induction_experiment.ratio_table({name: res["sets"]}).to_csv(out / "induction.csv", index=False)
    res["sequences"].to_csv(out / "induction_sequences.csv", index=False)
    h = res["heads"].assign(task="induction", role=lambda t: t["primary"].map({True: "primary", False: "other"}))
    h.to_csv(out / "heads_induction.csv", index=False)
    return f"primaries {' '.join(res['primaries'])} (top induction scores); clean log-prob {res['clean_logprob']:.3f}"


def _attempt(rows: list, name: str, experiment: str, run, where: tuple) -> bool:
    """One part; its status row either way (a failure costs this row, not the others' tables)."""
    t0 = time.process_time()
    try:
        reason, ok = run(), True
    except Exception as err:  # one part's failure must not lose the other parts' tables
        reason, ok = f"not run: failed: {type(err).__name__}: {err}", False
        log.exception("%s %s failed; its status row says so and the other parts go on", name, experiment)
    cpu = time.process_time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the job's peak so far (kB on Linux)
    log.info("%s %s %s: %.0f CPU-s, peak RSS so far %.0f MB", name, experiment, "ran" if ok else "not run", cpu, rss)
    rows.append(dict(zip(STATUS_COLUMNS, [name, experiment, "ran" if ok else "not run", reason, cpu, rss, *where])))
    return ok


def coax_lm(folder, name: str, s: dict, ioi_cfg: dict, ind_cfg: dict, protocol: str, out_dir, device="cpu", every=30.0):
    """Paper B on one packaged LM in ``folder``: tables under ``out_dir`` (bos.csv,
    heads.csv, ioi_*.csv, induction.csv) and the status table (:data:`STATUS_COLUMNS`,
    one row per part of :data:`PARTS`, with its process CPU seconds). ``s``: the
    ``coax.lms`` settings at the chosen scale."""
    from transformers import AutoTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bridge = load_bridge(folder, device)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    where, rows, state = (str(folder), model_identity(folder)), [], {}
    # BOS, the seeds, one scoring per data seed and seeding, induction
    n_stages = 2 + len(s["data_seeds"]) * len(s["seedings"]) + 1
    with Progress(name, "coax_lm", n_stages, every) as prog:
        prog.watch(bridge)

        def bos():
            with prog.stage("BOS"):
                t = bos_table(bridge, tok, int(s["n_bos"]), int(s["truth_seed"]))
            t.to_csv(out / "bos.csv", index=False)
            state["bos"] = bool(t.loc[t["chosen"], "bos"].iloc[0])
            return f"BOS {'first' if state['bos'] else 'left out'} (IOI accuracy {float(t[t.chosen].accuracy.iloc[0]):.2f})"

        _attempt(rows, name, "bos", bos, where)
        _attempt(
            rows, name, "ioi", lambda: run_ioi_part(bridge, tok, state["bos"], s, ioi_cfg, protocol, out, prog), where
        )
        _attempt(rows, name, "induction", lambda: run_induction_part(bridge, name, s, ind_cfg, out, prog), where)
    heads = [pd.read_csv(out / f) for f in ("heads_ioi.csv", "heads_induction.csv") if (out / f).exists()]
    pd.concat(heads, ignore_index=True).to_csv(out / "heads.csv", index=False) if heads else None
    rows.append(
        dict(
            zip(
                STATUS_COLUMNS, [name, "pruning", "not run", f"not run: {s['pruning_note']}", 0.0, float("nan"), *where]
            )
        )
    )
    return pd.DataFrame(rows, columns=STATUS_COLUMNS)
