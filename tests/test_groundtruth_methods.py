"""The ground truth, wired: every method as a node score (checked against paper B's own baselines,
finite differences and paper A's G), one model's tables against brute force, and the
agreement tables and findings on hand-built inputs."""

import numpy as np
import pandas as pd
import pytest
import torch

from selfrepair.coax import baselines
from selfrepair.core import attribution, interventions, models
from selfrepair.core import components as C
from selfrepair.gim.backward import GIMConfig
from selfrepair.groundtruth import methods, pipeline
from selfrepair.groundtruth import tables as gt
from selfrepair.heroes import scores as heroes
from selfrepair.tasks import sequences as S
from shapley_brute import brute_force


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny paper-A GPT-2 (2 layers, 2 heads; PyTorch's default init), saved."""
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=32)
    folder = tmp_path_factory.mktemp("gtm") / "model"
    models.save_model(models.build_gpt2_toy(cfg, init="torch", seed=1), folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """The tiny model's bridge, a batch, its components and their means."""
    bridge = models.load_bridge(tiny_dir)
    batch = S.eval_set("sort", 4, 12, seed=3)
    comps = C.all_components(2, 2)
    means = interventions.component_means(bridge, [batch.tokens], comps)
    return bridge, batch, comps, means


def logprob(batch):
    return lambda lg: -heroes.lm_loss(lg, batch)


def test_atp_is_paper_b_baseline_as_a_drop(tiny):
    """Zero ablation of heads: paper B's atp estimates L(ablated) - L(clean); the node
    method estimates the drop, so they are the same numbers with the sign flipped. (Paper
    B's eap_ig now interpolates one layer at a time, the COAX release's path, and ranks
    a magnitude; the node method scales every component at once: no identity to check.)"""
    bridge, batch, comps, _ = tiny
    heads = [c for c in comps if c.is_head]
    metric = logprob(batch)
    ours = methods.atp(bridge, batch.tokens, heads, metric, "zero")
    ref = baselines.atp(bridge, batch.tokens, heads, metric)
    assert max(abs(v) for v in ref.values()) > 1e-3
    assert [ours[h.name] for h in heads] == pytest.approx([-ref[h.name] for h in heads], rel=1e-4, abs=1e-6)


def test_atp_is_the_first_order_drop_of_mean_ablation(tiny):
    """Moving one component's output a step eps toward its mean changes v by about
    -eps * atp (central finite difference, every component)."""
    bridge, batch, comps, means = tiny
    metric = logprob(batch)
    est = methods.atp(bridge, batch.tokens, comps, metric, "mean", means)
    eps = 1e-2

    def v_at(c, t):
        def hook(x, hook):
            b = means[c.hook].to(x.dtype)
            y = x + t * (b - x)
            if c.is_head:
                x = x.clone()
                x[:, :, c.head] = y[:, :, c.head]
                return x
            return y

        with torch.no_grad():
            return float(metric(bridge.run_with_hooks(batch.tokens, fwd_hooks=[(c.hook, hook)])))

    fd = {c.name: (v_at(c, -eps) - v_at(c, eps)) / (2 * eps) for c in comps}
    scale = max(abs(x) for x in fd.values())
    assert scale > 1e-2
    for c in comps:
        assert est[c.name] == pytest.approx(fd[c.name], abs=0.02 * scale)


def test_gim_without_modifications_is_atp_and_with_them_differs(tiny):
    bridge, batch, comps, means = tiny
    metric = logprob(batch)
    a = methods.atp(bridge, batch.tokens, comps, metric, "mean", means)
    plain = methods.gim_scores(bridge, batch.tokens, comps, metric, "mean", means, GIMConfig.none())
    full = methods.gim_scores(bridge, batch.tokens, comps, metric, "mean", means)
    assert [plain[c.name] for c in comps] == pytest.approx([a[c.name] for c in comps], rel=1e-5, abs=1e-7)
    assert max(abs(full[c.name] - a[c.name]) for c in comps) > 1e-3
    assert all(p.grad is None for p in bridge.parameters())


def test_grad_norms_are_heroes_g_and_leave_no_grad(tiny):
    bridge, batch, comps, _ = tiny
    ours = methods.grad_norms(bridge, batch.tokens, comps, logprob(batch), "sqrt")
    ref = attribution.gradient_norms(bridge, [batch], comps, heroes.lm_loss, "sqrt")
    bridge.zero_grad(set_to_none=True)
    assert [ours[c.name] for c in comps] == pytest.approx([ref[c.name][0] for c in comps], rel=1e-6)
    ours = methods.grad_norms(bridge, batch.tokens, comps, logprob(batch), "sqrt")
    assert all(p.grad is None for p in bridge.parameters())


def test_one_backward_pass_gives_both_normalizations_of_g(tiny):
    """The sqrt-normalized G derived from the raw norms (one backward pass) is the one
    gradient_norms computes under 'sqrt' (the same floats, one division each)."""
    bridge, batch, comps, _ = tiny
    raw = methods.grad_norms(bridge, batch.tokens, comps, logprob(batch), "raw")
    ref = methods.grad_norms(bridge, batch.tokens, comps, logprob(batch), "sqrt")
    got = methods.sqrt_normalized(raw, comps, bridge.cfg)
    assert [got[c.name] for c in comps] == pytest.approx([ref[c.name] for c in comps], rel=1e-12)
    # by hand: a head reads a d_model x d_head slice of W_V (32 x 16), an MLP W_out (64 x 32)
    assert got["L0H1"] == pytest.approx(raw["L0H1"] / np.sqrt(32 * 16), rel=1e-15)
    assert got["L1MLP"] == pytest.approx(raw["L1MLP"] / np.sqrt(64 * 32), rel=1e-15)


@pytest.mark.parametrize("mode,protocol", [("mean", "v2"), ("zero", "v1")])
def test_coax_on_the_engine_equals_the_scan_on_the_bridge(tiny, tiny_dir, mode, protocol):
    """COAX's single, cond and comp from the ablation engine's runs equal coax.scan's on
    the bridge to float rounding, with a seed and without (cond NaN inside the seed)."""
    bridge, batch, comps, means = tiny
    hf = models.load_hf(tiny_dir)
    for seed in ([comps[0], comps[3]], []):
        ref = methods.coax_scores(bridge, batch.tokens, comps, seed, mode, means, protocol, top_r=8)
        got = methods.coax_scores_engine(hf, batch.tokens, comps, seed, mode, means, protocol, top_r=8)
        assert set(got) == set(ref) == {"coax_single", "coax_cond", "coax_comp"}
        for k in ref:
            x = [ref[k][c.name] for c in comps]
            assert [got[k][c.name] for c in comps] == pytest.approx(x, rel=1e-4, abs=1e-7, nan_ok=True), k
        assert max(ref["coax_single"].values()) > 1e-3
        inside = {c.name for c in seed}
        assert all(np.isnan(got["coax_cond"][n]) == (n in inside or not seed) for n in got["coax_cond"])


def test_model_tables_on_a_tiny_model_against_brute_force(tiny):
    bridge, batch, comps, means = tiny
    specs = [
        pipeline.GameSpec("logprob", logprob(batch)),
        pipeline.GameSpec(
            "accuracy", lambda lg: heroes.exact_match(lg, batch.targets, batch.mask).float().mean(), False, 0.0
        ),
    ]
    t = pipeline.model_tables(bridge, batch.tokens, specs, comps, means, pipeline.Settings(mode="mean", n_primary=2))
    value, phi = brute_force(bridge, batch.tokens, comps, means, logprob(batch))
    s = t["shapley"][t["shapley"]["game"] == "logprob"].set_index("component")
    assert set(s["estimator"]) == {"exact"}
    assert s.loc[[c.name for c in comps], "shapley"].to_numpy() == pytest.approx(phi, abs=2e-5)
    e = frozenset()
    single = {c.name: value[e] - value[frozenset([c])] for c in comps}
    assert s.loc[[c.name for c in comps], "single"].to_numpy() == pytest.approx(list(single.values()), abs=2e-5)
    i = t["interactions"][t["interactions"]["game"] == "logprob"].set_index(["u", "v"])
    a, b = comps[0], comps[3]
    jmi = value[e] - value[frozenset([a, b])] - single[a.name] - single[b.name]
    assert i.loc[(a.name, b.name), "interaction"] == pytest.approx(jmi, abs=2e-5)
    assert np.isfinite(i["shapley_interaction"]).all()
    sc = t["scores"]
    want = {"single", "single_mean", "single_zero", *methods.GRADIENT_METHODS, *methods.COAX_METHODS}
    for game in ("logprob", "accuracy"):
        assert set(sc.loc[sc["game"] == game, "method"]) == want
    # the single method is each game's own drop; the gradient methods are shared
    acc_single = sc[(sc["game"] == "accuracy") & (sc["method"] == "single")].set_index("component")["score"]
    acc = t["shapley"][t["shapley"]["game"] == "accuracy"].set_index("component")["single"]
    assert acc_single.loc[acc.index].to_numpy() == pytest.approx(acc.to_numpy(), abs=1e-12)
    g = sc[sc["method"] == "atp"].pivot_table(index="component", columns="game", values="score")
    assert g["logprob"].to_numpy() == pytest.approx(g["accuracy"].to_numpy(), abs=0)
    # COAX: the two primaries (heads of largest single drop) have no cond / comp
    assert len(t["primaries"]) == 2 and all(C.parse(p).is_head for p in t["primaries"])
    comp_units = set(sc.loc[sc["method"] == "coax_comp", "component"])
    assert comp_units == {c.name for c in comps} - set(t["primaries"])


def test_sampled_shapley_within_its_se_of_the_exact_value(tiny):
    bridge, batch, comps, means = tiny
    spec = [pipeline.GameSpec("logprob", logprob(batch))]
    exact = pipeline.model_tables(bridge, batch.tokens, spec, comps, means, pipeline.Settings(mode="mean"))["shapley"]
    st = pipeline.Settings(mode="mean", exact_max_players=3, max_permutations=64, rel_se=1e-9)
    samp = pipeline.model_tables(bridge, batch.tokens, spec, comps, means, st)["shapley"]
    assert set(samp["estimator"]) == {"permutation"} and (samp["se"] > 0).any()
    z = (samp["shapley"] - exact["shapley"]).abs() / samp["se"].clip(lower=1e-9)
    assert (z < 4.5).all()


def test_model_tables_on_paper_a_engine_equal_the_bridge_path(tiny, tiny_dir):
    """model_tables with paper A's Hugging Face model (every game value and COAX's runs
    from the ablation engine) and without (the bridge's hooks): the same files' columns
    and rows, the log-probability values and the methods to float rounding, the accuracy
    values identical, exact and sampled (antithetic permutations, truncated at accuracy 0)."""
    bridge, batch, comps, means = tiny
    with torch.no_grad():
        pred = bridge(batch.tokens).argmax(-1)
    batch = S.Batch(batch.tokens, torch.where(batch.mask, pred, batch.targets), batch.mask)  # intact: all right
    specs = pipeline.heroes_specs(batch)
    assert [s.name for s in specs] == ["logprob", "accuracy"] and specs[1].floor == 0.0
    assert [s.name for s in pipeline.heroes_specs(batch, ["accuracy"])] == ["accuracy"]
    hf = models.load_hf(tiny_dir)
    for st in (
        pipeline.Settings(mode="mean", n_primary=2),
        pipeline.Settings(mode="mean", n_primary=2, exact_max_players=3, max_permutations=64, rel_se=0.0),
    ):
        old = pipeline.model_tables(bridge, batch.tokens, specs, comps, means, st)
        new = pipeline.model_tables(bridge, batch.tokens, specs, comps, means, st, hf_model=hf)
        for name in ("shapley", "interactions", "scores", "timing"):
            assert list(new[name].columns) == list(old[name].columns), name
            assert len(new[name]) == len(old[name]), name
        for name, keys, cols in (
            ("shapley", ["game", "component"], ["shapley", "se", "ci95", "single", "v_empty", "v_full"]),
            ("interactions", ["game", "u", "v"], ["drop_uv", "interaction"]),
            ("scores", ["game", "method", "component"], ["score"]),
        ):
            a, b = old[name].set_index(keys), new[name].set_index(keys)
            for col in cols:
                x, y = a[col].to_numpy(), b.loc[a.index, col].to_numpy()
                acc = a.index.get_level_values("game") == "accuracy"
                if name == "scores":  # the shared methods (COAX's runs on the engine too) are no game values
                    acc &= a.index.get_level_values("method").str.startswith("single")
                assert y[acc] == pytest.approx(x[acc], abs=1e-12, nan_ok=True), (name, col)
                assert y[~acc] == pytest.approx(x[~acc], abs=2e-5, nan_ok=True), (name, col)
        sh = new["shapley"]
        acc = sh[sh["game"] == "accuracy"]
        assert acc["v_empty"].iloc[0] == 1.0 and acc["shapley"].abs().max() > 0.05
        cols = ["estimator", "n_permutations", "n_pairs", "n_evaluations", "n_truncated", "converged"]
        assert new["shapley"][cols].equals(old["shapley"][cols])
    assert set(new["shapley"]["estimator"]) == {"permutation"} and (new["shapley"]["n_pairs"] == 32).all()
    no_engine = [pipeline.GameSpec("logprob", logprob(batch))]
    with pytest.raises(ValueError, match="no engine form"):
        pipeline.model_tables(bridge, batch.tokens, no_engine, comps, means, pipeline.Settings(), hf_model=hf)
    with pytest.raises(ValueError, match="unknown paper-A games"):
        pipeline.heroes_specs(batch, ["logprob", "loss"])


def test_settings_refuse_a_cap_below_the_minimum_of_pairs():
    assert pipeline.Settings().min_pairs == 32
    with pytest.raises(ValueError, match="below 2 x min_pairs = 64"):
        pipeline.Settings(max_permutations=63)
    with pytest.raises(ValueError, match="min_pairs must be an integer >= 2"):
        pipeline.Settings(min_pairs=1)
    assert pipeline.Settings(max_permutations=8, min_pairs=4).min_pairs == 4


def test_coalitions_per_forward_do_not_change_the_values(tiny):
    """max_rows only groups coalitions into forwards (one per forward vs all 64 in one)."""
    bridge, batch, comps, means = tiny
    spec = [pipeline.GameSpec("logprob", logprob(batch))]
    one = pipeline.model_tables(bridge, batch.tokens, spec, comps, means, pipeline.Settings(max_rows=12))
    many = pipeline.model_tables(bridge, batch.tokens, spec, comps, means, pipeline.Settings(max_rows=4096))
    assert one["shapley"]["shapley"].to_numpy() == pytest.approx(many["shapley"]["shapley"].to_numpy(), abs=1e-6)
    assert one["interactions"]["interaction"].to_numpy() == pytest.approx(
        many["interactions"]["interaction"].to_numpy(), abs=1e-6
    )


def test_no_differentiable_game_is_refused(tiny):
    bridge, batch, comps, means = tiny
    spec = [pipeline.GameSpec("accuracy", lambda lg: lg.sum() * 0, differentiable=False)]
    with pytest.raises(ValueError, match="differentiable"):
        pipeline.model_tables(bridge, batch.tokens, spec, comps, means, pipeline.Settings())


# ---------------------------------------------------------------- tables ----------
def hand_scores():
    """Two models of one group; 'good' ranks as Shapley does, 'bad' reversed."""
    rows, shap = [], []
    for model, phi in (("m1", [3.0, 2.0, 1.0, 0.5]), ("m2", [1.0, 4.0, 2.0, 0.1])):
        names = ["L0H0", "L0H1", "L1H0", "L1MLP"]
        for n, p in zip(names, phi):
            shap.append(
                {
                    "family": "f",
                    "group": "g",
                    "model": model,
                    "game": "v",
                    "component": n,
                    "shapley": p,
                    "se": 0.0,
                    "single": p if n != "L1H0" else 0.0,
                }
            )
            rows.append(
                {
                    "family": "f",
                    "group": "g",
                    "model": model,
                    "game": "v",
                    "method": "good",
                    "component": n,
                    "score": 2 * p,
                }
            )
            rows.append(
                {"family": "f", "group": "g", "model": model, "game": "v", "method": "bad", "component": n, "score": -p}
            )
    return pd.DataFrame(rows), pd.DataFrame(shap)


def test_agreement_tables_on_hand_built_scores():
    scores, shap = hand_scores()
    per = gt.agreement_models(scores, shap, k=2)
    good = per[per["method"] == "good"]
    bad = per[per["method"] == "bad"]
    assert good["spearman"].tolist() == pytest.approx([1.0, 1.0])
    assert bad["spearman"].tolist() == pytest.approx([-1.0, -1.0])
    assert good["top_k_share"].tolist() == [1.0, 1.0] and bad["top_k_share"].tolist() == [0.0, 0.0]
    # m2: L1H0 is second by Shapley with single 0 (hidden); 'good' has it in its top 2
    m2 = per[per["model"] == "m2"].set_index("method")
    assert m2.loc["good", "n_hidden"] == 1 and m2.loc["good", "hidden_recall"] == 1.0
    assert m2.loc["bad", "hidden_recall"] == 0.0
    summ = gt.agreement_summary(per, n_boot=200)
    assert set(summ["method"]) == {"good", "bad"} and (summ["n_models"] == 2).all()
    d = gt.paired_difference(per, "good", "bad", "spearman", n_boot=200)
    assert d["mean"] == pytest.approx(2.0) and d["a_higher"] == 2 and d["n"] == 2


def hand_labels(model="m"):
    """5 heads: a primary in layer 0, a quiet downstream backup (L2H0), a downstream head
    that repairs but is active alone (L1H0, 'interacting'), same-layer redundancy (L0H1),
    and an unrelated head (L2H1); threshold 1."""
    return pd.DataFrame(
        {
            "model": [model] * 5,
            "unit": ["L0H0", "L0H1", "L1H0", "L2H0", "L2H1"],
            "role": ["primary", "same_layer_redundancy", "interacting", "downstream_backup", "other"],
            "downstream_score": [np.nan, np.nan, 2.0, 1.5, 0.1],
            "backup_score": [np.nan, 3.0, 2.0, 1.5, 0.1],
            "threshold": 1.0,
        }
    )


def test_backup_recall_per_target_set():
    labels = hand_labels()
    scores = pd.DataFrame(
        {
            "model": ["m"] * 5,
            "method": ["x"] * 5,
            "component": ["L0H0", "L0H1", "L1H0", "L2H0", "L2H1"],
            "score": [9.0, 6.0, 0.5, 5.0, 0.0],
        }
    )
    r = gt.backup_recall(scores, labels).set_index("target")
    # candidates: the 4 non-primaries. Ranking: L0H1, L2H0, L1H0, L2H1
    assert (r["n_candidates"] == 4).all()
    assert (r.loc["downstream_backup", "k"], r.loc["downstream_backup", "hits"]) == (1, 0)  # top 1: L0H1
    assert (r.loc["downstream_repair", "k"], r.loc["downstream_repair", "hits"]) == (2, 1)  # top 2 has L2H0
    assert (r.loc["any_repair", "k"], r.loc["any_repair", "hits"]) == (3, 3)
    assert r.loc["downstream_repair", "recall"] == 0.5


def test_paper_b_rankings_against_the_corrected_labels():
    labels = hand_labels("ioi/seed1")
    t = pd.DataFrame(
        {
            "model_seed": 1,
            "data_seed": 11,
            "unit": ["L0H0", "L0H1", "L1H0", "L2H0", "L2H1"],
            "single": [9.0, 3.0, 2.0, 0.1, 0.2],
            "comp": [np.nan, 0.1, 0.5, 2.0, 0.0],
        }
    )
    for m in ("atp", "eap_ig", "atp_star", "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio"):
        t[m] = 0.0
    r = gt.paper_b_recall(t, labels)
    r = r[r["target"] == "downstream_backup"].set_index("method")
    # k = 1 (L2H0), over the 4 non-primaries: COAX's comp ranks it first; single ablation
    # ranks the same-layer copy L0H1 first
    assert r.loc["coax", "k"] == 1 and r.loc["coax", "recall"] == 1.0
    assert r.loc["single", "recall"] == 0.0 and r.loc["single", "n_candidates"] == 4


def test_findings_are_new_rows_with_their_intervals():
    scores, shap = hand_scores()
    scores = scores.assign(group="heroes/sort", game="accuracy")
    scores["method"] = scores["method"].map({"good": "single", "bad": "grad_norm"})
    shap = shap.assign(group="heroes/sort", game="accuracy")
    per = gt.agreement_models(scores, shap, k=2)
    f = gt.findings(per, None, n_boot=200).set_index("id")
    assert f.loc["gt_heroes_spearman_single", "status"] == "new"
    assert f.loc["gt_heroes_spearman_single", "reproduced"] == pytest.approx(1.0)
    assert f.loc["gt_heroes_single_minus_g", "reproduced"] == pytest.approx(2.0)
    assert f.loc["gt_gim_minus_eap", "status"] == "not run"  # no paper-C models here
