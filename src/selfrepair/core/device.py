"""Which torch device a job runs on: the one place that turns ``auto`` / ``cpu`` /
``cuda[:N]`` into a device and fails loudly when the one asked for is absent."""

from __future__ import annotations

import torch


def resolve_device(device: str = "auto") -> str:
    """With SELFREPAIR_EMULATE_CUDA=1 (the device check, core/emulated_cuda.py), 'cuda'
    is a CUDA device emulated on this CPU, and 'auto' stays 'cpu'."""
    from selfrepair.core import emulated_cuda

    if emulated_cuda.requested() and device != "auto" and device.startswith("cuda"):
        emulated_cuda.install()
        return "cuda"
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', not {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available here")
    return device
