"""GIM's backward modifications: hand-worked formulas and parity with gim-explain 0.1.4."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

gim_ref = pytest.importorskip("gim")  # the reference package, pinned in requirements.lock

from selfrepair.core.models import load_bridge, save_model  # noqa: E402
from selfrepair.gim.backward import GIMConfig, gim, temperature_softmax, tsg_softmax  # noqa: E402
from selfrepair.tasks.counterfactual import save_word_tokenizer  # noqa: E402
from tiny_models import save_toy_gpt2, tiny_llama  # noqa: E402

NONE = dict(freeze_norm=False, softmax_temperature=None, q_scale=None, k_scale=None, v_scale=None)


def _tiny_llama(folder):
    save_model(tiny_llama(seed=0), folder)
    save_word_tokenizer(folder, [f"t{i}" for i in range(20)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gim_models")
    save_toy_gpt2(root / "gpt2", seed=3)
    _tiny_llama(root / "llama")
    out = {}
    for name in ("gpt2", "llama"):
        b = load_bridge(root / name, "cpu")
        for p in b.parameters():
            p.requires_grad_(False)
        out[name] = (b, root / name)
    return out


def mine(bridge, toks, target, baseline, cfg):
    """Gradient x (input - baseline) under our GIM, computed like gim.explain does."""
    with torch.no_grad():
        base = bridge.embed(torch.full_like(toks, baseline))
    emb = bridge.embed(toks).detach().clone().requires_grad_(True)
    with gim(bridge, cfg):
        logits = bridge.run_with_hooks(toks, fwd_hooks=[("hook_embed", lambda x, hook: emb)])
        logits[0, -1, target].backward()
    return (emb.grad * (emb.detach() - base)).sum(-1)[0]


def test_tsg_softmax_matches_hand_formula():
    torch.manual_seed(0)
    x = torch.randn(3, 5, requires_grad=True)
    g = torch.randn(3, 5)
    y = tsg_softmax(x, -1, 2.0)
    assert torch.allclose(y, torch.softmax(x, -1))  # forward unchanged
    y.backward(g)
    s = torch.exp(x.detach() / 2) / torch.exp(x.detach() / 2).sum(-1, keepdim=True)
    expected = s * (g - (g * s).sum(-1, keepdim=True))  # no 1/T factor
    assert torch.allclose(x.grad, expected, atol=1e-6)


def test_forward_unchanged_and_each_switch_changes_gradient(models):
    bridge, _ = models["gpt2"]
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8]])
    with torch.no_grad():
        plain = bridge(toks)
        with gim(bridge, GIMConfig()):
            modified = bridge(toks)
    assert torch.equal(plain, modified)
    g0 = mine(bridge, toks, 3, 0, GIMConfig.none())
    for variant in ("gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm"):
        g = mine(bridge, toks, 3, 0, GIMConfig.variant(variant))
        assert not torch.allclose(g, g0, atol=1e-7), variant
    # hooks are removed on exit: plain gradients again
    assert torch.allclose(mine(bridge, toks, 3, 0, GIMConfig.none()), g0)


def test_tsg_in_attention_is_the_temperature_formula(models):
    """Gradient at hook_attn_scores == s_T * (g_pattern - <g_pattern, s_T>), s_T = softmax(scores/2)."""
    bridge, _ = models["gpt2"]
    toks = torch.tensor([[1, 5, 7, 9, 4]])
    store = {}

    def keep(name):
        def fn(x, hook):
            x = x if x.requires_grad else x.detach().requires_grad_(True)
            store[name] = x
            x.register_hook(lambda g: store.__setitem__(name + ".grad", g))
            return x

        return fn

    emb = bridge.embed(toks).detach().requires_grad_(True)
    hooks = [
        ("hook_embed", lambda x, hook: emb),
        ("blocks.1.attn.hook_attn_scores", keep("s")),
        ("blocks.1.attn.hook_pattern", keep("p")),
    ]
    with gim(bridge, GIMConfig(freeze_norm=False, normalize=False)):
        bridge.run_with_hooks(toks, fwd_hooks=hooks)[0, -1, 3].backward()
    scores, g_out = store["s"].detach(), store["p.grad"]
    s_t = torch.softmax(scores / 2.0, dim=-1)
    expected = s_t * (g_out - (g_out * s_t).sum(-1, keepdim=True))
    got = store["s.grad"]
    finite = torch.isfinite(scores)
    assert torch.allclose(got[finite], expected[finite], atol=1e-6)


@pytest.mark.parametrize("kind", ["ln", "qkv", "none"])
def test_parity_with_gim_explain_on_bridge(models, kind):
    """Same model (bridged GPT-2), same input: gim.explain == ours, per modification."""
    bridge, _ = models["gpt2"]
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8]])
    kw, cfg = {
        "ln": ({**NONE, "freeze_norm": True}, GIMConfig(tsg=False, normalize=False)),
        "qkv": ({**NONE, "q_scale": 0.25, "k_scale": 0.25, "v_scale": 0.5}, GIMConfig(tsg=False, freeze_norm=False)),
        "none": (NONE, GIMConfig.none()),
    }[kind]
    ref = gim_ref.explain(bridge, toks, target_token_id=3, baseline_token_id=0, **kw)
    ours = mine(bridge, toks, 3, 0, cfg)
    assert torch.allclose(ref, ours, atol=1e-6)


@pytest.mark.parametrize("kind", ["tsg", "ln+tsg"])
def test_parity_with_gim_explain_tsg_on_hf_model(models, kind):
    """gim-explain's softmax patch cannot run on the bridge (see below); on the same
    weights as a plain eager Hugging Face GPT-2 it agrees with ours on the bridge."""
    from transformers import AutoModelForCausalLM

    bridge, folder = models["gpt2"]
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8]])
    kw = {**NONE, "softmax_temperature": 2.0, "freeze_norm": kind == "ln+tsg"}
    cfg = GIMConfig(freeze_norm=kind == "ln+tsg", normalize=False)
    ref = gim_ref.explain(hf, toks, target_token_id=3, baseline_token_id=0, **kw)
    assert torch.allclose(ref, mine(bridge, toks, 3, 0, cfg), atol=1e-6)


def test_gated_mlp_parity_and_reference_deviation(models):
    """Llama (gated MLP, GQA): with gated-MLP scaling off ours equals gim-explain's
    q/k/v scaling; the paper's method (gate and up x0.5) differs from the reference."""
    bridge, _ = models["llama"]
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8]])
    kw = {**NONE, "q_scale": 0.25, "k_scale": 0.25, "v_scale": 0.5}
    ref = gim_ref.explain(bridge, toks, target_token_id=3, baseline_token_id=0, **kw)
    as_ref = mine(bridge, toks, 3, 0, GIMConfig(tsg=False, freeze_norm=False, gated_mlp=False))
    paper = mine(bridge, toks, 3, 0, GIMConfig(tsg=False, freeze_norm=False))
    assert torch.allclose(ref, as_ref, atol=1e-6)
    assert not torch.allclose(ref, paper, atol=1e-5)
    # RMSNorm freeze through hook_scale: the reference agrees on the bridge
    ref_ln = gim_ref.explain(bridge, toks, target_token_id=3, baseline_token_id=0, **{**NONE, "freeze_norm": True})
    assert torch.allclose(ref_ln, mine(bridge, toks, 3, 0, GIMConfig(tsg=False, normalize=False)), atol=1e-6)


def test_reference_deviation_softmax_patch(models):
    """Deviations of gim-explain 0.1.4 from the paper, kept visible:
    (a) its temperature patch replaces every softmax, so a softmax in the metric gets
        the temperature backward too (ours: only attention softmaxes);
    (b) its patched F.softmax lacks the ``dtype`` argument, so it fails on TL4 bridges;
    (c) on a plain HF Llama it does not freeze LlamaRMSNorm (not an nn.RMSNorm)."""
    from gim.context.softmax import _patch_softmax_backward_T_only
    from transformers import AutoModelForCausalLM

    bridge, folder = models["gpt2"]
    x = torch.tensor([0.3, -1.0, 2.0, 0.5], requires_grad=True)
    exact = torch.autograd.grad(torch.softmax(x, -1)[2], x)[0]
    with _patch_softmax_backward_T_only(2.0):
        ref_metric = torch.autograd.grad(torch.softmax(x, -1)[2], x)[0]
    with temperature_softmax(bridge, 2.0):
        ours_metric = torch.autograd.grad(torch.softmax(x, -1)[2], x)[0]
    assert torch.allclose(ours_metric, exact)
    assert not torch.allclose(ref_metric, exact, atol=1e-4)
    toks = torch.tensor([[1, 5, 7, 9]])
    with pytest.raises(TypeError, match="dtype"):
        gim_ref.explain(bridge, toks, target_token_id=3, baseline_token_id=0, **{**NONE, "softmax_temperature": 2.0})
    _, lfolder = models["llama"]
    hf = AutoModelForCausalLM.from_pretrained(lfolder).eval()
    plain = gim_ref.explain(hf, toks, target_token_id=3, baseline_token_id=0, **NONE)
    frozen = gim_ref.explain(hf, toks, target_token_id=3, baseline_token_id=0, **{**NONE, "freeze_norm": True})
    assert torch.allclose(plain, frozen)  # the reference's freeze is a no-op here
    lbridge, _ = models["llama"]
    assert not torch.allclose(mine(lbridge, toks, 3, 0, GIMConfig(tsg=False, normalize=False)), plain, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_freeze_norm_also_freezes_per_head_ln1(models, arch):
    """With split q/k/v inputs (edge scoring) the bridge re-applies ln1 per head outside
    hook_scale; the frozen gradients must equal those of the unsplit forward."""
    bridge, _ = models[arch]
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8]])
    cfg = GIMConfig(tsg=False, normalize=False)
    plain_split = None
    try:
        unsplit = mine(bridge, toks, 3, 0, cfg)
        bridge.set_use_split_qkv_input(True)
        split = mine(bridge, toks, 3, 0, cfg)
        plain_split = mine(bridge, toks, 3, 0, GIMConfig.none())
        bridge.set_use_split_qkv_input(False)
        plain = mine(bridge, toks, 3, 0, GIMConfig.none())
    finally:
        bridge.set_use_split_qkv_input(False)
    assert torch.allclose(split, unsplit, atol=1e-6)
    assert torch.allclose(plain_split, plain, atol=1e-6)
    assert not torch.allclose(split, plain, atol=1e-6)


def test_frozen_scale_layer_norm_is_layer_norm_forward_and_detached_scale_backward():
    """freeze_norm's LayerNorm: F.layer_norm's bits forward; backward the autograd of
    (x - mean) / sqrt(var + eps).detach() * w + b, for x, w and b."""
    from selfrepair.gim.backward import _FrozenScaleLayerNorm

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8), torch.randn(8), torch.randn(8)
    g = torch.randn(2, 3, 8)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = _FrozenScaleLayerNorm.apply(xs, ws, bs, 1e-5)
    assert torch.equal(y, torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5))
    y.backward(g)
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    mean = xr.mean(-1, keepdim=True)
    scale = ((xr - mean).pow(2).mean(-1, keepdim=True) + 1e-5).sqrt().detach()
    ((xr - mean) / scale * wr + br).backward(g)
    for mine_, ref in ((xs, xr), (ws, wr), (bs, br)):
        torch.testing.assert_close(mine_.grad, ref.grad, rtol=1e-5, atol=1e-6)
    # the frozen gradient is not the plain one (the scale's own derivative is dropped)
    xp = x.clone().requires_grad_(True)
    torch.nn.functional.layer_norm(xp, (8,), w, b, 1e-5).backward(g)
    assert not torch.allclose(xp.grad, xs.grad, atol=1e-3)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gim_and_relp_forwards_are_the_models_own_bit_for_bit(models, arch):
    """edge_scores records the node activations in the gradient's forward under GIM and
    RelP: their logits must equal the plain forward's bits (split q/k/v inputs on)."""
    from selfrepair.gim.hooks import prepared
    from selfrepair.gim.relp import RelPConfig, relp

    bridge, _ = models[arch]
    toks = torch.tensor([[1, 5, 7, 9, 4, 3, 8], [2, 6, 6, 1, 9, 0, 4]])
    with prepared(bridge):
        with torch.no_grad():
            plain = bridge(toks)
        for ctx in (gim(bridge, GIMConfig()), relp(bridge, RelPConfig()), relp(bridge, RelPConfig(ah=True))):
            with ctx:
                assert torch.equal(bridge(toks), plain)
