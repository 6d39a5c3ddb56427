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
