"""MIB's key and value inputs on grouped-query models (gim.kv_inputs): the model ungrouped
(a key and value projection per query head) computes the same function; each query head's
key/value edge is scored and patched on its own; the per-head edges sum to the group's;
and patching one head's key or value input is what a hand-written attention gives."""

import warnings
from contextlib import ExitStack

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import UngroupError, load_bridge, load_hf, save_model, ungroup_kv  # noqa: E402
from selfrepair.gim.attribute import edge_scores, exact_edge_patching  # noqa: E402
from selfrepair.gim.evaluate import run_circuit  # noqa: E402
from selfrepair.gim.graph import KV_INPUTS, Graph, from_mib_json, to_mib_json, ungroups  # noqa: E402
from selfrepair.gim.hooks import prepared  # noqa: E402
from selfrepair.gim.memory import Shape  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402
from tiny_models import tiny_gemma3, tiny_llama  # noqa: E402

VOCAB = 20
N_HEADS, N_KV = 4, 2  # tiny_llama: two key/value groups of two query heads
REP = N_HEADS // N_KV


def _sharp(model):
    """Queries and keys scaled up, so that attention is far from uniform and a head's keys
    move the logits (at the initial scale they hardly do), and values and the unembedding
    too, so that the logit differences are not small."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6)
            layer.self_attn.k_proj.weight.mul_(6)
            layer.self_attn.v_proj.weight.mul_(3)
        model.lm_head.weight.mul_(10)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv_models")
    out = {}
    for name, model in (("llama", tiny_llama(VOCAB, N_KV, seed=3)), ("mha", tiny_llama(VOCAB, N_HEADS, seed=4))):
        save_model(_sharp(model), root / name)
        save_word_tokenizer(root / name, [f"t{i}" for i in range(VOCAB)])
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def bridges(folders):
    """The grouped-query Llama booted both ways, graph features on."""
    with ExitStack() as stack:
        yield {
            kv: stack.enter_context(prepared(load_bridge(folders["llama"], "cpu", ungroup=ungroups(kv))))
            for kv in KV_INPUTS
        }


def _data(n=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, VOCAB, (n, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1:4] = torch.randint(0, VOCAB, (n, 3), generator=g)
    answer = torch.randint(0, VOCAB, (n,), generator=g)
    return CounterfactualBatch(clean, corrupt, answer, (answer + 1) % VOCAB, torch.full((n,), T - 1))


def test_kv_inputs_is_checked():
    assert ungroups("per_query_head") and not ungroups("per_group")
    with pytest.raises(ValueError, match="per_query_head"):
        ungroups("per_head")


def test_ungrouped_model_is_the_same_function(folders):
    tokens = _data().clean
    grouped, ungrouped = load_hf(folders["llama"]), ungroup_kv(load_hf(folders["llama"]))
    assert ungrouped.config.num_key_value_heads == N_HEADS
    attn = ungrouped.model.layers[0].self_attn
    assert attn.k_proj.weight.shape[0] == N_HEADS * attn.head_dim and attn.num_key_value_groups == 1
    # head h's projection rows are its group's: the weights copied, not changed
    w, d = grouped.model.layers[0].self_attn.k_proj.weight, attn.head_dim
    for h in range(N_HEADS):
        assert torch.equal(attn.k_proj.weight[h * d : (h + 1) * d], w[(h // REP) * d : (h // REP + 1) * d])
    with torch.no_grad():
        torch.testing.assert_close(ungrouped(tokens).logits, grouped(tokens).logits, rtol=0, atol=1e-5)


def test_ungroup_leaves_multi_head_models_alone(folders):
    hf = load_hf(folders["mha"])
    before = hf.model.layers[0].self_attn.k_proj
    assert ungroup_kv(hf) is hf and hf.model.layers[0].self_attn.k_proj is before


def test_ungroup_gemma3_one_kv_head(tmp_path):
    """Gemma-3's one key/value head for all query heads (Gemma-3-270M: 4 on 1), its
    per-head key norm included: the same logits, a key input per query head."""
    save_model(tiny_gemma3(50, 1, 3, seed=2), tmp_path / "g")
    save_word_tokenizer(tmp_path / "g", [f"t{i}" for i in range(50)])
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    grouped = load_bridge(tmp_path / "g")
    ungrouped = load_bridge(tmp_path / "g", ungroup=True)
    with torch.no_grad():
        torch.testing.assert_close(ungrouped(tokens), grouped(tokens), rtol=0, atol=1e-5)
    assert Graph.from_bridge(ungrouped).n_kv_heads == 2 and Graph.from_bridge(grouped).n_kv_heads == 1
    shape = {}
    with prepared(ungrouped):
        ungrouped.run_with_hooks(
            tokens, fwd_hooks=[("blocks.1.hook_v_input", lambda x, hook: shape.__setitem__("v", tuple(x.shape)))]
        )
    assert shape["v"][2] == 2


def test_ungroup_refuses_attention_it_cannot_expand():
    class Attn(torch.nn.Module):
        num_key_value_groups = 2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()
            self.attn = Attn()

    with pytest.raises(UngroupError, match="k_proj"):
        ungroup_kv(Model())


def test_both_graphs_have_the_same_edges(bridges):
    a, b = (Graph.from_bridge(bridges[kv]) for kv in KV_INPUTS)
    assert a.edge_names() == b.edge_names() and a.n_kv_heads == N_HEADS and b.n_kv_heads == N_KV
    # slots: per query head its own k/v input; per group the group's
    slots = {kv: dict(g.backward_slots()["blocks.1.hook_k_input"]) for kv, g in zip(KV_INPUTS, (a, b))}
    j = a.backward.index("a1.h3<k>")
    assert slots["per_query_head"][j] == 3 and slots["per_group"][j] == 3 // REP


def test_memory_shape_ungrouped():
    shape = Shape.from_config(
        {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "vocab_size": 100,
        }  # fmt: skip
    )
    assert shape.ungrouped().n_kv_heads == 9 and shape.ungrouped().n_params > shape.n_params
    assert shape.ungrouped().grad_slots - shape.grad_slots == 2 * 2 * (9 - 3)


@pytest.mark.parametrize("method", ["eap", "gim", "eap-ig"])
def test_per_head_edges_sum_to_the_group_edge(bridges, method):
    """The group's shared k (v) input receives the sum of its heads' gradients, so the sum
    of the per-head edge scores is the group's edge score, which the grouped convention
    gives each head divided by the group size; every other edge scores the same."""
    data = _data()
    per_head, per_group = (edge_scores(bridges[kv], Graph.from_bridge(bridges[kv]), data, method) for kv in KV_INPUTS)
    graph = Graph.from_bridge(bridges["per_query_head"])
    kv_cols = [j for j, v in enumerate(graph.backward) if v.endswith(("<k>", "<v>"))]
    other = [j for j in range(len(graph.backward)) if j not in kv_cols]
    torch.testing.assert_close(per_head[:, other], per_group[:, other], rtol=1e-4, atol=1e-6)
    checked = 0
    for layer in range(graph.n_layers):
        for x in "kv":
            for g in range(N_KV):
                cols = [graph.backward.index(f"a{layer}.h{h}<{x}>") for h in range(g * REP, (g + 1) * REP)]
                group_edge = per_group[:, cols[0]] * REP
                for j in cols:  # the grouped convention: each head the group's share
                    torch.testing.assert_close(per_group[:, j], per_group[:, cols[0]])
                torch.testing.assert_close(per_head[:, cols].sum(1), group_edge, rtol=1e-4, atol=1e-6)
                checked += int((per_head[:, cols[0]] - per_head[:, cols[1]]).abs().max() > 1e-6)
    assert checked > 0  # the heads of a group are scored apart, not tied


def _hand_patched_logit_diff(hf, data, layer: int, head: int, kind: str) -> torch.Tensor:
    """logit(answer) - logit(foil) with query head ``head`` of ``layer`` reading keys
    (``kind`` "k") or values ("v") computed from the corrupted input, every other head
    and everything else from the clean one, written with the Hugging Face model's own
    attention interface: the corrupted run's key/value states of that layer are kept, then
    in the clean run the grouped states are expanded per head and head ``head``'s row
    replaced. For ``layer`` 0 this is patching the edge input -> a{layer}.h{head}<kind>."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import repeat_kv
    from transformers.models.llama.modeling_llama import eager_attention_forward

    kept = {}

    def attention(module, query, key, value, attention_mask, **kw):
        # a custom implementation is handed no eager mask: the causal one (no padding here)
        T = query.shape[-2]
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
        rep = module.num_key_value_groups
        k, v = repeat_kv(key, rep), repeat_kv(value, rep)
        if module.layer_idx == layer:
            if "corrupt" not in kept:
                kept["corrupt"] = (k, v)
            elif kept.get("patch"):
                k, v = k.clone(), v.clone()
                src = kept["corrupt"][0] if kind == "k" else kept["corrupt"][1]
                (k if kind == "k" else v)[:, head] = src[:, head]
        module.num_key_value_groups = 1  # states already expanded
        try:
            return eager_attention_forward(module, query, k, v, causal, **kw)
        finally:
            module.num_key_value_groups = rep

    AttentionInterface.register("kv_patch_reference", attention)
    old = hf.config._attn_implementation
    hf.set_attn_implementation("kv_patch_reference")
    try:
        with torch.no_grad():
            hf(data.corrupt)
            kept["patch"] = True
            logits = hf(data.clean).logits
    finally:
        hf.set_attn_implementation(old)
    rows = torch.arange(len(data))
    last = logits[rows, data.pos]
    return last[rows, data.answer] - last[rows, data.foil]


def _clean_logit_diff(hf, data):
    with torch.no_grad():
        logits = hf(data.clean).logits
    rows = torch.arange(len(data))
    return logits[rows, data.pos, data.answer] - logits[rows, data.pos, data.foil]


@pytest.mark.parametrize("kind", ["k", "v"])
def test_one_heads_kv_edge_patched_on_its_own_is_the_hand_written_attention(folders, bridges, kind):
    """Patching input -> a0.h{H}<k|v> under MIB's convention moves head H's keys (values)
    alone: the circuit evaluation (every edge kept but that one) and EActP's score equal a
    hand-written attention on the original grouped model. Under the grouped convention
    the same edge patches the whole group's input, and its EActP score is the group's
    effect divided by the group size."""
    hf, data = load_hf(folders["llama"]), _data(seed=1)
    hf.set_attn_implementation("eager")
    base = _clean_logit_diff(hf, data)
    bridge = bridges["per_query_head"]
    graph = Graph.from_bridge(bridge)
    exact = exact_edge_patching(bridge, graph, data)
    i = graph.forward.index("input")
    effects = []
    for head in range(N_HEADS):
        want = _hand_patched_logit_diff(hf, data, 0, head, kind)
        effects.append(float((base - want).mean()))
        j = graph.backward.index(f"a0.h{head}<{kind}>")
        mask = graph.valid.clone()
        mask[i, j] = False
        torch.testing.assert_close(run_circuit(bridge, graph, data, mask), want, rtol=0, atol=1e-5)
        assert float(exact[i, j]) == pytest.approx(float((base - want).mean()), abs=1e-5)
    # grouped: the edge into head 0 patches the group of heads 0 and 1
    grouped = bridges["per_group"]
    g_graph = Graph.from_bridge(grouped)
    g_exact = exact_edge_patching(grouped, g_graph, data)
    mask = g_graph.valid.clone()
    mask[i, [g_graph.backward.index(f"a0.h{h}<{kind}>") for h in range(REP)]] = False
    group_effect = (base - run_circuit(grouped, g_graph, data, mask)).mean()
    assert float(g_exact[i, g_graph.backward.index(f"a0.h0<{kind}>")]) == pytest.approx(
        float(group_effect) / REP, abs=1e-5
    )
    # the two conventions part here: head 0's own edge is not its group's share
    assert abs(effects[0] - float(group_effect) / REP) > 1e-3
    assert max(abs(e) for e in effects) > 1e-2


def test_mib_file_round_trip_per_query_head(bridges):
    """A circuit file of per-head scores, read back as the per-head graph: every key and
    value edge's own score and flag kept (MIB's files name the same edges either way)."""
    graph = Graph.from_bridge(bridges["per_query_head"])
    scores = torch.randn(graph.valid.shape, generator=torch.Generator().manual_seed(0)) * graph.valid
    keep = torch.zeros_like(graph.valid)
    keep[0, graph.backward.index("a1.h1<k>")] = True
    g2, s2, in2 = from_mib_json(to_mib_json(graph, scores, keep), n_kv_heads=N_HEADS)
    assert g2.n_kv_heads == N_HEADS and torch.equal(in2, keep)
    torch.testing.assert_close(s2, scores)
