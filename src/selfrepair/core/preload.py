"""The two C libraries that the pinned numerics modes preload before torch
(:mod:`selfrepair.core.numerics`): their sources (MKL's vendor check answered 'Intel'; a
correctly rounded square root), the file each is built into (in ``$SELFREPAIR_CACHE`` or
``~/.cache/selfrepair``, one per source) and whether each is in force in this process.
numerics builds them (:func:`selfrepair.core.numerics.intel_dispatch_library`) and
imports these names back (``numerics.X`` works as before).

This module must stay importable without importing torch or numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

# MKL's vendor check, answered 'Intel' (the pinned modes, on CPUs of other vendors). torch's
# libtorch_cpu exports MKL's own mkl_serv_intel_cpu_true and calls it through its symbol
# table, so a library loaded before it into the global scope (LD_PRELOAD for child
# processes, dlopen with RTLD_GLOBAL in this one) takes its place.
INTEL_DISPATCH_SOURCE = """\
/* selfrepair (src/selfrepair/core/numerics.py): MKL's vendor check answered 'Intel', so that
   MKL runs the kernels it runs on Intel CPUs (the numerics modes exact and fast). */
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
"""
INTEL_DISPATCH_SYMBOL = "mkl_serv_intel_cpu_true"

# torch.sqrt correctly rounded (the exact mode, every x86-64 CPU). ATen computes sqrt of a
# float or double tensor with MKL's vmsSqrt/vmdSqrt (aten/src/ATen/cpu/vml.h), called
# through the symbol table like the vendor check above. Under MKL_CBWR=COMPATIBLE MKL's
# kernel starts from rsqrtps, an instruction whose result the x86 manuals leave to the
# implementation (relative error at most 1.5 * 2^-12), and refines it without FMA: 16-20%
# of its results are 1 ulp off the correctly rounded root, and which ones depends on the
# CPU's rsqrtps table. SSE2's sqrtss/sqrtsd are IEEE 754 (correctly rounded) everywhere.
IEEE_SQRT_SOURCE = """\
/* selfrepair (src/selfrepair/core/numerics.py): MKL's vector square roots, which ATen calls
   for torch.sqrt, correctly rounded (IEEE 754 sqrtss/sqrtsd) instead of MKL's COMPATIBLE
   kernel, whose last bit follows the CPU's approximate rsqrtps (the numerics mode exact).
   MKL_INT is int (LP64), the mode argument MKL_INT64. */
#include <math.h>
void vmsSqrt(const int n, const float *a, float *r, const long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrtf(a[i]);
}
void vmdSqrt(const int n, const double *a, double *r, const long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrt(a[i]);
}
"""
IEEE_SQRT_SYMBOL = "vmsSqrt"


def _cache_dir() -> Path:
    return Path(os.environ.get("SELFREPAIR_CACHE") or Path.home() / ".cache" / "selfrepair")


_LIBRARY_PREFIX = {"dispatch": "libselfrepair_mkl_intel_dispatch", "sqrt": "libselfrepair_ieee_sqrt"}
_LIBRARY_SOURCE = {"dispatch": INTEL_DISPATCH_SOURCE, "sqrt": IEEE_SQRT_SOURCE}
_LIBRARY_WHAT = {"dispatch": "MKL's vendor override", "sqrt": "the correctly rounded square root"}


def is_override_library(path: str) -> bool:
    """Whether ``path`` is one of selfrepair's preloaded libraries (any source version)."""
    return Path(path).name.startswith(tuple(_LIBRARY_PREFIX.values()))


def _library_path(kind: str) -> Path:
    tag = hashlib.sha256(_LIBRARY_SOURCE[kind].encode()).hexdigest()[:12]
    return _cache_dir() / f"{_LIBRARY_PREFIX[kind]}-{tag}.so"


def _in_force(kind: str, symbol: str) -> bool:
    """Whether ``symbol`` resolves to the ``kind`` library in this process's global scope."""
    lib = _library_path(kind)
    if not lib.exists():
        return False
    try:
        found = ctypes.CDLL(None)[symbol]
    except (AttributeError, OSError):
        return False
    ours = ctypes.CDLL(str(lib))[symbol]
    return ctypes.cast(found, ctypes.c_void_p).value == ctypes.cast(ours, ctypes.c_void_p).value


def intel_dispatch_in_force() -> bool:
    """Whether MKL's vendor check resolves to the override in this process's global scope."""
    return _in_force("dispatch", INTEL_DISPATCH_SYMBOL)


def ieee_sqrt_in_force() -> bool:
    """Whether MKL's vmsSqrt resolves to the correctly rounded one in this process."""
    return _in_force("sqrt", IEEE_SQRT_SYMBOL)
