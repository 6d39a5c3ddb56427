"""Paper B's baselines: AtP, EAP-IG, AtP* GradDrop (head level), the release-2.1.0
baselines (AtP averaging magnitudes, conditional gradient, two-state AtP*, amplification
ratio), and the pruning scores."""

import math

import pandas as pd
import pytest
import torch

from coax_toys import LinearHeads, PlantedBackup
from selfrepair.coax import baselines, pruning
from selfrepair.coax import score as coax
from selfrepair.core.components import head_components, parse
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


@pytest.fixture(scope="module")
def gpt2_bridge(tmp_path_factory):
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model

    model = build_gpt2_toy(
        gpt2_toy_config(vocab_size=30, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=8), seed=0, positional=True
    )
    folder = tmp_path_factory.mktemp("gd") / "m"
    save_model(model, folder)
    return load_bridge(folder)


def test_graddrop_cuts_the_own_layer_on_a_bridged_gpt2(gpt2_bridge):
    b = gpt2_bridge
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


def test_graddrop_keeps_the_residual_skip_gradient_on_a_bridged_gpt2(gpt2_bridge):
    """Dropping layer 1 detaches only its attention and MLP outputs: layer 0's gradient is
    then that of the model with those two outputs frozen at their clean values (the
    residual skip past layer 1 still carries it), checked against central finite
    differences of that frozen model; without the drop, against the full model."""
    b = gpt2_bridge
    tokens = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(0))
    f = lambda lg: lg[:, -1, 1].mean()  # noqa: E731
    z0, dropped = baselines._grads(b, tokens, [0], f, drop_layer=1)["blocks.0.attn.hook_z"]
    full = baselines._grads(b, tokens, [0], f)["blocks.0.attn.hook_z"][1]
    names = ("blocks.1.hook_attn_out", "blocks.1.hook_mlp_out")
    with torch.no_grad():
        _, cache = b.run_with_cache(tokens, names_filter=lambda n: n in names)
    frozen = {n: cache[n].detach().clone() for n in names}
    delta = torch.randn(z0.shape, generator=torch.Generator().manual_seed(1))

    def slope(freeze: bool, h: float = 1e-2) -> float:  # d/dh f(z0 + h delta) at h = 0
        def at(eps):
            hooks = [("blocks.0.attn.hook_z", lambda x, hook: x + eps * delta)]
            hooks += [(n, lambda x, hook, n=n: frozen[n]) for n in names] if freeze else []
            with torch.no_grad():
                return float(f(b.run_with_hooks(tokens, fwd_hooks=hooks)))

        return (at(h) - at(-h)) / (2 * h)

    s_frozen, s_full = slope(True), slope(False)
    assert abs(s_frozen) > 1e-3 and abs(s_full - s_frozen) > 1e-3  # both paths carry signal
    assert float((dropped * delta).sum()) == pytest.approx(s_frozen, rel=5e-3)
    assert float((full * delta).sum()) == pytest.approx(s_full, rel=5e-3)


def test_gradient_baselines_run_on_a_frozen_model(gpt2_bridge):
    """A model whose parameters do not require gradients gets the same scores."""
    b = gpt2_bridge
    tokens = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(2))
    f = lambda lg: lg[:, -1, 1].mean()  # noqa: E731
    heads, S = head_components(2, 2), [parse("L0H0")]

    def scores():
        return (
            baselines.atp(b, tokens, heads, f),
            baselines.eap_ig(b, tokens, heads, f, steps=2),
            baselines.cond_grad(b, tokens, heads, S, f),
            baselines.atp_star_2s(b, tokens, heads, S, f),
        )

    want = scores()
    flags = [p.requires_grad for p in b.parameters()]
    try:
        for p in b.parameters():
            p.requires_grad_(False)
        got = scores()
    finally:
        for p, flag in zip(b.parameters(), flags):
            p.requires_grad_(flag)
    for g, w in zip(got, want):
        assert list(g.values()) == pytest.approx(list(w.values()), rel=1e-6, abs=1e-9, nan_ok=True)


# The planted dormant backup (coax_toys.PlantedBackup): P = L0H0 writes a u, I = L0H1 writes
# 0.3 v, L0H2 and L1H1 are silent, B = L1H0 writes relu(a - z_P) u (0 until P is ablated).
# The metric reads the last position's logits along W; everything downstream of a head is
# linear, so AtP at either state is that state's exact ablation effect.
W = torch.tensor([1.0, -0.5, 0.25, 2.0, -1.0])


def read_w(lg):
    return (lg[:, -1, :] @ W).mean()


def _planted():
    m = PlantedBackup(vocab=5, a=1.0)
    tokens = torch.zeros(4, 3, dtype=torch.long)
    return m, tokens, [parse(n) for n in ("L0H0", "L0H1", "L0H2", "L1H0", "L1H1")]


def test_cond_grad_and_two_state_atp_star_find_the_dormant_backup_by_hand():
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    u, v = m.blocks[0].attn.W_O.detach()[0, 0], m.blocks[0].attn.W_O.detach()[1, 0]
    uw, vw = float(u @ W), float(v @ W)
    assert abs(uw) > 0.1 and abs(vw) > 0.1
    heads = [I, Z, B, Z2]
    # clean: B is silent, so the clean-state gradient scores give it 0
    assert baselines.atp(m, tokens, heads, read_w)["L1H0"] == 0.0
    assert baselines.atp_star_graddrop(m, tokens, heads, read_w)["L1H0"] == 0.0
    cg = baselines.cond_grad(m, tokens, [P] + heads, [P], read_w)
    # with P ablated, B writes a u (a = 1): removing it changes the metric by -u.W
    assert cg["L1H0"] == pytest.approx(-uw, rel=1e-6)
    assert cg["L0H1"] == pytest.approx(-0.3 * vw, rel=1e-6)  # I's own write, the same in both states
    assert cg["L0H2"] == 0.0 and cg["L1H1"] == 0.0 and math.isnan(cg["L0H0"])
    # the exact conditional effects L(S + h) - L(S), forward only
    vals = run_ablated(m, tokens, [[P]] + [[P, h] for h in heads], reduce=lambda lg: float(read_w(lg)))
    for h, val in zip(heads, vals[1:]):
        assert cg[h.name] == pytest.approx(val - vals[0], abs=1e-6)
    # AtP* with P ablated: B's gradient survives dropping layer 0, not layer 1 ->
    # |u.W| / (L - 1) = |u.W|, against 0 clean; I's survives dropping layer 1 only, in
    # both states (|0.3 v.W|) -> growth 0
    two = baselines.atp_star_2s(m, tokens, [P] + heads, [P], read_w)
    assert two["L1H0"] == pytest.approx(abs(uw), rel=1e-6)
    assert two["L0H1"] == pytest.approx(0.0, abs=1e-7)
    assert baselines.atp_star_graddrop(m, tokens, [I], read_w)["L0H1"] == pytest.approx(0.3 * abs(vw), rel=1e-6)
    assert two["L0H2"] == 0.0 and two["L1H1"] == 0.0 and math.isnan(two["L0H0"])


def test_cond_grad_is_the_exact_conditional_effect_on_a_linear_toy(linear):
    m, tokens, heads = linear
    S = [heads[0]]
    f = lambda lg: float(metric(lg))  # noqa: E731
    cg = baselines.cond_grad(m, tokens, heads, S, metric)
    vals = run_ablated(m, tokens, [S] + [S + [h] for h in heads[1:]], reduce=f)
    for h, val in zip(heads[1:], vals[1:]):
        assert abs(val - vals[0]) > 1e-3
        assert cg[h.name] == pytest.approx(val - vals[0], rel=1e-4, abs=1e-5)
    assert math.isnan(cg["L0H0"])
    a = baselines.atp(m, tokens, heads, metric)
    # layer 1 reads L0H0's output: its heads' effects change once L0H0 is gone; L0H1's,
    # additive in a linear model, does not
    for h in heads[2:]:
        assert abs(cg[h.name] - a[h.name]) > 1e-3
    assert cg["L0H1"] == pytest.approx(a["L0H1"], rel=1e-5)


def test_atp_mag_averages_magnitudes_while_atp_and_eap_ig_aggregate_signs():
    """A head whose per-prompt effects have opposite signs: AtP and EAP-IG take the signed
    mean over prompts (they cancel), atp_mag the mean of the magnitudes."""
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    v = m.blocks[0].attn.W_O.detach()[1, 0]
    k = int(v.abs().argmax())
    for signs in ([1.0, -1.0, 1.0, -1.0], [1.0, -1.0, 1.0, 1.0]):
        s = torch.tensor(signs)
        f = lambda lg, s=s: (s * lg[:, -1, k]).mean()  # noqa: E731
        # removing I (it writes 0.3 v) moves prompt b's metric by -0.3 v[k] s_b
        per_prompt = [-0.3 * float(v[k]) * x for x in signs]
        signed, mag = sum(per_prompt) / 4, sum(abs(x) for x in per_prompt) / 4
        assert baselines.atp(m, tokens, [I], f)["L0H1"] == pytest.approx(signed, abs=1e-7)
        assert baselines.eap_ig(m, tokens, [I], f, steps=3)["L0H1"] == pytest.approx(signed, abs=1e-7)
        assert baselines.atp_mag(m, tokens, [I], f)["L0H1"] == pytest.approx(mag, rel=1e-6)
        assert mag > abs(signed) + 0.05
    # discovery ranks the magnitude of the signed aggregates, atp_mag as it is
    t = pd.DataFrame({"atp": [-0.5, 0.2], "eap_ig": [-0.5, 0.2], "atp_mag": [0.5, 0.7]})
    D = baselines.DISCOVERY_METHODS
    assert list(D["atp"](t)) == [0.5, 0.2] and list(D["eap_ig"](t)) == [0.5, 0.2]
    assert list(D["atp_mag"](t)) == [0.5, 0.7]


def test_atp_mag_is_the_mean_per_prompt_magnitude_on_a_linear_toy(linear):
    m, tokens, heads = linear
    mag = baselines.atp_mag(m, tokens, heads, metric)
    a = baselines.atp(m, tokens, heads, metric)
    cancels = 0
    for h in heads:
        per = []
        for i in range(tokens.shape[0]):  # each prompt alone: its exact effect (linear model)
            vals = run_ablated(m, tokens[i : i + 1], [[], [h]], reduce=lambda lg: float(metric(lg)))
            per.append(vals[1] - vals[0])
        assert mag[h.name] == pytest.approx(sum(abs(x) for x in per) / len(per), rel=1e-4)
        assert a[h.name] == pytest.approx(sum(per) / len(per), rel=1e-4, abs=1e-5)
        cancels += min(per) < 0 < max(per)
    assert cancels > 0  # some head's prompts disagree in sign, so the two conventions differ


def test_amp_ratio_by_hand():
    nan = float("nan")
    t = pd.DataFrame(
        {"unit": ["L0H0", "L1H0", "L1H1", "L1H2"], "single": [0.8, 0.5, 0.0, 1.0], "cond": [nan, 0.5, 0.3, 2.0]}
    )
    # candidates (units with a cond; L0H0 is in S): mean single (0.5 + 0 + 1) / 3 = 0.5
    r = baselines.amp_ratio(t, amp_eps=0.1)  # eps = 0.05
    assert r["L1H0"] == pytest.approx(10 / 11) and r["L1H1"] == pytest.approx(6.0)
    assert r["L1H2"] == pytest.approx(40 / 21) and math.isnan(r["L0H0"])
    d = baselines.amp_ratio(t)  # amp_eps = 1e-3: eps = 5e-4
    assert d["L1H1"] == pytest.approx(600.0) and d["L1H0"] == pytest.approx(0.5 / 0.5005)
    assert d["L1H2"] == pytest.approx(2.0 / 1.0005)
    for bad in (0.0, -1e-3, nan):
        with pytest.raises(ValueError, match="amp_eps must be > 0"):
            baselines.amp_ratio(t, amp_eps=bad)
    with pytest.raises(ValueError, match="negative single or cond for L1H1"):
        baselines.amp_ratio(t.assign(cond=[nan, 0.5, -0.1, 2.0]))
    with pytest.raises(ValueError, match="negative single or cond for L0H0"):
        baselines.amp_ratio(t.assign(single=[-0.8, 0.5, 0.0, 1.0]))
    with pytest.raises(ValueError, match="eps = amp_eps x mean single"):
        baselines.amp_ratio(t.assign(single=[0.8, 0.0, 0.0, 0.0]))


def test_all_scores_threads_the_primaries_and_keeps_the_old_columns():
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    cands = [I, Z, B, Z2]
    sc = coax.scan(m, tokens, cands, [P], protocol="v2")
    t = baselines.all_scores(m, tokens, cands, read_w, sc.table, ig_steps=3, primaries=[P])
    assert list(t.columns) == [
        "unit", "single", "atp", "eap_ig", "atp_star", "cond", "comp",
        "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio",
    ]  # fmt: skip
    ti = t.set_index("unit")
    standalone = {
        "atp": baselines.atp(m, tokens, cands, read_w),
        "eap_ig": baselines.eap_ig(m, tokens, cands, read_w, steps=3),
        "atp_star": baselines.atp_star_graddrop(m, tokens, cands, read_w),
        "atp_mag": baselines.atp_mag(m, tokens, cands, read_w),
        "cond_grad": baselines.cond_grad(m, tokens, cands, [P], read_w),
        "atp_star_2s": baselines.atp_star_2s(m, tokens, cands, [P], read_w),
        "amp_ratio": baselines.amp_ratio(sc.table),
    }
    for col, want in standalone.items():
        # the same functions on the same inputs: equal up to float32 rounding (rel 1e-6,
        # ~8 ulps; abs 1e-9 for the exact zeros of the silent heads). A wrong column or
        # primaries not threaded through moves these by 0.04 or more (the scores: 0, 0.04,
        # 0.73, 0.89, 1.0)
        assert ti[col].to_dict() == pytest.approx(want, rel=1e-6, abs=1e-9), col
    D = baselines.DISCOVERY_METHODS
    assert list(D) == [
        "single", "atp", "eap_ig", "atp_star", "coax", "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio"
    ]  # fmt: skip
    b = list(t["unit"]).index("L1H0")
    for mth in ("atp", "atp_mag", "eap_ig", "atp_star"):  # clean-state scores miss it
        assert D[mth](t).iloc[b] == 0.0, mth  # B's clean z is relu(1 - 1) = 0 exactly: z . g = 0
    # B's single energy is a quadratic form in the logit change of its ablated run (a
    # batched forward) against the clean run: 0 up to float32 rounding of the logits
    # (~1e-7, squared ~1e-14; 2.8e-17 measured), while I's is 0.04 and B's cond 0.89
    single = D["single"](t)
    assert abs(single.iloc[b]) <= 1e-9 * single.drop(index=b).abs().max()
    for mth in ("cond_grad", "atp_star_2s", "amp_ratio", "coax"):  # the conditional ones rank it first
        s = D[mth](t)
        assert s.iloc[b] > 0 and s.drop(index=b).max() < s.iloc[b], mth
    with pytest.raises(TypeError, match="primaries"):
        baselines.all_scores(m, tokens, cands, read_w, sc.table)
