"""The edge graph of a transformer in MIB's naming, circuit selection and MIB circuit files.

Graph (MIB, Mueller et al. 2025): forward nodes ``input``, ``a{L}.h{H}``, ``m{L}``;
backward inputs ``a{L}.h{H}<q|k|v>``, ``m{L}``, ``logits``. A head of layer L receives
from ``input`` and every head and MLP of layers < L; ``m{L}`` also from the heads of
layer L; ``logits`` from everything. GPT-2 small has 32,491 edges. The mapping to the
workflow's component names (``L3H3``, ``L1MLP``) is ``mib_to_component``.

A circuit is a boolean mask over the graph's edges, chosen from edge scores the way MIB
chooses it (top-n or greedy, then pruned of dangling edges). The circuit files are MIB's
JSON (EAP-IG ``Graph.to_json``/``from_json``). No model is run here: where the nodes are
on a bridge is :mod:`selfrepair.gim.hooks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from selfrepair.core.components import Component


# ---------------------------------------------------------------- names ----------
def mib_to_component(name: str) -> Component | None:
    """``a3.h2`` -> L3H2, ``m1`` -> L1MLP; ``input``/``logits`` -> None."""
    name = name.split("<")[0]
    if name.startswith("a"):
        layer, head = name[1:].split(".h")
        return Component(int(layer), int(head))
    if name.startswith("m"):
        return Component(int(name[1:]), None)
    return None


def component_to_mib(c: Component) -> str:
    return f"a{c.layer}.h{c.head}" if c.head is not None else f"m{c.layer}"


# ---------------------------------------------------------------- graph ----------
# A grouped-query model's key and value inputs (gim.kv_inputs, docs/MIB.md): "per_query_head",
# MIB's: each query head its own input, scored and patched on its own (the model booted
# ungrouped, core.models.ungroup_kv); "per_group": one per key/value group, an edge into a
# head's k (v) input scoring the group's divided by the group size. The same edges.
KV_INPUTS = ("per_query_head", "per_group")


def ungroups(kv_inputs: str) -> bool:
    """Whether ``kv_inputs`` (:data:`KV_INPUTS`) boots the model ungrouped; ValueError
    naming the choices otherwise."""
    if kv_inputs not in KV_INPUTS:
        raise ValueError(f"unknown kv_inputs {kv_inputs!r}; one of {KV_INPUTS}")
    return kv_inputs == "per_query_head"


# The logits node's input: every upstream node has written its activation before it, so a
# forward that only records the nodes can stop there (hooks.forward_activations' stop_after).
LOGITS_INPUT = "ln_final.hook_in"


@dataclass
class Graph:
    """The edge graph of a model as the bridge exposes it: ``n_kv_heads`` key and value
    inputs per layer (``n_heads`` on an ungrouped bridge, :data:`KV_INPUTS`)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    forward: list[str] = field(default_factory=list)  # upstream nodes
    backward: list[str] = field(default_factory=list)  # downstream inputs
    valid: torch.Tensor = None  # [n_forward, n_backward] bool

    @classmethod
    def build(cls, n_layers: int, n_heads: int, d_model: int, n_kv_heads: int | None = None) -> "Graph":
        g = cls(n_layers, n_heads, n_kv_heads or n_heads, d_model)
        g.forward = ["input"]
        for layer in range(n_layers):
            g.forward += [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]
        for layer in range(n_layers):
            g.backward += [f"a{layer}.h{h}<{x}>" for x in "qkv" for h in range(n_heads)]
            g.backward.append(f"m{layer}")
        g.backward.append("logits")
        valid = torch.zeros(len(g.forward), len(g.backward), dtype=torch.bool)
        for j, v in enumerate(g.backward):
            for i, u in enumerate(g.forward):
                valid[i, j] = g._is_parent(u, v)
        g.valid = valid
        return g

    @classmethod
    def from_bridge(cls, bridge) -> "Graph":
        cfg = bridge.cfg
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return cls.build(cfg.n_layers, cfg.n_heads, cfg.d_model, n_kv)

    @staticmethod
    def _layer(name: str) -> int:
        return int(name[1:].split(".")[0].split("<")[0])

    def _is_parent(self, u: str, v: str) -> bool:
        if v == "logits" or u == "input":
            return True
        lu, lv = self._layer(u), self._layer(v)
        if v.startswith("a"):
            return lu < lv
        return lu < lv or (lu == lv and u.startswith("a"))

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edge_names(self) -> list[str]:
        idx = self.valid.nonzero().tolist()
        return [f"{self.forward[i]}->{self.backward[j]}" for i, j in idx]

    def edge_index(self) -> dict[str, tuple[int, int]]:
        return {f"{self.forward[i]}->{self.backward[j]}": (i, j) for i, j in self.valid.nonzero().tolist()}

    # hook layout ------------------------------------------------------------
    def backward_slots(self):
        """Per hook name of a downstream input: list of (column, slot index or None)."""
        H, rep = self.n_heads, self.n_heads // self.n_kv_heads
        slots = {}
        for j, v in enumerate(self.backward):
            if v == "logits":
                slots.setdefault(LOGITS_INPUT, []).append((j, None))
            elif v.startswith("m"):
                slots.setdefault(f"blocks.{self._layer(v)}.hook_mlp_in", []).append((j, None))
            else:
                layer = self._layer(v)
                head = int(v.split(".h")[1].split("<")[0])
                kind = v[-2]
                slot = head if kind == "q" else head // rep
                slots.setdefault(f"blocks.{layer}.hook_{kind}_input", []).append((j, slot))
        assert H % self.n_kv_heads == 0
        return slots


# ---------------------------------------------------------------- selection ------
def n_edges_at(fraction: float, n_edges: int) -> int:
    """Edges in the circuit at ``fraction`` of the graph: ``int(fraction * n_edges)``, as
    MIB's ``evaluate_area_under_curve`` (truncation, not rounding: 0.2 * 33 -> 6)."""
    return int(fraction * n_edges)


def _node_of(name: str) -> str:
    return name.split("<")[0]


def prune_dangling(graph: Graph, mask: torch.Tensor, passes: int | None = None) -> torch.Tensor:
    """MIB's pruning (EAP-IG ``Graph.apply_topn(..., prune=True)``), to a fixed point.

    A node stays only if it has an in-graph incoming edge (``input`` counts as having one;
    the q/k/v inputs of a head are one node) and an in-graph outgoing edge (``logits`` is
    always kept); every edge out of or into a dropped node is dropped. Repeated until
    nothing changes, so what remains is the union of the input -> logits paths of ``mask``.
    ``passes=1``: one sweep only, what the EAP-IG commit MIB pins (7af394a) does after
    ``apply_topn`` (its loop compares the node set with the one ``apply_topn`` just set
    from the same edges, so it stops after the first sweep): the circuit whose edges MIB's
    leaderboard counts (:func:`mib_reported_edges`).
    """
    nodes = list(dict.fromkeys(graph.forward + [_node_of(v) for v in graph.backward]))
    pos = {n: k for k, n in enumerate(nodes)}
    src = torch.zeros(len(nodes), len(graph.forward), dtype=torch.bool)  # node k -> forward row i
    dst = torch.zeros(len(nodes), len(graph.backward), dtype=torch.bool)  # node k -> backward column j
    for i, u in enumerate(graph.forward):
        src[pos[u], i] = True
    for j, v in enumerate(graph.backward):
        dst[pos[_node_of(v)], j] = True
    has_in_always = torch.tensor([n == "input" for n in nodes])
    has_out_always = torch.tensor([n == "logits" for n in nodes])
    mask = mask & graph.valid
    done = 0
    while passes is None or done < passes:
        done += 1
        has_out = (src.float() @ mask.any(dim=1).float() > 0) | has_out_always
        has_in = (dst.float() @ mask.any(dim=0).float() > 0) | has_in_always
        alive = has_in & has_out
        alive_fwd = (alive.float() @ src.float()) > 0  # [n_forward]
        alive_bwd = (alive.float() @ dst.float()) > 0  # [n_backward]
        pruned = mask & alive_fwd[:, None] & alive_bwd[None, :]
        if torch.equal(pruned, mask):
            return mask
        mask = pruned
    return mask


def mib_reported_edges(graph: Graph, scores: torch.Tensor, n: int, absolute: bool, selection: str = "topn") -> int:
    """The edge count MIB's leaderboard reports for the circuit of ``n`` edges
    (``weighted_edge_count`` after the pinned EAP-IG's ``apply_topn`` / ``apply_greedy``
    with ``prune=True``).

    Top-n: the top ``n`` edges after one pruning sweep (``apply_topn`` sets the node set
    that sweep computes, so its loop stops at once). It can exceed the circuit MIB
    evaluates, which ``evaluate_graph`` prunes to the fixed point (:func:`top_edges`,
    ``n_kept``). Greedy: ``apply_greedy`` leaves the nodes it opened as the node set, so
    the sweep's loop runs to the fixed point and the count is the evaluated circuit's."""
    if selection == "greedy":
        return int(greedy_edges(graph, scores, n, absolute).sum())
    if selection != "topn":
        raise ValueError(f"unknown selection {selection!r}; one of ('topn', 'greedy')")
    return int(prune_dangling(graph, top_edges(graph, scores, n, absolute, prune=False), passes=1).sum())


def top_edges(graph: Graph, scores: torch.Tensor, n: int, absolute: bool, prune: bool = True) -> torch.Tensor:
    """The ``n`` edges with the highest (signed or absolute) score, as a mask; with
    ``prune`` (the default, MIB's evaluation) dangling edges are then dropped
    (:func:`prune_dangling`), so the circuit may hold fewer than ``n`` edges.

    Ties are broken as MIB breaks them (EAP-IG ``Graph.apply_topn``): the first ``n`` of
    ``torch.argsort(descending=True)`` over the flattened [n_forward, n_backward] matrix,
    edges off the graph at -inf. On the CPU (torch 2.13) that is libstdc++'s
    ``std::sort`` on (score, flat index) pairs, an introsort: with at most 16 entries
    ties keep the lower flat index first; beyond 16 its partitions reorder ties, the
    same way on every run (a function of the scores alone; tested against the algorithm
    written out in ``tests/std_sort.py``), but not by index. MIB's GPU runs sort on the
    CPU too (EAP-IG keeps ``graph.scores`` on the CPU), as ours do (every method's
    scores are on the CPU), so GPU runs keep these edges as well."""
    s = scores.abs() if absolute else scores.clone()
    s = s.masked_fill(~graph.valid, float("-inf")).flatten()
    mask = torch.zeros_like(s, dtype=torch.bool)
    if n > 0:
        mask[torch.argsort(s, descending=True)[:n]] = True
    mask = mask.view_as(scores) & graph.valid
    return prune_dangling(graph, mask) if prune else mask


def greedy_edges(
    graph: Graph,
    scores: torch.Tensor,
    n: int,
    absolute: bool,
    prune: bool = True,
    tie_break: torch.Tensor | None = None,
) -> torch.Tensor:
    """MIB's greedy circuit (EAP-IG ``Graph.apply_greedy(n, absolute, prune=True)``), grown
    backwards from ``logits`` so that every chosen edge feeds the circuit, as a mask.

    The circuit starts as ``logits`` alone. An edge is a candidate once its child node is
    in the circuit (a head's q/k/v inputs are one node). ``n`` times: the candidate with
    the highest (signed or absolute) score joins, and if its parent was not yet in the
    circuit the parent joins and the edges into it become candidates (``input`` has
    none). Ties go to the candidate that became one first, then to the lower (forward,
    backward) index (MIB: its edge-list order for the edges into ``logits``, the order
    of a Python set for later ones). ``tie_break`` ([n_forward, n_backward] integers, e.g.
    :func:`mib_tie_order`) replaces that last key: among candidates that became ones
    together, ties go to the lower ``tie_break``. Then, with ``prune`` (the default, MIB's
    evaluation), dangling edges are dropped (:func:`prune_dangling`): a parent that never
    got an incoming edge loses its edges, so the circuit may hold fewer than ``n``."""
    import heapq

    if not 0 <= n <= graph.n_edges:
        raise ValueError(f"n ({n}) must be between 0 and the graph's {graph.n_edges} edges")
    s = (scores.abs() if absolute else scores).tolist()
    if tie_break is None:
        key = torch.arange(graph.valid.numel()).view_as(graph.valid).tolist()
    elif tie_break.shape != graph.valid.shape:
        raise ValueError(f"tie_break has shape {tuple(tie_break.shape)}; the graph's is {tuple(graph.valid.shape)}")
    else:
        key = tie_break.tolist()
    columns: dict[str, list[int]] = {}  # node -> the backward columns that are its inputs
    for j, v in enumerate(graph.backward):
        columns.setdefault(_node_of(v), []).append(j)
    parents = [graph.valid[:, j].nonzero().flatten().tolist() for j in range(len(graph.backward))]
    heap: list[tuple[float, int, int, int, int]] = []
    opened = {"logits"}

    def open_node(node):  # its input edges become candidates, after every earlier one on ties
        rank = len(opened)
        for j in columns.get(node, ()):
            for i in parents[j]:
                heapq.heappush(heap, (-s[i][j], rank, key[i][j], i, j))

    open_node("logits")
    mask = torch.zeros_like(graph.valid)
    for _ in range(n):
        *_, i, j = heapq.heappop(heap)
        mask[i, j] = True
        u = graph.forward[i]
        if u not in opened:
            opened.add(u)
            open_node(u)
    return prune_dangling(graph, mask) if prune else mask


def mib_tie_order(graph: Graph, seed: int) -> torch.Tensor:
    """One of the tie orders MIB's greedy circuit can take (a ``tie_break`` for
    :func:`greedy_edges`): the edges into ``logits`` in their edge-list order, as MIB
    has them (a dict's order), every other edge in a random order drawn from ``seed``.
    MIB takes a newly opened node's input edges in the order of a Python set
    (EAP-IG 7af394a ``Graph.apply_greedy``: ``sorted(parent.parent_edges)`` is stable), which
    varies with ``PYTHONHASHSEED``; these random permutations stand in for the orders
    it can draw (a sample of the same kind, not MIB's hash-seed orders themselves)."""
    n_fwd, n_bwd = graph.valid.shape
    perm = torch.randperm(n_fwd * n_bwd, generator=torch.Generator().manual_seed(int(seed))).view(n_fwd, n_bwd)
    key = perm + n_fwd * n_bwd  # after every edge into logits
    logits = [j for j, v in enumerate(graph.backward) if _node_of(v) == "logits"]
    key[:, logits] = torch.arange(n_fwd * n_bwd).view(n_fwd, n_bwd)[:, logits]
    return key


# How MIB picks the circuit of n edges from a method's scores (``run_evaluation.py``:
# greedy for information flow routes, top-n for every other method); both then prune.
SELECTIONS = {"topn": top_edges, "greedy": greedy_edges}
METHOD_SELECTION = {"ifr": "greedy"}  # a method absent here: "topn"


def selection_rule(method: str) -> str:
    """The name (a key of :data:`SELECTIONS`) of MIB's circuit selection for ``method``."""
    return METHOD_SELECTION.get(method, "topn")


def select_edges(
    graph: Graph, scores: torch.Tensor, n: int, absolute: bool, selection: str = "topn", prune: bool = True
) -> torch.Tensor:
    """The circuit of ``n`` edges by the selection rule ``selection`` (:data:`SELECTIONS`)."""
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection {selection!r}; one of {tuple(SELECTIONS)}")
    return SELECTIONS[selection](graph, scores, n, absolute, prune)


# ---------------------------------------------------------------- MIB files ------
def to_mib_json(graph: Graph, scores: torch.Tensor, in_graph: torch.Tensor | None = None) -> dict:
    if in_graph is None:
        in_graph = torch.zeros_like(graph.valid)
    edges = {}
    for name, (i, j) in graph.edge_index().items():
        edges[name] = {"score": float(scores[i, j]), "in_graph": bool(in_graph[i, j])}
    nodes = {n: {"in_graph": False} for n in graph.forward}
    nodes["logits"] = {"in_graph": False}
    for i, j in in_graph.nonzero().tolist():
        nodes[graph.forward[i]]["in_graph"] = True
        nodes[graph.backward[j].split("<")[0]]["in_graph"] = True
    cfg = {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "parallel_attn_mlp": False, "d_model": graph.d_model}
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def save_mib_json(path, graph: Graph, scores: torch.Tensor, in_graph: torch.Tensor | None = None) -> None:
    """Write a MIB circuit file atomically (``runtime.atomic_path``: a killed job leaves none)."""
    from selfrepair.core import runtime

    text = json.dumps(to_mib_json(graph, scores, in_graph))
    with runtime.atomic_path(path) as tmp:
        Path(tmp).write_text(text)


class CircuitFileError(ValueError):
    """A MIB circuit file that cannot be used as it is; the message names the file."""


def _check_mib_nodes(nodes: dict, graph: Graph, where: str, cfg: dict) -> None:
    """The ``nodes`` of a MIB circuit file: known names, objects with a boolean ``in_graph``,
    no neuron masks."""
    known = set(graph.forward) | {"logits"}
    for name, n in nodes.items():
        if name not in known:
            raise CircuitFileError(f"MIB circuit file {where}: node {name!r} is not in the graph of {cfg}")
        if not isinstance(n, dict):
            raise CircuitFileError(f"MIB circuit file {where}: node {name!r} is not an object: {n!r}")
        if "in_graph" not in n:
            raise CircuitFileError(f"MIB circuit file {where}: nodes[{name!r}] lacks 'in_graph'")
        if not isinstance(n["in_graph"], bool):
            raise CircuitFileError(
                f"MIB circuit file {where}: nodes[{name!r}].in_graph is {n['in_graph']!r}, not a JSON boolean (true/false)"
            )
        neurons = n.get("neurons")
        if neurons is not None and not (isinstance(neurons, list) and all(v == 1 for v in neurons)):
            raise CircuitFileError(
                f"MIB circuit file {where}: nodes[{name!r}].neurons selects neurons; neuron-level circuits are not supported"
            )


def from_mib_json(
    path_or_dict, n_kv_heads: int | None = None, allow_partial: bool = False
) -> tuple[Graph, torch.Tensor, torch.Tensor]:
    """Graph, edge scores and in-graph mask of a MIB circuit file (or its parsed dict).

    The format is MIB's (EAP-IG ``Graph.to_json``/``from_json``): ``cfg``; ``nodes``:
    {name: {"in_graph": bool, optional "score", "neurons", "neurons_scores"}}, the
    forward nodes and ``logits``; ``edges``: {"src->dst": {"score": float, "in_graph":
    bool}}. A node's ``in_graph`` is not tied to its edges' there (before MIB prunes a
    circuit, an in-graph edge may leave a node that is not marked), so only types and
    names are checked; the circuit is the edges' ``in_graph``.

    CircuitFileError (naming the file and the key) for invalid JSON (e.g. truncated), a
    missing ``cfg``/``nodes``/``edges`` key, an edge or node not in the graph, a score
    that is not a finite number, an ``in_graph`` that is not a JSON boolean (the string
    ``"false"`` would otherwise count as in the circuit), a neuron-level circuit (whose
    neuron masks this reader would drop), or a file that lists only some of the graph's
    edges (``allow_partial=True`` accepts that, the absent edges scoring 0 and out of the
    circuit). A missing or null score counts as 0, a missing ``in_graph`` as out of the
    circuit (``to_mib_json`` and MIB always write both).
    """
    where = "<dict>" if isinstance(path_or_dict, dict) else str(path_or_dict)
    if isinstance(path_or_dict, dict):
        d = path_or_dict
    else:
        text = Path(path_or_dict).read_text()  # FileNotFoundError names the path
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise CircuitFileError(f"MIB circuit file {where} is not valid JSON (truncated?): {err}") from err
    if not isinstance(d, dict):
        raise CircuitFileError(f"MIB circuit file {where}: expected a JSON object, got {type(d).__name__}")
    for key in ("cfg", "nodes", "edges"):
        if not isinstance(d.get(key), dict):
            what = "is missing" if key not in d else f"is a {type(d[key]).__name__}, not an object"
            raise CircuitFileError(f"MIB circuit file {where}: key {key!r} {what}")
    cfg = d["cfg"]
    missing = [k for k in ("n_layers", "n_heads", "d_model") if k not in cfg]
    if missing:
        raise CircuitFileError(f"MIB circuit file {where}: cfg lacks {missing}")
    if cfg.get("parallel_attn_mlp"):
        raise CircuitFileError(f"MIB circuit file {where}: parallel attention/MLP graphs are not supported")
    graph = Graph.build(cfg["n_layers"], cfg["n_heads"], cfg["d_model"], n_kv_heads)
    index = graph.edge_index()
    scores = torch.zeros(graph.valid.shape)
    in_graph = torch.zeros_like(graph.valid)
    for name, e in d["edges"].items():
        if name not in index:
            raise CircuitFileError(f"MIB circuit file {where}: edge {name!r} is not in the graph of {cfg}")
        if not isinstance(e, dict):
            raise CircuitFileError(f"MIB circuit file {where}: edge {name!r} is not an object: {e!r}")
        score = e.get("score")
        score = 0.0 if score is None else score
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not np.isfinite(score):
            raise CircuitFileError(f"MIB circuit file {where}: edge {name!r} has score {score!r}, not a finite number")
        flag = e.get("in_graph", False)
        if not isinstance(flag, bool):
            raise CircuitFileError(
                f"MIB circuit file {where}: edges[{name!r}].in_graph is {flag!r}, not a JSON boolean (true/false)"
            )
        i, j = index[name]
        scores[i, j] = float(score)
        in_graph[i, j] = flag
    _check_mib_nodes(d["nodes"], graph, where, cfg)
    if len(d["edges"]) < graph.n_edges and not allow_partial:
        absent = [n for n in index if n not in d["edges"]]
        raise CircuitFileError(
            f"MIB circuit file {where} lists {len(d['edges'])} of the graph's {graph.n_edges} edges "
            f"(absent: {', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); "
            "pass allow_partial=True to score the absent edges 0"
        )
    return graph, scores, in_graph
