"""The ground truth under grouped-query attention, and on a subset of players.

A tiny random Llama with 2 key/value heads for 4 heads is checked against brute force
(its Shapley values) and against the same model with ``repeat_kv`` made explicit (4
key/value heads, each a copy of its group's, built here from the weights): the two
compute the same function and the same per-head outputs, so every method's score of a
head must agree, and there the gradient norm is read the ordinary way (the slice of
``hook_v``'s gradient of the head's own value weights). The subset of players is checked
against brute force over the players it names."""

import numpy as np
import pandas as pd
import pytest
import torch

from selfrepair.core import components as C
from selfrepair.core import interventions, models
from selfrepair.gim.evaluate import logit_diff
from selfrepair.groundtruth import methods, pipeline, players, shapley_values
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer
from shapley_brute import brute_force
from tiny_models import tiny_llama

V, N_HEADS, D_HEAD = 20, 4, 4


def _expanded(gqa_model):
    """``gqa_model`` with each key/value head copied to the heads of its group (head h
    reads group h // (n_heads / n_kv_heads), ``repeat_kv``'s order): no grouped-query attention."""
    full = tiny_llama(vocab_size=V, n_kv_heads=N_HEADS, seed=99)
    sd = gqa_model.state_dict()
    rep = N_HEADS // gqa_model.config.num_key_value_heads
    for k, w in list(sd.items()):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            sd[k] = w.view(-1, D_HEAD, w.shape[1]).repeat_interleave(rep, dim=0).reshape(N_HEADS * D_HEAD, -1)
    full.load_state_dict(sd)
    return full


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(GQA bridge, expanded bridge, pairs, components, means of each)."""
    root = tmp_path_factory.mktemp("gqa")
    gqa = tiny_llama(vocab_size=V, n_kv_heads=2, seed=4)
    out = []
    for name, model in (("gqa", gqa), ("full", _expanded(gqa))):
        models.save_model(model, root / name)
        save_word_tokenizer(root / name, [f"t{i}" for i in range(V)])
        out.append(models.load_bridge(root / name, "cpu"))
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(2, V, (6, 7), generator=g)
    ans, foil = torch.randint(2, V, (6,), generator=g), torch.randint(2, V, (6,), generator=g)
    data = CounterfactualBatch(clean, clean, ans, foil, torch.randint(3, 7, (6,), generator=g))
    comps = C.all_components(2, N_HEADS)
    means = [interventions.component_means(b, [clean], comps) for b in out]
    return out[0], out[1], data, comps, means


def _metric(data):
    return lambda lg: logit_diff(lg, data).mean()


def test_the_two_models_compute_the_same_outputs_and_head_outputs(pair):
    gqa, full, data, _, _ = pair
    assert gqa.cfg.n_key_value_heads == 2 and getattr(full.cfg, "n_key_value_heads", 4) in (None, 4)
    z = {}
    for name, b in (("gqa", gqa), ("full", full)):
        logits, cache = b.run_with_cache(data.clean, names_filter=lambda n: n.endswith("hook_z"))
        z[name] = (logits, [cache[f"blocks.{la}.attn.hook_z"] for la in range(2)])
    torch.testing.assert_close(z["gqa"][0], z["full"][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(z["gqa"][1], z["full"][1]):
        assert a.shape[2] == N_HEADS
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_shapley_values_under_gqa_equal_brute_force(pair):
    """Heads of one key/value group are separate players: ablating one zeroes or means
    its own z only. Six players (three heads of layer 1 from both groups, a layer-0 head
    of each group, an MLP) by brute force over all 6! orders against the pipeline."""
    gqa, _, data, comps, (means, _) = pair
    chosen = [C.parse(n) for n in ("L0H0", "L0H3", "L1H0", "L1H1", "L1H2", "L0MLP")]
    _, phi = brute_force(gqa, data.clean, chosen, means, _metric(data))
    spec = pipeline.GameSpec("logit_diff", _metric(data))
    out = pipeline.model_tables(gqa, data.clean, [spec], chosen, means, pipeline.Settings(ig_steps=2))
    got = out["shapley"].set_index("component").loc[[c.name for c in chosen], "shapley"].to_numpy()
    assert np.abs(phi).max() > 1e-3
    np.testing.assert_allclose(got, phi, rtol=1e-6, atol=1e-7)
    # the two heads of one group are different players
    assert abs(phi[2] - phi[3]) > 1e-6


def test_every_method_scores_a_gqa_head_as_the_expanded_model_does(pair):
    gqa, full, data, comps, (m_gqa, m_full) = pair
    spec = pipeline.GameSpec("logit_diff", _metric(data))
    singles = {}
    for mode in ("mean", "zero"):
        game = pipeline._games(full, None, data.clean, [spec], mode, m_full, 256)["logit_diff"]
        singles[mode] = pipeline._singles(game, comps)
    got = [
        methods.all_methods(b, data.clean, comps, _metric(data), singles, "mean", m, n_primary=2, ig_steps=3)
        for b, m in ((gqa, m_gqa), (full, m_full))
    ]
    a, b = (g.set_index(["method", "component"])["score"] for g in got)
    assert set(a.index) == set(b.index)
    for method in methods.GRADIENT_METHODS + methods.COAX_METHODS:
        x, y = a.loc[method].sort_index(), b.loc[method].sort_index()
        assert np.abs(y.to_numpy()).max() > 1e-6, method
        np.testing.assert_allclose(x.to_numpy(), y.to_numpy(), rtol=2e-4, atol=1e-6, err_msg=method)


def test_a_heads_gradient_norm_is_its_own_copy_of_the_group_weights(pair):
    """By autograd on the expanded Hugging Face model: each head's gradient of its own
    rows of v_proj (the copy of its group's) has the GQA model's G of that head; the
    heads of one group add up to the shared v_proj's gradient of the GQA model."""
    gqa, full, data, comps, _ = pair
    heads = [c for c in comps if c.is_head]
    ours = methods.grad_norms(gqa, data.clean, heads, _metric(data), "raw")
    hf_full = full.original_model
    hf_full.zero_grad(set_to_none=True)
    (-_metric(data)(hf_full(data.clean).logits)).backward()
    for c in heads:
        w = hf_full.model.layers[c.layer].self_attn.v_proj.weight.grad
        ref = w[c.head * D_HEAD : (c.head + 1) * D_HEAD].norm().item()
        assert ours[c.name] == pytest.approx(ref, rel=1e-4)
    hf_gqa = gqa.original_model
    hf_gqa.zero_grad(set_to_none=True)
    (-_metric(data)(hf_gqa(data.clean).logits)).backward()
    shared = hf_gqa.model.layers[1].self_attn.v_proj.weight.grad[:D_HEAD]  # group 0 of layer 1
    summed = sum(hf_full.model.layers[1].self_attn.v_proj.weight.grad[h * D_HEAD : (h + 1) * D_HEAD] for h in (0, 1))
    torch.testing.assert_close(shared, summed, rtol=1e-4, atol=1e-7)
    hf_full.zero_grad(set_to_none=True)
    hf_gqa.zero_grad(set_to_none=True)


@pytest.mark.parametrize("rest", ["player", "intact"])
def test_top_players_and_the_rest_against_brute_force(pair, rest):
    """players top: the 3 components of largest |single drop| (found here from each
    component's own run) and the rest as one player or never ablated, by brute force over
    those players (the rest ablated as one set)."""
    gqa, _, data, comps, (means, _) = pair
    metric = _metric(data)
    v = interventions.run_ablated(gqa, data.clean, [[]] + [[c] for c in comps], "mean", means, reduce=metric)
    drops = [float(v[0] - v[i + 1]) for i in range(len(comps))]
    top = sorted(sorted(range(len(comps)), key=lambda i: -abs(drops[i]))[:3])
    others = [c for i, c in enumerate(comps) if i not in top]
    who = [[comps[i]] for i in top] + ([others] if rest == "player" else [])
    phi = _brute_groups(gqa, data.clean, who, means, metric)
    settings = pipeline.Settings(players="top", n_players=3, rest=rest, ig_steps=2)
    out = pipeline.model_tables(gqa, data.clean, [pipeline.GameSpec("ld", metric)], comps, means, settings)
    names = [comps[i].name for i in top] + (["rest"] if rest == "player" else [])
    shap = out["shapley"].set_index("component")
    assert list(shap.index) == names
    np.testing.assert_allclose(shap.loc[names, "shapley"].to_numpy(), phi, rtol=1e-6, atol=1e-7)
    assert shap["estimator"].eq("exact").all()
    sv = shapley_values(gqa, data.clean, metric, comps, means=means, settings=settings).set_index("component")
    np.testing.assert_allclose(sv.loc[names, "shapley"].to_numpy(), phi, rtol=1e-6, atol=1e-7)
    if rest == "player":  # efficiency over the whole model
        assert phi.sum() == pytest.approx(float(v[0]) - _value(gqa, data.clean, comps, means, metric), abs=1e-5)
    # every component keeps its single drop; the methods score the chosen components
    single = out["scores"].query("method == 'single'").set_index("component")["score"]
    np.testing.assert_allclose(single.loc[[c.name for c in comps]].to_numpy(), drops, rtol=1e-6, atol=1e-7)
    for m in ("single_zero", "atp", "grad_norm", "coax_single"):
        assert set(out["scores"].query("method == @m")["component"]) == set(names) - {"rest"}, m


def _value(bridge, tokens, coalition, means, metric) -> float:
    return float(interventions.run_ablated(bridge, tokens, [list(coalition)], "mean", means, reduce=metric)[0])


def _brute_groups(bridge, tokens, groups, means, metric) -> np.ndarray:
    """Shapley values of players that are sets of components, over all orders."""
    import itertools
    import math

    phi = np.zeros(len(groups))
    cache = {}

    def val(idx):
        key = frozenset(idx)
        if key not in cache:
            cache[key] = _value(bridge, tokens, [c for i in sorted(key) for c in groups[i]], means, metric)
        return cache[key]

    for order in itertools.permutations(range(len(groups))):
        pre = []
        for i in order:
            phi[i] += val(pre) - val(pre + [i])
            pre = pre + [i]
    return phi / math.factorial(len(groups))


def test_layer_players_and_bad_settings():
    comps = C.all_components(2, 2)
    got = players.choose(comps, {}, "layers", 16, "player")
    assert [g.name for g in got] == ["L0", "L1"]
    assert [c.name for c in got[1].members] == ["L1H0", "L1H1", "L1MLP"]
    assert players.choose(comps, {}, "all", 1, "player") == comps
    single = {c.name: float(i) for i, c in enumerate(comps)}
    assert players.choose(comps, single, "top", 99, "intact") == comps
    with pytest.raises(ValueError, match="players must be"):
        pipeline.Settings(players="some")
    with pytest.raises(ValueError, match="n_players"):
        pipeline.Settings(players="top", n_players=0)
    with pytest.raises(ValueError, match="rest must be"):
        pipeline.Settings(rest="gone")


def test_run_on_model_gives_the_tables_of_a_gqa_model(pair):
    gqa, _, data, comps, _ = pair
    settings = pipeline.Settings(players="top", n_players=4, ig_steps=2)
    out = pipeline.run_on_model(gqa, data, settings, top_k=3, name="tiny")
    assert set(out) == {"shapley", "interactions", "scores", "agreement", "timing"}
    assert len(out["shapley"]) == 5 and out["shapley"]["component"].iloc[-1] == "rest"
    agree = out["agreement"].set_index("method")["n_components"]
    assert isinstance(out["agreement"], pd.DataFrame) and agree["atp"] == 4 and agree.max() == 4  # not "rest"


def test_own_shapley_runs_on_a_gqa_model_with_a_subset_of_players(tmp_path):
    """The own: section's shapley analysis on a grouped-query model (it used to answer
    "not run"), with the entry's players, n_players and rest."""
    from selfrepair.own.entries import TABLES
    from selfrepair.own.run import run_analysis

    folder = tmp_path / "gqa-llama"
    models.save_model(tiny_llama(vocab_size=64, n_kv_heads=2, seed=2), folder)
    save_word_tokenizer(folder, [f"t{i}" for i in range(64)])
    s = dict(
        name="gqa", model=str(folder), task="ioi", n_eval=6, data_seed=0, mode="mean", top_k=3, single_frac=0.1,
        settings={"ig_steps": 2, "exact_max_players": 12}, players="top", n_players=4, rest="player",
    )  # fmt: skip
    outputs = {t: str(tmp_path / f"{t}.csv") for t in TABLES["shapley"]} | {"status": str(tmp_path / "status.csv")}
    status = run_analysis("shapley", s, outputs).iloc[0]
    assert status["status"] == "ran", status["reason"]
    shap = pd.read_csv(outputs["shapley"])
    assert len(shap) == 5 and shap["component"].iloc[-1] == "rest" and shap["estimator"].eq("exact").all()
    scores = pd.read_csv(outputs["scores"])
    assert scores.query("method == 'single'")["component"].nunique() == 10
    assert scores.query("method == 'eap_ig'")["component"].nunique() == 4


def test_gim_freezes_gemma3_rms_norm_like_gemma2s():
    """Gemma-3's RMSNorm (x / rms(x) * (1 + w), float32) under GIM's freeze_norm: its own
    forward, bit for bit, and the gradient of x * (1 + w) / rms with rms a constant."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from selfrepair.gim.backward import _FrozenScaleNorm

    torch.manual_seed(0)
    norm = Gemma3RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 8, requires_grad=True)
    y = _FrozenScaleNorm(norm).forward(x)
    assert torch.equal(y, norm(x))
    g = torch.randn(3, 8)
    (dx,) = torch.autograd.grad(y, x, g)
    rms = (x.detach().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(dx, g * (1 + norm.weight.detach()) / rms)
