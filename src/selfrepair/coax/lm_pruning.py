"""Paper B's structured head pruning on a real LM (rule coax_lm_pruning): sequential
COAX against Random, Magnitude, Wanda and Taylor (:mod:`selfrepair.coax.pruning`'s
scores), the pruned model's perplexity on an English text (:mod:`selfrepair.tasks.plays`).

Sequential COAX removes, at each step, the head with the smallest conditional ablation
energy E(dz_u | S) given the heads S already removed (the dense model's clean
next-token distributions on the calibration windows as the Fisher metric, COAX protocol
v1: the top ``top_r`` logits at the kept positions), then scores again. The first step
is the single-ablation energy. The same quantity as :func:`pruning.coax_order`, for
fewer passes: every step runs S + u from u's own layer, resumed from the streams of one
forward with S ablated (:func:`given`), where the scan resumes from S's first layer and
also recomputes every single ablation. ``positions`` keeps a stride of the calibration
positions: a 262k vocabulary unembedded at every position costs more than the blocks.

The perplexity of each (method, share of heads removed) is exp of the mean next-token
NLL over every evaluation token; sequences.csv keeps each window's mean NLL, so the
claim's interval resamples the windows.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from selfrepair.coax import pruning, score
from selfrepair.core.components import Component, head_components
from selfrepair.core.interventions import Prefix, first_layer, fit_rows, make_hooks, run_ablated, run_resumed

log = logging.getLogger(__name__)

STEP_COLUMNS = ["step", "unit", "energy", "candidates"]
ONE_SHOT = ("random", "magnitude", "wanda", "taylor")
METHODS = ONE_SHOT + ("coax",)


def kept_positions(length: int, stride: int) -> list[int]:
    """Every ``stride``-th position of a window, counted back from the one before the last
    (v1 never keeps the last: no next token is scored there)."""
    if stride < 1:
        raise ValueError(f"stride must be at least 1, not {stride}")
    return sorted(range(length - 2, -1, -stride))


def given(pfx: Prefix, removed: list[Component], positions: list[int]):
    """(a copy of ``pfx`` whose streams are those of the model with ``removed``
    zero-ablated, the logits at ``positions`` of that model): one forward from the first
    removed layer. A set S + u then resumes at u's layer from the copy."""
    start = first_layer(removed, pfx.n_layers)
    captured: dict[int, torch.Tensor] = {}

    def keep(layer):
        def fn(x, hook):
            captured[layer] = x.detach()
            return x

        return fn

    hooks = make_hooks([removed], pfx.b) + [(f"blocks.{la}.hook_in", keep(la)) for la in range(start + 1, pfx.n_layers)]
    logits = pfx.run(start, 1, hooks, positions)
    if len(captured) != pfx.n_layers - start - 1:
        raise RuntimeError(f"the streams of {len(captured)} blocks came back, not {pfx.n_layers - start - 1}")
    out = copy.copy(pfx)
    out.pre = [captured.get(layer, x) for layer, x in enumerate(pfx.pre)]
    return out, logits


def conditional_energies(pfx, removed, units, ref, support, positions, max_rows) -> list[float]:
    """E(z_S - z_{S+u}) for each u in ``units`` (``ref``: the logits with S removed, at
    ``positions``), each run from u's own layer of :func:`given`'s streams."""
    z_s = support.gather_kept(ref)
    per = max(1, max_rows // pfx.b)
    out: dict[int, float] = {}
    with torch.no_grad():
        for layer in sorted({u.layer for u in units}):
            idx = [i for i, u in enumerate(units) if u.layer == layer]
            for c0 in range(0, len(idx), per):
                grp = idx[c0 : c0 + per]
                logits = pfx.run(layer, len(grp), make_hooks([removed + [units[i]] for i in grp], pfx.b), positions)
                for j, i in enumerate(grp):
                    part = logits[j * pfx.b : (j + 1) * pfx.b]
                    out[i] = score.energy(z_s - support.gather_kept(part), support.p0)
    return [out[i] for i in range(len(units))]


def checkpoint_key(tokens, heads, positions, top_r: int, identity: str = "") -> str:
    """What a saved COAX order depends on: the calibration tokens, the heads, the kept
    positions, ``top_r`` and the model's ``identity`` (SHA-256 of them)."""
    h = hashlib.sha256()
    h.update(tokens.detach().cpu().numpy().astype("int64").tobytes())
    h.update(json.dumps([[c.name for c in heads], list(map(int, positions)), int(top_r), identity]).encode())
    return h.hexdigest()


def _resume(checkpoint, key: str, heads, quiet: bool = False) -> pd.DataFrame:
    """The steps saved in ``checkpoint`` under ``key`` (none where it is absent, damaged or
    made for other inputs: then it is started over, and the log says why)."""
    path = Path(checkpoint)
    if not path.exists():
        return pd.DataFrame(columns=STEP_COLUMNS)
    try:
        t = pd.read_csv(path)
        names = {h.name for h in heads}
        ok = list(t.columns) == STEP_COLUMNS + ["key"] and (t["key"] == key).all() and t["unit"].isin(names).all()
        ok = ok and list(t["step"]) == list(range(len(t))) and t["unit"].is_unique
    except (ValueError, KeyError, pd.errors.ParserError) as err:
        quiet or log.warning("COAX pruning: %s is unreadable (%s): starting over", path, err)
        return pd.DataFrame(columns=STEP_COLUMNS)
    if not ok:
        quiet or log.warning("COAX pruning: %s was saved for other inputs or is damaged: starting over", path)
        return pd.DataFrame(columns=STEP_COLUMNS)
    quiet or log.info("COAX pruning: resuming after the %d steps saved in %s", len(t), path)
    return t[STEP_COLUMNS]


def _save(checkpoint, rows: list[dict], key: str) -> None:
    path = Path(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(rows, columns=STEP_COLUMNS).assign(key=key).to_csv(tmp, index=False)
    os.replace(tmp, path)  # a killed job leaves the last whole step, never half a file


def coax_order(bridge, tokens, heads, n_remove: int, positions, top_r: int, max_rows: int, checkpoint=None,
               identity: str = ""):  # fmt: skip
    """Sequential COAX's first ``n_remove`` heads, and a table of each step's pick and
    energy. Ties go to the first head in ``heads``' order (as :func:`pruning.coax_order`).
    ``checkpoint``: a CSV that keeps every finished step (with :func:`checkpoint_key` of
    the inputs and the model's ``identity``); a later call on the same inputs resumes
    after them."""
    pfx = Prefix(bridge, tokens, positions=positions)
    if not pfx.resumable:
        raise ValueError("sequential COAX pruning needs a model that resumes at a block (blocks.{l}.hook_in)")
    support = score.support_at(pfx.logits(positions), positions, "v1", top_r)
    key = checkpoint_key(tokens, heads, positions, top_r, identity)
    done = _resume(checkpoint, key, heads) if checkpoint is not None else pd.DataFrame(columns=STEP_COLUMNS)
    rows = done.to_dict("records")[: min(n_remove, len(heads))]
    by_name = {h.name: h for h in heads}
    removed = [by_name[r["unit"]] for r in rows]
    remaining = [h for h in heads if h not in removed]

    def single(logits):
        return score.energy(support.z0 - support.gather_kept(logits), support.p0)

    for step in range(len(rows), min(n_remove, len(heads))):
        if step:
            cond, ref = given(pfx, removed, positions)
            energies = conditional_energies(cond, removed, remaining, ref, support, positions, max_rows)
        else:
            energies = run_resumed(pfx, [[h] for h in heads], "zero", None, single, max_rows, positions)
        i = int(np.argmin(energies))  # the first of equal minima
        u = remaining.pop(i)
        rows.append({"step": step, "unit": u.name, "energy": float(energies[i]), "candidates": len(energies)})
        removed.append(u)
        if checkpoint is not None:
            _save(checkpoint, rows, key)
        log.info(
            "COAX pruning step %d/%d: %s (energy %.4g of %d)", step + 1, n_remove, u.name, energies[i], len(energies)
        )
    return removed, pd.DataFrame(rows, columns=STEP_COLUMNS)


def coax_rows(n_heads: int, n_remove: int, b: int, start: int = 0) -> int:
    """The rows (sequences through the unembedding) :func:`coax_order` runs from step
    ``start`` on (the steps before it resumed from a checkpoint): the intact run, every
    single ablation at step 0, then per later step the run with S removed and S + u for
    every remaining u (the heartbeat's plan)."""
    later = sum(1 + n_heads - k for k in range(max(1, start), min(n_remove, n_heads)))
    return b * (1 + (n_heads if start == 0 else 0) + later)


def sequence_nll(logits: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """Per window, the mean next-token NLL [B] of ``tokens`` given their logits [B, T, V]."""
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -lp.gather(-1, tokens[:, 1:, None].to(lp.device))[..., 0]
    return nll.mean(1).double().cpu().numpy()


def perplexities(bridge, evalset, orders: dict, sparsities, max_rows: int) -> pd.DataFrame:
    """One row per (method, sparsity, window): the window's mean NLL with the first
    round(sparsity x heads) heads of the method's order removed (zero ablation). The
    windows run in chunks whose logits fit :func:`fit_rows`; equal sets run once."""
    n_heads = bridge.cfg.n_layers * bridge.cfg.n_heads
    t = evalset.shape[1]
    chunk = fit_rows(bridge, t, max_rows)
    jobs: dict[tuple, list] = {}
    for m, order in orders.items():
        for s in sparsities:
            n = int(round(float(s) * n_heads))
            if n > len(order):
                raise ValueError(f"{m}'s order holds {len(order)} heads, fewer than sparsity {s}'s {n}")
            jobs.setdefault(tuple(h.name for h in order[:n]), []).append((m, float(s), n))
    by_name = {h.name: h for o in orders.values() for h in o}
    sets = {k: [by_name[u] for u in k] for k in jobs}
    nll: dict[tuple, np.ndarray] = {k: np.empty(evalset.shape[0]) for k in jobs}
    keys = list(jobs)
    for c0 in range(0, evalset.shape[0], chunk):
        part = evalset[c0 : c0 + chunk]
        got = run_ablated(
            bridge, part, [sets[k] for k in keys], reduce=lambda lg, p=part: sequence_nll(lg, p), max_rows=chunk
        )
        for k, v in zip(keys, got):
            nll[k][c0 : c0 + len(part)] = v
    rows = []
    for k, uses in jobs.items():
        for m, s, n in uses:
            rows += [
                {"method": m, "sparsity": s, "n_pruned": n, "window": w, "nll": float(x)} for w, x in enumerate(nll[k])
            ]
    return pd.DataFrame(rows)


def summary(sequences: pd.DataFrame, headline: float) -> pd.DataFrame:
    """Per (method, sparsity): perplexity = exp(mean NLL over the windows' tokens; every
    window has as many), the windows, and whether it is the headline sparsity."""
    g = sequences.groupby(["method", "sparsity", "n_pruned"], sort=False)["nll"]
    t = g.agg(["mean", "size"]).reset_index().rename(columns={"mean": "mean_nll", "size": "n_windows"})
    t["perplexity"] = np.exp(t["mean_nll"])
    t["is_headline"] = (t["sparsity"] - headline).abs() < 1e-9
    return t


def run(bridge, calib, evalset, cfg: dict, prog=None, checkpoint=None, identity: str = "") -> dict[str, pd.DataFrame]:
    """Every method's order and the perplexity sweep: tables ``perplexity`` (:func:`summary`),
    ``sequences`` (:func:`perplexities`), ``orders`` (method, rank, unit) and ``steps``
    (COAX's pick and energy per step). ``cfg``: sparsities, headline, seed, top_r,
    max_rows, stride; ``checkpoint``, ``identity``: :func:`coax_order`'s."""
    from selfrepair.tasks.lm import lm_loss

    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    sparsities = sorted({float(s) for s in cfg["sparsities"]} | {float(cfg["headline"])})
    n_coax = int(round(max(sparsities) * len(heads)))
    max_rows = int(cfg["max_rows"])

    def stage(name, rows=None):
        return prog.stage(name, rows) if prog is not None else _null()

    with stage("one-shot scores: random, magnitude, wanda, taylor"):
        orders = pruning.one_shot_orders(bridge, calib, heads, lambda lg: lm_loss(lg, calib), int(cfg["seed"]))
    pos, top_r = kept_positions(calib.shape[1], int(cfg["stride"])), int(cfg["top_r"])
    saved = 0 if checkpoint is None else len(_resume(checkpoint, checkpoint_key(calib, heads, pos, top_r, identity),
                                                     heads, quiet=True))  # fmt: skip
    with stage(f"sequential COAX: {n_coax} heads", coax_rows(len(heads), n_coax, calib.shape[0], saved)):
        orders["coax"], steps = coax_order(bridge, calib, heads, n_coax, pos, top_r, max_rows, checkpoint, identity)
    n_sets = len({tuple(h.name for h in o[: int(round(s * len(heads)))]) for o in orders.values() for s in sparsities})
    with stage("perplexity sweep", n_sets * evalset.shape[0]):
        seqs = perplexities(bridge, evalset, orders, sparsities, max_rows)
    order_t = pd.DataFrame(
        [{"method": m, "rank": i, "unit": c.name} for m, hs in orders.items() for i, c in enumerate(hs)]
    )
    return {"perplexity": summary(seqs, float(cfg["headline"])), "sequences": seqs, "orders": order_t, "steps": steps}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def coax_lm_pruning(
    folder, name: str, s: dict, top_r: int, max_rows: int, device="cpu", every=30.0, checkpoint=None, numerics=""
):
    """The pruning study on the packaged LM in ``folder`` (``s``: coax.lms.pruning): the
    calibration and evaluation windows of two plays (BOS first where the tokenizer has
    one), :func:`run`'s tables and a status table (:data:`lms.STATUS_COLUMNS`, one row).
    ``checkpoint``: where COAX's finished steps are kept, so that a killed job resumes
    after them (:func:`coax_order`), under the same model and ``numerics`` mode only (a
    step's energies may differ in their last bits between modes)."""
    import resource
    import time

    from transformers import AutoTokenizer

    from selfrepair.coax.lms import STATUS_COLUMNS
    from selfrepair.core.models import check_context, load_bridge, model_identity
    from selfrepair.core.progress import Progress
    from selfrepair.tasks import plays

    if s["calibration"] == s["evaluation"]:
        raise ValueError(f"calibration and evaluation are both {s['calibration']!r}: they must be other texts")
    t0 = time.process_time()
    bridge = load_bridge(folder, device)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    length, bos = int(s["length"]), tok.bos_token_id is not None
    check_context(bridge, length, "the pruning windows", name)
    calib = plays.windows(tok, plays.text(s["calibration"]), int(s["n_calib"]), length, bos)
    evalset = plays.windows(tok, plays.text(s["evaluation"]), int(s["n_eval"]), length, bos)
    dev = next(bridge.parameters()).device
    cfg = {**s, "top_r": top_r, "max_rows": max_rows}
    with Progress(name, "coax_lm_pruning", 3, every) as prog:
        prog.watch(bridge)
        ident = f"{model_identity(folder)} numerics {numerics} device {device}"
        tables = run(bridge, calib.to(dev), evalset.to(dev), cfg, prog, checkpoint, ident)
    t = tables["perplexity"]
    head = t[t["is_headline"]].set_index("method")["perplexity"]
    said = ", ".join(f"{m} {head[m]:.1f}" for m in METHODS if m in head)
    reason = (
        f"perplexity at {float(s['headline']):.0%} of the heads removed: {said} ({s['evaluation']}, "
        f"{int(s['n_eval'])} windows of {length} tokens; scored on {s['calibration']}, {int(s['n_calib'])} windows)"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = [name, "pruning", "ran", reason, time.process_time() - t0, rss, str(folder), model_identity(folder)]
    tables["status"] = pd.DataFrame([dict(zip(STATUS_COLUMNS, row))], columns=STATUS_COLUMNS)
    return tables
