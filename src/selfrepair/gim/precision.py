"""MIB's precision per model: the dtype the MIB rules load each model in
(``gim.mib.dtype``), resolved from the model's ``config.json`` and the device.

MIB's circuit track loads Qwen, Gemma and Llama in bfloat16 and GPT-2 in float32; its
activation buffers take the model's dtype. Gemma-3 (``gemma3_text``, not a MIB model) is
planned and loaded as Gemma-2 is. ``auto`` uses that precision on a GPU and
float32 on the CPU (bf16 matmuls are slow on CPUs without bf16 units, and their bits
differ across vendors); ``mib`` uses it everywhere; ``float32`` and ``bfloat16`` force one.
"""

from __future__ import annotations

import json
from pathlib import Path

SETTINGS = ("auto", "mib", "float32", "bfloat16")

# config.json's model_type -> the dtype MIB's circuit track loads it in; any other
# architecture (the project's toys) keeps float32. MIB has no Gemma-3: it takes MIB's
# precision for its family, Gemma-2's bfloat16, so that a Gemma-3 run compares with
# MIB's Gemma-2 runs
MIB_DTYPES = {
    "gpt2": "float32",
    "qwen2": "bfloat16",
    "gemma2": "bfloat16",
    "gemma3_text": "bfloat16",
    "llama": "bfloat16",
}

BYTES = {"float32": 4, "bfloat16": 2}


def mib_dtype(model_type: str) -> str:
    """The dtype MIB's own code loads a ``model_type`` in (float32 when MIB has none)."""
    return MIB_DTYPES.get(model_type, "float32")


def resolve(setting: str, model_type: str, device: str) -> str:
    """``gim.mib.dtype``'s dtype name for one model on ``device``; ValueError naming the
    allowed settings for any other."""
    if setting not in SETTINGS:
        raise ValueError(f"gim.mib.dtype {setting!r} is not one of {SETTINGS}")
    if setting == "auto":
        return mib_dtype(model_type) if str(device).startswith("cuda") else "float32"
    if setting == "mib":
        return mib_dtype(model_type)
    return setting


def model_type(folder: str | Path) -> str:
    """The ``model_type`` a model folder's ``config.json`` names ("" when it has none)."""
    f = Path(folder) / "config.json"
    return json.loads(f.read_text()).get("model_type", "") if f.exists() else ""


def torch_dtype(name: str):
    """The torch dtype of a dtype name of :data:`BYTES`."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
