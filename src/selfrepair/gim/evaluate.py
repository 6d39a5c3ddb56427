"""MIB's evaluation of a circuit: counterfactual edge patching, the logit-difference
metric, faithfulness at the edge fractions, CPR and CMD.

Every edge outside the circuit carries its upstream node's activation on the corrupted
input. Grouped-query attention on a grouped bridge (``gim.kv_inputs: per_group``): k and
v inputs belong to key/value heads, so a group's k/v input keeps u's clean activation
when any head of the group has the edge from u; on an ungrouped one (MIB's) each head's
input is patched on its own.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from selfrepair.gim.backward import with_hooks
from selfrepair.gim.edge_patch import _patch_hooks
from selfrepair.gim.graph import (
    LOGITS_INPUT,
    SELECTIONS,
    Graph,
    greedy_edges,
    mib_reported_edges,
    mib_tie_order,
    n_edges_at,
    select_edges,
)
from selfrepair.gim.hooks import (
    forward_activations,
    on_prepared,
    prepared,
)
from selfrepair.tasks.counterfactual import CounterfactualBatch

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


# ---------------------------------------------------------------- metric ---------
def logit_diff(logits: torch.Tensor, batch: CounterfactualBatch) -> torch.Tensor:
    """Per row: logit(answer) - logit(foil) at ``pos``."""
    rows = torch.arange(logits.shape[0])
    last = logits[rows, batch.pos]
    return last[rows, batch.answer] - last[rows, batch.foil]


READ_HOOK = "unembed.hook_in"  # the unembedding's input, after the final norm


def read_logits(bridge, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B, V] logits of each row at its ``pos`` only: the unembedding (over the whole
    vocabulary) is applied to those rows of its input, not to every position (on
    Gemma-3's 262k-token vocabulary it is most of a short prompt's forward). Hooks
    already on the bridge (patching, gradients) run as before; the values are those of
    ``bridge(tokens)[rows, pos]``. A model without :data:`READ_HOOK` runs whole."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    at = pos.to(tokens.device)
    if READ_HOOK not in getattr(bridge, "hook_dict", {}):
        return bridge(tokens)[rows, at]
    with with_hooks(bridge, [(READ_HOOK, lambda x, hook: x[rows, at][:, None])]):
        return bridge(tokens)[:, 0]


def read_logit_diff(bridge, batch: CounterfactualBatch, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`logit_diff` of ``tokens`` (the batch's clean prompts if None), with the
    logits read at ``pos`` only (:func:`read_logits`)."""
    last = read_logits(bridge, batch.clean if tokens is None else tokens, batch.pos)
    rows = torch.arange(last.shape[0], device=last.device)
    return last[rows, batch.answer.to(last.device)] - last[rows, batch.foil.to(last.device)]


# ---------------------------------------------------------------- patching -------
@contextmanager
def patched(bridge, graph: Graph, in_graph: torch.Tensor, a_corr: torch.Tensor):
    """Hooks so that every edge outside ``in_graph`` carries the corrupted activation.

    input_v := input_v - sum_{u parent of v, (u,v) not in graph} (a_u(now) - a_u(corrupt)).
    ``in_graph``: bool [n_forward, n_backward]; ``a_corr``: forward activations of the
    corrupted run [B, T, n_forward, d].

    With post-attention norms (Gemma-2, Gemma-3, :func:`hooks.attn_post_norms`), MIB's convention
    (EAP-IG ``evaluate_graph``): the parent heads of one layer L reach v through
    N_L = ln1_post, so v's input gets instead, per layer,
    N_L(pre_L(now) - sum_{h out} (r_h(now) - r_h(corrupt))) - N_L(pre_L(now)), pre_L the
    norm's input (summed head outputs plus bias) in this run: v reads layer L's attention
    output recomputed, scale included, from its in-circuit heads' current and its
    out-of-circuit heads' corrupted outputs. Other parents (input, MLPs) stay additive.

    How (:func:`_patch_hooks`): the recording hooks write a_u(now) - a_u(corrupt) in place
    into one [n_forward, B, T, d] buffer; each downstream hook corrects all of its slots
    (a layer's q, k or v inputs, an MLP's input, the logits' input) with one matrix
    product of that buffer's parent rows and the hook's 0/1 matrix of patched edges, plus,
    with post-norms, one product and one norm per parent layer. A hook none of whose
    edges is patched is not installed. For evaluation: the corrections are computed
    without autograd.
    """
    corr = a_corr.detach().permute(2, 0, 1, 3).contiguous()
    with prepared(bridge), with_hooks(bridge, _patch_hooks(bridge, graph, in_graph, corr)):
        yield


@on_prepared
def run_circuit(
    bridge, graph: Graph, data: CounterfactualBatch, in_graph: torch.Tensor, batch_size: int = 64
) -> torch.Tensor:
    """Per-row logit difference of the model with every edge outside ``in_graph`` patched."""
    return run_circuits(bridge, graph, data, [in_graph], batch_size)[0]


@on_prepared
def run_circuits(bridge, graph: Graph, data: CounterfactualBatch, circuits, batch_size: int = 64) -> list:
    """:func:`run_circuit` of each circuit in ``circuits`` (bool masks), with the corrupted
    run's activations computed once per batch for all of them and each distinct circuit
    (edges of ``graph``) run once: one corrupted forward per batch, and one clean forward
    per batch and distinct circuit (the whole graph's without any hook)."""
    index, distinct = [], {}
    for c in circuits:
        c = c.to(graph.valid.device) & graph.valid
        index.append(distinct.setdefault(c.numpy().tobytes(), (len(distinct), c))[0])
    masks = [c for _, c in sorted(distinct.values(), key=lambda kc: kc[0])]
    any_patched = any(bool((graph.valid & ~c).any()) for c in masks)
    out = [[] for _ in masks]
    for b in data.batches(batch_size, next(bridge.parameters()).device):
        corr = None
        if any_patched:
            _, a_corr = forward_activations(bridge, graph, b.corrupt, stop_after=LOGITS_INPUT)
            corr = a_corr.permute(2, 0, 1, 3).contiguous()
            del a_corr
        for k, c in enumerate(masks):
            hooks = _patch_hooks(bridge, graph, c, corr) if corr is not None else []
            with torch.no_grad(), with_hooks(bridge, hooks):
                out[k].append(read_logit_diff(bridge, b))
    rows = [torch.cat(o) for o in out]
    return [rows[k].clone() for k in index]


# ---------------------------------------------------------------- faithfulness ---
@on_prepared
def faithfulness_curve(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    scores: torch.Tensor,
    fractions=FRACTIONS,
    absolute: bool = False,
    batch_size: int = 64,
    selection: str = "topn",
) -> dict:
    """f(C) = (m(C) - m(empty)) / (m(M) - m(empty)) at each edge fraction, MIB's way:
    C = ``int(fraction * n_edges)`` edges chosen by ``selection`` (``"topn"``: the top
    edges, ``"greedy"``: :func:`greedy_edges`; :func:`selection_rule` gives a method's)
    with dangling edges pruned (``n_edges``: that count; ``n_kept``: the edges left
    after pruning, the circuit evaluated; ``n_reported``: the count MIB's leaderboard
    gives it, :func:`graph.mib_reported_edges`)."""
    return faithfulness_curves(bridge, graph, data, scores, fractions, (absolute,), batch_size, selection)[absolute]


@on_prepared
def faithfulness_curves(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    scores: torch.Tensor,
    fractions=FRACTIONS,
    rankings=(False, True),
    batch_size: int = 64,
    selection: str = "topn",
) -> dict:
    """{absolute: :func:`faithfulness_curve`} for each ranking in ``rankings`` (False:
    signed scores, True: absolute), all their circuits evaluated together
    (:func:`run_circuits`): m(M) and m(empty) once, one corrupted forward per batch, one
    clean forward per batch and distinct circuit."""
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection {selection!r}; one of {tuple(SELECTIONS)}")
    plan, circuits = [], [graph.valid, torch.zeros_like(graph.valid)]
    for absolute in rankings:
        for frac in fractions:
            n = n_edges_at(frac, graph.n_edges)
            mask = select_edges(graph, scores, n, absolute, selection)
            plan.append((absolute, frac, n, mask))
            circuits.append(mask)
    m = [r.mean().item() for r in run_circuits(bridge, graph, data, circuits, batch_size)]
    m_full, m_empty = m[0], m[1]
    out = {absolute: {"m_full": m_full, "m_empty": m_empty, "points": []} for absolute in rankings}
    for (absolute, frac, n, mask), mc in zip(plan, m[2:]):
        out[absolute]["points"].append(
            {
                "fraction": frac,
                "selection": selection,
                "n_edges": n,
                "n_kept": int(mask.sum()),
                # MIB's leaderboard count (top-n: one pruning sweep; greedy: the circuit's)
                "n_reported": int(mask.sum())
                if selection == "greedy"
                else mib_reported_edges(graph, scores, n, absolute),
                "metric": mc,
                "faithfulness": (mc - m_empty) / (m_full - m_empty),
            }
        )
    return out


TIE_ORDERS = 8  # config gim.ifr_tie_orders


@on_prepared
def greedy_tie_spread(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    scores: torch.Tensor,
    fractions=FRACTIONS,
    batch_size: int = 64,
    orders: int = TIE_ORDERS,
) -> dict:
    """CPR and CMD of the greedy circuits (:func:`greedy_edges`) under ``orders`` of MIB's
    possible tie orders (:func:`graph.mib_tie_order`, seeds 0 .. orders-1) and ours: their
    range, and how many of the drawn orders change at least one circuit
    (``tie_orders_moved``). MIB's own IFR result depends on ``PYTHONHASHSEED`` where
    scores tie; this range is a sampled estimate of that spread from ``orders`` + 1
    orders (random permutations, not MIB's hash-seed orders), so it need not contain the
    value MIB reports. Every distinct circuit is run once (:func:`run_circuits`)."""
    if orders < 0:
        raise ValueError(f"orders must be >= 0, not {orders}")
    keys = [None] + [mib_tie_order(graph, k) for k in range(orders)]
    circuits, plan = [graph.valid, torch.zeros_like(graph.valid)], []
    for key in keys:
        masks = [
            greedy_edges(graph, scores, n_edges_at(f, graph.n_edges), absolute, tie_break=key)
            for absolute in (False, True)
            for f in fractions
        ]
        plan.append(masks)
        circuits += masks
    m = [r.mean().item() for r in run_circuits(bridge, graph, data, circuits, batch_size)]
    m_full, m_empty, m = m[0], m[1], m[2:]
    k = len(fractions)
    cprs, cmds = [], []
    for o in range(len(keys)):
        f = [(mc - m_empty) / (m_full - m_empty) for mc in m[2 * k * o : 2 * k * (o + 1)]]
        cprs.append(cpr(fractions, f[:k]))
        cmds.append(cmd(fractions, f[k:]))
    moved = sum(any(not torch.equal(a, b) for a, b in zip(masks, plan[0])) for masks in plan[1:])
    return {
        "tie_orders": orders,
        "tie_orders_moved": moved,
        "cpr_tie_min": min(cprs),
        "cpr_tie_max": max(cprs),
        "cmd_tie_min": min(cmds),
        "cmd_tie_max": max(cmds),
    }


def check_ascending(fractions) -> np.ndarray:
    """``fractions`` as an array; ValueError, naming them and their order, unless each is
    larger than the one before (CPR and CMD, areas over them, change sign otherwise)."""
    x = np.asarray(fractions, float)
    if np.any(np.diff(x) <= 0):
        raise ValueError(
            f"fractions {x.tolist()} are not in ascending order: CPR and CMD are areas over them, "
            f"which change sign over a descending order; give them as {sorted(set(x.tolist()))}"
        )
    return x


def area(x, y) -> float:
    """Trapezoid area under y over x (linear x); x must ascend (over a descending x the
    area changes sign: ValueError)."""
    x, y = check_ascending(x), np.asarray(y, float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def cpr(fractions, f) -> float:
    """CPR: area under the faithfulness curve (circuits of the top signed edges)."""
    return area(fractions, f)


def cmd(fractions, f) -> float:
    """CMD: area under |1 - f| (circuits of the top absolute edges)."""
    return area(fractions, np.abs(1 - np.asarray(f, float)))
