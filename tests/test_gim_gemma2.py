"""Gemma-2's post-attention / post-MLP norms in MIB's edge graph, on a tiny random Gemma-2.

MIB's convention (EAP-IG ``evaluate_graph``, the ``use_normalization_before_and_after``
case): a head node is its pre-norm output; a downstream input reads each parent layer's
attention output recomputed as ln1_post(sum of its heads, out-of-circuit ones corrupted);
MLP nodes are post-norm outputs and add. The references below are plain torch on a
separately loaded Hugging Face model (no bridge, no hook point).
"""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import load_bridge, save_model  # noqa: E402
from selfrepair.gim.attribute import edge_scores, exact_edge_patching, information_flow_routes  # noqa: E402
from selfrepair.gim.backward import GIMConfig, gim  # noqa: E402
from selfrepair.gim.evaluate import logit_diff, patched, run_circuit  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402
from selfrepair.gim.hooks import attn_post_norms, forward_activations, prepared  # noqa: E402
from selfrepair.gim.localization import check_supported  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402

VOCAB, D, H, DH = 50, 16, 2, 8


def _gemma(folder, n_kv_heads):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=H,
        num_key_value_heads=n_kv_heads,
        head_dim=DH,
        max_position_embeddings=64,
        initializer_range=0.3,  # larger than Gemma's 0.02, so that every edge matters
        query_pre_attn_scalar=1,  # q.k unscaled: sharp attention, q/k edges matter
    )
    model = Gemma2ForCausalLM(cfg)
    with torch.no_grad():  # Gemma's norms start at weight 0 (scale 1 + 0): make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)
    save_model(model, folder)
    save_word_tokenizer(folder, ["<pad>", "<bos>"] + [f"t{i}" for i in range(VOCAB - 2)])
    bridge = load_bridge(folder, "cpu")
    hf = Gemma2ForCausalLM.from_pretrained(str(folder)).eval()  # the independent reference
    for p in hf.parameters():
        p.requires_grad_(False)
    return bridge, hf


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return _gemma(tmp_path_factory.mktemp("gemma2") / "m", H)


@pytest.fixture(scope="module")
def gemma_gqa(tmp_path_factory):
    """One key/value head for the two query heads (Gemma-2-2B has 8 query, 4 kv heads)."""
    return _gemma(tmp_path_factory.mktemp("gemma2_gqa") / "m", 1)


def _data(n=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randint(2, VOCAB, s, generator=g)  # noqa: E731
    return CounterfactualBatch(r(n, T), r(n, T), r(n), r(n), torch.full((n,), T - 1))


# ---------------------------------------------------------------- plain HF reference
def hf_parts(hf, toks):
    """Per layer on the plain HF model: each head's output (o_proj of its slice of z, the
    pre-norm result), the MLP's post-norm output; and the embedding (the input node)."""
    layers = hf.model.layers
    z, mlp, emb = {}, {}, {}
    hs = [layers[0].input_layernorm.register_forward_pre_hook(lambda m, a: emb.__setitem__(0, a[0]))]
    for L, layer in enumerate(layers):
        hs.append(layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, L=L: z.__setitem__(L, a[0])))
        hs.append(layer.post_feedforward_layernorm.register_forward_hook(lambda m, a, o, L=L: mlp.__setitem__(L, o)))
    with torch.no_grad():
        hf(toks)
    for h in hs:
        h.remove()
    heads = {}
    for L, layer in enumerate(layers):
        W = layer.self_attn.o_proj.weight  # [D, H * DH]
        for h in range(H):
            heads[L, h] = z[L][..., h * DH : (h + 1) * DH] @ W[:, h * DH : (h + 1) * DH].T
    return emb[0], heads, mlp


def hf_logit_diff_with_shift(hf, data, target: str, shift: torch.Tensor) -> torch.Tensor:
    """Clean run of the plain HF model with only ``target``'s input moved by ``shift``:
    ``m{L}`` (the pre-feedforward norm's input, not the residual), ``logits`` (the final
    norm's input), ``a{L}.h{H}<q|k|v>`` (that head's slice of q/k/v_proj recomputed from
    input_layernorm(residual + shift))."""
    layers = hf.model.layers
    hs = []
    if target == "logits":
        hs.append(hf.model.norm.register_forward_pre_hook(lambda m, a: (a[0] + shift,)))
    elif target.startswith("m"):
        ln = layers[int(target[1:])].pre_feedforward_layernorm
        hs.append(ln.register_forward_pre_hook(lambda m, a: (a[0] + shift,)))
    else:
        L, rest = target[1:].split(".h")
        layer, head, kind = layers[int(L)], int(rest[0]), rest[2]
        resid = {}
        hs.append(layer.input_layernorm.register_forward_pre_hook(lambda m, a: resid.__setitem__("x", a[0])))
        proj = getattr(layer.self_attn, f"{kind}_proj")

        def swap(m, a, out):
            moved = torch.nn.functional.linear(layer.input_layernorm(resid["x"] + shift), m.weight, m.bias)
            out = out.clone()
            out[..., head * DH : (head + 1) * DH] = moved[..., head * DH : (head + 1) * DH]
            return out

        hs.append(proj.register_forward_hook(swap))
    try:
        with torch.no_grad():
            logits = hf(data.clean).logits
    finally:
        for h in hs:
            h.remove()
    return logit_diff(logits, data)


def hf_edge_shift(hf, data, parent: str) -> torch.Tensor:
    """How patching ``parent`` -> v alone moves v's input, by MIB's convention: an MLP or
    the input adds its corrupted - clean output; head h of layer L moves it by
    N_L(pre_L + r_h(corrupt) - r_h(clean)) - N_L(pre_L), N_L the post-attention norm and
    pre_L the clean sum of the layer's heads (the post-norm's scale recomputed)."""
    e_cl, heads_cl, mlp_cl = hf_parts(hf, data.clean)
    e_co, heads_co, mlp_co = hf_parts(hf, data.corrupt)
    if parent == "input":
        return e_co - e_cl
    if parent.startswith("m"):
        return mlp_co[int(parent[1:])] - mlp_cl[int(parent[1:])]
    L, h = (int(x) for x in parent[1:].split(".h"))
    norm = hf.model.layers[L].post_attention_layernorm
    pre = sum(heads_cl[L, k] for k in range(H))
    with torch.no_grad():
        return norm(pre + heads_co[L, h] - heads_cl[L, h]) - norm(pre)


# ---------------------------------------------------------------- tests -------------
def test_graph_and_hooks(gemma):
    bridge, _ = gemma
    graph = Graph.from_bridge(bridge)
    # by hand (2 layers, 2 heads): heads of layer 0: 3 inputs x 2 heads x 1 parent (input);
    # m0: input + 2 heads; heads of layer 1: 3 x 2 x (input, a0.h0, a0.h1, m0); m1: 4 + 2;
    # logits: input + 2 x (2 heads + MLP)
    assert graph.n_edges == 6 + 3 + 24 + 6 + 7 == 46
    check_supported(bridge)  # Gemma-2 is patched by MIB's convention, no longer refused
    norms = attn_post_norms(bridge)
    assert [type(n).__name__ for n in norms] == ["Gemma2RMSNorm"] * 2
    hd = bridge.hook_dict
    assert hd["blocks.1.hook_mlp_out"] is hd["blocks.1.ln2_post.hook_out"]  # MLP node: post-norm
    assert hd["blocks.1.hook_attn_out"] is hd["blocks.1.ln1_post.hook_out"]
    # a head node is its pre-norm output: the heads sum to the post-norm's input
    data = _data()
    with prepared(bridge), torch.no_grad():
        _, cache = bridge.run_with_cache(data.clean)
    for L in range(2):
        assert torch.allclose(cache[f"blocks.{L}.attn.hook_result"].sum(2), cache[f"blocks.{L}.ln1_post.hook_in"])


@pytest.mark.parametrize(
    "alias, target, message",
    [  # hook_mlp_out the pre-norm MLP output: MLP edges would not add up
        ("blocks.1.hook_mlp_out", "blocks.1.ln2_post.hook_in", "post-MLP normalization in layer 1"),
        # hook_attn_out the pre-norm attention output: the convention's norm is elsewhere
        ("blocks.0.hook_attn_out", "blocks.0.ln1_post.hook_in", "post-attention normalization in layer 0"),
    ],
)
def test_refuses_post_norms_out_of_place(gemma, alias, target, message):
    bridge, _ = gemma

    class Fake:
        cfg = bridge.cfg
        blocks = bridge.blocks
        hook_dict = {**bridge.hook_dict, alias: bridge.hook_dict[target]}

    with pytest.raises(NotImplementedError, match=message):
        check_supported(Fake())


def test_empty_and_full_circuit_are_the_corrupted_and_clean_runs(gemma):
    bridge, hf = gemma
    graph = Graph.from_bridge(bridge)
    data = _data()
    with torch.no_grad():
        clean, corr = hf(data.clean).logits, hf(data.corrupt).logits
    _, a_corr = forward_activations(bridge, graph, data.corrupt)
    with torch.no_grad():
        with patched(bridge, graph, torch.zeros_like(graph.valid), a_corr):
            assert torch.allclose(bridge(data.clean), corr, atol=1e-5)
        with patched(bridge, graph, graph.valid.clone(), a_corr):
            assert torch.allclose(bridge(data.clean), clean, atol=1e-5)
    empty = run_circuit(bridge, graph, data, torch.zeros_like(graph.valid))
    assert torch.allclose(empty, logit_diff(corr, data), atol=1e-5)


EDGES = ["a0.h1->m0", "a0.h0->a1.h0<q>", "a0.h1->a1.h1<k>", "a0.h0->a1.h0<v>", "a1.h1->logits", "m0->logits"]


def test_one_edge_patch_is_the_hand_computed_forward(gemma):
    """Exact: patching u->v alone == the HF model's clean run with only v's input moved by
    u's shift (``hf_edge_shift``), for head, MLP and logit targets; EActP agrees."""
    bridge, hf = gemma
    graph = Graph.from_bridge(bridge)
    data = _data()
    index = graph.edge_index()
    base = logit_diff(hf(data.clean).logits, data)
    eactp = exact_edge_patching(bridge, graph, data)
    for edge in EDGES:
        parent, target = edge.split("->")
        want = hf_logit_diff_with_shift(hf, data, target, hf_edge_shift(hf, data, parent))
        mask = graph.valid.clone()
        mask[index[edge]] = False
        got = run_circuit(bridge, graph, data, mask)
        assert torch.allclose(got, want, atol=1e-5), edge
        assert (want - base).abs().max() > 1e-4, edge  # the edge matters: the check can fail
        assert eactp[index[edge]].item() == pytest.approx((base - want).mean().item(), abs=1e-5), edge


def test_heads_of_one_layer_meet_in_the_norm(gemma):
    """Two heads of layer 0 cut from m0: m0 reads ln1_post of the corrupted heads' sum (the
    corrupted attention output), not the sum of the two single-edge shifts."""
    bridge, hf = gemma
    graph = Graph.from_bridge(bridge)
    data = _data()
    index = graph.edge_index()
    mask = graph.valid.clone()
    mask[index["a0.h0->m0"]] = mask[index["a0.h1->m0"]] = False
    _, heads_cl, _ = hf_parts(hf, data.clean)
    _, heads_co, _ = hf_parts(hf, data.corrupt)
    norm = hf.model.layers[0].post_attention_layernorm
    with torch.no_grad():
        shift = norm(heads_co[0, 0] + heads_co[0, 1]) - norm(heads_cl[0, 0] + heads_cl[0, 1])
    want = hf_logit_diff_with_shift(hf, data, "m0", shift)
    assert torch.allclose(run_circuit(bridge, graph, data, mask), want, atol=1e-5)
    additive = hf_edge_shift(hf, data, "a0.h0") + hf_edge_shift(hf, data, "a0.h1")
    assert (hf_logit_diff_with_shift(hf, data, "m0", additive) - want).abs().max() > 1e-4


@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_random_circuits_match_a_fixed_point_of_whole_forwards(gemma, gemma_gqa, kind):
    """Every downstream input set to sum of its parents' chosen parts, the heads of a layer
    through its post-norm: N_L(sum_h (kept ? r_h : r_h(corrupt))), iterated to a fixed
    point of whole bridge forwards (``patched``'s incremental form is not used). Under
    grouped-query attention a group's k/v input keeps u if any head of the group does."""
    bridge, _ = gemma if kind == "mha" else gemma_gqa
    graph = Graph.from_bridge(bridge)
    rep = graph.n_heads // graph.n_kv_heads
    assert rep == (1 if kind == "mha" else 2)
    data = _data(seed=1)
    norms = attn_post_norms(bridge)
    slots = graph.backward_slots()
    head_of = {1 + L * (H + 1) + h: L for L in range(2) for h in range(H)}
    torch.manual_seed(4)
    with prepared(bridge):
        _, a_corr = forward_activations(bridge, graph, data.corrupt)
        for density in (0.3, 0.6):
            keep = (torch.rand(graph.valid.shape) < density) & graph.valid
            acts = a_corr.clone()
            for _ in range(2 * graph.n_layers + 3):
                hooks = []
                for name, cols in slots.items():

                    def setter(x, hook, name=name, cols=cols):
                        y = x.clone()
                        for j, s in cols:
                            parents = graph.valid[:, j].nonzero().flatten().tolist()
                            group = [jj for jj, ss in cols if ss == s]
                            kept = keep[:, group].any(1) if name.endswith(("k_input", "v_input")) else keep[:, j]
                            pick = {i: acts[:, :, i] if kept[i] else a_corr[:, :, i] for i in parents}
                            total = sum(v for i, v in pick.items() if i not in head_of)
                            for L in sorted({head_of[i] for i in parents if i in head_of}):
                                total = total + norms[L](sum(v for i, v in pick.items() if head_of.get(i) == L))
                            if s is None:
                                y = total
                            else:
                                y[:, :, s] = total
                        return y

                    hooks.append((name, setter))
                slow, acts = forward_activations(bridge, graph, data.clean, hooks=hooks)
            with torch.no_grad(), patched(bridge, graph, keep, a_corr):
                fast = bridge(data.clean)
            assert torch.allclose(fast, slow, atol=1e-4), density


def test_eap_scores_are_mibs_jacobian_free_estimate(gemma):
    """MIB's (and our) EAP score of a head edge: (r_h(corrupt) - r_h(clean)) . dL/dx_v with
    x_v v's input, the gradient taken on the plain HF model; the post-norm's Jacobian in
    between is left out, so it differs from the first-order estimate of the edge's
    patching effect, dL/dx_v . (N(pre + delta) - N(pre)) to first order."""
    bridge, hf = gemma
    graph = Graph.from_bridge(bridge)
    data = _data()
    for method in ("eap", "eap-ig", "gim"):
        s = edge_scores(bridge, graph, data, method)
        assert s.shape == graph.valid.shape and torch.isfinite(s).all(), method
        assert (s[~graph.valid] == 0).all() and s[graph.valid].abs().max() > 0, method
    ifr = information_flow_routes(bridge, graph, data)
    assert ifr.shape == graph.valid.shape and torch.isfinite(ifr).all()
    eap = edge_scores(bridge, graph, data, "eap")
    # gradient of L = -logit_diff at the MLP 0 input alone (not the residual), plain HF
    leaf = {}

    def make_leaf(m, a):
        leaf["x"] = a[0].detach().clone().requires_grad_(True)
        return (leaf["x"],)

    h = hf.model.layers[0].pre_feedforward_layernorm.register_forward_pre_hook(make_leaf)
    try:
        (-logit_diff(hf(data.clean).logits, data).sum()).backward()
    finally:
        h.remove()
    g = leaf["x"].grad
    _, heads_cl, _ = hf_parts(hf, data.clean)
    _, heads_co, _ = hf_parts(hf, data.corrupt)
    delta = heads_co[0, 1] - heads_cl[0, 1]
    want = (delta * g).sum() / len(data)
    i, j = graph.edge_index()["a0.h1->m0"]
    assert eap[i, j].item() == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
    norm = hf.model.layers[0].post_attention_layernorm
    pre = heads_cl[0, 0] + heads_cl[0, 1]
    _, jvp = torch.func.jvp(norm, (pre,), (delta,))  # the norm's Jacobian applied to delta
    first_order = (jvp * g).sum() / len(data)
    assert abs(first_order.item() - want.item()) > 0.05 * abs(want.item())


def test_gim_freeze_norm_of_gemma_per_head_ln1(gemma):
    """With split q/k/v inputs the bridge re-applies Gemma's ln1 per head (weight 1 + w)
    outside hook_scale; under freeze_norm that norm is frozen too, so split and unsplit
    gradients agree, and freezing changes them."""
    bridge, _ = gemma
    toks = _data().clean[:1]

    def grad(cfg):
        leaf = {}

        def make_leaf(x, hook):
            leaf["x"] = x.detach().clone().requires_grad_(True)
            return leaf["x"]

        with gim(bridge, cfg):
            logits = bridge.run_with_hooks(toks, fwd_hooks=[("hook_embed", make_leaf)])
            logits[0, -1, 3].backward()
        return leaf["x"].grad

    frozen, plain = GIMConfig(tsg=False, normalize=False), GIMConfig.none()
    with prepared(bridge):
        split, split_plain = grad(frozen), grad(plain)
        bridge.set_use_split_qkv_input(False)
        try:
            unsplit = grad(frozen)
        finally:
            bridge.set_use_split_qkv_input(True)
    assert torch.allclose(split, unsplit, atol=1e-6)
    assert not torch.allclose(split, split_plain, atol=1e-5)
