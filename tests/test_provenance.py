"""Issue 50: a model folder is what its path says (its record names the job that made it
for that folder), and a folder the workflow wrote without its record stops the job."""

import os
import re
from types import SimpleNamespace

import pytest

from job_stub import Named
from selfrepair.core import models, runtime
from selfrepair.tasks import sequences as S


def job(rule, wildcards, inputs=(), outputs=()):
    smk = SimpleNamespace(
        rule=rule,
        wildcards=Named(**wildcards),
        params=Named(seed=wildcards.get("seed", "0"), model={"n_layers": 1}),
        input=Named(**{f"i{k}": v for k, v in enumerate(inputs)}),
        output=Named(**{f"o{k}": v for k, v in enumerate(outputs)}),
    )
    return runtime.job_record(smk)


def toy():
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=1, d_model=8, d_mlp=16, n_ctx=8)
    return models.build_gpt2_toy(cfg, seed=0)


@pytest.fixture
def two_seeds(tmp_path, monkeypatch):
    """results/gim/arithmetic/tiny/seed{0,1}/model, saved as the training job saves them
    (seed 1 first into its ``.partial`` folder, renamed after), under ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    for seed in (0, 1):
        out = f"results/gim/arithmetic/tiny/seed{seed}/model"
        wc = {"task": "arithmetic", "gmodel": "tiny", "seed": str(seed)}
        monkeypatch.setattr(runtime, "JOB", job("gim_train", wc, outputs=[out]))
        save_to = out + ".partial" if seed else out
        models.save_model(toy(), save_to, {"task": "arithmetic", "seed": seed})
        if seed:
            os.rename(save_to, out)
    monkeypatch.setattr(runtime, "JOB", None)
    return tmp_path / "results/gim/arithmetic/tiny"


def test_the_record_names_rule_wildcards_params_and_folder(two_seeds):
    made = models.read_meta(two_seeds / "seed1/model")["made_by"]
    assert made["rule"] == "gim_train"
    assert made["wildcards"] == {"task": "arithmetic", "gmodel": "tiny", "seed": "1"}
    assert made["folder"] == "results/gim/arithmetic/tiny/seed1/model"  # the output, not the .partial folder
    assert re.fullmatch("[0-9a-f]{64}", made["params_sha256"])
    models.load_hf(two_seeds / "seed1/model")  # its own folder: loads
    models.load_hf("results/gim/arithmetic/tiny/seed1/model")  # relative: loads


def test_a_folder_linked_to_another_seeds_model_is_refused_naming_both(two_seeds, monkeypatch):
    """The issue's case: seed1/model -> ../seed0/model loaded silently seed 0's model."""
    import shutil

    shutil.rmtree(two_seeds / "seed1/model")
    (two_seeds / "seed1/model").symlink_to("../seed0/model")
    monkeypatch.setattr(
        runtime, "JOB", job("gim_localize", {"seed": "1"}, inputs=["results/gim/arithmetic/tiny/seed1/model"])
    )
    for load in (models.load_hf, models.load_bridge):
        with pytest.raises(models.ModelElsewhere) as err:
            load("results/gim/arithmetic/tiny/seed1/model")
        msg = str(err.value)
        assert "model folder results/gim/arithmetic/tiny/seed1/model is not this folder's model" in msg
        assert (
            "rule gim_train (gmodel=tiny, seed=0, task=arithmetic) made it for results/gim/arithmetic/tiny/seed0/model"
            in msg
        )
        assert "--forcerun gim_train" in msg
    # a copy is the same case
    (two_seeds / "seed1/model").unlink()
    shutil.copytree(two_seeds / "seed0/model", two_seeds / "seed1/model")
    with pytest.raises(models.ModelElsewhere, match="made it for results/gim/arithmetic/tiny/seed0/model"):
        models.load_hf("results/gim/arithmetic/tiny/seed1/model")


def test_a_results_tree_moved_elsewhere_still_loads(two_seeds, tmp_path):
    os.rename(tmp_path / "results", tmp_path / "moved")
    (tmp_path / "elsewhere").mkdir()
    os.rename(tmp_path / "moved", tmp_path / "elsewhere/results")
    models.load_hf(tmp_path / "elsewhere/results/gim/arithmetic/tiny/seed0/model")


@pytest.mark.parametrize("damage", ["no-selfrepair-json", "hashes-removed"])
def test_a_workflow_folder_without_its_record_is_refused_with_the_fix(two_seeds, monkeypatch, damage):
    """The issue's case 2: delete the record, edit config.json, rerun: it loaded silently."""
    import json

    folder = "results/gim/arithmetic/tiny/seed0/model"
    record = two_seeds / "seed0/model/selfrepair.json"
    if damage == "no-selfrepair-json":
        record.unlink()
    else:
        meta = json.loads(record.read_text())
        del meta["files_sha256"], meta["made_by"]
        record.write_text(json.dumps(meta))
    cfg = two_seeds / "seed0/model/config.json"
    cfg.write_text(cfg.read_text().replace('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": 0.1'))
    monkeypatch.setattr(runtime, "JOB", job("gim_localize", {"seed": "0"}, inputs=[folder]))
    with pytest.raises(models.NoRecord) as err:
        models.load_bridge(folder)
    msg = str(err.value)
    what = "has no selfrepair.json" if damage == "no-selfrepair-json" else "has no file hashes in selfrepair.json"
    assert msg.startswith(f"model folder {folder} {what}")
    assert f"delete {folder} and rerun snakemake" in msg and "--forcerun" in msg
    assert not isinstance(err.value, models.CorruptCheckpoint)  # never turned into a "not run" row
    # a folder the user brings (not an input of the job: real models, search paths) loads
    monkeypatch.setattr(runtime, "JOB", job("gim_mib", {}, inputs=[]))
    models.load_hf(folder)


def test_a_legacy_record_without_provenance_loads_by_its_hashes(two_seeds, monkeypatch):
    """The committed golden checkpoints were saved before ``made_by``: their hashes are
    checked, their folder cannot be."""
    import json

    folder = "results/gim/arithmetic/tiny/seed0/model"
    record = two_seeds / "seed0/model/selfrepair.json"
    meta = json.loads(record.read_text())
    del meta["made_by"]
    record.write_text(json.dumps(meta))
    monkeypatch.setattr(runtime, "JOB", job("gim_localize", {"seed": "0"}, inputs=[folder]))
    models.load_hf(folder)


def test_a_save_outside_a_workflow_job_records_no_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "JOB", None)
    models.save_model(toy(), tmp_path / "m", {"seed": 0})
    assert "made_by" not in models.read_meta(tmp_path / "m")
    models.load_hf(tmp_path / "m")


@pytest.mark.slow
def test_workflow_stops_on_a_seed_linked_to_another_seeds_model(tmp_path):
    """End to end, the issue's case: train seed 0, make seed1/model a symlink to it, ask
    for seed 1's localization: the job stops naming both folders (it printed seed 0's
    numbers as seed 1's before)."""
    import golden_suite as G

    d = G.prepare(tmp_path)
    m0, m1 = "results/gim/arithmetic/tiny/seed0/model", "results/gim/arithmetic/tiny/seed1/model"
    G.snakemake("--cores", "1", *G.tiny_args(d, paper="gim"), "--", m0)
    assert models.read_meta(d / m0)["made_by"]["folder"] == m0
    (d / m1).parent.mkdir(parents=True)
    (d / m1).symlink_to("../seed0/model")
    target = "results/gim/arithmetic/tiny/seed1/localization.csv"
    r = G.snakemake("--cores", "1", *G.tiny_args(d, paper="gim"), "--", target, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and not (d / target).exists()
    assert f"ModelElsewhere: model folder {m1} is not this folder's model" in out, out[-3000:]
    assert f"made it for {m0}" in out


def test_a_copy_loaded_by_hand_outside_the_workflow_is_named_not_refused(two_seeds, tmp_path, caplog):
    """A user who copies a trained model elsewhere and loads it in a notebook gets it, with
    a warning naming both folders; in a workflow job the same load stops (above)."""
    import shutil

    shutil.copytree(two_seeds / "seed0/model", tmp_path / "mine")
    with caplog.at_level("WARNING"):
        models.load_hf(tmp_path / "mine")
    assert f"model folder {tmp_path / 'mine'} is not this folder's model" in caplog.text
    assert "made it for results/gim/arithmetic/tiny/seed0/model" in caplog.text
