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

import pandas as pd

from selfrepair.coax import induction_experiment, ioi_experiment, name_movers
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


def lm_prompts(tokenizer, n: int, seed: int, bos: bool, bridge=None) -> ioi.IOIPrompts:
    """Paper B's IOI prompts (the COAX release's draw, :func:`ioi.gpt2_prompts`) in the
    checkpoint's own tokenizer, with or without BOS first; on ``bridge``'s device when
    given (the prompts enter the model there)."""
    pr = ioi.gpt2_prompts(_Encoder(tokenizer, bos), n, seed, style="authors")
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


def ioi_heads(bridge, prompts, n_primary: int, backup_share: float, max_rows: int):
    """(primaries, backups, heads table): the name movers (:func:`name_movers.pick_primaries`)
    and the backups by conditional ablation with them, on ``prompts``."""
    nm = name_movers.pick_primaries(name_movers.name_mover_table(bridge, prompts), n_primary)
    prim = [parse(u) for u in nm[nm["primary"]].sort_values("dla", ascending=False)["unit"]]
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    cb = name_movers.conditional_backups(bridge, prompts, heads, prim, backup_share, max_rows)
    t = nm.merge(cb, on="unit", how="left")
    t["backup"] = t["backup"].astype("boolean").fillna(False).astype(bool)
    t["role"] = ["primary" if p else ("backup" if b else "other") for p, b in zip(t["primary"], t["backup"])]
    t.loc[t["backup"], "how"] = "conditional ablation: top beta = drop with primaries ablated - drop alone"
    t.insert(0, "task", "ioi")
    backups = [parse(u) for u in t[t["backup"]].sort_values("beta", ascending=False)["unit"]]
    return prim, backups, t


def run_ioi_part(bridge, tokenizer, bos: bool, s: dict, ioi_cfg: dict, protocol: str, out: Path, prog) -> str:
    """Primaries and backups on the truth prompts, then COAX and the baselines on each
    data seed's prompts (:func:`ioi_experiment.run_ioi`); writes heads.csv and ioi_*.csv."""
    truth = lm_prompts(tokenizer, int(s["n_truth"]), int(s["truth_seed"]), bos, bridge)
    max_rows = int(s["max_rows"])
    with prog.stage("name movers and conditional backups"):
        prim, back, heads_t = ioi_heads(bridge, truth, int(ioi_cfg["n_primary"]), float(s["backup_share"]), max_rows)
    heads_t.to_csv(out / "heads_ioi.csv", index=False)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    parts: dict[str, list] = {k: [] for k in ("scores", "discovery", "wake", "freeze", "knockout")}
    for ds in s["data_seeds"]:
        with prog.stage(f"IOI data seed {ds}"):
            res = ioi_experiment.run_ioi(
                bridge, lm_prompts(tokenizer, int(s["n_prompts"]), int(ds), bos, bridge), heads, prim, back, protocol,
                int(s["top_r"]), int(ioi_cfg["top_k"]), ioi_cfg.get("k_recovered") or len(back),
                float(ioi_cfg["wake_min"]), int(ioi_cfg["ig_steps"]), max_rows, float(ioi_cfg["amp_eps"]),
                release_vocab(bridge), last_only=True,
            )  # fmt: skip
        for k in parts:
            t = res[k].copy()
            t.insert(0, "data_seed", int(ds))
            t.insert(0, "model_seed", 0)  # one pretrained model: the toy tables' columns
            parts[k].append(t)
    cat = {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}
    cat["discovery"]["ground_truth"] = "conditional ablation on this model (no documented circuit)"
    ioi_summary(cat["discovery"]).to_csv(out / "ioi_summary.csv", index=False)
    for k, t in cat.items():
        t.to_csv(out / f"ioi_{k}.csv", index=False)
    return f"primaries {' '.join(h.name for h in prim)} (name movers); {len(back)} backups by conditional ablation"


def run_induction_part(bridge, name: str, s: dict, ind_cfg: dict, out: Path, prog) -> str:
    """Induction on repeated random tokens (:func:`induction_experiment.run_induction`):
    induction.csv (COAX top-k sets against random sets) and heads_induction.csv."""
    T = int(s["induction_T"])
    check_context(bridge, 2 * T + 2, "the induction sequences", name)
    with prog.stage("induction"):
        res = induction_experiment.run_induction(
            bridge, (T, T + 2), min(int(bridge.cfg.d_vocab), 20_000), int(s["induction_prompts"]),
            int(ind_cfg["data_seed"]), list(ind_cfg["ks"]), int(ind_cfg["n_primary"]), int(ind_cfg["n_random"]),
            str(s["induction_protocol"]), int(s["top_r"]), fit_rows(bridge, 2 * T + 2, int(s["max_rows"])),
        )  # fmt: skip
    induction_experiment.ratio_table({name: res["sets"]}).to_csv(out / "induction.csv", index=False)
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
    with Progress(name, "coax_lm", 2 + len(s["data_seeds"]) + 1, every) as prog:
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
