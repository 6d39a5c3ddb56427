"""Real-model IOI prompts are the COAX release's token ids: the checkpoint's own tokenizer.

The release tokenizes each prompt with ``AutoTokenizer.from_pretrained(checkpoint)`` and
``tokenizer(prompt)``; TransformerLens 4's bridge reloads a tokenizer that has a BOS token
with ``add_bos_token=True``, so prompts tokenized by ``bridge.tokenizer`` gain a BOS the
release's lack (GPT-2's 50256, SmolLM2's ``<|im_start|>``). Three model folders built
offline, each booted through ``load_bridge`` by the real-model rules:

- ``gpt2``: a random GPT-2 with GPT-2's vocabulary size (50,257, ``<|endoftext|>`` =
  50256 as BOS, EOS and UNK) and GPT-2's tokenizer files as the hub's ``gpt2`` has them
  (``vocab.json``, ``merges.txt``, ``tokenizer.json``, a ``tokenizer_config.json``
  naming no class, so ``AutoTokenizer`` picks ``GPT2Tokenizer`` from the model type): a
  byte-level BPE over GPT-2's byte alphabet whose merges make the prompts' words (GPT-2's
  real merges are not on this machine; the prompts' words are one token each in it too);
- ``smol``: a Llama with a byte-level BPE that has a BOS token its call does not add
  (SmolLM2's: ``<|im_start|>``, id 1);
- ``pythia``: a GPT-NeoX whose BOS, EOS and UNK are one ``<|endoftext|>`` (id 0), not
  added by its call (Pythia's);
- ``bos``: a Llama whose tokenizer's call puts BOS first (as Llama's and Gemma's do).
"""

import json

import numpy as np
import pytest
import torch

from selfrepair.coax import real_models
from selfrepair.core import models
from selfrepair.tasks import ioi

torch.set_num_threads(1)

# the release's lists and template, written out here (not taken from ioi)
NAMES = "John Mary Tom James Dan Sid Martin Anna Paul Kate Mark Lucy Peter Sarah David Emma".split()
PLACES = "store park school office garden station market library".split()
OBJECTS = "drink book ball ring kiss snack bone note".split()
TEMPLATE = "When {IO} and {S} went to the {P}, {S} gave a {O} to"
WORDS = ["and", "went", "to", "the", "gave", "a"] + NAMES + PLACES + OBJECTS


def _byte_chars() -> list[str]:
    """GPT-2's byte alphabet in its vocabulary order (ids 0..255)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _bpe(first: list[str], split=()):
    """(vocab, merges): the byte alphabet after the ``first`` special tokens, then merges
    building "When", and " " + each word (``Ġ`` + word) but those in ``split``."""
    vocab = {t: i for i, t in enumerate(first)}
    for c in _byte_chars():
        vocab[c] = len(vocab)
    merges = []
    for piece in ["When"] + ["Ġ" + w for w in WORDS if w not in split]:
        for k in range(2, len(piece) + 1):
            if piece[:k] not in vocab:
                merges.append((piece[: k - 1], piece[k - 1]))
                vocab[piece[:k]] = len(vocab)
    return vocab, merges


def _save_gpt2_tokenizer(folder):
    from transformers import GPT2Tokenizer

    vocab, merges = _bpe([])
    while len(vocab) < 50256:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    vocab["<|endoftext|>"] = 50256
    GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(str(folder))
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    return len(vocab)


# special tokens (unk, bos, eos) of the byte-level BPE tokenizers below, by convention
SPECIALS = {
    "smol": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],  # SmolLM2's: BOS <|im_start|>, not added
    "pythia": ["<|endoftext|>", "<|endoftext|>", "<|endoftext|>"],  # Pythia's: one token for all, not added
    "bos": ["<unk>", "<s>", "</s>"],  # added first by the call, as Llama's and Gemma's
}


def _save_bpe_tokenizer(folder, kind: str, split=()):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials, adds_bos = SPECIALS[kind], kind == "bos"
    vocab, merges = _bpe(list(dict.fromkeys(specials)), split)
    tk = Tokenizer(models.BPE(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = (
        processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        if adds_bos
        else processors.ByteLevel(trim_offsets=False)
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token=specials[0], bos_token=specials[1], eos_token=specials[2]
    ).save_pretrained(str(folder))
    return len(vocab)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    root = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=64, n_embd=16, n_layer=2, n_head=2)).save_pretrained(
        root / "gpt2"
    )
    assert _save_gpt2_tokenizer(root / "gpt2") == 50257
    for name in ("smol", "bos"):
        v = _save_bpe_tokenizer(root / name, name)
        cfg = LlamaConfig(vocab_size=v, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
                          bos_token_id=1, eos_token_id=2)  # fmt: skip
        LlamaForCausalLM(cfg).save_pretrained(root / name)
    v = _save_bpe_tokenizer(root / "pythia", "pythia")
    GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=v, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64, bos_token_id=0,
                                     eos_token_id=0)).save_pretrained(root / "pythia")  # fmt: skip
    return root


# the BOS each folder's tokenizer has, and whether the release's tokenizer(prompt) adds it
BOS = {"gpt2": (50256, False), "smol": (1, False), "pythia": (0, False), "bos": (1, True)}


def _release_ids(folder, n: int, seed: int):
    """The release's prompts: drawn with numpy's default_rng(seed) in its order, each
    tokenized by the checkpoint's AutoTokenizer call; IO and S, " " + name's first token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    rng = np.random.default_rng(seed)
    rows, io, s = [], [], []
    for _ in range(n):
        a, b = rng.choice(NAMES, size=2, replace=False)
        place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
        rows.append(tok(TEMPLATE.format(IO=a, S=b, P=place, O=obj)).input_ids)
        io.append(tok(" " + a, add_special_tokens=False).input_ids[0])
        s.append(tok(" " + b, add_special_tokens=False).input_ids[0])
    return rows, io, s


class _Seen(Exception):
    pass


@pytest.mark.parametrize("name", sorted(BOS))
def test_real_model_rules_tokenize_the_prompts_as_the_release(folders, name, monkeypatch):
    """Through the real-model rules (boot with load_bridge, then the prompts of the IOI
    and the wake-up experiments): every prompt's token ids equal the release's."""
    seen = []
    real_fn = ioi.gpt2_prompts

    def spy(tokenizer, n, seed, style="authors"):
        seen.append((seed, real_fn(tokenizer, n, seed, style)))
        raise _Seen  # stop each experiment once its first prompts are made

    monkeypatch.setattr(ioi, "gpt2_prompts", spy)
    real = {"search_paths": [str(folders)], "ioi_model": name, "wakeup_models": [name], "induction_models": [],
            "n_prompts": 10, "data_seeds": [1], "induction_T": 6}  # fmt: skip
    status = real_models.run_real_models(real, {}, {}, "v2", 16, folders / "out" / name, "cpu")
    assert status.reason.str.contains("_Seen").sum() == 2, status.reason.tolist()
    assert [s for s, _ in seen] == [5, 21]  # the IOI experiment's first prompts, then the wake-up's
    bos, adds = BOS[name]
    for seed, got in seen:
        rows, io, s = _release_ids(folders / name, 10, seed)
        assert got.tokens.tolist() == rows, (name, seed)
        assert got.io.tolist() == io and got.s.tolist() == s
        assert (got.tokens[:, 0] == bos).all() == adds and got.tokens.shape[1] == 14 + adds
    # what the bridge's own tokenizer would have given: a BOS before every prompt
    text = TEMPLATE.format(IO="John", S="Mary", P="store", O="drink")
    assert models.load_bridge(folders / name).tokenizer(text).input_ids[0] == bos


@pytest.mark.parametrize("name", sorted(BOS))
def test_checkpoint_tokenizer_is_the_release_tokenizer(folders, name):
    tok = models.checkpoint_tokenizer(name, [str(folders)])
    rows, io, s = _release_ids(folders / name, 25, 7)
    p = ioi.gpt2_prompts(tok, 25, seed=7)
    assert p.tokens.tolist() == rows and p.io.tolist() == io and p.s.tolist() == s
    assert ioi.adds_bos(tok) == BOS[name][1]
    assert ioi.single_token_names(tok) == NAMES


def test_names_a_tokenizer_splits_are_not_drawn(tmp_path, caplog):
    """A tokenizer that splits some of the release's names: the prompts are drawn, in
    the release's order, from the names it keeps whole (in the list's order), logged."""
    split = ("Sid", "Anna", "Emma")
    _save_bpe_tokenizer(tmp_path, "bos", split=split)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok(" Sid", add_special_tokens=False).input_ids) == 3
    kept = [w for w in NAMES if w not in split]
    assert ioi.single_token_names(tok) == kept
    with caplog.at_level("WARNING", logger="selfrepair.tasks.ioi"):
        p = ioi.gpt2_prompts(tok, 12, seed=3)
    assert "splits 3 of the release's 16 names (Sid, Anna, Emma)" in caplog.text
    rng = np.random.default_rng(3)
    for i in range(12):
        a, b = rng.choice(kept, size=2, replace=False)
        place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
        assert p.tokens[i].tolist() == tok(TEMPLATE.format(IO=a, S=b, P=place, O=obj)).input_ids
        assert tok.convert_ids_to_tokens([int(p.io[i]), int(p.s[i])]) == ["Ġ" + a, "Ġ" + b]
