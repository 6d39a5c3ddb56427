"""Feature attribution: captum baselines, GIM parity, and the two faithfulness metrics."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model  # noqa: E402
from selfrepair.gim import feature_attribution as FA  # noqa: E402
from selfrepair.gim.backward import GIMConfig  # noqa: E402
from selfrepair.tasks.classify import Classify  # noqa: E402
from selfrepair.tasks.counterfactual import save_word_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    task = Classify()
    folder = tmp_path_factory.mktemp("fa") / "m"
    cfg = gpt2_toy_config(vocab_size=len(task.vocab), n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=task.n_ctx)
    save_model(build_gpt2_toy(cfg, seed=4, positional=True), folder)
    save_word_tokenizer(folder, task.vocab)
    b = load_bridge(folder, "cpu")
    for p in b.parameters():
        p.requires_grad_(False)
    return b


def test_classify_truth_marks_the_signal_words():
    task = Classify()
    data, truth = task.sample_with_truth(50, 0)
    signal = data.clean >= task.id["p0"]
    assert torch.equal(signal, truth)
    pos_label = data.answer == task.id["pos"]
    for i in range(50):
        words = data.clean[i][truth[i]]
        assert bool(((words < task.id["n0"]) == pos_label[i]).all())  # all signals of the label's class
        assert bool((data.corrupt[i][truth[i]] != words).all())


def test_integrated_gradients_completeness(bridge):
    """captum's IG: attributions sum to f(input) - f(baseline) (up to the Riemann error)."""
    task = Classify()
    data, _ = task.sample_with_truth(2, 1)
    tokens = data.clean[:1]
    pos, target = int(data.pos[0]), int(data.answer[0])
    a = FA.attribute(bridge, tokens, pos, target, 0, "integrated_gradients", ig_steps=64)
    with torch.no_grad():
        full = bridge(tokens)[0, pos, target]
        base_tokens = torch.zeros_like(tokens)
        base = bridge(base_tokens)[0, pos, target]
    # the baseline replaces the token embeddings; positions stay: the input to block 0 differs
    # only by token embeddings, so f(baseline) is the all-baseline-token run
    assert a.sum().item() == pytest.approx((full - base).item(), rel=0.02, abs=1e-3)


def test_gim_attribution_matches_gim_explain(bridge):
    gim_ref = pytest.importorskip("gim")
    task = Classify()
    data, _ = task.sample_with_truth(2, 2)
    tokens = data.clean[:1]
    pos, target = int(data.pos[0]), int(data.answer[0])
    ours = FA.attribute(bridge, tokens, pos, target, 0, "gim", config=GIMConfig(tsg=False))
    ref = gim_ref.explain(
        bridge,
        tokens,
        target_token_id=target,
        target_position=pos,
        baseline_token_id=0,
        freeze_norm=True,
        softmax_temperature=None,
    )
    assert torch.allclose(ours, ref, atol=1e-6)


def test_comprehensiveness_and_sufficiency_by_hand(bridge):
    task = Classify()
    data, _ = task.sample_with_truth(1, 3)
    tokens = data.clean
    pos, target, T = int(data.pos[0]), int(data.answer[0]), tokens.shape[1]
    attribution = torch.arange(T, dtype=torch.float)  # later tokens more important
    comp, suff = FA.faithfulness_scores(bridge, tokens, pos, target, 0, attribution)

    def logit(replace):
        t = tokens.clone()
        t[0, list(replace)] = 0
        with torch.no_grad():
            return float(bridge(t)[0, pos, target])

    full = logit([])
    ranked = list(range(T - 2, 0, -1))  # positions 1..T-2, most important first
    n = len(ranked)
    expected_comp = sum(full - logit(ranked[:k]) for k in range(1, n + 1)) / n / full
    expected_suff = sum(full - logit(ranked[n - round(r * n) :]) for r in FA.RATIOS) / len(FA.RATIOS) / full
    assert comp == pytest.approx(expected_comp, rel=1e-4, abs=1e-6)
    assert suff == pytest.approx(expected_suff, rel=1e-4, abs=1e-6)


def test_evaluate_rows(bridge):
    data, truth = Classify().sample_with_truth(2, 4)
    df = FA.evaluate(bridge, data, truth, 0, ig_steps=4)
    assert set(df.method) == set(FA.METHODS) and len(df) == 2 * len(FA.METHODS)
    assert df.ground_truth_hit.between(0, 1).all()
    assert list(df.columns) == ["example", "method", *FA.DETAIL, "ground_truth_hit"]
    assert (df.comprehensiveness * df.target_logit).to_numpy() == pytest.approx(df.comprehensiveness_logit.to_numpy())
    assert (df.comprehensiveness_prob <= 1).all() and df.target_prob.between(0, 1).all()


class _SumModel:
    """A model worked by hand: at every position the logits over 3 tokens are
    [s + shift, shift, shift], s the sum of the token ids at positions 1..T-2."""

    def __init__(self, shift=0.0):
        self.shift = shift

    def __call__(self, tokens):
        s = tokens[:, 1:-1].sum(1).double()
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 3, dtype=torch.float64) + self.shift
        logits[:, :, 0] += s[:, None]
        return logits


def test_faithfulness_detail_worked_by_hand():
    import math

    tokens = torch.tensor([[5, 1, 2, 3, 5]])
    attribution = torch.tensor([9.0, 0.1, 0.3, 0.2, 9.0])  # ranks positions 2, 3, 1 (first and last unranked)
    d = FA.faithfulness_detail(_SumModel(), tokens, 4, 0, 0, attribution, foil=1)
    # s: full 6; the top 1, 2, 3 tokens replaced by id 0: 4, 1, 0; drops 2, 5, 6
    assert d["target_logit"] == 6 and d["comprehensiveness_logit"] == pytest.approx(13 / 3)
    assert d["comprehensiveness"] == pytest.approx(13 / 18)
    # sufficiency: round(r * 3) of the least important replaced: 2, 2, 3, 3, 3 -> s 2, 2, 0, 0, 0
    assert d["sufficiency_logit"] == pytest.approx(26 / 5) and d["sufficiency"] == pytest.approx(26 / 30)

    def p(s):  # the target's softmax probability: e^s / (e^s + 2)
        return math.exp(s) / (math.exp(s) + 2)

    assert d["target_prob"] == pytest.approx(p(6))
    assert d["comprehensiveness_prob"] == pytest.approx((3 * p(6) - p(4) - p(1) - p(0)) / 3 / p(6))
    assert d["sufficiency_prob"] == pytest.approx((5 * p(6) - 2 * p(2) - 3 * p(0)) / 5 / p(6))
    assert d["foil_logit"] == 0 and d["correct"] is True
    # every logit shifted by -5.5: the full logit 0.5 divides the same drops; the probabilities do not move
    s = FA.faithfulness_detail(_SumModel(-5.5), tokens, 4, 0, 0, attribution, foil=1)
    assert s["comprehensiveness"] == pytest.approx(13 / 3 / 0.5)
    assert s["comprehensiveness_prob"] == pytest.approx(d["comprehensiveness_prob"])
    assert s["comprehensiveness_logit"] == pytest.approx(13 / 3) and s["correct"] is True
    # the target's logit 0, as the foil's: not answered, and the ratio to the full logit undefined
    z = FA.faithfulness_detail(_SumModel(), torch.tensor([[5, 0, 0, 0, 5]]), 4, 0, 0, attribution, foil=1)
    assert z["correct"] is False and math.isnan(z["comprehensiveness"]) and z["comprehensiveness_prob"] == 0
    assert FA.faithfulness_scores(_SumModel(), tokens, 4, 0, 0, attribution) == (
        pytest.approx(13 / 18),
        pytest.approx(26 / 30),
    )


def test_faithfulness_detail_rejects_bad_input():
    with pytest.raises(ValueError, match="positions"):
        FA.faithfulness_detail(_SumModel(), torch.tensor([[5, 1, 2, 5]]), 3, 0, 0, torch.zeros(5))
    with pytest.raises(ValueError, match="no rankable"):
        FA.faithfulness_detail(_SumModel(), torch.tensor([[5, 5]]), 1, 0, 0, torch.zeros(2))
