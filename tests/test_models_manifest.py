"""scripts/models_manifest.py: the list of a run's models with their weights' hashes, the
provenance of reference tables, and `make verify`, which retrains a model and compares
bits, saying first whether this machine should get them back."""

import subprocess
import sys

import pandas as pd
import pytest

import golden_suite as G
from selfrepair.core import numerics

sys.path.insert(0, str(G.ROOT / "scripts"))
import models_manifest as M  # noqa: E402

TINY = ["config/config.yaml", "config/test.yaml"]


def test_manifest_lists_every_model_with_the_hash_of_its_weights():
    table = M.manifest(G.CHECKPOINTS, TINY)
    # the committed hashes (tests/golden/checkpoints.csv) were written by another function
    golden = pd.read_csv(G.GOLDEN / "checkpoints.csv")
    assert dict(zip(table["model"], table["sha256"])) == dict(zip(golden["model"], golden["sha256"]))
    assert set(table["numerics"]) == {G.TRAIN_NUMERICS}
    assert set(table["configfiles"]) == {"config/config.yaml config/test.yaml"}
    assert table["cpu_vendor"].str.len().min() > 0 and "unrecorded" not in set(table["cpu_vendor"])


def test_provenance_needs_one_record_and_keeps_other_rows(tmp_path):
    out = tmp_path / "numerics.csv"
    pd.DataFrame([{"table": "old.csv", "numerics": "fast", "cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC",
                   "commit": "abc", "date": "2026-01-01"}]).to_csv(out, index=False)  # fmt: skip
    M.provenance(["a.csv", "old2.csv"], G.CHECKPOINTS, out)
    got = pd.read_csv(out).set_index("table")
    assert list(got.index) == ["a.csv", "old.csv", "old2.csv"]
    assert got.loc["old.csv", "cpu_vendor"] == "AuthenticAMD"  # a table not named keeps its row
    rec = M.training_record(G.CHECKPOINTS / "results/coax/ioi/seed1")
    assert got.loc["a.csv", "numerics"] == G.TRAIN_NUMERICS and got.loc["a.csv", "cpu_vendor"] == rec["cpu_vendor"]
    # two models with different records: no single provenance, and it says so
    mixed = tmp_path / "mixed"
    for m, vendor in (("results/a/seed1", "GenuineIntel"), ("results/a/seed2", "AuthenticAMD")):
        (mixed / m / "model").mkdir(parents=True)
        (mixed / m / "model" / "model.safetensors").write_bytes(b"x")
        (mixed / m / "train.json").write_text('{"numerics": {"mode": "fast", "cpu_vendor": "%s"}}' % vendor)
    with pytest.raises(SystemExit, match="mixes numerics records"):
        M.provenance(["b.csv"], mixed, out)


def test_provenance_keeps_the_row_of_a_table_committed_unchanged(tmp_path):
    """`make reference` after a partial rerun: a table copied again with the same bytes as
    committed keeps its row (commit, date); a changed or new one gets this run's."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    out = tmp_path / "numerics.csv"
    pd.DataFrame([{"table": t, "numerics": "fast", "cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC",
                   "commit": "abc", "date": "2026-01-01"} for t in ("same.csv", "edited.csv")]).to_csv(out, index=False)  # fmt: skip
    for t in ("same.csv", "edited.csv"):
        (tmp_path / t).write_text("x,y\n1,2\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "reference")
    (tmp_path / "edited.csv").write_text("x,y\n1,3\n")
    (tmp_path / "new.csv").write_text("x\n1\n")
    M.provenance(["same.csv", "edited.csv", "new.csv"], G.CHECKPOINTS, out)
    got = pd.read_csv(out).set_index("table")
    assert list(got.index) == ["edited.csv", "new.csv", "same.csv"]
    assert (got.loc["same.csv", "commit"], got.loc["same.csv", "cpu_vendor"]) == ("abc", "AuthenticAMD")
    assert got.loc["edited.csv", "commit"] != "abc" and got.loc["new.csv", "commit"] != "abc"
    assert got.loc["edited.csv", "numerics"] == G.TRAIN_NUMERICS


def test_make_reference_stamps_provenance_after_writing_every_table_it_names():
    """provenance keeps the row of a table that equals its committed bytes, so it must run
    after every command that writes into results/reference/: run before runtime.csv was
    rewritten, it kept runtime.csv's row of the previous run (984b1a3)."""
    plan = subprocess.run(["make", "-n", "reference"], cwd=G.ROOT, capture_output=True, text=True, check=True)
    lines = plan.stdout.splitlines()
    at = [i for i, line in enumerate(lines) if "models_manifest.py provenance" in line]
    assert len(at) == 1, plan.stdout
    named = lines[at[0]].split("provenance", 1)[1].split()
    assert {"models.csv", "runtime.csv", "published_summary.csv"} <= set(named)
    late = [line for line in lines[at[0] + 1 :] if "results/reference/" in line]
    assert late == [], f"written after the provenance was stamped: {late}"


def test_expectation_follows_the_mode_the_vendor_and_the_fingerprints(monkeypatch):
    monkeypatch.setattr(numerics, "can_pin", lambda: True)
    monkeypatch.setattr(numerics, "cpu_vendor", lambda: "GenuineIntel")
    agree = {"vendors": ["AuthenticAMD", "GenuineIntel"], "training_same": True}
    for mode in ("exact", "fast"):
        ok, why = M.expectation({"numerics": mode, "cpu_vendor": "GenuineIntel"})
        assert ok is True and "this CPU is GenuineIntel too" in why
    # Across vendors: as the committed fingerprints say (both vendors' files are committed:
    # the same training under fast, and under exact with its correctly rounded square root,
    # on the Intel Xeon model 167 and the AMD Zen 5), and as a verdict says when given.
    for mode in ("exact", "fast"):
        ok, why = M.expectation({"numerics": mode, "cpu_vendor": "AuthenticAMD"})
        assert ok is True and "both vendors train the same bits" in why
    ok, why = M.expectation({"numerics": "exact", "cpu_vendor": "AuthenticAMD"}, {**agree, "training_same": False})
    assert ok is False and "training other bits" in why
    ok, why = M.expectation({"numerics": "exact", "cpu_vendor": "AuthenticAMD"}, agree)
    assert ok is True and "both vendors train the same bits" in why
    ok, why = M.expectation({"numerics": "exact", "cpu_vendor": "AuthenticAMD"}, {**agree, "training_same": None})
    assert ok is False and "no committed fingerprint" in why
    assert M.expectation({"numerics": "native", "cpu_vendor": "GenuineIntel"})[0] is False
    monkeypatch.setattr(numerics, "can_pin", lambda: False)
    assert "lacks AVX2" in M.expectation({"numerics": "exact", "cpu_vendor": "GenuineIntel"})[1]


def test_verify_names_a_missing_manifest_and_an_unknown_model(tmp_path):
    with pytest.raises(SystemExit, match="make reference"):
        M.verify("results/x", tmp_path / "none.csv", None, 1)
    f = tmp_path / "models.csv"
    M.manifest(G.CHECKPOINTS, TINY).to_csv(f, index=False)
    with pytest.raises(SystemExit, match="no model .* matches 'results/nothing'"):
        M.verify("results/nothing", f, None, 1)


def test_make_verify_without_a_model_says_how():
    r = subprocess.run(["make", "-s", "verify", "VENV=" + str(G.BIN.parent)], cwd=G.ROOT, capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode != 0 and "MODEL=results/heroes/sort/seed42" in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_verify_retrains_a_model_and_compares_its_bits(tmp_path, capsys, monkeypatch):
    """The toy IOI model of the committed checkpoints as a manifest row of this CPU's
    vendor, with the hash this CPU must train (G.expected_hashes): retrained here under
    the golden mode, the same bits (exit 0); against a wrong hash, exit 1. (A row of the
    other vendor: test_expectation_follows_the_mode_the_vendor_and_the_fingerprints.)
    The wrong-hash check compares the weights the first call retrained (kept, and shown
    above to be the expected bits) instead of training the same model a second time."""
    vendor = numerics.cpu_vendor()
    want, _ = G.expected_hashes(vendor, M.cross_vendor_evidence(G.TRAIN_NUMERICS)["training_same"])
    if not want:
        pytest.skip(f"no golden hashes for {vendor} CPUs in tests/golden/vendor_checkpoints.csv")
    f = tmp_path / "models.csv"
    table = M.manifest(G.CHECKPOINTS, TINY)
    ioi = table["model"] == "results/coax/ioi/seed1"
    table.loc[ioi, ["sha256", "cpu_vendor"]] = [want["results/coax/ioi/seed1"], vendor]
    table.to_csv(f, index=False)
    kept = tmp_path / "kept"
    kept.mkdir()
    assert M.verify("results/coax/ioi/seed*", f, kept, 2) == 0
    out = capsys.readouterr().out
    assert (
        f"expect the same bits: {G.TRAIN_NUMERICS} mode" in out and "SAME BITS" in out and "1 model(s) retrained" in out
    )
    (weights,) = kept.glob("verify-*/results/coax/ioi/seed1/model/model.safetensors")
    assert G.sha256(weights) == want["results/coax/ioi/seed1"]
    calls = []
    monkeypatch.setattr(M, "retrain", lambda folder, *a: calls.append(folder) or weights)
    table.loc[ioi, "sha256"] = "0" * 64
    table.to_csv(f, index=False)
    assert M.verify("results/coax/ioi/seed1", f, None, 2) == 1
    assert "DIFFERENT BITS" in capsys.readouterr().out and calls == ["results/coax/ioi/seed1"]
