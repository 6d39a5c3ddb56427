"""The smallest real-size case end to end: a random-weight GPT-2 small (124M, the
published configuration) through the workflow's real-model rules, as a researcher with
the weights would run them (benchmarks/real_size.py; minutes)."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("real_size", ROOT / "benchmarks" / "real_size.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_published_configurations_have_the_published_sizes():
    rs = _bench()
    # parameter counts of the published checkpoints (their model cards), within 1%
    published = {"gpt2": 124.4e6, "gpt2-medium": 354.8e6, "EleutherAI/pythia-160m": 162.3e6,
                 "Qwen/Qwen2.5-0.5B": 494.0e6, "meta-llama/Llama-3.1-8B": 8.03e9}  # fmt: skip
    for name, want in published.items():
        cls, kw = rs.CONFIGS[name]
        assert abs(rs.n_params(cls, kw) - want) / want < 0.01, name
    # Llama-3.1-8B does not fit in fp32 here: its real width with fewer layers
    cls, kw = rs.CONFIGS["meta-llama/Llama-3.1-8B"]
    layers = rs.fitting_layers(cls, kw, 1.6e9)
    assert 1 <= layers < 32 and rs.n_params(cls, {**kw, "num_hidden_layers": layers}) <= 1.6e9
    assert rs.n_params(cls, {**kw, "num_hidden_layers": layers + 1}) > 1.6e9


@pytest.mark.slow
def test_gpt2_small_at_real_size_through_the_workflow(tmp_path):
    from selfrepair.core.models import model_identity

    rs = _bench()
    out = tmp_path / "real_size.csv"
    rs.main(["--models", "gpt2", "--parts", "ioi", "mib:eap", "--n-prompts", "2", "--n-eval", "4",
             "--root", str(tmp_path), "--out", str(out)])  # fmt: skip
    t = pd.read_csv(out).set_index("part")
    assert list(t.index) == ["ioi", "mib:eap"]
    assert t.ran.all(), t.check.to_dict()
    assert (t.params_built == 124439808).all() and (t.layers_built == 12).all()
    assert t.loc["mib:eap", "check"].startswith("32491 edges (MIB: 32491, equal)")
    assert (t.peak_rss_gb > 0.4).all() and (t.cpu_s > 0).all()
    # the status says which model files produced the numbers
    folder = tmp_path / "models" / "gpt2"
    st = pd.read_csv(tmp_path / "runs/gpt2/ioi/results/coax/real/status.csv").set_index("experiment")
    assert st.loc["ioi", "status"] == "ran" and st.loc["ioi", "folder"] == str(folder)
    assert st.loc["ioi", "identity"] == model_identity(folder)
    log = (tmp_path / "runs/gpt2/ioi/logs/coax/real.log").read_text()
    assert f"model gpt2: folder {folder}, identity {model_identity(folder)}" in log
    assert "gpt2 ioi: data seed 11 done in " in log


def test_presence_names_what_is_there_by_hand(tmp_path):
    from selfrepair.core import local_files

    assert local_files.presence(["m"], ["ioi"], [str(tmp_path)]) == "model m: absent\ndataset ioi: absent"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "mib-bench__ioi" / "data").mkdir(parents=True)
    (tmp_path / "mib-bench__ioi" / "data" / "test.jsonl").write_text("{}\n")
    st, sd = (tmp_path / "m" / "config.json").stat(), (tmp_path / "mib-bench__ioi/data/test.jsonl").stat()
    assert local_files.presence(["m"], ["ioi"], [str(tmp_path)]) == (
        f"model m: {tmp_path / 'm'} config.json:2:{st.st_mtime_ns}\n"
        f"dataset ioi: {tmp_path / 'mib-bench__ioi'} data/test.jsonl:3:{sd.st_mtime_ns}"
    )


@pytest.mark.slow
def test_a_cached_not_run_reruns_when_the_weights_arrive(tmp_path):
    import yaml

    import golden_suite as G

    d = G.prepare(tmp_path / "run")
    models = tmp_path / "models"
    extra = tmp_path / "real.yaml"
    extra.write_text(yaml.safe_dump({"coax": {"real": {"search_paths": [str(models)], "ioi_model": "gpt2",
                                                       "wakeup_models": [], "induction_models": []}}}))  # fmt: skip
    args = [*G.tiny_args(d, extra, paper="coax"), "--", "results/coax/real/status.csv"]
    G.snakemake("--cores", "1", *args, timeout=600)
    st = pd.read_csv(d / "results/coax/real/status.csv").set_index("experiment")
    assert st.loc["ioi", "status"] == "not run"
    assert "coax_real" not in G.snakemake("-n", *args).stdout  # nothing changed: nothing to do
    (models / "gpt2").mkdir(parents=True)
    (models / "gpt2" / "config.json").write_text("{}")  # the weights arrive (here: a folder begins to)
    assert "coax_real" in G.snakemake("-n", *args).stdout
