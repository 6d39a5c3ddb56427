"""The papers' analyses on one model and one set of counterfactual pairs (or, for G vs
C, one of paper A's sequence tasks), each returning its tables: the library calls the
workflow's own rules make, wired for a model and data of one's own. Nothing here
reimplements a method; every score comes from the paper packages and the ground truth.
"""

from __future__ import annotations

import pandas as pd


class NotRun(Exception):
    """An analysis that cannot run on this model or data; the message says why."""


def logit_diff_metric(data):
    """The mean logit difference of answer over foil at each pair's read position."""
    from selfrepair.gim.evaluate import logit_diff

    return lambda logits: logit_diff(logits, data).mean()


def edges(bridge, data, s: dict, circuits_dir) -> tuple[dict, list[str]]:
    """Paper C's localization (rule gim_localize's calls) for every method of
    ``s["methods"]``: tables localization (CPR, CMD per method), curves (faithfulness,
    signed and absolute) and edges (every edge's score per method), a MIB circuit file
    per method in ``circuits_dir``; and the methods skipped for the graph's size."""
    from pathlib import Path

    from selfrepair.gim import edge_table, write_circuit
    from selfrepair.gim.attribute import too_large
    from selfrepair.gim.graph import Graph
    from selfrepair.gim.localization import check_supported, localize

    try:
        check_supported(bridge)
    except NotImplementedError as err:
        raise NotRun(f"edge patching is not supported on this model: {err}") from None
    n_edges = Graph.from_bridge(bridge).n_edges
    summaries, curves, edge_rows, skipped = [], [], [], []
    for method in s["methods"]:
        if why := too_large(method, n_edges, int(s["eactp_max_edges"])):
            skipped.append(why)
            continue
        graph, scores, curve, summary = localize(
            bridge, data, method, tuple(s["fractions"]), int(s["batch_size"]), int(s["ig_steps"]),
            str(s["weighting"]), int(s["tie_orders"]),
        )  # fmt: skip
        write_circuit(Path(circuits_dir) / f"{method}.json", graph, scores, method, float(s["circuit_fraction"]))
        summaries.append({**summary, "kv_inputs": s.get("kv_inputs", ""), "bos": s.get("bos", "")})
        curves.append(curve)
        edge_rows.append(edge_table(graph, scores).assign(method=method))
    tables = {
        "localization": pd.DataFrame(summaries),
        "curves": pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
        "edges": pd.concat(edge_rows, ignore_index=True) if edge_rows else pd.DataFrame(),
    }
    return tables, skipped


LONG_MINUTES = 10.0  # a Shapley estimate past this is said with the way out


def shapley_cost(n_players: int, coalitions: int, seconds: float, s: dict) -> tuple[str, bool]:
    """(the estimate of a Shapley analysis's cost, whether it is long): its players, the
    most coalitions they take, at ``seconds`` a coalition (one forward of the pairs, as
    measured here); a long one with every component as a player names the way out."""
    minutes = coalitions * seconds / 60
    what = (
        f"shapley of {s['name']}: {n_players} players (players: {s.get('players', 'all')}), at most "
        f"{coalitions:,} coalitions at {seconds:.3g} s each: up to about {minutes:.3g} min"
    )
    long = minutes > LONG_MINUTES
    if long and s.get("players", "all") == "all":
        what += (
            f". To play fewer: players: top in the own: entry {s['name']} (n_players, 16 by default, of largest "
            "single drop, and the rest as one player)"
        )
    return what, long


def seconds_per_coalition(bridge, data, max_rows: int) -> float:
    """One forward of the pairs' clean prompts (at most ``max_rows`` of them), timed: what
    each coalition of the ground truth's game costs, about."""
    import time

    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        bridge(data.clean[:max_rows])
        return time.perf_counter() - t0


def shapley(bridge, data, s: dict, hf_model=None) -> dict:
    """The ground truth (:func:`groundtruth.pipeline.run_on_model`, rule groundtruth_gim's
    calls): Shapley values of every head and MLP (or the entry's ``players``:
    ``top`` ``n_players`` components and the ``rest``, or ``layers``) for the logit
    difference under ``s["mode"]`` ablation (exact up to ``exact_max_players`` players,
    else sampled), pairwise interactions, every method's node scores, and each method's
    agreement with the Shapley values (rank correlations, top-k overlap, recall of what
    single ablation hides). ``hf_model``: a Hugging Face GPT-2's, to play the games on
    paper A's ablation engine (the same values)."""
    import logging

    from selfrepair.groundtruth import pipeline

    who = {k: s[k] for k in ("players", "n_players", "rest") if k in s}
    settings = pipeline.Settings(mode=s["mode"], **{**s["settings"], **who})
    n, coalitions = pipeline.coalition_bound(bridge.cfg.n_layers, bridge.cfg.n_heads, settings)
    said, long = shapley_cost(n, coalitions, seconds_per_coalition(bridge, data, settings.max_rows), s)
    log = logging.getLogger(__name__)
    (log.warning if long else log.info)("%s", said)
    out = pipeline.run_on_model(
        bridge, data, settings, int(s["top_k"]), float(s["single_frac"]), name=s["name"], hf_model=hf_model
    )
    return {k: out[k] for k in ("shapley", "interactions", "scores", "agreement")}


def single_ablation_primary(bridge, data, n_primary: int, mode: str, max_rows: int) -> list[str]:
    """The ``n_primary`` heads whose single ablation lowers the logit difference most
    (ties in head order): COAX's seed set when none is given."""
    from selfrepair.core import components as C
    from selfrepair.core import interventions
    from selfrepair.groundtruth.games import AblationGame

    heads = C.head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [data.clean], heads) if mode == "mean" else None
    rows = interventions.fit_rows(bridge, data.clean.shape[1], max_rows)  # 262k-token vocabularies: fewer rows
    game = AblationGame(bridge, data.clean, logit_diff_metric(data), mode, means, rows)
    v = game([[]] + [[h] for h in heads])
    drops = pd.Series({h.name: float(v[0] - v[i + 1]) for i, h in enumerate(heads)})
    return list(drops.sort_values(ascending=False, kind="stable").index[:n_primary])


def one_length(data):
    """The pairs of the most common prompt length (ties: the longest), cut to it: COAX
    reads the last position, which a right-padded shorter prompt does not end at.
    Returns (pairs, length)."""
    import torch

    from selfrepair.tasks.counterfactual import CounterfactualBatch

    lengths = data.pos + 1
    values, counts = torch.unique(lengths, return_counts=True)
    n = int(values[counts == counts.max()].max())
    keep = lengths == n
    cut = (data.clean[keep][:, :n], data.corrupt[keep][:, :n], data.answer[keep], data.foil[keep], data.pos[keep])
    return CounterfactualBatch(*cut), n


def coax(bridge, data, s: dict) -> tuple[dict, list[str]]:
    """Paper B's COAX scan of the heads outside the seed set, with every baseline
    (:func:`selfrepair.coax.coax_scores`), on the clean prompts with the logit
    difference as the baselines' metric; the seed set as given, else found by single
    ablation (:func:`single_ablation_primary`); on the pairs of one prompt length
    (:func:`one_length`). Returns ({"scores": table}, seed set, pairs used)."""
    from selfrepair.coax import coax_scores
    from selfrepair.core.components import parse
    from selfrepair.core.interventions import fit_rows

    seed = list(s.get("seed_set") or [])
    for h in seed:
        c = parse(h)
        if c.layer >= bridge.cfg.n_layers or c.head is None or c.head >= bridge.cfg.n_heads:
            raise NotRun(
                f"seed_set: {h} is no head of this model ({bridge.cfg.n_layers} layers of {bridge.cfg.n_heads} heads)"
            )
    data, _ = one_length(data)
    if not seed:
        seed = single_ablation_primary(bridge, data, int(s["n_primary"]), str(s["mode"]), int(s["max_rows"]))
    table = coax_scores(
        bridge, data.clean, seed, logit_diff_metric(data), protocol=str(s["protocol"]), top_r=int(s["top_r"]),
        ig_steps=int(s["ig_steps"]), max_rows=fit_rows(bridge, data.clean.shape[1], int(s["max_rows"])),
    )  # fmt: skip
    return {"scores": table.assign(seed_set=" ".join(seed))}, seed, data


def g_vs_c(model, s: dict) -> dict:
    """Paper A's G (weight-gradient norm, :func:`heroes.gradient_importance`) against C
    (accuracy drop under ablation with its paired SE and 95% interval, the calls of
    :func:`heroes.causal_importance`) of every head and MLP of a Hugging Face GPT-2 on
    sequence task ``s["task"]`` of ``s["length"]`` values; each component's role under
    mean ablation (hero, bloat, aligned at ``s["role_threshold"]``) with its bootstrap
    stability, and the bootstrap interval of Spearman's rho(G, C)
    (:func:`heroes.spread.bootstrap_roles`)."""
    from selfrepair.core import engine
    from selfrepair.core.components import all_components
    from selfrepair.heroes import gradient_importance, scores
    from selfrepair.heroes.spread import bootstrap_roles
    from selfrepair.tasks import sequences as S

    need = 2 * int(s["length"]) + 2  # START x1..xN SEP y1..yN (END is predicted)
    if model.config.vocab_size < S.VOCAB:
        raise NotRun(f"paper A's tasks use {S.VOCAB} tokens; the model's vocabulary has {model.config.vocab_size}")
    if need > model.config.n_positions:
        raise NotRun(
            f"the {s['task']} sequences of length {s['length']} are {need} tokens long, longer than the model's "
            f"context of {model.config.n_positions} tokens (n_ctx)"
        )
    seed, dev = int(s["data_seed"]), next(model.parameters()).device
    batches = S.fixed_length_batches(s["task"], int(s["length"]), int(s["n_batches"]), int(s["batch_size"]), seed)
    fresh = S.eval_set(s["task"], int(s["length"]), int(s["n_eval"]), seed + 1).to(dev)
    batches = [b.to(dev) for b in batches]
    G = gradient_importance(model, batches)
    comps = all_components(model.config.n_layer, model.config.n_head)
    means = engine.means(model, [b.tokens for b in batches], comps)  # causal_importance's calls, outcomes kept
    correct = {
        m: scores.ablation_correct(model, fresh, [[]] + [[c] for c in comps], m, means) for m in ("mean", "zero")
    }
    C = pd.concat([scores.causal_table(correct[m], [c.name for c in comps], m) for m in correct], ignore_index=True)
    C = C.assign(C_lo=C["C"] - 1.96 * C["C_se"], C_hi=C["C"] + 1.96 * C["C_se"])
    t = float(s["role_threshold"])
    roles, rho = bootstrap_roles(correct["mean"].T.cpu().numpy(), G["G"].to_numpy(), [t], seed=seed)
    roles = roles.rename(columns={f"role_t{t:g}": "role", f"stability_t{t:g}": "role_stability"})
    roles = roles.assign(component=G["component"], mode="mean", role_threshold=t, **rho)
    return {"g_vs_c": G.merge(C, on="component").merge(roles, on=["component", "mode"], how="left")}
