"""Bad inputs of the `own:` section that gave a wrong result without a word, or an error
that did not say what to do: each now says which file or key and the way out, or does
the right thing. Tiny models of a 20-word vocabulary t0..t19 (t0 the unknown and
padding token, t1 BOS and EOS: word tN is id N), the analyses run in this process
(:func:`selfrepair.own.run.run_analysis`, what the rule's script calls)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from selfrepair.own import entries
from selfrepair.own.data import NoPairs, load_pairs

GOOD = [(2, 3, 4), (5, 6, 7), (8, 9, 2), (3, 5, 8)]  # clean "a b c a", corrupt "b b c a", answer b, foil c


def words(*ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def plain(a, b, c, answer=None, foil=None) -> dict:
    return {
        "clean": words(a, b, c, a),
        "corrupt": words(b, b, c, a),
        "answer": answer or f"t{b}",
        "foil": foil or f"t{c}",
    }


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def word_tokenizer(folder, n_words=20, pad="t0", bos="t1", eos="t1", post=None, chat_template=None):
    """A word-level tokenizer of t0..t{n_words-1} (t0 unknown); ``post``: a template
    processor's single-sequence template (``"t1 $A"`` adds a BOS, ``"$A t1"`` an EOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(n_words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if post:
        tk.post_processor = processors.TemplateProcessing(single=post, special_tokens=[("t1", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", pad_token=pad, bos_token=bos, eos_token=eos)
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(str(folder))
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A 2-layer toy GPT-2 of 20 tokens with its word tokenizer (as test_own_dag's)."""
    from tiny_models import save_toy_gpt2

    return save_toy_gpt2(tmp_path_factory.mktemp("own_inputs") / "toy", vocab_size=20, n_ctx=16)


def settings(model, task, **kw) -> dict:
    return {
        "name": "x", "model": str(model), "task": str(task), "search_paths": [], "n_eval": 8, "data_seed": 0,
        "methods": ["eap"], "fractions": [0.1, 0.5, 1.0], "batch_size": 8, "ig_steps": 2, "weighting": "example",
        "tie_orders": 0, "eactp_max_edges": 0, "circuit_fraction": 0.2, **kw,
    }  # fmt: skip


def run_edges(tmp_path, s) -> dict:
    from selfrepair.own.run import run_analysis

    out = {t: tmp_path / f"{t}.csv" for t in (*entries.TABLES["edges"], "status")} | {"circuits": tmp_path / "c"}
    return run_analysis("edges", s, out).iloc[0].to_dict()


# ------------------------------------------- an answer the tokenizer does not know -----
def test_pairs_whose_answer_or_foil_the_tokenizer_does_not_know_are_dropped_and_named(tmp_path):
    tok = word_tokenizer(tmp_path / "tok")
    rows = [plain(*g) for g in GOOD] + [plain(*GOOD[0], answer="cat"), plain(*GOOD[1], foil="dog")]
    data, dropped, usable, notes = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 100)
    assert usable == 4 and data.answer.tolist() == [3, 6, 9, 5] and data.foil.tolist() == [4, 7, 2, 8]
    assert 0 not in data.answer.tolist() + data.foil.tolist()  # before: cat and dog were id 0, the padding
    unk = "which the tokenizer does not know (whole or in part it would become the unknown token 't0', id 0)"
    assert dropped == [
        f"{tmp_path / 'p.jsonl'}: row 4: the answer holds 'cat', {unk}",
        f"{tmp_path / 'p.jsonl'}: row 5: the foil holds 'dog', {unk}",
    ]
    assert notes == []


def test_the_status_row_counts_the_pairs_dropped_for_an_unknown_answer(toy, tmp_path):
    rows = [plain(*g) for g in GOOD] + [plain(*g, answer="cat") for g in GOOD]
    row = run_edges(tmp_path, settings(toy, write_jsonl(tmp_path / "p.jsonl", rows)))
    assert row["status"] == "ran", row["reason"]
    assert row["reason"].startswith(
        f"4 pairs used of 4 usable; 4 rows dropped: {tmp_path / 'p.jsonl'}: row 4: the answer holds 'cat'"
    )


def test_a_dataset_whose_every_answer_is_unknown_is_not_run_with_the_reason(toy, tmp_path):
    rows = [plain(*g, answer="cat") for g in GOOD]
    row = run_edges(tmp_path, settings(toy, write_jsonl(tmp_path / "p.jsonl", rows)))
    assert row["status"] == "not run"
    assert row["reason"].startswith(f"dataset {tmp_path / 'p.jsonl'}: no usable pair in 4 rows")
    assert "the answer holds 'cat', which the tokenizer does not know" in row["reason"]


def test_unknown_words_in_a_prompt_drop_the_pair_too(tmp_path):
    tok = word_tokenizer(tmp_path / "tok")
    rows = [plain(*GOOD[0]), {**plain(*GOOD[1]), "corrupt": "t6 zebra t7 t5"}]
    _, dropped, usable, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 100)
    assert usable == 1 and dropped[0].endswith(
        "row 1: the corrupt prompt holds 'zebra', " + dropped[0].split("'zebra', ")[1]
    )


def test_a_word_that_a_special_token_prefixes_is_named_not_split(tmp_path):
    """The word tokenizer's BOS t1 is an added token, matched inside t19: t19 became
    [t1, unknown] (the BOS and the padding token)."""
    tok = word_tokenizer(tmp_path / "tok")
    rows = [plain(*GOOD[0]), {**plain(*GOOD[1]), "clean": words(5, 6, 19, 5), "corrupt": words(6, 6, 19, 5)}]
    _, dropped, usable, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 100)
    assert usable == 1 and "row 1: the clean prompt holds 't19', which the tokenizer does not know" in dropped[0]


# --------------------------------- ids the model's embedding does not hold ---------------
def test_rows_with_ids_beyond_the_embedding_are_dropped_naming_the_token(toy, tmp_path):
    """A tokenizer extended to 24 words beside a model of 20: before, IndexError."""
    model = tmp_path / "model"
    shutil.copytree(toy, model)
    word_tokenizer(model, n_words=24)
    rows = [plain(*g) for g in GOOD] + [plain(21, 3, 4)]
    row = run_edges(tmp_path, settings(model, write_jsonl(tmp_path / "p.jsonl", rows)))
    assert row["status"] == "ran", row["reason"]
    assert row["reason"].startswith(
        f"4 pairs used of 4 usable; 1 rows dropped: {tmp_path / 'p.jsonl'}: row 4: token id 21 ('t21') is beyond "
        "the model's embedding of 20 tokens: the tokenizer has 24"
    )
    assert "the tokenizer has 24 tokens, the model's embedding 20" in row["reason"]


def test_a_padding_token_beyond_the_embedding_is_not_used_to_pad(toy, tmp_path):
    """Prompts of two lengths are padded; a padding token added to the tokenizer (id 20)
    indexed past the embedding. Id 0 pads instead (nothing reads padded positions)."""
    model = tmp_path / "model"
    shutil.copytree(toy, model)
    tok = word_tokenizer(model, n_words=21, pad="t20")
    rows = [plain(*GOOD[0]), {"clean": words(5, 6, 7), "corrupt": words(6, 6, 7), "answer": "t6", "foil": "t7"}]
    data, _, _, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 10, vocab_size=20)
    assert data.clean.tolist() == [[2, 3, 4, 2], [5, 6, 7, 0]] and data.pos.tolist() == [3, 2]
    row = run_edges(tmp_path, settings(model, tmp_path / "p.jsonl"))
    assert row["status"] == "ran", row["reason"]


def test_a_model_with_a_padded_vocabulary_runs(tmp_path):
    """An embedding of 24 rows (padded for speed) beside a tokenizer of 20: every id fits."""
    from tiny_models import save_toy_gpt2

    model = save_toy_gpt2(tmp_path / "padded", vocab_size=24, n_ctx=16)
    word_tokenizer(model, n_words=20)
    row = run_edges(tmp_path, settings(model, write_jsonl(tmp_path / "p.jsonl", [plain(*g) for g in GOOD])))
    assert row["status"] == "ran" and row["reason"] == "4 pairs used of 4 usable", row["reason"]


# ------------------------------------ a copy of a model the workflow trained ------------
@pytest.fixture
def copied(tmp_path, monkeypatch):
    """results/gim/ioi/tiny/seed0/model as rule gim_train saves it, copied to models/mine
    with a word tokenizer; the running job is an own: analysis."""
    from types import SimpleNamespace

    from job_stub import Named
    from selfrepair.core import models, runtime

    monkeypatch.chdir(tmp_path)

    def job(rule, outputs=()):
        return runtime.job_record(
            SimpleNamespace(rule=rule, wildcards=Named(), params=Named(), input=Named(), output=Named(o=outputs[0]))
        )

    out = "results/gim/ioi/tiny/seed0/model"
    monkeypatch.setattr(runtime, "JOB", job("gim_train", [out]))
    cfg = models.gpt2_toy_config(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    models.save_model(models.build_gpt2_toy(cfg, seed=0, positional=True), out, {"task": "ioi", "seed": 0})
    shutil.copytree(out, "models/mine")
    word_tokenizer("models/mine")
    monkeypatch.setattr(runtime, "JOB", job("own_edges", ["results/own/mine/edges/status.csv"]))
    return tmp_path / "models/mine"


def test_a_copy_of_a_workflow_model_is_analysed_as_ones_own(copied, tmp_path):
    """Before: ModelElsewhere, advising to delete the copy and --forcerun gim_train."""
    row = run_edges(tmp_path, settings("models/mine", write_jsonl(tmp_path / "p.jsonl", [plain(*g) for g in GOOD])))
    assert row["status"] == "ran", row["reason"]
    assert row["reason"].endswith(
        "model folder models/mine: its selfrepair.json says rule gim_train made it for "
        "results/gim/ioi/tiny/seed0/model (a copy); analysed as your own model, as it is now"
    )


def test_a_copy_fine_tuned_in_place_is_analysed_as_it_is_now(copied, tmp_path):
    from safetensors.torch import load_file, save_file

    w = load_file(copied / "model.safetensors")
    w = {k: v + 0.01 for k, v in w.items()}
    save_file(w, copied / "model.safetensors", metadata={"format": "pt"})
    row = run_edges(tmp_path, settings("models/mine", write_jsonl(tmp_path / "p.jsonl", [plain(*g) for g in GOOD])))
    assert row["status"] == "ran", row["reason"]
    assert "(a copy); model.safetensors changed since that save; analysed as your own model" in row["reason"]


# ------------------------------------------------------------ the config ---------------
def test_an_entry_named_like_the_sections_own_file_is_refused():
    """Before: Snakemake's ChildIOException (results/own/status.csv/edges/...), no key named."""
    e = {"task": "ioi", "analyses": ["edges"]}
    for name, file in (("status.csv", "results/own/status.csv"), ("status.log", "logs/own/status.log")):
        assert entries.problems([{**e, "name": "ok"}, {**e, "name": name}]) == [
            f"own.1 ({name}).name: {name!r} is the name of the section's own file {file}, where the entry's folder "
            "would go: give the entry another name"
        ]


# -------------------------------------------------- other tokenizers and files -----------
def test_a_tokenizer_that_adds_a_bos_keeps_it(tmp_path):
    tok = word_tokenizer(tmp_path / "tok", post="t1 $A")
    data, _, _, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", [plain(*GOOD[0])]), tok, 10)
    assert data.clean.tolist() == [[1, 2, 3, 4, 2]] and data.corrupt.tolist() == [[1, 3, 3, 4, 2]]
    assert data.pos.tolist() == [4] and data.answer.tolist() == [3] and data.foil.tolist() == [4]


def test_a_tokenizer_that_appends_an_eos_is_read_at_the_prompts_last_word(tmp_path):
    """Before: the EOS was the last token, and the logits were read there."""
    tok = word_tokenizer(tmp_path / "tok", post="$A t1")
    data, _, _, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", [plain(*GOOD[0])]), tok, 10)
    assert data.clean.tolist() == [[2, 3, 4, 2]] and data.pos.tolist() == [3]


def test_a_chat_template_is_not_applied(tmp_path):
    """Prompts are plain text, as MIB's: a tokenizer's chat template does not wrap them."""
    tok = word_tokenizer(tmp_path / "tok", chat_template="{% for m in messages %}t1 {{ m['content'] }}{% endfor %}")
    assert tok.chat_template
    data, _, _, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", [plain(*GOOD[0])]), tok, 10)
    assert data.clean.tolist() == [[2, 3, 4, 2]]


def test_answers_of_several_tokens_read_their_first_and_say_so(toy, tmp_path):
    rows = [plain(*g) for g in GOOD[:3]] + [plain(*GOOD[3], answer="t5 t9")]
    row = run_edges(tmp_path, settings(toy, write_jsonl(tmp_path / "p.jsonl", rows)))
    assert row["status"] == "ran"
    assert row["reason"] == (
        "4 pairs used of 4 usable; 1 pairs have an answer or foil of several tokens: their first token is read "
        "(MIB's convention)"
    )


def test_an_empty_dataset_file_is_not_run_with_the_reason(toy, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    row = run_edges(tmp_path, settings(toy, tmp_path / "empty.jsonl"))
    assert (
        row["status"] == "not run" and row["reason"] == f"dataset {tmp_path / 'empty.jsonl'}: no usable pair in 0 rows"
    )


def test_a_line_that_is_not_utf8_costs_that_row(tmp_path):
    """Before: UnicodeDecodeError for the whole file ("failed: ...")."""
    tok = word_tokenizer(tmp_path / "tok")
    # '{"clean": "caf' is 14 bytes: latin-1's e acute (0xe9) is the line's byte 14, counted from 0
    lines = [json.dumps(plain(*g)).encode() for g in GOOD[:2]] + ['{"clean": "caf\u00e9"}'.encode("latin-1")]
    (tmp_path / "p.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _, dropped, usable, _ = load_pairs(tmp_path / "p.jsonl", tok, 10)
    assert usable == 2 and dropped == [
        f"{tmp_path / 'p.jsonl'}: row 2: not UTF-8 text (byte 0xe9 at 14 of the line): save the file as UTF-8"
    ]


def test_a_csv_that_is_not_utf8_is_named(tmp_path):
    tok = word_tokenizer(tmp_path / "tok")
    (tmp_path / "p.csv").write_bytes("clean,corrupt,answer,foil\ncaf\u00e9,t2,t3,t4\n".encode("latin-1"))
    with pytest.raises(NoPairs, match=f"dataset {tmp_path / 'p.csv'} is not UTF-8 text .*: save it as UTF-8"):
        load_pairs(tmp_path / "p.csv", tok, 10)


def test_a_spreadsheets_byte_order_mark_is_read_past(tmp_path):
    """Before: the first column was named '\\ufeffclean', so every row lacked 'clean'."""
    tok = word_tokenizer(tmp_path / "tok")
    rows = ["clean,corrupt,answer,foil"] + [",".join(plain(*g).values()) for g in GOOD]
    (tmp_path / "p.csv").write_text("\n".join(rows) + "\n", encoding="utf-8-sig")
    write_jsonl(tmp_path / "p.jsonl", [plain(*g) for g in GOOD])
    (tmp_path / "p.jsonl").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "p.jsonl").read_bytes())
    for name in ("p.csv", "p.jsonl"):
        data, dropped, usable, _ = load_pairs(tmp_path / name, tok, 10)
        assert usable == 4 and dropped == [] and data.clean[:, 0].tolist() == [2, 5, 8, 3], name


def test_a_line_separator_inside_a_prompt_is_no_line_end(tmp_path):
    """JSON allows U+2028 unescaped in a string; str.splitlines cut the row there."""
    tok = word_tokenizer(tmp_path / "tok")
    row = {**plain(*GOOD[0]), "clean": "t2 t3\u2028t4 t2"}
    (tmp_path / "p.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    data, dropped, usable, _ = load_pairs(tmp_path / "p.jsonl", tok, 10)
    assert dropped == [] and data.clean.tolist() == [[2, 3, 4, 2]]


def test_an_empty_answer_is_said_to_be_empty(tmp_path):
    tok = word_tokenizer(tmp_path / "tok")
    rows = [plain(*GOOD[0]), {**plain(*GOOD[1]), "answer": "  "}, plain(*GOOD[2], answer="t7", foil="t7")]
    _, dropped, usable, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 10)
    assert usable == 1 and [d.split(": row ")[1] for d in dropped] == [
        "1: field 'answer' is empty (plain rows hold clean, corrupt, answer, foil)",
        "2: the answer and the foil begin with the same token",
    ]


def test_more_pairs_asked_than_the_file_has_uses_them_all(toy, tmp_path):
    row = run_edges(tmp_path, settings(toy, write_jsonl(tmp_path / "p.jsonl", [plain(*g) for g in GOOD]), n_eval=100))
    assert row["status"] == "ran" and row["reason"] == "4 pairs used of 4 usable"


def test_load_pairs_without_padding_token_pads_with_0(tmp_path):
    tok = word_tokenizer(tmp_path / "tok", pad=None)
    assert tok.pad_token_id is None
    rows = [plain(*GOOD[0]), {"clean": words(5, 6, 7), "corrupt": words(6, 6, 7), "answer": "t6", "foil": "t7"}]
    data, _, _, _ = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows), tok, 10)
    assert data.clean.tolist() == [[2, 3, 4, 2], [5, 6, 7, 0]]
    assert torch.equal(data.pos, torch.tensor([3, 2]))
