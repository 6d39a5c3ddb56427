"""A CUDA device emulated on a CPU-only torch: the device check of ``make test``.

CI has no GPU, so every test runs where all tensors share one device, and a host tensor
that meets the model's tensors on a GPU (token ids fed to an embedding, an eval set left
on the host) goes unseen there. Under ``install()`` a tensor moved to ``cuda`` (``.to``,
``.cuda()``, a module's ``.to``, a factory given ``device="cuda"``) becomes an
``EmulatedCuda`` tensor: the same CPU memory and the same CPU kernels, but it reports
``device cuda:0`` and an op that mixes it with a host tensor of one or more dimensions
raises as CUDA does ("Expected all tensors to be on the same device"), as does turning it
into numpy without ``.cpu()``. Nothing numeric changes; it only says where the host and the
device would meet.

What CUDA accepts is accepted here too (no false alarms): host index tensors in advanced
indexing (``x[idx]``, ``x[idx] = v``), a host 0-dimensional tensor as an operand,
``copy_`` across devices (``load_state_dict``). Autograd calls tensor and module backward
hooks with plain tensors; the hooks registered while emulating get theirs back as device
tensors (``register_hook``, a module's full backward (pre-)hooks).

Where it is used: ``SELFREPAIR_EMULATE_CUDA=1`` makes ``core.device.resolve_device``
install it and accept ``cuda`` on a machine without one (a Snakemake job then runs its
rule's code on the emulated device; common.smk plans ``device=cuda`` there); the tests of
tests/test_device_check.py call ``install()`` directly. Never in a real run: it is slower
than plain CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

ENV = "SELFREPAIR_EMULATE_CUDA"
CUDA = torch.device("cuda", 0)
_T = torch.Tensor


class DeviceMismatch(RuntimeError):
    """A host tensor met an (emulated) CUDA tensor in one op."""


def _plain(t):
    return t.as_subclass(_T) if isinstance(t, EmulatedCuda) else t


def _to_device(x):
    if isinstance(x, _T) and not isinstance(x, EmulatedCuda):
        with torch._C.DisableTorchFunctionSubclass():
            return x.as_subclass(EmulatedCuda)
    return x


def _is_cuda(device) -> bool | None:
    """True for a cuda device, False for another, None when ``device`` is None."""
    if device is None:
        return None
    if isinstance(device, int):
        return True  # an ordinal: a CUDA device
    return torch.device(device).type == "cuda"


def _target(func, args, kwargs) -> bool | None:
    """Where ``func`` puts its result: True (cuda), False (host), None (where its inputs are)."""
    if func in (_T.to, _T.cuda, _T.cpu):
        if func is _T.cuda:
            return True
        if func is _T.cpu:
            return False
        rest = args[1:]
        if rest and isinstance(rest[0], _T):
            return isinstance(rest[0], EmulatedCuda)
        if isinstance(kwargs.get("other"), _T):
            return isinstance(kwargs["other"], EmulatedCuda)
        return _is_cuda(torch._C._nn._parse_to(*rest, **kwargs)[0])
    return _is_cuda(kwargs.get("device"))


def _move(func, args, kwargs):
    """``func(*args, **kwargs)`` with the cuda device taken out (the CPU build would refuse
    it); a tensor moved comes back as a copy, as from a copy across devices."""
    if func in (_T.to, _T.cuda, _T.cpu):
        x, rest, kw = args[0], args[1:], {}
        if func is _T.to and rest and isinstance(rest[0], _T):
            kw["dtype"] = rest[0].dtype
        elif func is _T.to and isinstance(kwargs.get("other"), _T):
            kw["dtype"] = kwargs["other"].dtype
        elif func is _T.to:
            _, dtype, _, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
            kw = {k: v for k, v in (("dtype", dtype), ("memory_format", memory_format)) if v is not None}
        with torch._C.DisableTorchFunctionSubclass():
            out = _T.to(x, **kw)
        return out.clone() if out is x else out
    kwargs = dict(kwargs)
    if "device" in kwargs:
        kwargs["device"] = "cpu"
    return func(*args, **kwargs)


# Ops whose host tensor arguments CUDA accepts beside device tensors: the indices of
# advanced indexing (and the value written through them), and copies across devices.
_MIXED_OK = {_T.__getitem__, _T.__setitem__, _T.copy_, _T.index_put_, torch.index_put}


_INDEXING = {_T.__getitem__, _T.__setitem__, _T.index_put_, torch.index_put}


def _check(func, args, kwargs) -> None:
    if func in _INDEXING and not isinstance(args[0], EmulatedCuda):
        if any(isinstance(t, EmulatedCuda) for t in tree_flatten(args[1])[0]):
            raise DeviceMismatch(
                "indices should be either on cpu or on the same device as the indexed tensor (cpu) "
                f"(a host tensor indexed by cuda indices; emulated CUDA, {ENV})"
            )
    flat, _ = tree_flatten((args, kwargs))
    tensors = [a for a in flat if isinstance(a, _T)]
    on_device = [t for t in tensors if isinstance(t, EmulatedCuda)]
    host = [t for t in tensors if not isinstance(t, EmulatedCuda) and t.dim() > 0]
    if on_device and host and func not in _MIXED_OK:
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
        raise DeviceMismatch(
            f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
            f"({name} got a host tensor of shape {tuple(host[0].shape)} beside a cuda tensor; emulated CUDA, "
            f"{ENV}): move it to the model's device where it enters the computation"
        )
    gen = kwargs.get("generator")
    if on_device and isinstance(gen, torch.Generator) and gen.device.type != "cuda":
        raise DeviceMismatch(f"Expected a 'cuda' device type for generator but found '{gen.device.type}' (emulated)")


def _wrap_hook(hook):
    """A backward hook that gets device tensors (autograd passes plain ones)."""

    @functools.wraps(hook)
    def wrapped(*args):
        with torch._C._EnableTorchFunction():
            out = hook(*tree_map(_to_device, args))
        return tree_map(_plain, out)

    return wrapped


class EmulatedCuda(torch.Tensor):
    """A CPU tensor that reports, and is checked as, a CUDA tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == _T.device.__get__:
            return CUDA
        if func == _T.is_cuda.__get__:
            return True
        if func == _T.is_cpu.__get__:
            return False
        if func in (_T.numpy, _T.__array__):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                f"memory first. (emulated CUDA, {ENV})"
            )
        if func is _T.__reduce_ex__:  # saved as the plain tensor it holds
            with torch._C.DisableTorchFunctionSubclass():
                return _T.__reduce_ex__(_plain(args[0]), *args[1:])
        if func is torch._has_compatible_shallow_copy_type:  # a module's .to makes new parameters
            return type(args[0]) is type(args[1])
        if func is _T.register_hook:
            args = (args[0], _wrap_hook(args[1]), *args[2:])
        target = _target(func, args, kwargs)
        if target is None:
            _check(func, args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs) if target is None else _move(func, args, kwargs)
        if target is False:
            return tree_map(_plain, out)
        if func in _NO_WRAP:
            return out
        return tree_map(_to_device, out)


_NO_WRAP = {_T.data_ptr, _T.untyped_storage, _T.__repr__, _T.__format__, _T.tolist, _T.item}


class _CudaMode(TorchFunctionMode):
    """Turns moves to cuda and factories given a cuda device into EmulatedCuda tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = _target(func, args, kwargs)
        if target is True and not any(issubclass(t, EmulatedCuda) for t in types):
            return tree_map(_to_device, _move(func, args, kwargs))
        return func(*args, **kwargs)


_MODE: _CudaMode | None = None


def installed() -> bool:
    return _MODE is not None


def requested() -> bool:
    """Whether this process is to emulate CUDA (``SELFREPAIR_EMULATE_CUDA=1``)."""
    return os.environ.get(ENV) == "1"


def install() -> None:
    """Emulate CUDA in this process from now on (idempotent): the mode, and module
    backward hooks that get device tensors."""
    global _MODE
    if _MODE is not None:
        return
    _MODE = _CudaMode()
    _MODE.__enter__()
    m = torch.nn.Module
    for name in ("register_full_backward_hook", "register_full_backward_pre_hook", "register_backward_hook"):
        original = getattr(m, name)

        def patched(self, hook, *a, _original=original, **kw):
            return _original(self, _wrap_hook(hook), *a, **kw)

        setattr(m, name, patched)
        _ORIGINALS[name] = original


_ORIGINALS: dict = {}


def uninstall() -> None:
    """Back to plain CPU tensors (the tests' fixture)."""
    global _MODE
    if _MODE is None:
        return
    _MODE.__exit__(None, None, None)
    _MODE = None
    for name, original in _ORIGINALS.items():
        setattr(torch.nn.Module, name, original)
    _ORIGINALS.clear()
