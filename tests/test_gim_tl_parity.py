"""EAP with ``gradient_at="corrupted"`` equals TransformerLens 4.3's own edge-level
attribution patching (``transformer_lens.tools.analysis.attribution_patching``, plain
attribution, ``ig_steps=1``), node names mapped to MIB's and token positions summed."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model  # noqa: E402
from selfrepair.gim.attribute import edge_scores  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402
from selfrepair.gim.tl_reference import tl_edge_scores  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402
from tiny_models import tiny_llama  # noqa: E402

AP = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")

V = 20


def _llama(n_kv: int):
    return tiny_llama(vocab_size=V, n_kv_heads=n_kv, seed=1)


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    root = tmp_path_factory.mktemp("tl_parity")
    models = {
        "gpt2": build_gpt2_toy(
            gpt2_toy_config(V, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16), seed=5, positional=True
        ),
        "llama": _llama(4),  # TransformerLens's edge graph refuses GQA (see below)
        "llama-gqa": _llama(2),
    }
    out = {}
    for name, model in models.items():
        save_model(model, root / name)
        save_word_tokenizer(root / name, [f"t{i}" for i in range(V)])
        out[name] = load_bridge(root / name, "cpu")
    return out


def _data(n=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(2, V, (n, T), generator=g)
    corrupt = torch.randint(2, V, (n, T), generator=g)
    answer, foil = torch.randint(2, V, (n,), generator=g), torch.randint(2, V, (n,), generator=g)
    return CounterfactualBatch(clean, corrupt, answer, foil, torch.randint(2, T, (n,), generator=g))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_corrupted_gradient_point_equals_transformer_lens(bridges, name):
    bridge = bridges[name]
    graph = Graph.from_bridge(bridge)
    data = _data()
    ours = edge_scores(bridge, graph, data, "eap", batch_size=2, gradient_at="corrupted")
    theirs = tl_edge_scores(bridge, graph, data)
    # the same edge set (every TL edge landed on one of ours; ours off the graph are 0)
    assert ours[~graph.valid].abs().max() == 0 and theirs[~graph.valid].abs().max() == 0
    scale = theirs.abs().max()
    assert scale > 1e-3
    # float32 sums in another order (batched vs one example at a time, position-summed
    # here vs per position there): 1e-5 of the largest score, ~100 float32 epsilons
    print(f"{name}: max |ours - TL| = {(ours - theirs).abs().max():.2e}, max |TL| = {scale:.3f}")
    assert (ours - theirs).abs().max() <= 1e-5 * scale
    # and the default (gradient on the clean run) is a different estimate
    clean = edge_scores(bridge, graph, data, "eap", batch_size=2)
    assert (clean - theirs).abs().max() > 1e-2 * scale


@pytest.mark.parametrize("method", ["eap", "gim"])
def test_corrupted_gradient_point_is_the_swapped_pair(bridges, method):
    """Gradient on the corrupted run = the default on the pair with clean and corrupted
    swapped and answer and foil swapped (the same sign: positive favours the answer)."""
    bridge = bridges["gpt2"]
    graph = Graph.from_bridge(bridge)
    data = _data(n=3)
    swapped = CounterfactualBatch(data.corrupt, data.clean, data.foil, data.answer, data.pos)
    a = edge_scores(bridge, graph, data, method, gradient_at="corrupted")
    b = edge_scores(bridge, graph, swapped, method)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="gradient_at"):
        edge_scores(bridge, graph, data, method, gradient_at="middle")
    with pytest.raises(ValueError, match="eap-ig"):
        edge_scores(bridge, graph, data, "eap-ig", gradient_at="corrupted")


def test_transformer_lens_refuses_gqa_edges(bridges):
    """TransformerLens 4.3 has no edge graph for grouped-query attention; ours does."""
    bridge = bridges["llama-gqa"]
    data = _data(n=1)
    with pytest.raises(ValueError, match="GQA/MQA"):
        tl_edge_scores(bridge, Graph.from_bridge(bridge), data)
    s = edge_scores(bridge, Graph.from_bridge(bridge), data, "eap", gradient_at="corrupted")
    assert torch.isfinite(s).all()
