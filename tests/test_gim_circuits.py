"""Edge graph, edge scores, MIB files, counterfactual patching and the areas."""

import warnings
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model  # noqa: E402
from selfrepair.gim.attribute import (  # noqa: E402
    edge_scores,
    exact_edge_patching,
    exact_patching_rows,
    information_flow_routes,
    l1_distances,
    method_scores,
    per_edge_patching,
    proximity_shares,
    too_large,
)
from selfrepair.gim.backward import GIMConfig, gim  # noqa: E402
from selfrepair.gim.evaluate import FRACTIONS, cmd, cpr, faithfulness_curve, logit_diff, patched, run_circuit  # noqa: E402
from selfrepair.gim.flow_routes import _slots_equal, _values_equal  # noqa: E402
from selfrepair.gim.graph import (  # noqa: E402
    Graph,
    from_mib_json,
    mib_to_component,
    n_edges_at,
    prune_dangling,
    save_mib_json,
    top_edges,
)
from selfrepair.gim.hooks import forward_activations, prepared  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402
from tiny_models import tiny_llama  # noqa: E402


def _save_llama(folder):
    save_model(tiny_llama(seed=1), folder)


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    root = tmp_path_factory.mktemp("circ_models")
    cfg = gpt2_toy_config(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    save_model(build_gpt2_toy(cfg, seed=5, positional=True), root / "gpt2")
    _save_llama(root / "llama")
    out = {}
    with ExitStack() as stack:  # the brute-force references below hook q/k/v inputs directly
        for name in ("gpt2", "llama"):
            save_word_tokenizer(root / name, [f"t{i}" for i in range(20)])
            out[name] = stack.enter_context(prepared(load_bridge(root / name, "cpu")))
        yield out


def _data(n=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(2, 20, (n, T), generator=g)
    corrupt = torch.randint(2, 20, (n, T), generator=g)
    return CounterfactualBatch(
        clean,
        corrupt,
        torch.randint(2, 20, (n,), generator=g),
        torch.randint(2, 20, (n,), generator=g),
        torch.full((n,), T - 1),
    )


def test_edge_count_gpt2_small():
    assert Graph.build(12, 12, 768).n_edges == 32491  # MIB's count for GPT-2 small
    g = Graph.build(2, 2, 16)
    # by hand: heads of layer 0: 3*2*1, m0: 1+2, heads of layer 1: 3*2*4, m1: 4+2, logits: 7
    assert g.n_edges == 6 + 3 + 24 + 6 + 7
    assert "a0.h1->a1.h0<k>" in g.edge_names() and "a0.h0->m0" in g.edge_names()
    assert "m1->a1.h0<q>" not in g.edge_names() and "a1.h0->a1.h1<q>" not in g.edge_names()
    assert str(mib_to_component("a3.h2<q>")) == "L3H2" and mib_to_component("m1").name == "L1MLP"


def brute_force_patched_logits(bridge, graph, data, in_graph):
    """Fixed-point iteration of whole forward passes: pass k sets every downstream input
    to (corrupted run's input) + sum over kept parent edges of (a_u from pass k-1 minus
    a_u corrupted). After 2 * n_layers + 3 passes nothing changes (the graph is a DAG)."""
    _, a_corr = forward_activations(bridge, graph, data.corrupt)
    # corrupted inputs of every downstream slot, recorded directly
    slots = graph.backward_slots()
    x_corr = {}
    with torch.no_grad():
        bridge.run_with_hooks(
            data.corrupt,
            fwd_hooks=[(n, (lambda n: lambda x, hook: x_corr.__setitem__(n, x.clone()))(n)) for n in slots],
        )
    acts = a_corr.clone()
    rep = graph.n_heads // graph.n_kv_heads
    for _ in range(2 * graph.n_layers + 3):
        hooks = []
        for name, cols in slots.items():

            def setter(x, hook, name=name, cols=cols):
                y = x_corr[name].clone()
                done = set()
                for j, s in cols:
                    if s in done and s is not None:
                        continue
                    if s is not None and name.endswith(("k_input", "v_input")) and rep > 1:
                        js = [jj for jj, ss in cols if ss == s]
                        keep = in_graph[:, js].any(dim=1)
                    else:
                        keep = in_graph[:, j]
                    done.add(s)
                    add = sum((acts[:, :, i] - a_corr[:, :, i]) for i in range(len(graph.forward)) if keep[i])
                    if s is None:
                        y = y + add
                    else:
                        y[:, :, s] = y[:, :, s] + add
                return y

            hooks.append((name, setter))
        logits, acts_new = forward_activations(bridge, graph, data.clean, hooks=hooks)
        acts = acts_new
    return logits


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_patching_matches_brute_force(bridges, name):
    bridge = bridges[name]
    graph = Graph.from_bridge(bridge)
    data = _data()
    torch.manual_seed(3)
    for density in (0.0, 0.3, 0.7, 1.0):
        in_graph = (torch.rand(graph.valid.shape) < density) & graph.valid
        _, a_corr = forward_activations(bridge, graph, data.corrupt)
        with torch.no_grad(), patched(bridge, graph, in_graph, a_corr):
            fast = bridge(data.clean)
        slow = brute_force_patched_logits(bridge, graph, data, in_graph)
        assert torch.allclose(fast, slow, atol=1e-4), (name, density)
    # the two ends: no edge == the corrupted run, every edge == the clean run
    with torch.no_grad():
        clean, corr = bridge(data.clean), bridge(data.corrupt)
        with patched(bridge, graph, torch.zeros_like(graph.valid), a_corr):
            assert torch.allclose(bridge(data.clean), corr, atol=1e-5)
        with patched(bridge, graph, graph.valid.clone(), a_corr):
            assert torch.allclose(bridge(data.clean), clean, atol=1e-5)


def test_patching_a_node_equals_activation_patching(bridges):
    bridge = bridges["gpt2"]
    graph = Graph.from_bridge(bridge)
    data = _data()
    _, a_corr = forward_activations(bridge, graph, data.corrupt)
    u = graph.forward.index("a0.h1")
    in_graph = graph.valid.clone()
    in_graph[u] = False

    def patch(x, hook):
        x = x.clone()
        x[:, :, 1] = a_corr[:, :, u]
        return x

    with torch.no_grad():
        with patched(bridge, graph, in_graph, a_corr):
            edges = bridge(data.clean)
        node = bridge.run_with_hooks(data.clean, fwd_hooks=[("blocks.0.attn.hook_result", patch)])
    assert torch.allclose(edges, node, atol=1e-5)


@pytest.mark.parametrize("method", ["eap", "gim", "gim-no-ln"])
def test_eap_out_edges_sum_to_node_attribution(bridges, method):
    """sum_v score(u->v) == (a_u(corr) - a_u(clean)) . dL/da_u / N, with dL/da_u taken by
    autograd at the head's own output hook (an independent path)."""
    bridge = bridges["gpt2"]
    graph = Graph.from_bridge(bridge)
    data = _data()
    scores = edge_scores(bridge, graph, data, method)
    u = graph.forward.index("a0.h1")
    _, a_clean = forward_activations(bridge, graph, data.clean)
    _, a_corr = forward_activations(bridge, graph, data.corrupt)
    store = {}

    def leaf(x, hook):
        store["x"] = x.detach().clone().requires_grad_(True)
        return store["x"]

    cfg = None if method == "eap" else GIMConfig.variant(method)
    with gim(bridge, cfg or GIMConfig.none()):
        logits = bridge.run_with_hooks(data.clean, fwd_hooks=[("blocks.0.attn.hook_result", leaf)])
        (-logit_diff(logits, data).sum()).backward()
    grad = store["x"].grad[:, :, 1]
    expected = ((a_corr[:, :, u] - a_clean[:, :, u]) * grad).sum() / len(data)
    assert scores[u].sum().item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-7)


def test_eap_ig_out_edges_sum_to_averaged_node_attribution(bridges):
    """EAP-IG (inputs, 3 steps): sum_v score(u->v) == diff_u . mean_k dL/da_u, the
    gradient taken at the head's output with the input embedding set by hand to
    corrupt + k/3 (clean - corrupt), k = 0, 1, 2."""
    bridge = bridges["gpt2"]
    graph = Graph.from_bridge(bridge)
    data = _data()
    scores = edge_scores(bridge, graph, data, "eap-ig", ig_steps=3)
    u = graph.forward.index("a1.h0")
    _, a_clean = forward_activations(bridge, graph, data.clean)
    _, a_corr = forward_activations(bridge, graph, data.corrupt)
    total = torch.zeros_like(a_clean[:, :, u])
    for k in range(3):
        emb = a_corr[:, :, 0] + k / 3 * (a_clean[:, :, 0] - a_corr[:, :, 0])
        store = {}

        def leaf(x, hook):
            store["x"] = x.detach().clone().requires_grad_(True)
            return store["x"]

        logits = bridge.run_with_hooks(
            data.clean,
            fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: emb), ("blocks.1.attn.hook_result", leaf)],
        )
        (-logit_diff(logits, data).sum()).backward()
        total += store["x"].grad[:, :, 0]
    expected = ((a_corr[:, :, u] - a_clean[:, :, u]) * total / 3).sum() / len(data)
    assert scores[u].sum().item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-7)
    assert not torch.allclose(scores, edge_scores(bridge, graph, data, "eap"))


def test_gqa_scores_and_patching_run(bridges):
    bridge = bridges["llama"]
    graph = Graph.from_bridge(bridge)
    assert graph.n_kv_heads == 2 and graph.n_heads == 4
    data = _data()
    for m in ("eap", "gim"):
        s = edge_scores(bridge, graph, data, m)
        assert torch.isfinite(s).all() and s.abs().sum() > 0
    curve = faithfulness_curve(bridge, graph, data, s, fractions=(0.1, 0.5, 1.0))
    assert curve["points"][-1]["faithfulness"] == pytest.approx(1.0, abs=1e-4)


def test_areas_hand_worked():
    assert cpr([0, 0.5, 1], [0, 1, 1]) == pytest.approx(0.75)
    assert cmd([0, 0.5, 1], [0, 1, 1]) == pytest.approx(0.25)
    assert cmd([0, 1], [2, 0]) == pytest.approx(1.0)  # |1-f| = 1, 1
    x = np.array(FRACTIONS)
    assert cpr(x, x) == pytest.approx((1 - 0.001**2) / 2)
    assert cpr(x, np.ones_like(x)) == pytest.approx(0.999)
    assert cmd(x, np.ones_like(x)) == pytest.approx(0.0)


def test_fractions_out_of_ascending_order_are_refused():
    """Over descending fractions the trapezoid area changes sign: CPR 0.75 read as -0.75
    (by hand: widths -0.5, -0.5 times mean heights 1 and 0.5)."""
    with pytest.raises(ValueError, match=r"fractions \[1.0, 0.5, 0.0\] are not in ascending order.*\[0.0, 0.5, 1.0\]"):
        cpr([1, 0.5, 0], [1, 1, 0])
    with pytest.raises(ValueError, match="not in ascending order"):
        cmd([0.1, 0.1, 1.0], [0, 1, 1])  # a repeated fraction: no order either


def test_localize_refuses_descending_fractions_before_scoring(bridges):
    from selfrepair.gim.localization import localize

    with pytest.raises(ValueError, match=r"fractions \[1.0, 0.5, 0.1\] are not in ascending order"):
        localize(bridges["gpt2"], _data(), "eap", (1.0, 0.5, 0.1))


def test_the_config_refuses_descending_fractions_naming_the_key():
    import yaml

    from selfrepair.core import config_schema

    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/gim.schema.yaml").read_text())
    assert config_schema.problems({"fractions": [0.1, 0.5, 1.0]}, schema, "gim") == []
    assert config_schema.problems({"fractions": [1.0, 0.5, 0.1]}, schema, "gim") == [
        "gim.fractions: [1.0, 0.5, 0.1] is not in ascending order (each value must be larger than the one before; "
        "write [0.1, 0.5, 1.0])"
    ]


def test_mib_json_roundtrip(tmp_path):
    g = Graph.build(2, 2, 16)
    torch.manual_seed(0)
    scores = torch.randn(g.valid.shape) * g.valid
    in_graph = top_edges(g, scores, 5, absolute=True, prune=False)
    save_mib_json(tmp_path / "c.json", g, scores, in_graph)
    import json

    d = json.loads((tmp_path / "c.json").read_text())
    assert d["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
    assert len(d["edges"]) == g.n_edges and sum(e["in_graph"] for e in d["edges"].values()) == 5
    assert set(d["nodes"]) == set(g.forward) | {"logits"}
    g2, s2, ig2 = from_mib_json(tmp_path / "c.json")
    assert torch.allclose(s2, scores) and torch.equal(ig2, in_graph)
    top = max(d["edges"].items(), key=lambda kv: abs(kv[1]["score"]))
    assert top[1]["in_graph"]


# ------------------------------------------------------------- MIB's evaluation ------
def _mask(g, names):
    idx = g.edge_index()
    m = torch.zeros_like(g.valid)
    for n in names:
        m[idx[n]] = True
    return m


def _names(g, mask):
    return {n for n, (i, j) in g.edge_index().items() if mask[i, j]}


CHAIN = ["input->a0.h0<q>", "a0.h0->m0", "m0->a1.h1<v>", "a1.h1->logits"]


@pytest.mark.parametrize(
    "extra, kept",
    [
        ([], CHAIN),  # a chain input -> logits stays whole
        (["input->a0.h1<k>"], CHAIN),  # a0.h1 dangles (no outgoing edge): its input edge goes
        (["a0.h1->logits"], CHAIN),  # a0.h1 has no incoming edge (its only input was cut): its output goes
        (["input->a1.h0<k>", "a1.h0->logits"], CHAIN + ["input->a1.h0<k>", "a1.h0->logits"]),  # a k edge is an input
        (["input->logits"], CHAIN + ["input->logits"]),  # input counts as having an incoming edge
        # three passes backwards: m1 has no output, then a1.h0 has none, then a0.h1
        (["input->a0.h1<q>", "a0.h1->a1.h0<k>", "a1.h0->m1"], CHAIN),
        # three passes forwards: a0.h1 has no input, then m0's second output, then a1.h0
        (["a0.h1->a1.h0<q>", "a1.h0->m1", "m1->logits"], CHAIN),
    ],
)
def test_prune_dangling_by_hand(extra, kept):
    g = Graph.build(2, 2, 16)
    assert _names(g, prune_dangling(g, _mask(g, CHAIN + extra))) == set(kept)


def test_prune_dangling_several_passes_to_empty_and_logits_kept():
    g = Graph.build(2, 2, 16)
    # nothing reaches logits: pruned over three passes down to nothing
    assert not prune_dangling(g, _mask(g, ["input->a0.h0<q>", "a0.h0->m0", "m0->a1.h0<k>"])).any()
    # logits needs no outgoing edge: one edge into it from input is a whole circuit
    assert _names(g, prune_dangling(g, _mask(g, ["input->logits"]))) == {"input->logits"}
    assert _names(g, prune_dangling(g, _mask(g, ["input->m1", "m1->logits"]))) == {"input->m1", "m1->logits"}


def _on_paths(g, mask):
    """Reference: edges u->v of mask with u reachable from input and v reaching logits."""
    edges = [(g.forward[i], g.backward[j].split("<")[0]) for i, j in mask.nonzero().tolist()]
    fwd, changed = {"input"}, True
    while changed:
        new = {v for u, v in edges if u in fwd} - fwd
        fwd |= new
        changed = bool(new)
    back, changed = {"logits"}, True
    while changed:
        new = {u for u, v in edges if v in back} - back
        back |= new
        changed = bool(new)
    return {
        f"{g.forward[i]}->{g.backward[j]}"
        for i, j in mask.nonzero().tolist()
        if g.forward[i] in fwd and g.backward[j].split("<")[0] in back
    }


def test_prune_dangling_keeps_exactly_the_input_to_logits_paths():
    g = Graph.build(3, 2, 16)
    gen = torch.Generator().manual_seed(0)
    for p in (0.05, 0.1, 0.2, 0.4):
        for _ in range(25):
            mask = (torch.rand(g.valid.shape, generator=gen) < p) & g.valid
            assert _names(g, prune_dangling(g, mask)) == _on_paths(g, mask)


def test_edges_at_a_fraction_truncate_like_mib():
    # MIB: int(pct * n); rounding would give 3, 1, 1 and 1
    assert [n_edges_at(f, n) for f, n in ((0.2, 13), (0.05, 13), (0.005, 110), (0.001, 500))] == [2, 0, 0, 0]
    assert n_edges_at(1.0, 13) == 13 and n_edges_at(0.5, 110) == 55


def test_faithfulness_curve_counts_and_prunes(bridges):
    bridge, data = bridges["gpt2"], _data()
    graph = Graph.from_bridge(bridge)
    s = edge_scores(bridge, graph, data, "eap")
    fr = (0.05, 0.2, 0.5, 1.0)
    curve = faithfulness_curve(bridge, graph, data, s, fractions=fr, absolute=True)
    for f, p in zip(fr, curve["points"]):
        assert p["n_edges"] == int(f * graph.n_edges)
        mask = top_edges(graph, s, p["n_edges"], absolute=True)
        assert p["n_kept"] == int(mask.sum()) <= p["n_edges"]
        assert torch.equal(mask, prune_dangling(graph, top_edges(graph, s, p["n_edges"], True, prune=False)))
        m = run_circuit(bridge, graph, data, mask).mean().item()
        assert p["metric"] == pytest.approx(m, abs=1e-6)


# ---------------------------------------------------------------- EActP and IFR --
@pytest.mark.parametrize("max_rows", [4096, 4])  # all parents of an input in one run; one at a time
def test_exact_edge_patching_equals_one_masked_run_per_edge(bridges, max_rows):
    bridge, data = bridges["gpt2"], _data(n=5)
    graph = Graph.from_bridge(bridge)
    fast = exact_edge_patching(bridge, graph, data, batch_size=3, max_rows=max_rows)
    slow = per_edge_patching(bridge, graph, data, batch_size=3)  # one `patched` run per edge
    assert slow.abs().max() > 1e-3
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    assert (fast[~graph.valid] == 0).all()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_exact_patching_rows_is_what_a_progress_counter_sees(bridges, name):
    """The planned rows of the EActP stage (its progress line's ETA) against the rows its
    forward passes carry, counted at the unembedding: GPT-2's and grouped-query Llama's
    inputs, two batches of which the second is partial."""
    from selfrepair.core.progress import Progress

    bridge, data = bridges[name], _data(n=5)
    graph = Graph.from_bridge(bridge)
    # by hand: each (parent, physical input) pair once per example; GQA's k and v inputs
    # of one key/value group are one input, so their parents count once per group
    slots = graph.backward_slots()
    pairs = {
        (i, name_, s)
        for name_, cols in slots.items()
        for j, s in cols
        for i in graph.valid[:, j].nonzero().flatten().tolist()
    }
    with Progress("m", "x", 1, log=lambda s: None) as p:
        p.watch(bridge)
        exact_edge_patching(bridge, graph, data, batch_size=3)
    assert p.rows == exact_patching_rows(graph, len(data)) == len(data) * (2 + len(pairs))


def test_exact_edge_patching_gqa_patches_the_group_input(bridges):
    bridge, data = bridges["llama"], _data()
    graph = Graph.from_bridge(bridge)
    rep = graph.n_heads // graph.n_kv_heads
    fast = exact_edge_patching(bridge, graph, data)
    base = run_circuit(bridge, graph, data, graph.valid).mean()
    # a q edge and an MLP edge: exactly one masked run; a k edge: the whole group's
    # k input loses u (every head of the group masked), that effect / group size
    for target in ("a1.h1<q>", "m0", "a1.h2<k>"):
        j = graph.backward.index(target)
        group = [j]
        if target.endswith("<k>"):
            head = int(target.split(".h")[1][0])
            group = [graph.backward.index(f"a1.h{h}<k>") for h in range(graph.n_heads) if h // rep == head // rep]
        for i in graph.valid[:, j].nonzero().flatten().tolist()[:3]:
            mask = graph.valid.clone()
            mask[i, group] = False
            want = (base - run_circuit(bridge, graph, data, mask).mean()) / len(group)
            assert float(fast[i, j]) == pytest.approx(float(want), abs=1e-5)


def test_proximity_shares_hand_worked():
    parts = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[3.0, 0.0], [-1.0, 0.0]], [[2.0, 0.0], [-1.0, 0.0]]])
    total = torch.tensor([[1.0, 1.0], [2.0, 0.0], [1.0, 0.0]])
    # |y|=2, |y-p|=1,1 -> 1,1 -> halves; |y|=2, |y-p|=1,3 -> 1,0; |y|=1, |y-p|=1,2 -> 0,0
    want = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(proximity_shares(parts, total), want)


@pytest.mark.parametrize("chunk", [1, 24, 2**18])
def test_l1_distances_on_a_prefix_view_match_brute_force(chunk):
    """|total - part_k|_1 on a strided prefix of a larger buffer, in chunks of 1 row, of
    a few rows and all at once, against abs().sum() of the explicit differences."""
    g = torch.Generator().manual_seed(0)
    buf = torch.randn(3, 4, 7, 5, generator=g)  # [B, T, n_forward, d]
    total = torch.randn(3, 4, 5, generator=g)
    parts = buf[:, :, :4]  # not contiguous
    want = (total[:, :, None, :] - parts).abs().sum(-1)
    got = l1_distances(parts, total, chunk=chunk)
    assert got.shape == (3, 4, 4)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        proximity_shares(buf, total, first=4), proximity_shares(parts.contiguous(), total), rtol=0, atol=0
    )


def test_value_and_slot_equality_helpers():
    x = torch.arange(6.0).reshape(1, 1, 1, 6).expand(2, 3, 4, 6).clone()
    assert _slots_equal(x)
    x[1, 2, 3, 0] += 1
    assert not _slots_equal(x)
    assert _values_equal(x[:, :, 0], x[:, :, 1]) and not _values_equal(x[:, :, 0], x[:, :, 3])
    assert not _values_equal(torch.zeros(2), torch.zeros(3))
    assert not _values_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))  # as torch.equal


def test_forward_activations_stop_after_skips_the_rest_and_leaves_no_hooks(bridges):
    bridge = bridges["gpt2"]
    graph, tokens = Graph.from_bridge(bridge), _data().clean
    logits, a = forward_activations(bridge, graph, tokens)
    none, b = forward_activations(bridge, graph, tokens, stop_after="ln_final.hook_in")
    assert none is None and torch.equal(a, b)
    assert not bridge.hook_dict["ln_final.hook_in"]._forward_hooks
    with torch.no_grad():
        assert torch.equal(bridge(tokens), logits)


@pytest.mark.parametrize("processing", ["none", "mib"])
def test_information_flow_routes_by_hand(bridges, processing):
    """By hand from the cache. The input node is the token embedding (MIB's hook_embed,
    not hook_resid_pre, which adds the position embedding). Under "mib" the activations
    are those of HookedTransformer's default processing: each head's output less its
    value bias's constant b_V @ W_O (folded into b_O), then every part and input centred
    over d_model (GPT-2 has LayerNorm)."""
    bridge, data = bridges["gpt2"], _data(n=3, T=5)
    data.pos = torch.tensor([4, 2, 3])
    graph = Graph.from_bridge(bridge)
    hf = bridge.original_model.transformer.h
    biases = [blk.attn.c_attn.bias for blk in hf] + [blk.ln_1.bias for blk in hf]
    kept = [b.detach().clone() for b in biases]
    try:
        with torch.no_grad():  # GPT-2's init leaves biases at 0: give the values some to fold
            g = torch.Generator().manual_seed(3)
            for b in biases:
                b.normal_(0, 0.5, generator=g)
        _check_ifr_by_hand(bridge, graph, data, processing)
    finally:
        with torch.no_grad():
            for b, k in zip(biases, kept):
                b.copy_(k)


def _check_ifr_by_hand(bridge, graph, data, processing):
    ifr = information_flow_routes(bridge, graph, data, batch_size=2, processing=processing)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(data.clean)
    assert cache["hook_pos_embed"].abs().max() > 1e-3  # positions the input node must leave out
    assert bridge.b_V.abs().max() > 0.1
    if processing == "mib":  # the processing moves the scores by far more than the tolerances below
        other = information_flow_routes(bridge, graph, data, batch_size=2, processing="none")
        assert (ifr - other).abs().max() > 1e-2
    mib = processing == "mib"
    W_O, W_V, b_V = bridge.W_O.detach(), bridge.W_V.detach(), bridge.b_V.detach()  # [L,H,dh,d] [L,H,d,dh] [L,H,dh]
    ln_b = [blk.ln_1.bias.detach() for blk in bridge.original_model.transformer.h]

    def centre(x):
        return x - x.mean(-1, keepdim=True) if mib else x

    parts = [centre(cache["hook_embed"])]  # input, then each layer's heads and MLP
    for layer in range(graph.n_layers):
        for h in range(graph.n_heads):
            r = cache[f"blocks.{layer}.attn.hook_result"][:, :, h]
            # fold_ln puts ln_1's bias into b_V (through W_V) before the value biases are folded
            constant = (b_V[layer, h] + ln_b[layer] @ W_V[layer, h]) @ W_O[layer, h]
            parts.append(centre(r - constant if mib else r))
        parts.append(centre(cache[f"blocks.{layer}.hook_mlp_out"]))
    reads = {"logits": cache["ln_final.hook_in"], "a1.h1<v>": cache["blocks.1.hook_v_input"][:, :, 1]}
    reads["m0"] = cache["blocks.0.hook_mlp_in"]
    reads = {k: centre(v) for k, v in reads.items()}
    # MIB's order: the mean over each example's positions (up to the one read: 5, 3 and 4
    # of them), then the mean over the 3 examples; not the mean of the 12 pooled pairs
    for target, y in reads.items():
        j = graph.backward.index(target)
        parents = graph.valid[:, j].nonzero().flatten().tolist()
        want, pooled, n = torch.zeros(len(parents)), torch.zeros(len(parents)), 0
        for b in range(3):
            per_example = torch.zeros(len(parents))
            for t in range(int(data.pos[b]) + 1):
                prox = []
                for i in parents:
                    yy, p = y[b, t].double(), parts[i][b, t].double()
                    prox.append(max(float(yy.abs().sum() - (yy - p).abs().sum()), 0.0))
                per_example += torch.tensor(prox) / sum(prox)
                n += 1
            want += per_example / (int(data.pos[b]) + 1)
            pooled += per_example
        torch.testing.assert_close(ifr[parents, j], (want / 3).float(), atol=1e-5, rtol=1e-4)
        # the two orders differ here by more than the tolerance above (1e-5 + 1e-4 x a share <= 1)
        assert (ifr[parents, j] - pooled / n).abs().max() > 2e-4
    assert (ifr >= 0).all() and (ifr[~graph.valid] == 0).all()
    assert (ifr.sum(0) <= 1 + 1e-5).all()


def test_method_scores_dispatch_and_size_limit(bridges):
    bridge, data = bridges["gpt2"], _data()
    graph = Graph.from_bridge(bridge)
    torch.testing.assert_close(method_scores(bridge, graph, data, "ifr"), information_flow_routes(bridge, graph, data))
    torch.testing.assert_close(method_scores(bridge, graph, data, "eap"), edge_scores(bridge, graph, data, "eap"))
    with pytest.raises(ValueError, match="unknown method 'eatp'"):
        method_scores(bridge, graph, data, "eatp")
    assert too_large("eactp", 32491) and "32491 edges" in too_large("eactp", 32491)
    assert too_large("eactp", 110) is None and too_large("eap", 10**6) is None
