"""The numerics mode (src/selfrepair/core/numerics.py): pins, their check, and the claim that
the portable mode gives the same bits whatever the environment asks for."""

import json
import os
import subprocess
import sys

import pytest
import torch

from selfrepair.core import numerics

NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "portable"))


def test_portable_environment_pins_every_library_and_one_thread():
    env = numerics.environment("portable", threads=4, base={"ATEN_CPU_CAPABILITY": "avx512", "HOME": "/h"})
    for k, v in numerics.PINS.items():
        assert env[k] == v
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert env["HOME"] == "/h"


def test_native_environment_removes_the_pins_and_keeps_the_threads():
    base = {**numerics.PINS, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "HOME": "/h"}
    env = numerics.environment("native", threads=3, base=base)
    assert not set(numerics.PINS) - {"ONEDNN_MAX_CPU_ISA"} & set(env)
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"  # a user's own setting stays
    assert env["OMP_NUM_THREADS"] == "3" and env["HOME"] == "/h"


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="'fast'"):
        numerics.environment("fast")
    assert numerics.job_threads("portable", 8) == 1
    assert numerics.job_threads("native", 8) == 8


@pytest.mark.skipif(NUMERICS != "portable", reason="tests run under native numerics")
def test_this_process_runs_portable():
    numerics.check("portable")
    rec = numerics.record("portable")
    assert rec["threads"] == 1 and rec["pins"] == numerics.PINS
    assert rec["bit_portable"] == numerics.can_pin()
    if numerics.can_pin():
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    # torch is loaded: switching the pins now cannot take effect, and says so
    with pytest.raises(numerics.NumericsError, match="after torch was imported"):
        numerics.configure("native")
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"  # nothing was changed


def test_cuda_records_that_it_is_not_bit_portable():
    rec = numerics.record("portable", device="cuda")
    assert rec["bit_portable"] is False and "cuda" in rec["why"]


def _python(code, env):
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return r


def test_missing_pins_fail_loudly():
    env = numerics.environment("native", base=os.environ)
    r = _python(
        "import torch; torch.set_num_threads(1); from selfrepair.core import numerics; numerics.check('portable')", env
    )
    assert r.returncode != 0 and "NumericsError" in r.stderr and "ATEN_CPU_CAPABILITY=avx2" in r.stderr


@pytest.mark.skipif(not {"avx512f"} <= numerics.cpu_flags(), reason="needs a CPU above AVX2 to load torch unpinned")
def test_torch_loaded_before_the_pins_fails_loudly():
    env = numerics.environment("native", base=os.environ)
    code = (
        "import os, torch; torch.backends.cpu.get_cpu_capability()\n"
        "from selfrepair.core import numerics\n"
        "os.environ.update(numerics.PINS); numerics.apply('portable', 1)"
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
def test_portable_training_ignores_the_machines_settings():
    """The emulation of issue 9: the same training under the portable mode, once in this
    environment and once with another machine's instruction-set settings and threads,
    gives identical weights; both ran the pinned kernels on one thread."""
    a = _train("portable", 1, {})
    b = _train("portable", 2, OTHER_MACHINE)
    assert a["cap"] == b["cap"] == "AVX2" and a["threads"] == b["threads"] == 1
    assert a["hash"] == b["hash"]


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_native_training_depends_on_the_kernels():
    """The control: unpinned, the instruction set of one library alone moves the bits, so
    the test above compares something that can differ."""
    a = _train("native", 1, {})
    b = _train("native", 1, {"ATEN_CPU_CAPABILITY": "default"})
    assert a["cap"] != "DEFAULT" and b["cap"] == "DEFAULT"
    assert a["hash"] != b["hash"]
