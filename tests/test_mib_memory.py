"""MIB's precision (gim.mib.dtype), the memory plan, batch_size auto and the refusal
of a job that cannot fit, on tiny models of each architecture (test_gim_mib's)."""

import dataclasses
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import folder_tokenizer, load_bridge, load_hf  # noqa: E402
from selfrepair.gim import localization, memory, precision  # noqa: E402
from selfrepair.gim.graph import Graph  # noqa: E402
from selfrepair.gim.localization import localize, run_mib  # noqa: E402
from selfrepair.tasks import mib  # noqa: E402
from test_gim_mib import _datasets, _models  # noqa: E402

ARCHS = ("gpt2", "llama", "qwen2", "gemma2", "gemma3_text")  # model types; test_gim_mib's folders


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mib_memory")
    paths = _models(root / "models")
    _datasets(root / "data")
    return paths, str(root / "data")


def test_resolve_follows_mib_per_model_and_device():
    # MIB's own for GPT-2, Llama, Qwen-2 and Gemma-2; Gemma-3 (no MIB model) as Gemma-2
    mib_own = ["float32", "bfloat16", "bfloat16", "bfloat16", "bfloat16"]
    assert [precision.resolve("mib", a, "cpu") for a in ARCHS] == mib_own
    assert [precision.resolve("auto", a, "cuda:0") for a in ARCHS] == mib_own
    assert {precision.resolve("auto", a, "cpu") for a in ARCHS} == {"float32"}
    assert precision.resolve("bfloat16", "gpt2", "cpu") == "bfloat16"
    assert precision.resolve("mib", "gpt_neox", "cuda") == "float32"  # not a MIB model: float32
    with pytest.raises(ValueError, match="gim.mib.dtype 'half' is not one of"):
        precision.resolve("half", "llama", "cpu")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_dtype_switch_loads_and_scores_each_architecture(tiny, arch):
    paths, data_dir = tiny
    tok = folder_tokenizer(paths[arch], None)
    data = mib.load("ioi", tok, 4, [data_dir])
    default = load_bridge(paths[arch])
    f32 = load_bridge(paths[arch], dtype=torch.float32)
    bf16 = load_bridge(paths[arch], dtype=torch.bfloat16)
    assert {p.dtype for p in f32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    # float32 is today's path bit for bit (the checkpoints are float32)
    _, s_default, _, sum_default = localize(default, data, "eap", (0.5, 1.0), 4)
    _, s_f32, _, sum_f32 = localize(f32, data, "eap", (0.5, 1.0), 4)
    assert torch.equal(s_default, s_f32) and sum_default["cpr"] == sum_f32["cpr"]
    # bf16 runs, and moves the scores (it is another precision), not by orders of magnitude
    _, s_bf16, _, sum_bf16 = localize(bf16, data, "eap", (0.5, 1.0), 4)
    assert s_bf16.dtype == torch.float32 and torch.isfinite(s_bf16).all()
    assert not torch.equal(s_bf16, s_f32)
    scale = s_f32.abs().max()
    assert (s_bf16 - s_f32).abs().max() < 0.1 * scale


def test_run_mib_names_each_models_dtype(tiny):
    paths, data_dir = tiny
    models = [paths[a] for a in ARCHS]
    status, table, _ = run_mib(
        models, ["ioi"], ["eap"], n_eval=4, search_paths=[data_dir], batch_size=4, fractions=(0.5, 1.0), dtype="mib"
    )
    assert list(status.status) == ["ran"] * 5
    assert list(status.dtype) == ["float32", "bfloat16", "bfloat16", "bfloat16", "bfloat16"]
    assert status.plan.str.startswith("planned ").all()  # every one a known architecture
    assert table[["cpr", "cmd"]].notna().all().all()


def test_shape_reads_the_graph_and_the_parameters_of_each_architecture(tiny):
    import json
    from pathlib import Path

    paths, _ = tiny
    for arch in ARCHS:
        shape = memory.Shape.from_config(json.loads((Path(paths[arch]) / "config.json").read_text()))
        bridge = load_bridge(paths[arch])
        g = Graph.from_bridge(bridge)
        assert (shape.n_forward, shape.n_backward) == (len(g.forward), len(g.backward))
        n = sum(p.numel() for p in load_hf(paths[arch]).parameters())
        # the plan leaves out norms and biases: a few hundred numbers on these models
        assert 0 <= n - shape.n_params < 0.1 * n


# the published parameter counts (each model card); the plan omits norms and biases
PUBLISHED = {"gpt2": 124_439_808, "Qwen/Qwen2.5-0.5B": 494_032_768, "google/gemma-2-2b": 2_614_341_888,
             "meta-llama/Llama-3.1-8B": 8_030_261_248}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_shape_counts_the_real_models_parameters(name):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("real_size", Path(__file__).parents[1] / "benchmarks/real_size.py")
    real_size = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_size)
    cls_name, kw = real_size.CONFIGS[name]
    model_type = {"GPT2Config": "gpt2", "Qwen2Config": "qwen2", "Gemma2Config": "gemma2", "LlamaConfig": "llama"}
    shape = memory.Shape.from_config({"model_type": model_type[cls_name], **kw})
    assert abs(shape.n_params - PUBLISHED[name]) < 0.002 * PUBLISHED[name]


def test_shape_of_gemma3_270m_by_hand():
    """Gemma-3-270M's config.json (its keys as published): 18 layers, 4 query heads and 1
    key/value head of 256 (q is 1024 wide, over d_model 640), MLP 2048, vocab 262,144,
    tied. By hand: embedding 262144 * 640 = 167,772,160; per layer attention
    640 * (1024 + 256 + 256) + 1024 * 640 = 1,638,400 and MLP 3 * 640 * 2048 = 3,932,160;
    167,772,160 + 18 * 5,570,560 = 268,042,240 (the 268,098,176 of the checkpoint less its
    55,936 norm weights: 18 * (4 * 640 + 2 * 256) + 640)."""
    c = {"model_type": "gemma3_text", "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
         "hidden_size": 640, "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144}  # fmt: skip
    s = memory.Shape.from_config(c)
    assert s.tied and s.qk_norm and s.n_params == 268_042_240
    assert (s.n_forward, s.n_backward, s.grad_slots) == (1 + 18 * 5, 18 * 13 + 1, 18 * (4 + 2 + 1) + 1)
    # the q/k norms' outputs: (4 + 1) * 256 more elements per layer than without them
    p, no_qk = (memory.plan(x, "gim", 2, 20, "bfloat16") for x in (s, dataclasses.replace(s, qk_norm=False)))
    assert p["autograd"] - no_qk["autograd"] == 2 * 20 * 18 * 5 * 256 * 2
    assert not memory.Shape.from_config({**c, "model_type": "gemma2"}).qk_norm


def test_plan_components_by_hand():
    # 2 layers, 4 heads, 2 key-value heads, d 16, d_head 4, d_mlp 32, vocab 10, gated, untied
    s = memory.Shape(2, 4, 2, 16, 4, 32, 10, True, False, 0)
    assert (s.n_forward, s.n_backward, s.grad_slots) == (11, 27, 19)  # 1+2*5; 2*13+1; 2*(4+4+1)+1
    # embed 160, unembed 160; per layer attn 16*(16+8+8) + 16*16 = 768, mlp 3*16*32 = 1536
    assert s.n_params == 160 + 160 + 2 * (768 + 1536)
    p = memory.plan(s, "eap", batch=3, positions=5, dtype="bfloat16", device="cuda")
    bt = 15
    assert p["weights"] == 4928 * 2
    assert p["runtime"] == 0
    assert p["activations"] == 2 * bt * 11 * 16 * 2
    assert p["gradients"] == bt * 19 * 16 * 2
    per_layer = 2 * 8 * 16 + 8 * 4 + 3 * 4 * 5 + 4 * (4 + 16) + 4 * 16 + 4 * 32  # = 620
    assert p["autograd"] == bt * (2 * per_layer * 2 + 10 * (2 + 4))
    assert p["scores"] == 3 * 11 * 27 * 4
    assert p["loading"] == 0 and p["total"] == sum(v for k, v in p.items() if k != "total")
    ig = memory.plan(s, "eap-ig", 3, 5, "bfloat16", "cuda")
    assert ig["gradients"] == 2 * p["gradients"]
    cpu = memory.plan(s, "eap", 3, 5, "float32", "cpu", resident_embedding=False)
    assert cpu["weights"] == (4928 - 160) * 4 and cpu["runtime"] == memory.RUNTIME_CPU
    # the check of the checkpoint: the runtime, the file (float32), the largest tensor (16 x 32) and its mask
    assert cpu["loading"] == memory.RUNTIME_CPU + 4928 * 4 + 512 * 5
    assert cpu["total"] == max(cpu["loading"], sum(v for k, v in cpu.items() if k not in ("total", "loading")))


def test_batch_choices_and_the_fitting_batch():
    assert memory.batch_choices(100) == [20, 10, 5, 4, 2, 1]
    assert memory.batch_choices(8) == [8, 4, 2, 1]
    assert memory.batch_choices(30, divisors=False)[:3] == [20, 19, 18]
    plan_of = lambda b: {"total": 100.0 * b}  # noqa: E731
    assert memory.fitting_batch(plan_of, 1000.0, [20, 10, 5]) == 5  # 900 usable: 500 fits, 1000 not
    assert memory.fitting_batch(plan_of, 100.0, [2, 1]) is None


def _plans(paths, arch, data_dir):
    """The llama/qwen2 toy's plan per batch on the ioi pairs (float32, CPU), and its shape."""
    import json
    from pathlib import Path

    shape = memory.Shape.from_config(json.loads((Path(paths[arch]) / "config.json").read_text()))
    data = mib.load("ioi", folder_tokenizer(paths[arch], None), 8, [data_dir])
    return {
        b: memory.plan(shape, "eap", b, data.clean.shape[1], "float32", "cpu", False)["total"] for b in (1, 2, 4, 8)
    }


def test_auto_picks_the_largest_fitting_divisor_and_uses_it(tiny, monkeypatch):
    paths, data_dir = tiny
    plans = _plans(paths, "llama", data_dir)
    gb = (plans[4] + plans[8]) / 2 / 0.9 / memory.GB  # batch 4 fits 90% of it, 8 does not
    # brute force: the divisors of 8 whose plan fits 90% of the budget
    assert [b for b in (8, 4, 2, 1) if plans[b] <= 0.9 * gb * memory.GB] == [4, 2, 1]
    used = []
    real = localization.localize

    def spy(bridge, data, method, fractions, batch_size, *a):
        used.append(batch_size)
        return real(bridge, data, method, fractions, batch_size, *a)

    monkeypatch.setattr(localization, "localize", spy)
    status, table, _ = run_mib([paths["llama"]], ["ioi"], ["eap"], n_eval=8, search_paths=[data_dir],
                               batch_size="auto", fractions=(0.5, 1.0), weighting="mib", memory_gb=gb)  # fmt: skip
    row = status.iloc[0]
    assert row.status == "ran" and row.batch_size == 4 and used == [4]
    assert row.plan.startswith("planned ") and "weights" in row.plan
    # with room for every batch, auto is MIB's largest (here n_eval: 8)
    status, _, _ = run_mib([paths["llama"]], ["ioi"], ["eap"], n_eval=8, search_paths=[data_dir],
                           batch_size="auto", fractions=(0.5, 1.0), weighting="mib", memory_gb=100.0)  # fmt: skip
    assert status.iloc[0].batch_size == 8


def test_a_job_that_cannot_fit_is_refused_at_its_start_with_its_numbers(tiny, monkeypatch):
    paths, data_dir = tiny

    def never(*a, **k):
        raise AssertionError("scored although its plan does not fit")

    monkeypatch.setattr(localization, "localize", never)
    plans = _plans(paths, "qwen2", data_dir)
    gb = plans[1] / 0.89 / memory.GB  # batch 1 just fits
    status, table, _ = run_mib([paths["qwen2"], paths["gpt2"]], ["ioi"], ["eap"], n_eval=8, search_paths=[data_dir],
                               batch_size="auto", fractions=(0.5, 1.0), memory_gb=gb * 0.95)  # fmt: skip
    assert list(status.status) == ["not run", "not run"] and table.empty
    reason = status.iloc[0].reason
    assert reason.startswith(f"does not fit: {paths['qwen2']} at batch 1 in float32 is planned ")
    assert f"the budget is {gb * 0.95:.2f} GB" in reason
    assert "gim.mib.dtype: bfloat16" in reason and "a device with more free memory" in reason
    # a set batch that does not fit: refused too, with auto named as a way out
    status, _, _ = run_mib([paths["qwen2"]], ["ioi"], ["eap"], n_eval=8, search_paths=[data_dir],
                           batch_size=8, fractions=(0.5, 1.0), memory_gb=(plans[1] + plans[8]) / 1.8 / memory.GB)  # fmt: skip
    assert status.iloc[0].reason.startswith(f"does not fit: {paths['qwen2']} at batch 8") and "batch_size: auto" in (
        status.iloc[0].reason
    )
    # weights alone over the budget: refused before loading, every dataset's row says so
    status, _, _ = run_mib([paths["qwen2"]], ["ioi", "copycolors_mcqa"], ["eap"], n_eval=8, search_paths=[data_dir],
                           batch_size="auto", memory_gb=0.01)  # fmt: skip
    assert list(status.status) == ["not run"] * 2 and status.reason.str.startswith("does not fit").all()
    assert (status.dtype == "float32").all() and (status.folder == paths["qwen2"]).all()


def test_the_plan_holds_against_the_measured_peaks():
    """results/reference/benchmark_mib_memory.csv (benchmarks/mib_memory.py --measure --write: one fresh process per
    MIB job on the CPU stand-ins, ru_maxrss): each row's plan, worked out again here
    from the stand-in's configuration, is within 25% of the measured peak RSS."""
    import importlib.util
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location("mib_memory", root / "benchmarks/mib_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = pd.read_csv(root / "results/reference/benchmark_mib_memory.csv")
    assert set(bench.MODELS) <= set(rows.model)  # GPT-2 small, Qwen2.5-0.5B, Gemma-2-2B, Llama-3.1-8B
    for r in rows.itertuples():
        shape = bench.shape_of(r.model, int(r.layers_built))
        p = memory.plan(shape, r.method, int(r.batch), int(r.positions), "float32", "cpu", False, "float32")
        assert abs(p["total"] / 1e9 - r.planned_gb) < 1e-3, r
        assert r.status == "ran" and abs(p["total"] / 1e9 / r.peak_rss_gb - 1) <= bench.TOLERANCE, r


def test_the_needs_table_of_the_docs_is_the_plans():
    """docs/MIB.md's table of needs per model and method is what
    ``benchmarks/mib_memory.py --table --positions 32`` prints."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location("mib_memory", root / "benchmarks/mib_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = (root / "docs/MIB.md").read_text()
    assert "`benchmarks/mib_memory.py --table --positions 32`" in doc
    table = re.search(r"<!-- needs-table -->\n(.*?)\n<!-- /needs-table -->", doc, re.S).group(1)
    assert table.strip() == bench.needs_table(32).to_markdown(index=False).strip()
