"""The shared core every paper uses: models, training, components and interventions,
attribution, statistics and analysis, published claims, plots, runtime and numerics.

Imports nothing from the paper packages. Kept free of imports so that torch-free
modules (``numerics``) stay importable without torch: the names below load their module
on first use.

The door for a model of one's own (docs/OWN_MODEL.md):

- ``load_bridge(folder)``: a local model folder (``config.json`` and safetensors weights,
  any architecture TransformerLens 4 boots) or a name found in the local Hugging Face
  cache, as a TransformerBridge (papers B, C and the ground truth);
- ``load_hf(folder)``: the same folder as the plain Hugging Face model (paper A's G and
  C, and the ground truth's ablation engine, take a GPT-2 this way);
- ``resolve_local(name_or_path)``: the folder ``load_bridge`` would boot (a name's
  Hugging Face cache snapshot), for ``load_hf``.

Both work offline: importing them sets ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE``
(unless already set) and nothing is ever downloaded. Absent weights raise
``ModelNotFound`` (a FileNotFoundError naming the places looked at); a folder without
``config.json`` or weights, or with weights that do not fit the config,
``CorruptCheckpoint``; NaN or infinite weights ``NonFiniteWeights``; a folder
``save_model`` wrote whose files changed since ``WeightsChanged``. Components are
named ``L3H3`` (layer 3, head 3) and ``L1MLP`` everywhere (``parse``,
``all_components``, ``head_components``).
"""

from selfrepair.core.lazy import lazy_exports

_LAZY = {
    "models": [
        "load_bridge",
        "load_hf",
        "resolve_local",
        "ModelNotFound",
        "CorruptCheckpoint",
        "NonFiniteWeights",
        "WeightsChanged",
    ],
    "components": ["Component", "parse", "all_components", "head_components"],
}
__all__ = [*(name for names in _LAZY.values() for name in names)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
