"""Numerics modes: how far a float result may depend on the machine that computed it.

Float results on a CPU depend on the instruction set that each math library dispatches
to (ATen's vectorized kernels, MKL's BLAS, oneDNN, numpy's SIMD loops) and on the
number of threads (parallel reductions split differently). Two modes:

``portable`` (the default for CPU runs)
    Every library is pinned to its AVX2 code path and each compute job runs on one
    thread (parallelism comes from running jobs side by side). Any x86-64 CPU with AVX2
    then runs the same kernels in the same order, so training and scoring give the same
    bits whatever the CPU's newest instruction set (AVX-512, AMX) or the ``--cores``.
    The pins are environment variables that the libraries read when they load, so they
    must be set before torch (or numpy) is imported: :func:`configure` does that, and
    :func:`check` verifies afterwards that the pin took effect.

``native``
    Each library takes the fastest kernels of this CPU and a job uses the configured
    threads. Results are deterministic on one machine but may move on another.

CUDA runs are never bit-portable (kernels differ across GPUs, drivers and library
versions); :func:`record` says so.

This module must stay importable without importing torch or numpy.
"""

from __future__ import annotations

import logging
import os
import platform
import sys

MODES = ("portable", "native")

# What `portable` pins, and to what. Read by each library when it loads.
PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized CPU kernels (default|avx2|avx512)
    "MKL_CBWR": "AVX2,STRICT",  # MKL conditional numerical reproducibility: AVX2 path
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL: never dispatch above AVX2
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy's SIMD loops at AVX2
}
# Thread pools that the libraries size from the environment when they start.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
PORTABLE_THREADS = 1
# ATen's name for the pinned capability, as torch.backends.cpu.get_cpu_capability() says it.
PORTABLE_CAPABILITY = "AVX2"


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
    if mode not in MODES:
        raise ValueError(f"numerics mode must be one of {MODES}, got {mode!r}")
    return mode


def environment(mode: str, threads: int | None = None, base: dict | None = None) -> dict:
    """The environment a process of ``mode`` must start with (a copy of ``base``,
    by default ``os.environ``, with the pins set or removed)."""
    check_mode(mode)
    env = dict(os.environ if base is None else base)
    if mode == "portable":
        env.update(PINS)
        n = PORTABLE_THREADS
    else:  # remove this module's pins (inherited from a portable parent), keep others'
        for k, v in PINS.items():
            if env.get(k) == v:
                del env[k]
        n = threads
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
    changed = [k for k in PINS if os.environ.get(k) != env.get(k)]
    if "torch" in sys.modules and changed:
        raise NumericsError(
            f"numerics mode {mode!r} set after torch was imported (changes {', '.join(changed)}): "
            "call selfrepair.core.numerics.configure() before importing torch"
        )
    for k in (*PINS, *THREAD_VARS):
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)


def job_threads(mode: str, threads: int) -> int:
    """Threads of one compute job: fixed in portable mode, the configured ones in native."""
    return PORTABLE_THREADS if check_mode(mode) == "portable" else max(1, int(threads))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def can_pin() -> bool:
    """Whether this CPU runs the pinned kernels (x86-64 with AVX2 and FMA)."""
    return platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= cpu_flags()


def apply(mode: str, threads: int, device: str = "cpu") -> int:
    """In a process that has imported torch: verify the pins, set torch's threads.

    Returns the thread count in force. Raises :class:`NumericsError` in portable mode
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

    if check_mode(mode) != "portable":
        return
    missing = {k: os.environ.get(k) for k in PINS if os.environ.get(k) != PINS[k]}
    if missing:
        raise NumericsError(
            f"numerics: portable mode needs {', '.join(f'{k}={PINS[k]}' for k in missing)} "
            "in the environment before torch is imported (selfrepair.core.numerics.configure)"
        )
    cap = torch.backends.cpu.get_cpu_capability()
    if can_pin() and cap != PORTABLE_CAPABILITY:
        raise NumericsError(
            f"numerics: portable mode expects ATen capability {PORTABLE_CAPABILITY}, torch runs {cap}: "
            "torch was imported before the pins were set"
        )
    if torch.get_num_threads() != PORTABLE_THREADS:
        raise NumericsError(
            f"numerics: portable mode runs {PORTABLE_THREADS} thread, torch has {torch.get_num_threads()}"
        )


def record(mode: str, device: str = "cpu") -> dict:
    """What decided this process's float results: stored beside every result."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    portable = mode == "portable" and device == "cpu" and can_pin() and cap == PORTABLE_CAPABILITY
    if device != "cpu":
        why = f"{device} kernels are not bit-portable"
    elif mode != "portable":
        why = "native kernels of this CPU"
    elif not portable:
        why = "this CPU lacks AVX2/FMA: the pinned kernels cannot run here"
    else:
        why = "AVX2 kernels, one thread"
    return {
        "mode": mode,
        "bit_portable": bool(portable),
        "why": why,
        "device": device,
        "threads": torch.get_num_threads(),
        "aten_capability": cap,
        "pins": {k: os.environ.get(k) for k in PINS},
        "cpu": cpu_model(),
        "torch": torch.__version__,
    }


def configure_from_argv(argv: list[str], default: str = "portable") -> str:
    """For command-line tools: read ``--numerics MODE`` (or ``--numerics=MODE``) from
    ``argv`` without consuming it, and :func:`configure` it, before torch is imported.
    The tool's own argument parser declares the same option for its help text."""
    mode = default
    for i, arg in enumerate(argv):
        if arg == "--numerics" and i + 1 < len(argv):
            mode = argv[i + 1]
        elif arg.startswith("--numerics="):
            mode = arg.split("=", 1)[1]
    configure(check_mode(mode))
    return mode
