"""Tiny randomly initialised models of the papers' architectures, built locally (shared by tests)."""

from __future__ import annotations

import torch


def tiny_llama(vocab_size: int = 20, n_kv_heads: int = 2, seed: int = 0, max_position_embeddings: int = 32):
    """A 2-layer Llama (d_model 16, 4 query heads of size 4, ``n_kv_heads`` key/value heads,
    gated MLP of 32): grouped-query attention when ``n_kv_heads`` < 4."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=max_position_embeddings,
        head_dim=4,
    )
    return LlamaForCausalLM(cfg)


def save_toy_gpt2(folder, vocab_size: int = 20, n_ctx: int = 16, seed: int = 0):
    """A 2-layer toy GPT-2 (2 heads, d_model 16, MLP 32, learned positions) saved in
    ``folder`` with a word tokenizer t0..t{vocab_size-1}: a model paper C's code loads."""
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, save_model
    from selfrepair.tasks.counterfactual import save_word_tokenizer

    cfg = gpt2_toy_config(vocab_size=vocab_size, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=n_ctx)
    save_model(build_gpt2_toy(cfg, seed=seed, positional=True), folder)
    save_word_tokenizer(folder, [f"t{i}" for i in range(vocab_size)])
    return folder


def tiny_gemma3(vocab_size: int = 50, n_kv_heads: int = 2, sliding_window: int = 3, seed: int = 0):
    """A 2-layer Gemma-3 (d_model 16, 2 query heads of size 8, ``n_kv_heads`` key/value
    heads, gated GELU MLP of 32): layer 0 local (a sliding window of ``sliding_window``
    keys, the query's own included), layer 1 global, as Gemma-3 alternates them. Larger
    weights than Gemma's init and every norm's weight (stored as an offset from 1) drawn
    around 0, so that every edge and every norm matters; q.k unscaled (sharp attention)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=n_kv_heads,
        head_dim=8,
        max_position_embeddings=64,
        initializer_range=0.3,
        query_pre_attn_scalar=1,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
    )
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)
    return model
