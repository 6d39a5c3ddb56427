"""Information flow routes under MIB's protocol: the greedy circuit selection (grown
backwards from the logits) that MIB applies to IFR, and IFR's per-example averaging
over positions. Expected values are worked out by hand on hand-built graphs, or checked
against the rule's defining property; none is copied from the code's output."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import load_bridge  # noqa: E402
from selfrepair.gim.attribute import ALL_METHODS, information_flow_routes, position_weights  # noqa: E402
from selfrepair.gim.evaluate import run_circuit  # noqa: E402
from selfrepair.gim.graph import Graph, greedy_edges, n_edges_at, select_edges, selection_rule, top_edges  # noqa: E402
from selfrepair.gim.localization import localize  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch  # noqa: E402
from tiny_models import save_toy_gpt2  # noqa: E402

# One layer, one head: forward input, a0.h0, m0; 8 edges.
SMALL = {
    "input->a0.h0<q>": 0.9,
    "input->a0.h0<k>": 0.8,
    "input->a0.h0<v>": 0.7,
    "a0.h0->m0": 0.6,
    "input->logits": 0.4,
    "a0.h0->logits": 0.3,
    "m0->logits": 0.2,
    "input->m0": 0.1,
}
Q, K, V = "input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>"
IL, AL, ML, AM, IM = "input->logits", "a0.h0->logits", "m0->logits", "a0.h0->m0", "input->m0"


def _graph():
    g = Graph.build(1, 1, 16)
    assert set(g.edge_names()) == set(SMALL)
    return g


def _scores(g, values):
    s = torch.zeros(g.valid.shape)
    for name, (i, j) in g.edge_index().items():
        s[i, j] = values[name]
    return s


def _names(g, mask):
    return {n for n, (i, j) in g.edge_index().items() if mask[i, j]}


# By hand, greedy from the logits: candidates IL .4, AL .3, ML .2 -> IL (input has no
# inputs) -> AL (a0.h0 joins: Q .9, K .8, V .7 become candidates) -> Q -> K -> V -> ML
# (the only one left; m0 joins: AM .6, IM .1) -> AM -> IM.
GREEDY_ORDER = [IL, AL, Q, K, V, ML, AM, IM]
# Pruned (a node needs an incoming edge, input excepted, and an outgoing one): AL dangles
# until a0.h0 has an input (n = 3); ML until m0 has one (n = 7).
GREEDY_PRUNED = {
    0: set(),
    1: {IL},
    2: {IL},
    3: {IL, AL, Q},
    4: {IL, AL, Q, K},
    5: {IL, AL, Q, K, V},
    6: {IL, AL, Q, K, V},
    7: {IL, AL, Q, K, V, ML, AM},
    8: set(SMALL),
}
# Top-n by score takes Q, K, V, AM first: nothing of them reaches the logits, so pruning
# leaves nothing until IL comes in at n = 5; AM (m0 has no way out) until ML at n = 7.
TOPN_PRUNED = {
    1: set(),
    2: set(),
    3: set(),
    4: set(),
    5: {IL},
    6: {Q, K, V, IL, AL},
    7: {Q, K, V, AM, IL, AL, ML},
    8: set(SMALL),
}


@pytest.mark.parametrize("n", range(len(SMALL) + 1))
def test_greedy_edges_by_hand(n):
    g = _graph()
    s = _scores(g, SMALL)
    assert _names(g, greedy_edges(g, s, n, absolute=True, prune=False)) == set(GREEDY_ORDER[:n])
    assert _names(g, greedy_edges(g, s, n, absolute=True)) == GREEDY_PRUNED[n]
    if n:
        assert _names(g, top_edges(g, s, n, absolute=True)) == TOPN_PRUNED[n]


def test_greedy_and_top_n_differ_where_top_n_is_disconnected():
    g = _graph()
    s = _scores(g, SMALL)
    for n in (1, 3, 4):  # top-n: Q, K, V, AM lead nowhere; greedy keeps a connected circuit
        assert _names(g, top_edges(g, s, n, absolute=True)) == set()
        assert greedy_edges(g, s, n, absolute=True).any()


def test_greedy_ties_go_to_the_older_candidate_then_the_lower_index():
    """All scores equal. Edges into logits first, in forward order (input, a0.h0, m0):
    IL; AL (a0.h0 joins: Q, K, V); ML, older than Q, K, V (m0 joins: IM, AM); then Q, K,
    V (a0.h0's, older than m0's); then IM (parent input, index 0) before AM (a0.h0)."""
    g = _graph()
    s = torch.ones(g.valid.shape) * g.valid
    want = [IL, AL, ML, Q, K, V, IM, AM]
    for n in range(1, 9):
        added = _names(g, greedy_edges(g, s, n, True, prune=False)) - _names(
            g, greedy_edges(g, s, n - 1, True, prune=False)
        )
        assert added == {want[n - 1]}, n


def test_greedy_signed_and_absolute():
    g = _graph()
    s = _scores(g, {**SMALL, "m0->logits": -0.95})
    # |score|: ML (.95) first, m0 joins -> AM (.6, above IL .4), a0.h0 joins -> Q, K, V,
    # then IL, AL, IM
    want = [ML, AM, Q, K, V, IL, AL, IM]
    # signed: as GREEDY_ORDER (ML at -.95 is still the only candidate left after V)
    for n in range(9):
        assert _names(g, greedy_edges(g, s, n, absolute=True, prune=False)) == set(want[:n]), n
        assert _names(g, greedy_edges(g, s, n, absolute=False, prune=False)) == set(GREEDY_ORDER[:n]), n


def test_greedy_adds_the_best_eligible_edge_at_every_step():
    """The defining property, on random scores of a 3-layer graph: the circuit of n + 1
    edges is the one of n plus the highest-|score| edge whose child node (a head's q/k/v
    inputs are one node) is ``logits`` or the parent of an edge already in."""
    g = Graph.build(3, 2, 16)
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(g.valid.shape, generator=gen) * g.valid
    idx = g.edge_index()
    prev = set()
    for n in range(1, g.n_edges + 1):
        cur = _names(g, greedy_edges(g, s, n, absolute=True, prune=False))
        assert prev <= cur and len(cur) == n
        nodes = {"logits"} | {e.split("->")[0] for e in prev}
        eligible = [e for e in idx if e not in prev and e.split("->")[1].split("<")[0] in nodes]
        best = max(eligible, key=lambda e: abs(float(s[idx[e]])))
        assert cur - prev == {best}, n
        prev = cur
    assert _names(g, greedy_edges(g, s, 20, True)) != _names(g, top_edges(g, s, 20, True))


def test_greedy_edges_refuses_more_edges_than_the_graph_has():
    g = _graph()
    with pytest.raises(ValueError, match="between 0 and the graph's 8 edges"):
        greedy_edges(g, torch.zeros(g.valid.shape), 9, True)


def test_selection_rule_per_method():
    assert selection_rule("ifr") == "greedy"
    assert {selection_rule(m) for m in ALL_METHODS if m != "ifr"} == {"topn"}
    g = _graph()
    s = _scores(g, SMALL)
    assert _names(g, select_edges(g, s, 3, True, "greedy")) == GREEDY_PRUNED[3]
    assert _names(g, select_edges(g, s, 6, True, "topn")) == TOPN_PRUNED[6]
    with pytest.raises(ValueError, match="unknown selection 'best'"):
        select_edges(g, s, 3, True, "best")


# -------------------------------------------------------------- positions ------------
def test_position_weights_by_hand():
    w = position_weights(torch.tensor([0, 2, 1]), 3)
    want = torch.tensor([[1.0, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0]])
    torch.testing.assert_close(w, want)


def test_per_example_mean_differs_from_the_pooled_one_by_hand():
    """Example 0 reads position 0 (share 0.9); example 1 reads position 2 (shares 0.0,
    0.3, 0.6; its position 0's 0.9 in row 0 is padding). Per example: 0.9 and 0.3, mean
    0.6. Pooled over the four (example, position) pairs: 1.8 / 4 = 0.45."""
    shares = torch.tensor([[0.9, 0.5, 0.5], [0.0, 0.3, 0.6]])
    w = position_weights(torch.tensor([0, 2]), 3)
    assert float((shares * w).sum()) / 2 == pytest.approx(0.6)


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    return load_bridge(save_toy_gpt2(tmp_path_factory.mktemp("ifr_model"), seed=5), "cpu")


def _data(pos):
    g = torch.Generator().manual_seed(4)
    n, T = len(pos), max(pos) + 1
    clean = torch.randint(2, 20, (n, T), generator=g)
    corrupt = torch.randint(2, 20, (n, T), generator=g)
    return CounterfactualBatch(
        clean, corrupt, torch.randint(2, 20, (n,), generator=g), torch.randint(2, 20, (n,), generator=g),
        torch.tensor(pos),
    )  # fmt: skip


def test_ifr_scores_do_not_depend_on_how_examples_are_batched_or_padded(bridge):
    """An example's score is its own mean over positions: the mean over examples of each
    example scored alone (unpadded) equals the scores of the padded batch, whatever the
    batch size."""
    data = _data([5, 1, 3, 2])
    graph = Graph.from_bridge(bridge)
    alone = []
    for b in range(len(data)):
        one = data.slice(b, b + 1)
        T = int(one.pos[0]) + 1
        one = CounterfactualBatch(one.clean[:, :T], one.corrupt[:, :T], one.answer, one.foil, one.pos)
        alone.append(information_flow_routes(bridge, graph, one))
    want = torch.stack(alone).mean(0)
    for bs in (1, 3, 4):
        torch.testing.assert_close(information_flow_routes(bridge, graph, data, batch_size=bs), want)


def test_localize_evaluates_ifr_greedily_and_others_by_top_n(bridge):
    data = _data([4, 4, 4])
    graph = Graph.from_bridge(bridge)
    fr = (0.05, 0.2, 0.5, 1.0)
    for method, select in (("ifr", greedy_edges), ("eap", top_edges)):
        _, scores, curve, summary = localize(bridge, data, method, fractions=fr)
        assert set(curve.selection) == {"greedy" if method == "ifr" else "topn"}
        assert {"cpr", "cmd"} <= set(summary) and all(abs(summary[k]) < 10 for k in ("cpr", "cmd"))
        for p in curve.itertuples():
            mask = select(graph, scores, p.n_edges, p.ranking == "absolute")
            assert p.n_kept == int(mask.sum())
            assert p.metric == pytest.approx(run_circuit(bridge, graph, data, mask).mean().item(), abs=1e-6)
    # on IFR's scores the two rules pick different circuits at some fraction
    s = information_flow_routes(bridge, graph, data)
    assert any(
        not torch.equal(greedy_edges(graph, s, n_edges_at(f, graph.n_edges), True),
                        top_edges(graph, s, n_edges_at(f, graph.n_edges), True))
        for f in fr
    )  # fmt: skip
