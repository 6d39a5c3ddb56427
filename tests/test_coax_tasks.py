"""Paper B's tasks and the path to the papers' own models (tiny random stand-ins)."""

import pandas as pd
import pytest
import torch

from selfrepair.coax import induction_experiment, ioi_experiment, real_models
from selfrepair.coax import score as coax
from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.tasks import induction, ioi, lm

torch.set_num_threads(1)


def test_toy_ioi_prompts():
    p = ioi.sample_toy(8, seed=0)
    assert p.tokens.shape == (8, ioi.PROMPT_LEN)
    for i in range(8):
        row = p.tokens[i].tolist()
        assert row[0] == ioi.TOKEN[ioi.BOS]
        assert row.count(int(p.io[i])) == 1 and row.count(int(p.s[i])) == 2
        assert row[-1] == ioi.TOKEN["to"]
        # ABBA on even rows (IO named first), BABA on odd rows
        assert row[2] == (int(p.io[i]) if i % 2 == 0 else int(p.s[i]))
    assert torch.equal(ioi.sample_toy(8, 0).tokens, p.tokens)
    logits = torch.zeros(8, ioi.PROMPT_LEN, ioi.VOCAB)
    logits[torch.arange(8), -1, p.io] = 2.0
    logits[torch.arange(8), -1, p.s] = 0.5
    assert float(ioi.logit_diff(logits, p)) == pytest.approx(1.5)
    assert ioi.accuracy(logits, p) == 1.0


def test_induction_sequences_and_metric():
    tok, lens = induction.sample(6, (4, 7), vocab=10, seed=0)
    assert tok.shape == (6, 15)
    for i, t in enumerate(lens.tolist()):
        assert tok[i, 1 : 1 + t].tolist() == tok[i, 1 + t : 1 + 2 * t].tolist()
    # uniform logits: every token has log-prob -log V
    assert float(induction.repeated_logprob(torch.zeros(6, 15, 10), tok, lens)) == pytest.approx(
        -torch.log(torch.tensor(10.0)).item()
    )
    # perfect prediction of the repeated tokens: log-prob 0
    perfect = torch.full((6, 15, 10), -1e4)
    perfect[:, :-1].scatter_(-1, tok[:, 1:, None], 0.0)
    assert float(induction.repeated_logprob(perfect, tok, lens)) == pytest.approx(0.0, abs=1e-4)


def test_attention_only_gpt2_has_no_mlp_output(tmp_path):
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model

    m = build_gpt2_toy(gpt2_toy_config(16, 2, 2, 16, 1, n_ctx=12), seed=0, positional=True)
    induction_experiment.make_attention_only(m)
    save_model(m, tmp_path / "m")
    b = load_bridge(tmp_path / "m")
    _, cache = b.run_with_cache(torch.randint(0, 16, (2, 8)), names_filter=lambda n: n.endswith("hook_mlp_out"))
    assert all(float(v.abs().max()) == 0.0 for v in cache.values())


def test_grammar_language():
    x = lm.sample(4, 30, seed=0)
    assert x.shape == (4, 30) and (x[:, 0] == lm.TOKEN[lm.BOS]).all()
    assert int(x.max()) < lm.VOCAB
    words = [lm.WORDS[i] for i in x[0].tolist()]
    # number agreement: a singular noun directly before an intransitive verb takes 'sleeps' not 'sleep'
    for a, b_ in zip(words, words[1:]):
        if a in lm.NOUN["sg"] and b_ in lm.VI["pl"] + lm.VT["pl"]:
            raise AssertionError(f"agreement broken: {a} {b_}")


def _word_tokenizer(folder):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = (
        ["<unk>", "<bos>", ",", "When", "and", "went", "to", "the", "gave", "a"] + ioi.NAMES + ioi.PLACES + ioi.OBJECTS
    )
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>")
    fast.save_pretrained(folder)
    return len(words)


@pytest.fixture(scope="module")
def tiny_real_models(tmp_path_factory):
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    root = tmp_path_factory.mktemp("hub")
    v = 60
    cfgs = {
        "tiny-gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=v, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
        "tiny-neox": (
            GPTNeoXForCausalLM,
            GPTNeoXConfig(
                vocab_size=v,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
        ),
        "tiny-llama": (
            LlamaForCausalLM,
            LlamaConfig(
                vocab_size=v,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
        ),
    }
    for name, (cls, cfg) in cfgs.items():
        torch.manual_seed(0)
        folder = root / name
        cls(cfg).save_pretrained(folder)
        assert _word_tokenizer(folder) <= v
    return root


def test_gpt2_prompts_with_a_tokenizer(tiny_real_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_real_models / "tiny-gpt2")
    p = ioi.gpt2_prompts(tok, 10, seed=0)
    assert p.tokens.shape[0] == 10
    text = tok.decode(p.tokens[0, 1:])
    assert text.startswith("When ") and text.endswith(" to")
    assert (p.io != p.s).all()


def test_real_model_path_on_tiny_gpt2_neox_llama(tiny_real_models, tmp_path):
    real = {
        "search_paths": [str(tiny_real_models)],
        "ioi_model": "tiny-gpt2",
        "wakeup_models": ["tiny-gpt2", "tiny-neox", "tiny-llama"],
        "induction_models": ["tiny-neox", "tiny-llama"],
        "n_prompts": 12,
        "data_seeds": [1, 2],
        "induction_T": 6,
    }
    ioi_cfg = {
        "n_primary": 2, "backup_frac": 0.2, "top_k": 5, "k_recovered": None, "wake_min": 1.05, "ig_steps": 2,
        "amp_eps": 1e-3,
    }  # fmt: skip
    ind_cfg = {"n_prompts": 8, "data_seed": 3, "ks": [2, 4], "n_primary": 2, "n_random": 2, "protocol": "v1"}
    status = real_models.run_real_models(real, ioi_cfg, ind_cfg, "v2", 16, tmp_path, "cpu").set_index("experiment")
    assert status.loc["ioi", "status"] == "ran", status.loc["ioi", "reason"]
    assert status.loc["wakeup", "status"] == "ran", status.loc["wakeup", "reason"]
    assert status.loc["induction", "status"] == "ran", status.loc["induction", "reason"]
    assert status.loc["pruning", "status"] == "not run"
    tabs = real_models.real_tables(tmp_path)
    assert list(tabs["ioi_summary"]["method"]) == list(DISCOVERY_METHODS)
    disc = pd.read_csv(tmp_path / "ioi_discovery.csv")
    assert list(disc["method"]) == list(DISCOVERY_METHODS) * 2  # per prompt set
    w = pd.read_csv(tmp_path / "wakeup_models.csv")
    assert set(w["model"]) == {"tiny-gpt2", "tiny-neox", "tiny-llama"}
    assert set(tabs["induction"]["model"]) == {"tiny-neox", "tiny-llama"}


def test_absent_weights_are_not_run_not_a_failure(tmp_path):
    real = {
        "search_paths": [str(tmp_path)],
        "ioi_model": "no-such-gpt2",
        "wakeup_models": ["no-such-medium"],
        "induction_models": ["no-such-pythia"],
        "n_prompts": 8,
        "data_seeds": [1],
        "induction_T": 6,
    }
    status = real_models.run_real_models(real, {}, {}, "v2", 16, tmp_path / "t", "cpu")
    assert (status["status"] == "not run").all()
    assert status.set_index("experiment").loc["ioi", "reason"].startswith("not run: weights not found")
    from selfrepair.core import published

    claims = [{"id": "ioi_auc_coax", "claim": "x", "source": "y", "value": 0.91, "tolerance": 0.05}]
    nr = {
        c: r
        for _, row in status.iterrows()
        if row["status"] != "ran"
        for c in row["claims"].split()
        for r in [row["reason"]]
    }
    table = published.compare("coax", claims, coax.measured_claims(None, {}, {}, nr))
    assert table.loc[0, "status"] == "not run" and "weights not found" in table.loc[0, "note"]


def test_ground_truth_pair_interaction_by_hand():
    from coax_toys import PlantedBackup

    m = PlantedBackup(vocab=5, a=1.0)
    u = m.blocks[0].attn.W_O.detach()[0, 0]
    v = m.blocks[0].attn.W_O.detach()[1, 0]
    io, s = int(u.argmax()), int(u.argmin())
    prompts = ioi.IOIPrompts(torch.zeros(4, 3, dtype=torch.long), torch.full((4,), io), torch.full((4,), s))
    heads = [ioi_experiment.parse_name(n) for n in ("L0H0", "L0H1", "L0H2", "L1H0")]
    table, pairs, prim, back = ioi_experiment.ground_truth(m, prompts, heads, n_primary=1, backup_frac=0.1)
    pairs = pairs.set_index(["u", "v"])
    # P alone: repaired by B (drop 0); B alone: silent (drop 0); together: a (u_io - u_s)
    assert pairs.loc[("L0H0", "L1H0"), "drop_u"] == pytest.approx(0.0, abs=1e-6)
    assert pairs.loc[("L0H0", "L1H0"), "drop_v"] == pytest.approx(0.0, abs=1e-6)
    assert pairs.loc[("L0H0", "L1H0"), "interaction"] == pytest.approx(float(u[io] - u[s]), rel=1e-5)
    # I is additive with everything
    assert pairs.loc[("L0H1", "L1H0"), "interaction"] == pytest.approx(0.0, abs=1e-6)
    t = table.set_index("unit")
    assert t.loc["L0H1", "drop"] == pytest.approx(0.3 * float(v[io] - v[s]), rel=1e-5)


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # equal paired differences, by design
def test_release_claims_are_measured_from_the_same_summary_rows_as_the_papers():
    """config/published.yaml's IOI ROC-AUC rows, the paper's and release 2.1.0's (_r21),
    all map to an ioi_summary method: measured from the paper's model when it ran, else
    'not run' with the toy analogue of that method (the release's AtP: atp_mag)."""
    from pathlib import Path

    import yaml

    from selfrepair.core import published

    root = Path(__file__).resolve().parents[1]
    claims = published.load_claims(root / "config/published.yaml", "coax")
    auc_ids = [c["id"] for c in claims if c["id"].startswith("ioi_auc_")]
    assert auc_ids == list(coax.IOI_AUC_CLAIMS)
    assert set(auc_ids) <= set(real_models.IOI_CLAIMS)
    by_id = {c["id"]: c for c in claims}
    for cid in auc_ids:
        release = cid.endswith("_r21")
        assert ("release 2.1.0" in by_id[cid]["source"]) == release and by_id[cid]["tolerance"] == 0.05
    assert by_id["ioi_auc_coax_r21"]["value"] == 0.941 and by_id["ioi_auc_atp_r21"]["value"] == 0.650
    assert yaml.safe_load((root / "workflow/schemas/coax.schema.yaml").read_text())["properties"]["ioi"][
        "properties"]["amp_eps"]["default"] == 1e-3  # fmt: skip
    # two models x one prompt set; AUC of method i: 0.5 + 0.04 i (model 1), + 0.02 (model 2)
    methods = list(DISCOVERY_METHODS)
    disc = pd.DataFrame(
        [
            {"model_seed": ms, "data_seed": 1, "method": m, "roc_auc": 0.5 + 0.04 * i + 0.02 * (ms - 1),
             "hits": 1, "n_backups": 2, "top_k": 5}
            for ms in (1, 2) for i, m in enumerate(methods)
        ]
    )  # fmt: skip
    summ = coax.ioi_summary(disc)
    real = coax.measured_claims(None, {}, {"ioi_summary": summ}, {})
    for cid, mth in coax.IOI_AUC_CLAIMS.items():
        assert real[cid].value == pytest.approx(0.51 + 0.04 * methods.index(mth)), cid
        assert real[cid].lo < real[cid].value < real[cid].hi
    assert real["ioi_auc_atp_r21"].value == pytest.approx(0.51 + 0.04 * methods.index("atp_mag"))
    assert "our atp_mag, mean of 2 runs" in real["ioi_auc_atp_r21"].note
    assert "our" not in real["ioi_auc_atp"].note.split(";")[1]  # the paper's ids keep their note
    # GPT-2 absent: not run, the toy analogue of the mapped method in the note
    nr = {cid: "not run: weights not found" for cid in coax.IOI_AUC_CLAIMS}
    toy = coax.measured_claims(None, {"ioi_summary": summ}, {}, nr)
    table = published.compare("coax", claims, toy).set_index("id")
    for cid, mth in coax.IOI_AUC_CLAIMS.items():
        assert table.loc[cid, "status"] == "not run"
        assert f"toy analogue: {0.51 + 0.04 * methods.index(mth):.3f}" in table.loc[cid, "note"], cid
    assert (table.loc["ioi_auc_eap_ig", "published"], table.loc["ioi_auc_eap_ig_r21", "published"]) == (0.70, 0.581)
