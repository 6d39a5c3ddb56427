"""Every model is a Hugging Face ``transformers`` model; analysis goes through one door.

Toy models are small configurations of real architectures, trained from scratch and
saved with ``save_pretrained`` (safetensors). ``load_bridge`` boots any local model
folder (or a name in the local Hugging Face cache) through TransformerLens 4's
``TransformerBridge.boot_transformers`` with the hub switched off, the same path that
loads GPT-2 or Llama.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from selfrepair.core.device import resolve_device  # noqa: E402,F401  (models.resolve_device, as before)

# A model folder's record and the checks every load makes live in model_files; their names
# stay importable from here (models.CorruptCheckpoint, models.check_unchanged, ...).
from selfrepair.core.model_files import (  # noqa: E402,F401
    FILES_KEY,
    MADE_KEY,
    WEIGHTS_KEY,
    CorruptCheckpoint,
    ModelElsewhere,
    ModelNotFound,
    NonFiniteWeights,
    NoRecord,
    WeightsChanged,
    _check_folder,
    _recordable,
    _sha256,
    brought_record,
    check_finite,
    check_fits,
    check_provenance,
    check_unchanged,
    made_by,
    model_identity,
    read_meta,
)


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


def load_hf(folder: str | Path, device: str = "cpu", dtype=None, brought: bool = False):
    """The Hugging Face model saved in ``folder``, with clear errors when absent or broken
    (ModelNotFound, CorruptCheckpoint), holding NaN/inf weights (NonFiniteWeights), or
    edited since ``save_model`` wrote them (WeightsChanged; hashed once per load); in ``dtype`` if given.
    ``brought``: a folder the user brings as their own (the ``own:`` section): a record it
    carries from a copied workflow model is not checked (:func:`brought_record` says it)."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    _check_folder(folder)
    check_finite(folder)  # before the hash: an edit that put a NaN in is named by tensor
    if not brought:
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


def resolve_local(name_or_path: str, search_paths: list[str] | None = None) -> Path:
    """A local folder for a model: an existing path, a folder under ``search_paths``, or
    the Hugging Face cache's snapshot (:func:`local_files.find_model`); for a GGUF file,
    the folder the workflow converted it into. Never downloads; ModelNotFound otherwise."""
    from selfrepair.core.local_files import converted_folder, find_model, gguf_file, is_gguf_path

    found = find_model(str(name_or_path), search_paths)
    p = Path(name_or_path).expanduser()
    where = ", ".join([str(p)] + [str(Path(b) / name_or_path) for b in search_paths or []])
    if found is None and is_gguf_path(p):
        f = gguf_file(p, search_paths)
        if f is not None:
            want = converted_folder(f)
            raise ModelNotFound(
                f"{name_or_path} is a GGUF file, not yet converted into a model folder: the workflow converts it "
                f"into {want} (rule lm_convert: snakemake {want}; or gguf_files.convert in Python)"
            )
        raise ModelNotFound(
            f"weights not found for {name_or_path!r} (looked at {where}); no GGUF file there, and no folder "
            "converted from it under results/lms: give the path of the .gguf file, or the folder that holds it "
            "in search_paths"
        )
    if found is None:
        raise ModelNotFound(
            f"weights not found for {name_or_path!r} (looked at {where} and the local Hugging "
            "Face cache; nothing is downloaded)"
        )
    return found


def checkpoint_tokenizer(folder_or_name: str | Path, search_paths: list[str] | None = None):
    """The checkpoint's own tokenizer, loaded as COAX's release loads it
    (``AutoTokenizer.from_pretrained(folder)``, offline), with its own special tokens:
    its call adds what its files say (no BOS on GPT-2 or Pythia, BOS first on Gemma).

    Prompts for real models are tokenized with this, never with ``bridge.tokenizer``:
    TransformerLens 4 reloads a tokenizer that has a BOS token with ``add_bos_token=True``
    (``get_tokenizer_with_bos``), so the bridge's tokenizer puts BOS (GPT-2's 50256,
    SmolLM2's ``<|im_start|>``) before prompts whose own tokenizer adds none."""
    from transformers import AutoTokenizer

    folder = resolve_local(str(folder_or_name), search_paths)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def folder_tokenizer(folder_or_name: str | Path, search_paths: list[str] | None = None):
    """The model folder's own ``tokenizer.json`` read directly (``AutoTokenizer`` in
    transformers 5 maps some model types to a fixed tokenizer class: Qwen2's rebuilds
    itself and drops a word-level stand-in's words), else :func:`checkpoint_tokenizer`.
    Either way the checkpoint's own special tokens, never the bridge's tokenizer; what
    MIB-format pairs are tokenized with (paper C's rules, the ground truth's real-LM
    game, the ``own:`` section)."""
    from transformers import PreTrainedTokenizerFast

    folder = resolve_local(str(folder_or_name), search_paths)
    if (folder / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    return checkpoint_tokenizer(folder)


class UngroupError(ValueError):
    """A grouped-query model whose attention modules :func:`ungroup_kv` cannot expand."""


def ungroup_kv(hf):
    """Give every query head of a grouped-query model its own key and value projection, in
    place, and return the model: each attention module's ``k_proj`` and ``v_proj`` rows
    (and biases) repeated per head of their key/value group (``repeat_interleave``), its
    ``num_key_value_groups`` set to 1, the config's ``num_key_value_heads`` to
    ``num_attention_heads``. The function is the same (each head's keys and values are
    the same numbers, computed from its own copy of the weights), but a bridge booted on
    it has a key and value input per query head (``hook_k_input``: [B, T, n_heads, d]),
    TransformerLens 2's ``ungroup_grouped_query_attention``, which MIB's code switches on.
    A model without grouped keys and values (GPT-2, multi-head Llama) is returned as it
    is; UngroupError when a grouped model's attention modules are not of the
    ``k_proj``/``v_proj``/``head_dim`` kind (Llama, Qwen-2, Gemma-2, Gemma-3)."""
    cfg = getattr(hf.config, "text_config", None) or hf.config
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if not heads or not kv or kv == heads:
        return hf
    if heads % kv:
        raise UngroupError(f"{heads} query heads do not split into {kv} key/value groups")
    rep = heads // kv
    attns = [m for m in hf.modules() if hasattr(m, "num_key_value_groups")]
    if not attns or not all(hasattr(m, a) for m in attns for a in ("k_proj", "v_proj", "head_dim")):
        raise UngroupError(
            f"cannot ungroup {type(hf).__name__}'s key/value heads: its attention modules have no "
            "k_proj, v_proj and head_dim to expand (kv_inputs: per_group keeps them grouped)"
        )
    for attn in attns:
        d = attn.head_dim
        for name in ("k_proj", "v_proj"):
            old = getattr(attn, name)
            w = old.weight
            new = nn.Linear(old.in_features, heads * d, bias=old.bias is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                new.weight.copy_(old.weight.view(kv, d, -1).repeat_interleave(rep, 0).reshape(heads * d, -1))
                if old.bias is not None:
                    new.bias.copy_(old.bias.view(kv, d).repeat_interleave(rep, 0).reshape(-1))
            new.requires_grad_(old.weight.requires_grad)
            setattr(attn, name, new)
        attn.num_key_value_groups = 1
        if hasattr(attn, "num_key_value_heads"):
            attn.num_key_value_heads = heads
    cfg.num_key_value_heads = heads
    return hf


def load_bridge(
    folder_or_name: str | Path,
    device: str = "cpu",
    search_paths: list[str] | None = None,
    dtype=None,
    brought=False,
    ungroup: bool = False,
):
    """Boot a local model through ``TransformerBridge.boot_transformers``, offline (in
    ``dtype`` if given; ``brought``: :func:`load_hf`'s; ``ungroup``: the model's
    grouped key/value heads given one per query head first, :func:`ungroup_kv`)."""
    from transformer_lens.model_bridge import TransformerBridge

    folder = resolve_local(str(folder_or_name), search_paths)
    _check_folder(folder)
    hf = load_hf(folder, device, dtype, brought)
    if ungroup:
        hf = ungroup_kv(hf)
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
