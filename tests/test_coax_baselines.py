"""Paper B's baselines (the COAX authors' release 2.1.0 definitions): AtP (signed, ours,
and averaging magnitudes), activation-space EAP-IG, AtP* GradDrop, the conditional
gradient, two-state AtP and AtP*, the amplification ratio; and the pruning scores.

The per-prompt tests recompute every score one prompt at a time with their own hooks
(a leaf tensor in place of the scored layer's z, the GradDrop as resid_post = resid_pre +
(resid_post - resid_pre).detach(), the ablation as a mask), not with baselines._grads."""

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
        # IG interpolating one layer at a time, the later layers recomputed from it: the
        # metric is linear along that path, so IG is the whole (signed, batch) effect, in
        # magnitude, at any number of steps
        assert ig[h.name] == pytest.approx(abs(exact[h.name]), rel=1e-4, abs=1e-5)
        if h.layer == 0:  # an indirect path through layer 1: scaling every layer at once
            # (the old path) would have met it at alpha z1 and given it half weight
            assert abs(exact[h.name] - _direct(m, tokens, h)) > 1e-3


def _per_prompt_effects(m, tokens, h):
    """Each prompt alone: (its exact single-ablation effect, its direct effect) on the
    linear toy (the metric is a mean over the batch: one prompt, its own metric)."""
    out = []
    for i in range(tokens.shape[0]):
        one = tokens[i : i + 1]
        vals = run_ablated(m, one, [[], [h]], reduce=lambda lg: float(metric(lg)))
        out.append((vals[1] - vals[0], _direct(m, one, h)))
    return out


def test_graddrop_by_hand_on_a_linear_toy(linear):
    """Per prompt, sum over the dropped layers of |AtP_l| / (L - 1), then the mean over
    prompts: for L = 2 one of the two drops leaves each head's gradient."""
    m, tokens, heads = linear
    gd = baselines.atp_star_graddrop(m, tokens, heads, metric)
    cancels = 0
    for h in heads:
        per = _per_prompt_effects(m, tokens, h)
        # layer 0: dropping layer 0 cuts its own gradient, dropping layer 1 leaves the
        # direct path; layer 1: dropping layer 0 leaves the whole effect, dropping 1 cuts it
        kept = [d if h.layer == 0 else tot for tot, d in per]
        assert gd[h.name] == pytest.approx(sum(abs(x) for x in kept) / len(kept), rel=1e-4)
        cancels += sum(abs(x) for x in kept) / len(kept) > abs(sum(kept) / len(kept)) + 1e-2
    assert cancels > 0  # the magnitude of the prompts' mean (the old aggregation) differs


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


def _prompt_grad(b, one, f, layer, ablate=(), drop=None, alpha=1.0):
    """(z, df/dz) of layer ``layer``'s hook_z for one prompt ``one`` [1, T]: that z is
    replaced by the leaf alpha x z (the layers after it recomputed from the leaf), the
    heads ``ablate`` are multiplied by 0, and layer ``drop``'s residual contribution is
    detached (resid_post := resid_pre + (resid_post - resid_pre).detach())."""
    leaf, pre = {}, {}

    def z_hook(lyr):
        def fn(x, hook):
            mask = torch.ones(x.shape[2])
            for c in ablate:
                if c.layer == lyr:
                    mask[c.head] = 0.0
            x = x * mask[:, None]
            if lyr == layer:
                leaf["z"] = (alpha * x).detach().requires_grad_(True)
                return leaf["z"]
            return x

        return fn

    hooks = [(f"blocks.{lyr}.attn.hook_z", z_hook(lyr)) for lyr in range(b.cfg.n_layers)]
    if drop is not None:
        hooks += [
            (f"blocks.{drop}.hook_resid_pre", lambda x, hook: pre.setdefault("x", x)),
            (f"blocks.{drop}.hook_resid_post", lambda x, hook: pre["x"] + (x - pre["x"]).detach()),
        ]
    with torch.enable_grad():
        out = f(b.run_with_hooks(one, fwd_hooks=hooks))
        (g,) = torch.autograd.grad(out, [leaf["z"]], allow_unused=True)  # None: z's layer dropped
    return leaf["z"].detach(), torch.zeros_like(leaf["z"]) if g is None else g


def _prompt_atp(b, tokens, f, heads, **kw):
    """{head: [AtP_b per prompt b]}, AtP_b = -z . df_b/dz, one prompt at a time."""
    out = {h.name: [] for h in heads}
    for i in range(tokens.shape[0]):
        for layer in sorted({h.layer for h in heads}):
            z, g = _prompt_grad(b, tokens[i : i + 1], f, layer, **kw)
            for h in heads:
                if h.layer == layer:
                    out[h.name].append(-float((z[0, :, h.head] * g[0, :, h.head]).sum()))
    return out


def _mean(xs):
    return sum(xs) / len(xs)


def _mean_abs(xs):
    return sum(abs(x) for x in xs) / len(xs)


GPT2_TOKENS = torch.randint(0, 30, (5, 6), generator=torch.Generator().manual_seed(3))


def diff_metric(lg):  # a mean over prompts of a per-prompt metric
    return (lg[:, -1, 1] - lg[:, -1, 2]).mean()


def _close(got: dict, want: dict, names):
    """Batched against one prompt at a time, float32: 5e-10 apart measured on scores of
    5e-4..6e-3, so rel 1e-5 and abs 1e-8 (>= 20x) still tell apart what the checks below
    require to differ (>= 4e-6)."""
    assert [got[n] for n in names] == pytest.approx([want[n] for n in names], rel=1e-5, abs=1e-8)


def test_atp_cond_grad_and_atp_2s_against_per_prompt_brute_force(gpt2_bridge):
    """atp: the signed mean of AtP_b; atp_mag: the mean of |AtP_b|; cond_grad: the mean
    of |AtP_b| with S ablated; atp_2s: their difference (NaN in S)."""
    b, tokens, f = gpt2_bridge, GPT2_TOKENS, diff_metric
    heads, S = head_components(2, 2), [parse("L0H1")]
    intact = _prompt_atp(b, tokens, f, heads)
    cond = _prompt_atp(b, tokens, f, heads, ablate=S)
    names = [h.name for h in heads]
    outside = [n for n in names if n != "L0H1"]
    _close(baselines.atp(b, tokens, heads, f), {n: _mean(v) for n, v in intact.items()}, names)
    _close(baselines.atp_mag(b, tokens, heads, f), {n: _mean_abs(v) for n, v in intact.items()}, names)
    cg = baselines.cond_grad(b, tokens, heads, S, f)
    _close(cg, {n: _mean_abs(v) for n, v in cond.items()}, outside)
    two = baselines.atp_2s(b, tokens, heads, S, f)
    _close(two, {n: _mean_abs(cond[n]) - _mean_abs(intact[n]) for n in names}, outside)
    assert math.isnan(cg["L0H1"]) and math.isnan(two["L0H1"])
    # prompts of opposite sign: |mean| (the old cond_grad) is below the mean magnitude
    assert max(_mean_abs(cond[n]) - abs(_mean(cond[n])) for n in outside) > 1e-2 * max(map(_mean_abs, cond.values()))


def _prompt_atp_star(b, tokens, f, heads, ablate=()):
    """{head: mean over prompts of sum over the dropped layers of |AtP_b,l| / (L - 1)},
    with the heads ``ablate`` ablated; and the old aggregation sum_l |mean_b AtP_b,l| / (L - 1)."""
    n = b.cfg.n_layers
    per = [_prompt_atp(b, tokens, f, heads, ablate=ablate, drop=lyr) for lyr in range(n)]
    new = {h.name: sum(_mean_abs(p[h.name]) for p in per) / (n - 1) for h in heads}
    old = {h.name: sum(abs(_mean(p[h.name])) for p in per) / (n - 1) for h in heads}
    return new, old


def test_atp_star_and_two_state_atp_star_against_per_prompt_brute_force(gpt2_bridge):
    b, tokens, f = gpt2_bridge, GPT2_TOKENS, diff_metric
    heads, S = head_components(2, 2), [parse("L0H1")]
    names = [h.name for h in heads]
    outside = [n for n in names if n != "L0H1"]
    want, old = _prompt_atp_star(b, tokens, f, heads)
    want_s, _ = _prompt_atp_star(b, tokens, f, heads, ablate=S)
    gd = baselines.atp_star_graddrop(b, tokens, heads, f)
    _close(gd, want, names)
    assert max(want[n] - old[n] for n in names) > 1e-2 * max(want.values())  # per-prompt magnitudes matter here
    gd_s = baselines.atp_star_graddrop(b, tokens, heads, f, ablate=S)
    _close(gd_s, want_s, outside)
    assert gd_s["L0H1"] == 0.0  # its z is 0 in the ablated state
    two = baselines.atp_star_2s(b, tokens, heads, S, f)
    _close(two, {n: want_s[n] - want[n] for n in names}, outside)
    assert math.isnan(two["L0H1"])


def _prompt_eap_ig(b, tokens, f, layer, steps):
    """{head of ``layer``: |mean over prompts of -z_clean . mean_k df_b/dz|}, the layer's z
    set to (k / steps) z_clean, one prompt at a time."""
    signed = {}
    for i in range(tokens.shape[0]):
        one = tokens[i : i + 1]
        zc, _ = _prompt_grad(b, one, f, layer)
        gbar = sum(_prompt_grad(b, one, f, layer, alpha=k / steps)[1] for k in range(1, steps + 1)) / steps
        for hd in range(zc.shape[2]):
            signed.setdefault(f"L{layer}H{hd}", []).append(-float((zc[0, :, hd] * gbar[0, :, hd]).sum()))
    return {n: abs(_mean(v)) for n, v in signed.items()}


def test_eap_ig_against_a_per_layer_brute_force(gpt2_bridge):
    b, tokens, f = gpt2_bridge, GPT2_TOKENS, diff_metric
    heads = head_components(2, 2)
    names = [h.name for h in heads]
    ig = baselines.eap_ig(b, tokens, heads, f, steps=3)
    want = {**_prompt_eap_ig(b, tokens, f, 0, 3), **_prompt_eap_ig(b, tokens, f, 1, 3)}
    _close(ig, want, names)
    # one step is the clean state: |signed mean AtP|
    a = baselines.atp(b, tokens, heads, f)
    one = baselines.eap_ig(b, tokens, heads, f, steps=1)
    assert [one[n] for n in names] == pytest.approx([abs(a[n]) for n in names], rel=1e-5)
    # the model is not linear along the path: the steps matter (2e-5 here)
    assert max(abs(ig[n] - one[n]) for n in names) > 1e-3 * max(ig.values())
    with pytest.raises(ValueError, match="steps >= 1"):
        baselines.eap_ig(b, tokens, heads, f, steps=0)


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


def test_cond_grad_and_two_state_scores_find_the_dormant_backup_by_hand():
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    u, v = m.blocks[0].attn.W_O.detach()[0, 0], m.blocks[0].attn.W_O.detach()[1, 0]
    uw, vw = float(u @ W), float(v @ W)
    assert abs(uw) > 0.1 and abs(vw) > 0.1
    heads = [I, Z, B, Z2]
    # clean: B is silent, so the clean-state gradient scores give it 0
    assert baselines.atp(m, tokens, heads, read_w)["L1H0"] == 0.0
    assert baselines.atp_star_graddrop(m, tokens, heads, read_w)["L1H0"] == 0.0
    cg = baselines.cond_grad(m, tokens, [P] + heads, [P], read_w)
    # with P ablated, B writes a u (a = 1): removing it changes each prompt's metric by -u.W
    assert cg["L1H0"] == pytest.approx(abs(uw), rel=1e-6)
    assert cg["L0H1"] == pytest.approx(0.3 * abs(vw), rel=1e-6)  # I's own write, the same in both states
    assert cg["L0H2"] == 0.0 and cg["L1H1"] == 0.0 and math.isnan(cg["L0H0"])
    # the exact conditional effects L(S + h) - L(S), forward only (every prompt the same)
    vals = run_ablated(m, tokens, [[P]] + [[P, h] for h in heads], reduce=lambda lg: float(read_w(lg)))
    for h, val in zip(heads, vals[1:]):
        assert cg[h.name] == pytest.approx(abs(val - vals[0]), abs=1e-6)
    # AtP* with P ablated: B's gradient survives dropping layer 0, not layer 1 ->
    # |u.W| / (L - 1) = |u.W|, against 0 clean; I's survives dropping layer 1 only, in
    # both states (|0.3 v.W|) -> growth 0
    two = baselines.atp_star_2s(m, tokens, [P] + heads, [P], read_w)
    assert two["L1H0"] == pytest.approx(abs(uw), rel=1e-6)
    assert two["L0H1"] == pytest.approx(0.0, abs=1e-7)
    assert baselines.atp_star_graddrop(m, tokens, [I], read_w)["L0H1"] == pytest.approx(0.3 * abs(vw), rel=1e-6)
    assert two["L0H2"] == 0.0 and two["L1H1"] == 0.0 and math.isnan(two["L0H0"])
    # two-state AtP: |u.W| - 0 for B, 0.3 |v.W| - 0.3 |v.W| for I
    a2 = baselines.atp_2s(m, tokens, [P] + heads, [P], read_w)
    assert a2["L1H0"] == pytest.approx(abs(uw), rel=1e-6) and a2["L0H1"] == pytest.approx(0.0, abs=1e-7)
    assert a2["L0H2"] == 0.0 and a2["L1H1"] == 0.0 and math.isnan(a2["L0H0"])


def test_cond_grad_is_the_mean_exact_conditional_magnitude_on_a_linear_toy(linear):
    m, tokens, heads = linear
    S = [heads[0]]
    f = lambda lg: float(metric(lg))  # noqa: E731
    cg = baselines.cond_grad(m, tokens, heads, S, metric)
    mag = baselines.atp_mag(m, tokens, heads, metric)
    for h in heads[1:]:
        per = []
        for i in range(tokens.shape[0]):  # each prompt alone: exact, the model is linear
            vals = run_ablated(m, tokens[i : i + 1], [S, S + [h]], reduce=f)
            per.append(vals[1] - vals[0])
        assert cg[h.name] == pytest.approx(_mean_abs(per), rel=1e-4, abs=1e-5)
    assert math.isnan(cg["L0H0"])
    # layer 1 reads L0H0's output: its heads' effects change once L0H0 is gone; L0H1's,
    # additive in a linear model, does not
    for h in heads[2:]:
        assert abs(cg[h.name] - mag[h.name]) > 1e-3
    assert cg["L0H1"] == pytest.approx(mag["L0H1"], rel=1e-5)


def test_prompts_of_opposite_sign_cancel_only_in_the_signed_aggregates():
    """A head whose per-prompt effects have opposite signs: atp and EAP-IG take the signed
    mean over prompts (they cancel), atp_mag, cond_grad and AtP* average magnitudes
    (|mean| over prompts, the old aggregation of the last two, would cancel too)."""
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    u, v = m.blocks[0].attn.W_O.detach()[0, 0], m.blocks[0].attn.W_O.detach()[1, 0]
    k = int(torch.minimum(u.abs(), v.abs()).argmax())
    assert min(abs(float(u[k])), abs(float(v[k]))) > 0.1
    cands = [I, Z, B, Z2]
    for signs in ([1.0, -1.0, 1.0, -1.0], [1.0, -1.0, 1.0, 1.0]):
        s = torch.tensor(signs)
        f = lambda lg, s=s: (s * lg[:, -1, k]).mean()  # noqa: E731
        # removing I (it writes 0.3 v) moves prompt b's metric by -0.3 v[k] s_b, in both
        # states; removing B with P ablated (it writes u) by -u[k] s_b
        mean_s = sum(signs) / 4
        signed, mag = -0.3 * float(v[k]) * mean_s, 0.3 * abs(float(v[k]))
        assert baselines.atp(m, tokens, [I], f)["L0H1"] == pytest.approx(signed, abs=1e-7)
        assert baselines.eap_ig(m, tokens, [I], f, steps=3)["L0H1"] == pytest.approx(abs(signed), abs=1e-7)
        assert baselines.atp_mag(m, tokens, [I], f)["L0H1"] == pytest.approx(mag, rel=1e-6)
        # AtP*: only dropping layer 1 leaves I's gradient, (L - 1) = 1
        assert baselines.atp_star_graddrop(m, tokens, [I], f)["L0H1"] == pytest.approx(mag, rel=1e-6)
        cg = baselines.cond_grad(m, tokens, cands, [P], f)
        assert cg["L0H1"] == pytest.approx(mag, rel=1e-6) and cg["L1H0"] == pytest.approx(abs(float(u[k])), rel=1e-6)
        two = baselines.atp_star_2s(m, tokens, cands, [P], f)
        assert two["L1H0"] == pytest.approx(abs(float(u[k])), rel=1e-6)
        a2 = baselines.atp_2s(m, tokens, cands, [P], f)
        assert a2["L1H0"] == pytest.approx(abs(float(u[k])), rel=1e-6) and a2["L0H1"] == pytest.approx(0, abs=1e-7)
        assert mag > abs(signed) + 0.05
    # discovery ranks the magnitude of our signed atp, the others as they are
    t = pd.DataFrame(
        {
            "atp": [-0.5, 0.2], "eap_ig": [0.5, 0.2], "atp_mag": [0.5, 0.7], "cond_grad": [0.9, 0.6],
            "atp_star": [0.1, 0.3], "atp_star_2s": [-0.2, 0.1], "amp_ratio": [0.0, 3.0],
        }
    )  # fmt: skip
    D = baselines.DISCOVERY_METHODS
    assert list(D["atp"](t)) == [0.5, 0.2] and list(D["eap_ig"](t)) == [0.5, 0.2]
    assert list(D["atp_mag"](t)) == [0.5, 0.7] and list(D["cond_grad"](t)) == [0.9, 0.6]
    assert list(D["atp_star_2s"](t)) == [-0.2, 0.1] and list(D["amp_ratio"](t)) == [0.0, 3.0]
    assert list(D["atp_2s"](t)) == pytest.approx([0.4, -0.1])  # cond_grad - atp_mag, signed


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
    # cond / single where single > 0; 0 where single = 0; NaN in S (L0H0, no cond)
    r = baselines.amp_ratio(t)
    assert r["L1H0"] == pytest.approx(1.0) and r["L1H2"] == pytest.approx(2.0)
    assert r["L1H1"] == 0.0 and math.isnan(r["L0H0"])
    tiny = baselines.amp_ratio(t.assign(single=[0.8, 0.5, 1e-12, 1.0]))  # no eps: a tiny single
    assert tiny["L1H1"] == pytest.approx(3e11)
    with pytest.raises(ValueError, match="negative single or cond for L1H1"):
        baselines.amp_ratio(t.assign(cond=[nan, 0.5, -0.1, 2.0]))


def test_amp_ratio_eps_by_hand():
    nan = float("nan")
    t = pd.DataFrame(
        {"unit": ["L0H0", "L1H0", "L1H1", "L1H2"], "single": [0.8, 0.5, 0.0, 1.0], "cond": [nan, 0.5, 0.3, 2.0]}
    )
    # candidates (units with a cond; L0H0 is in S): mean single (0.5 + 0 + 1) / 3 = 0.5
    r = baselines.amp_ratio_eps(t, amp_eps=0.1)  # eps = 0.05
    assert r["L1H0"] == pytest.approx(10 / 11) and r["L1H1"] == pytest.approx(6.0)
    assert r["L1H2"] == pytest.approx(40 / 21) and math.isnan(r["L0H0"])
    d = baselines.amp_ratio_eps(t)  # amp_eps = 1e-3: eps = 5e-4
    assert d["L1H1"] == pytest.approx(600.0) and d["L1H0"] == pytest.approx(0.5 / 0.5005)
    assert d["L1H2"] == pytest.approx(2.0 / 1.0005)
    for bad in (0.0, -1e-3, nan):
        with pytest.raises(ValueError, match="amp_eps must be > 0"):
            baselines.amp_ratio_eps(t, amp_eps=bad)
    with pytest.raises(ValueError, match="negative single or cond for L1H1"):
        baselines.amp_ratio_eps(t.assign(cond=[nan, 0.5, -0.1, 2.0]))
    with pytest.raises(ValueError, match="negative single or cond for L0H0"):
        baselines.amp_ratio_eps(t.assign(single=[-0.8, 0.5, 0.0, 1.0]))
    with pytest.raises(ValueError, match="eps = amp_eps x mean single"):
        baselines.amp_ratio_eps(t.assign(single=[0.8, 0.0, 0.0, 0.0]))


def test_all_scores_threads_the_primaries_and_keeps_the_old_columns():
    m, tokens, (P, I, Z, B, Z2) = _planted()  # noqa: E741
    cands = [I, Z, B, Z2]
    sc = coax.scan(m, tokens, cands, [P], protocol="v2")
    t = baselines.all_scores(m, tokens, cands, read_w, sc.table, ig_steps=3, primaries=[P], amp_eps=0.1)
    assert list(t.columns) == [
        "unit", "single", "atp", "eap_ig", "atp_star", "cond", "comp",
        "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio", "atp_2s", "amp_ratio_eps",
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
        "atp_2s": baselines.atp_2s(m, tokens, cands, [P], read_w),
        "amp_ratio_eps": baselines.amp_ratio_eps(sc.table, amp_eps=0.1),
    }
    for col, want in standalone.items():
        # the same functions on the same inputs: equal up to float32 rounding (rel 1e-6,
        # ~8 ulps; abs 1e-9 for the exact zeros of the silent heads). A wrong column or
        # primaries not threaded through moves these by 0.04 or more (the scores: 0, 0.04,
        # 0.73, 0.89, 1.0)
        assert ti[col].to_dict() == pytest.approx(want, rel=1e-6, abs=1e-9), col
    D = baselines.DISCOVERY_METHODS
    assert list(D) == [
        "single", "atp", "eap_ig", "atp_star", "coax", "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio", "atp_2s"
    ]  # fmt: skip
    # the heads outside S (run_ioi's candidates) get a finite score from every method
    for mth, rank in D.items():
        assert rank(t).notna().all(), mth
    assert list(D["atp_2s"](t)) == list(t["atp_2s"])  # from its two terms: the same numbers
    b = list(t["unit"]).index("L1H0")
    for mth in ("atp", "atp_mag", "eap_ig", "atp_star"):  # clean-state scores miss it
        assert D[mth](t).iloc[b] == 0.0, mth  # B's clean z is relu(1 - 1) = 0 exactly: z . g = 0
    # B's single energy is a quadratic form in the logit change of its ablated run (a
    # batched forward) against the clean run: 0 up to float32 rounding of the logits
    # (~1e-7, squared ~1e-14; 2.8e-17 measured), while I's is 0.04 and B's cond 0.89
    single = D["single"](t)
    assert abs(single.iloc[b]) <= 1e-9 * single.drop(index=b).abs().max()
    for mth in ("cond_grad", "atp_star_2s", "atp_2s", "coax"):  # the conditional ones rank it first
        s = D[mth](t)
        assert s.iloc[b] > 0 and s.drop(index=b).max() < s.iloc[b], mth
    # amp_ratio: cond / single, so B (single 0 up to rounding) is either first by far or,
    # when its single energy comes back exactly 0, scored 0 (the release's NaN -> 0)
    amp, cond_b, single_b = D["amp_ratio"](t).iloc[b], t["cond"].iloc[b], t["single"].iloc[b]
    assert amp == (cond_b / single_b if single_b > 0 else 0.0)
    with pytest.raises(TypeError, match="primaries"):
        baselines.all_scores(m, tokens, cands, read_w, sc.table)
