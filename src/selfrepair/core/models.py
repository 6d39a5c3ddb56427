"""Every model is a Hugging Face ``transformers`` model; analysis goes through one door.

Toy models are small configurations of real architectures, trained from scratch and
saved with ``save_pretrained`` (safetensors). ``load_bridge`` boots any local model
folder (or a name in the local Hugging Face cache) through TransformerLens 4's
``TransformerBridge.boot_transformers`` with the hub switched off, the same path that
loads GPT-2 or Llama.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from selfrepair.core.device import resolve_device  # noqa: E402,F401  (models.resolve_device, as before)


class ModelNotFound(FileNotFoundError):
    """Weights of a requested model are not on this machine."""


class CorruptCheckpoint(RuntimeError):
    """A checkpoint exists but cannot be read."""


class NonFiniteWeights(ValueError):
    """A checkpoint holds NaN or infinite values; ``file`` and ``tensor`` name the first."""

    def __init__(self, message: str, file: Path, tensor: str):
        super().__init__(message)
        self.file, self.tensor = file, tensor


def gpt2_toy_config(
    vocab_size: int,
    n_layers: int = 4,
    n_heads: int = 4,
    d_model: int = 128,
    d_mlp: int = 512,
    n_ctx: int = 64,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
):
    """GPT-2 configuration of paper A's model: exact GELU, no dropout, untied unembedding."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_ctx,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        n_inner=d_mlp,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


def _torch_default_init(model: nn.Module) -> None:
    """PyTorch's default initialization, as the authors' plain-PyTorch code gets it.

    Linear-like weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (what
    ``nn.Linear.reset_parameters`` gives); embeddings N(0, 1); LayerNorm 1 and 0.
    GPT-2's ``Conv1D`` stores weights as [in, out], so fan_in is its first dimension.
    """
    from transformers.pytorch_utils import Conv1D

    for mod in model.modules():
        if isinstance(mod, Conv1D):
            bound = 1.0 / math.sqrt(mod.weight.shape[0])
            nn.init.uniform_(mod.weight, -bound, bound)
            nn.init.uniform_(mod.bias, -bound, bound)
        elif isinstance(mod, nn.Linear):
            mod.reset_parameters()
        elif isinstance(mod, nn.Embedding):
            nn.init.normal_(mod.weight, 0.0, 1.0)
        elif isinstance(mod, nn.LayerNorm):
            mod.reset_parameters()


def build_gpt2_toy(config, init: str = "transformers", seed: int = 0, positional: bool = False):
    """A freshly initialized GPT-2 LM.

    ``init``: ``transformers`` (GPT-2's own N(0, 0.02) scheme) or ``torch`` (PyTorch
    defaults, the authors' code). ``positional=False`` zeroes the position table and
    freezes it, so position reaches the model only through the causal mask.
    """
    from transformers import GPT2LMHeadModel

    if init not in ("transformers", "torch"):
        raise ValueError(f"init must be 'transformers' or 'torch', not {init!r}")
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    if init == "torch":
        torch.manual_seed(seed)
        _torch_default_init(model)
    if not positional:
        with torch.no_grad():
            model.transformer.wpe.weight.zero_()
        model.transformer.wpe.weight.requires_grad_(False)
    return model


def save_model(model, folder: str | Path, meta: dict | None = None, tokenizer=None) -> None:
    """``save_pretrained`` (safetensors), then ``tokenizer`` (a callable that writes the
    tokenizer files into the folder, if any), then ``selfrepair.json``: the metadata
    ``meta`` (if any) and, under ``files_sha256``, the SHA-256 of every file the save wrote
    (config.json, generation_config.json, the weights, the tokenizer's files), which every
    load checks (a model folder is a Snakemake ``directory()`` output, so Snakemake does
    not notice a file inside it that changed).

    The weights files are rewritten through ``runtime.atomic_path``: ``save_pretrained``
    (safetensors) leaves them 0o600, and they get the permissions of every other output
    (0o666 less the umask, and any default ACL)."""
    from selfrepair.core import runtime

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for f in sorted(folder.glob("*.safetensors")):
        data = f.read_bytes()  # small files (the largest toy model: a few MB)
        with runtime.atomic_path(f) as tmp:
            tmp.write_bytes(data)
    if tokenizer is not None:
        tokenizer(folder)
    hashes = {f.name: _sha256(f) for f in _recordable(folder)}
    if meta is not None and runtime.NUMERICS_RECORD is not None:  # trained in a workflow job: how its floats came about
        meta = {**meta, "numerics": runtime.NUMERICS_RECORD}
    if meta is not None and runtime.JOB is not None:  # trained in a workflow job: which model this is
        meta = {**meta, MADE_KEY: made_by(runtime.JOB, folder)}
    runtime.write_json(folder / "selfrepair.json", {**(meta or {}), FILES_KEY: hashes})


MADE_KEY = "made_by"  # selfrepair.json: the workflow job that made the model (rule, wildcards, folder)


def made_by(job: dict, folder: Path) -> dict:
    """The provenance a workflow job records in the model it saves in ``folder``: its rule,
    wildcards and parameters' SHA-256, and the output folder the model is (``folder``, or
    the output it is renamed to: a ``<output>.partial`` folder saved first)."""
    here = os.path.abspath(str(folder))
    target = os.path.normpath(str(folder))
    for out in job.get("outputs", []):
        if here in (os.path.abspath(out), os.path.abspath(out) + ".partial"):
            target = out
            break
    return {
        "rule": job["rule"],
        "wildcards": job["wildcards"],
        "params_sha256": job["params_sha256"],
        "folder": Path(target).as_posix(),
    }


FILES_KEY = "files_sha256"  # selfrepair.json: {file name: SHA-256} of every file save_model wrote
WEIGHTS_KEY = "weights_sha256"  # the older record: the weights files only (folders saved before FILES_KEY)
# The files of a model folder that the record covers (config, weights, tokenizer).
_MODEL_FILES = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt")
# A weights file that appears after the save (another shard, a .bin beside the safetensors)
# changes what loads and is refused too; a tokenizer added later (tests and users save one
# beside an existing model) is not in the record and is not checked.
_WEIGHT_FILES = ("*.safetensors", "*.bin")


def _recordable(folder: Path) -> list[Path]:
    return sorted({f for pat in _MODEL_FILES for f in folder.glob(pat) if f.is_file() and f.name != "selfrepair.json"})


def _sha256(f: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


class WeightsChanged(RuntimeError):
    """A file of a model folder (its config, weights or tokenizer) differs from the one
    ``save_model`` wrote there, is gone, or appeared since.

    Not a CorruptCheckpoint: callers that turn an unreadable model into a "not run" status
    must not do so for an edited one."""


def check_unchanged(folder: str | Path) -> None:
    """Raise WeightsChanged, naming the folder, the file and the fix, if a file that
    ``save_model`` recorded in ``selfrepair.json`` no longer has its SHA-256 or is gone,
    or (for a ``files_sha256`` record) a weights file appeared that the save did not write.

    Folders with the older ``weights_sha256`` record have their weights checked only.
    Folders without a record (saved before the record existed, a Hugging Face cache
    snapshot) are not checked: they load as before."""
    folder = Path(folder)
    meta = read_meta(folder)
    key = FILES_KEY if FILES_KEY in meta else WEIGHTS_KEY
    recorded = meta.get(key)
    if recorded is None:
        return  # an older folder, saved before save_model recorded hashes
    if not isinstance(recorded, dict):
        raise CorruptCheckpoint(
            f"{folder / 'selfrepair.json'}: key {key!r} is a {type(recorded).__name__}, "
            "not an object of file names and SHA-256 digests"
        )
    fix = (
        f"Retrain it: delete {folder} and rerun snakemake (or rerun with --forcerun <its training rule>); "
        "or undo the edit"
    )
    for name, want in sorted(recorded.items()):
        f = folder / name
        now = _sha256(f) if f.exists() else "(file missing)"
        if now != want:
            raise WeightsChanged(
                f"model folder {folder} changed since it was saved: {name} sha256 {want} recorded "
                f"in selfrepair.json, {now} now. {fix}"
            )
    if key == FILES_KEY:
        new = sorted({f.name for pat in _WEIGHT_FILES for f in folder.glob(pat)} - set(recorded))
        if new:
            raise WeightsChanged(
                f"model folder {folder} changed since it was saved: {', '.join(new)} appeared "
                f"(not among the files recorded in selfrepair.json). {fix}"
            )


class ModelElsewhere(WeightsChanged):
    """A model folder whose record names another folder: a symlink or copy of another
    model where the workflow expects the one its own rule made."""


class NoRecord(WeightsChanged):
    """A model folder that the workflow wrote has no ``selfrepair.json`` (or no hashes in
    it): nothing says it is the model its rule made."""


def _is_job_input(folder: Path) -> bool:
    """Whether ``folder`` is an input of the running workflow job: an output of another
    rule (the models the user brings come through parameters and search paths)."""
    from selfrepair.core import runtime

    if runtime.JOB is None:
        return False
    here = os.path.abspath(str(folder))
    return any(os.path.abspath(f) == here for f in runtime.JOB.get("inputs", []))


def check_provenance(folder: str | Path, required: bool | None = None) -> None:
    """Raise ModelElsewhere when the folder's record names another folder (the model that
    rule R made for folder F is not this folder's; outside a workflow job, a warning: a
    copy loaded by hand on purpose), and NoRecord when ``required`` (by
    default: when ``folder`` is an input of the running workflow job, so a folder another
    rule wrote) and the folder has no record of its files' hashes.

    A record names its folder relative to the working directory: the check holds when the
    folder's path (its symlinks not followed) ends with it, so a whole results tree moved
    elsewhere still loads. Records saved before provenance was recorded (the committed
    golden checkpoints) are checked by their hashes only."""
    folder = Path(folder)
    meta = read_meta(folder)
    made = meta.get(MADE_KEY)
    if required is None:
        required = _is_job_input(folder)
    if isinstance(made, dict) and made.get("folder"):
        want = Path(str(made["folder"]))
        here = Path(os.path.normpath(os.path.abspath(folder)))
        n = len(want.parts)
        ok = here == want if want.is_absolute() else here.parts[-n:] == want.parts
        if not ok:
            wc = ", ".join(f"{k}={v}" for k, v in sorted((made.get("wildcards") or {}).items()))
            what = (
                f"model folder {folder} is not this folder's model: its selfrepair.json says rule "
                f"{made.get('rule')} ({wc}) made it for {want} (a symlink or a copy of another model?)"
            )
            from selfrepair.core import runtime

            if runtime.JOB is None:  # loaded by hand (a notebook, a copy kept on purpose): said, not refused
                import logging

                logging.getLogger(__name__).warning("%s; loading it as asked", what)
                return
            raise ModelElsewhere(
                f"{what}. Delete {folder} and rerun snakemake (or rerun with --forcerun {made.get('rule')}) "
                "to make its own"
            )
    elif required and FILES_KEY not in meta and WEIGHTS_KEY not in meta:
        what = (
            "has no selfrepair.json"
            if not (folder / "selfrepair.json").exists()
            else "has no file hashes in selfrepair.json"
        )
        raise NoRecord(
            f"model folder {folder} {what}: the record that names the model and its files' SHA-256, "
            "written when the workflow saved it, so nothing shows it is the model its rule made. "
            f"Retrain it: delete {folder} and rerun snakemake (or rerun with --forcerun <the rule that writes it>)"
        )


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise ModelNotFound(f"model folder not found: {folder}")
    if not (folder / "config.json").exists():
        raise CorruptCheckpoint(f"{folder} has no config.json: not a saved model")
    weights = list(folder.glob("*.safetensors")) + list(folder.glob("*.bin"))
    if not weights:
        raise CorruptCheckpoint(f"{folder} holds no weights (*.safetensors)")


def _weight_tensors(file: Path):
    """(name, tensor) of one checkpoint file, one tensor at a time for safetensors."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        yield from torch.load(file, weights_only=True, map_location="cpu").items()


def check_finite(folder: str | Path) -> None:
    """Raise NonFiniteWeights, naming the file and tensor, if any floating-point tensor of
    the checkpoint in ``folder`` holds a NaN or an infinity (a diverged or damaged save
    would otherwise flow silently into every score)."""
    folder = Path(folder)
    bad = []
    # the files transformers loads: safetensors when present, else PyTorch .bin (not
    # other pickles such as a Trainer's training_args.bin)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    for file in files:
        try:
            for name, t in _weight_tensors(file):
                if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                    n_nan = int(torch.isnan(t).sum())
                    bad.append((file, name, n_nan, int((~torch.isfinite(t)).sum()) - n_nan, t.numel()))
        except Exception as err:  # safetensors raises several types for a damaged file
            raise CorruptCheckpoint(f"cannot load the checkpoint in {folder}: cannot read {file}: {err}") from err
    if bad:
        lines = [f"  {f}: tensor {n!r} has {a} NaN and {b} inf of {m} values" for f, n, a, b, m in bad[:5]]
        more = f"\n  ... and {len(bad) - 5} more tensors" if len(bad) > 5 else ""
        raise NonFiniteWeights(
            f"non-finite weights in the checkpoint {folder}:\n" + "\n".join(lines) + more, bad[0][0], bad[0][1]
        )


def load_hf(folder: str | Path, device: str = "cpu", dtype=None):
    """The Hugging Face model saved in ``folder``, with clear errors when absent or broken
    (ModelNotFound, CorruptCheckpoint), holding NaN/inf weights (NonFiniteWeights), or
    edited since ``save_model`` wrote them (WeightsChanged; hashed once per load); in ``dtype`` if given."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    _check_folder(folder)
    check_finite(folder)  # before the hash: an edit that put a NaN in is named by tensor
    check_unchanged(folder)
    check_provenance(folder)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, output_loading_info=True, dtype=dtype
        )
    except Exception as err:  # safetensors raises several types for a damaged file
        raise CorruptCheckpoint(f"cannot load the checkpoint in {folder}: {err}") from err
    check_fits(folder, model, info)
    return model.to(device).eval()


def check_fits(folder, model, info: dict) -> None:
    """CorruptCheckpoint when the checkpoint's tensors do not fit the architecture its
    ``config.json`` names: weights the model has but the checkpoint lacks (transformers
    would leave them randomly initialized) or tensors of another shape. Tensors the model
    does not use are logged, not refused (old checkpoints carry buffers such as GPT-2's
    ``attn.bias``)."""
    import logging

    missing, mismatched = sorted(info.get("missing_keys") or []), sorted(info.get("mismatched_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    if missing or mismatched:
        kind = type(model).__name__
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} weights of {kind} are not in the checkpoint (first: {', '.join(missing[:3])})"
            )
        if mismatched:
            parts.append(f"{len(mismatched)} have another shape (first: {', '.join(map(str, mismatched[:3]))})")
        if unexpected:
            parts.append(f"{len(unexpected)} checkpoint tensors are not {kind}'s (first: {', '.join(unexpected[:3])})")
        raise CorruptCheckpoint(
            f"the weights in {folder} do not fit the architecture its config.json names: "
            + "; ".join(parts)
            + ". Loading would run random weights in their place; check config.json against the weights"
        )
    if unexpected:
        logging.getLogger(__name__).warning(
            "%s: %d checkpoint tensors are not used by %s (first: %s)",
            folder, len(unexpected), type(model).__name__, ", ".join(unexpected[:3]),
        )  # fmt: skip


def resolve_local(name_or_path: str, search_paths: list[str] | None = None) -> Path:
    """A local folder for a model: an existing path, a folder under ``search_paths``, or
    the Hugging Face cache's snapshot (:func:`local_files.find_model`). Never downloads;
    ModelNotFound otherwise."""
    from selfrepair.core.local_files import find_model

    found = find_model(str(name_or_path), search_paths)
    if found is None:
        p = Path(name_or_path).expanduser()
        where = ", ".join([str(p)] + [str(Path(b) / name_or_path) for b in search_paths or []])
        raise ModelNotFound(
            f"weights not found for {name_or_path!r} (looked at {where} and the local Hugging "
            "Face cache; nothing is downloaded)"
        )
    return found


def load_bridge(folder_or_name: str | Path, device: str = "cpu", search_paths: list[str] | None = None, dtype=None):
    """Boot a local model through ``TransformerBridge.boot_transformers``, offline (in ``dtype`` if given)."""
    from transformer_lens.model_bridge import TransformerBridge

    folder = resolve_local(str(folder_or_name), search_paths)
    _check_folder(folder)
    hf = load_hf(folder, device, dtype)
    try:
        bridge = TransformerBridge.boot_transformers(str(folder), device=device, hf_model=hf, dtype=hf.dtype)
    except Exception as err:
        raise CorruptCheckpoint(f"TransformerBridge cannot boot {folder}: {err}") from err
    bridge.eval()
    return bridge


def load_identified(name_or_path: str | Path, device: str = "cpu", search_paths: list[str] | None = None):
    """(bridge, folder, identity) of a model found offline (:func:`resolve_local`): what
    the real-model rules boot, and name in their status rows (:func:`model_identity`)."""
    folder = resolve_local(str(name_or_path), search_paths)
    bridge = load_bridge(folder, device)
    return bridge, folder, model_identity(folder)


def read_meta(folder: str | Path) -> dict:
    """The folder's ``selfrepair.json`` ({} when there is none)."""
    f = Path(folder) / "selfrepair.json"
    if not f.exists():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as err:
        raise CorruptCheckpoint(f"{f} is not valid JSON: {err}") from err


def model_identity(folder: str | Path) -> str:
    """A model folder's identity: the SHA-256 (first 16 hex digits) of its ``config.json``
    and of every weights file, by name, read in full (a few seconds for GPT-2 small, about
    a minute for 8B parameters). Two folders with the same identity hold the same model;
    a real model and a random-weight stand-in of its configuration never share one."""
    import hashlib

    folder = Path(folder)
    total = hashlib.sha256()
    files = [folder / "config.json"] + sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    for f in files:
        if f.exists():
            total.update(f"{f.name}\0{_sha256(f)}\n".encode())
    return total.hexdigest()[:16]


class ContextTooShort(ValueError):
    """Inputs are longer than the model's context window."""


def check_context(bridge, length: int, what: str, model: str = "") -> None:
    """Refuse, before any forward pass, inputs of ``length`` tokens that the model's
    context (``cfg.n_ctx``) cannot hold: ContextTooShort naming both lengths."""
    n_ctx = getattr(bridge.cfg, "n_ctx", None)
    if n_ctx is not None and int(length) > int(n_ctx):
        name = f"{model}'s" if model else "the model's"
        raise ContextTooShort(
            f"{what} are {int(length)} tokens long, longer than {name} context of {int(n_ctx)} tokens (n_ctx)"
        )
