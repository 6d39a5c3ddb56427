"""GGUF files (llama.cpp's format) as model folders: what a file holds (architecture,
quantization, tokenizer), the checks that refuse, naming the file, one that ``transformers``
cannot turn into a model, and the conversion into a float32 safetensors folder.

:func:`convert` dequantizes a file with ``transformers`` (``gguf_file=``) and saves the
model with its tokenizer through :func:`models.save_model`, so the checks every load makes
on a trained model's folder (``WeightsChanged``, ``CorruptCheckpoint``,
``NonFiniteWeights``) cover it; its ``selfrepair.json`` records where the file came from,
its SHA-256 and its quantization. The workflow converts each file once, into
``results/lms/<name>/model`` (rule ``lm_convert``): a packaged model under its name
(:mod:`selfrepair.core.packaged_lms`), a user's file under :func:`file_key`, and
:func:`local_files.find_model` maps a ``.gguf`` path to that folder.

Where a file converts to (:func:`file_key`, :func:`converted_folder`) lives in
:mod:`selfrepair.core.local_files`, which the workflow's parse imports without torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# where a file converts to (torch-free, read by the workflow's parse), importable from here too
from selfrepair.core.local_files import (  # noqa: F401
    LMS_DIR,
    converted_folder,
    file_key,
    file_sha256,
    is_gguf_path,
    user_files,
)
from selfrepair.core.model_files import CorruptCheckpoint

MAGIC = b"GGUF"


class BadGGUF(CorruptCheckpoint):
    """A ``.gguf`` file that cannot become a model folder; the message names the file, what
    is wrong and what to do."""


def quantization_name(file_type: int | None) -> str | None:
    """llama.cpp's name of a ``general.file_type`` (3: ``Q4_1``, 15: ``Q4_K_M``, 0: ``F32``)."""
    from gguf import LlamaFileType

    if file_type is None:
        return None
    try:
        name = LlamaFileType(int(file_type)).name
    except ValueError:
        return f"unknown file type {int(file_type)}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _reader(path: Path):
    """The file read with ``gguf.GGUFReader``; BadGGUF for a file that is none, or cut short."""
    from gguf import GGUFReader

    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != MAGIC:
        raise BadGGUF(
            f"{path} is not a GGUF file: it starts with {head!r}, a GGUF file with {MAGIC!r}. "
            "Give the .gguf file itself (llama.cpp's format), or the model's folder (config.json and weights)"
        )
    cut = f"{path} is truncated or damaged ({size} bytes)"
    try:
        reader = GGUFReader(str(path))
    except Exception as err:  # the reader fails in many ways on a file cut short
        raise BadGGUF(
            f"{cut}: cannot read its header ({type(err).__name__}: {err}). Copy or download it again"
        ) from err
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)  # absolute offsets
    if end > size:
        raise BadGGUF(f"{cut}: its tensors end at byte {end}. Copy or download it again")
    return reader


def _string(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def gguf_info(path: str | Path) -> dict:
    """What a GGUF file holds: ``architecture``; ``file_type`` (``general.file_type``) and
    ``quantization``, its llama.cpp name; ``tensor_types`` (ggml type name -> number of
    tensors); ``tokenizer`` (``tokenizer.ggml.model``, None without one). BadGGUF for a
    file that is not GGUF or is cut short."""
    path = Path(path)
    r = _reader(path)
    ftype = r.fields.get("general.file_type")
    file_type = int(ftype.parts[ftype.data[0]][0]) if ftype is not None else None
    kinds: dict[str, int] = {}
    for t in r.tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    has_tokens = "tokenizer.ggml.tokens" in r.fields
    return {
        "architecture": _string(r, "general.architecture"),
        "file_type": file_type,
        "quantization": quantization_name(file_type),
        "tensor_types": dict(sorted(kinds.items())),
        "tokenizer": _string(r, "tokenizer.ggml.model") if has_tokens else None,
    }


def loadable_architectures() -> set[str]:
    """The ``general.architecture`` values transformers' GGUF loader builds a model of."""
    from transformers.integrations.gguf.utils import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # the config mapping's keys, less the two that name metadata sections, not models
    return (set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_ARCHS)) - {"general", "tokenizer"}


def undequantizable(info: dict) -> list[str]:
    """The file's tensor types that its architecture's loader cannot turn into floats:
    transformers' own dequantizer for the architectures it loads itself (``GGUF_ARCHS``),
    else the ``gguf`` package's ``dequantize`` (its other architectures' path), tried on
    one block of zeros."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
    from transformers.integrations.gguf.dequant import GGML_BLOCK
    from transformers.integrations.gguf.utils import GGUF_ARCHS

    bad = []
    for name in info["tensor_types"]:
        qtype = GGMLQuantizationType[name]
        if name in ("F32", "F16", "BF16"):
            continue
        if info["architecture"] in GGUF_ARCHS:
            if int(qtype) not in GGML_BLOCK:
                bad.append(name)
            continue
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
        except NotImplementedError:
            bad.append(name)
    return bad


def check_gguf(path: str | Path) -> dict:
    """:func:`gguf_info` of a file that transformers can turn into a model with its
    tokenizer; BadGGUF naming the file otherwise: not GGUF, cut short, an architecture or
    a quantization type transformers cannot load, no tokenizer."""
    import transformers

    path = Path(path)
    info = gguf_info(path)
    arch, tv = info["architecture"], f"transformers {transformers.__version__}"
    if arch is None:
        raise BadGGUF(f"{path} has no general.architecture in its metadata: not a model llama.cpp wrote")
    loadable = loadable_architectures()
    if arch not in loadable:
        raise BadGGUF(
            f"{path}: architecture {arch!r}, which {tv} cannot load from a GGUF file (it loads "
            f"{', '.join(sorted(loadable))}). Use the model's own folder (config.json and safetensors), "
            "or a GGUF of a supported architecture"
        )
    bad = undequantizable(info)
    if bad:
        raise BadGGUF(
            f"{path}: tensors of quantization type {', '.join(bad)} (file type {info['quantization']}), "
            f"which {tv} cannot dequantize. Use a GGUF of another quantization (F32, F16, BF16, Q8_0, "
            "Q4_K_M, ...: llama.cpp's llama-quantize writes one), or the model's own folder"
        )
    if info["tokenizer"] is None:
        raise BadGGUF(
            f"{path} holds no tokenizer (no tokenizer.ggml.tokens in its metadata), and the analyses need "
            "one. Convert the model again with llama.cpp's convert_hf_to_gguf.py from a folder that has "
            "its tokenizer, or use the model's own folder"
        )
    return info


def _load(path: Path):
    """(tokenizer, float32 model) that transformers builds from the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as err:  # whatever transformers raises: named with the file
        raise BadGGUF(f"transformers cannot load {path}: {type(err).__name__}: {err}") from err
    cfg = loaded.config
    # save_pretrained refuses a GGUF-loaded model ("quantized with gguf"), although every
    # weight is float32 now: the same architecture built from the config, the weights copied
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    return tok, model.eval()


def convert(gguf: str | Path, folder: str | Path, source: dict) -> dict:
    """Dequantize ``gguf`` into a float32 safetensors model folder with its tokenizer, and
    record ``source`` (where the file came from) with the GGUF's SHA-256, architecture and
    quantization in the folder's ``selfrepair.json``. Returns that record; BadGGUF (naming
    the file) for a file that cannot become one (:func:`check_gguf`)."""
    from selfrepair.core.models import save_model

    gguf = Path(gguf)
    info = check_gguf(gguf)
    tok, model = _load(gguf)
    record = {"source": {**source, "gguf_sha256": file_sha256(gguf), **info}}
    save_model(model, folder, meta=record, tokenizer=tok.save_pretrained)
    return record


SCRATCH = ".converting"  # beside a converted folder: one conversion's intermediate files


@contextmanager
def scratch(parent: str | Path) -> Iterator[Path]:
    """A folder for one conversion's intermediate files (a packaged model's chunks joined:
    hundreds of MB), ``<parent>/.converting``, removed at the end. What a killed
    conversion left beside the folder (that folder, or an older run's ``tmp*`` folder of
    ``.gguf`` files) is removed first, and said in the log."""
    import logging
    import shutil

    parent = Path(parent)
    d = parent / SCRATCH
    older = [p for p in parent.glob("tmp*") if p.is_dir() and all(f.suffix == ".gguf" for f in p.iterdir())]
    for p in [d, *older] if d.exists() else older:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        logging.getLogger(__name__).warning(
            "removing %s (%.0f MB), left by a conversion that was killed", p, size / 1e6
        )
        shutil.rmtree(p)
    d.mkdir(parents=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_user_file(path: str | Path, key: str) -> None:
    """BadGGUF, naming the file and the way out, when a user's file that the workflow's
    parse found as ``key`` is gone or holds another content by the time it is converted."""
    p = Path(path)
    if not p.is_file():
        raise BadGGUF(
            f"{path} is gone since the workflow started (it was to be converted into {LMS_DIR}/{key}/model): "
            "put it back and rerun snakemake, or name another model"
        )
    now = file_key(p)
    if now != key:
        raise BadGGUF(
            f"{path} changed since the workflow started (it was {key}, it is {now}): rerun snakemake, "
            f"which converts it as it is now into {LMS_DIR}/{now}/model"
        )
