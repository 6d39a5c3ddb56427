"""Numerics modes: how far a float result may depend on the machine that computed it.

Float results on a CPU depend on the code path each math library dispatches to (ATen's
vectorized kernels, MKL's BLAS and vector math, oneDNN, numpy's SIMD loops), and MKL
picks its path by CPU vendor as well as by instruction set: it asks itself whether the
CPU is an Intel one (``mkl_serv_intel_cpu_true``) and, when the answer is no, runs other
GEMM and vector-math kernels, whatever ``MKL_CBWR`` asks for. The thread count matters
too (parallel reductions split differently). Three modes:

``fast``
    Every library pinned to its AVX2 code path (MKL ``AVX2,STRICT``), one thread per job,
    and MKL dispatching as on an Intel CPU on every x86-64 CPU: on a CPU of another
    vendor, a one-function library (:data:`INTEL_DISPATCH_SOURCE`, compiled here with the
    system's C compiler, preloaded before torch) answers MKL's vendor check with yes. On
    an Intel CPU nothing is preloaded: MKL's own check answers the same. The same bits on
    Intel and AMD CPUs with AVX2 and FMA, measured on Intel Xeons (family 6 models 167 and
    207, and one at 2.8 GHz) and AMD EPYCs (Zen 3, 4 and 5): the committed fingerprints
    agree in every op and train the same 64-step GPT-2, and the Xeon model 167 and an
    AMD EPYC train every golden checkpoint bit for bit (docs/results/numerics.md).

``exact``
    The same, but MKL on its ``COMPATIBLE`` branch, and torch's square root (MKL's
    ``vmsSqrt``/``vmdSqrt``, which ATen calls) correctly rounded by a second preloaded
    library (:data:`IEEE_SQRT_SOURCE`, on every x86-64 CPU). MKL's own COMPATIBLE square
    root (``mkl_vml_kernel_sSqrt_EXHAynn``) refines the CPU's approximate ``rsqrtps``
    estimate with float products and sums, no FMA, so its last bit follows the vendor's
    ``rsqrtps`` table: that kernel made ``exact`` train other bits on Intel and AMD
    (docs/results/numerics.md, "The kernel that moved exact"). With the square root replaced, the
    same bits on Intel and AMD CPUs with AVX2 and FMA, as ``fast``: measured on an Intel
    Xeon (family 6 model 167) and AMD EPYCs Zen 4 and 5, every op, the training and the
    operation trace. No CPU measured gets more from it than from ``fast`` (on a CPU
    without AVX2, emulated, neither mode holds: ATen's own kernels, ``torch.randn``'s
    among them, move), and it costs about 2x; it stays as a second pinned kernel set, for
    a result that must not hinge on MKL's AVX2 kernels. ``fast`` is the default.

``native``
    Each library takes the fastest kernels of this CPU and a job uses the configured
    threads; MKL dispatches by vendor. Deterministic on one machine, may move on another.

The pins are environment variables that the libraries read when they load, and the
vendor override must be loaded before torch is: :func:`configure` does both, and
:func:`check` verifies afterwards that they took effect.

CUDA runs are never bit-portable (kernels differ across GPUs, drivers and library
versions); :func:`record` says so.

This module must stay importable without importing torch or numpy.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The preloaded C libraries' sources, files and in-force checks live in preload; their names
# stay importable from here (numerics.INTEL_DISPATCH_SOURCE, numerics.ieee_sqrt_in_force, ...).
from selfrepair.core.preload import (  # noqa: F401
    _LIBRARY_PREFIX,
    _LIBRARY_SOURCE,
    _LIBRARY_WHAT,
    IEEE_SQRT_SOURCE,
    IEEE_SQRT_SYMBOL,
    INTEL_DISPATCH_SOURCE,
    INTEL_DISPATCH_SYMBOL,
    _cache_dir,
    _in_force,
    _library_path,
    ieee_sqrt_in_force,
    intel_dispatch_in_force,
    is_override_library,
)

MODES = ("exact", "fast", "native")
PINNED_MODES = ("exact", "fast")
# The default of config/config.yaml and the tools (docs/results/numerics.md): both pinned modes
# give the same bits on Intel and AMD, and fast costs about half of exact.
DEFAULT_MODE = "fast"
# Names that earlier versions accepted, and what to use instead.
RENAMED = {
    "portable": "'portable' was split in two: 'fast' (AVX2 kernels, MKL dispatching as on Intel: the same "
    "bits on Intel and AMD) and 'exact' (MKL's COMPATIBLE branch and a correctly rounded square root: "
    "the same bits on Intel and AMD too, about 2x slower)",
}

# The pins every pinned mode shares. Read by each library when it loads.
_COMMON_PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized CPU kernels (default|avx2|avx512)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL: never dispatch above AVX2
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy's SIMD loops at AVX2
}
# What each pinned mode pins, and to what. MKL_CBWR is MKL's conditional numerical
# reproducibility branch: AVX2 exists only on Intel CPUs (elsewhere MKL runs its AUTO
# branch instead); COMPATIBLE is the same code on every x86-64 vendor.
MODE_PINS = {
    "exact": {**_COMMON_PINS, "MKL_CBWR": "COMPATIBLE"},
    "fast": {**_COMMON_PINS, "MKL_CBWR": "AVX2,STRICT"},
}
PIN_VARS = tuple(MODE_PINS["exact"])
# Thread pools that the libraries size from the environment when they start.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
PINNED_THREADS = 1
# ATen's name for the pinned capability, as torch.backends.cpu.get_cpu_capability() says it.
PINNED_CAPABILITY = "AVX2"
# What each mode promises, in words (stored with every result).
SAME_BITS_ON = {
    "fast": "any x86-64 CPU with AVX2 and FMA (Intel or AMD)",
    "exact": "any x86-64 CPU with AVX2 and FMA (Intel or AMD)",
    "native": "this machine only",
}

INTEL_VENDOR = "GenuineIntel"

# What an unpinned run on another CPU, set up by another user, would ask for: every
# library's newest kernels (AVX-512, AMX) and more threads. The portability checks
# (tests/test_numerics.py, benchmarks/portability.py) run under it to emulate that machine.
OTHER_CPU_ENV = {
    "ATEN_CPU_CAPABILITY": "avx512",
    "MKL_CBWR": "AUTO",
    "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
    "NPY_DISABLE_CPU_FEATURES": "",
    "OMP_NUM_THREADS": "2",
}


class NumericsError(RuntimeError):
    """The requested numerics mode is not in force in this process."""


def check_mode(mode: str) -> str:
    if mode in RENAMED:
        raise ValueError(f"numerics mode {mode!r} is no longer accepted: {RENAMED[mode]}")
    if mode not in MODES:
        raise ValueError(f"numerics mode must be one of {MODES}, got {mode!r}")
    return mode


def pins(mode: str) -> dict:
    """The environment pins of ``mode`` ({} for native)."""
    return dict(MODE_PINS.get(check_mode(mode), {}))


def environment(mode: str, threads: int | None = None, base: dict | None = None) -> dict:
    """The environment a process of ``mode`` must start with (a copy of ``base``,
    by default ``os.environ``, with the pins set or removed)."""
    check_mode(mode)
    env = dict(os.environ if base is None else base)
    preload = [x for x in env.get("LD_PRELOAD", "").split() if not is_override_library(x)]
    if mode in PINNED_MODES:
        env.update(MODE_PINS[mode])
        n = PINNED_THREADS
        preload[:0] = [str(lib) for lib in override_libraries(mode)]
    else:  # remove the pinned modes' pins (inherited from a pinned parent), keep others'
        for k in PIN_VARS:
            if env.get(k) in {p[k] for p in MODE_PINS.values()}:
                del env[k]
        n = threads
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    if n is not None:
        for k in THREAD_VARS:
            env[k] = str(n)
    return env


def configure(mode: str, threads: int | None = None) -> None:
    """Set this process's environment for ``mode``; child processes inherit it.

    Call before torch or numpy is imported (first lines of a script, ``conftest.py``,
    the Snakefile). Raises :class:`NumericsError` when torch was already imported under
    other pins: its kernels are chosen at load time and cannot be changed afterwards.
    """
    env = environment(mode, threads)
    changed = [k for k in PIN_VARS if os.environ.get(k) != env.get(k)]
    libraries = override_libraries(mode) if mode in PINNED_MODES else []
    if "torch" in sys.modules and mode in PINNED_MODES and needs_intel_dispatch() and not intel_dispatch_in_force():
        changed.append("MKL's vendor dispatch")
    if "torch" in sys.modules and mode in PINNED_MODES and needs_ieee_sqrt(mode) and not ieee_sqrt_in_force():
        changed.append("torch.sqrt's kernel")
    if "torch" in sys.modules and changed:
        raise NumericsError(
            f"numerics mode {mode!r} set after torch was imported (changes {', '.join(changed)}): "
            "call selfrepair.core.numerics.configure() before importing torch"
        )
    for k in (*PIN_VARS, *THREAD_VARS, "LD_PRELOAD"):
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)
    for lib in libraries:  # this process: into the global scope before torch loads MKL
        ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL | os.RTLD_NOW)


def job_threads(mode: str, threads: int) -> int:
    """Threads of one compute job: fixed in the pinned modes, the configured ones in native."""
    return PINNED_THREADS if check_mode(mode) in PINNED_MODES else max(1, int(threads))


def _cpuinfo(key: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), empty where they cannot be read."""
    return set((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_family() -> str:
    """The CPU's family and model numbers ('25/1': AMD Zen 3, '26/2': AMD Zen 5), which
    tell apart CPUs that share a model name (a KVM guest's 'AMD EPYC'); '?' where unknown."""
    family, model = _cpuinfo("cpu family"), _cpuinfo("model\t")
    return f"{family}/{model}" if family and model else "?"


def cpu_vendor() -> str:
    """The CPU vendor as the CPU names itself (GenuineIntel, AuthenticAMD, ...), or the
    machine architecture where /proc/cpuinfo has no vendor."""
    return _cpuinfo("vendor_id") or platform.machine() or "unknown"


def can_pin() -> bool:
    """Whether this CPU runs the pinned kernels (x86-64 with AVX2 and FMA)."""
    return platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= cpu_flags()


def needs_intel_dispatch() -> bool:
    """Whether the pinned modes preload MKL's vendor override here: an x86-64 CPU with
    AVX2 and FMA that is not an Intel one (on Intel, MKL's own check says the same)."""
    return can_pin() and cpu_vendor() != INTEL_VENDOR


def needs_ieee_sqrt(mode: str) -> bool:
    """Whether ``mode`` preloads the correctly rounded square root here: the exact mode
    on any x86-64 CPU with AVX2 and FMA, Intel's included (MKL's COMPATIBLE square root
    follows each vendor's rsqrtps)."""
    return mode == "exact" and can_pin()


def override_libraries(mode: str) -> list[Path]:
    """The libraries a pinned ``mode`` preloads before torch on this CPU, compiled once."""
    libs = [intel_dispatch_library()] if needs_intel_dispatch() else []
    return libs + ([ieee_sqrt_library()] if needs_ieee_sqrt(mode) else [])


def _library(kind: str) -> Path:
    """A preloaded library, built once per source in ``$SELFREPAIR_CACHE`` or
    ``~/.cache/selfrepair`` with the system's C compiler ``$CC``, ``cc`` or ``gcc``."""
    lib = _library_path(kind)
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NumericsError(
            f"numerics: on this {cpu_vendor()} CPU this numerics mode preloads {_LIBRARY_WHAT[kind]}, a few lines of "
            "C compiled here, and no C compiler was found (set CC, or install one: apt-get install gcc); "
            "or run numerics: native"
        )
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = tempfile.TemporaryDirectory(dir=lib.parent)
    except OSError as err:
        raise NumericsError(
            f"numerics: the cache folder {lib.parent} cannot be used ({err.strerror or err}): on this "
            f"{cpu_vendor()} CPU this numerics mode preloads {_LIBRARY_WHAT[kind]}, a few lines of C compiled "
            "once into that folder. Make it a writable folder, or set SELFREPAIR_CACHE to one "
            "(SELFREPAIR_CACHE=/some/writable/folder); or run numerics: native"
        ) from None
    with tmp_dir as tmp:
        src, out = Path(tmp) / f"{kind}.c", Path(tmp) / lib.name
        src.write_text(_LIBRARY_SOURCE[kind])
        # -fno-math-errno: sqrtf/sqrt become the sqrtss/sqrtsd instructions (no libm call)
        cmd = [cc, "-shared", "-fPIC", "-O2", "-fno-math-errno", "-o", str(out), str(src), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise NumericsError(f"numerics: compiling {_LIBRARY_WHAT[kind]} with {cc} failed:\n{r.stderr[-2000:]}")
        os.replace(out, lib)  # atomic: concurrent jobs see the whole file or none
    return lib


def intel_dispatch_library() -> Path:
    """The compiled vendor override (:data:`INTEL_DISPATCH_SOURCE`)."""
    return _library("dispatch")


def ieee_sqrt_library() -> Path:
    """The compiled correctly rounded square root (:data:`IEEE_SQRT_SOURCE`)."""
    return _library("sqrt")


def mkl_dispatch(mode: str) -> str:
    """How MKL picks its kernels in this process, in words."""
    if mode not in PINNED_MODES or not can_pin():
        return "by vendor (MKL's own check)"
    if not needs_intel_dispatch():
        return "as on Intel (an Intel CPU)"
    return "as on Intel (selfrepair's vendor override)" if intel_dispatch_in_force() else "by vendor (override MISSING)"


def sqrt_kernel(mode: str) -> str:
    """Whose square root torch.sqrt runs in this process, in words."""
    if not needs_ieee_sqrt(mode):
        return "MKL's (vmsSqrt)"
    return "correctly rounded (selfrepair's IEEE sqrt)" if ieee_sqrt_in_force() else "MKL's (IEEE sqrt MISSING)"


def apply(mode: str, threads: int, device: str = "cpu") -> int:
    """In a process that has imported torch: verify the pins, set torch's threads.

    Returns the thread count in force. Raises :class:`NumericsError` in a pinned mode
    when the pins are missing (the process was started without :func:`configure`).
    """
    import torch

    n = job_threads(mode, threads)
    torch.set_num_threads(n)
    check(mode)
    if device != "cpu":
        logging.warning("numerics: %s runs are not bit-portable (mode %s applies to CPU kernels only)", device, mode)
    return n


def check(mode: str) -> None:
    """Raise :class:`NumericsError` when ``mode`` is not in force in this process."""
    import torch

    if check_mode(mode) not in PINNED_MODES:
        return
    want = MODE_PINS[mode]
    missing = {k: os.environ.get(k) for k in want if os.environ.get(k) != want[k]}
    if missing:
        raise NumericsError(
            f"numerics: {mode} mode needs {', '.join(f'{k}={want[k]}' for k in missing)} "
            "in the environment before torch is imported (selfrepair.core.numerics.configure)"
        )
    cap = torch.backends.cpu.get_cpu_capability()
    if can_pin() and cap != PINNED_CAPABILITY:
        raise NumericsError(
            f"numerics: {mode} mode expects ATen capability {PINNED_CAPABILITY}, torch runs {cap}: "
            "torch was imported before the pins were set"
        )
    if torch.get_num_threads() != PINNED_THREADS:
        raise NumericsError(f"numerics: {mode} mode runs {PINNED_THREADS} thread, torch has {torch.get_num_threads()}")
    if needs_intel_dispatch() and not intel_dispatch_in_force():
        raise NumericsError(
            f"numerics: {mode} mode makes MKL dispatch as on Intel on this {cpu_vendor()} CPU, and the override is "
            "not loaded: torch was imported before selfrepair.core.numerics.configure(), or LD_PRELOAD names a "
            f"library this machine lacks (on a cluster, put $SELFREPAIR_CACHE on a filesystem every node sees; "
            f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r})"
        )
    if needs_ieee_sqrt(mode) and not ieee_sqrt_in_force():
        raise NumericsError(
            f"numerics: {mode} mode replaces MKL's square root with a correctly rounded one, and that library is "
            "not loaded: torch was imported before selfrepair.core.numerics.configure(), or LD_PRELOAD names a "
            f"library this machine lacks (LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r})"
        )


def same_bits_on(mode: str, device: str = "cpu", pinned: bool = True) -> str:
    """Where another machine gets the same bits back, in words."""
    if device != "cpu":
        return f"not guaranteed ({device} kernels differ across GPUs, drivers and library versions)"
    if mode in PINNED_MODES and not pinned:
        return "this machine only (this CPU lacks AVX2/FMA: the pinned kernels cannot run here)"
    return SAME_BITS_ON[mode]


def record(mode: str, device: str = "cpu") -> dict:
    """What decided this process's float results: stored beside every result."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    pinned = mode in PINNED_MODES and device == "cpu" and can_pin() and cap == PINNED_CAPABILITY
    return {
        "mode": mode,
        "pinned": bool(pinned),
        "same_bits_on": same_bits_on(mode, device, pinned),
        "device": device,
        "threads": torch.get_num_threads(),
        "aten_capability": cap,
        "pins": {k: os.environ.get(k) for k in PIN_VARS},
        "mkl_dispatch": mkl_dispatch(mode),
        "sqrt": sqrt_kernel(mode),
        "cpu": cpu_model(),
        "cpu_vendor": cpu_vendor(),
        "torch": torch.__version__,
    }


def configure_from_argv(argv: list[str], default: str | None = None) -> str:
    """For command-line tools: read ``--numerics MODE`` (or ``--numerics=MODE``) from
    ``argv`` without consuming it, and :func:`configure` it, before torch is imported.
    The tool's own argument parser declares the same option for its help text."""
    mode = default or DEFAULT_MODE
    for i, arg in enumerate(argv):
        if arg == "--numerics" and i + 1 < len(argv):
            mode = argv[i + 1]
        elif arg.startswith("--numerics="):
            mode = arg.split("=", 1)[1]
    configure(check_mode(mode))
    return mode
