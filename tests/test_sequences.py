import torch

from selfrepair.tasks import sequences as S


def test_batch_format_by_hand():
    values = torch.tensor([[5, 3, 9]])
    b = S.make_batch("reverse", values)
    # prompt [START] 5 3 9 [SEP], target 9 3 5 [END]; input = prompt + target[:-1]
    assert b.tokens.tolist() == [[S.START, 5, 3, 9, S.SEP, 9, 3, 5]]
    # SEP predicts 9, then 3, 5, END; prompt positions carry no loss
    assert b.mask.tolist() == [[False, False, False, False, True, True, True, True]]
    assert b.targets[b.mask].tolist() == [9, 3, 5, S.END]


def test_sort_target_keeps_repeats():
    b = S.make_batch("sort", torch.tensor([[7, 2, 7, 1]]))
    assert b.targets[b.mask].tolist() == [1, 2, 7, 7, S.END]


def test_per_batch_training_batches_have_no_pad_and_one_length():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        b = S.training_batch("sort", 16, 3, 7, g, "per_batch")
        n = (b.tokens.shape[1] - 2) // 2
        assert 3 <= n <= 7
        assert not (b.tokens == S.PAD).any()
        assert int(b.mask.sum(1).unique().item()) == n + 1


def test_per_example_padding_puts_pad_between_sep_and_target():
    g = torch.Generator().manual_seed(0)
    b = S.make_padded_batch("reverse", [2, 4], g)
    short = b.tokens[0].tolist()
    # [START] x1 x2 [SEP] PAD PAD | y1 y2 END ...
    assert short[0] == S.START and short[3] == S.SEP and short[4:6] == [S.PAD, S.PAD]
    # loss mask: exactly n + 1 positions, starting at the last prompt slot
    assert b.mask[0].sum() == 3 and b.mask[1].sum() == 5
    assert b.mask[0, 5:8].all() and b.targets[0, 7] == S.END
    x = short[1:3]
    assert b.targets[0, 5:7].tolist() == x[::-1]


def test_unknown_task_and_padding_raise():
    import pytest

    with pytest.raises(ValueError, match="unknown task"):
        S.solve("shuffle", torch.tensor([[1]]))
    with pytest.raises(ValueError, match="padding"):
        S.training_batch("sort", 2, 3, 4, torch.Generator(), "left")


def test_generators_are_deterministic():
    a = S.fixed_length_batches("sort", 8, 3, 4, seed=5)
    b = S.fixed_length_batches("sort", 8, 3, 4, seed=5)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, b))
