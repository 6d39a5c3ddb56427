"""Tiny GGUF files written here with the ``gguf`` package's ``GGUFWriter`` from tiny random
Hugging Face models (a Llama and a Gemma-3), as llama.cpp's ``convert_hf_to_gguf.py`` lays
them out: the metadata keys transformers' GGUF loader reads (``integrations/ggml.py``'s
config mapping, ``tokenizer.ggml.*``), gguf's own tensor names (``get_tensor_name_map``,
the map transformers inverts), Llama's query and key rows permuted and Gemma's norms
stored as ``1 + w`` (what transformers' tensor processors undo).

Every tensor is written as F32, and every config value that GGUF stores as a float32
(``rms_norm_eps``, ``rope_theta``) is exact in float32, and Gemma's norm weights are
multiples of 2**-10 (so ``(1 + w) - 1 == w`` in float32): the model transformers builds
from the file has the original's weights bit for bit, and the same logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

EPS = 2.0**-20  # rms_norm_eps, exact in float32 (GGUF stores it as one)

# a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2", as SmolLM2's): the 256 byte
# symbols, three merges, one control token
_MERGES = ["h e", "l l", "he ll"]


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in of each byte, in byte order (its ``bytes_to_unicode``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


BPE_TOKENS = _byte_symbols() + ["he", "ll", "hell", "<|endoftext|>"]
# a sentencepiece vocabulary (tokenizer.ggml.model "llama", as Gemma's): control tokens,
# then pieces with their scores
SPM_TOKENS = (
    ["<pad>", "<eos>", "<bos>", "<unk>"]
    + ["\u2581", "\u2581a", "\u2581b", "a", "b", "c", "d", "e"]
    + [f"<0x{i:02X}>" for i in range(256)]
)


def llama(seed: int = 0):
    """A tiny random LlamaForCausalLM (grouped-query attention, tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(BPE_TOKENS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=EPS, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=len(BPE_TOKENS) - 1, eos_token_id=len(BPE_TOKENS) - 1,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    _random_norms(model, seed)
    return model


def gemma3(seed: int = 0):
    """A tiny random Gemma3ForCausalLM (its text model; tied embeddings)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=len(SPM_TOKENS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=EPS, sliding_window=16, tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).eval()
    _random_norms(model, seed)
    return model


def _random_norms(model, seed: int) -> None:
    """Norm weights of random multiples of 2**-10 in (-0.5, 0.5): not the init's constant,
    and exact through Gemma's stored 1 + w."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randint(-511, 512, p.shape, generator=g).float() / 1024)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permutation of a query or key weight's rows (transformers reverses it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model, arch: str):
    """(gguf name, float32 array) of every weight, as llama.cpp writes them."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    cfg = model.config
    key = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    names = get_tensor_name_map(key, cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        w = t.detach().float().numpy().copy()
        if arch == "llama" and base.endswith("q_proj"):
            w = _permute(w, cfg.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            w = _permute(w, cfg.num_key_value_heads)
        elif arch == "gemma3" and "norm" in base:
            w = w + 1
        yield f"{names.get_name(base)}.{suffix}", w


def _config_keys(writer, model, arch: str) -> None:
    cfg = model.config
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(cfg.head_dim)
        writer.add_rope_freq_base(10000.0)
    else:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_rope_freq_base(float(cfg.rope_parameters["full_attention"]["rope_theta"]))


def _tokenizer_keys(writer, arch: str) -> None:
    if arch == "llama":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(BPE_TOKENS)
        writer.add_token_types([1] * (len(BPE_TOKENS) - 1) + [3])
        writer.add_token_merges(_MERGES)
        writer.add_bos_token_id(len(BPE_TOKENS) - 1)
        writer.add_eos_token_id(len(BPE_TOKENS) - 1)
    else:
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(SPM_TOKENS)
        writer.add_token_scores([0.0] * 4 + [-float(i) for i in range(len(SPM_TOKENS) - 4)])
        writer.add_token_types([3, 3, 3, 2] + [1] * 8 + [6] * 256)
        writer.add_pad_token_id(0)
        writer.add_eos_token_id(1)
        writer.add_bos_token_id(2)
        writer.add_unk_token_id(3)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def write(model, path: str | Path, arch: str | None = None, tokenizer: bool = True, file_type: int = 0,
          tensor_type=None) -> Path:  # fmt: skip
    """``model`` as a GGUF file at ``path``: ``arch`` the architecture key written (its
    own by default: an unknown one makes a file transformers cannot load); without
    ``tokenizer``, no ``tokenizer.ggml.*`` keys; ``tensor_type`` (a GGMLQuantizationType)
    stores the first 2-D weight as zero bytes of that type instead of F32."""
    from gguf import GGUFWriter

    own = "llama" if model.config.model_type == "llama" else "gemma3"
    path = Path(path)
    writer = GGUFWriter(str(path), arch or own)
    writer.add_name(f"tiny-{own}")
    writer.add_file_type(file_type)
    _config_keys(writer, model, own)
    if tokenizer:
        _tokenizer_keys(writer, own)
    odd = tensor_type
    for name, w in _tensors(model, own):
        if odd is not None and w.ndim == 2 and w.shape[1] % 32 == 0:
            from gguf import GGML_QUANT_SIZES

            block, size = GGML_QUANT_SIZES[odd]
            raw = np.zeros((w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=odd)
            odd = None
            continue
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
