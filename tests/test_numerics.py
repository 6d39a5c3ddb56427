"""The numerics modes (src/selfrepair/core/numerics.py): pins, their check, the claim that a
pinned mode gives the same bits whatever the environment asks for, and the fingerprint
comparison with the machines whose kernels are committed (benchmarks/fingerprints/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfrepair.core import numerics

NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "fast"))
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", numerics.PINNED_MODES)
def test_pinned_environment_pins_every_library_and_one_thread(mode):
    env = numerics.environment(mode, threads=4, base={"ATEN_CPU_CAPABILITY": "avx512", "HOME": "/h"})
    for k, v in numerics.MODE_PINS[mode].items():
        assert env[k] == v
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert env["HOME"] == "/h"


def test_the_modes_differ_in_the_mkl_branch_alone():
    """exact = fast but for MKL's reproducibility branch: COMPATIBLE, the one MKL documents
    as the same on Intel and compatible CPUs (its AVX2 branch exists only on Intel)."""
    exact, fast = numerics.MODE_PINS["exact"], numerics.MODE_PINS["fast"]
    assert {k for k in exact if exact[k] != fast[k]} == {"MKL_CBWR"}
    assert exact["MKL_CBWR"] == "COMPATIBLE" and fast["MKL_CBWR"] == "AVX2,STRICT"


@pytest.mark.parametrize("parent", numerics.PINNED_MODES)
def test_native_environment_removes_the_pins_and_keeps_the_threads(parent):
    base = {**numerics.MODE_PINS[parent], "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "HOME": "/h"}
    env = numerics.environment("native", threads=3, base=base)
    assert not set(numerics.PIN_VARS) - {"ONEDNN_MAX_CPU_ISA"} & set(env)
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"  # a user's own setting stays
    assert env["OMP_NUM_THREADS"] == "3" and env["HOME"] == "/h"


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="'fastest'"):
        numerics.environment("fastest")
    with pytest.raises(ValueError, match="'fast' is the old portable mode"):
        numerics.check_mode("portable")
    assert numerics.job_threads("exact", 8) == numerics.job_threads("fast", 8) == 1
    assert numerics.job_threads("native", 8) == 8


@pytest.mark.skipif(NUMERICS == "native", reason="tests run under native numerics")
def test_this_process_runs_its_pinned_mode():
    numerics.check(NUMERICS)
    rec = numerics.record(NUMERICS)
    assert rec["threads"] == 1 and rec["pins"] == numerics.MODE_PINS[NUMERICS]
    assert rec["pinned"] == numerics.can_pin()
    assert rec["cpu_vendor"] == numerics.cpu_vendor() and rec["cpu_vendor"]
    if numerics.can_pin():
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    other = "fast" if NUMERICS == "exact" else "exact"
    # torch is loaded: switching the pins now cannot take effect, and says so
    for mode in ("native", other):
        with pytest.raises(numerics.NumericsError, match="after torch was imported"):
            numerics.configure(mode)
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"  # nothing was changed
    with pytest.raises(numerics.NumericsError, match="MKL_CBWR"):
        numerics.check(other)


def test_records_say_where_the_bits_come_back(monkeypatch):
    monkeypatch.setattr(numerics, "cpu_vendor", lambda: "AuthenticAMD")
    assert "Intel or AMD" in numerics.same_bits_on("exact")
    assert "same vendor (AuthenticAMD)" in numerics.same_bits_on("fast")
    assert numerics.same_bits_on("native") == "this machine only"
    assert numerics.same_bits_on("exact", pinned=False).startswith("this machine only")


def test_cuda_records_that_it_is_not_bit_portable():
    rec = numerics.record("fast", device="cuda")
    assert rec["pinned"] is False and rec["same_bits_on"].startswith("not guaranteed (cuda")


def _python(code, env):
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return r


def test_missing_pins_fail_loudly():
    env = numerics.environment("native", base=os.environ)
    r = _python(
        "import torch; torch.set_num_threads(1); from selfrepair.core import numerics; numerics.check('exact')", env
    )
    assert r.returncode != 0 and "NumericsError" in r.stderr and "ATEN_CPU_CAPABILITY=avx2" in r.stderr


@pytest.mark.skipif(not {"avx512f"} <= numerics.cpu_flags(), reason="needs a CPU above AVX2 to load torch unpinned")
def test_torch_loaded_before_the_pins_fails_loudly():
    env = numerics.environment("native", base=os.environ)
    code = (
        "import os, torch; torch.backends.cpu.get_cpu_capability()\n"
        "from selfrepair.core import numerics\n"
        "os.environ.update(numerics.MODE_PINS['fast']); numerics.apply('fast', 1)"
    )
    r = _python(code, env)
    assert r.returncode != 0 and "torch was imported before the pins were set" in r.stderr


TRAIN = """
import hashlib, json, sys
from selfrepair.core import numerics
numerics.configure(sys.argv[1], threads=int(sys.argv[2]))
import torch
from selfrepair.core import models, train
from selfrepair.tasks import sequences as S
numerics.apply(sys.argv[1], int(sys.argv[2]))
cfg = models.gpt2_toy_config(S.VOCAB, n_layers=2, n_heads=2, d_model=64, d_mlp=256, n_ctx=16)
m = models.build_gpt2_toy(cfg, seed=3, positional=False)
g = torch.Generator().manual_seed(3)
train.train(m, lambda s: S.training_batch("sort", 64, 2, 5, g), lambda mod: 0.0, lr=3e-3,
            max_steps=40, eval_every=1000, target_accuracy=None)
h = hashlib.sha256()
for k, v in sorted(m.state_dict().items()):
    h.update(v.detach().contiguous().numpy().tobytes())
print(json.dumps({"hash": h.hexdigest(), "cap": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))
"""

# What another CPU or another machine's settings would give an unpinned run.
OTHER_MACHINE = numerics.OTHER_CPU_ENV


def _train(mode, threads, extra):
    env = {**os.environ, **extra}
    r = _python(TRAIN.replace("sys.argv[1]", repr(mode)).replace("sys.argv[2]", repr(str(threads))), env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
@pytest.mark.parametrize("mode", numerics.PINNED_MODES)
def test_pinned_training_ignores_the_machines_settings(mode):
    """The same training under a pinned mode, once in this environment and once with
    another machine's instruction-set settings and threads, gives identical weights; both
    ran the pinned kernels on one thread. (Across CPU vendors: the fingerprint test below
    and the golden training test, which trains under exact.)"""
    a = _train(mode, 1, {})
    b = _train(mode, 2, OTHER_MACHINE)
    assert a["cap"] == b["cap"] == "AVX2" and a["threads"] == b["threads"] == 1
    assert a["hash"] == b["hash"]


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_the_two_pinned_modes_train_different_bits():
    """The control for the golden training test: the MKL branch alone moves the weights,
    so training under exact checks something that fast would not reproduce."""
    assert _train("exact", 1, {})["hash"] != _train("fast", 1, {})["hash"]


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_native_training_depends_on_the_kernels():
    """The control: unpinned, the instruction set of one library alone moves the bits, so
    the test above compares something that can differ."""
    a = _train("native", 1, {})
    b = _train("native", 1, {"ATEN_CPU_CAPABILITY": "default"})
    assert a["cap"] != "DEFAULT" and b["cap"] == "DEFAULT"
    assert a["hash"] != b["hash"]


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_exact_kernels_agree_with_every_committed_fingerprint():
    """The exact mode's kernels on this machine hash like those of every machine whose
    fingerprint is committed (benchmarks/fingerprints/: CPUs of both vendors as they are
    measured): GEMMs, linear and attention forward and backward, layer norm, GELU,
    softmax, cross entropy, sums, exp/log/tanh. A third kind of machine sees here what it
    shares with them. The fast mode is compared too, and printed, but agrees only within
    a vendor."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    files = sorted(F.FINGERPRINTS.glob("*.json"))
    assert files, "no committed fingerprints"
    mine = F.fingerprint(["compatible", "avx2-strict"], ops_only=True)
    text, exact_same = F.report(mine, files)
    print(text)
    for f in files:
        other = json.loads(f.read_text())
        for row in F.compare(mine, other):
            assert row["ops"] >= 27, (f.name, row)  # every kernel op, not a subset
            if row["mode"] == "exact":
                assert not row["differ"], f"exact mode kernels differ from {f.name} ({other['cpu']}): {row['differ']}"
            elif row["mode"] == "fast" and other.get("cpu_vendor") == numerics.cpu_vendor():
                assert not row["differ"], f"fast mode kernels differ from the same vendor's {f.name}: {row['differ']}"
    assert exact_same
