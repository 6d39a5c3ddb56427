"""The numerics modes (src/selfrepair/core/numerics.py): pins, their check, the claim that a
pinned mode gives the same bits whatever the environment asks for, and the fingerprint
comparison with the machines whose kernels are committed (benchmarks/fingerprints/)."""

import json
import os
import shutil
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


def test_the_vendor_override_is_built_once_and_without_a_compiler_fails_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFREPAIR_CACHE", str(tmp_path))
    lib = numerics.intel_dispatch_library()  # built here with the system's compiler
    assert lib.parent == tmp_path and lib.stat().st_size > 0
    assert numerics.intel_dispatch_library() == lib  # found, not rebuilt
    lib.unlink()
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(numerics.shutil, "which", lambda name: None)
    with pytest.raises(numerics.NumericsError, match="no C compiler was found .* apt-get install gcc"):
        numerics.intel_dispatch_library()


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_pinned_modes_preload_mkls_vendor_override_on_other_vendors_only(monkeypatch, vendor):
    """MKL's vendor override on CPUs that are not Intel ones (both pinned modes); the
    correctly rounded square root in exact mode, on every vendor."""
    monkeypatch.setattr(numerics, "can_pin", lambda: True)
    monkeypatch.setattr(numerics, "cpu_vendor", lambda: vendor)
    lib, sqrt = str(numerics.intel_dispatch_library()), str(numerics.ieee_sqrt_library())
    for mode in numerics.PINNED_MODES:
        env = numerics.environment(mode, base={"LD_PRELOAD": "/x/libother.so"})
        want = [lib] * (vendor != "GenuineIntel") + [sqrt] * (mode == "exact") + ["/x/libother.so"]
        assert env["LD_PRELOAD"].split() == want
        again = numerics.environment(mode, base=env)  # a pinned child of a pinned parent: once
        assert again["LD_PRELOAD"] == env["LD_PRELOAD"]
    # fast from an exact parent drops the square root; native drops both (inherited from a
    # pinned parent) and keeps the user's own preloads
    env = numerics.environment("fast", base={"LD_PRELOAD": f"{lib} {sqrt} /x/libother.so"})
    assert env["LD_PRELOAD"].split() == [lib] * (vendor != "GenuineIntel") + ["/x/libother.so"]
    env = numerics.environment("native", base={"LD_PRELOAD": f"{lib} {sqrt} /x/libother.so"})
    assert env["LD_PRELOAD"] == "/x/libother.so"
    assert "LD_PRELOAD" not in numerics.environment("native", base={"LD_PRELOAD": lib})


_SQRT_COUNT = """
import sys
from selfrepair.core import numerics
numerics.configure(sys.argv[1])
import numpy as np, torch
numerics.apply(sys.argv[1], 1)
x = torch.rand(1_000_000, generator=torch.Generator().manual_seed(0)) * 1e-4  # Adam's second moments
ieee = np.sqrt(x.numpy().astype(np.float64)).astype(np.float32)  # correctly rounded (double, then rounded)
xd = x.double()
# float64: the square root of a double is correctly rounded by IEEE 754 itself (np.sqrt)
print(int((x.sqrt().numpy() != ieee).sum()), int((xd.sqrt().numpy() != np.sqrt(xd.numpy())).sum()),
      int((x[::3].sqrt().numpy() != ieee[::3]).sum()), numerics.sqrt_kernel(sys.argv[1]))
"""


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_exact_mode_square_root_is_correctly_rounded_where_mkls_compatible_one_is_not():
    """The exact mode's torch.sqrt equals the correctly rounded root (float32 via float64,
    which is exact for a float32's root; float64 and strided inputs too) on 10^6 of Adam's
    second moments. The control: MKL_CBWR=COMPATIBLE without the preloaded root, whose
    kernel refines the CPU's approximate rsqrtps without FMA, misses it on thousands."""
    env = numerics.environment("exact", base=os.environ)
    r = subprocess.run([sys.executable, "-c", _SQRT_COUNT, "exact"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    f32, f64, strided, kernel = r.stdout.split(maxsplit=3)
    assert (int(f32), int(f64), int(strided)) == (0, 0, 0) and kernel.startswith("correctly rounded"), r.stdout
    env["LD_PRELOAD"] = " ".join(x for x in env["LD_PRELOAD"].split() if "ieee_sqrt" not in x)
    # the exact mode's pins as they are (configure would load the root again), torch on one thread
    code = _SQRT_COUNT.replace("numerics.configure(sys.argv[1])", "").replace(
        "numerics.apply(sys.argv[1], 1)", "torch.set_num_threads(1)"
    )
    r = subprocess.run([sys.executable, "-c", code, "exact"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    f32, f64, _, _ = r.stdout.split(maxsplit=3)
    assert int(f32) > 10_000 and int(f64) > 1_000, r.stdout  # 165,317 and 12,150 on AMD EPYCs


_RSQRTPS_C = """
#include <immintrin.h>
#include <stddef.h>
void hw_rsqrt(const float *x, float *y, size_t n) {
    for (size_t i = 0; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, _mm_rsqrt_ps(_mm_loadu_ps(x + i)));
}
"""

_EMULATE = """
import ctypes, sys
import numpy as np, torch
torch.set_num_threads(1)
lib = ctypes.CDLL(sys.argv[1])
def rsqrtps(x):
    y = np.empty_like(x)
    lib.hw_rsqrt(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(x.size))
    return y
def ex_sqrt(x, y):  # mkl_vml_kernel_sSqrt_EXHAynn's instructions, float32, no FMA
    c = np.float32(0.5)
    r, h = x * y, y * c
    e = c - r * h
    r1, h1 = r * e + r, h * e + h
    return (x - r1 * r1) * h1 + r1
g = torch.Generator().manual_seed(0)
x = (torch.rand(400_000, generator=g) * 1e-4).numpy()
mkl = torch.from_numpy(x).sqrt().numpy()
exact_y = (1.0 / np.sqrt(x.astype(np.float64))).astype(np.float32)
print(int((ex_sqrt(x, rsqrtps(x)) == mkl).sum()), int((ex_sqrt(x, exact_y) != mkl).sum()))
"""


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_mkls_compatible_square_root_is_this_cpus_rsqrtps_refined_without_fma(tmp_path):
    """Why exact replaced the square root (docs/results/numerics.md, "The kernel that moved exact"):
    under MKL_CBWR=COMPATIBLE, torch.sqrt equals, bit for bit on 400,000 values, two
    float32 Newton steps without FMA from this CPU's own rsqrtps (an instruction whose
    bits the x86 manuals leave to the implementation); from a correctly rounded 1/sqrt
    instead, the same steps give other bits on thousands. If a torch or MKL upgrade
    changes that kernel, this test says so."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the rsqrtps helper")
    (tmp_path / "rsqrt.c").write_text(_RSQRTPS_C)
    lib = tmp_path / "librsqrt.so"
    subprocess.run([cc, "-O2", "-msse", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "rsqrt.c")], check=True)
    env = numerics.environment("exact", base=os.environ)  # MKL's COMPATIBLE branch...
    env["LD_PRELOAD"] = " ".join(x for x in env["LD_PRELOAD"].split() if "ieee_sqrt" not in x)  # ...its own root
    r = subprocess.run([sys.executable, "-c", _EMULATE, str(lib)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    equal, moved = map(int, r.stdout.split())
    assert equal == 400_000 and moved > 10_000, r.stdout


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_exact_mode_without_its_square_root_fails_loudly():
    env = numerics.environment("exact", base=os.environ)
    env["LD_PRELOAD"] = " ".join(x for x in env.get("LD_PRELOAD", "").split() if "ieee_sqrt" not in x)
    r = _python(
        "import torch; torch.set_num_threads(1); from selfrepair.core import numerics; numerics.check('exact')", env
    )
    assert r.returncode != 0 and "square root" in r.stderr and "not loaded" in r.stderr, r.stderr[-2000:]


def test_the_modes_differ_in_the_mkl_branch_alone():
    """exact = fast but for MKL's reproducibility branch: COMPATIBLE (a generic kernel)
    instead of AVX2,STRICT."""
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
    with pytest.raises(ValueError, match="'fast' \\(AVX2 kernels, MKL dispatching as on Intel"):
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
        want = "selfrepair's vendor override" if numerics.needs_intel_dispatch() else "an Intel CPU"
        assert rec["mkl_dispatch"] == f"as on Intel ({want})"
        assert numerics.intel_dispatch_in_force() is numerics.needs_intel_dispatch()
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
    assert "Intel or AMD" in numerics.same_bits_on("fast")
    assert "Intel or AMD" in numerics.same_bits_on("exact")
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_the_two_pinned_modes_train_different_bits():
    """The control for the golden training test: the MKL branch alone moves the weights,
    so training under exact checks something that fast would not reproduce."""
    assert _train("exact", 1, {})["hash"] != _train("fast", 1, {})["hash"]


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_native_training_depends_on_the_kernels():
    """The control: unpinned, the instruction set of one library alone moves the bits, so
    the test above compares something that can differ."""
    a = _train("native", 1, {})
    b = _train("native", 1, {"ATEN_CPU_CAPABILITY": "default"})
    assert a["cap"] != "DEFAULT" and b["cap"] == "DEFAULT"
    assert a["hash"] != b["hash"]


GEMM = """
import hashlib, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(1600, 128, generator=g), torch.randn(128, 512, generator=g)
print(hashlib.sha256((a @ b).numpy().tobytes()).hexdigest()[:16])
"""


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_the_vendor_override_makes_mkl_run_its_intel_kernels():
    """MKL's AVX2 branch without STRICT runs a GEMM whose bits differ between vendors; with
    the override preloaded, this CPU gives the hash that the committed Intel fingerprints
    recorded for it (mm_1600x128x512 under the preset avx2, written on Intel CPUs)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    intel = {f["presets"]["avx2"]["ops"]["mm_1600x128x512"] for f in F.committed() if f["cpu_vendor"] == "GenuineIntel"}
    assert len(intel) == 1
    intel = intel.pop()
    env = numerics.environment("native", base=os.environ)
    env.update({**F.PRESETS["avx2"], "LD_PRELOAD": str(numerics.intel_dispatch_library())})
    r = _python(GEMM, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == intel
    if numerics.needs_intel_dispatch():  # the control: without it, this vendor's own kernel
        del env["LD_PRELOAD"]
        assert _python(GEMM, env).stdout.strip() != intel


@pytest.mark.skipif(not numerics.needs_intel_dispatch(), reason="an Intel CPU: MKL needs no vendor override")
def test_a_pinned_process_without_the_override_fails_loudly():
    env = numerics.environment("fast", base=os.environ)
    env.pop("LD_PRELOAD")
    code = "import torch\nfrom selfrepair.core import numerics\nnumerics.apply('fast', 1)"
    r = _python(code, env)
    assert r.returncode != 0 and "the override is not loaded" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_kernels_agree_with_every_committed_fingerprint_as_the_modes_promise():
    """Both modes' kernels on this machine, as it runs them (on a CPU that is not an Intel
    one, with MKL's vendor override), hashed and compared with every committed fingerprint
    (benchmarks/fingerprints/: CPUs of both vendors): under fast and under exact, every
    kernel op agrees with every file that ran the mode (their promise: the same bits on
    Intel and AMD). A third kind of machine sees here what it shares with them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    files = sorted(f for f in F.FINGERPRINTS.glob("*.json") if "-trace-" not in f.name)
    assert files, "no committed fingerprints"
    vendor = numerics.cpu_vendor()
    mine = F.fingerprint([F.mode_preset(m, vendor) for m in ("exact", "fast")], ops_only=True)
    text, modes_same = F.report(mine, files)
    print(text)
    compared = set()
    for f in files:
        other = json.loads(f.read_text())
        for row in F.compare(mine, other):
            if row["mode"]:
                assert row["ops"] >= 27 and not row["differ"], (
                    f"{row['mode']} mode kernels differ from {f.name}: {row['differ']}"
                )
                compared.add((row["mode"], other["cpu_vendor"]))
    assert {(m, v) for m in ("exact", "fast") for v in ("GenuineIntel", "AuthenticAMD")} <= compared
    assert modes_same


_RANDN = """
import hashlib, torch
big = torch.randn(1600, 128, generator=torch.Generator().manual_seed(0))
small = torch.randn(8, generator=torch.Generator().manual_seed(0))
print(torch.backends.cpu.get_cpu_capability(), *(hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in (big, small)))
"""


@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
@pytest.mark.parametrize("mode", numerics.PINNED_MODES)
def test_on_a_cpu_without_avx2_emulated_torch_randn_itself_moves_so_neither_mode_holds(mode):
    """Why no mode promises anything on a CPU without AVX2 (docs/results/numerics.md): with every
    library capped at SSE4.2 (fingerprint.py --emulate, ATen's DEFAULT kernels), the mode's
    pins give other random draws than on an AVX2 CPU (ATen's vectorized normal sampler
    runs from 16 values on; 8 values take the scalar path and agree), so the weights of a
    model differ before its first step, whatever MKL branch the mode asks for."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    preset = F.mode_preset(mode, numerics.cpu_vendor())
    got = {}
    for emulate in (None, "sse4_2"):
        r = _python(_RANDN, F._child_env(preset, emulate))
        assert r.returncode == 0, r.stderr[-2000:]
        got[emulate] = r.stdout.split()
    assert got[None][0] == "AVX2" and got["sse4_2"][0] == "DEFAULT"
    assert got[None][1] != got["sse4_2"][1] and got[None][2] == got["sse4_2"][2]


def _fp(vendor, presets):
    return {"cpu": vendor, "cpu_vendor": vendor, "presets": {p: {"ops": ops} for p, ops in presets.items()}}


def test_preset_names_parse_to_their_branch_and_preloads_and_the_modes_name_theirs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    assert F.parse_preset("compatible+intel-dispatch+ieee-sqrt") == ("compatible", True, True)
    assert F.parse_preset("avx2-strict") == ("avx2-strict", False, False)
    assert F.mode_preset("exact", "GenuineIntel") == "compatible+ieee-sqrt"
    assert F.mode_preset("exact", "AuthenticAMD") == "compatible+intel-dispatch+ieee-sqrt"
    assert F.mode_preset("fast", "AuthenticAMD") == "avx2-strict+intel-dispatch"
    for bad, why in [("avx3", "unknown preset"), ("compatible+sqrt", "unknown preset"),
                     ("compatible+ieee-sqrt+ieee-sqrt", "unknown preset"),
                     ("compatible+ieee-sqrt+intel-dispatch", "is written 'compatible\\+intel-dispatch\\+ieee-sqrt'")]:  # fmt: skip
        with pytest.raises(SystemExit, match=why):
            F.parse_preset(bad)


@pytest.mark.parametrize("mode", numerics.PINNED_MODES)
def test_committed_fingerprints_and_traces_of_both_vendors_agree_under_each_pinned_mode(mode):
    """Both pinned modes promise the same bits on Intel and AMD (numerics.SAME_BITS_ON): every
    committed fingerprint that ran the mode (as its vendor runs it) agrees with every other
    on every op both measured, the 64-step training among them on both vendors, and so do
    the committed operation traces of the mode, per target."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    assert "Intel or AMD" in numerics.SAME_BITS_ON[mode]
    load = {f.name: json.loads(f.read_text()) for f in F.FINGERPRINTS.glob("*.json")}
    files = {n: f for n, f in load.items() if "-trace-" not in n}
    differ, vendors = F.disagreements(files, mode)
    assert not differ, differ
    assert {"GenuineIntel", "AuthenticAMD"} <= vendors
    trained = {f["cpu_vendor"] for f in files.values()
               if "gpt2_train64_weights" in f["presets"].get(F.mode_preset(mode, f["cpu_vendor"]), {}).get("ops", {})}  # fmt: skip
    assert {"GenuineIntel", "AuthenticAMD"} <= trained
    differ, vendors = F.trace_disagreements({n: t for n, t in load.items() if "-trace-" in n}, mode)
    assert not differ, differ
    assert {"GenuineIntel", "AuthenticAMD"} <= vendors
    # the check sees a disagreement: one op of one vendor's file moved
    intel = _fp("GenuineIntel", {F.mode_preset(mode, "GenuineIntel"): {"mm": "a", "sum": "s"}})
    amd = _fp("AuthenticAMD", {F.mode_preset(mode, "AuthenticAMD"): {"mm": "a", "sum": "t"},
                               F.MODE_PRESET[mode]: {"mm": "b"}})  # fmt: skip
    assert F.disagreements({"i": intel, "a": amd}, mode) == (["a vs i: sum"], {"GenuineIntel", "AuthenticAMD"})
    t = json.loads((F.FINGERPRINTS / "intel-xeon-model167-amx-trace-gpt2-exact.json").read_text())
    moved = {**t, "cpu_vendor": "AuthenticAMD", "preset": F.mode_preset("exact", "AuthenticAMD"),
             "trace": [dict(x) for x in t["trace"]]}  # fmt: skip
    moved["trace"][-1]["out"] = ["0" * 12]
    differ, _ = F.trace_disagreements({"i": t, "m": moved}, "exact")
    assert len(differ) == 1 and "first divergence at op 2288" in differ[0]


def test_cross_vendor_reads_each_file_as_its_vendor_runs_the_mode():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    intel = _fp("GenuineIntel", {"avx2-strict": {"mm": "a", "gpt2_train64_weights": "w"}})
    amd = _fp("AuthenticAMD", {"avx2-strict": {"mm": "a", "gpt2_train64_weights": "x"},
                               "avx2-strict+intel-dispatch": {"mm": "a", "gpt2_train64_weights": "w"}})  # fmt: skip
    ev = F.cross_vendor([intel, amd], "fast")
    assert ev == {"vendors": ["AuthenticAMD", "GenuineIntel"], "ops": {"mm": "same", "gpt2_train64_weights": "same"},
                  "training_same": True}  # fmt: skip
    amd["presets"]["avx2-strict+intel-dispatch"]["ops"]["gpt2_train64_weights"] = "y"
    assert F.cross_vendor([intel, amd], "fast")["training_same"] is False
    del amd["presets"]["avx2-strict+intel-dispatch"]  # AMD never ran the mode as the mode runs there
    assert F.cross_vendor([intel, amd], "fast") == {"vendors": ["GenuineIntel"], "ops": {}, "training_same": None}
    rows = F.compare(intel, _fp("GenuineIntel", {"avx2-strict": {"mm": "b"}}))
    assert rows[0] == {"preset": "avx2-strict", "mode": "fast", "ops": 1, "differ": ["mm"]}


def test_compare_traces_names_the_first_kernel_whose_inputs_agree_and_outputs_differ():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    def tr(*ops):
        return {"cpu": "c", "preset": "p", "trace": [{"op": o, "in": i, "out": out, "shape": []} for o, i, out in ops]}

    a = tr(
        ("aten.empty.memory_format", [], ["u1"]),
        ("aten.addmm.default", ["x"], ["y"]),
        ("aten.sqrt.default", ["y"], ["z"]),
    )
    b = tr(
        ("aten.empty.memory_format", [], ["u2"]),
        ("aten.addmm.default", ["x"], ["y"]),
        ("aten.sqrt.default", ["y"], ["q"]),
    )
    text = F.compare_traces(a, b)  # the uninitialized buffer of aten.empty is not a divergence
    assert "first divergence at op 2: aten.sqrt.default" in text and "inputs agree: this kernel differs" in text
    assert "SAME: 3 operations agree" in F.compare_traces(a, a)
    c = tr(("aten.empty.memory_format", [], ["u1"]), ("aten.mm.default", ["x"], ["y"]))
    assert "different call sequence" in F.compare_traces(a, c)


@pytest.mark.slow
@pytest.mark.skipif(not numerics.can_pin(), reason="this CPU cannot run the pinned (AVX2) kernels")
def test_fast_training_traces_like_the_committed_trace_operation_for_operation():
    """Two GPT-2 training steps under fast, as this CPU runs them, give every ATen
    operation's inputs and outputs of the committed fast-mode trace (written on an AMD
    EPYC): on that machine's vendor the determinism of the mode, on another vendor its
    promise, op by op."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint as F

    committed = json.loads((F.FINGERPRINTS / "amd-epyc-zen3-trace-gpt2-fast.json").read_text())
    mine = F.trace(F.mode_preset("fast", numerics.cpu_vendor()), "gpt2", 2)
    text = F.compare_traces(mine, committed)
    assert f"SAME: {len(committed['trace'])} operations agree" in text, text


def test_cpu_family_reads_family_and_model_not_model_name(monkeypatch):
    """'model\\t\\t: 2' is the model number; 'model name' (the line before it in a KVM guest's
    cpuinfo, 'AMD EPYC' for Zen 3 and Zen 5 alike) must not be taken for it."""
    info = {"cpu family": "26", "model\t": "2", "model name": "AMD EPYC"}
    monkeypatch.setattr(numerics, "_cpuinfo", lambda key: info.get(key))
    assert numerics.cpu_family() == "26/2"
    monkeypatch.setattr(numerics, "_cpuinfo", lambda key: None)
    assert numerics.cpu_family() == "?"


@pytest.mark.parametrize("where", ["SELFREPAIR_CACHE", "HOME"])
def test_an_unusable_cache_folder_is_named_with_why_and_the_fix(monkeypatch, tmp_path, where):
    """Issue 50: a cache folder that cannot be made ended in FileExistsError and a traceback
    that said neither why the folder is needed nor that SELFREPAIR_CACHE picks another."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    if where == "HOME":
        monkeypatch.delenv("SELFREPAIR_CACHE", raising=False)
        monkeypatch.setenv("HOME", str(blocker))
        folder = blocker / ".cache" / "selfrepair"
    else:
        monkeypatch.setenv("SELFREPAIR_CACHE", str(blocker / "cache"))
        folder = blocker / "cache"
    with pytest.raises(numerics.NumericsError) as err:
        numerics.ieee_sqrt_library()
    msg = str(err.value)
    assert msg.startswith(f"numerics: the cache folder {folder} cannot be used (Not a directory)")
    assert "the correctly rounded square root, a few lines of C compiled once into that folder" in msg
    assert "set SELFREPAIR_CACHE to one" in msg and "numerics: native" in msg
