"""Paper C (GIM): the backward modifications, the edge graph, MIB files and
faithfulness, feature attribution, attention self-repair, and the training runner of
the counterfactual tasks. Beside workflow/rules/gim.smk.

On a model of one's own (docs/OWN_MODEL.md), a TransformerBridge
(``selfrepair.core.load_bridge``) and a ``tasks.counterfactual.CounterfactualBatch``
(clean and corrupted tokens, answer and foil ids, the position read):

- :func:`method_scores` (any method of :data:`ALL_METHODS`: eap, eap-ig, gim, ...) and
  :func:`edge_scores` (the gradient ones): edge scores [n_forward, n_backward] on the
  edges of :class:`Graph` (``Graph.from_bridge``);
  :func:`edge_table` puts them in a table, edges named both MIB's way (``a0.h1->m1``)
  and with the project's components (``L0H1`` -> ``L1MLP``);
- :func:`write_circuit`: the MIB circuit file of a fraction of the edges, chosen by the
  method's rule (:func:`select_edges`, :func:`selection_rule`), as rule gim_localize
  writes it (:func:`save_mib_json`; :func:`from_mib_json` reads one back);
- :func:`localize`: one method's scores, faithfulness curves and CPR/CMD, the rule's
  call; :func:`faithfulness_curves`, :func:`cpr`, :func:`cmd` its parts;
  :func:`circuit_faithfulness`: f of one circuit (e.g. one read from a MIB file).

Names load their module on first use (importing the package imports no torch).
"""

from selfrepair.core.lazy import lazy_exports

_LAZY = {
    "attribute": ["METHODS", "ALL_METHODS", "edge_scores", "method_scores"],
    "graph": ["Graph", "select_edges", "selection_rule", "n_edges_at", "save_mib_json", "from_mib_json"],
    "evaluate": ["faithfulness_curves", "cpr", "cmd", "logit_diff"],
    "localization": ["localize"],
}
__all__ = ["edge_table", "write_circuit", "circuit_faithfulness", *(name for names in _LAZY.values() for name in names)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _node(name: str) -> str:
    """A MIB node (``a0.h1``, ``a0.h1<q>``, ``m1``, ``input``, ``logits``) in the
    project's names (``L0H1``, ``L1MLP``; input and logits as they are)."""
    from selfrepair.gim.graph import mib_to_component

    c = mib_to_component(name)
    return name if c is None else c.name


def edge_table(graph, scores, in_graph=None):
    """One row per edge of ``graph``: edge (MIB's name), upstream and downstream (the
    project's names, ``input`` and ``logits`` as they are), input (q, k or v for an
    attention head's input, else empty), score; and in_graph when a circuit mask is given."""
    import pandas as pd

    rows = []
    for name, (i, j) in graph.edge_index().items():
        down = graph.backward[j]
        row = {
            "edge": name,
            "upstream": _node(graph.forward[i]),
            "downstream": _node(down),
            "input": down[-2] if down.endswith(">") else "",
            "score": float(scores[i, j]),
        }
        if in_graph is not None:
            row["in_graph"] = bool(in_graph[i, j])
        rows.append(row)
    return pd.DataFrame(rows)


def write_circuit(path, graph, scores, method: str, fraction: float):
    """Write the MIB circuit file of ``method``'s scores: ``int(fraction * n_edges)``
    edges by |score|, chosen by the method's rule (top-n; greedy from the logits for
    ifr), dangling edges pruned, as rule gim_localize writes ``circuits/{method}.json``.
    Returns the circuit's edge mask."""
    from selfrepair.gim.graph import n_edges_at, save_mib_json, select_edges, selection_rule

    mask = select_edges(graph, scores, n_edges_at(fraction, graph.n_edges), True, selection_rule(method))
    save_mib_json(path, graph, scores, mask)
    return mask


def circuit_faithfulness(bridge, graph, data, in_graph, batch_size: int = 64) -> dict:
    """f(C) = (m(C) - m(empty)) / (m(M) - m(empty)) of the circuit ``in_graph`` (a bool
    mask of ``graph``'s edges; every edge outside it patched with the corrupted run),
    m the mean logit difference of answer over foil: {"metric", "m_full", "m_empty",
    "faithfulness"}, the arithmetic of a faithfulness curve's point."""
    import torch

    from selfrepair.gim.evaluate import run_circuits

    circuits = [graph.valid, torch.zeros_like(graph.valid), in_graph]
    m_full, m_empty, mc = [r.mean().item() for r in run_circuits(bridge, graph, data, circuits, batch_size)]
    return {"metric": mc, "m_full": m_full, "m_empty": m_empty, "faithfulness": (mc - m_empty) / (m_full - m_empty)}
