import pytest
import torch

from selfrepair.core import models, train
from selfrepair.tasks import sequences as S


def test_no_positional_signal(tiny_folder):
    """Without position embeddings, a run of identical tokens gives identical logits at
    every position (each position attends over identical values); with them it does not."""
    m = models.load_hf(tiny_folder)
    assert torch.count_nonzero(m.transformer.wpe.weight) == 0
    x = torch.full((1, 9), 17)
    logits = m(input_ids=x).logits[0]
    assert torch.allclose(logits, logits[0].expand_as(logits), atol=1e-5)
    with torch.no_grad():
        m.transformer.wpe.weight.normal_()
    logits = m(input_ids=x).logits[0]
    assert not torch.allclose(logits, logits[0].expand_as(logits), atol=1e-3)


def test_position_table_stays_zero_during_training():
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=32)
    m = models.build_gpt2_toy(cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    train.train(
        m,
        lambda s: S.training_batch("sort", 8, 3, 4, g),
        lambda mm: 0.0,
        max_steps=3,
        eval_every=3,
        target_accuracy=None,
    )
    assert torch.count_nonzero(m.transformer.wpe.weight) == 0


def test_paper_model_size():
    cfg = models.gpt2_toy_config(S.VOCAB)
    m = models.build_gpt2_toy(cfg)
    n = sum(p.numel() for p in m.parameters() if p.requires_grad)
    # 20 components: 4 layers x 4 heads + 4 MLPs, ~820k parameters (SPEC.md)
    assert 800_000 < n < 840_000
    assert cfg.n_layer == 4 and cfg.n_head == 4 and cfg.n_embd // cfg.n_head == 32 and cfg.n_inner == 512


def test_torch_init_differs_from_transformers_init():
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=64, d_mlp=128)
    a = models.build_gpt2_toy(cfg, init="transformers", seed=0)
    b = models.build_gpt2_toy(cfg, init="torch", seed=0)
    # transformers: N(0, 0.02); torch default for a 64-input layer: U(-1/8, 1/8), sd 0.072
    assert abs(a.transformer.h[0].attn.c_attn.weight.std().item() - 0.02) < 0.003
    assert abs(b.transformer.h[0].attn.c_attn.weight.std().item() - 0.125 / 3**0.5) < 0.005
    with pytest.raises(ValueError, match="init"):
        models.build_gpt2_toy(cfg, init="xavier")


def test_bridge_matches_hf(tiny_folder):
    hf = models.load_hf(tiny_folder)
    br = models.load_bridge(tiny_folder)
    x = S.make_batch("sort", torch.randint(1, 100, (3, 5))).tokens
    assert torch.allclose(br(x), hf(input_ids=x).logits, atol=1e-4)


def test_missing_and_corrupt_checkpoints(tmp_path, tiny_folder):
    with pytest.raises(models.ModelNotFound, match="not found"):
        models.load_hf(tmp_path / "nope")
    with pytest.raises(models.ModelNotFound, match="weights not found"):
        models.load_bridge("nobody/no-such-model-here")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_folder.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    w = next(broken.glob("*.safetensors"))
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(models.CorruptCheckpoint, match="broken"):
        models.load_hf(broken)


def test_nan_loss_raises_training_diverged():
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=32)
    m = models.build_gpt2_toy(cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(train.TrainingDiverged, match="step 1"):
        train.train(
            m,
            lambda s: S.training_batch("sort", 4, 3, 3, g),
            lambda mm: 0.0,
            logits_fn=lambda mm, t: mm(input_ids=t).logits * float("nan"),
            max_steps=2,
        )


def test_training_is_deterministic():
    def run():
        cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=32)
        m = models.build_gpt2_toy(cfg, seed=3)
        g = torch.Generator().manual_seed(3)
        train.train(
            m,
            lambda s: S.training_batch("reverse", 8, 3, 5, g),
            lambda mm: 0.0,
            max_steps=5,
            eval_every=5,
            target_accuracy=None,
        )
        return m.state_dict()

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _progress_run(**progress):
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=32)
    m = models.build_gpt2_toy(cfg, seed=3)
    g = torch.Generator().manual_seed(3)
    accs = iter([0.25, 0.5, 0.75])
    res = train.train(
        m,
        lambda s: S.training_batch("reverse", 8, 3, 5, g),
        lambda mm: next(accs),
        max_steps=7,
        eval_every=3,
        target_accuracy=None,
        **progress,
    )
    return m.state_dict(), res


def test_progress_lines_do_not_change_training(caplog, capsys):
    """Progress lines at every step (and on the clock) leave the weights and the log as
    with none; they go to the selfrepair.core.train logger, never to stdout."""
    quiet, quiet_res = _progress_run(progress_seconds=None)
    with caplog.at_level("INFO", logger="selfrepair.core.train"):
        loud, loud_res = _progress_run(progress_steps=1, progress_seconds=0.0)
    assert all(torch.equal(quiet[k], loud[k]) for k in quiet)
    assert [r["loss"] for r in quiet_res.log] == [r["loss"] for r in loud_res.log]
    lines = [r.getMessage() for r in caplog.records if r.name == "selfrepair.core.train"]
    assert len(lines) == 7 and capsys.readouterr().out == ""
    assert lines[0].startswith("train step 1/7 (14%) | loss ") and "no eval yet" in lines[0]
    assert "eval acc 0.2500 at step 3" in lines[3] and "eval acc 0.5000 at step 6" in lines[5]
    assert lines[6].startswith("train step 7/7 (100%)") and "eval acc 0.7500 at step 7" in lines[6]
    assert all("steps/s" in x and "eta " in x for x in lines)


def test_progress_defaults_to_evaluations_and_the_clock(caplog):
    with caplog.at_level("INFO", logger="selfrepair.core.train"):
        _progress_run()
    lines = [r.getMessage() for r in caplog.records if r.name == "selfrepair.core.train"]
    # a fast run: one line per evaluation (steps 3, 6 and the last step 7)
    assert [x.split(" |")[0] for x in lines] == [
        "train step 3/7 (43%)",
        "train step 6/7 (86%)",
        "train step 7/7 (100%)",
    ]
    assert lines[-1].endswith("eta 0:00:00 to max_steps")


def test_progress_line_numbers():
    line = train.progress_line(250, 1000, 0.123456, 0.9, 200, 50.0)
    assert (
        line
        == "train step 250/1000 (25%) | loss 0.1235 | eval acc 0.9000 at step 200 | 5.0 steps/s | elapsed 0:00:50 | eta 0:02:30 to max_steps"
    )
    assert "eta ?" in train.progress_line(1, 10, 1.0, float("nan"), None, 0.0)


def _tiny_gpt2(n_heads=2, seed=0):
    cfg = models.gpt2_toy_config(vocab_size=11, n_layers=2, n_heads=n_heads, d_model=8, d_mlp=16, n_ctx=6)
    return models.build_gpt2_toy(cfg, seed=seed, positional=True)


def test_head_dropout_zeroes_whole_heads_in_training_only():
    """Attention-head dropout (paper B's recipe, core.train): p = 1 drops every head, the
    same as zeroing every block's output projection weights (its bias stays); p = 0 and
    evaluation mode leave the model as it is; and a partial mask drops exactly the heads
    whose rows of the projection a hand-made copy zeroes, per example."""
    import copy

    model = _tiny_gpt2().train()
    tokens = torch.randint(11, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(input_ids=tokens).logits
        headless = copy.deepcopy(model)
        for block in headless.transformer.h:
            block.attn.c_proj.weight.zero_()
        all_dropped = train.head_dropout_logits_fn(1.0, 2)(model, tokens)
        torch.testing.assert_close(all_dropped, headless(input_ids=tokens).logits, rtol=0, atol=1e-6)
        assert not torch.allclose(all_dropped, plain, atol=1e-3)
        model.eval()  # the hooks only act in training
        torch.testing.assert_close(model(input_ids=tokens).logits, plain, rtol=0, atol=0)
        model.train()
        train.remove_head_dropout(model)
        torch.testing.assert_close(train.head_dropout_logits_fn(0.0, 2)(model, tokens), plain, rtol=0, atol=0)
        train.remove_head_dropout(model)

        # p = 0.5: the masks are drawn as rand(layers, batch, heads) >= p from a generator seeded 7
        keep = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(7)) >= 0.5
        clean = copy.deepcopy(model)  # no hooks: the references below have none
        got = train.head_dropout_logits_fn(0.5, 2, seed=7)(model, tokens)
        for b in range(3):
            ref = copy.deepcopy(clean)
            for layer, block in enumerate(ref.transformer.h):
                for h in range(2):
                    if not keep[layer, b, h]:  # Conv1D: input features are the weight's rows
                        block.attn.c_proj.weight[h * 4 : (h + 1) * 4].zero_()
            torch.testing.assert_close(got[b], ref(input_ids=tokens[b : b + 1]).logits[0], rtol=0, atol=1e-6)
    assert 0 < int(keep.sum()) < keep.numel()
    train.remove_head_dropout(model)
    for block in model.transformer.h:
        assert not hasattr(block.attn.c_proj, "_sr_handle") and not block.attn.c_proj._forward_pre_hooks


def test_papers_b_and_c_train_the_toy_ioi_model_alike(tmp_path):
    """Paper B (coax.ioi_experiment.train_toy) and paper C (gim.training.train_toy_ioi)
    train the toy IOI model through the one core function on tasks.ioi's data: the same
    arguments give the same weights, bit for bit."""
    from safetensors.torch import load_file

    from selfrepair.coax.ioi_experiment import train_toy
    from selfrepair.gim.training import train_toy_ioi
    from selfrepair.tasks.counterfactual import ToyIOI

    kw = dict(lr=1e-3, batch_size=8, max_steps=6, eval_every=3)
    b, res = train_toy(1, 2, 16, 32, seed=4, head_dropout=0.1, target_accuracy=0.99, **kw)
    meta = train_toy_ioi(ToyIOI(), tmp_path, 1, 2, 16, 32, 4, head_dropout=0.1, **kw)
    c = load_file(tmp_path / "model.safetensors")
    assert meta["steps"] == res.steps == 6 and meta["accuracy"] == res.final_accuracy
    state = {k: v for k, v in b.state_dict().items() if k in c}
    assert set(state) == set(c) and all(torch.equal(state[k], c[k]) for k in c)
    assert not b.training and not b.transformer.h[0].attn.c_proj._forward_pre_hooks
