"""COAX's prefix reuse (core.interventions.Prefix) against whole forwards of the bridge,
on tiny random models of every architecture the papers' real models have: resumed runs
give the full forward's bits, and where the bridge's blocks or head cannot be called
that way (Gemma-2 caps its logits outside the unembedding) every run is a whole forward.
Prefix checks that on the intact run itself: GPT-Neo, whose layers alternate local and
global attention, passed it with 3 layers and not with 2 (2e-6 apart; measured), so
either is right there as long as the results are the whole forward's."""

import pytest
import torch
import transformers as T

from selfrepair.core.components import parse
from selfrepair.core.interventions import Prefix, make_hooks
from selfrepair.core.models import load_bridge
from selfrepair.tasks.counterfactual import save_word_tokenizer

V = 50
CONFIGS = {
    "gpt2": (T.GPT2Config, dict(vocab_size=V, n_positions=32, n_embd=16, n_layer=3, n_head=2), True),
    "neox": (T.GPTNeoXConfig, dict(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32, rotary_pct=0.25), True),
    "llama": (T.LlamaConfig, dict(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=32, max_position_embeddings=32), True),
    "qwen2": (T.Qwen2Config, dict(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=32, max_position_embeddings=32), True),
    "olmo2": (T.Olmo2Config, dict(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                  num_key_value_heads=2, intermediate_size=32, max_position_embeddings=32), True),
    "gemma2": (T.Gemma2Config, dict(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=8, intermediate_size=32, max_position_embeddings=32,
                                    final_logit_softcapping=3.0, attn_logit_softcapping=5.0, sliding_window=4), False),
    "gptneo": (T.GPTNeoConfig, dict(vocab_size=V, hidden_size=16, num_layers=3, num_heads=2,
                                    max_position_embeddings=32, attention_types=[[["global", "local"], 1], [["global"], 1]],
                                    window_size=4), None),
}  # fmt: skip


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_resumed_runs_are_whole_forwards(arch, tmp_path):
    cls, kw, resumable = CONFIGS[arch]
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cls(**kw))
    with torch.no_grad():  # away from the init's small values, so that a wrong path shows
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path, ["<pad>", "<bos>"] + [f"t{i}" for i in range(V - 2)])
    bridge = load_bridge(tmp_path)
    tokens = torch.randint(0, V, (3, 9), generator=torch.Generator().manual_seed(1))
    pfx = Prefix(bridge, tokens, keep_z=True)
    assert resumable is None or pfx.resumable is resumable
    with torch.no_grad():
        assert torch.equal(pfx.logits(), bridge(tokens))
        for sets in ([["L1H0"]], [["L2H1"], ["L1H1", "L2H0"]]):
            comps = [[parse(n) for n in s] for s in sets]
            start = min(c.layer for s in comps for c in s)
            hooks = make_hooks(comps, 3, "zero", None)
            want = bridge.run_with_hooks(tokens.repeat(len(comps), 1), fwd_hooks=hooks)
            got = pfx.run(start, len(comps), hooks)
            assert torch.equal(got, want), (arch, sets, float((got - want).abs().max()))
            assert torch.equal(pfx.run(start, len(comps), hooks, positions=[-1]), want[:, [-1]])
