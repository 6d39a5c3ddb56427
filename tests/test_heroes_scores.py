import math

import pytest
import torch

from selfrepair.core import attribution, interventions, models
from selfrepair.core import components as C
from selfrepair.core.train import masked_lm_loss
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S


def test_gradient_norm_equals_autograd_on_weight_slices(tiny_folder):
    """G from hooked activations equals the norm of autograd's gradient of the actual
    weights: the head's column slice of GPT-2's fused c_attn (the V third) and c_proj."""
    br = models.load_bridge(tiny_folder)
    batch = S.make_batch("sort", torch.randint(1, 100, (6, 5), generator=torch.Generator().manual_seed(0)))
    comps = C.all_components(2, 2)
    raw = attribution.gradient_norms(br, [batch], comps, heroes.lm_loss, "raw")
    sq = attribution.gradient_norms(br, [batch], comps, heroes.lm_loss, "sqrt")
    hf = models.load_hf(tiny_folder)
    masked_lm_loss(hf(input_ids=batch.tokens).logits, batch.targets, batch.mask).backward()
    d, dh = 32, 16
    for layer in range(2):
        w = hf.transformer.h[layer].attn.c_attn.weight.grad  # [d_model, 3 d_model]: q | k | v
        for h in range(2):
            ref = w[:, 2 * d + h * dh : 2 * d + (h + 1) * dh].norm().item()
            assert raw[f"L{layer}H{h}"][0] == pytest.approx(ref, rel=1e-4)
            assert sq[f"L{layer}H{h}"][0] == pytest.approx(ref / math.sqrt(d * dh), rel=1e-4)
        ref = hf.transformer.h[layer].mlp.c_proj.weight.grad.norm().item()
        assert raw[f"L{layer}MLP"][0] == pytest.approx(ref, rel=1e-4)
        assert sq[f"L{layer}MLP"][0] == pytest.approx(ref / math.sqrt(64 * 32), rel=1e-4)


def _cache(br, tokens, hooks):
    names = ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    out = {}

    def keep(name):
        def fn(x, hook):
            out[name] = x.detach().clone()

        return fn

    with br.hooks(fwd_hooks=hooks):
        with br.hooks(fwd_hooks=[(n, keep(n)) for n in names]):
            br(tokens)
    return out


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_changes_exactly_the_intended_component(tiny_folder, mode):
    br = models.load_bridge(tiny_folder)
    tokens = S.make_batch("sort", torch.randint(1, 100, (4, 5))).tokens
    comps = C.all_components(2, 2)
    means = interventions.component_means(br, [tokens], comps)
    clean = _cache(br, tokens, [])
    target = C.parse("L1H0")
    ab = _cache(br, tokens, interventions.make_hooks([[target]], 4, mode, means))
    expect = torch.zeros(16) if mode == "zero" else means["blocks.1.attn.hook_z"][0]
    assert torch.allclose(ab["blocks.1.attn.hook_z"][:, :, 0], expect.expand(4, 12, 16), atol=1e-6)
    assert torch.allclose(ab["blocks.1.attn.hook_z"][:, :, 1], clean["blocks.1.attn.hook_z"][:, :, 1], atol=1e-5)
    assert torch.allclose(ab["blocks.0.attn.hook_z"], clean["blocks.0.attn.hook_z"])
    assert torch.allclose(ab["blocks.0.hook_mlp_out"], clean["blocks.0.hook_mlp_out"])
    # the MLP of layer 1 sits downstream and must change
    assert not torch.allclose(ab["blocks.1.hook_mlp_out"], clean["blocks.1.hook_mlp_out"])
    mlp = _cache(br, tokens, interventions.make_hooks([[C.parse("L0MLP")]], 4, mode, means))
    expect = torch.zeros(32) if mode == "zero" else means["blocks.0.hook_mlp_out"]
    assert torch.allclose(mlp["blocks.0.hook_mlp_out"], expect.expand(4, 12, 32), atol=1e-6)
    assert torch.allclose(mlp["blocks.0.attn.hook_z"], clean["blocks.0.attn.hook_z"])


def test_mean_is_over_batch_and_positions(tiny_folder):
    br = models.load_bridge(tiny_folder)
    t1 = S.make_batch("sort", torch.randint(1, 100, (3, 4))).tokens
    t2 = S.make_batch("sort", torch.randint(1, 100, (5, 4))).tokens
    means = interventions.component_means(br, [t1, t2], [C.parse("L0H1")])
    _, c1 = br.run_with_cache(t1)
    _, c2 = br.run_with_cache(t2)
    z = torch.cat([c1["blocks.0.attn.hook_z"], c2["blocks.0.attn.hook_z"]])
    assert torch.allclose(means["blocks.0.attn.hook_z"], z.mean((0, 1)), atol=1e-6)


def test_batched_ablations_equal_one_at_a_time(tiny_folder):
    br = models.load_bridge(tiny_folder)
    tokens = S.make_batch("sort", torch.randint(1, 100, (5, 6))).tokens
    sets = [[], [C.parse("L0H0")], [C.parse("L1MLP"), C.parse("L0H1")]]
    together = interventions.run_ablated(br, tokens, sets, "zero")
    for s, lg in zip(sets, together):
        alone = interventions.run_ablated(br, tokens, [s], "zero", max_rows=5)[0]
        assert torch.allclose(lg, alone, atol=1e-5)


def test_exact_match_one_pass_equals_greedy_decoding(trained_sort_folder):
    """Teacher-forced argmax agreement equals token-by-token greedy decoding, for the
    intact and for an ablated model, sequence by sequence."""
    hf = models.load_hf(trained_sort_folder)
    br = models.load_bridge(trained_sort_folder)
    g = torch.Generator().manual_seed(5)
    values = S.sample_values(60, 4, g)
    batch = S.make_batch("sort", values)
    fast = heroes.correct(hf, batch)
    slow = torch.tensor([heroes.greedy_decode_correct(hf, "sort", v) for v in values])
    assert torch.equal(fast, slow)
    assert 0 < fast.float().mean() < 1  # the check is not vacuous
    hooks = interventions.make_hooks([[C.parse("L1H0")]], 1, "zero")

    class Ablated:
        def __call__(self, tokens):
            with br.hooks(fwd_hooks=hooks):
                return br(tokens)

        def run_with_hooks(self):  # marks it as bridge-like for forward_logits
            raise NotImplementedError

    ab = heroes.ablation_correct(hf, batch, [[C.parse("L1H0")]], "zero", None)[0]
    slow_ab = torch.tensor([heroes.greedy_decode_correct(Ablated(), "sort", v) for v in values])
    assert torch.equal(ab, slow_ab)


def test_causal_scores_by_hand(trained_sort_folder):
    hf = models.load_hf(trained_sort_folder)
    batch = S.eval_set("sort", 4, 80, seed=1)
    comps = [C.parse("L0H0"), C.parse("L1MLP")]
    df = heroes.causal_scores(hf, batch, comps, "zero", None)
    base = heroes.correct(hf, batch).float()
    for c, row in zip(comps, df.itertuples()):
        ab = heroes.ablation_correct(hf, batch, [[c]], "zero", None)[0].float()
        assert row.C == pytest.approx(float(base.mean() - ab.mean()))
        assert row.C_se == pytest.approx(float((base - ab).std() / math.sqrt(80)))
