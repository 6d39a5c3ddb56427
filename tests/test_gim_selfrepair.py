"""Attention self-repair counts and the single/joint score ablations."""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import load_bridge  # noqa: E402
from selfrepair.gim.evaluate import logit_diff  # noqa: E402
from selfrepair.gim.selfrepair_attention import attention_selfrepair, occurrences  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch  # noqa: E402
from tiny_models import save_toy_gpt2  # noqa: E402


def test_occurrences_hand_counted():
    pat = torch.zeros(2, 1, 1, 3, 3)  # [N, L, H, T, T]
    pat[0, 0, 0, 0] = torch.tensor([1.0, 0, 0])  # one important key
    pat[0, 0, 0, 1] = torch.tensor([0.5, 0.5, 0])  # two: counts
    pat[0, 0, 0, 2] = torch.tensor([0.3, 0.3, 0.4])  # three: counts
    pat[1, 0, 0, 2] = torch.tensor([0.05, 0.9, 0.05])  # one
    assert occurrences(pat, 0.1).tolist() == [2, 0]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    folder = save_toy_gpt2(tmp_path_factory.mktemp("sr") / "m", vocab_size=12, n_ctx=8, seed=2)
    return load_bridge(folder, "cpu")


def test_ablations_match_one_at_a_time(bridge):
    g = torch.Generator().manual_seed(0)
    n, T = 3, 6
    data = CounterfactualBatch(
        torch.randint(0, 12, (n, T), generator=g),
        torch.randint(0, 12, (n, T), generator=g),
        torch.tensor([1, 2, 3]),
        torch.tensor([4, 5, 6]),
        torch.full((n,), T - 1),
    )
    per_input, rows = attention_selfrepair(bridge, data, threshold=0.1, batch_size=5)
    assert len(per_input) == n and len(rows) > 0
    for _, r in rows.head(4).iterrows():
        i = int(r.input)
        one = CounterfactualBatch(
            data.clean[i : i + 1],
            data.corrupt[i : i + 1],
            data.answer[i : i + 1],
            data.foil[i : i + 1],
            data.pos[i : i + 1],
        )
        with torch.no_grad():
            base = float(logit_diff(bridge(one.clean), one))

        def effect(keys):
            def fn(x, hook):
                x = x.clone()
                for k in keys:
                    x[0, int(r["head"]), int(r.query), k] = float("-inf")
                return x

            with torch.no_grad():
                lg = bridge.run_with_hooks(one.clean, fwd_hooks=[(f"blocks.{int(r.layer)}.attn.hook_attn_scores", fn)])
            return abs(base - float(logit_diff(lg, one)))

        e1, e2, e12 = effect([int(r.key1)]), effect([int(r.key2)]), effect([int(r.key1), int(r.key2)])
        assert r.effect1 == pytest.approx(e1, abs=1e-5) and r.effect2 == pytest.approx(e2, abs=1e-5)
        assert r.effect_joint == pytest.approx(e12, abs=1e-5)
        assert r.interaction == pytest.approx((e12 - e1 - e2) / e12, rel=1e-3)
        assert r.w1 >= r.w2 > 0.1
