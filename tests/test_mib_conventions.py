"""MIB's conventions where they differ from a plain reading of the methods (issue 34):
the batch weighting of the gradient methods' scores, the order of ties in top-n
circuits. Expected values are worked out by hand; the input node's activation and MIB's
weight processing for IFR are checked by hand in test_gim_circuits.py
(test_information_flow_routes_by_hand) and test_gim_mib.py (grouped value biases)."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import load_bridge  # noqa: E402
from selfrepair.gim.attribute import edge_scores, method_scores  # noqa: E402
from selfrepair.gim.graph import Graph, top_edges  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch  # noqa: E402
from tiny_models import save_toy_gpt2  # noqa: E402


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    return load_bridge(save_toy_gpt2(tmp_path_factory.mktemp("conv_model"), seed=2), "cpu")


def _data(n=5, T=5):
    g = torch.Generator().manual_seed(6)
    return CounterfactualBatch(
        torch.randint(2, 20, (n, T), generator=g), torch.randint(2, 20, (n, T), generator=g),
        torch.randint(2, 20, (n,), generator=g), torch.randint(2, 20, (n,), generator=g),
        torch.full((n,), T - 1),
    )  # fmt: skip


@pytest.mark.parametrize("method", ["eap", "eap-ig", "gim"])
def test_mib_weighting_with_an_unequal_last_batch(bridge, method):
    """5 examples in batches of 2: MIB's score is (s0 + s1) / 2 + (s2 + s3) / 2 + s4 / 1,
    divided by 5, with s_i the example's own score (each scored alone: a batch of one,
    where both weightings agree); ours ("example") is (s0 + ... + s4) / 5."""
    data = _data()
    graph = Graph.from_bridge(bridge)
    s = [edge_scores(bridge, graph, data.slice(i, i + 1), method, batch_size=1) for i in range(5)]
    want_mib = ((s[0] + s[1]) / 2 + (s[2] + s[3]) / 2 + s[4]) / 5
    want_example = sum(s) / 5
    got_mib = edge_scores(bridge, graph, data, method, batch_size=2, weighting="mib")
    got_example = edge_scores(bridge, graph, data, method, batch_size=2)
    torch.testing.assert_close(got_mib, want_mib, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_example, want_example, atol=1e-6, rtol=1e-5)
    assert (want_mib - want_example).abs().max() > 1e-3 * want_example.abs().max()  # the two differ here
    # equal batches: MIB's scale is ours / B
    four = data.slice(0, 4)
    torch.testing.assert_close(
        edge_scores(bridge, graph, four, method, batch_size=2, weighting="mib"),
        edge_scores(bridge, graph, four, method, batch_size=2) / 2,
        atol=1e-7,
        rtol=1e-5,
    )


def test_weighting_leaves_patching_and_ifr_alone_and_refuses_unknown(bridge):
    data, graph = _data(), Graph.from_bridge(bridge)
    for method in ("eactp", "ifr"):  # MIB's exact patching and IFR are per-example means
        torch.testing.assert_close(
            method_scores(bridge, graph, data, method, 2, weighting="mib"),
            method_scores(bridge, graph, data, method, 2),
        )
    with pytest.raises(ValueError, match="unknown weighting 'batch'"):
        edge_scores(bridge, graph, data, "eap", weighting="batch")


def test_top_n_ties_go_in_mib_argsort_order():
    """One layer, one head (8 edges). |scores|: five edges tie at 0.5. Top 3: the edge at
    0.9, then the tied edges in torch.argsort(descending=True)'s order over the
    flattened [forward, backward] matrix, which on the CPU is the lower flat index first
    (EAP-IG Graph.apply_topn); torch.topk picks other tied edges here."""
    g = Graph.build(1, 1, 16)
    index = g.edge_index()
    s = torch.zeros(g.valid.shape)
    tied = ["input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>", "a0.h0->m0", "m0->logits"]
    for name in tied:
        s[index[name]] = -0.5 if name == "a0.h0->m0" else 0.5  # absolute ranking: a signed tie
    s[index["input->logits"]] = 0.9
    flat = sorted(tied, key=lambda n: index[n][0] * s.shape[1] + index[n][1])
    want = {"input->logits", flat[0], flat[1]}
    mask = top_edges(g, s, 3, absolute=True, prune=False)
    assert {n for n, (i, j) in index.items() if mask[i, j]} == want
    a = s.abs().masked_fill(~g.valid, float("-inf")).flatten()
    by_topk = {n for n, (i, j) in index.items() if i * s.shape[1] + j in set(torch.topk(a, 3).indices.tolist())}
    assert by_topk != want  # the convention matters on this case


def test_mib_reported_edge_count_is_one_pruning_sweep():
    """One layer, one head. The top 2 edges: a0.h0->m0 (0.9) and m0->logits (0.8). The head
    has no incoming edge, so one sweep (the pinned EAP-IG's prune after apply_topn) drops
    a0.h0->m0 and keeps m0->logits, since m0 still had both edges when the sweep looked:
    MIB's leaderboard counts 1 edge. At the fixed point m0 has lost its input too, so the
    circuit MIB evaluates (and we do) is empty."""
    from selfrepair.gim.graph import mib_reported_edges

    g = Graph.build(1, 1, 16)
    index = g.edge_index()
    s = torch.full(g.valid.shape, 0.01)
    s[index["a0.h0->m0"]], s[index["m0->logits"]] = 0.9, 0.8
    assert mib_reported_edges(g, s, 2, absolute=True) == 1
    assert int(top_edges(g, s, 2, absolute=True).sum()) == 0
    # a connected top-n circuit: both counts agree (input->logits alone)
    s[index["input->logits"]] = 1.0
    assert mib_reported_edges(g, s, 1, absolute=True) == int(top_edges(g, s, 1, absolute=True).sum()) == 1
