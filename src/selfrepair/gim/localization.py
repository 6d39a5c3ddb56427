"""Paper C's circuit localization experiment: one method's scores and faithfulness curves
(``localize``), the comparisons over a task's models (``localization_summary``), the
published claims' evidence (``claims_evidence``) and MIB's own models and datasets when
present locally (``run_mib``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from selfrepair.gim.attribute import EACTP_MAX_EDGES, method_scores, too_large
from selfrepair.gim.evaluate import FRACTIONS, cmd, cpr, faithfulness_curves
from selfrepair.gim.graph import Graph, selection_rule
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
):
    """Scores of one method (``weighting``: :func:`attribute.edge_scores`'s; "mib" puts
    the gradient methods' scores on MIB's scale), and its two faithfulness curves (signed
    and absolute), with the method's circuit selection rule (:func:`selection_rule`:
    greedy for ``ifr``).

    Returns (graph, scores, curves DataFrame, summary dict with CPR and CMD).
    """
    import pandas as pd

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
    return graph, scores, pd.DataFrame(rows), summary


# ---------------------------------------------------------------- models ---------
SUMMARY_PAIRS = (("gim", "eap"), ("gim", "eap-ig"))


def localization_summary(localization: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mean CPR and CMD over a task's independently trained models, with a t-interval.

    ``localization`` has one row per (task, model, seed, method); a model is a
    (model, seed) pair (no ``seed`` column: one seed). Rows per task, plus task
    ``all`` pooling every task's models:

    - ``row == "method"``: each method's mean CPR / CMD over the models and the
      Student-t CI of that mean (``stats.t_interval``; NaN with one model);
    - ``row == "difference"``, ``method == "gim - eap"`` / ``"gim - eap-ig"``: the
      per-model paired difference, its mean and t-CI, and in how many models GIM is
      better (``cpr_wins``: CPR higher; ``cmd_wins``: CMD lower; ties count for neither).
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
    ]
    out = pd.DataFrame(rows, columns=cols)
    return out.astype({"cpr_wins": "Int64", "cmd_wins": "Int64"})


def claims_evidence(localization, selfrepair=None, fa=None, mib=None, summary=None) -> dict:
    """Measured values of paper C's claims from the localization table.

    ``summary``: ``localization_summary(localization)`` (computed when not given); the
    toy comparisons are quoted as means with a t-interval over models.

    The published claims are about MIB's models (GPT-2, Qwen-2.5, Gemma-2, Llama-3.1)
    and datasets; rows whose ``model`` is a toy model of this workflow are evidence,
    never a reproduction: those claims are reported 'not run' with the toy numbers.
    """
    from selfrepair.core.published import NotRun
    from selfrepair.core.stats import fmt_ci

    df = localization
    out = {}
    summ = localization_summary(df) if summary is None else summary
    pooled = summ[summ.task == ("all" if "all" in set(summ.task) else summ.task.iloc[0])]

    def ci(r, metric):
        return fmt_ci({"mean": r[f"{metric}_mean"], "lo": r[f"{metric}_lo"], "hi": r[f"{metric}_hi"]})

    toy = "; ".join(
        f"{r.method}: CPR {ci(r._asdict(), 'cpr')}, CMD {ci(r._asdict(), 'cmd')}"
        for r in pooled[pooled.row == "method"].itertuples()
    )
    diffs = summ[summ.row == "difference"]
    for pair, d in diffs.groupby("method", sort=False):
        per_task = ", ".join(
            f"{r.task} {ci(r._asdict(), 'cpr')} ({int(r.cpr_wins)}/{int(r.n_models)})"
            for r in d[d.task != "all"].itertuples()
        )
        p = d[d.task == pooled.task.iloc[0]].iloc[0]
        toy += (
            f"; paired CPR difference {pair.upper()} per model: {ci(p, 'cpr')}, GIM higher in "
            f"{int(p.cpr_wins)}/{int(p.n_models)} models (per task: {per_task})"
        )
    n_models = int(pooled.n_models.max()) if len(pooled) else 0
    reason = (
        "MIB models/datasets are not in the local cache, so the claim about them is not run; "
        f"on this workflow's toy models (mean over {n_models} models of all tasks, 95% t-interval over "
        f"models; results/gim/tables/localization_summary.csv): {toy}"
    )
    out["gim_best_mean_cpr"] = NotRun(reason)
    if mib is not None and len(mib) and {"gim", "eap", "eap-ig"} <= set(mib.method):
        from selfrepair.core.published import Holds

        m = mib.groupby("method").cpr.mean()
        pairs = mib[["task", "model"]].drop_duplicates()
        others = [k for k in ("eap", "eap-ig", "ifr") if k in m]  # the claim's baselines that run here
        holds = bool(all(m["gim"] > m[k] for k in others))
        out["gim_best_mean_cpr"] = Holds(
            holds,
            "MIB models present locally, mean CPR over "
            f"{len(pairs)} (model, dataset) pairs: "
            + ", ".join(f"{k} {v:.3f}" for k, v in m.items())
            + " (Hybrid-ens is not implemented here)"
            + _model_files(mib),
        )
    if {"gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm"} <= set(df.method):
        unit = ["task", "model"] + (["seed"] if "seed" in df else [])
        piv = df.pivot_table(index=unit, columns="method", values="cpr")
        lower = sum(int((piv[v] < piv["gim"]).sum()) for v in ("gim-no-tsg", "gim-no-ln", "gim-no-norm"))
        n = 3 * len(piv)
        out["gim_ablation_each_modification"] = NotRun(
            f"not run on MIB models; on toy models removing one modification lowered CPR in {lower}/{n} "
            f"({', '.join(unit)}, modification) cases"
        )
    if selfrepair is not None and len(selfrepair):
        occ = "; ".join(
            f"{r.task}/{r.model}: {r.occurrences_mean:.1f} (min {r.occurrences_min}, max {r.occurrences_max})"
            for r in selfrepair.itertuples()
        )
        out["gim_selfrepair_occurrences"] = NotRun(
            f"the claim is about LLMs (not in the local cache); toy models, occurrences per input: {occ}"
        )
        sup = "; ".join(
            f"{r.task}/{r.model}: joint > sum in {r.frac_joint_exceeds_sum:.0%} of {r.n_rows_ablated} rows, "
            f"median interaction {r.interaction_median:.2f}"
            for r in selfrepair.itertuples()
        )
        out["gim_joint_ablation_superadditive"] = NotRun(f"the claim is about LLMs; toy models: {sup}")
    if fa is not None and len(fa):
        m = fa.groupby("method")[["comprehensiveness", "sufficiency", "ground_truth_hit"]].mean()
        txt = "; ".join(
            f"{k}: comp {r.comprehensiveness:.3f}, suff {r.sufficiency:.3f}, hit {r.ground_truth_hit:.2f}"
            for k, r in m.iterrows()
        )
        out["gim_fa_comprehensiveness_sufficiency"] = NotRun(
            f"the claim is about instruction-tuned LLMs (not in the local cache); classification toy task, "
            f"mean over models: {txt}"
        )
    out.setdefault(
        "gim_fa_comprehensiveness_sufficiency",
        NotRun(
            "feature attribution (comprehensiveness/sufficiency vs Gradient x Input, IG, DeepLIFT, LRP) is not "
            "implemented in this workflow yet"
        ),
    )
    return out


# ---------------------------------------------------------------- MIB ------------
def _model_files(mib: pd.DataFrame) -> str:
    """'; model files: gpt2 (identity ...), ...': which model files produced the MIB numbers."""
    if "identity" not in mib:
        return ""
    ids = mib[["model", "identity"]].drop_duplicates()
    return "; model files: " + ", ".join(f"{m} (identity {i})" for m, i in zip(ids.model, ids.identity))


def check_supported(bridge) -> None:
    """Edge patching needs every node's output to reach the residual stream additively,
    except heads behind a post-attention norm (Gemma-2), patched by MIB's convention
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


def _model_tokenizer(model: str, search_paths, bridge):
    """The model folder's own ``tokenizer.json`` read directly (``AutoTokenizer`` in
    transformers 5 maps some model types to a fixed tokenizer class), else the bridge's."""
    from transformers import PreTrainedTokenizerFast

    from selfrepair.core.models import resolve_local

    folder = resolve_local(model, search_paths)
    if (folder / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    return bridge.tokenizer


MIB_STATUS_COLUMNS = ["model", "dataset", "status", "reason", "folder", "identity"]


def run_mib(
    models: list[str],
    datasets: list[str],
    methods,
    n_eval: int,
    search_paths=None,
    batch_size: int = 32,
    ig_steps: int = 5,
    fractions=FRACTIONS,
    device: str = "cpu",
    eactp_max_edges: int = EACTP_MAX_EDGES,
    every: float = 30.0,
    weighting: str = "example",
):
    """MIB's circuit localization on every (model, dataset) present locally
    (``weighting``: :func:`localize`'s).

    Returns (status DataFrame, :data:`MIB_STATUS_COLUMNS`; localization rows; curves).
    Absent weights or datasets, pairs longer than the model's context, and any error
    while one (model, dataset) runs give that pair a 'not run' row with the reason; the
    other pairs' results are kept. A method skipped for the graph's size
    (:func:`too_large`) is named in the reason. Each row of a model that was found names
    its folder and identity hash (:func:`models.model_identity`); the progress of each
    (model, dataset) is logged every ``every`` seconds, one stage per method.
    """
    import logging

    import pandas as pd

    from selfrepair.core import models as M
    from selfrepair.core.progress import Progress
    from selfrepair.tasks import mib

    log = logging.getLogger(__name__)
    status, rows, curves = [], [], []
    for model in models:
        where = {"folder": "", "identity": ""}
        try:
            bridge, folder, identity = M.load_identified(model, device, search_paths)
            where = {"folder": str(folder), "identity": identity}
            log.info("MIB model %s: folder %s, identity %s", model, where["folder"], where["identity"])
            check_supported(bridge)
            tokenizer = _model_tokenizer(model, search_paths, bridge)
        except M.WeightsChanged:
            raise
        except (M.ModelNotFound, M.CorruptCheckpoint, NotImplementedError) as err:
            status += [
                {"model": model, "dataset": d, "status": "not run", "reason": str(err), **where} for d in datasets
            ]
            continue
        except Exception as err:  # a model that cannot be booted costs its rows, not the other models'
            log.exception("MIB model %s cannot be prepared; its rows say so and the other models go on", model)
            reason = f"failed: {type(err).__name__}: {err}"
            status += [{"model": model, "dataset": d, "status": "not run", "reason": reason, **where} for d in datasets]
            continue
        n_edges = Graph.from_bridge(bridge).n_edges
        for d in datasets:
            try:
                data = mib.load(d, tokenizer, n_eval, search_paths)
                M.check_context(bridge, data.clean.shape[1], f"MIB {d}'s pairs", model)
            except (mib.DatasetNotFound, ValueError) as err:  # DatasetRowError, ContextTooShort are ValueErrors
                status.append({"model": model, "dataset": d, "status": "not run", "reason": str(err), **where})
                continue
            except Exception as err:  # the tokenizer on an odd row: this pair's rows, not the job
                log.exception(
                    "MIB %s cannot be read for %s; its status row says so and the other pairs go on", d, model
                )
                reason = f"failed reading the dataset: {type(err).__name__}: {err}"
                status.append({"model": model, "dataset": d, "status": "not run", "reason": reason, **where})
                continue
            skipped, got_rows, got_curves = [], [], []
            try:
                run = [m for m in methods if not too_large(m, n_edges, eactp_max_edges)]
                skipped = [too_large(m, n_edges, eactp_max_edges) for m in methods if m not in run]
                with Progress(model, f"MIB {d}", max(1, len(run)), every) as prog:
                    prog.watch(bridge)
                    for method in run:
                        with prog.stage(method):
                            _, _, curve, summary = localize(
                                bridge, data, method, fractions, batch_size, ig_steps, weighting
                            )
                        got_rows.append({"task": d, "model": model, **summary, "identity": where["identity"]})
                        got_curves.append(curve.assign(task=d, model=model))
            except M.WeightsChanged:
                raise
            except Exception as err:  # one pair's failure must not lose the others' results
                log.exception("MIB %s on %s failed; its status row says so and the other pairs go on", d, model)
                reason = f"failed: {type(err).__name__}: {err}"
                status.append({"model": model, "dataset": d, "status": "not run", "reason": reason, **where})
                continue
            rows += got_rows
            curves += got_curves
            reason = "; ".join([f"{len(data)} pairs"] + skipped)
            status.append({"model": model, "dataset": d, "status": "ran", "reason": reason, **where})
    cols = ["task", "model", "method", "n_edges", "cpr", "cmd", "m_full", "m_empty", "identity"]
    return (
        pd.DataFrame(status, columns=MIB_STATUS_COLUMNS),
        pd.DataFrame(rows, columns=cols),
        pd.concat(curves) if curves else pd.DataFrame(),
    )
