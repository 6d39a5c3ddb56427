"""Paper C's circuit localization experiment: one method's scores and faithfulness curves
(``localize``), the comparisons over a task's models (``localization_summary``) and
MIB's own models and datasets when present locally (``run_mib``). The published claims
read these tables in :mod:`selfrepair.gim.claims`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from selfrepair.gim.attribute import EACTP_MAX_EDGES, exact_patching_rows, method_scores, too_large
from selfrepair.gim.evaluate import FRACTIONS, check_ascending, cmd, cpr, faithfulness_curves, greedy_tie_spread
from selfrepair.gim.graph import Graph, selection_rule, ungroups
from selfrepair.gim.hooks import on_prepared
from selfrepair.tasks.counterfactual import CounterfactualBatch

if TYPE_CHECKING:
    import pandas as pd


# ---------------------------------------------------------------- experiment -----
@on_prepared
def localize(
    bridge,
    data: CounterfactualBatch,
    method: str,
    fractions=FRACTIONS,
    batch_size: int = 64,
    ig_steps: int = 5,
    weighting: str = "example",
    tie_orders: int = 0,
):
    """Scores of one method (``weighting``: :func:`attribute.edge_scores`'s; "mib" puts
    the gradient methods' scores on MIB's scale and makes EActP the mean of batch
    means, :func:`attribute.method_scores`), and its two faithfulness curves (signed
    and absolute), with the method's circuit selection rule (:func:`selection_rule`:
    greedy for ``ifr``). For a greedy method, ``tie_orders`` > 0 adds the range of CPR
    and CMD over that many sampled tie orders and ours (:func:`evaluate.greedy_tie_spread`).

    Returns (graph, scores, curves DataFrame, summary dict with CPR and CMD).
    """
    import pandas as pd

    check_ascending(fractions)  # before the scores: CPR and CMD over a descending order flip sign
    graph = Graph.from_bridge(bridge)
    scores = method_scores(bridge, graph, data, method, batch_size, ig_steps, weighting)
    rows = []
    summary = {"method": method, "n_edges": graph.n_edges}
    curves = faithfulness_curves(  # both rankings' circuits together: m_full, m_empty once
        bridge, graph, data, scores, fractions, (False, True), batch_size, selection=selection_rule(method)
    )
    for kind, absolute in (("signed", False), ("absolute", True)):
        curve = curves[absolute]
        for p in curve["points"]:
            rows.append(
                {"method": method, "ranking": kind, **p, "m_full": curve["m_full"], "m_empty": curve["m_empty"]}
            )
        f = [p["faithfulness"] for p in curve["points"]]
        if absolute:
            summary["cmd"] = cmd(fractions, f)
        else:
            summary["cpr"] = cpr(fractions, f)
        summary["m_full"], summary["m_empty"] = curve["m_full"], curve["m_empty"]
    if tie_orders and selection_rule(method) == "greedy":
        summary.update(greedy_tie_spread(bridge, graph, data, scores, fractions, batch_size, tie_orders))
    return graph, scores, pd.DataFrame(rows), summary


# localize's summary keys for a greedy method's spread over tie orders
TIE_RANGES = ["cpr_tie_min", "cpr_tie_max", "cmd_tie_min", "cmd_tie_max"]
TIE_COLUMNS = ["tie_orders", "tie_orders_moved", *TIE_RANGES]


# ---------------------------------------------------------------- models ---------
# (a, b): a row "a - b" of paired differences; the newest methods against GIM
SUMMARY_PAIRS = (("gim", "eap"), ("gim", "eap-ig"), ("relp", "gim"), ("eap-gp", "gim"))


def localization_summary(localization: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mean CPR and CMD over a task's independently trained models, with a t-interval.

    ``localization`` has one row per (task, model, seed, method); a model is a
    (model, seed) pair (no ``seed`` column: one seed). Rows per task, plus task
    ``all`` pooling every task's models:

    - ``row == "method"``: each method's mean CPR / CMD over the models and the
      Student-t CI of that mean (``stats.t_interval``; NaN with one model);
    - ``row == "difference"``, ``method == "a - b"`` for each pair of
      :data:`SUMMARY_PAIRS` present (``gim - eap``, ``gim - eap-ig``, ``relp - gim``,
      ``eap-gp - gim``): the per-model paired difference, its mean and t-CI, and in how
      many models a is better (``cpr_wins``: CPR higher; ``cmd_wins``: CMD lower; ties
      count for neither).

    A greedy method's rows (IFR) also give the range over sampled tie orders
    (:func:`localize`'s ``tie_orders``, :func:`evaluate.greedy_tie_spread`: an estimate): ``cpr_tie_min`` / ``cpr_tie_max`` (and CMD's),
    the mean over the models of each model's lowest / highest value; NaN elsewhere.
    """
    import pandas as pd

    from selfrepair.core.stats import t_interval

    df = localization.copy()
    if "seed" not in df:
        df["seed"] = 0
    keys = ["model", "seed"]
    rows = []
    groups = [(t, g) for t, g in df.groupby("task", sort=False)]
    if df["task"].nunique() > 1:
        groups.append(("all", df))
    for task, g in groups:
        unit = ["task"] + keys
        for method, m in g.groupby("method", sort=False):
            row = {"task": task, "row": "method", "method": method, "n_models": len(m[unit].drop_duplicates())}
            for metric in ("cpr", "cmd"):
                ci = t_interval(m[metric], level)
                row.update({f"{metric}_mean": ci["mean"], f"{metric}_lo": ci["lo"], f"{metric}_hi": ci["hi"]})
            row.update({c: m[c].mean() for c in TIE_RANGES if c in m})
            rows.append(row)
        for a, b in SUMMARY_PAIRS:
            if not {a, b} <= set(g["method"]):
                continue
            piv = {metric: g.pivot_table(index=unit, columns="method", values=metric) for metric in ("cpr", "cmd")}
            diff = {metric: (p[a] - p[b]).dropna() for metric, p in piv.items()}
            row = {"task": task, "row": "difference", "method": f"{a} - {b}", "n_models": len(diff["cpr"])}
            for metric, d in diff.items():
                ci = t_interval(d, level)
                row.update({f"{metric}_mean": ci["mean"], f"{metric}_lo": ci["lo"], f"{metric}_hi": ci["hi"]})
            row.update(cpr_wins=int((diff["cpr"] > 0).sum()), cmd_wins=int((diff["cmd"] < 0).sum()))
            rows.append(row)
    cols = [
        "task",
        "row",
        "method",
        "n_models",
        "cpr_mean",
        "cpr_lo",
        "cpr_hi",
        "cmd_mean",
        "cmd_lo",
        "cmd_hi",
        "cpr_wins",
        "cmd_wins",
        *TIE_RANGES,
    ]
    out = pd.DataFrame(rows, columns=cols)
    return out.astype({"cpr_wins": "Int64", "cmd_wins": "Int64"})


# ---------------------------------------------------------------- MIB ------------
def check_supported(bridge) -> None:
    """Edge patching needs every node's output to reach the residual stream additively,
    except heads behind a post-attention norm (Gemma-2, Gemma-3), patched by MIB's convention
    (:func:`evaluate.patched`: the norm recomputed on the mixed sum of a layer's heads).

    NotImplementedError, naming the layer, when a post-norm is not where that convention
    and the node hooks assume it (:mod:`selfrepair.gim.hooks`): the post-attention norm's
    output must be ``hook_attn_out`` and its input hookable; behind a post-MLP norm the MLP
    node (``hook_mlp_out``) must be the norm's output, or MLP edges would not add up."""
    hd = bridge.hook_dict
    with_norm = [any(n.startswith(f"blocks.{layer}.ln1_post.") for n in hd) for layer in range(bridge.cfg.n_layers)]
    if any(with_norm) and not all(with_norm):
        raise NotImplementedError(
            f"post-attention normalization in some layers only ({sum(with_norm)} of {len(with_norm)}): "
            "not supported by the edge patching on this bridge"
        )
    for layer in range(bridge.cfg.n_layers):
        pre = f"blocks.{layer}."
        if with_norm[layer]:
            norm = getattr(bridge.blocks[layer], "ln1_post", None)
            if (
                hd.get(pre + "hook_attn_out") is not hd.get(pre + "ln1_post.hook_out")
                or pre + "ln1_post.hook_in" not in hd
                or getattr(norm, "original_component", None) is None
            ):
                raise NotImplementedError(
                    f"post-attention normalization in layer {layer}: hook_attn_out is not the output of a "
                    "hookable ln1_post, so heads cannot be patched by MIB's convention (norm recomputed on "
                    "the mixed head sum) on this bridge"
                )
        if any(n.startswith(pre + "ln2_post.") for n in hd):
            if hd.get(pre + "hook_mlp_out") is not hd.get(pre + "ln2_post.hook_out"):
                raise NotImplementedError(
                    f"post-MLP normalization in layer {layer}: hook_mlp_out is not ln2_post's output, so the "
                    "MLP node's output does not add into the residual stream and its edges cannot be patched"
                )


MIB_STATUS_COLUMNS = ["model", "dataset", "status", "reason", "folder", "identity", "dtype", "batch_size", "plan"]


def _prepare(model: str, device: str, search_paths, dtype: str, budget: float, kv_inputs: str = "per_query_head"):
    """(bridge, tokenizer, where, shape, dtype name) of one MIB model in its precision
    (:func:`precision.resolve`), its key and value inputs as ``kv_inputs`` says
    (:data:`graph.KV_INPUTS`); DoesNotFit before loading when its weights alone pass
    the budget (``where``'s folder, identity and dtype are filled as they become known)."""
    import json

    from selfrepair.core import models as M
    from selfrepair.gim import memory, precision

    where = {"folder": "", "identity": "", "dtype": ""}
    try:
        folder = M.resolve_local(model, search_paths)
        config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
        name = precision.resolve(dtype, config.get("model_type", ""), device)
        where.update(folder=str(folder), identity=M.model_identity(folder), dtype=name)
        shape = memory.Shape.from_config(config) if config.get("model_type") in precision.MIB_DTYPES else None
        if shape is not None and ungroups(kv_inputs):
            shape = shape.ungrouped()
        if shape is not None:
            need = memory.plan(
                shape, "eap", 1, 1, name, device, _resident_embedding(config, name, device), _saved(config)
            )
            if need["total"] > budget * (1 - memory.MARGIN):
                raise memory.DoesNotFit(memory.refusal(model, need, budget, 1, name))
        bridge = M.load_bridge(folder, device, dtype=precision.torch_dtype(name), ungroup=ungroups(kv_inputs))
    except Exception as err:
        err.where = where  # the status rows name what was found before the failure
        raise
    return bridge, M.folder_tokenizer(model, search_paths), where, shape, config


def _resident_embedding(config: dict, dtype: str, device: str) -> bool:
    """Whether the input embedding is resident in full: on a GPU, or when loading
    converts the checkpoint's dtype; on the CPU a checkpoint read in its own dtype stays
    mapped from the file and only the rows read count (:mod:`selfrepair.gim.memory`)."""
    return str(device).startswith("cuda") or _saved(config) != dtype


def _saved(config: dict) -> str:
    """The dtype the checkpoint's ``config.json`` says its tensors are saved in."""
    saved = str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", "")
    return saved if saved in ("float32", "bfloat16") else "float32"


def _pair_plan(model, shape, config, methods, data, dtype, device, batch_size, weighting, budget):
    """(batch, plan) of one (model, dataset): ``batch_size`` or, for ``"auto"``, the
    largest of :func:`memory.batch_choices` that fits; DoesNotFit with the plan's
    numbers when none (or the batch set) does not fit. The plan is the costliest
    method's; a model the plan does not know (no MIB architecture) is not planned."""
    from selfrepair.gim import memory

    auto = batch_size == "auto"
    choices = memory.batch_choices(len(data), divisors=weighting == "mib") if auto else [int(batch_size)]
    if shape is None:
        return (choices[0], None)
    resident = _resident_embedding(config, dtype, device)

    def plan_of(b):
        plans = [
            memory.plan(shape, m, b, data.clean.shape[1], dtype, device, resident, _saved(config)) for m in methods
        ]
        return max(plans, key=lambda p: p["total"])

    batch = memory.fitting_batch(plan_of, budget, choices)
    if batch is None:
        raise memory.DoesNotFit(memory.refusal(model, plan_of(choices[-1]), budget, choices[-1], dtype))
    return batch, plan_of(batch)


def _score_pair(bridge, graph, data, d, model, batch, job):
    """One (model, dataset)'s rows and curves over the job's methods, with its progress
    logged; (rows, curves, skipped) with the methods skipped for the graph's size."""
    from selfrepair.core.progress import Progress

    methods, most = job["methods"], job["eactp_max_edges"]
    run = [m for m in methods if not too_large(m, graph.n_edges, most)]
    skipped = [too_large(m, graph.n_edges, most) for m in methods if m not in run]
    rows, curves = [], []
    with Progress(model, f"MIB {d}", max(1, len(run)), job["every"]) as prog:
        prog.watch(bridge)
        for method in run:
            # EActP's rows are known (one run per edge and example): its ETA before it
            # ends; the faithfulness curves add a few more
            plan = exact_patching_rows(graph, len(data)) if method == "eactp" else None
            with prog.stage(method, rows=plan):
                _, _, curve, summary = localize(bridge, data, method, job["fractions"], batch, job["ig_steps"],
                                                job["weighting"], job["tie_orders"])  # fmt: skip
            rows.append({"task": d, "model": model, **summary})
            curves.append(curve.assign(task=d, model=model))
    return rows, curves, skipped


def _mib_pair(model, d, prepared, job):
    """(status row, localization rows, curves) of one (model, dataset): read, checked
    against the context, planned (:func:`_pair_plan`), scored (:func:`_score_pair`);
    a failure costs this pair's rows only (the status row says why)."""
    import logging

    from selfrepair.core import models as M
    from selfrepair.gim import memory
    from selfrepair.tasks import mib

    bridge, tokenizer, where, shape, config, graph = prepared
    row, stage = {"model": model, "dataset": d, "status": "not run", **where}, " reading the dataset"
    try:
        data = mib.load(d, tokenizer, job["n_eval"], job["search_paths"], bos=job["bos"])
        M.check_context(bridge, data.clean.shape[1], f"MIB {d}'s pairs", model)
        stage = ""
        batch, plan = _pair_plan(model, shape, config, job["methods"], data, where["dtype"], job["device"],
                                 job["batch_size"], job["weighting"], job["budget"])  # fmt: skip
        row.update(batch_size=batch, plan=memory.describe(plan) if plan else "")
        logging.getLogger(__name__).info("MIB %s on %s: batch %d, %s", d, model, batch, row["plan"] or "no plan")
        rows, curves, skipped = _score_pair(bridge, graph, data, d, model, batch, job)
    except M.WeightsChanged:
        raise
    except Exception as err:  # one pair's failure must not lose the others' results
        # DatasetRowError, ContextTooShort are ValueErrors
        quiet = isinstance(err, memory.DoesNotFit) or (stage and isinstance(err, (mib.DatasetNotFound, ValueError)))
        if not quiet:
            logging.getLogger(__name__).exception(
                "MIB %s on %s failed; its status row says so and the other pairs go on", d, model
            )
        return {**row, "reason": str(err) if quiet else f"failed{stage}: {type(err).__name__}: {err}"}, [], []
    rows = [{**r, "identity": where["identity"], "kv_inputs": job["kv_inputs"], "bos": job["bos"]} for r in rows]
    return {**row, "status": "ran", "reason": "; ".join([f"{len(data)} pairs"] + skipped)}, rows, curves


def run_mib(
    models: list[str],
    datasets: list[str],
    methods,
    n_eval: int,
    search_paths=None,
    batch_size: int | str = 32,
    ig_steps: int = 5,
    fractions=FRACTIONS,
    device: str = "cpu",
    eactp_max_edges: int = EACTP_MAX_EDGES,
    every: float = 30.0,
    weighting: str = "example",
    tie_orders: int = 0,
    dtype: str = "float32",
    memory_gb: float | None = None,
    kv_inputs: str = "per_query_head",
    bos: str = "mib",
):
    """MIB's circuit localization on every (model, dataset) present locally, with MIB's
    key/value inputs and BOS by default (``kv_inputs``, ``bos``: docs/MIB.md)
    (``weighting``, ``tie_orders``: :func:`localize`'s), each model in ``dtype``
    (``gim.mib.dtype``: :func:`precision.resolve`), at ``batch_size`` or, for ``"auto"``,
    the largest batch whose memory plan (:mod:`selfrepair.gim.memory`) fits the budget
    (``memory_gb``, else the device's free memory at the start).

    Returns (status DataFrame, :data:`MIB_STATUS_COLUMNS`; localization rows; curves).
    Absent weights or datasets, pairs longer than the model's context, a plan that does
    not fit at batch 1 (or at the batch set), and any error while one (model, dataset)
    runs give that pair a 'not run' row with the reason; the other pairs' results are
    kept. A method skipped for the graph's size (:func:`too_large`) is named in the
    reason. Each row of a model that was found names its folder, identity hash
    (:func:`models.model_identity`) and dtype; each that ran, its batch and its plan. The
    progress of each (model, dataset) is logged every ``every`` seconds.
    """
    import logging

    import pandas as pd

    from selfrepair.core import models as M
    from selfrepair.gim import memory

    log = logging.getLogger(__name__)
    job = dict(n_eval=n_eval, search_paths=search_paths, methods=list(methods), batch_size=batch_size,
               ig_steps=ig_steps, fractions=fractions, device=device, eactp_max_edges=eactp_max_edges,
               every=every, weighting=weighting, tie_orders=tie_orders, bos=bos, kv_inputs=kv_inputs)  # fmt: skip
    ungroups(kv_inputs)  # an unknown convention is refused before any model is read
    job["budget"] = memory.job_budget(device, memory_gb)
    log.info("MIB memory budget %.2f GB (%s)", job["budget"] / memory.GB, "set" if memory_gb else "measured")
    status, rows, curves = [], [], []
    for model in models:
        try:
            bridge, tokenizer, where, shape, config = _prepare(
                model, device, search_paths, dtype, job["budget"], kv_inputs
            )
            log.info("MIB model %s: folder %s, identity %s, dtype %s", model, *where.values())
            check_supported(bridge)
        except M.WeightsChanged:
            raise
        except Exception as err:  # a model that cannot be booted costs its rows, not the other models'
            where = getattr(err, "where", {})
            known = (M.ModelNotFound, M.CorruptCheckpoint, NotImplementedError, memory.DoesNotFit)
            if not isinstance(err, known):
                log.exception("MIB model %s cannot be prepared; its rows say so and the other models go on", model)
            reason = str(err) if isinstance(err, known) else f"failed: {type(err).__name__}: {err}"
            status += [{"model": model, "dataset": d, "status": "not run", "reason": reason, **where} for d in datasets]
            continue
        prepared = (bridge, tokenizer, where, shape, config, Graph.from_bridge(bridge))
        for d in datasets:
            row, got_rows, got_curves = _mib_pair(model, d, prepared, job)
            status.append(row)
            rows += got_rows
            curves += got_curves
    cols = ["task", "model", "method", "n_edges", "cpr", "cmd", "m_full", "m_empty", *TIE_COLUMNS, "identity",
            "kv_inputs", "bos"]  # fmt: skip
    return (
        pd.DataFrame(status, columns=MIB_STATUS_COLUMNS),
        pd.DataFrame(rows, columns=cols),
        pd.concat(curves) if curves else pd.DataFrame(),
    )
