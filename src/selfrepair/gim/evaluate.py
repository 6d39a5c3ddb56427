"""MIB's evaluation of a circuit: counterfactual edge patching, the logit-difference
metric, faithfulness at the edge fractions, CPR and CMD.

Every edge outside the circuit carries its upstream node's activation on the corrupted
input. Grouped-query attention: k and v inputs belong to key/value heads, so a group's
k/v input keeps u's clean activation when any head of the group has the edge from u.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from selfrepair.gim.backward import with_hooks
from selfrepair.gim.graph import SELECTIONS, Graph, n_edges_at, select_edges
from selfrepair.gim.hooks import (
    POST_NORM_INPUT,
    attn_post_norms,
    forward_activations,
    forward_hooks,
    head_rows,
    on_prepared,
    post_norm_shift,
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


# ---------------------------------------------------------------- patching -------
@contextmanager
def patched(bridge, graph: Graph, in_graph: torch.Tensor, a_corr: torch.Tensor):
    """Hooks so that every edge outside ``in_graph`` carries the corrupted activation.

    input_v := input_v - sum_{u parent of v, (u,v) not in graph} (a_u(now) - a_u(corrupt)).
    ``in_graph``: bool [n_forward, n_backward]; ``a_corr``: forward activations of the
    corrupted run [B, T, n_forward, d].

    With post-attention norms (Gemma-2, :func:`hooks.attn_post_norms`), MIB's convention
    (EAP-IG ``evaluate_graph``): the parent heads of one layer L reach v through
    N_L = ln1_post, so v's input gets instead, per layer,
    N_L(pre_L(now) - sum_{h out} (r_h(now) - r_h(corrupt))) - N_L(pre_L(now)), pre_L the
    norm's input (summed head outputs plus bias) in this run: v reads layer L's attention
    output recomputed, scale included, from its in-circuit heads' current and its
    out-of-circuit heads' corrupted outputs. Other parents (input, MLPs) stay additive.
    """
    out_edges = (graph.valid & ~in_graph).float()  # edges that are patched
    store = {}
    hooks = []
    for name, fslots in forward_hooks(graph):

        def rec(x, hook, fslots=fslots):
            for i, s in fslots:
                store[i] = (x if s is None else x[:, :, s]) - a_corr[:, :, i]

        hooks.append((name, rec))
    norms = attn_post_norms(bridge)
    pre = {}  # layer -> the post-norm's input in this run
    rows = head_rows(graph)
    plain = torch.ones(len(graph.forward))  # rows that add into the residual stream
    if norms is not None:
        for layer in range(graph.n_layers):
            plain[rows[layer]] = 0

            def rec_pre(x, hook, layer=layer):
                pre[layer] = x

            hooks.append((POST_NORM_INPUT.format(layer=layer), rec_pre))
    rep = graph.n_heads // graph.n_kv_heads
    for name, cols in graph.backward_slots().items():
        if name.endswith(("k_input", "v_input")) and rep > 1:
            # one slot per kv group: a parent is kept if any head of the group keeps it
            groups = {}
            for j, s in cols:
                groups.setdefault(s, []).append(j)
            cols = [(min(js), s) for s, js in groups.items()]
            masks = {s: out_edges[:, js].min(dim=1).values for s, js in groups.items()}
        else:
            masks = {s: out_edges[:, j] for j, s in cols}

        def fix(x, hook, cols=cols, masks=masks):
            n = len(store)
            d = torch.stack([store[i] for i in range(n)], dim=2)  # [B, T, n_known, d]
            x = x.clone()
            for j, s in cols:
                m = masks[s][:n].to(d.device, d.dtype)
                delta = torch.einsum("btfd,f->btd", d, m * plain[:n].to(d.device, d.dtype))
                if norms is not None:
                    for layer, r in enumerate(rows):
                        if r[-1] >= n or not m[r].any():
                            continue  # not a parent yet, or every head of it kept
                        moved = torch.einsum("btfd,f->btd", d[:, :, r], m[r])
                        delta = delta - post_norm_shift(norms[layer], pre[layer], -moved)
                if s is None:
                    x = x - delta
                else:
                    x[:, :, s] = x[:, :, s] - delta
            return x

        hooks.append((name, fix))
    with prepared(bridge), with_hooks(bridge, hooks):
        yield


@on_prepared
def run_circuit(
    bridge, graph: Graph, data: CounterfactualBatch, in_graph: torch.Tensor, batch_size: int = 64
) -> torch.Tensor:
    """Per-row logit difference of the model with every edge outside ``in_graph`` patched."""
    out = []
    for b in data.batches(batch_size):
        _, a_corr = forward_activations(bridge, graph, b.corrupt)
        with torch.no_grad(), patched(bridge, graph, in_graph, a_corr):
            logits = bridge(b.clean)
        out.append(logit_diff(logits, b))
    return torch.cat(out)


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
    after pruning)."""
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection {selection!r}; one of {tuple(SELECTIONS)}")
    m_full = run_circuit(bridge, graph, data, graph.valid, batch_size).mean().item()
    m_empty = run_circuit(bridge, graph, data, torch.zeros_like(graph.valid), batch_size).mean().item()
    rows = []
    for frac in fractions:
        n = n_edges_at(frac, graph.n_edges)
        mask = select_edges(graph, scores, n, absolute, selection)
        m = run_circuit(bridge, graph, data, mask, batch_size).mean().item()
        rows.append(
            {
                "fraction": frac,
                "selection": selection,
                "n_edges": n,
                "n_kept": int(mask.sum()),
                "metric": m,
                "faithfulness": (m - m_empty) / (m_full - m_empty),
            }
        )
    return {"m_full": m_full, "m_empty": m_empty, "points": rows}


def area(x, y) -> float:
    """Trapezoid area under y over x (linear x)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def cpr(fractions, f) -> float:
    """CPR: area under the faithfulness curve (circuits of the top signed edges)."""
    return area(fractions, f)


def cmd(fractions, f) -> float:
    """CMD: area under |1 - f| (circuits of the top absolute edges)."""
    return area(fractions, np.abs(1 - np.asarray(f, float)))
