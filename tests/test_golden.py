"""The training half of the regression suite (the scoring half, on the committed fixed
weights, is tests/test_workflow.py::test_tiny_run_matches_golden_values)."""

import json

import pandas as pd
import pytest

import golden_suite as G
from selfrepair.core import numerics

# One model of each training protocol the tiny DAG uses (the paper's v3 protocol and the
# authors'-code protocol of the grid); all eight are committed.
RETRAIN = [
    "results/heroes/sort/seed42",
    "results/heroes/grid/train/per_example-torch/reverse/seed42",
]
# One tiny model each of papers B and C (all of their models are committed too): the toy
# IOI model (head-dropout training) and one GIM arithmetic model, about 6 s of training each.
RETRAIN_BC = {"coax": "results/coax/ioi/seed1", "gim": "results/gim/arithmetic/tiny/seed0"}


def test_committed_checkpoints_match_their_hashes():
    golden = pd.read_csv(G.GOLDEN / "checkpoints.csv").set_index("model")["sha256"].to_dict()
    assert G.weight_hashes(G.CHECKPOINTS) == golden
    assert set(RETRAIN) | set(RETRAIN_BC.values()) <= set(golden)
    assert {G.paper_of(m) for m in golden} == set(G.PAPERS)
    for m in golden:
        meta = G.train_meta(G.CHECKPOINTS / m)
        assert meta["numerics"]["mode"] == G.TRAIN_NUMERICS and meta["numerics"]["pinned"]


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_exact_training_reproduces_the_committed_checkpoints_bit_for_bit(tmp_path):
    """Under the exact mode the tiny training run gives the committed weights exactly, on
    any x86-64 CPU with AVX2, Intel or AMD (they were written on another run, maybe
    another CPU of another vendor: train.json says which)."""
    d = G.prepare(tmp_path)
    G.snakemake("--cores", "2", *G.tiny_args(d), f"numerics={G.TRAIN_NUMERICS}", "--",
                *(f"{m}/train.json" for m in RETRAIN))  # fmt: skip
    golden = pd.read_csv(G.GOLDEN / "checkpoints.csv").set_index("model")["sha256"]
    got = G.weight_hashes(d)
    for m in RETRAIN:
        assert got[m] == golden[m], (
            f"{m}: exact training gave other weights than tests/golden/checkpoints on this CPU "
            f"({numerics.cpu_model()}, {numerics.cpu_vendor()}); see README 'Numerics'"
        )
        meta = json.loads((d / m / "train.json").read_text())
        gmeta = json.loads((G.CHECKPOINTS / m / "train.json").read_text())
        assert (meta["steps"], meta["id_accuracy"]) == (gmeta["steps"], gmeta["id_accuracy"])


@pytest.mark.slow
def test_native_training_reaches_its_target_like_the_golden(tmp_path):
    """Under `numerics: native` the weights are this CPU's own, so training is checked
    statistically: the reach model gets to its target accuracy within one evaluation
    interval of the golden (exact) step count."""
    golden = pd.read_csv(G.GOLDEN / "training.csv").iloc[0]
    d = G.prepare(tmp_path)
    G.snakemake("--cores", "1", *G.tiny_args(d, G.reach_config(d)), "numerics=native", "--", G.reach_target(d))
    meta = json.loads((d / G.reach_target(d)).read_text())
    assert meta["numerics"]["mode"] == "native"
    assert meta["reached_target"] and bool(golden["reached_target"])
    assert abs(meta["steps"] - golden["steps"]) <= G.TRAIN_REACH["eval_every"], (meta["steps"], golden["steps"])


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
@pytest.mark.parametrize("paper", sorted(RETRAIN_BC))
def test_exact_training_reproduces_the_committed_bc_checkpoints_bit_for_bit(tmp_path, paper):
    """The same for one tiny model of paper B (COAX) and one of paper C (GIM)."""
    m = RETRAIN_BC[paper]
    d = G.prepare(tmp_path)
    r = G.snakemake("--cores", "2", *G.tiny_args(d, paper=paper), f"numerics={G.TRAIN_NUMERICS}", "--", f"{m}/model")
    assert G.ran_training(r.stdout + r.stderr, paper)
    golden = pd.read_csv(G.GOLDEN / "checkpoints.csv").set_index("model")["sha256"]
    assert G.weight_hashes(d, (paper,)) == {m: golden[m]}, (
        f"{m}: exact training gave other weights than tests/golden/checkpoints on this CPU "
        f"({numerics.cpu_model()}, {numerics.cpu_vendor()}); see README 'Numerics'"
    )
    meta, gmeta = G.train_meta(d / m), G.train_meta(G.CHECKPOINTS / m)
    skip = {"numerics", "seconds", "train_seconds"}  # the CPU's name and wall times may differ
    assert {k: v for k, v in meta.items() if k not in skip} == {k: v for k, v in gmeta.items() if k not in skip}
    for name in G.TRAIN_OUTPUTS[paper]:
        if name.endswith(".csv"):  # the training log: losses and accuracies, without wall times
            log, glog = (
                pd.read_csv(f / m / name).drop(columns=["seconds"], errors="ignore") for f in (d, G.CHECKPOINTS)
            )
            pd.testing.assert_frame_equal(log, glog, check_exact=True)
