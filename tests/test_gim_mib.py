"""MIB path: tiny random models of each architecture and a MIB-format dataset written here."""

import json
import re
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, save_model  # noqa: E402
from selfrepair.gim.localization import run_mib  # noqa: E402
from selfrepair.tasks import mib  # noqa: E402
from selfrepair.tasks.counterfactual import save_word_tokenizer  # noqa: E402

VOCAB = ["<pad>", "<bos>"] + [f"t{i}" for i in range(30)]


def _models(root):
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    kw = dict(
        vocab_size=len(VOCAB),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        head_dim=4,
    )
    torch.manual_seed(0)
    models = {
        "gpt2": build_gpt2_toy(gpt2_toy_config(len(VOCAB), 2, 2, 16, 32, 64), seed=1, positional=True),
        "llama": LlamaForCausalLM(LlamaConfig(**kw)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(**kw)),
        "gemma2": Gemma2ForCausalLM(Gemma2Config(**kw)),
        # a local layer (a window of 3 keys, under prompts of 7 tokens or more) and a global one
        "gemma3_text": Gemma3ForCausalLM(
            Gemma3TextConfig(**kw, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
        ),
    }
    for name, m in models.items():
        save_model(m, root / name)
        save_word_tokenizer(root / name, VOCAB)
    return {name: str(root / name) for name in models}


def _datasets(root):
    g = torch.Generator().manual_seed(0)

    def words(n):
        return " ".join(f"t{int(i)}" for i in torch.randint(10, 30, (n,), generator=g))

    ioi, ari, mcqa = [], [], []
    for i in range(8):
        io, s = f"t{i}", f"t{i + 1}"
        body = words(4)
        ioi.append(
            {
                "prompt": f"{io} {s} {body} {s}",
                "metadata": {"indirect_object": io, "subject": s},
                "s2_io_flip_counterfactual": {"prompt": f"{io} {s} {body} {io}"},
            }
        )
        ari.append(
            {
                "prompt": f"t{i} t{i + 2} t9",
                "label": f"t{2 * i + 2}",
                "random_counterfactual": {"prompt": f"t{i + 1} t{i + 3} t9", "label": f"t{2 * i + 4}"},
            }
        )
        mcqa.append(
            {
                "prompt": f"{words(3)} t1 t2 t3",
                "choices": {"label": ["t1", "t2", "t3"], "text": ["a", "b", "c"]},
                "answerKey": i % 3,
                "symbol_counterfactual": {
                    "prompt": f"{words(3)} t2 t3 t1",
                    "choices": {"label": ["t2", "t3", "t1"], "text": ["a", "b", "c"]},
                    "answerKey": i % 3,
                },
            }
        )
    for name, rows in (("ioi", ioi), ("arithmetic_addition", ari), ("copycolors_mcqa", mcqa)):
        (root / name).mkdir(parents=True)
        (root / name / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return ioi, ari, mcqa


def test_answers_follow_mib_fields(tmp_path):
    ioi, ari, mcqa = _datasets(tmp_path)
    assert mib.answers("ioi", ioi[0]) == (ioi[0]["prompt"], ioi[0]["s2_io_flip_counterfactual"]["prompt"], "t0", "t1")
    assert mib.answers("arithmetic_addition", ari[1])[2:] == ("t4", "t6")
    # answerKey 1: clean symbol t2; counterfactual labels t2 t3 t1 -> t3
    assert mib.answers("copycolors_mcqa", mcqa[1])[2:] == ("t2", "t3")
    with pytest.raises(mib.DatasetNotFound):
        mib.resolve_dataset("arc_easy", [str(tmp_path)])


def test_run_mib_on_tiny_architectures(tmp_path):
    paths = _models(tmp_path / "models")
    _datasets(tmp_path / "data")
    archs = ("gpt2", "llama", "qwen2", "gemma2", "gemma3_text")
    models = [paths[m] for m in archs] + [str(tmp_path / "absent")]
    datasets = ["ioi", "arithmetic_addition", "copycolors_mcqa", "arc_easy"]
    status, table, curves = run_mib(
        models, datasets, ["gim"], n_eval=6, search_paths=[str(tmp_path / "data")], batch_size=6, fractions=(0.1, 1.0)
    )
    st = status.set_index(["model", "dataset"]).status
    for m in archs:  # Gemma-2's and Gemma-3's post-norms: MIB's convention
        for d in ("ioi", "arithmetic_addition", "copycolors_mcqa"):
            assert st[(paths[m], d)] == "ran"
        assert st[(paths[m], "arc_easy")] == "not run"
    assert (status[status.model == str(tmp_path / "absent")].status == "not run").all()
    assert len(table) == 5 * 3 and table[["cpr", "cmd"]].notna().all().all()
    full = curves[curves.fraction == 1.0]
    assert (full.faithfulness - 1).abs().max() < 1e-3


def test_one_failing_pair_costs_its_row_not_the_others(tmp_path, monkeypatch):
    from selfrepair.core.models import model_identity
    from selfrepair.gim import localization

    short = tmp_path / "models" / "short"
    save_model(build_gpt2_toy(gpt2_toy_config(len(VOCAB), 1, 2, 16, 32, n_ctx=6), seed=1, positional=True), short)
    save_word_tokenizer(short, VOCAB)
    _datasets(tmp_path / "data")
    localize = localization.localize

    def fails_on_mcqa(bridge, data, method, *a, **k):
        if data.clean.shape[1] == 6:  # copycolors_mcqa's pairs: 6 words
            raise RuntimeError("simulated failure")
        return localize(bridge, data, method, *a, **k)

    monkeypatch.setattr(localization, "localize", fails_on_mcqa)
    status, table, _ = run_mib(
        [str(short)], ["ioi", "arithmetic_addition", "copycolors_mcqa"], ["eap"], n_eval=4,
        search_paths=[str(tmp_path / "data")], batch_size=4, fractions=(0.5, 1.0), bos="tokenizer",
    )  # fmt: skip
    st = status.set_index("dataset")
    assert st.loc["ioi", "reason"] == (  # the words alone (bos "tokenizer": the word tokenizer adds no BOS)
        f"MIB ioi's pairs are 7 tokens long, longer than {short}'s context of 6 tokens (n_ctx)"
    )
    assert st.loc["copycolors_mcqa", "reason"] == "failed: RuntimeError: simulated failure"
    assert st.loc["arithmetic_addition", "status"] == "ran"  # 3 words fit
    assert (status.folder == str(short)).all() and (status.identity == model_identity(short)).all()
    assert list(table.task) == ["arithmetic_addition"] and list(table.identity) == [model_identity(short)]


def _rewrite(path, edit):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows)
    path.write_text("\n".join(json.dumps(r) for r in rows))


@pytest.mark.parametrize(
    "name, edit, message",
    [
        # issue 33: a row without metadata ended the job with "'float' object is not subscriptable"
        ("ioi", lambda r: r[2].pop("metadata"), "row 2: field 'metadata' is missing"),
        ("ioi", lambda r: r[1]["metadata"].pop("subject"), "row 1: field 'metadata.subject' is missing"),
        # a renamed counterfactual field gave "You need to specify either `text` or `text_target`"
        (
            "ioi",
            lambda r: r[3].update(io_flip=r[3].pop("s2_io_flip_counterfactual")),
            "row 3: field 's2_io_flip_counterfactual' is missing",
        ),
        ("ioi", lambda r: r[0].update(prompt=7), "row 0: field 'prompt' is a int, not a string"),
        (
            "arithmetic_addition",
            lambda r: r[4].update(random_counterfactual="t1 t2 t9"),
            "row 4: field 'random_counterfactual' is a string; arithmetic_addition needs an object with its own label",
        ),
        (
            "arithmetic_addition",
            lambda r: r[5]["random_counterfactual"].pop("label"),
            "row 5: field 'random_counterfactual.label' is missing",
        ),
        ("copycolors_mcqa", lambda r: r[1].update(answerKey=5), "row 1: field 'answerKey' is 5, outside the 3 choices"),
        (
            "copycolors_mcqa",
            lambda r: r[2]["symbol_counterfactual"].update(answerKey="t9"),
            "row 2: field 'symbol_counterfactual.answerKey' is 't9', not one of the labels ['t2', 't3', 't1']",
        ),
        ("copycolors_mcqa", lambda r: r[0].pop("choices"), "row 0: field 'choices' is missing"),
    ],
)
def test_a_bad_row_is_named_by_file_row_and_field(tmp_path, name, edit, message):
    _datasets(tmp_path)
    f = tmp_path / name / "test.jsonl"
    _rewrite(f, edit)
    rows = mib.read_rows(tmp_path / name)
    with pytest.raises(mib.DatasetRowError, match=re.escape(f"{f}: {message}")):
        for _, row in rows.iterrows():
            mib.answers(name, row)


def test_a_bad_row_costs_its_dataset_not_the_job(tmp_path):
    """Before: one IOI row without metadata lost every dataset's results (TypeError)."""
    short = tmp_path / "models" / "m"
    save_model(build_gpt2_toy(gpt2_toy_config(len(VOCAB), 1, 2, 16, 32, n_ctx=16), seed=1, positional=True), short)
    save_word_tokenizer(short, VOCAB)
    _datasets(tmp_path / "data")
    f = tmp_path / "data" / "ioi" / "test.jsonl"
    _rewrite(f, lambda r: r[2].pop("metadata"))
    status, table, _ = run_mib(
        [str(short)], ["ioi", "arithmetic_addition"], ["eap"], n_eval=4,
        search_paths=[str(tmp_path / "data")], batch_size=4, fractions=(0.5, 1.0),
    )  # fmt: skip
    st = status.set_index("dataset")
    assert st.loc["ioi", "status"] == "not run"
    assert st.loc["ioi", "reason"] == f"{f}: row 2: field 'metadata' is missing"
    assert st.loc["arithmetic_addition", "status"] == "ran" and list(table.task) == ["arithmetic_addition"]


def test_a_model_without_per_head_outputs_is_a_not_run_row(tmp_path):
    """Issue 33: a BERT folder under an MIB search path crashed the whole job
    (NotImplementedError: use_attn_result); it is its pairs' "not run" row with the reason."""
    from transformers import BertConfig, BertLMHeadModel

    folder = tmp_path / "bert"
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, is_decoder=True)  # fmt: skip
    BertLMHeadModel(cfg).save_pretrained(folder)
    save_word_tokenizer(folder, VOCAB)
    _datasets(tmp_path / "data")
    status, table, _ = run_mib(
        [str(folder)], ["ioi", "arithmetic_addition"], ["eap"], n_eval=4,
        search_paths=[str(tmp_path / "data")], batch_size=4, fractions=(1.0,),
    )  # fmt: skip
    assert list(status.status) == ["not run", "not run"] and table.empty
    assert status.reason.str.contains("Per-head result computation is unavailable").all()


def test_mib_processing_folds_grouped_value_biases_by_hand(tmp_path):
    """Qwen-2 (grouped-query attention, value biases, RMSNorm): the constant that MIB's
    processed model moves out of head h is b_V[h // (n_heads / n_kv_heads)] @ W_O[h],
    from the HF weights by hand; nothing is centred under RMSNorm, and a model without
    biases (Llama) has nothing to fold."""
    from selfrepair.core.models import load_bridge
    from selfrepair.gim.attribute import mib_processing
    from selfrepair.gim.graph import Graph
    from selfrepair.gim.hooks import head_rows

    paths = _models(tmp_path)
    bridge = load_bridge(paths["qwen2"])
    layers = bridge.original_model.model.layers
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for blk in layers:
            blk.self_attn.v_proj.bias.normal_(0, 1, generator=g)
    graph = Graph.from_bridge(bridge)
    vb, centre = mib_processing(bridge, graph)
    assert not centre
    heads = {i for rows in head_rows(graph) for i in rows}
    assert (vb[[i for i in range(len(graph.forward)) if i not in heads]] == 0).all()
    for layer, rows in enumerate(head_rows(graph)):
        b_v = layers[layer].self_attn.v_proj.bias.detach().view(2, 4)  # 2 key/value groups of d_head 4
        w_o = layers[layer].self_attn.o_proj.weight.detach()  # [d_model, n_heads * d_head]
        for h, i in enumerate(rows):
            torch.testing.assert_close(vb[i], b_v[h // 2] @ w_o[:, 4 * h : 4 * h + 4].T)
    vb, centre = mib_processing(load_bridge(paths["llama"]), graph)
    assert not centre and (vb == 0).all()


@pytest.mark.parametrize(
    "name, content, message",
    [
        # issue 50: an empty file gave "MIB dataset 'ioi': no usable (aligned) pairs"
        ("test.jsonl", "", "the file is empty: a MIB dataset file holds rows"),
        ("test.jsonl", "\n\n", "the file is empty: a MIB dataset file holds rows"),
        ("test.json", "", "the file is empty: a MIB dataset file holds rows"),
        ("test.json", "[]", "the file is empty (it holds no rows)"),
    ],
)
def test_an_empty_dataset_file_is_named_as_empty(tmp_path, name, content, message):
    _datasets(tmp_path)
    (tmp_path / "ioi" / "test.jsonl").unlink()
    f = tmp_path / "ioi" / name
    f.write_text(content)
    with pytest.raises(mib.DatasetRowError, match=re.escape(f"{f}: {message}")) as err:
        mib.read_rows(tmp_path / "ioi")
    assert "Copy the dataset's files again" in str(err.value)
