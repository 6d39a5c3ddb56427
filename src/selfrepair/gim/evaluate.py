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
from selfrepair.gim.graph import (
    SELECTIONS,
    Graph,
    greedy_edges,
    mib_reported_edges,
    mib_tie_order,
    n_edges_at,
    select_edges,
)
from selfrepair.gim.hooks import (
    POST_NORM_INPUT,
    attn_post_norms,
    forward_activations,
    head_rows,
    node_rows,
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


def _rows_of(mat: torch.Tensor, rows: torch.Tensor, n: int):
    """The rows of a product over ``rows`` (of a prefix of ``n``): the prefix slice
    itself when most of it is used (no copy), else the rows by index."""
    return slice(0, n) if len(rows) > 0.75 * n else rows


def _patch_hooks(bridge, graph: Graph, in_graph: torch.Tensor, corr: torch.Tensor) -> list:
    """The hooks of :func:`patched`, for corrupted activations ``corr`` [n_forward, B, T, d].

    Downstream hooks with the same parents (a layer's q, k and v inputs) form a family
    whose first hook to fire in a forward computes the corrections of all its slots in one
    product. The additive parents' part is, per family, whichever needs the smaller
    product: the patched edges' sum over their rows (``direct``), or (``complement``)
    the running sum of every additive row recorded so far (all of the family's additive
    parents, a prefix of the rows) minus the kept edges' sum, cheap for small circuits
    (the empty circuit: no product at all). Post-norm parents: one product per layer."""
    n_forward = len(graph.forward)
    out_edges = graph.valid & ~in_graph.to(graph.valid.device)  # edges that are patched
    norms = attn_post_norms(bridge)
    rows = head_rows(graph)
    behind_norm = torch.zeros(n_forward, dtype=torch.bool)  # rows that reach v through a post-norm
    if norms is not None:
        for r in rows:
            behind_norm[r] = True
    additive = ~behind_norm
    dev, dt = corr.device, corr.dtype
    diff = torch.zeros_like(corr)  # a_u(now) - a_u(corrupt), written by the recording hooks
    run = {"sum": torch.zeros_like(corr[0]), "upto": 0}  # running sum of the additive rows recorded
    pre, base = {}, {}  # layer -> the post-norm's input in this run, and its norm
    families = {}  # parents' rows -> [(hook name, slots, [F, S] patched, [F, S] parents)]
    for name, cols in graph.backward_slots().items():
        groups = {}  # slot -> its columns (several: the heads of one kv group's k/v input)
        for j, s in cols:
            groups.setdefault(s, []).append(j)
        # a parent is patched into a slot when every column of the slot has it patched
        # (grouped-query attention: a group's k/v input keeps u if any head keeps it)
        m = torch.stack([out_edges[:, js].all(dim=1) for js in groups.values()], dim=1)  # [F, S]
        if not m.any():
            continue  # every edge into this hook is kept: x - 0 == x
        par = torch.stack([graph.valid[:, js].any(dim=1) for js in groups.values()], dim=1)
        families.setdefault(par.any(dim=1).numpy().tobytes(), []).append((name, list(groups), m, par))
    fixes, cache = [], []
    for members in families.values():
        m = torch.cat([mm for _, _, mm, _ in members], dim=1)  # [F, S_all] patched edges
        par = torch.cat([pp for _, _, _, pp in members], dim=1)  # [F, S_all] parents
        width = m.shape[1]
        plan = {"width": width, "names": [name for name, _, _, _ in members], "mode": None, "normed": []}
        patched_rows = (m & additive[:, None]).any(dim=1).nonzero().flatten()
        if len(patched_rows):
            upto = int(par.any(dim=1).nonzero().max()) + 1  # rows recorded when the family fires
            prefix = additive.clone()
            prefix[upto:] = False
            kept = par & ~m & additive[:, None]
            kept_rows, kept_cols = kept.any(dim=1).nonzero().flatten(), kept.any(dim=0).nonzero().flatten()
            cost_direct = len(patched_rows) * width
            cost_complement = len(kept_rows) * len(kept_cols)
            n = int(patched_rows.max()) + 1
            plan["direct"] = (_rows_of(m, patched_rows, n), (m & additive[:, None])[:n])
            if torch.equal(par & additive[:, None], prefix[:, None].expand_as(par)) and cost_complement < cost_direct:
                plan["mode"] = "complement"
                plan["upto"] = upto
                if len(kept_rows):
                    nk = int(kept_rows.max()) + 1
                    sel = _rows_of(kept, kept_rows, nk)
                    mat = kept[:nk][sel][:, kept_cols] if isinstance(sel, torch.Tensor) else kept[:nk][:, kept_cols]
                    plan["kept"] = (sel, nk, kept_cols.to(dev), mat.to(dev, dt))
                else:
                    plan["kept"] = None
            else:
                plan["mode"] = "direct"
            sel, mat = plan["direct"]
            plan["direct"] = (sel, n, (mat[sel] if isinstance(sel, torch.Tensor) else mat).to(dev, dt))
        if norms is not None:
            for layer, r in enumerate(rows):
                mr = m[r]  # [H, S_all]
                live = mr.any(dim=0).nonzero().flatten()
                if len(live):  # (layer, first row, last row + 1, slots it moves, [H, c] matrix)
                    plan["normed"].append((layer, r[0], r[-1] + 1, live.to(dev), mr[:, live].to(dev, dt)))
        plan["state"] = {"delta": None, "left": set()}
        cache.append(plan["state"])
        start = 0
        for name, slots, mm, _ in members:
            fixes.append((name, slots, slice(start, start + len(slots)), plan))
            start += len(slots)

    def post_norm_base(layer):
        if layer not in base:
            base[layer] = norms[layer](pre[layer])
        return base[layer]

    def product(sel, n, mat):
        """mat.T @ the recorded rows ``sel`` (of the first ``n``): [c, B*T*d]."""
        src = diff[:n] if isinstance(sel, slice) else diff.index_select(0, sel.to(dev))
        return mat.T @ src.view(src.shape[0], -1)

    def corrections(plan):
        """[S_all, B, T, d]: what the family's slots lose, from the rows recorded so far."""
        shape, width = diff.shape[1:], plan["width"]
        mode = plan["mode"]
        if mode == "complement" and run["upto"] != plan["upto"]:
            mode = "direct"  # not the rows expected at this point of the forward
        if mode == "complement":
            delta = run["sum"].view(1, -1).expand(width, -1).clone()
            if plan["kept"] is not None:
                sel, nk, cols, mat = plan["kept"]
                delta.index_add_(0, cols, product(sel, nk, mat), alpha=-1)
        elif mode == "direct":
            delta = product(*plan["direct"])
        else:
            delta = diff.new_zeros(width, shape.numel())
        for layer, r0, r1, live, mat in plan["normed"]:
            moved = (mat.T @ diff[r0:r1].view(r1 - r0, -1)).view(len(live), *shape)
            shift = post_norm_shift(norms[layer], pre[layer], -moved, post_norm_base(layer))
            delta.index_add_(0, live, shift.reshape(len(live), -1), alpha=-1)
        return delta.view(width, *shape)

    def make_fix(name, slots, part, plan):
        state = plan["state"]

        def fix(x, hook):
            with torch.no_grad():
                if name not in state["left"]:  # the family's first hook in this forward
                    state["delta"], state["left"] = corrections(plan), set(plan["names"])
                state["left"].discard(name)
                delta = state["delta"][part]
                if not state["left"]:
                    state["delta"] = None
                if slots == [None]:
                    return x - delta[0]
                delta = delta.permute(1, 2, 0, 3)  # [B, T, S, d]
                if slots == list(range(x.shape[2])):
                    return x - delta
                x = x.clone()
                x[:, :, slots] = x[:, :, slots] - delta
                return x

        return fix

    def start(x, hook):  # a new forward: nothing computed in an earlier one is reused
        run["sum"].zero_()
        run["upto"] = 0
        for state in cache:
            state["delta"], state["left"] = None, set()

    hooks = [("blocks.0.hook_resid_pre", start)]
    for name, first, k in node_rows(graph):
        last = first + (1 if k is None else k)
        adds = bool(additive[first:last].all())
        assert adds or not additive[first:last].any()

        def rec(x, hook, first=first, k=k, last=last, adds=adds):
            with torch.no_grad():
                if k is None:
                    torch.sub(x, corr[first], out=diff[first])
                else:
                    torch.sub(x.permute(2, 0, 1, 3)[:k], corr[first:last], out=diff[first:last])
                if adds:
                    run["sum"] += diff[first] if k is None else diff[first:last].sum(dim=0)
                run["upto"] = last if run["upto"] == first else -1  # -1: rows out of order

        hooks.append((name, rec))
    if norms is not None:
        for layer in sorted({nm[0] for _, _, _, plan in fixes for nm in plan["normed"]}):

            def rec_pre(x, hook, layer=layer):
                pre[layer] = x
                base.pop(layer, None)

            hooks.append((POST_NORM_INPUT.format(layer=layer), rec_pre))
    hooks += [(name, make_fix(name, slots, part, plan)) for name, slots, part, plan in fixes]
    return hooks if fixes else []


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
            _, a_corr = forward_activations(bridge, graph, b.corrupt)
            corr = a_corr.permute(2, 0, 1, 3).contiguous()
            del a_corr
        for k, c in enumerate(masks):
            hooks = _patch_hooks(bridge, graph, c, corr) if corr is not None else []
            with torch.no_grad(), with_hooks(bridge, hooks):
                out[k].append(logit_diff(bridge(b.clean), b))
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
