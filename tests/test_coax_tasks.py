"""Paper B's tasks and the path to the papers' own models (tiny random stand-ins)."""

import json

import pandas as pd
import pytest
import torch

from selfrepair.coax import claims as coax_claims
from selfrepair.coax import induction_experiment, ioi_experiment, real_models
from selfrepair.coax import score as coax
from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.core import models
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
        # a context of 8 tokens, shorter than the IOI prompts
        "tiny-short": (GPT2LMHeadModel, GPT2Config(vocab_size=v, n_positions=8, n_embd=32, n_layer=2, n_head=4)),
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
    for style in ioi.PROMPT_STYLES:
        p = ioi.gpt2_prompts(tok, 10, seed=0, style=style)
        assert p.tokens.shape[0] == 10
        text = tok.decode(p.tokens[0, 1:] if style == "bos-torch" else p.tokens[0])
        assert text.startswith("When ") and text.endswith(" to")
        assert (p.io != p.s).all()


def test_gpt2_prompts_authors_style_is_the_release_algorithm(tiny_real_models):
    """The default style builds COAX release 2.1.0's prompts (circuits.ioi_prompts):
    no BOS; numpy default_rng(seed); per prompt 2 names without replacement (IO, S),
    then a place, then an object, from the release's lists; every prompt kept."""
    import numpy as np
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_real_models / "tiny-gpt2")
    # the release's lists, written out here (not taken from ioi)
    names = "John Mary Tom James Dan Sid Martin Anna Paul Kate Mark Lucy Peter Sarah David Emma".split()
    places = "store park school office garden station market library".split()
    objects = "drink book ball ring kiss snack bone note".split()
    for seed in (0, 42):
        p = ioi.gpt2_prompts(tok, 6, seed=seed)
        assert torch.equal(p.tokens, ioi.gpt2_prompts(tok, 6, seed=seed, style="authors").tokens)
        assert p.tokens.shape == (6, 14)  # no BOS: the 14 words of the template
        assert (p.tokens[:, 0] != tok.bos_token_id).all() and (p.tokens != tok.bos_token_id).all()
        rng = np.random.default_rng(seed)
        for i in range(6):
            io, s = rng.choice(names, size=2, replace=False)
            place, obj = rng.choice(places), rng.choice(objects)
            want = f"When {io} and {s} went to the {place} , {s} gave a {obj} to"
            assert tok.decode(p.tokens[i]) == want, (seed, i)
            assert tok.convert_ids_to_tokens([int(p.io[i]), int(p.s[i])]) == [io, s]
    # a prefix of a longer set: nothing is skipped or redrawn
    assert torch.equal(ioi.gpt2_prompts(tok, 20, seed=3).tokens[:6], ioi.gpt2_prompts(tok, 6, seed=3).tokens)


def test_gpt2_prompts_bos_torch_style_keeps_the_old_prompts(tiny_real_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_real_models / "tiny-gpt2")
    p = ioi.gpt2_prompts(tok, 4, seed=0, style="bos-torch")
    # what gpt2_prompts(tok, 4, seed=0) gave before the "authors" style became the default
    assert [tok.decode(t) for t in p.tokens] == [
        "<bos> When Peter and Mark went to the store , Mark gave a drink to",
        "<bos> When Peter and Emma went to the office , Emma gave a drink to",
        "<bos> When James and Mary went to the library , Mary gave a drink to",
        "<bos> When Mary and Kate went to the school , Kate gave a drink to",
    ]
    assert tok.convert_ids_to_tokens(p.io.tolist()) == ["Peter", "Peter", "James", "Mary"]
    assert tok.convert_ids_to_tokens(p.s.tolist()) == ["Mark", "Emma", "Mary", "Kate"]


def test_gpt2_prompts_refuse_an_unknown_style(tiny_real_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_real_models / "tiny-gpt2")
    for bad in ("bos", "Authors", ""):
        with pytest.raises(ValueError, match="prompt style must be one of"):
            ioi.gpt2_prompts(tok, 4, seed=0, style=bad)


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
    status = real_models.run_real_models(real, ioi_cfg, ind_cfg, "v2", 16, tmp_path, "cpu")
    assert list(status.columns) == real_models.STATUS_COLUMNS
    ran = status[status.experiment != "pruning"]
    assert (ran.status == "ran").all(), ran.reason.tolist()
    # one row per model x experiment, each naming the model's folder and identity
    assert list(zip(ran.experiment, ran.model)) == [("ioi", "tiny-gpt2")] + [
        ("wakeup", m) for m in real["wakeup_models"]
    ] + [("induction", m) for m in real["induction_models"]]
    for _, r in ran.iterrows():
        assert r.folder == str(tiny_real_models / r.model)
        assert r.identity == models.model_identity(tiny_real_models / r.model)
    assert ran.drop_duplicates("model").identity.nunique() == 3
    assert status.set_index("experiment").loc["pruning", "status"] == "not run"
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
    status = coax_claims.status_with_claims(real_models.run_real_models(real, {}, {}, "v2", 16, tmp_path / "t", "cpu"))
    # the status CSV's columns: the computation's, with the claims module's claim ids after the reason
    assert list(status.columns) == ["model", "experiment", "status", "reason", "claims", "folder", "identity"]
    by_experiment = status.set_index("experiment")["claims"]
    assert by_experiment["wakeup"] == "wakeup_scales" and by_experiment["induction"] == "induction_ratio_range"
    assert by_experiment["pruning"] == "pruning_beats_baselines pruning_coax_ppl_50 pruning_taylor_ppl_50"
    ioi_ids = by_experiment["ioi"].split()
    assert ioi_ids[:2] == ["ioi_auc_single", "ioi_auc_atp"] and ioi_ids[-1] == "wakeup_random_flat"
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
    table = published.compare("coax", claims, coax_claims.measured_claims(None, {}, {}, nr))
    assert table.loc[0, "status"] == "not run" and "weights not found" in table.loc[0, "note"]
    with pytest.raises(ValueError, match="experiments \\['other'\\] name no claims; add them to coax.claims"):
        coax_claims.status_with_claims(status.assign(experiment="other").drop(columns="claims"))


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
    assert auc_ids == list(coax_claims.IOI_AUC_CLAIMS)
    assert set(auc_ids) <= set(coax_claims.IOI_CLAIMS)
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
    real = coax_claims.measured_claims(None, {}, {"ioi_summary": summ}, {})
    for cid, mth in coax_claims.IOI_AUC_CLAIMS.items():
        assert real[cid].value == pytest.approx(0.51 + 0.04 * methods.index(mth)), cid
        assert real[cid].lo < real[cid].value < real[cid].hi
    assert real["ioi_auc_atp_r21"].value == pytest.approx(0.51 + 0.04 * methods.index("atp_mag"))
    assert "our atp_mag, mean of 2 runs" in real["ioi_auc_atp_r21"].note
    assert "our" not in real["ioi_auc_atp"].note.split(";")[1]  # the paper's ids keep their note
    # GPT-2 absent: not run, the toy analogue of the mapped method in the note
    nr = {cid: "not run: weights not found" for cid in coax_claims.IOI_AUC_CLAIMS}
    toy = coax_claims.measured_claims(None, {"ioi_summary": summ}, {}, nr)
    table = published.compare("coax", claims, toy).set_index("id")
    for cid, mth in coax_claims.IOI_AUC_CLAIMS.items():
        assert table.loc[cid, "status"] == "not run"
        assert f"toy analogue: {0.51 + 0.04 * methods.index(mth):.3f}" in table.loc[cid, "note"], cid
    assert (table.loc["ioi_auc_eap_ig", "published"], table.loc["ioi_auc_eap_ig_r21", "published"]) == (0.70, 0.581)


def _model_files_by_hand(folder):
    import hashlib

    lines = ""
    for f in [folder / "config.json", *sorted(folder.glob("*.safetensors"))]:
        lines += f"{f.name}\0{hashlib.sha256(f.read_bytes()).hexdigest()}\n"
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def test_model_identity_hashes_config_and_weights(tiny_real_models, tmp_path):
    import shutil

    src = tiny_real_models / "tiny-gpt2"
    assert models.model_identity(src) == _model_files_by_hand(src)
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    assert models.model_identity(copy) == models.model_identity(src)  # the files, not the folder's name
    cfg = json.loads((copy / "config.json").read_text())
    cfg["activation_function"] = "relu"  # same weights, another model
    (copy / "config.json").write_text(json.dumps(cfg))
    assert models.model_identity(copy) != models.model_identity(src)


def test_one_failing_model_costs_its_row_not_the_others(tiny_real_models, tmp_path, monkeypatch):
    real = {
        "search_paths": [str(tiny_real_models)],
        "ioi_model": "tiny-short",
        "wakeup_models": ["tiny-gpt2", "tiny-short", "no-such-model", "tiny-llama"],
        "induction_models": ["tiny-neox", "tiny-llama"],
        "n_prompts": 8,
        "data_seeds": [1],
        "induction_T": 6,
    }
    ioi_cfg = {"n_primary": 2, "backup_frac": 0.2, "top_k": 5, "k_recovered": None, "wake_min": 1.05, "ig_steps": 2}
    ind_cfg = {"n_prompts": 8, "data_seed": 3, "ks": [2, 4], "n_primary": 2, "n_random": 2, "protocol": "v1"}
    run_induction = real_models.induction_experiment.run_induction

    def fails_on_neox(bridge, *a, **k):
        if bridge.cfg.n_ctx == 64 and "NeoX" in type(bridge.original_model).__name__:
            raise RuntimeError("out of memory (simulated)")
        return run_induction(bridge, *a, **k)

    monkeypatch.setattr(real_models.induction_experiment, "run_induction", fails_on_neox)
    status = coax_claims.status_with_claims(
        real_models.run_real_models(real, ioi_cfg, ind_cfg, "v2", 16, tmp_path, "cpu")
    )
    st = status.set_index(["experiment", "model"])
    length = ioi.gpt2_prompts(models.checkpoint_tokenizer(tiny_real_models / "tiny-gpt2"), 8, 1).tokens.shape[1]
    assert length == 14  # the checkpoint's tokenizer adds no BOS (the bridge's would: 15)
    short = f"not run: the IOI prompts are {length} tokens long, longer than tiny-short's context of 8 tokens (n_ctx)"
    assert st.loc[("ioi", "tiny-short"), "reason"] == short
    assert st.loc[("wakeup", "tiny-short"), "reason"] == short
    assert st.loc[("wakeup", "no-such-model"), "reason"].startswith("not run: weights not found for 'no-such-model'")
    assert st.loc[("wakeup", "no-such-model"), "identity"] == ""
    assert st.loc[("induction", "tiny-neox"), "reason"] == "not run: failed: RuntimeError: out of memory (simulated)"
    for key in [("wakeup", "tiny-gpt2"), ("wakeup", "tiny-llama"), ("induction", "tiny-llama")]:
        assert st.loc[key, "status"] == "ran", st.loc[key, "reason"]
    # the others' tables are kept
    assert set(pd.read_csv(tmp_path / "wakeup_models.csv").model) == {"tiny-gpt2", "tiny-llama"}
    assert set(pd.read_csv(tmp_path / "induction.csv").model) == {"tiny-llama"}
    assert not (tmp_path / "ioi_summary.csv").exists()
    # the published table: a claim of a model that did not run is not run, with the reason
    files = coax_claims.model_files(status)
    assert "ioi_auc_coax" not in files
    assert files["wakeup_scales"] == "; ".join(
        f"{m} at {tiny_real_models / m} (identity {models.model_identity(tiny_real_models / m)})"
        for m in ("tiny-gpt2", "tiny-llama")
    )


def test_induction_progress_plan_is_the_rows_it_runs(tiny_real_models, caplog):
    import logging
    import re

    ind_cfg = {"n_prompts": 8, "data_seed": 3, "ks": [2, 4], "n_primary": 2, "n_random": 2, "protocol": "v1"}
    b = models.load_bridge(tiny_real_models / "tiny-llama")
    with caplog.at_level(logging.INFO, logger="selfrepair.progress"):
        real_models._run_induction(b, "tiny-llama", {"induction_T": 6}, ind_cfg, 16, 2048, 1000.0)
    done = [m for m in caplog.messages if " done in " in m]
    rows = int(re.search(r", (\d+) rows \(", done[0]).group(1))
    # 8 heads, 2 primaries: 1 detection + 2 + 2 x 6 scan + 2 + 2 ks x 3 sets x 2, each over 8 prompts
    assert rows == (1 + 2 + 12 + 2 + 12) * 8


# ---- COAX release 2.1.0's protocol on real models (issue 51) ----------------------------
def test_real_ioi_prompt_sets_default_to_the_release_seeds():
    """backup_recovery_full.py's --seeds default is 1 8 15 22."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    schema = yaml.safe_load((root / "workflow" / "schemas" / "coax.schema.yaml").read_text())
    assert schema["properties"]["real"]["properties"]["data_seeds"]["default"] == [1, 8, 15, 22]


def test_release_vocab_bounds_v2_on_a_padded_vocabulary(tiny_real_models):
    """tiny-gpt2 outputs 60 logits but its tokenizer has 42 tokens (a padded vocabulary,
    like Pythia's 50,304 outputs for 50,254 tokens). The release's full vocabulary is
    top-r with r = min(42, 60): the 42 largest clean logits at the last position, p0
    their softmax. The single-ablation energy of a head is worked out here from full
    forwards with the head's z zeroed: mean over prompts of sum_k p0_k (dz_k -
    E_p0[dz])^2 on those 42 logits."""
    bridge = models.load_bridge(tiny_real_models / "tiny-gpt2", "cpu")
    assert int(bridge.cfg.d_vocab) == 60 and coax.release_vocab(bridge) == bridge.tokenizer.vocab_size == 42
    tokens = ioi.gpt2_prompts(models.checkpoint_tokenizer(tiny_real_models / "tiny-gpt2"), 6, seed=1).tokens
    from selfrepair.core.components import head_components

    head = head_components(2, 4)[5]
    with torch.no_grad():
        z0 = bridge(tokens)[:, -1, :].float()
        hook = (f"blocks.{head.layer}.attn.hook_z", lambda z, hook: z.index_fill(2, torch.tensor([head.head]), 0.0))
        za = bridge.run_with_hooks(tokens, fwd_hooks=[hook])[:, -1, :].float()
    top = z0.topk(42, dim=-1).indices
    p0 = torch.softmax(z0.gather(-1, top), -1)
    dz = z0.gather(-1, top) - za.gather(-1, top)
    want = float((p0 * (dz - (p0 * dz).sum(-1, keepdim=True)) ** 2).sum(-1).mean())
    support = coax.make_support(bridge(tokens).detach(), "v2", vocab=42)
    assert support.index.shape == (6, 1, 42)
    assert torch.equal(support.index.sort(-1).values[:, 0], top.sort(-1).values)
    got = coax.scan(bridge, tokens, [head], protocol="v2", vocab=coax.release_vocab(bridge)).table["single"][0]
    full = coax.scan(bridge, tokens, [head], protocol="v2").table["single"][0]
    assert got == pytest.approx(want, rel=1e-4)
    assert abs(full - want) > 1e-3 * want  # the 18 padded logits move the energy here
    # a bound at or above the output size keeps all of it, as before
    assert torch.equal(coax.make_support(z0[:, None], "v2", vocab=60).index, coax.make_support(z0[:, None], "v2").index)


def test_real_model_ioi_and_wakeup_scan_with_the_release_vocab(tiny_real_models, tmp_path, monkeypatch):
    seen = []
    real_scan = coax.scan

    def spy(*a, **kw):
        seen.append(kw.get("vocab"))
        return real_scan(*a, **kw)

    monkeypatch.setattr(ioi_experiment.coax, "scan", spy)
    monkeypatch.setattr(real_models, "scan", spy)
    real = {"search_paths": [str(tiny_real_models)], "ioi_model": "tiny-gpt2", "wakeup_models": ["tiny-gpt2"],
            "induction_models": [], "n_prompts": 6, "data_seeds": [1], "induction_T": 6}  # fmt: skip
    ioi_cfg = {"n_primary": 2, "backup_frac": 0.2, "top_k": 5, "k_recovered": None, "wake_min": 1.05,
               "ig_steps": 1, "amp_eps": 1e-3}  # fmt: skip
    status = real_models.run_real_models(real, ioi_cfg, {}, "v2", 16, tmp_path, "cpu")
    assert (status[status.experiment != "pruning"].status == "ran").all(), status.reason.tolist()
    assert seen == [42, 42]  # the IOI scan and the wake-up scan


def test_authors_prompts_keep_the_tokenizers_bos(tmp_path):
    """A tokenizer that puts BOS first (as Llama's, Gemma's and OLMo's do): the release
    tokenizes with tokenizer(prompt), so each prompt is BOS + the 14 template words;
    IO and S stay the names' own first tokens."""
    import numpy as np
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<bos>", ",", "When", "and", "went", "to", "the", "gave", "a"]
    words += ioi.NAMES + ioi.PLACES + ioi.OBJECTS
    tk = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = Whitespace()
    tk.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<bos>")
    assert tok("When")["input_ids"] == [1, 3]  # the tokenizer's call adds BOS
    p = ioi.gpt2_prompts(tok, 5, seed=8)
    assert p.tokens.shape == (5, 15) and (p.tokens[:, 0] == 1).all() and (p.tokens[:, 1:] != 1).all()
    rng = np.random.default_rng(8)
    for i in range(5):
        io, s = rng.choice(ioi.NAMES, size=2, replace=False)
        place, obj = rng.choice(ioi.PLACES), rng.choice(ioi.OBJECTS)
        want = f"When {io} and {s} went to the {place} , {s} gave a {obj} to"
        assert tok.decode(p.tokens[i, 1:]) == want
        assert [words[int(p.io[i])], words[int(p.s[i])]] == [io, s]
