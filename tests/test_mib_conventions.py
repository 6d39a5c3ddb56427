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


def test_eactp_mib_weighting_is_the_mean_of_batch_means(bridge):
    """5 examples in batches of 2: MIB's exact patching (EAP-IG get_scores_exact with
    run_attribution's batch-mean metric) takes .mean() over the 3 per-batch values:
    ((s0 + s1) / 2 + (s2 + s3) / 2 + s4 / 1) / 3, with s_i the example's own effect (each
    patched alone, a batch of one); "example" is (s0 + ... + s4) / 5. With equal batches
    the two are the same numbers, bit for bit."""
    data, graph = _data(), Graph.from_bridge(bridge)
    s = [method_scores(bridge, graph, data.slice(i, i + 1), "eactp", 1) for i in range(5)]
    want_mib = ((s[0] + s[1]) / 2 + (s[2] + s[3]) / 2 + s[4]) / 3
    want_example = sum(s) / 5
    got_mib = method_scores(bridge, graph, data, "eactp", 2, weighting="mib")
    got_example = method_scores(bridge, graph, data, "eactp", 2)
    torch.testing.assert_close(got_mib, want_mib, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_example, want_example, atol=1e-6, rtol=1e-5)
    assert (want_mib - want_example).abs().max() > 1e-2 * want_example.abs().max()  # the two differ here
    four = data.slice(0, 4)
    assert torch.equal(
        method_scores(bridge, graph, four, "eactp", 2, weighting="mib"), method_scores(bridge, graph, four, "eactp", 2)
    )


def test_weighting_leaves_ifr_alone_and_refuses_unknown(bridge):
    data, graph = _data(), Graph.from_bridge(bridge)
    # MIB's IFR is a per-example mean (the sum over examples / their number)
    torch.testing.assert_close(
        method_scores(bridge, graph, data, "ifr", 2, weighting="mib"), method_scores(bridge, graph, data, "ifr", 2)
    )
    with pytest.raises(ValueError, match="unknown weighting 'batch'"):
        edge_scores(bridge, graph, data, "eap", weighting="batch")
    with pytest.raises(ValueError, match="unknown weighting 'batch'"):
        method_scores(bridge, graph, data, "eactp", weighting="batch")


def test_top_n_ties_go_in_mib_argsort_order():
    """One layer, one head (8 edges, a flattened matrix of 15 entries). |scores|: five
    edges tie at 0.5. Top 3: the edge at 0.9, then the tied edges in
    torch.argsort(descending=True)'s order over the flattened [forward, backward]
    matrix (EAP-IG Graph.apply_topn), which on the CPU with at most 16 entries is the
    lower flat index first (an insertion sort; beyond 16, the next test); torch.topk
    picks other tied edges here."""
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


def test_top_n_ties_beyond_16_entries_follow_torchs_introsort():
    """torch 2.13's CPU argsort(descending=True) is libstdc++'s std::sort on (score,
    flat index) pairs: ties keep ascending index order only up to 16 entries. The
    reference (tests/std_sort.py, written from the algorithm) equals torch on tie-heavy
    vectors of 17 to 5000 entries; top_edges on a 2-layer, 2-head graph (105 entries,
    46 edges, 42 of them tied) keeps exactly the reference's first n, which is not the
    lower flat index first."""
    from std_sort import introsort_descending

    assert introsort_descending([0.0] * 16) == list(range(16))
    assert introsort_descending([0.0] * 17) != list(range(17))
    g = torch.Generator().manual_seed(3)
    for n in (17, 18, 31, 64, 100, 1000, 5000):
        v = torch.randint(0, 3, (n,), generator=g).float()
        v[torch.rand(n, generator=g) < 0.2] = float("-inf")
        assert torch.argsort(v, descending=True).tolist() == introsort_descending(v.tolist()), n
    graph = Graph.build(2, 2, 16)
    edges = graph.valid.nonzero().tolist()
    s = torch.zeros(graph.valid.shape)
    for k, (i, j) in enumerate(edges):
        s[i, j] = (0.9, -0.8, 0.7, 0.6)[k] if k < 4 else (0.5 if k % 2 else -0.5)  # 42 tie at |0.5|
    flat = s.abs().masked_fill(~graph.valid, float("-inf")).flatten()
    assert flat.numel() > 16 and int((flat == 0.5).sum()) == 42
    by_index = sorted(range(flat.numel()), key=lambda k: (-flat[k].item(), k))
    for n in (5, 10, 20):
        want = torch.zeros(flat.numel(), dtype=torch.bool)
        want[introsort_descending(flat.tolist())[:n]] = True
        got = top_edges(graph, s, n, absolute=True, prune=False)
        assert torch.equal(got.flatten(), want), n
        stable = torch.zeros_like(want)
        stable[by_index[:n]] = True
        assert not torch.equal(got.flatten(), stable), n  # "lower flat index first" is not what happens


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


# ---------------------------------------------------------------- greedy ties --------
def _mib_greedy(g: Graph, s: torch.Tensor, n: int, set_order: torch.Tensor) -> tuple[torch.Tensor, set]:
    """EAP-IG 7af394a ``apply_greedy`` written out on our matrices (absolute scores, no
    prune): the edges into logits sorted from the edge list, each opened node's input edges
    sorted from its ``parent_edges`` set, iterated in ``set_order``; ``heapq.merge``
    with the older candidates first. Returns (mask, opened parent nodes)."""
    import heapq

    a = s.abs()
    node = [v.split("<")[0] for v in g.backward]

    def score(e):
        return float(a[e])

    def inputs(v):
        edges = [(i, j) for j in range(len(g.backward)) if node[j] == v for i in range(len(g.forward)) if g.valid[i, j]]
        return sorted(sorted(edges, key=lambda e: int(set_order[e])), key=score, reverse=True)

    edges = heapq.merge(inputs("logits"), key=score, reverse=True)
    mask, opened = torch.zeros_like(g.valid), set()
    for _ in range(n):
        i, j = next(edges)
        mask[i, j] = True
        if g.forward[i] not in opened:
            opened.add(g.forward[i])
            edges = heapq.merge(edges, inputs(g.forward[i]), key=score, reverse=True)
    return mask, opened


def test_greedy_tie_orders_are_mib_apply_greedy_with_a_set_order():
    """With ties everywhere (scores in {0, 1, 2}), our greedy circuit under
    ``mib_tie_order(seed)`` is MIB's apply_greedy with that order of the parent-edge sets,
    edge for edge, and the orders do give different circuits."""
    from selfrepair.gim.graph import greedy_edges, mib_tie_order

    g = Graph.build(2, 2, 16)
    s = torch.randint(0, 3, g.valid.shape, generator=torch.Generator().manual_seed(0)).float() * g.valid
    circuits = set()
    for seed in range(6):
        key = mib_tie_order(g, seed)
        for n in (1, 3, 7, 15):
            want, _ = _mib_greedy(g, s, n, key)
            got = greedy_edges(g, s, n, absolute=True, prune=False, tie_break=key)
            assert torch.equal(got, want), (seed, n)
            circuits.add(got.numpy().tobytes())
    assert len(circuits) > 4  # 4 sizes: the orders moved some circuits
    # our default order is MIB's with the sets in flat (forward, backward) order
    flat = torch.arange(g.valid.numel()).view_as(g.valid)
    assert torch.equal(greedy_edges(g, s, 7, True, prune=False), _mib_greedy(g, s, 7, flat)[0])
    with pytest.raises(ValueError, match="tie_break has shape"):
        greedy_edges(g, s, 3, True, tie_break=flat[:, :-1])


def _pinned_prune_count(g: Graph, mask: torch.Tensor, nodes: torch.Tensor) -> int:
    """The pinned EAP-IG's ``prune()`` from the node set ``nodes`` that apply_topn /
    apply_greedy left (forward nodes), written out: a sweep, compared with the node set
    before it, until two agree; returns the edges left."""
    node = [v.split("<")[0] for v in g.backward]
    f2b = torch.tensor([[node[j] == u for j in range(len(g.backward))] for u in g.forward])
    mask = mask.clone()
    while True:
        has_out = mask.any(dim=1)
        has_in = (f2b.float() @ mask.any(dim=0).float()) > 0
        has_in[0] = True
        new = has_out & has_in
        same = torch.equal(new, nodes)
        nodes = new
        bwd = (nodes.float() @ f2b.float()) > 0
        bwd[-1] = True
        mask &= nodes[:, None] & bwd[None, :]
        if same:
            return int(mask.sum())


def test_mib_reported_edge_counts_follow_the_pinned_prune_for_both_rules():
    """The leaderboard count (``mib_reported_edges``) is what the pinned prune leaves from
    each rule's own node set: apply_topn's (nodes with an edge in and out: one sweep) and
    apply_greedy's (the parents it opened: the fixed point, the evaluated circuit)."""
    from selfrepair.gim.graph import greedy_edges, mib_reported_edges

    g = Graph.build(2, 2, 16)
    gen = torch.Generator().manual_seed(3)
    node = [v.split("<")[0] for v in g.backward]
    f2b = torch.tensor([[node[j] == u for j in range(len(g.backward))] for u in g.forward])
    differ = 0
    for _ in range(20):
        s = torch.randn(g.valid.shape, generator=gen) * g.valid
        for n in (2, 5, 9, 20):
            raw = top_edges(g, s, n, absolute=True, prune=False)
            has_in = (f2b.float() @ raw.any(dim=0).float()) > 0
            has_in[0] = True
            want = _pinned_prune_count(g, raw, raw.any(dim=1) & has_in)
            assert mib_reported_edges(g, s, n, absolute=True) == want
            differ += want != int(top_edges(g, s, n, absolute=True).sum())
            graw, opened = _mib_greedy(g, s, n, torch.arange(g.valid.numel()).view_as(g.valid))
            start = torch.tensor([u in opened for u in g.forward])
            want = _pinned_prune_count(g, graw, start)
            assert mib_reported_edges(g, s, n, absolute=True, selection="greedy") == want
            assert want == int(greedy_edges(g, s, n, absolute=True).sum())
    assert differ  # the top-n count differs from the evaluated circuit somewhere


def test_ifr_tie_spread_brackets_our_cpr(bridge):
    """The range over MIB's tie orders holds our own CPR and CMD (ours is one of the
    orders), is a single point with no drawn order, and IFR's q/k/v ties move a circuit."""
    from selfrepair.gim.evaluate import greedy_tie_spread
    from selfrepair.gim.localization import localize

    data = _data(n=6)
    n_edges = Graph.from_bridge(bridge).n_edges
    fr = tuple((k + 0.5) / n_edges for k in range(1, n_edges, 2)) + (1.0,)  # a circuit at every other size
    g, scores, _, summary = localize(bridge, data, "ifr", fr, batch_size=3, tie_orders=4)
    assert summary["tie_orders"] == 4
    assert summary["cpr_tie_min"] <= summary["cpr"] <= summary["cpr_tie_max"]
    assert summary["cmd_tie_min"] <= summary["cmd"] <= summary["cmd_tie_max"]
    assert summary["tie_orders_moved"] >= 1
    none = greedy_tie_spread(bridge, g, data, scores, fr, 3, orders=0)
    assert none["cpr_tie_min"] == none["cpr_tie_max"] == pytest.approx(summary["cpr"], abs=1e-12)
    assert none["cmd_tie_min"] == none["cmd_tie_max"] == pytest.approx(summary["cmd"], abs=1e-12)
    _, _, _, eap = localize(bridge, data, "eap", fr, batch_size=3, tie_orders=4)
    assert "cpr_tie_min" not in eap  # top-n ties are MIB's argsort order: no spread
