"""TransformerLens's own edge-level attribution patching, in this project's edge layout:
the reference that EAP with ``gradient_at="corrupted"`` is checked and timed against
(tests/test_gim_tl_parity.py, benchmarks/bench_gim.py)."""

from __future__ import annotations

import torch

from selfrepair.gim.graph import Graph
from selfrepair.tasks.counterfactual import CounterfactualBatch


def mib_name(node) -> str:
    """A TransformerLens edge-graph node -> its MIB node name (the position dropped)."""
    k, L, H = node.kind, node.layer, node.head
    names = {"embed": "input", "attn_head_out": f"a{L}.h{H}", "mlp_out": f"m{L}", "mlp_in": f"m{L}"}
    names |= {"logits": "logits", **{f"{x}_input": f"a{L}.h{H}<{x}>" for x in "qkv"}}
    return names[k]


def tl_edge_scores(bridge, graph: Graph, data: CounterfactualBatch) -> torch.Tensor:
    """TransformerLens 4.3's ``attribution_patch`` (edge granularity, ``ig_steps=1``) per
    example, whose metric reads the example's own position, answer and foil; summed over
    token positions and averaged over examples, as [n_forward, n_backward]."""
    from transformer_lens.tools.analysis import attribution_patching as AP

    index = graph.edge_index()
    out = torch.zeros(graph.valid.shape, dtype=torch.float64)
    cfg = AP.EdgeAttributionConfig(granularity="edge", ig_steps=1)
    for r in range(len(data)):
        p, a, f = int(data.pos[r]), int(data.answer[r]), int(data.foil[r])

        def metric(logits, p=p, a=a, f=f):
            return logits[0, p, a] - logits[0, p, f]

        res = AP.attribution_patch(bridge, data.clean[r : r + 1], data.corrupt[r : r + 1], metric, cfg)
        for (w, rd), s in res.edge_scores.items():
            if w.position != rd.position:
                raise ValueError(f"TransformerLens edge across positions: {w} -> {rd}")
            out[index[f"{mib_name(w)}->{mib_name(rd)}"]] += s
    return (out / len(data)).float()
