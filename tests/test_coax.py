"""Paper B: the COAX energy, scores, wake-up, synergy and the synthetic benchmark."""

import math

import numpy as np
import pytest
import torch

from coax_toys import PlantedBackup
from selfrepair.coax import score as coax
from selfrepair.core.components import Component, head_components, parse
from selfrepair.core.stats import paired_test, recall_at_k, roc_auc

torch.set_num_threads(1)


def test_energy_is_the_fisher_quadratic_form_by_hand():
    # p0 = (1/2, 1/4, 1/4); F = diag(p0) - p0 p0^T
    p0 = torch.tensor([[[0.5, 0.25, 0.25]], [[0.5, 0.25, 0.25]]])
    dz = torch.tensor([[[1.0, 0.0, -1.0]], [[0.0, 2.0, 0.0]]])
    # dz1: sum p dz^2 = 0.5 + 0.25 = 0.75, (p.dz)^2 = 0.25^2 -> 0.6875
    # dz2: 0.25 * 4 = 1.0, (p.dz)^2 = 0.5^2 -> 0.75; mean 0.71875
    assert coax.energy(dz, p0) == pytest.approx(0.71875, abs=1e-7)
    # <dz1, dz2>_F = sum p dz1 dz2 - (p.dz1)(p.dz2) = 0 - 0.25 * 0.5
    assert coax.fisher_inner(dz[:1], dz[1:], p0[:1]) == pytest.approx(-0.125, abs=1e-7)


def test_support_protocols():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))[None, None, :].repeat(1, 3, 1)  # [1, 3, 4]
    v2 = coax.make_support(logits, "v2")
    assert v2.positions.tolist() == [2]
    assert v2.p0[0, 0].tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125])
    v1 = coax.make_support(logits, "v1", top_r=2)
    assert v1.positions.tolist() == [0, 1]
    assert v1.index[0, 0].tolist() == [0, 1]
    assert v1.p0[0, 0].tolist() == pytest.approx([2 / 3, 1 / 3])  # renormalized on the top 2
    with pytest.raises(ValueError):
        coax.make_support(logits, "v3")


def _hand_energy(dz, z0):
    p = np.exp(z0 - z0.max())
    p /= p.sum()
    f = np.diag(p) - np.outer(p, p)
    return float(dz @ f @ dz)


def test_comp_of_planted_dormant_unit_is_large_and_inert_is_zero():
    m = PlantedBackup(vocab=5, a=1.0)
    tokens = torch.zeros(3, 4, dtype=torch.long)
    P, I, Z, B, Z2 = parse("L0H0"), parse("L0H1"), parse("L0H2"), parse("L1H0"), parse("L1H1")  # noqa: E741  the paper's unit names
    res = coax.scan(m, tokens, [I, Z, B, Z2], [P], protocol="v2")
    t = res.table.set_index("unit")
    W0, W1 = m.blocks[0].attn.W_O.detach()[:, 0].numpy(), m.blocks[1].attn.W_O.detach()[:, 0].numpy()
    z0 = 1.0 * W0[0] + 0.3 * W0[1]  # clean logits: P writes a*u, I 0.3 v, B silent
    e_b = _hand_energy(1.0 * W1[0], z0)  # with P gone, B writes a*u
    e_i = _hand_energy(0.3 * W0[1], z0)
    assert t.loc["L1H0", "single"] == pytest.approx(0.0, abs=1e-9)
    assert t.loc["L1H0", "cond"] == pytest.approx(e_b, rel=1e-5)
    assert t.loc["L1H0", "comp"] == pytest.approx(e_b, rel=1e-5)
    assert e_b > 0.05
    assert t.loc["L0H1", "single"] == pytest.approx(e_i, rel=1e-5)
    assert abs(t.loc["L0H1", "comp"]) < 1e-6
    assert abs(t.loc["L0H2", "comp"]) < 1e-9
    # the recovered set: comp ranks the backup first, and it wakes up
    m2 = PlantedBackup(vocab=5, a=1.0, b0=0.1)
    wake = coax.wake_up_ratios(m2, tokens, [I, B], [P])
    assert wake["L1H0"] == pytest.approx(11.0, rel=1e-5)  # (1 + 0.1) / 0.1
    assert wake["L0H1"] == pytest.approx(1.0)
    t2 = coax.scan(m2, tokens, [I, Z, B, Z2], [P], protocol="v2").table
    assert coax.recovered_set(t2, wake, k=2) == ["L1H0"]


def test_pairwise_synergy_of_a_backup_pair():
    m = PlantedBackup(vocab=5)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    units = [parse("L0H0"), parse("L0H1"), parse("L1H0")]
    sup = coax.clean_support(m, tokens, "v2")
    syn = coax.pairwise_synergy(m, tokens, units, sup).set_index(["u", "v"])
    W0, W1 = m.blocks[0].attn.W_O.detach()[:, 0].numpy(), m.blocks[1].attn.W_O.detach()[:, 0].numpy()
    z0 = W0[0] + 0.3 * W0[1]
    # P and B: each alone does nothing (repair / silence), together they remove a*u
    assert syn.loc[("L0H0", "L1H0"), "synergy"] == pytest.approx(_hand_energy(W1[0], z0), rel=1e-5)
    assert syn.loc[("L0H0", "L0H1"), "synergy"] == pytest.approx(0.0, abs=1e-9)


def test_synthetic_benchmark_matches_the_published_values():
    t = coax.synthetic_benchmark(trials=10, seed=3)
    m = t.groupby("score")["auc"].mean()
    assert m["clean_energy"] < 0.48  # below chance: inert units are louder when clean
    assert abs(m["clean_answer"] - 0.5) < 0.06
    assert 0.65 < m["cond_answer"] < 0.82
    assert m["coax"] > 0.88


def test_roc_auc_against_a_hand_count():
    # positives 0.9, 0.7; negatives 0.8, 0.6, 0.5: 0.9 beats 3, 0.7 beats 2 -> 5/6
    assert roc_auc([0.9, 0.8, 0.7, 0.6, 0.5], [1, 0, 1, 0, 0]) == pytest.approx(5 / 6)
    # ties count half: pos 0.2 vs neg 0.2 -> 1/2, vs neg 0.9 -> 0  => 0.25
    assert roc_auc([0.2, 0.2, 0.9], [1, 0, 0]) == pytest.approx(0.25)
    assert math.isnan(roc_auc([1, 2], [0, 0]))
    assert recall_at_k(["a", "b", "c", "d"], {"b", "d", "e"}, 2) == (1, 1 / 3)
    p = paired_test([0.9, 0.8, 0.85, 0.9, 0.95, 0.7], [0.5, 0.6, 0.55, 0.4, 0.6, 0.65])
    assert p["p_wilcoxon"] == pytest.approx(1 / 64)  # all 6 differences positive
    assert p["mean_diff"] == pytest.approx(np.mean([0.4, 0.2, 0.3, 0.5, 0.35, 0.05]))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model

    folder = tmp_path_factory.mktemp("gpt2")
    model = build_gpt2_toy(
        gpt2_toy_config(vocab_size=50, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16), seed=0, positional=True
    )
    save_model(model, folder)
    return load_bridge(folder)


def test_one_scan_costs_1_plus_2U_forward_passes_batched(tiny_gpt2):
    b = tiny_gpt2
    tokens = torch.randint(0, 50, (6, 10), generator=torch.Generator().manual_seed(0))
    rows, calls = [], []

    def count(mod, args, kwargs, out=None):
        x = args[0] if args else next(iter(kwargs.values()))
        rows.append(x.shape[0])
        calls.append(1)

    # counted at the unembedding: the ablated runs resume from the intact run at their first
    # ablated layer (interventions.Prefix), so they do not all pass the embedding
    h = b.unembed.register_forward_pre_hook(lambda mod, args, kwargs: count(mod, args, kwargs), with_kwargs=True)
    try:
        units = head_components(2, 4)
        res = coax.scan(b, tokens, units, [units[5]], protocol="v1", top_r=8)
    finally:
        h.remove()
    U = len(units)
    assert sum(rows) / tokens.shape[0] == 1 + 2 * U  # S inside U: its cond pass is the S-alone pass
    assert res.forward_passes == 1 + 2 * U
    # clean; the singles and the S + u in one batch per first ablated layer (2 layers each); S alone
    assert len(calls) == 6
    # S outside U: clean + |U| singles + S alone + |U| conditionals
    res2 = coax.scan(b, tokens, units[:3], [units[5]], protocol="v2")
    assert res2.forward_passes == 2 + 2 * 3
    # the batched scan equals one-at-a-time ablation
    from selfrepair.core.interventions import run_ablated

    sup = coax.clean_support(b, tokens, "v1", 8)
    z_s = run_ablated(b, tokens, [[units[5]]], reduce=sup.gather)[0]
    z_su = run_ablated(b, tokens, [[units[5], units[0]]], reduce=sup.gather)[0]
    t = res.table.set_index("unit")
    assert t.loc[units[0].name, "cond"] == pytest.approx(coax.energy(z_s - z_su, sup.p0), rel=1e-4)
    assert math.isnan(t.loc[units[5].name, "cond"])


def test_wake_up_norms_match_a_manual_computation(tiny_gpt2):
    b = tiny_gpt2
    tokens = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    h = Component(1, 2)
    _, cache = b.run_with_cache(tokens, names_filter=lambda n: n == "blocks.1.attn.hook_z")
    z = cache["blocks.1.attn.hook_z"][:, :, 2, :]
    manual = float((z @ b.blocks[1].attn.W_O[2]).norm(dim=-1).mean().detach())
    assert coax.head_output_norms(b, tokens, [h])["L1H2"] == pytest.approx(manual, rel=1e-5)
    r = coax.wake_up_ratios(b, tokens, [h, Component(0, 1)], [Component(0, 0)])
    assert r["L0H1"] == pytest.approx(1.0, abs=1e-6)  # same layer: cannot react
    assert r["L1H2"] != pytest.approx(1.0, abs=1e-6)


def test_fisher_weight_floors_p0_at_1e_12_as_the_release():
    """d = sqrt(max(p0, 1e-12)) (dz - E_p0[dz]), the mean with p0 itself (release 2.1.0:
    torch.sqrt(p.clamp_min(1e-12))); by hand for p0 with a 0 and a 1e-30 entry."""
    p0 = torch.tensor([[0.5, 0.5 - 1e-30, 1e-30, 0.0]], dtype=torch.float64)
    dz = torch.tensor([[1.0, 2.0, 3.0, 5.0]], dtype=torch.float64)
    mean = 0.5 * 1.0 + (0.5 - 1e-30) * 2.0 + 1e-30 * 3.0  # = 1.5 in float64
    want = torch.tensor(
        [[math.sqrt(0.5) * (1.0 - mean), math.sqrt(0.5) * (2.0 - mean), 1e-6 * (3.0 - mean), 1e-6 * (5.0 - mean)]],
        dtype=torch.float64,
    )
    got = coax.features(dz, p0)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    unclamped = p0.sqrt() * (dz - mean)  # 1.5e-15 and 0 in the last two entries
    assert float(unclamped[0, 2]) == pytest.approx(1.5e-15) and float(unclamped[0, 3]) == 0.0
    assert float(got[0, 2]) == pytest.approx(1.5e-6) and float(got[0, 3]) == pytest.approx(3.5e-6)
    assert coax.energy(dz, p0) == pytest.approx(0.25 + 1e-12 * (1.5**2 + 3.5**2), rel=0, abs=1e-16)  # 0.25 unclamped
    # above the floor nothing changes
    q = torch.softmax(torch.tensor([[0.3, -1.0, 2.0]]), -1)
    d = torch.tensor([[0.5, 1.0, -2.0]])
    assert torch.equal(coax.features(d, q), q.sqrt() * (d - (q * d).sum(-1, keepdim=True)))
