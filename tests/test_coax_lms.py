"""Paper B on the packaged real LMs (coax.lms, coax.name_movers, rule coax_lm), on tiny
local models: the name-mover finder on a Llama with planted heads, the last-position
unembedding against the full one, the library's smoke run on a tiny Llama and a tiny
Gemma-3, and the rule's plan."""

import math

import pandas as pd
import pytest
import torch

import golden_suite as G
from selfrepair.coax import lm_seeds, lms, name_movers
from selfrepair.coax.baselines import DISCOVERY_METHODS
from selfrepair.core.interventions import Prefix
from selfrepair.core.models import load_bridge, save_model
from selfrepair.tasks import ioi

WORDS = ["<unk>", "<bos>", ",", "When", "and", "went", "to", "the", "gave", "a"] + ioi.NAMES + ioi.PLACES + ioi.OBJECTS
V = 60
C_OUT = 3.0  # the planted name mover's output gain


def _word_tokenizer(folder):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>").save_pretrained(folder)


def _planted_llama(folder):
    """A 2-layer Llama (d_model 16, 4 heads of 16, tied embeddings) whose only writers
    are two layer-1 heads that attend to the token 'Mary' (query bias, key = the
    direction of Mary's embedding, in head dimensions 4-7 whose rotary frequency is ~0):
    L1H2 copies it (V = identity, O = +3 I: a name mover when Mary is IO), L1H0 writes
    it negated (O = -1.5 I: attends IO, writes against it). Every other head's output
    projection and every MLP's down projection are zero."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, max_position_embeddings=64, attention_bias=True, rope_theta=1e12,
        tie_word_embeddings=True,
    )  # fmt: skip
    m = LlamaForCausalLM(cfg)
    mary = WORDS.index("Mary")
    with torch.no_grad():
        m.model.embed_tokens.weight.normal_(0, 1)
        e = m.model.embed_tokens.weight[mary] / m.model.embed_tokens.weight[mary].norm()
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.zero_()
        att = m.model.layers[1].self_attn
        for h, gain in ((2, C_OUT), (0, -C_OUT / 2)):
            r = slice(16 * h, 16 * h + 16)
            att.q_proj.weight[r] = 0.0
            att.q_proj.bias[16 * h + 4] = 5.0
            att.k_proj.weight[r] = 0.0
            att.k_proj.weight[16 * h + 4] = 4.0 * 4.0 * e  # score 5 * 16 * cos / sqrt(16) = 20 on Mary
            att.v_proj.weight[r] = torch.eye(16)
            att.o_proj.weight[:, r] = gain * torch.eye(16)
    save_model(m, folder)
    _word_tokenizer(folder)
    return m


def _mary_prompts(tok, n=6):
    """IOI prompts with IO = Mary, S one of the other names."""
    others = [w for w in ioi.NAMES if w != "Mary"][:n]
    texts = [f"When Mary and {s} went to the store, {s} gave a drink to" for s in others]
    toks = torch.tensor([tok.encode(t, add_special_tokens=False) for t in texts])
    io = torch.full((n,), WORDS.index("Mary"))
    s_ids = torch.tensor([WORDS.index(s) for s in others])
    return ioi.IOIPrompts(toks, io, s_ids)


def test_name_movers_find_the_planted_head(tmp_path):
    from transformers import AutoTokenizer

    m = _planted_llama(tmp_path / "m")
    bridge = load_bridge(tmp_path / "m")
    pr = _mary_prompts(AutoTokenizer.from_pretrained(tmp_path / "m"))
    t = name_movers.pick_primaries(name_movers.name_mover_table(bridge, pr), n_primary=3).set_index("unit")
    # both planted heads attend to IO (weight ~1), not to S
    for u in ("L1H2", "L1H0"):
        assert t.loc[u, "att_io"] > 0.999 and t.loc[u, "att_s"] < 1e-3
    # only the copying head writes logit[IO] - logit[S]: the one name mover, first
    assert list(t.index[t["name_mover"]]) == ["L1H2"]
    assert t.loc["L1H0", "dla"] < 0
    # the primaries: it, topped up by DLA to 3 (every other head writes nothing: DLA 0)
    assert t.loc["L1H2", "primary"] and int(t["primary"].sum()) == 3 and not t.loc["L1H0", "primary"]
    assert t.loc["L1H2", "how"].startswith("name mover")
    assert t.loc[t["primary"] & (t.index != "L1H2"), "how"].str.startswith("top-up").all()
    # its DLA by hand: its output at END is 3 * RMSNorm(e_Mary); the final residual is
    # e_END + (3 - 1.5) * RMSNorm(e_Mary); the final norm's scale frozen; tied unembedding
    E = m.model.embed_tokens.weight.detach()
    mary = E[WORDS.index("Mary")]
    nmary = mary / torch.sqrt(mary.pow(2).mean() + m.config.rms_norm_eps)
    want = []
    for b in range(pr.tokens.shape[0]):
        x = E[pr.tokens[b, -1]] + (C_OUT - C_OUT / 2) * nmary
        scale = torch.sqrt(x.pow(2).mean() + m.config.rms_norm_eps)
        want.append(float((C_OUT * nmary / scale) @ (mary - E[pr.s[b]])))
    assert t.loc["L1H2", "dla"] == pytest.approx(sum(want) / len(want), rel=1e-4)


def _tiny_gemma3(folder):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=128, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    save_model(Gemma3ForCausalLM(cfg), folder)
    _word_tokenizer(folder)


def _tiny_llama(folder):
    from tiny_models import tiny_llama

    save_model(tiny_llama(vocab_size=V, max_position_embeddings=128), folder)
    _word_tokenizer(folder)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny_lm(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "model"
    (_tiny_llama if request.param == "llama" else _tiny_gemma3)(folder)
    return request.param, folder


def test_last_position_logits_equal_the_full_unembedding(tiny_lm):
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tokens = torch.randint(2, V, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = bridge(tokens)
    pfx = Prefix(bridge, tokens, positions=[8])
    assert pfx.resumable  # Gemma-3's sliding and global layers resume with their own masks
    assert torch.equal(pfx.logits([8]), full[:, [8]])
    with pytest.raises(ValueError, match="keeps the intact logits at positions"):
        pfx.logits([3])


SMOKE = {
    "truth_seed": 5, "backup_share": 0.25, "top_r": 16, "max_rows": 64, "pruning_note": "too costly here",
    "n_bos": 4, "n_truth": 4, "n_prompts": 3, "data_seeds": [1], "induction_T": 5, "induction_prompts": 3,
    "induction_protocol": "v2", "templates": ["ABBA", "BABA"], "seedings": ["name_movers", "single_drop"],
}  # fmt: skip
IOI_CFG = {"n_primary": 2, "top_k": 3, "k_recovered": None, "wake_min": 1.05, "ig_steps": 2, "amp_eps": 1e-3}
IND_CFG = {"data_seed": 3, "ks": [2], "n_primary": 2, "n_random": 2}


def test_coax_lm_runs_every_part(tiny_lm, tmp_path, caplog):
    name, folder = tiny_lm
    with caplog.at_level("INFO", logger="selfrepair.progress"):
        status = lms.coax_lm(folder, name, SMOKE, IOI_CFG, IND_CFG, "v2", tmp_path, "cpu")
    # the heartbeat counts every stage it runs: BOS, seeds, one data seed x two seedings, induction
    started = [r.getMessage() for r in caplog.records if " started (" in r.getMessage()]
    assert len(started) == 5 and started[-1].endswith("started (5/5)"), started
    assert list(status.columns) == lms.STATUS_COLUMNS
    assert list(status["experiment"]) == list(lms.PARTS)
    ran = status.set_index("experiment")
    assert (ran.loc[["bos", "ioi", "induction"], "status"] == "ran").all(), status.reason.tolist()
    assert ran.loc["pruning", "status"] == "not run" and "too costly here" in ran.loc["pruning", "reason"]
    bos = pd.read_csv(tmp_path / "bos.csv")
    assert list(bos["bos"]) == [False, True] and int(bos["chosen"].sum()) == 1
    heads = pd.read_csv(tmp_path / "heads.csv")
    n_heads = {"llama": 8, "gemma3": 4}[name]  # 2 layers of 4 heads; 2 of 2
    for seeding in ("name_movers", "single_drop"):
        ioi_h = heads[(heads.task == "ioi") & (heads.seeding == seeding)]
        assert len(ioi_h) == n_heads and int((ioi_h.role == "primary").sum()) == 2
        # candidates: the heads after the earliest primary's layer; the others are upstream
        first = min(int(u[1]) for u in ioi_h.loc[ioi_h.role == "primary", "unit"])
        layer = ioi_h["unit"].str[1].astype(int)
        assert set(ioi_h.loc[(layer <= first) & (ioi_h.role != "primary"), "role"]) <= {"upstream"}
        n_cand = int(((layer > first) & (ioi_h.role != "primary")).sum())
        # a quarter of the heads other than the primaries, rounded, at least 1, beta > 0
        back = ioi_h[ioi_h.role == "backup"]
        assert len(back) <= max(1, round(0.25 * (n_heads - 2))) and (back.beta > 0).all()
        if seeding == "single_drop":  # the primaries: the largest mean single drops
            assert set(ioi_h.nlargest(2, "drop")["unit"]) == set(ioi_h.loc[ioi_h.role == "primary", "unit"])
        # the backups again from the per-prompt matrix of ioi_truth: the same
        truth = pd.read_csv(tmp_path / "ioi_truth.csv")
        mat, units, tmpl, n_other = lm_seeds.matrix_from_table(truth[truth.seeding == seeding])
        assert len(units) == n_cand and list(tmpl) == ["ABBA", "BABA", "ABBA", "BABA"] and n_other == n_heads - 2
        again = lm_seeds.backups_from(mat, units, 0.25, None, n_other)
        assert set(again.loc[again.backup, "unit"]) == set(back["unit"])
    disc = pd.read_csv(tmp_path / "ioi_discovery.csv")
    for _, d in disc.groupby("seeding"):
        assert list(d["method"]) == list(DISCOVERY_METHODS)
    assert (disc["ground_truth"] == "conditional ablation on this model (no documented circuit)").all()
    for f in ("ioi_summary", "ioi_wake", "ioi_freeze", "ioi_knockout", "induction", "seeds_stability"):
        assert len(pd.read_csv(tmp_path / f"{f}.csv")) > 0, f
    assert int((heads.task == "induction").sum()) == n_heads
    # the per-prompt table against run_ioi's own means (another code path): the intact and
    # primaries-ablated logit differences of knockout, and freezing's drops
    pr, ko = pd.read_csv(tmp_path / "ioi_prompts.csv"), pd.read_csv(tmp_path / "ioi_knockout.csv")
    fr = pd.read_csv(tmp_path / "ioi_freeze.csv")
    for seeding, p in pr.groupby("seeding"):
        k = ko[ko.seeding == seeding].set_index("set")
        assert p["ld_clean"].mean() == pytest.approx(k.loc["clean", "logit_diff"], abs=1e-5)
        assert p["ld_primaries"].mean() == pytest.approx(k.loc["primaries", "logit_diff"], abs=1e-5)
        assert p["ld_primaries_coax"].mean() == pytest.approx(k.loc["primaries+coax", "logit_diff"], abs=1e-5)
        f = fr[fr.seeding == seeding].iloc[0]
        assert (p["ld_clean"] - p["ld_frozen_backups"]).mean() == pytest.approx(f["drop_backups_frozen"], abs=1e-5)
        assert (p["ld_clean"] - p["ld_frozen_all"]).mean() == pytest.approx(f["drop_all_frozen"], abs=1e-5)
    # induction per sequence: its means are induction.csv's drops
    seq, ind = pd.read_csv(tmp_path / "induction_sequences.csv"), pd.read_csv(tmp_path / "induction.csv")
    for k, g in seq.groupby("k"):
        r = ind[ind.k == k].iloc[0]
        assert g["drop_coax"].mean() == pytest.approx(r["drop_coax"], abs=1e-5)
        assert g["drop_random"].mean() == pytest.approx(r["drop_random"], abs=1e-5)


def test_a_failing_part_costs_its_row_only(tiny_lm, tmp_path):
    name, folder = tiny_lm
    if name != "llama":
        pytest.skip("one architecture is enough")
    bad = {**SMOKE, "induction_T": 500}  # longer than the context: induction fails, IOI still runs
    status = lms.coax_lm(folder, name, bad, IOI_CFG, IND_CFG, "v2", tmp_path, "cpu").set_index("experiment")
    assert status.loc["ioi", "status"] == "ran"
    assert status.loc["induction", "status"] == "not run" and "failed" in status.loc["induction", "reason"]
    assert (tmp_path / "ioi_summary.csv").exists() and not (tmp_path / "induction.csv").exists()
    assert not math.isnan(status.loc["ioi", "cpu_s"])


@pytest.mark.slow
def test_rule_coax_lm_is_planned_per_packaged_lm(tmp_path):
    over = tmp_path / "lms.yaml"
    over.write_text("lms: {models: [smollm2-135m, gemma-3-270m], scale: large}\n")
    r = G.snakemake("-n", *G.tiny_args(tmp_path, over, paper="coax"), "--", "results/coax/lms/gemma-3-270m/status.csv")
    out = r.stdout + r.stderr
    assert "rule coax_lm:" in out and "rule lm_convert:" in out
    assert "results/coax/lms/gemma-3-270m/tables" in out
    # off without packaged LMs: the tiny config's lms: {models: []} plans no coax_lm job
    r = G.snakemake("-n", *G.tiny_args(tmp_path, paper="coax"))
    assert "rule coax_lm:" not in r.stdout + r.stderr and "rule coax_lm_train:" in r.stdout + r.stderr


def test_fit_rows_keeps_one_forwards_logits_near_a_gigabyte():
    from types import SimpleNamespace

    from selfrepair.core.interventions import fit_rows

    gemma3 = SimpleNamespace(cfg=SimpleNamespace(d_vocab=262_144))
    assert fit_rows(gemma3, 20, 4096) == 47  # 2.5e8 // (20 x 262,144): 47 x 20 x 262,144 x 4 B = 0.99 GB
    assert fit_rows(gemma3, 10_000, 4096) == 1  # never fewer than one sequence
    toy = SimpleNamespace(cfg=SimpleNamespace(d_vocab=100))
    assert fit_rows(toy, 20, 4096) == 4096  # a small vocabulary: max_rows as given


def test_the_truth_matrix_reuses_the_single_ablations_bit_for_bit(tiny_lm):
    """The conditional-ablation matrix built on the single-drop matrix's runs equals the
    one that runs every set itself, bit for bit (a row's logits do not depend on the rows
    batched with it)."""
    from transformers import AutoTokenizer

    from selfrepair.core.components import head_components

    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    pr = lms.lm_prompts(tok, 4, 3, True, bridge, ["ABBA", "BABA"])
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    pfx = Prefix(bridge, pr.tokens, positions=[pr.tokens.shape[1] - 1])
    prim, cands = [heads[0]], heads[1:]
    drops = lm_seeds.drop_matrix(pfx, pr, heads, max_rows=6)
    reused = lm_seeds.truth_matrix(pfx, pr, prim, cands, 6, drops, heads)
    alone = lm_seeds.truth_matrix(pfx, pr, prim, cands, 64)
    assert reused.shape == (2 + 2 * len(cands), 4) and (reused == alone).all()


def test_baba_swaps_the_first_mentions_and_halves_split_each_template(tmp_path):
    from transformers import AutoTokenizer

    from selfrepair.core.components import parse

    _word_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    pr = lms.lm_prompts(tok, 4, 7, False, None, ["ABBA", "BABA"])
    words = [tok.convert_ids_to_tokens(row.tolist()) for row in pr.tokens]
    for i, w in enumerate(words):
        io, s = tok.convert_ids_to_tokens([int(pr.io[i]), int(pr.s[i])])
        # "When A and B went to the P , S gave a O to": ABBA has IO first, BABA S first
        assert w[:4] == ["When", io if i % 2 == 0 else s, "and", s if i % 2 == 0 else io]
        assert w[9] == s and w[-1] == "to"
    a, b = lm_seeds.halves(lm_seeds.template_names(6))
    assert list(a) == [0, 1, 4, 5] and list(b) == [2, 3]  # ABBA 0 2 4 and BABA 1 3 5, each alternately
    with pytest.raises(ValueError, match="template BABA has 1 truth prompt"):  # half B would lack BABA
        lm_seeds.halves(lm_seeds.template_names(3))
    heads = [parse(u) for u in ("L0H0", "L1H0", "L1H1", "L2H0", "L3H0")]
    cands, up = lm_seeds.downstream(heads, [parse("L1H0"), parse("L3H0")])
    assert [h.name for h in cands] == ["L2H0"] and [h.name for h in up] == ["L0H0", "L1H1"]
    with pytest.raises(ValueError, match="templates"):
        lm_seeds.template_names(3, ["ABAB"])
