"""The ablation engine (selfrepair.core.engine) against independent references: a full
forward of the Hugging Face model with the ablation written into it by hooks, the
TransformerBridge's own ablation path (interventions.run_ablated), its caches (means,
attention patterns) and its gradient norms."""

import random

import pytest
import torch

from hooked_gpt2 import hooked_logits
from selfrepair.core import attribution, engine, interventions, models
from selfrepair.core import components as C
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S


def same(a, b):
    """Equal to float32 rounding. The engine runs the model's own operations, but on other
    shapes than one full forward (chunks of rows; with ``positions``, the last layer on a
    slice of the sequence), and a GEMM may pick another kernel, or sum in another order,
    for another shape: bit for bit on some MKL branches, not on all (MKL's compatible
    branch moved the logits by 9e-8, max |logit| 0.44). Tolerance 1e-5 of the largest
    logit (~50x that), while the smallest ablation here moves the logits by 0.04."""
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=3, n_heads=2, d_model=32, d_mlp=64, n_ctx=32)
    folder = tmp_path_factory.mktemp("engine") / "model"
    models.save_model(models.build_gpt2_toy(cfg, seed=3), folder)
    return folder


def some_sets(comps, seed=0):
    rnd = random.Random(seed)
    sets = [[]] + [[c] for c in comps]
    sets += [rnd.sample(comps, k) for k in (2, 3, 5, len(comps))]
    sets += [comps[:k] for k in range(1, len(comps) + 1)]  # a pruning curve in layer order
    sets += [list(reversed(comps))[:k] for k in range(1, 4)]  # one from the top
    sets += [[comps[2]], [comps[2]], []]  # repeats
    return sets


@pytest.mark.parametrize("mode", ["mean", "zero"])
@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("site", engine.SITES)
def test_engine_logits_equal_a_full_hooked_forward(three_layers, mode, reuse, site):
    hf = models.load_hf(three_layers)
    comps = C.all_components(3, 2)
    tokens = S.eval_set("sort", 5, 20, seed=4).tokens
    means = engine.means(hf, [S.eval_set("sort", 5, 30, seed=5).tokens], rows=7)
    sets = some_sets(comps)
    eng = engine.AblationEngine(hf, mode, means, rows=7, reuse=reuse, site=site)  # 3 chunks of rows
    got = eng.run(tokens, sets)
    pos = slice(7, 12)
    at_pos = eng.run(tokens, sets, positions=pos)
    for s, g, gp in zip(sets, got, at_pos):
        ref = hooked_logits(hf, tokens, list(dict.fromkeys(s)), mode, means, site)
        assert g.shape == ref.shape
        assert same(g, ref), [c.name for c in s]
        assert same(gp, ref[:, pos]), [c.name for c in s]
    # the check is not vacuous: ablations change the logits
    assert not torch.allclose(got[0], got[len(comps)])


def test_prefix_reuse_skips_the_layers_below_the_first_ablation(three_layers):
    """An ablation at the top MLP runs no attention; a pruning curve's point runs only
    the layers from the component it adds."""
    hf = models.load_hf(three_layers)
    calls = []
    handles = [
        blk.attn.c_attn.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
        for i, blk in enumerate(hf.transformer.h)
    ]
    tokens = S.eval_set("sort", 4, 6, seed=1).tokens
    eng = engine.AblationEngine(hf, "zero")
    eng.run(tokens, [[], [C.parse("L2MLP")], [C.parse("L2H1")]])
    assert calls == [0, 1, 2]  # the intact forward only
    calls.clear()
    eng.run(
        tokens,
        [[C.parse("L0H0")], [C.parse("L0H0"), C.parse("L1MLP")], [C.parse("L0H0"), C.parse("L1MLP"), C.parse("L2H0")]],
    )
    # intact (0,1,2); L0H0 resumes from layer 0's z: layers 1, 2; + L1MLP: layer 2; + L2H0: nothing
    assert calls == [0, 1, 2, 1, 2, 2]
    calls.clear()
    engine.AblationEngine(hf, "zero", reuse=False).run(tokens, [[C.parse("L2MLP")]])
    assert calls == [0, 1, 2, 0, 1, 2]
    for h in handles:
        h.remove()


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_engine_c_equals_the_bridge_path(trained_sort_folder, mode):
    """C through the engine (Hugging Face modules) and through the bridge's hooks
    (interventions.run_ablated, one full forward per set): identical exact-match outcomes,
    with the bridge's means and with the engine's."""
    br = models.load_bridge(trained_sort_folder)
    hf = models.load_hf(trained_sort_folder)
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    batch = S.eval_set("sort", 4, 300, seed=9)
    ref_means = S.fixed_length_batches("sort", 4, 3, 32, seed=2)
    bmeans = interventions.component_means(br, [b.tokens for b in ref_means], comps)
    emeans = engine.means(hf, [b.tokens for b in ref_means])
    sets = [[]] + [[c] for c in comps] + [comps[:k] for k in range(2, len(comps) + 1)]
    bridge_rows = interventions.run_ablated(
        br, batch.tokens, sets, mode, bmeans, reduce=lambda lg: heroes.exact_match(lg, batch.targets, batch.mask)
    )
    bridge_rows = torch.stack(bridge_rows)
    assert torch.equal(heroes.ablation_correct(hf, batch, sets, mode, bmeans, rows=64), bridge_rows)
    assert torch.equal(heroes.ablation_correct(hf, batch, sets, mode, emeans), bridge_rows)
    acc = bridge_rows.float().mean(1)
    assert 0 < acc[0] < 1 and len(set(acc.tolist())) > 3  # outcomes vary: not vacuous


def test_engine_means_equal_the_bridge_caches(trained_sort_folder):
    br = models.load_bridge(trained_sort_folder)
    hf = models.load_hf(trained_sort_folder)
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    toks = [b.tokens for b in S.fixed_length_batches("sort", 4, 3, 32, seed=2)]
    ours = engine.means(hf, toks, rows=10)
    ref = interventions.component_means(br, toks, comps)
    assert set(ours) == set(ref)
    for k in ref:
        assert ours[k].shape == ref[k].shape
        assert torch.allclose(ours[k], ref[k], atol=2e-6), k


def test_attention_patterns_equal_the_bridge_patterns(trained_sort_folder):
    br = models.load_bridge(trained_sort_folder)
    tokens = S.eval_set("sort", 4, 16, seed=3).tokens
    pats = engine.AblationEngine(models.load_hf(trained_sort_folder)).attention_patterns(tokens)
    _, cache = br.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    for layer, p in enumerate(pats):
        ref = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert p.shape == ref.shape
        assert torch.allclose(p, ref, atol=1e-5)
        assert torch.allclose(p.sum(-1), torch.ones(p.shape[:-1]), atol=1e-6)
        assert (p.triu(1) == 0).all()
    st = heroes.attention_stats(pats)
    assert list(st["component"]) == [f"L{i}H{h}" for i in range(br.cfg.n_layers) for h in range(br.cfg.n_heads)]


def test_gpt2_gradient_norms_equal_the_bridge_path(trained_sort_folder):
    br = models.load_bridge(trained_sort_folder)
    hf = models.load_hf(trained_sort_folder)
    comps = C.all_components(br.cfg.n_layers, br.cfg.n_heads)
    batches = S.fixed_length_batches("sort", 4, 3, 32, seed=6)
    for norm in ("sqrt", "raw"):
        ref = attribution.gradient_norms(br, batches, comps, heroes.lm_loss, norm)
        ours = attribution.gradient_norms_gpt2(hf, batches, comps, heroes.lm_loss, norm)
        assert list(ours) == list(ref)
        for k in ref:
            assert ours[k] == pytest.approx(ref[k], rel=1e-5), k
    assert all(p.grad is None and p.requires_grad for p in hf.parameters())


def test_engine_rejects_bad_input(three_layers):
    hf = models.load_hf(three_layers)
    tokens = S.eval_set("sort", 4, 3, seed=1).tokens
    with pytest.raises(ValueError, match="unknown ablation mode"):
        engine.AblationEngine(hf, "resample")
    with pytest.raises(ValueError, match="unknown ablation site"):
        engine.AblationEngine(hf, "zero", site="hook_attn_out")
    with pytest.raises(ValueError, match="needs means"):
        engine.AblationEngine(hf, "mean")
    with pytest.raises(ValueError, match="not a component of this model"):
        engine.AblationEngine(hf).run(tokens, [[C.parse("L3H0")]])
    with pytest.raises(ValueError, match="not a component of this model"):
        engine.AblationEngine(hf).run(tokens, [[C.parse("L0H2")]])
    with pytest.raises(ValueError, match="has shape"):
        engine.AblationEngine(hf, "mean", {"blocks.0.attn.hook_z": torch.zeros(3, 16)})
    with pytest.raises(ValueError, match="mean of blocks.1.hook_mlp_out"):
        engine.AblationEngine(hf, "mean", {}).run(tokens, [[C.parse("L1MLP")]])
    with pytest.raises(TypeError, match="GPT-2"):
        engine.AblationEngine(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="not a TransformerBridge"):
        engine.AblationEngine(models.load_bridge(three_layers))
    with pytest.raises(ValueError, match="no target positions"):
        heroes.target_positions(torch.zeros(2, 5, dtype=torch.bool))


def test_probe_ablations_equal_the_separate_measurements(trained_sort_folder):
    """heroes_probe's one engine call (joint ablations + pruning curves, the intact model
    and single ablations taken from heroes_scores' outcomes) gives the numbers of
    joint_vs_individual and pruning_curve run separately."""
    hf = models.load_hf(trained_sort_folder)
    comps = C.all_components(hf.config.n_layer, hf.config.n_head)
    batch = S.eval_set("sort", 4, 200, seed=11)
    means = engine.means(hf, [b.tokens for b in S.fixed_length_batches("sort", 4, 2, 32, seed=2)])
    groups = {"bloat": comps[:2], "hero": [comps[5], comps[3]], "none": []}
    orders = {"up": comps, "down": list(reversed(comps)), "mixed": [comps[i] for i in (4, 0, 5, 2, 1, 3)]}
    singles = heroes.ablation_correct(hf, batch, [[]] + [[c] for c in comps], "mean", means)
    known = dict(zip(["baseline"] + [c.name for c in comps], singles))
    for kn in (None, known):
        joint, curves = heroes.probe_ablations(hf, batch, groups, orders, "mean", means, kn)
        for g, members in groups.items():
            ref = heroes.joint_vs_individual(hf, batch, members, "mean", means)
            assert joint[g] == pytest.approx(ref, nan_ok=True), g
        for name, order in orders.items():
            assert curves[name] == heroes.pruning_curve(hf, batch, order, "mean", means), name
    assert joint["bloat"]["joint"] != 0 and len(set(curves["up"])) > 2  # not vacuous
    # known outcomes are used, not recomputed: wrong ones show up in the result
    fake = {k: torch.zeros_like(v) for k, v in known.items()}
    joint, _ = heroes.probe_ablations(hf, batch, groups, {}, "mean", means, fake)
    assert joint["bloat"]["baseline_acc"] == 0.0


def test_probe_needs_the_means_heroes_scores_saved(tmp_path):
    """An outcomes.pt from before the engine (no means) gets an error that says what to rerun."""
    from selfrepair.core import runtime

    f = tmp_path / "outcomes.pt"
    runtime.save_tensors(f, {"status": "kept", "columns": ["baseline"], "mean": torch.zeros(3, 1, dtype=torch.bool)})
    with pytest.raises(ValueError, match="rerun heroes_scores"):
        heroes.saved_means(runtime.load_tensors(f), f)
    means = {"blocks.0.hook_mlp_out": torch.ones(4)}
    runtime.save_tensors(f, {"status": "kept", "means": means})
    assert torch.equal(heroes.saved_means(runtime.load_tensors(f), f)["blocks.0.hook_mlp_out"], torch.ones(4))
