"""The training half of the regression suite (the scoring half, on the committed fixed
weights, is tests/test_workflow.py::test_tiny_run_matches_golden_values)."""

import hashlib
import json
import subprocess
import sys

import pandas as pd
import pytest

import golden_suite as G
from selfrepair.core import models, numerics

sys.path.insert(0, str(G.ROOT / "benchmarks"))
import fingerprint as F  # noqa: E402  the committed fingerprints (benchmarks/fingerprints/)

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
    # The vendor table holds the committed checkpoints under the vendor that trained them,
    # and every model for every other vendor it lists.
    rows = G.vendor_rows()
    assert list(rows.columns) == G.VENDOR_COLUMNS and not rows.duplicated(["model", "cpu_vendor"]).any()
    assert G.vendor_hashes(G.checkpoints_vendor()) == golden
    for vendor in set(rows["cpu_vendor"]):
        assert set(G.vendor_hashes(vendor)) == set(golden), vendor


def test_the_fingerprints_show_both_vendors_training_the_same_bits_under_the_golden_mode():
    """The golden training tests hold one vendor's hashes for every vendor: that stands on
    the committed fingerprints of both vendors, whose 64-step GPT-2 training under
    TRAIN_NUMERICS (as each vendor runs it) gives the same weights; and where two vendors'
    golden rows are both committed, they are equal."""
    evidence = F.cross_vendor(F.committed(), G.TRAIN_NUMERICS)
    assert {"GenuineIntel", "AuthenticAMD"} <= set(evidence["vendors"])
    assert evidence["training_same"] is True, evidence
    vendors = sorted(set(G.vendor_rows()["cpu_vendor"]))
    for v in vendors:
        assert G.vendor_hashes(v) == G.vendor_hashes(vendors[0]), (v, vendors[0])
    # The control: under MKL's COMPATIBLE branch alone (exact before its correctly rounded
    # square root), the two vendors' committed fingerprints train other bits.
    compat = {f["cpu_vendor"]: f["presets"][F.preset_name("compatible", f["cpu_vendor"] != "GenuineIntel", False)]
              for f in F.committed()}  # fmt: skip
    assert (
        compat["GenuineIntel"]["ops"]["gpt2_train64_weights"] != compat["AuthenticAMD"]["ops"]["gpt2_train64_weights"]
    )


# update.py's row writer in its own process (it pins the fast mode before torch loads):
# this machine's rows of each paper in turn, into the file argv[2], of the run folder argv[1].
_WRITE_ROWS = """
import sys
from pathlib import Path
sys.path.insert(0, "tests/golden")
import update
update.G.VENDOR_CHECKPOINTS = Path(sys.argv[2])
for paper in ("heroes", "coax"):
    update.write_vendor_rows(update.G.trained_hashes(Path(sys.argv[1]), (paper,)), (paper,), replace_others=False)
"""


def test_vendor_rows_of_two_papers_written_in_one_call_read_back_through_golden_suite(tmp_path, monkeypatch):
    """update.py --vendor-hashes over several papers: each paper's rows keyed results/<paper>/...
    (the second paper once died in paper_of on the first's unprefixed keys), read back by
    vendor_hashes, the other vendor's rows and the other paper's untouched."""
    run = tmp_path / "run"
    weights = {"results/heroes/sort/seed42": b"heroes", "results/heroes/grid/train/per_example-torch/sort/seed42":
               b"grid", "results/coax/ioi/seed1": b"coax"}  # fmt: skip
    for m, data in weights.items():
        (run / m / "model").mkdir(parents=True)
        (run / m / "model" / "model.safetensors").write_bytes(data)
    other = "GenuineIntel" if numerics.cpu_vendor() != "GenuineIntel" else "AuthenticAMD"
    before = pd.DataFrame([{"model": m, "cpu_vendor": other, "sha256": f"{i}" * 64, "source": "before"}
                           for i, m in enumerate([*weights, "results/gim/arithmetic/tiny/seed0"])])  # fmt: skip
    table = tmp_path / "vendor_checkpoints.csv"
    before.to_csv(table, index=False)
    r = subprocess.run([sys.executable, "-c", _WRITE_ROWS, str(run), str(table)], cwd=G.ROOT, capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    monkeypatch.setattr(G, "VENDOR_CHECKPOINTS", table)
    assert G.vendor_hashes(numerics.cpu_vendor()) == {m: hashlib.sha256(b).hexdigest() for m, b in weights.items()}
    assert G.vendor_hashes(other) == dict(zip(before["model"], before["sha256"]))
    assert {G.paper_of(m) for m in G.vendor_rows()["model"]} == {"heroes", "coax", "gim"}
    cpu = f"{numerics.cpu_model()} (family {numerics.cpu_family().replace('/', ' model ')}), fast mode, "
    rows = G.vendor_rows()
    assert rows[rows["cpu_vendor"] == numerics.cpu_vendor()]["source"].str.startswith(cpu).all()
    # keys as the broken writer had them are refused, naming the form
    with pytest.raises(ValueError, match="results/<paper>"):
        G.with_vendor_rows(before, {"heroes/sort/seed42": "0" * 64}, "x", "y", ("heroes",), replace_others=False)
    with pytest.raises(ValueError, match="results/<paper>"):
        G.with_vendor_rows(before, {"results/coax/ioi/seed1": "0" * 64}, "x", "y", ("heroes",), replace_others=False)


def _committed() -> dict[str, str]:
    return pd.read_csv(G.GOLDEN / "checkpoints.csv").set_index("model")["sha256"].to_dict()


def _expected_hashes() -> dict[str, str]:
    """The golden hashes this CPU must train (G.expected_hashes)."""
    evidence = F.cross_vendor(F.committed(), G.TRAIN_NUMERICS)
    want, _ = G.expected_hashes(numerics.cpu_vendor(), evidence["training_same"])
    if not want:
        pytest.skip(f"no golden hashes for {numerics.cpu_vendor()} CPUs in tests/golden/vendor_checkpoints.csv "
                    "and no committed fingerprint shows it training the same bits as another vendor "
                    "(add them from such a machine: tests/golden/update.py --vendor-hashes)")  # fmt: skip
    return want


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_training_reproduces_the_committed_checkpoints_bit_for_bit(tmp_path):
    """Under TRAIN_NUMERICS (fast) the tiny training run gives, bit for bit, the committed
    weights, whatever the CPU's vendor (written on another run, maybe another vendor's
    machine: G.expected_hashes says which rows hold); with them, the records equal theirs."""
    want = _expected_hashes()
    d = G.prepare(tmp_path)
    G.snakemake("--cores", "2", *G.tiny_args(d), f"numerics={G.TRAIN_NUMERICS}", "--",
                *(f"{m}/train.json" for m in RETRAIN))  # fmt: skip
    got = G.weight_hashes(d)
    for m in RETRAIN:
        assert got[m] == want[m], (
            f"{m}: {G.TRAIN_NUMERICS} training gave other weights than tests/golden/vendor_checkpoints.csv holds for "
            f"{numerics.cpu_vendor()} CPUs, on this one ({numerics.cpu_model()}); see README 'Numerics'"
        )
        if want[m] == _committed()[m]:  # the committed weights: then their records too
            meta = json.loads((d / m / "train.json").read_text())
            gmeta = json.loads((G.CHECKPOINTS / m / "train.json").read_text())
            assert (meta["steps"], meta["id_accuracy"]) == (gmeta["steps"], gmeta["id_accuracy"])


@pytest.mark.slow
def test_native_training_reaches_its_target_like_the_golden(tmp_path):
    """Under `numerics: native` the weights are this CPU's own, so training is checked
    statistically: the reach model gets to its target accuracy within one evaluation
    interval of the golden (TRAIN_NUMERICS) step count."""
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
def test_training_reproduces_the_committed_bc_checkpoints_bit_for_bit(tmp_path, paper):
    """The same for one tiny model of paper B (COAX) and one of paper C (GIM)."""
    m = RETRAIN_BC[paper]
    want = _expected_hashes()
    d = G.prepare(tmp_path)
    r = G.snakemake("--cores", "2", *G.tiny_args(d, paper=paper), f"numerics={G.TRAIN_NUMERICS}", "--", f"{m}/model")
    assert G.ran_training(r.stdout + r.stderr, paper)
    assert G.weight_hashes(d, (paper,)) == {m: want[m]}, (
        f"{m}: {G.TRAIN_NUMERICS} training gave other weights than tests/golden/vendor_checkpoints.csv holds for "
        f"{numerics.cpu_vendor()} CPUs, on this one ({numerics.cpu_model()}); see README 'Numerics'"
    )
    # the files' hashes: the weights are compared above; a committed checkpoint saved before
    # save_model recorded every file has the weights-only record (models.WEIGHTS_KEY)
    record = {models.FILES_KEY, models.WEIGHTS_KEY, models.MADE_KEY}
    meta, gmeta = ({k: v for k, v in G.train_meta(x).items() if k not in record} for x in (d / m, G.CHECKPOINTS / m))
    assert {"config.json", "model.safetensors"} <= set(G.train_meta(d / m)[models.FILES_KEY])
    if want[m] != _committed()[m]:  # this vendor's own weights: the committed records hold other floats
        assert set(meta) == set(gmeta)
        return
    skip = {"numerics", "seconds", "train_seconds"}  # the CPU's name and wall times may differ
    assert {k: v for k, v in meta.items() if k not in skip} == {k: v for k, v in gmeta.items() if k not in skip}
    for name in G.TRAIN_OUTPUTS[paper]:
        if name.endswith(".csv"):  # the training log: losses and accuracies, without wall times
            log, glog = (
                pd.read_csv(f / m / name).drop(columns=["seconds"], errors="ignore") for f in (d, G.CHECKPOINTS)
            )
            pd.testing.assert_frame_equal(log, glog, check_exact=True)
