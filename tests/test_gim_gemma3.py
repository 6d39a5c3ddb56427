"""GIM's backward and MIB's edge graph on Gemma-3, on a tiny random Gemma-3
(``tiny_models.tiny_gemma3``: layer 0 local, a sliding window of 3 keys, shorter than the
6-token prompts; layer 1 global).

What Gemma-3 adds to Gemma-2 (tests/test_gim_gemma2.py): ``Gemma3RMSNorm`` (Gemma-2's
formula: float32, weight stored as an offset from 1), query-key norms (that RMSNorm over
each head's q and k after the projection, before RoPE: GIM freezes them, as every norm)
and local layers whose keys lie in a window. Every expected value is worked out here: by
hand on a two-number norm, from a window mask built here, or by GIM's backward written
here on the plain eager Hugging Face model (no bridge, no hook point, nothing of
``selfrepair.gim.backward``).
"""

import warnings
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")

from selfrepair.core.models import load_bridge, save_model  # noqa: E402
from selfrepair.gim.attribute import edge_scores, exact_edge_patching  # noqa: E402
from selfrepair.gim.backward import GIMConfig, _FrozenScaleNorm, gim, with_hooks  # noqa: E402
from selfrepair.gim.evaluate import logit_diff, read_logit_diff, read_logits, run_circuit  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402
from selfrepair.gim.hooks import attn_post_norms, prepared  # noqa: E402
from selfrepair.gim.localization import check_supported  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402
from test_gim_gemma2 import DH, VOCAB, H, hf_edge_shift, hf_logit_diff_with_shift, hf_parts  # noqa: E402
from tiny_models import tiny_gemma3  # noqa: E402

WINDOW, T = 3, 6


def _gemma3(folder, n_kv_heads):
    from transformers import Gemma3ForCausalLM

    save_model(tiny_gemma3(VOCAB, n_kv_heads, WINDOW), folder)
    save_word_tokenizer(folder, ["<pad>", "<bos>"] + [f"t{i}" for i in range(VOCAB - 2)])
    bridge = load_bridge(folder, "cpu")
    # the independent reference: eager attention, whose softmax the reference GIM replaces
    hf = Gemma3ForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    return bridge, hf


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _gemma3(tmp_path_factory.mktemp("gemma3") / "m", H)


@pytest.fixture(scope="module")
def gemma3_gqa(tmp_path_factory):
    """One key/value head for the two query heads (Gemma-3-270M: 4 query heads, 1 kv head)."""
    return _gemma3(tmp_path_factory.mktemp("gemma3_gqa") / "m", 1)


def _data(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randint(2, VOCAB, s, generator=g)  # noqa: E731
    return CounterfactualBatch(r(n, T), r(n, T), r(n), r(n), torch.full((n,), T - 1))


# ---------------------------------------------------------------- GIM written out on plain HF
class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


class _SoftmaxT2(torch.autograd.Function):
    """softmax forward; backward s * (g - <g, s>) with s = softmax(x / 2), no 1/2."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.softmax(x / 2, -1)
        return s * (g - (g * s).sum(-1, keepdim=True))


def _frozen_rms(norm):
    def forward(x):
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps).detach()
        return (xf * inv * (1.0 + norm.weight.float())).type_as(x)

    return forward


@contextmanager
def hf_gim(hf, tsg=True, freeze=True, normalize=True):
    """GIM on the plain HF Gemma-3: every Gemma3RMSNorm (q_norm and k_norm included) with
    its rsqrt detached; the attention softmax (eager: the only softmax of the forward)
    with the T = 2 backward; q, k x0.25, v x0.5 at the projections' outputs, the MLP's
    gate and up x0.5."""
    norms = [m for m in hf.modules() if type(m).__name__ == "Gemma3RMSNorm"] if freeze else []
    assert not freeze or len(norms) == 1 + len(hf.model.layers) * 6  # final; 4 per layer and q, k norms
    handles = []
    if normalize:
        for layer in hf.model.layers:
            a, m = layer.self_attn, layer.mlp
            for proj, s in ((a.q_proj, 0.25), (a.k_proj, 0.25), (a.v_proj, 0.5), (m.gate_proj, 0.5), (m.up_proj, 0.5)):
                handles.append(proj.register_forward_hook(lambda mod, args, out, s=s: _Scale.apply(out, s)))
    softmax = F.softmax

    def tsg_softmax(x, dim=None, _stacklevel=3, dtype=None):
        assert dim == -1
        return _SoftmaxT2.apply(x if dtype is None else x.to(dtype))

    try:
        for n in norms:
            n.forward = _frozen_rms(n)
        if tsg:
            torch.nn.functional.softmax = tsg_softmax
        yield
    finally:
        torch.nn.functional.softmax = softmax
        for n in norms:
            del n.forward
        for h in handles:
            h.remove()


def hf_input_grad(hf, data, target: str, **mods) -> torch.Tensor:
    """dL/d(input of ``target``), L = -sum of logit_diff, clean run of the plain HF model
    under :func:`hf_gim`: ``logits`` the final norm's input, ``m{L}`` the
    pre-feedforward norm's input, ``a{L}.h{j}<q|k|v>`` a copy of the residual feeding
    only query (or key/value) head j's slice of that projection, through input_layernorm."""
    layers, leaf, hs = hf.model.layers, {}, []

    def make_leaf(m, a):
        leaf["x"] = a[0].detach().clone().requires_grad_(True)
        return (leaf["x"],)

    if target == "logits":
        hs.append(hf.model.norm.register_forward_pre_hook(make_leaf))
    elif target.startswith("m"):
        hs.append(layers[int(target[1:])].pre_feedforward_layernorm.register_forward_pre_hook(make_leaf))
    else:
        L, j, kind = int(target[1]), int(target[4]), target[6]
        layer, resid = layers[L], {}

        def keep(m, a):  # the layer's residual, not swap's own call below
            if "x" not in resid:
                resid["x"] = a[0]

        hs.append(layer.input_layernorm.register_forward_pre_hook(keep))

        def swap(m, a, out):
            leaf["x"] = resid["x"].detach().clone().requires_grad_(True)
            moved = F.linear(layer.input_layernorm(leaf["x"]), m.weight, m.bias)
            out = out.clone()
            out[..., j * DH : (j + 1) * DH] = moved[..., j * DH : (j + 1) * DH]
            return out

        # registered before hf_gim's scaling hook on the same projection: scaled after the swap
        hs.append(getattr(layer.self_attn, f"{kind}_proj").register_forward_hook(swap))
    try:
        with hf_gim(hf, **mods):
            logits = hf(data.clean).logits
        (-logit_diff(logits, data).sum()).backward()
    finally:
        for h in hs:
            h.remove()
    return leaf["x"].grad


def hf_edge_score(hf, data, edge: str, n_kv_heads: int, **mods) -> float:
    """EAP under the GIM written above: (a_u(corrupt) - a_u(clean)) . dL/d(input of v),
    summed, over the examples; a head's a_u its pre-norm output (MIB's convention); a k/v
    edge shares its key/value head's input gradient among the group's query heads."""
    parent, target = edge.split("->")
    e_cl, heads_cl, mlp_cl = hf_parts(hf, data.clean)
    e_co, heads_co, mlp_co = hf_parts(hf, data.corrupt)
    if parent == "input":
        delta = e_co - e_cl
    elif parent.startswith("m"):
        delta = mlp_co[int(parent[1:])] - mlp_cl[int(parent[1:])]
    else:
        key = (int(parent[1]), int(parent[4]))
        delta = heads_co[key] - heads_cl[key]
    share = 1
    if target.endswith(("<k>", "<v>")):
        share = H // n_kv_heads
        target = f"{target[:4]}{int(target[4]) // share}{target[5:]}"  # its key/value head
    grad = hf_input_grad(hf, data, target, **mods)
    return ((delta * grad).sum() / len(data) / share).item()


# ---------------------------------------------------------------- the norm, by hand
def test_frozen_gemma3_rms_norm_by_hand():
    """x = (3, 4), weight (0.5, -0.25) (scale 1 + w = 1.5, 0.75): rms = sqrt(12.5), so
    1 / rms = 0.2 sqrt 2. Forward: the module's own bits. Backward of g = (1, 1) with the
    scale frozen: g (1 + w) / rms = (0.3 sqrt 2, 0.15 sqrt 2); exact backward subtracts
    x_i sum_j g_j (1 + w_j) x_j / (d rms^3) = x_i 7.5 / (25 sqrt 12.5)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(2, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, -0.25]))
    norm.weight.requires_grad_(False)
    x = torch.tensor([[3.0, 4.0]], requires_grad=True)
    y = _FrozenScaleNorm(norm).forward(x)
    assert torch.equal(y, norm(x.detach()))
    y.backward(torch.ones_like(y))
    r2 = 2**0.5
    assert x.grad.tolist()[0] == pytest.approx([0.3 * r2, 0.15 * r2], rel=1e-5)
    xe = x.detach().clone().requires_grad_(True)
    norm(xe).backward(torch.ones(1, 2))
    sub = 7.5 / (25 * 12.5**0.5)
    assert xe.grad.tolist()[0] == pytest.approx([0.3 * r2 - 3 * sub, 0.15 * r2 - 4 * sub], rel=1e-5)
    # bfloat16 input: computed in float32, cast back, as the module does
    xb = torch.tensor([[3.0, 4.0], [-1.0, 0.5]], dtype=torch.bfloat16)
    assert torch.equal(_FrozenScaleNorm(norm).forward(xb), norm(xb))


# ---------------------------------------------------------------- the bridge and the window
def test_bridge_is_the_model_and_the_window_matters(gemma3):
    bridge, hf = gemma3
    data = _data()
    with torch.no_grad():
        ref = hf(data.clean).logits
        assert torch.allclose(bridge(data.clean), ref, atol=1e-5)
        hf.config.sliding_window = 64  # every layer global: other logits, so the window is in play
        try:
            assert (hf(data.clean).logits - ref).abs().max() > 1e-3
        finally:
            hf.config.sliding_window = WINDOW


def test_graph_post_norms_and_qk_norm_hooks(gemma3):
    bridge, _ = gemma3
    graph = Graph.from_bridge(bridge)
    # by hand (2 layers, 2 heads), as Gemma-2's: 6 + 3 + 24 + 6 + 7; the window adds no node
    assert graph.n_edges == 46
    check_supported(bridge)
    assert [type(n).__name__ for n in attn_post_norms(bridge)] == ["Gemma3RMSNorm"] * 2
    hd = bridge.hook_dict
    assert hd["blocks.1.hook_mlp_out"] is hd["blocks.1.ln2_post.hook_out"]
    assert hd["blocks.1.hook_attn_out"] is hd["blocks.1.ln1_post.hook_out"]
    # the q/k norms are bridged norms with a hook_scale each: freeze_norm finds them
    for L in range(2):
        for qk in "qk":
            assert f"blocks.{L}.attn.{qk}_norm.hook_scale" in hd
            assert (
                type(bridge.get_submodule(f"blocks.{L}.attn.{qk}_norm").original_component).__name__ == "Gemma3RMSNorm"
            )


def _capture(store, name):
    def fn(x, hook):
        x = x if x.requires_grad else x.detach().requires_grad_(True)
        store[name] = x
        x.register_hook(lambda g: store.__setitem__(name + ".grad", g))
        return x

    return fn


@pytest.mark.parametrize("layer, window", [(0, WINDOW), (1, T)])
def test_tsg_respects_the_sliding_window(gemma3, layer, window):
    """Layer 0 (local): query i sees keys i-2..i; layer 1 (global): every earlier key.
    The pattern is zero outside the window built here, and the gradient at the scores
    is s_T (g - <g, s_T>), s_T = softmax(scores / 2) over the window's keys only, zero
    outside it."""
    bridge, _ = gemma3
    toks = _data().clean
    store = {}
    hooks = [(f"blocks.{layer}.attn.hook_{n}", _capture(store, n)) for n in ("attn_scores", "pattern")]
    emb = bridge.embed(toks).detach().requires_grad_(True)
    with gim(bridge, GIMConfig(freeze_norm=False, normalize=False)):
        logits = bridge.run_with_hooks(toks, fwd_hooks=[("hook_embed", lambda x, hook: emb)] + hooks)
        logits[:, -1, 3].sum().backward()
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (i - j >= 0) & (i - j < window)
    pattern = store["pattern"].detach()
    assert (pattern[..., ~seen] == 0).all()
    assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-6)
    scores, g = store["attn_scores"].detach(), store["pattern.grad"]
    s_t = torch.softmax(scores.masked_fill(~seen, float("-inf")) / 2, dim=-1)
    want = s_t * (g - (g * s_t).sum(-1, keepdim=True))
    got = store["attn_scores.grad"]
    assert torch.allclose(got[..., seen], want[..., seen], atol=1e-6)
    assert (got[..., ~seen] == 0).all()
    assert want[..., seen].abs().max() > 1e-3


# ---------------------------------------------------------------- the query-key norms
def test_freeze_norm_freezes_the_qk_norms(gemma3):
    """Under freeze_norm alone the gradient at q (k) before its norm is the gradient after
    it times (1 + w) / rms(q) per head and position, the rms a constant; the exact
    backward differs."""
    bridge, _ = gemma3
    toks = _data().clean
    names = ("q", "q_normed", "k", "k_normed")

    def run(cfg):
        store = {}
        with gim(bridge, cfg):
            logits = bridge.run_with_hooks(
                toks, fwd_hooks=[(f"blocks.0.attn.hook_{n}", _capture(store, n)) for n in names]
            )
            logits[:, -1, 3].sum().backward()
        return store

    frozen, exact = run(GIMConfig(tsg=False, normalize=False)), run(GIMConfig.none())
    for qk in "qk":
        w = bridge.get_submodule(f"blocks.0.attn.{qk}_norm").original_component.weight
        x = frozen[qk].detach()  # [B, T, heads, d_head]
        inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        after = frozen[f"{qk}_normed.grad"].transpose(1, 2)  # [B, heads, T, d] -> [B, T, heads, d]
        assert torch.allclose(frozen[f"{qk}.grad"], after * (1 + w) * inv, atol=1e-6), qk
        assert not torch.allclose(
            exact[f"{qk}.grad"], exact[f"{qk}_normed.grad"].transpose(1, 2) * (1 + w) * inv, atol=1e-4
        )


def test_qk_scaling_before_the_qk_norm_is_scaling_after_it(gemma3):
    """GIM scales q, k at the projections' outputs (hook_q, hook_k), before the q/k norms
    and RoPE; gim-explain's HF path scales what enters attention (after both). Backward
    is linear in the incoming gradient and the frozen norm's Jacobian is a constant, so
    both give the same gradients: here x0.25 written at hook_rot_q / hook_rot_k."""
    bridge, _ = gemma3
    toks = _data().clean

    def grad(cfg, hooks=()):
        emb = bridge.embed(toks).detach().requires_grad_(True)
        with gim(bridge, cfg):
            bridge.run_with_hooks(toks, fwd_hooks=[("hook_embed", lambda x, hook: emb), *hooks])[
                :, -1, 3
            ].sum().backward()
        return emb.grad

    after = [(f"blocks.{L}.attn.hook_rot_{qk}", lambda x, hook: _Scale.apply(x, 0.25)) for L in range(2) for qk in "qk"]
    ours = grad(GIMConfig(tsg=False))
    moved = grad(GIMConfig(tsg=False, q_scale=1.0, k_scale=1.0), after)
    unscaled = grad(GIMConfig(tsg=False, q_scale=1.0, k_scale=1.0))
    assert torch.allclose(ours, moved, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ours, unscaled, atol=1e-4)


# ---------------------------------------------------------------- edge scores against HF
EDGES = [
    "input->a0.h0<q>",
    "input->a0.h1<k>",
    "input->a0.h1<v>",
    "a0.h1->m0",
    "a0.h0->a1.h1<q>",
    "m0->a1.h0<k>",
    "a0.h1->a1.h1<v>",
    "a1.h0->logits",
    "m1->logits",
    "input->m1",
]
VARIANTS = {
    "gim": {},
    "gim-no-tsg": {"tsg": False},
    "gim-no-ln": {"freeze": False},
    "gim-no-norm": {"normalize": False},
    "eap": {"tsg": False, "freeze": False, "normalize": False},
}


@pytest.mark.parametrize("kind", ["mha", "gqa"])
@pytest.mark.parametrize("method", list(VARIANTS))
def test_edge_scores_are_the_hand_written_gim_on_hf(gemma3, gemma3_gqa, kind, method):
    """Each variant's edge scores on the bridge == EAP under GIM's backward written above
    on the plain HF model (every norm frozen, q/k norms included; TSG over the sliding
    window's mask; q, k, v, gate and up scaled), for q/k/v inputs of the local and the
    global layer, MLPs and logits."""
    bridge, hf = gemma3 if kind == "mha" else gemma3_gqa
    n_kv = H if kind == "mha" else 1
    graph = Graph.from_bridge(bridge)
    data = _data()
    scores = edge_scores(bridge, graph, data, method)
    index = graph.edge_index()
    for edge in EDGES:
        want = hf_edge_score(hf, data, edge, n_kv, **VARIANTS[method])
        assert scores[index[edge]].item() == pytest.approx(want, rel=1e-4, abs=1e-6), edge
        if method == "gim":  # the check can fail: GIM moves every one of these scores
            plain = hf_edge_score(hf, data, edge, n_kv, **VARIANTS["eap"])
            assert abs(want - plain) > 0.01 * abs(plain), edge


# ---------------------------------------------------------------- MIB's convention
def test_one_edge_patch_through_the_post_norms(gemma3):
    """Patching u->v alone == the HF clean run with v's input moved by u's shift, a head's
    through its layer's post-attention norm (test_gim_gemma2's convention); EActP agrees."""
    bridge, hf = gemma3
    graph = Graph.from_bridge(bridge)
    data = _data()
    index = graph.edge_index()
    base = logit_diff(hf(data.clean).logits, data)
    eactp = exact_edge_patching(bridge, graph, data)
    with prepared(bridge):
        for edge in ("a0.h1->m0", "a0.h0->a1.h0<q>", "a0.h1->a1.h1<k>", "a0.h0->a1.h0<v>", "a1.h1->logits"):
            parent, target = edge.split("->")
            want = hf_logit_diff_with_shift(hf, data, target, hf_edge_shift(hf, data, parent))
            mask = graph.valid.clone()
            mask[index[edge]] = False
            assert torch.allclose(run_circuit(bridge, graph, data, mask), want, atol=1e-5), edge
            assert (want - base).abs().max() > 1e-4, edge
            assert eactp[index[edge]].item() == pytest.approx((base - want).mean().item(), abs=1e-5), edge


def test_empty_and_full_circuit_are_the_corrupted_and_clean_runs(gemma3_gqa):
    bridge, hf = gemma3_gqa
    graph = Graph.from_bridge(bridge)
    data = _data()
    with torch.no_grad():
        clean, corr = logit_diff(hf(data.clean).logits, data), logit_diff(hf(data.corrupt).logits, data)
    assert torch.allclose(run_circuit(bridge, graph, data, torch.zeros_like(graph.valid)), corr, atol=1e-5)
    assert torch.allclose(run_circuit(bridge, graph, data, graph.valid.clone()), clean, atol=1e-5)
    assert (clean - corr).abs().max() > 1e-3


def test_gim_forward_is_the_models_own_bit_for_bit(gemma3_gqa):
    """edge_scores records the node activations in the gradient's forward: under GIM the
    logits of a Gemma-3 (its q/k norms and post-norms swapped for frozen-scale copies,
    split q/k/v inputs on) must be the plain forward's bits."""
    bridge, _ = gemma3_gqa
    toks = _data().clean
    with prepared(bridge):
        with torch.no_grad():
            plain = bridge(toks)
        with gim(bridge, GIMConfig()):
            assert torch.equal(bridge(toks), plain)


def test_read_logits_unembeds_only_the_read_positions(gemma3_gqa):
    """read_logits: the plain HF model's logits at each row's own position (the positions
    differ per row), with the unembedding given one position per row (its output seen at
    ``unembed.hook_out``), and the gradient of a logit difference read that way equal to
    HF's through the whole logits."""
    bridge, hf = gemma3_gqa
    data = _data()
    data = CounterfactualBatch(data.clean, data.corrupt, data.answer, data.foil, torch.tensor([5, 2, 4, 0]))
    rows = torch.arange(4)
    seen = []
    with torch.no_grad():
        want = hf(data.clean).logits[rows, data.pos]
        with with_hooks(bridge, [("unembed.hook_out", lambda x, hook: seen.append(tuple(x.shape)))]):
            got = read_logits(bridge, data.clean, data.pos)
    assert seen == [(4, 1, VOCAB)]
    assert torch.allclose(got, want, atol=1e-5) and got.shape == (4, VOCAB)
    assert torch.allclose(read_logit_diff(bridge, data), logit_diff(hf(data.clean).logits, data), atol=1e-5)

    def input_grad(run):
        leaf = {}

        def grab(x, hook):
            leaf["x"] = x.detach().requires_grad_(True)
            return leaf["x"]

        with with_hooks(bridge, [("blocks.0.hook_resid_pre", grab)]):
            run().sum().backward()
        return leaf["x"].grad

    whole = input_grad(lambda: logit_diff(bridge(data.clean), data))
    read = input_grad(lambda: read_logit_diff(bridge, data))
    assert whole.abs().max() > 0 and torch.allclose(read, whole, atol=1e-6)
