"""RelP (LRP rules in the backward pass) and EAP-GP (GradPath), checked by hand: each rule's
local gradient against its formula on a tiny model, the conservation each rule claims,
RelP with every rule off against AtP / EAP, EAP-GP along the straight line against EAP-IG,
and GradPath on maps where its path is known in closed form."""

import warnings
from contextlib import ExitStack, nullcontext

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core import components as C  # noqa: E402
from selfrepair.core import interventions, models  # noqa: E402
from selfrepair.gim import attribute  # noqa: E402
from selfrepair.gim import relp as R  # noqa: E402
from selfrepair.gim.backward import frozen, with_hooks  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402
from selfrepair.gim.hooks import prepared  # noqa: E402
from selfrepair.groundtruth import methods  # noqa: E402
from selfrepair.heroes import scores as heroes  # noqa: E402
from selfrepair.tasks import sequences as S  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402
from tiny_models import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny paper-A GPT-2 (2 layers, 2 heads), a batch, its components and means."""
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=32)
    folder = tmp_path_factory.mktemp("relp") / "model"
    models.save_model(models.build_gpt2_toy(cfg, init="torch", seed=1), folder)
    bridge = models.load_bridge(folder)
    batch = S.eval_set("sort", 4, 12, seed=3)
    comps = C.all_components(2, 2)
    means = interventions.component_means(bridge, [batch.tokens], comps)
    return bridge, batch, comps, means


def _metric(batch):
    return lambda lg: -heroes.lm_loss(lg, batch)


def _grads(bridge, tokens, names, ctx):
    """{hook: (value, d metric / d value)} under ``ctx`` (a fixed metric of the logits)."""
    store = {}

    def keep(n):
        def fn(x, hook):
            x = x if x.requires_grad else x.detach().requires_grad_(True)
            x.retain_grad()
            store[n] = x
            return x

        return fn

    with frozen(bridge), torch.enable_grad(), ctx, with_hooks(bridge, [(n, keep(n)) for n in names]):
        logits = bridge(tokens)
        (logits[:, -1].log_softmax(-1)[:, 3].sum() + logits[:, 2].logsumexp(-1).sum()).backward()
    return logits.detach(), {n: (store[n].detach(), store[n].grad) for n in names}


# ---------------------------------------------------------------- rules, by hand -
def test_stabilize_and_half_by_hand():
    x = torch.tensor([0.0, 2.0, -3.0])
    assert R.stabilize(x).tolist() == pytest.approx([1e-6, 2 + 1e-6, -3 - 1e-6])
    a, b = torch.tensor(3.0, requires_grad=True), torch.tensor(-2.0, requires_grad=True)
    out = R.half(a * b)
    assert float(out.detach()) == -6.0
    out.backward()
    assert (float(a.grad), float(b.grad)) == (-1.0, 1.5)  # half of d(ab)/da = b, d(ab)/db = a
    # conservation of the half-rule: the branches' relevances sum to the product's
    assert float((a * a.grad + b * b.grad).detach()) == pytest.approx(-6.0)


def test_rules_keep_the_forward_and_relp_off_is_the_plain_gradient(tiny):
    bridge, batch, _, _ = tiny
    names = ["blocks.0.hook_resid_pre", "blocks.1.mlp.hook_pre", "blocks.1.attn.hook_q"]
    lg0, g0 = _grads(bridge, batch.tokens, names, nullcontext())
    lg1, g1 = _grads(bridge, batch.tokens, names, R.relp(bridge, R.RelPConfig(ah=True)))
    lg2, g2 = _grads(bridge, batch.tokens, names, R.relp(bridge, R.RelPConfig.none()))
    assert torch.equal(lg0, lg1) and torch.equal(lg0, lg2)
    assert all(torch.equal(g0[n][1], g2[n][1]) for n in names)
    assert not torch.allclose(g0[names[0]][1], g1[names[0]][1])
    assert g1["blocks.1.attn.hook_q"][1] is None  # AH-rule: no gradient into the queries


def test_identity_rule_by_hand_and_its_conservation(tiny):
    """dz/dx := z / x on the GELU: the gradient at hook_pre is the one at hook_post times
    post / stabilize(pre), and x * dz/dx = z conserves the relevance per MLP."""
    bridge, batch, _, _ = tiny
    pre_n, post_n = "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post"
    _, g = _grads(bridge, batch.tokens, [pre_n, post_n], R.identity_rule(bridge))
    (pre, g_pre), (post, g_post) = g[pre_n], g[post_n]
    torch.testing.assert_close(g_pre, g_post * post / R.stabilize(pre))
    assert float((pre * g_pre).sum()) == pytest.approx(float((post * g_post).sum()), rel=1e-4, abs=1e-6)


def test_ln_rule_by_hand_and_its_conservation(tiny):
    """LN with a frozen scale: g_x = (w g - mean(w g)) / sigma, sigma = sqrt(var(x) + eps),
    and sum(x * g_x) = sum((out - bias) * g)."""
    bridge, batch, _, _ = tiny
    in_n, out_n = "blocks.1.ln2.hook_in", "blocks.1.ln2.hook_out"
    _, g = _grads(bridge, batch.tokens, [in_n, out_n], R.ln_rule(bridge))
    (x, g_x), (out, g_out) = g[in_n], g[out_n]
    ln = bridge.blocks[1].ln2.original_component
    sigma = (x.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    wg = ln.weight.detach() * g_out
    torch.testing.assert_close(g_x, (wg - wg.mean(-1, keepdim=True)) / sigma, rtol=1e-4, atol=1e-7)
    lhs, rhs = float((x * g_x).sum()), float(((out - ln.bias.detach()) * g_out).sum())
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-7)


def test_ah_rule_by_hand_and_its_conservation(tiny):
    """Frozen attention weights: g_v[key] = sum over queries of pattern[q, key] g_z[q]; no
    gradient into the scores; sum(v * g_v) = sum(z * g_z) (the head is linear in v)."""
    bridge, batch, _, _ = tiny
    names = ["blocks.1.attn.hook_v", "blocks.1.attn.hook_z", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_k"]
    _, g = _grads(bridge, batch.tokens, names, R.ah_rule(bridge))
    (v, g_v), (z, g_z), (pattern, _), (_, g_k) = (g[n] for n in names)
    assert g_k is None
    torch.testing.assert_close(g_v, torch.einsum("bhqk,bqhd->bkhd", pattern, g_z), rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(z, torch.einsum("bhqk,bkhd->bqhd", pattern, v), rtol=1e-4, atol=1e-6)
    assert float((v * g_v).sum()) == pytest.approx(float((z * g_z).sum()), rel=1e-4, abs=1e-7)


def test_gated_mlp_identity_and_half_rule_by_hand(tmp_path):
    """A tiny Llama (gated MLP, post = silu(gate) * up): d post/d gate := up silu(gate)/gate / 2,
    d post/d up := silu(gate) / 2, and the two branches' relevances sum to the product's."""
    models.save_model(tiny_llama(seed=1), tmp_path / "llama")
    save_word_tokenizer(tmp_path / "llama", [f"t{i}" for i in range(20)])
    bridge = models.load_bridge(tmp_path / "llama", "cpu")
    names = ["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_pre_linear", "blocks.0.mlp.hook_post"]
    tokens = torch.randint(2, 20, (2, 5), generator=torch.Generator().manual_seed(0))
    _, g = _grads(bridge, tokens, names, R.relp(bridge, R.RelPConfig(ln=False)))
    (gate, g_gate), (up, g_up), (post, g_post) = (g[n] for n in names)
    f = torch.nn.functional.silu(gate)
    torch.testing.assert_close(post, f * up)
    torch.testing.assert_close(g_gate, 0.5 * g_post * up * f / R.stabilize(gate))
    torch.testing.assert_close(g_up, 0.5 * g_post * f)
    lhs = float((gate * g_gate + up * g_up).sum())
    assert lhs == pytest.approx(float((post * g_post).sum()), rel=1e-4, abs=1e-7)


# ---------------------------------------------------------------- GradPath -------
def test_gradpath_on_an_orthogonal_map_is_the_straight_line():
    """||Q x - Q x'||^2 with Q orthogonal has gradient 2 (x - x'): GradPath with the
    straight path's step lengths visits x - j/m (x - x'), per example."""
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    x, x0 = torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, 6, generator=g, dtype=torch.float64)
    dist = (x - x0).norm(dim=1)
    pts = R.gradpath(lambda p: p @ q, x, x0 @ q, dist, 4)
    for j, p in enumerate(pts, 1):
        torch.testing.assert_close(p, x - j / 4 * (x - x0))
    mid = R.gradpath(lambda p: p @ q, x, x0 @ q, dist, 4, first=0.5)
    torch.testing.assert_close(mid[-1], x - 3.5 / 4 * (x - x0))


def test_gradpath_steps_have_the_asked_length_on_a_nonlinear_map():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 7, generator=g, dtype=torch.float64)
    x, x0 = torch.randn(2, 5, generator=g, dtype=torch.float64), torch.randn(2, 5, generator=g, dtype=torch.float64)
    dist = (x - x0).norm(dim=1)
    pts = [x] + R.gradpath(lambda p: torch.tanh(p @ w), x, torch.tanh(x0 @ w), dist, 3)
    for a, b in zip(pts, pts[1:]):
        torch.testing.assert_close((b - a).norm(dim=1), dist / 3)


# ---------------------------------------------------------------- node level -----
def test_node_relp_without_rules_is_atp_and_with_them_differs(tiny):
    bridge, batch, comps, means = tiny
    metric = _metric(batch)
    atp = methods.atp(bridge, batch.tokens, comps, metric, "mean", means)
    off = methods.relp_scores(bridge, batch.tokens, comps, metric, "mean", means, R.RelPConfig.none())
    on = methods.relp_scores(bridge, batch.tokens, comps, metric, "mean", means)
    assert off == atp
    assert max(abs(on[k] - atp[k]) for k in atp) > 1e-4


def test_node_eap_gp_on_the_straight_line_is_eap_ig(tiny):
    bridge, batch, comps, means = tiny
    metric = _metric(batch)
    for mode, m in (("mean", means), ("zero", None)):
        ig = methods.eap_ig(bridge, batch.tokens, comps, metric, mode, m, steps=3)
        st = methods.eap_gp(bridge, batch.tokens, comps, metric, mode, m, steps=3, path="straight")
        assert [st[c.name] for c in comps] == pytest.approx([ig[c.name] for c in comps], rel=1e-4, abs=1e-7)
    gp = methods.eap_gp(bridge, batch.tokens, comps, metric, "mean", means, steps=3)
    ig = methods.eap_ig(bridge, batch.tokens, comps, metric, "mean", means, steps=3)
    assert all(torch.isfinite(torch.tensor(v)) for v in gp.values())
    assert max(abs(gp[k] - ig[k]) for k in ig) > 1e-6  # GradPath leaves the straight line


def test_node_eap_gp_with_one_step_is_the_half_step_gradient(tiny):
    """One step: the gradient at the point half a straight-path step from the clean
    state along the normalized GradPath direction; with a single step that point is at
    distance sqrt(#alphas) / 2 from alpha = 1, checked on the alphas themselves."""
    bridge, batch, comps, means = tiny
    metric = _metric(batch)
    hooks = sorted({c.hook for c in comps})
    target = methods._ablated_logits(bridge, batch.tokens, hooks, "mean", means)
    _, grad, alphas = methods._path_state(bridge, batch.tokens, hooks, metric, "mean", means, None, target)
    flat = torch.cat([grad[h].flatten(1) for h in hooks], dim=1)
    n = flat.shape[1]
    moved = R.gradpath_step(torch.ones_like(flat), flat, torch.full((flat.shape[0],), n**0.5 / 2))
    torch.testing.assert_close((moved - 1).norm(dim=1), torch.full((flat.shape[0],), n**0.5 / 2))


# ---------------------------------------------------------------- edge level -----
@pytest.fixture(scope="module")
def edge_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("relp_edges")
    cfg = models.gpt2_toy_config(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    models.save_model(models.build_gpt2_toy(cfg, seed=5, positional=True), root / "gpt2")
    save_word_tokenizer(root / "gpt2", [f"t{i}" for i in range(20)])
    g = torch.Generator().manual_seed(0)
    n, t = 4, 6
    data = CounterfactualBatch(
        torch.randint(2, 20, (n, t), generator=g),
        torch.randint(2, 20, (n, t), generator=g),
        torch.randint(2, 20, (n,), generator=g),
        torch.randint(2, 20, (n,), generator=g),
        torch.full((n,), t - 1),
    )
    with ExitStack() as stack:
        bridge = stack.enter_context(prepared(models.load_bridge(root / "gpt2", "cpu")))
        yield bridge, Graph.from_bridge(bridge), data


def test_edge_relp_without_rules_is_eap(edge_setup, monkeypatch):
    bridge, graph, data = edge_setup
    eap = attribute.edge_scores(bridge, graph, data, "eap")
    relp = attribute.edge_scores(bridge, graph, data, "relp")
    assert not torch.allclose(relp, eap)
    plain = attribute._method_config
    monkeypatch.setattr(attribute, "_method_config", lambda m: R.RelPConfig.none() if m == "relp" else plain(m))
    torch.testing.assert_close(attribute.edge_scores(bridge, graph, data, "relp"), eap, rtol=1e-5, atol=1e-8)


def test_edge_eap_gp_on_the_straight_line_is_eap_ig(edge_setup):
    bridge, graph, data = edge_setup
    ig = attribute.edge_scores(bridge, graph, data, "eap-ig", ig_steps=3)
    st = attribute.edge_scores(bridge, graph, data, "eap-gp", ig_steps=3, path="straight")
    torch.testing.assert_close(st, ig, rtol=1e-4, atol=1e-7)
    gp = attribute.method_scores(bridge, graph, data, "eap-gp", ig_steps=3)
    assert torch.isfinite(gp).all() and not torch.allclose(gp, ig)
    with pytest.raises(ValueError, match="eap-gp integrates"):
        attribute.edge_scores(bridge, graph, data, "eap-gp", gradient_at="corrupted")


def test_edge_methods_on_a_gated_gqa_model(tmp_path):
    """Gated MLPs (identity and half-rule), grouped-query attention and RMSNorm: every new
    edge method gives finite, nonzero scores on the graph's edges only."""
    models.save_model(tiny_llama(seed=2), tmp_path / "llama")
    save_word_tokenizer(tmp_path / "llama", [f"t{i}" for i in range(20)])
    g = torch.Generator().manual_seed(3)
    data = CounterfactualBatch(
        torch.randint(2, 20, (3, 5), generator=g),
        torch.randint(2, 20, (3, 5), generator=g),
        torch.randint(2, 20, (3,), generator=g),
        torch.randint(2, 20, (3,), generator=g),
        torch.full((3,), 4),
    )
    with prepared(models.load_bridge(tmp_path / "llama", "cpu")) as bridge:
        graph = Graph.from_bridge(bridge)
        eap = attribute.edge_scores(bridge, graph, data, "eap")
        for m in ("relp", "relp-ah", "eap-gp"):
            s = attribute.edge_scores(bridge, graph, data, m, ig_steps=2)
            assert torch.isfinite(s).all() and s.abs().sum() > 0 and not torch.allclose(s, eap), m
            assert (s[~graph.valid] == 0).all(), m
