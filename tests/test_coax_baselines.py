"""Paper B's baselines: AtP, EAP-IG, AtP* GradDrop (head level), and the pruning scores."""

import pytest
import torch

from coax_toys import LinearHeads
from selfrepair.coax import baselines, pruning
from selfrepair.core.components import head_components
from selfrepair.core.interventions import run_ablated

torch.set_num_threads(1)


def metric(logits):
    return logits[:, :, 0].sum(1).mean() + 0.5 * logits[:, -1, 2].mean()


@pytest.fixture
def linear():
    m = LinearHeads(vocab=4, n_heads=2, d_head=2)
    tokens = torch.randint(0, 7, (5, 3), generator=torch.Generator().manual_seed(0))
    return m, tokens, head_components(2, 2)


def _direct(m, tokens, h):
    """Effect on the metric of removing only the head's own write to the logits (linear)."""
    with torch.no_grad():
        z0 = m.emb[tokens]
        if h.layer == 0:
            write = torch.einsum("btd,dm->btm", z0[:, :, h.head], m.blocks[0].attn.W_O[h.head])
        else:
            o0 = torch.einsum("bthd,hdm->btm", z0, m.blocks[0].attn.W_O)
            z1 = torch.einsum("btm,mhd->bthd", o0, m.read)
            write = torch.einsum("btd,dm->btm", z1[:, :, h.head], m.blocks[1].attn.W_O[h.head])
    return -float(metric(write))


def test_atp_and_eap_ig_against_finite_differences_on_a_linear_toy(linear):
    m, tokens, heads = linear
    vals = run_ablated(m, tokens, [[]] + [[h] for h in heads], reduce=lambda lg: float(metric(lg)))
    exact = {h.name: v - vals[0] for h, v in zip(heads, vals[1:])}
    a = baselines.atp(m, tokens, heads, metric)
    ig = baselines.eap_ig(m, tokens, heads, metric, steps=5)
    for h in heads:
        assert abs(exact[h.name]) > 1e-3
        # AtP is exact for a model linear in z
        assert a[h.name] == pytest.approx(exact[h.name], rel=1e-4, abs=1e-5)
        # IG on the all-heads path: a layer-0 head's effect through layer 1 is met at
        # alpha * z1, so it gets direct + (1/2) indirect; a layer-1 head gets its total
        d = _direct(m, tokens, h)
        want = d + 0.5 * (exact[h.name] - d) if h.layer == 0 else exact[h.name]
        assert ig[h.name] == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_graddrop_by_hand_on_a_linear_toy(linear):
    m, tokens, heads = linear
    vals = run_ablated(m, tokens, [[]] + [[h] for h in heads], reduce=lambda lg: float(metric(lg)))
    total = {h.name: v - vals[0] for h, v in zip(heads, vals[1:])}
    gd = baselines.atp_star_graddrop(m, tokens, heads, metric)
    for h in heads:
        if h.layer == 0:
            # drop layer 0: own gradient cut (0); drop layer 1: only the direct path remains
            assert gd[h.name] == pytest.approx(abs(_direct(m, tokens, h)) / 1, rel=1e-4)
        else:
            # drop layer 0: the full effect (layer-1 heads do not pass through layer 0); drop 1: 0
            assert gd[h.name] == pytest.approx(abs(total[h.name]), rel=1e-4)


def test_graddrop_cuts_the_own_layer_on_a_bridged_gpt2(tmp_path):
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model

    model = build_gpt2_toy(
        gpt2_toy_config(vocab_size=30, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=8), seed=0, positional=True
    )
    save_model(model, tmp_path / "m")
    b = load_bridge(tmp_path / "m")
    tokens = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(0))
    f = lambda lg: lg[:, -1, 1].mean()  # noqa: E731
    for layer in range(2):
        zg = baselines._grads(b, tokens, [0, 1], f, drop_layer=layer)
        assert zg[f"blocks.{layer}.attn.hook_z"][1].abs().max() == 0
        assert zg[f"blocks.{1 - layer}.attn.hook_z"][1].abs().max() > 0 or layer == 0
    # AtP on the bridge agrees with the hooked gradient of a plain HF forward
    heads = head_components(2, 2)
    a = baselines.atp(b, tokens, heads, f)
    vals = run_ablated(b, tokens, [[]] + [[h] for h in heads], reduce=lambda lg: float(f(lg)))
    for h, v in zip(heads, vals[1:]):
        assert a[h.name] == pytest.approx(v - vals[0], abs=0.05 + 0.5 * abs(v - vals[0]))


def test_pruning_scores_by_hand(linear):
    m, tokens, heads = linear
    mag = pruning.magnitude_scores(m, heads)
    assert mag["L0H1"] == pytest.approx(float(m.blocks[0].attn.W_O[1].norm()))
    wanda = pruning.wanda_scores(m, tokens, heads)
    z = m.emb[tokens][:, :, 1].detach().reshape(-1, 2)  # layer-0 head 1, d_head 2
    by_hand = sum(float(m.blocks[0].attn.W_O[1][i].abs().sum() * z[:, i].norm()) for i in range(2))
    assert wanda["L0H1"] == pytest.approx(by_hand, rel=1e-5)
    # Taylor: sum over sequences of |z . dL/dz|, L = the metric (a mean over sequences)
    tay = pruning.taylor_scores(m, tokens, heads, metric)
    per_seq = []
    for i in range(tokens.shape[0]):
        one = tokens[i : i + 1]
        vals = run_ablated(m, one, [[], [heads[0]]], reduce=lambda lg: float(metric(lg)))
        per_seq.append(abs(vals[1] - vals[0]))  # linear: |z . g| is the exact per-sequence effect
    assert tay["L0H0"] == pytest.approx(sum(per_seq) / tokens.shape[0], rel=1e-4)
