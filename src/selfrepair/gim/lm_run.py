"""Paper C's experiments on one real LM (rule gim_lm): which MIB-format tasks the model
solves (the accuracy gate on held-out prompts), circuit localization of every method on
each solved task with CPR / CMD and their bootstrap intervals over the pairs
(:mod:`selfrepair.gim.lm_pairs`), and GIM's feature attribution on the IOI prompts.

The datasets are :mod:`selfrepair.tasks.mib_synth`'s, read by ``tasks.mib.load`` as
MIB's own (its batch weighting ``mib`` and batch of 20 kept). Prompts are tokenized by the
checkpoint's own ``tokenizer.json``, with the BOS as ``gim.bos`` says (MIB's by default:
the tokenizer's BOS token first, Gemma-3's ``<bos>``, SmolLM2's ``<|im_start|>``), and
the model is booted with its key and value inputs as ``gim.kv_inputs`` says (MIB's by
default: one per query head); each localization row names both. A failure in one
(task, method) costs only its row of ``status``.
"""

from __future__ import annotations

import logging
import time

import pandas as pd
import torch

STATUS_COLUMNS = ["model", "task", "part", "method", "status", "reason", "cpu_s"]
LOG = logging.getLogger(__name__)


def choice_ids(task: str, tokenizer, n: int):
    """[n, 4] ids of the MCQA labels (the choices the accuracy compares), None elsewhere."""
    from selfrepair.tasks import mib, mib_synth

    if task != "copycolors_mcqa":
        return None
    ids = [mib.answer_tokens(tokenizer, label)[0] for label in mib_synth.LABELS]
    return torch.tensor([ids] * n)


def task_rows(bridge, tokenizer, name: str, s: dict, data_dir: str) -> list[dict]:
    """One row per task of ``s["tasks"]``: held-out accuracy on ``s["n_gate"]`` validation
    prompts, chance, and whether it enters the run (:func:`lm_pairs.gate`, margin
    ``s["gate_margin"]``)."""
    from selfrepair.gim import lm_pairs
    from selfrepair.tasks import mib, mib_synth

    rows = []
    for task in s["tasks"]:
        margin = float(s.get("gate_margin", lm_pairs.GATE_MARGIN))
        row = {"model": name, "task": task, "chance": mib_synth.CHANCE[task], "margin": margin}
        try:
            data = mib.load(task, tokenizer, int(s["n_gate"]), [data_dir], split="validation", bos=s["bos"])
            ok = lm_pairs.correct(bridge, data, choice_ids(task, tokenizer, len(data)), int(s["batch_size"]))
            acc = float(ok.float().mean())
            solved, why = lm_pairs.gate(acc, row["chance"], margin)
            row.update(n=len(data), accuracy=acc, solved=solved, reason=why, positions=int(data.clean.shape[1]))
        except Exception as err:  # noqa: BLE001  a task that cannot be read or run is not solved
            LOG.exception("task %s on %s failed", task, name)
            row.update(n=0, accuracy=float("nan"), solved=False, reason=f"failed: {type(err).__name__}: {err}")
        LOG.info("%s %s: %s", name, task, row["reason"])
        rows.append(row)
    return rows


def _timed(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def localize_task(bridge, graph, data, name: str, task: str, s: dict, prog):
    """(status rows, localization rows, curve rows, contrast rows: GIM against each other
    method, paired over the pairs) of every method on one task.

    Each method scores the edges; then every method's circuits are run together
    (:func:`lm_pairs.pair_curves_many`: the corrupted run, the whole model and the empty
    circuit once for all, each method's numbers bit for bit its own run's), and each
    method's ``curves_cpu_s`` is an equal share of that run. Should the shared run fail,
    each method's circuits are run on their own, so one method's failure costs its row
    only."""
    from selfrepair.gim import lm_pairs
    from selfrepair.gim.attribute import method_scores, too_large

    status, scored = {}, {}  # status: {method: its row}, written in the methods' order
    for method in s["methods"]:
        head = {"model": name, "task": task, "part": "localization", "method": method}
        if why := too_large(method, graph.n_edges, int(s["eactp_max_edges"])):
            status[method] = {**head, "status": "not run", "reason": why}
            continue
        try:
            with prog.stage(f"{task} {method}"):
                scored[method] = _timed(lambda: method_scores(bridge, graph, data, method, int(s["batch_size"]),
                                                              int(s["ig_steps"]), str(s["weighting"])))  # fmt: skip
        except Exception as err:  # noqa: BLE001  one method's failure costs its row only
            LOG.exception("%s %s %s failed", name, task, method)
            status[method] = {**head, "status": "failed", "reason": f"{type(err).__name__}: {err}"}
    with prog.stage(f"{task} curves of {len(scored)} methods"):
        curves_of = _curves(bridge, graph, data, {m: sc for m, (sc, _) in scored.items()}, s, name, task)
    summary, curves, per_method = [], [], {}
    fr = tuple(s["fractions"])
    for method, (_, t_score) in scored.items():
        head = {"model": name, "task": task, "part": "localization", "method": method}
        pp, t_curve = curves_of[method]
        if isinstance(pp, Exception):
            status[method] = {**head, "status": "failed", "reason": f"{type(pp).__name__}: {pp}"}
            continue
        ci = lm_pairs.pair_bootstrap(pp, fr, int(s["n_boot"]), int(s["boot_seed"]))
        per_method[method] = pp
        conv = {k: s.get(k, "") for k in ("kv_inputs", "bos", "bos_first")}
        summary.append(
            {**head, "n_edges": graph.n_edges, **conv, **ci, "score_cpu_s": t_score, "curves_cpu_s": t_curve}
        )
        curves += [{**head, **r} for r in lm_pairs.curve_rows(pp, fr)]
        status[method] = {**head, "status": "ran", "reason": f"{len(data)} pairs", "cpu_s": t_score + t_curve}
    status = [status[m] for m in s["methods"] if m in status]
    contrasts = lm_pairs.contrast_rows(per_method, "gim", fr, int(s["n_boot"]), int(s["boot_seed"]))
    return status, summary, curves, [{"model": name, "task": task, **c} for c in contrasts]


def _curves(bridge, graph, data, scores: dict, s: dict, name: str, task: str) -> dict:
    """{method: (per-pair curves or the exception that stopped them, CPU seconds)}: all
    methods' circuits in one run, or, if that fails, each method's on its own."""
    from selfrepair.gim import lm_pairs
    from selfrepair.gim.graph import selection_rule

    fr, bs = tuple(s["fractions"]), int(s["batch_size"])
    if not scores:
        return {}
    try:
        sel = {m: selection_rule(m) for m in scores}
        many, t = _timed(lambda: lm_pairs.pair_curves_many(bridge, graph, data, scores, fr, bs, sel))
        return {m: (many[m], t / len(scores)) for m in scores}
    except Exception:  # noqa: BLE001  then each method on its own: a failure costs its row
        LOG.exception("%s %s: the shared curve run failed; each method's circuits on their own", name, task)
    out = {}
    for m, sc in scores.items():
        try:
            out[m] = _timed(lambda: lm_pairs.pair_curves(bridge, graph, data, sc, fr, bs, selection_rule(m)))
        except Exception as err:  # noqa: BLE001
            LOG.exception("%s %s %s curves failed", name, task, m)
            out[m] = (err, 0.0)
    return out


def ioi_truth(data) -> torch.Tensor:
    """[N, T] bool: the positions of the indirect object's name in each clean prompt (the
    token of the answer), the tokens an IOI attribution should rank first."""
    return data.clean == data.answer[:, None]


def feature_attribution(bridge, tokenizer, data, name: str, s: dict) -> tuple[list[dict], list[dict]]:
    """(status rows, per-example rows) of GIM's feature attribution and its baselines
    (:mod:`selfrepair.gim.feature_attribution`) on the first ``s["fa"]["n_examples"]``
    IOI prompts, each cut at its read position, the target the IO name's logit, the
    baseline token the tokenizer's pad (else EOS) token. A method's failure costs its rows."""
    from selfrepair.gim import feature_attribution as fa
    from selfrepair.tasks.counterfactual import CounterfactualBatch

    f = s["fa"]
    base = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    truth = ioi_truth(data)
    status, rows = [], []
    for method in f["methods"]:
        head = {"model": name, "task": "ioi", "part": "feature_attribution", "method": method}
        t = time.process_time()
        try:
            for i in range(min(int(f["n_examples"]), len(data))):
                T = int(data.pos[i]) + 1
                one = CounterfactualBatch(data.clean[i : i + 1, :T], data.corrupt[i : i + 1, :T],
                                          data.answer[i : i + 1], data.foil[i : i + 1], torch.tensor([T - 1]))  # fmt: skip
                df = fa.evaluate(bridge, one, truth[i : i + 1, :T], base, (method,), int(f["ig_steps"]))
                rows += [{**head, **r, "example": i} for r in df.to_dict("records")]
        except Exception as err:  # noqa: BLE001
            LOG.exception("%s feature attribution %s failed", name, method)
            rows = [r for r in rows if r["method"] != method]
            status.append({**head, "status": "failed", "reason": f"{type(err).__name__}: {err}"})
            continue
        n = min(int(f["n_examples"]), len(data))
        status.append({**head, "status": "ran", "reason": f"{n} prompts", "cpu_s": time.process_time() - t})
    return status, rows


def settings(lms: dict, gim: dict, scale: str = "default") -> dict:
    """The settings :func:`run_lm` takes, from the ``gim.lms`` section (its ``large`` sizes
    when ``scale`` is "large") and the gim section's fractions, integration steps,
    weighting, EActP limit, data seed (the bootstrap's seed), key/value inputs
    (``kv_inputs``, :data:`graph.KV_INPUTS`) and BOS (``bos``, :data:`tasks.mib.BOS_MODES`)."""
    sized = {k: lms[k] for k in ("n_eval", "n_gate", "methods", "fa_examples", "fa_methods")}
    sized.update(lms["large"] if scale == "large" else {})
    return {
        "tasks": list(lms["tasks"]), "n_eval": int(sized["n_eval"]), "n_gate": int(sized["n_gate"]),
        "batch_size": int(lms["batch_size"]), "gate_margin": float(lms["gate_margin"]),
        "methods": list(sized["methods"]), "n_boot": int(lms["n_boot"]), "boot_seed": int(gim["data_seed"]),
        "fractions": list(gim["fractions"]), "ig_steps": int(gim["ig_steps"]), "weighting": str(gim["weighting"]),
        "eactp_max_edges": int(gim["eactp_max_edges"]),
        "kv_inputs": str(gim.get("kv_inputs", "per_query_head")), "bos": str(gim.get("bos", "mib")),
        "fa": {"n_examples": int(sized["fa_examples"]), "ig_steps": int(lms["fa_ig_steps"]),
               "methods": list(sized["fa_methods"])},
    }  # fmt: skip


def run_lm(folder, name: str, data_dir, s: dict, device: str = "cpu", every: float = 30.0) -> dict:
    """Every part on one LM: {"status", "tasks", "localization", "curves",
    "feature_attribution"} tables. ``s``: the ``gim.lms`` settings (one scale), with the
    gim section's ``fractions``, ``ig_steps``, ``weighting``, ``eactp_max_edges``."""
    from selfrepair.core.models import folder_tokenizer, load_bridge
    from selfrepair.core.progress import Progress
    from selfrepair.gim.graph import Graph, ungroups
    from selfrepair.gim.localization import check_supported
    from selfrepair.tasks import mib

    s = {"kv_inputs": "per_query_head", "bos": "mib", **s}  # MIB's conventions unless said
    bridge = load_bridge(folder, device, ungroup=ungroups(s["kv_inputs"]))
    tokenizer = folder_tokenizer(str(folder), None)  # the checkpoint's own, as gim_mib reads it
    s = {**s, "bos_first": mib.bos_first(tokenizer, s["bos"])}  # what each localization row states
    tasks = task_rows(bridge, tokenizer, name, s, str(data_dir))
    solved = [r["task"] for r in tasks if r["solved"]]
    status, summary, curves, contrasts, fa_rows = [], [], [], [], []
    graph = Graph.from_bridge(bridge)
    check_supported(bridge)
    fa_on = bool(s["fa"]["methods"] and s["fa"]["n_examples"])
    stages = len(solved) * (len(s["methods"]) + 1) + int(fa_on and "ioi" in solved)  # + each task's curves
    with Progress(name, "GIM on the LM", max(1, stages), every) as prog:
        prog.watch(bridge)
        for task in solved:
            data = mib.load(task, tokenizer, int(s["n_eval"]), [str(data_dir)], split="test", bos=s["bos"])
            got = localize_task(bridge, graph, data, name, task, s, prog)
            status, summary, curves, contrasts = status + got[0], summary + got[1], curves + got[2], contrasts + got[3]
            if task == "ioi" and fa_on:
                with prog.stage("ioi feature attribution"):
                    st, rows = feature_attribution(bridge, tokenizer, data, name, s)
                status, fa_rows = status + st, fa_rows + rows
    for r in tasks:
        if not r["solved"]:
            status.append({"model": name, "task": r["task"], "part": "localization", "method": "",
                           "status": "not run", "reason": f"task not solved: {r['reason']}"})  # fmt: skip
    return {
        "status": pd.DataFrame(status, columns=STATUS_COLUMNS),
        "tasks": pd.DataFrame(tasks),
        "localization": pd.DataFrame(summary),
        "curves": pd.DataFrame(curves),
        "contrasts": pd.DataFrame(contrasts),
        "feature_attribution": pd.DataFrame(fa_rows),
    }
