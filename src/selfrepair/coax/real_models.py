"""Paper B's rules on the papers' own models (GPT-2 ...), when their weights are on this
machine: IOI with GPT-2 small's documented heads, wake-up across model sizes, induction.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from selfrepair.coax import induction_experiment, ioi_experiment
from selfrepair.coax.score import ioi_summary, release_vocab, scan, wake_up_curve
from selfrepair.core.components import head_components, parse
from selfrepair.core.interventions import fit_rows
from selfrepair.core.models import (
    ContextTooShort,
    CorruptCheckpoint,
    ModelNotFound,
    WeightsChanged,
    check_context,
    checkpoint_tokenizer,
    load_identified,
)
from selfrepair.core.progress import Progress
from selfrepair.tasks import ioi

log = logging.getLogger(__name__)

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


# the claim ids each row bears on are added by coax.claims.status_with_claims (its ``claims`` column)
STATUS_COLUMNS = ["model", "experiment", "status", "reason", "folder", "identity"]


class _Models:
    """Each real model booted once, offline; a model that cannot be booted is remembered
    with its error. ``where(name)`` is the folder and identity hash of a booted model,
    ``tokenizer(name)`` its checkpoint's own tokenizer (:func:`checkpoint_tokenizer`)."""

    def __init__(self, search_paths, device):
        self.search_paths, self.device = list(search_paths or []), device
        self.cache: dict = {}
        self.info: dict = {}
        self.tokenizers: dict = {}

    def boot(self, name):
        if name not in self.cache:
            try:
                bridge, folder, identity = load_identified(name, self.device, self.search_paths)
                self.info[name] = (str(folder), identity)
                n_par = sum(p.numel() for p in bridge.original_model.parameters())
                log.info(
                    "model %s: folder %s, identity %s, %s, %d layers x %d heads, d_model %d, %.1fM parameters, "
                    "context %d tokens",
                    name, folder, self.info[name][1], type(bridge.original_model).__name__, bridge.cfg.n_layers,
                    bridge.cfg.n_heads, bridge.cfg.d_model, n_par / 1e6, bridge.cfg.n_ctx,
                )  # fmt: skip
                self.cache[name] = bridge
            except (ModelNotFound, CorruptCheckpoint) as err:
                self.cache[name] = err
        if isinstance(self.cache[name], Exception):
            raise self.cache[name]
        return self.cache[name]

    def where(self, name) -> tuple[str, str]:
        return self.info.get(name, ("", ""))

    def tokenizer(self, name):
        """The booted model's own tokenizer, as COAX's release loads it (its own BOS
        behaviour), not the bridge's, which TransformerLens reloads adding BOS."""
        if name not in self.tokenizers:
            self.boot(name)
            self.tokenizers[name] = checkpoint_tokenizer(self.info[name][0])
        return self.tokenizers[name]

    def drop(self, name) -> None:
        """Free a model no later experiment needs (GPT-2 large is 3 GB in fp32)."""
        if not isinstance(self.cache.get(name), Exception):
            self.cache.pop(name, None)


def _attempt(rows: list, models: _Models, name: str, experiment: str, run) -> bool:
    """Run one model x experiment; its status row either way. A failure (weights absent,
    prompts longer than the context, an error inside) is a 'not run' row with the reason,
    and the other models' and experiments' results are kept. An edited model folder
    (WeightsChanged) is not turned into a row: it stops the job."""
    try:
        reason, ok = run(), True
    except WeightsChanged:
        raise
    except (ModelNotFound, CorruptCheckpoint, ContextTooShort) as err:
        reason, ok = f"not run: {err}", False
        log.info("%s %s not run: %s", name, experiment, err)
    except Exception as err:  # one model's failure must not lose the others' tables
        reason, ok = f"not run: failed: {type(err).__name__}: {err}", False
        log.exception("%s %s failed; its status row says so and the other parts go on", name, experiment)
    folder, identity = models.where(name)
    rows.append(
        {
            "model": name,
            "experiment": experiment,
            "status": "ran" if ok else "not run",
            "reason": reason,
            "folder": folder,
            "identity": identity,
        }
    )
    return ok


def _prompts(bridge, tokenizer, name: str, real: dict, seed: int, device):
    """The IOI prompts of ``seed``, tokenized by the checkpoint's own ``tokenizer``."""
    pr = ioi.gpt2_prompts(tokenizer, real["n_prompts"], seed, style=real.get("prompt_style", "authors"))
    check_context(bridge, pr.tokens.shape[1], "the IOI prompts", name)
    return pr.to(device)


def _run_ioi(b, tok, name, real, ioi_cfg, protocol, top_r, out_dir, device, max_rows, every) -> str:
    heads = head_components(b.cfg.n_layers, b.cfg.n_heads)
    parts: dict[str, list] = {k: [] for k in ("discovery", "wake", "freeze", "knockout")}
    truth_prompts = _prompts(b, tok, name, real, 5, device)
    mr = fit_rows(b, truth_prompts.tokens.shape[1], max_rows)
    seeds = list(real["data_seeds"])
    with Progress(name, "ioi", len(seeds), every) as prog:
        prog.watch(b)
        prim, back, how = _ioi_heads_for(b, truth_prompts, heads, ioi_cfg["n_primary"], ioi_cfg["backup_frac"], mr)
        for ds in seeds:
            with prog.stage(f"data seed {ds}"):
                pr = _prompts(b, tok, name, real, ds, device)
                res = ioi_experiment.run_ioi(
                    b, pr, heads, prim, back, protocol, top_r, ioi_cfg["top_k"],
                    ioi_cfg["k_recovered"] or len(back), ioi_cfg["wake_min"], ioi_cfg["ig_steps"], mr,
                    ioi_cfg["amp_eps"], release_vocab(b),
                )  # fmt: skip
            for k in parts:
                t = res[k].copy()
                t.insert(0, "data_seed", ds)
                t.insert(0, "model_seed", 0)
                parts[k].append(t)
    cat = {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}
    ioi_summary(cat["discovery"]).to_csv(out_dir / "ioi_summary.csv", index=False)
    for k, t in cat.items():
        t.to_csv(out_dir / f"ioi_{k}.csv", index=False)
    return f"heads: {how}; primaries {' '.join(h.name for h in prim)}"


def _run_wakeup(b, tok, name, real, ioi_cfg, protocol, top_r, device, max_rows, every) -> pd.DataFrame:
    heads = head_components(b.cfg.n_layers, b.cfg.n_heads)
    pr = _prompts(b, tok, name, real, 21, device)
    mr = fit_rows(b, pr.tokens.shape[1], max_rows)
    with Progress(name, "wakeup", 3, every) as prog:
        prog.watch(b)
        n = pr.tokens.shape[0]
        with prog.stage("single ablations", rows=(1 + len(heads)) * n):
            drops = ioi_experiment.ablation_drops(b, pr, [[h] for h in heads], max_rows=mr)
        order = sorted(range(len(heads)), key=lambda i: -drops[i])
        prim = [heads[i] for i in order[: ioi_cfg["n_primary"]]]
        cands = [h for h in heads if h not in prim]
        with prog.stage("COAX scan", rows=(2 + 2 * len(cands)) * n):  # the scan's 2 + 2|U| passes
            sc = scan(b, pr.tokens, cands, prim, protocol, top_r, max_rows=mr, vocab=release_vocab(b))
        watch_names = list(sc.table.sort_values("comp", ascending=False)["unit"].head(8))
        rng = np.random.default_rng(0)
        rand = [cands[i] for i in rng.choice(len(cands), min(8, len(cands)), replace=False)]
        watch = [h for h in cands if h.name in watch_names]
        with prog.stage("wake-up curve"):
            wc = wake_up_curve(
                b, pr.tokens, prim, watch + [h for h in rand if h not in watch], positions=[pr.tokens.shape[1] - 1]
            )
    wc["group"] = wc["unit"].map(lambda u: "coax_top8" if u in watch_names else "random")
    wc.insert(0, "model", name)
    return wc


def _run_induction(b, name, real, ind_cfg, top_r, max_rows, every) -> dict:
    T = int(real["induction_T"])
    check_context(b, 2 * T + 5, "the induction prompts", name)
    with Progress(name, "induction", 1, every) as prog:
        prog.watch(b)
        n_heads = int(b.cfg.n_layers) * int(b.cfg.n_heads)
        # induction scores, the scan's 2 + 2|U| passes, the clean and primaries runs, and per k
        # the COAX set and the random sets, alone and with the primaries
        rows = 1 + 2 + 2 * (n_heads - ind_cfg["n_primary"]) + 2 + 2 * len(ind_cfg["ks"]) * (1 + ind_cfg["n_random"])
        with prog.stage("detect, scan, ablation sets", rows=rows * ind_cfg["n_prompts"]):
            res = induction_experiment.run_induction(
                b, (T, T + 2), min(int(b.cfg.d_vocab), 20_000), ind_cfg["n_prompts"], ind_cfg["data_seed"],
                ind_cfg["ks"], ind_cfg["n_primary"], ind_cfg["n_random"], ind_cfg["protocol"], top_r,
                fit_rows(b, 2 * T + 5, max_rows),
            )  # fmt: skip
    return res["sets"]


def run_real_models(
    real: dict,
    ioi_cfg: dict,
    ind_cfg: dict,
    protocol: str,
    top_r: int,
    out_dir,
    device="cpu",
    max_rows: int = 2048,
    every: float = 30.0,
) -> pd.DataFrame:
    """Paper B's rules on the papers' own models, each loaded offline if present.

    Writes tables under ``out_dir`` (same formats as the toy tables) and returns the
    status table (:data:`STATUS_COLUMNS`): one row per model x experiment, 'ran' or
    'not run' with the reason, and the model's folder and identity hash (:func:`models.model_identity`), so a real model's numbers can be told
    from a stand-in's. One model x experiment that fails costs its row, not the others'
    tables. Long parts log their progress every ``every`` seconds (:class:`Progress`).
    The claims each row bears on are paper B's claims module's to say
    (``coax.claims.status_with_claims``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list = []
    models = _Models(real.get("search_paths"), device)
    later = [real["ioi_model"], *real["wakeup_models"], *real["induction_models"]]

    def done_with(name, position):
        if name not in later[position + 1 :]:
            models.drop(name)

    name = real["ioi_model"]
    _attempt(
        rows, models, name, "ioi",
        lambda: _run_ioi(
            models.boot(name), models.tokenizer(name), name, real, ioi_cfg, protocol, top_r, out_dir, device,
            max_rows, every,
        ),
    )  # fmt: skip
    done_with(name, 0)

    wake_rows = []
    for i, name in enumerate(real["wakeup_models"]):

        def wake(name=name):
            b, tok = models.boot(name), models.tokenizer(name)
            wake_rows.append(_run_wakeup(b, tok, name, real, ioi_cfg, protocol, top_r, device, max_rows, every))
            return f"{len(wake_rows[-1])} wake-up rows"

        _attempt(rows, models, name, "wakeup", wake)
        done_with(name, 1 + i)
    if wake_rows:
        pd.concat(wake_rows, ignore_index=True).to_csv(out_dir / "wakeup_models.csv", index=False)

    ind_tabs = {}
    for i, name in enumerate(real["induction_models"]):

        def induction(name=name):
            ind_tabs[name] = _run_induction(models.boot(name), name, real, ind_cfg, top_r, max_rows, every)
            return f"{len(ind_tabs[name])} ablation sets"

        _attempt(rows, models, name, "induction", induction)
        done_with(name, 1 + len(real["wakeup_models"]) + i)
    if ind_tabs:
        induction_experiment.ratio_table(ind_tabs).to_csv(out_dir / "induction.csv", index=False)
    rows.append(
        {
            "model": "gpt2 ... 7B",
            "experiment": "pruning",
            "status": "not run",
            "reason": f"not run: {PRUNING_NOT_RUN}",
            "folder": "",
            "identity": "",
        }
    )
    return pd.DataFrame(rows, columns=STATUS_COLUMNS)


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
