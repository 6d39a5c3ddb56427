"""Paper C on real LMs: the MIB-format dataset generator, the accuracy gate, the
bootstrap interval over pairs, and a smoke run of gim_lm's library function on a tiny
random Llama (seconds)."""

import json
import warnings

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore")

from selfrepair.gim import lm_pairs  # noqa: E402
from selfrepair.tasks import mib, mib_synth  # noqa: E402

FRACTIONS = (0.1, 0.5, 1.0)


def _word_tokenizer(folder, texts, bos: bool):
    """A word-level tokenizer (words and punctuation split) over every word of ``texts``;
    with ``bos`` it puts <bos> first, as Gemma-3's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    words = sorted({w for t in texts for w, _ in pre.pre_tokenize_str(t)})
    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre
    if bos:
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<pad>", pad_token="<pad>", bos_token="<bos>")
    fast.save_pretrained(str(folder))
    return fast


def _all_texts(data_dir):
    out = []
    for f in sorted(data_dir.rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out.append(json.dumps(r).replace("\\n", " "))
    return out


# ---------------------------------------------------------------- generator -----
def test_rows_are_deterministic_and_splits_differ():
    for task in mib_synth.TASKS:
        a, b = mib_synth.rows(task, 20, 7), mib_synth.rows(task, 20, 7)
        assert a == b
        assert a != mib_synth.rows(task, 20, 8)
        assert a != mib_synth.rows(task, 20, 7, "validation")


def test_rows_parse_through_mib_with_the_right_answers(tmp_path):
    mib_synth.write(tmp_path, mib_synth.TASKS, 30, 0)
    ioi = mib.read_rows(tmp_path / "ioi", "test")
    assert len(ioi) == 30
    for _, row in ioi.iterrows():
        clean, corrupt, io, s = mib.answers("ioi", row)
        assert io != s and clean.endswith(" to")
        # the counterfactual names S twice less and IO once more (S2 flipped to IO)
        assert clean.count(s) == 2 and clean.count(io) == 1
        assert corrupt.count(s) == 1 and corrupt.count(io) == 2
    for _, row in mib.read_rows(tmp_path / "copycolors_mcqa", "test").iterrows():
        clean, corrupt, a, f = mib.answers("copycolors_mcqa", row)
        color = row["choices"]["text"][row["answerKey"]]
        assert f"\n{a}. {color}\n" in clean and f"\n{f}. {color}\n" in corrupt and a != f
        assert f" are {color}. What color" in clean  # the right colour is the one the question states
    for _, row in mib.read_rows(tmp_path / "arithmetic_addition", "test").iterrows():
        clean, corrupt, a, f = mib.answers("arithmetic_addition", row)
        assert clean.startswith(mib_synth.FEW_SHOT) and corrupt.startswith(mib_synth.FEW_SHOT)
        x, y = clean.split("\n")[-1].rstrip("=").split("+")
        assert int(a) == int(x) + int(y) < 100 and a[0] != f[0]
        x, y = corrupt.split("\n")[-1].rstrip("=").split("+")
        assert int(f) == int(x) + int(y)


@pytest.mark.parametrize("bos", [False, True])
def test_answers_are_single_tokens_and_pairs_align(tmp_path, bos):
    mib_synth.write(tmp_path / "d", mib_synth.TASKS, 40, 3)
    tok = _word_tokenizer(tmp_path / "tok", _all_texts(tmp_path / "d"), bos)
    for name in mib_synth.NAMES + mib_synth.COLORS + mib_synth.LABELS:
        assert len(tok(" " + name, add_special_tokens=False)["input_ids"]) == 1
    for task in mib_synth.TASKS:
        data = mib.load(task, tok, 40, [str(tmp_path / "d")])
        assert len(data) == 40  # every pair aligned and answer != foil
        assert bool((data.clean[:, 0] == 1).all()) == bos  # the tokenizer's own BOS, or none
        # MIB's BOS: the tokenizer's BOS first, once, whether or not its call adds it; the
        # same pairs otherwise, one position later
        mib_bos = mib.load(task, tok, 40, [str(tmp_path / "d")], bos="mib")
        assert bool((mib_bos.clean[:, 0] == 1).all()) and not bool((mib_bos.clean[:, 1] == 1).any())
        bare = data.clean[:, 1:] if bos else data.clean
        assert torch.equal(mib_bos.clean[:, 1:], bare) and torch.equal(mib_bos.answer, data.answer)
        assert torch.equal(mib_bos.pos, data.pos + (0 if bos else 1))
        assert mib.bos_first(tok, "mib") and mib.bos_first(tok, "tokenizer") == bos
    with pytest.raises(ValueError, match="unknown bos 'prepend'"):
        mib.load("ioi", tok, 4, [str(tmp_path / "d")], bos="prepend")


def test_digit_answers_are_read_at_their_first_digit():
    class Digits:  # a tokenizer that splits digits and makes the space a token of its own
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [10 if ch == " " else int(ch) for ch in text]}

        def decode(self, ids):
            return "".join(" " if i == 10 else str(i) for i in ids)

    assert mib.answer_tokens(Digits(), "46") == [4, 6]
    assert mib.answer_tokens(Digits(), " ") == [10]


# ---------------------------------------------------------------- gate -----------
def test_gate_is_chance_plus_margin():
    assert lm_pairs.gate(0.80, 0.5)[0] and not lm_pairs.gate(0.79, 0.5)[0]
    assert lm_pairs.gate(0.55, 0.25)[0] and not lm_pairs.gate(0.54, 0.25)[0]
    assert "0.790 < chance 0.50 + 0.30" in lm_pairs.gate(0.79, 0.5)[1]


def test_correct_counts_answer_over_foil_and_the_best_choice():
    from selfrepair.tasks.counterfactual import CounterfactualBatch

    logits = torch.zeros(3, 2, 6)
    logits[:, 1] = torch.tensor([[0, 5, 1, 0, 0, 0], [0, 1, 5, 0, 0, 0], [0, 1, 2, 3, 0, 0]], dtype=torch.float)

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, tokens):
            return logits[tokens[:, 0]]

    data = CounterfactualBatch(torch.tensor([[0, 0], [1, 0], [2, 0]]), torch.zeros(3, 2, dtype=torch.long),
                               torch.tensor([1, 1, 2]), torch.tensor([2, 2, 1]), torch.tensor([1, 1, 1]))  # fmt: skip
    assert lm_pairs.correct(Fixed(), data, batch_size=2).tolist() == [True, False, True]
    choices = torch.tensor([[1, 2, 3]] * 3)  # row 2: 3 beats the answer 2
    assert lm_pairs.correct(Fixed(), data, choices, batch_size=2).tolist() == [True, False, False]


# ---------------------------------------------------------------- bootstrap ------
def _hand_table():
    rng = np.random.default_rng(5)
    n = 12
    full = 3 + rng.normal(size=n)
    empty = rng.normal(size=n) * 0.3
    signed = np.stack([empty + (full - empty) * f + rng.normal(size=n) * 0.2 for f in (0.2, 0.6, 1.0)])
    absolute = np.stack([empty + (full - empty) * f + rng.normal(size=n) * 0.2 for f in (0.5, 0.9, 1.0)])
    return {"full": full, "empty": empty, "signed": signed, "absolute": absolute}


def test_cpr_cmd_by_hand():
    t = _hand_table()
    fs = [(t["signed"][i].mean() - t["empty"].mean()) / (t["full"].mean() - t["empty"].mean()) for i in range(3)]
    fa = [(t["absolute"][i].mean() - t["empty"].mean()) / (t["full"].mean() - t["empty"].mean()) for i in range(3)]
    cpr = 0.4 * (fs[0] + fs[1]) / 2 + 0.5 * (fs[1] + fs[2]) / 2
    cmd = 0.4 * (abs(1 - fa[0]) + abs(1 - fa[1])) / 2 + 0.5 * (abs(1 - fa[1]) + abs(1 - fa[2])) / 2
    got = lm_pairs.cpr_cmd(t, FRACTIONS)
    assert got == pytest.approx((cpr, cmd), rel=1e-12)


def test_bootstrap_interval_matches_an_independent_percentile_bootstrap():
    t = _hand_table()
    n, B = len(t["full"]), 400
    rng = np.random.default_rng(11)  # the same draws as pair_bootstrap(seed=11)
    cprs, cmds = [], []
    for _ in range(B):
        i = rng.integers(0, n, n)
        m_full, m_empty = np.mean(t["full"][i]), np.mean(t["empty"][i])
        f_s = [(np.mean(t["signed"][k][i]) - m_empty) / (m_full - m_empty) for k in range(3)]
        f_a = [(np.mean(t["absolute"][k][i]) - m_empty) / (m_full - m_empty) for k in range(3)]
        cprs.append(np.trapezoid(f_s, FRACTIONS))
        cmds.append(np.trapezoid(np.abs(1 - np.array(f_a)), FRACTIONS))
    got = lm_pairs.pair_bootstrap(t, FRACTIONS, B, seed=11)
    assert got["cpr_lo"] == pytest.approx(np.percentile(cprs, 2.5), rel=1e-9)
    assert got["cpr_hi"] == pytest.approx(np.percentile(cprs, 97.5), rel=1e-9)
    assert got["cmd_lo"] == pytest.approx(np.percentile(cmds, 2.5), rel=1e-9)
    assert got["cmd_hi"] == pytest.approx(np.percentile(cmds, 97.5), rel=1e-9)
    assert got["cpr_lo"] < got["cpr"] < got["cpr_hi"] and got["n_pairs"] == n


def test_paired_contrast_matches_an_independent_paired_bootstrap():
    a = _hand_table()
    b = {k: (v * 0.5 if k in ("signed", "absolute") else v) for k, v in a.items()}  # a weaker method
    n, B = len(a["full"]), 300

    def areas(t, i):
        m_full, m_empty = np.mean(t["full"][i]), np.mean(t["empty"][i])
        f_s = [(np.mean(t["signed"][k][i]) - m_empty) / (m_full - m_empty) for k in range(3)]
        f_a = [(np.mean(t["absolute"][k][i]) - m_empty) / (m_full - m_empty) for k in range(3)]
        return np.trapezoid(f_s, FRACTIONS), np.trapezoid(np.abs(1 - np.array(f_a)), FRACTIONS)

    rng = np.random.default_rng(5)  # one resample of the pairs serves both methods
    d = []
    for _ in range(B):
        i = rng.integers(0, n, n)
        (ca, ma), (cb, mb) = areas(a, i), areas(b, i)
        d.append((ca - cb, ma - mb))
    d = np.array(d)
    got = lm_pairs.paired_contrast(a, b, FRACTIONS, B, seed=5)
    all_pairs = np.arange(n)
    assert got["d_cpr"] == pytest.approx(areas(a, all_pairs)[0] - areas(b, all_pairs)[0], rel=1e-12)
    assert got["d_cpr_lo"] == pytest.approx(np.percentile(d[:, 0], 2.5), rel=1e-9)
    assert got["d_cpr_hi"] == pytest.approx(np.percentile(d[:, 0], 97.5), rel=1e-9)
    assert got["d_cmd_lo"] == pytest.approx(np.percentile(d[:, 1], 2.5), rel=1e-9)
    assert got["d_cmd_hi"] == pytest.approx(np.percentile(d[:, 1], 97.5), rel=1e-9)
    rows = lm_pairs.contrast_rows({"gim": a, "eap": b}, "gim", FRACTIONS, 20, 0)
    assert [(r["method"], r["versus"]) for r in rows] == [("gim", "eap")]
    assert lm_pairs.contrast_rows({"eap": b}, "gim", FRACTIONS, 20, 0) == []
    short = {k: (v[..., :-1] if k in ("full", "empty", "signed", "absolute") else v) for k, v in a.items()}
    with pytest.raises(ValueError, match="same pairs"):
        lm_pairs.paired_contrast(a, short, FRACTIONS, 10)


# ---------------------------------------------------------------- smoke ----------
SMOKE = {
    "tasks": list(mib_synth.TASKS), "n_eval": 4, "n_gate": 4, "batch_size": 2, "gate_margin": -1.0,
    "methods": ["eap", "gim", "eactp"], "n_boot": 50, "boot_seed": 0, "fractions": [0.1, 0.5, 1.0],
    "ig_steps": 2, "weighting": "mib", "eactp_max_edges": 10,
    "fa": {"n_examples": 2, "ig_steps": 2, "methods": ["gim", "grad_x_input"]},
}  # fmt: skip


def test_gim_lm_smoke_on_a_tiny_llama(tmp_path):
    from selfrepair.core.models import save_model
    from selfrepair.gim.lm_run import run_lm
    from tiny_models import tiny_llama

    mib_synth.write(tmp_path / "data", mib_synth.TASKS, 8, 0)
    tok = _word_tokenizer(tmp_path / "lm", _all_texts(tmp_path / "data"), bos=False)
    save_model(tiny_llama(vocab_size=len(tok), max_position_embeddings=64), tmp_path / "lm")
    out = run_lm(tmp_path / "lm", "tiny", tmp_path / "data", SMOKE)
    assert out["tasks"]["solved"].all() and (out["tasks"]["n"] == 4).all()
    loc = out["localization"]
    assert sorted(set(zip(loc["task"], loc["method"]))) == sorted(
        (t, m) for t in mib_synth.TASKS for m in ("eap", "gim")
    )
    assert (loc["cpr_lo"] <= loc["cpr_hi"]).all() and (loc["n_pairs"] == 4).all()
    # MIB's conventions by default, named in each row: the tokenizer's <bos>, which its call
    # does not add (as SmolLM2's), first
    assert (loc["kv_inputs"] == "per_query_head").all() and (loc["bos"] == "mib").all() and loc["bos_first"].all()
    st = out["status"]
    assert st[st["method"] == "eactp"]["reason"].str.contains("eactp_max_edges 10").all()
    loc_st = st[st["part"] == "localization"]  # each task's rows in the methods' order, the not-run one too
    assert all(list(g["method"]) == ["eap", "gim", "eactp"] for _, g in loc_st.groupby("task"))
    assert set(out["feature_attribution"]["method"]) == {"gim", "grad_x_input"}
    assert len(out["curves"]) == 3 * 2 * 2 * 3  # tasks x methods x rankings x fractions
    c = out["contrasts"]  # GIM against EAP on each task, on the same pairs
    assert sorted(zip(c["task"], c["versus"])) == sorted((t, "eap") for t in mib_synth.TASKS)
    assert (c["d_cpr_lo"] <= c["d_cpr_hi"]).all() and (c["n_pairs"] == 4).all()


def test_curves_of_all_methods_in_one_run_are_each_methods_own_bit_for_bit(tmp_path):
    """pair_curves_many runs the corrupted batches, the whole model, the empty circuit and
    the circuits two methods share once; each method's numbers must be those of its own
    pair_curves run, with its own selection rule (EAP-IG's differs from top-n)."""
    from selfrepair.core.models import load_bridge, save_model
    from selfrepair.gim.attribute import method_scores
    from selfrepair.gim.graph import Graph, selection_rule
    from selfrepair.tasks import mib
    from tiny_models import tiny_llama

    mib_synth.write(tmp_path / "data", ["ioi"], 8, 0)
    tok = _word_tokenizer(tmp_path / "lm", _all_texts(tmp_path / "data"), bos=False)
    save_model(tiny_llama(vocab_size=len(tok), max_position_embeddings=64), tmp_path / "lm")
    bridge = load_bridge(tmp_path / "lm", ungroup=True)
    data = mib.load("ioi", tok, 6, [str(tmp_path / "data")], split="test", bos="mib")
    graph = Graph.from_bridge(bridge)
    fr = (0.05, 0.2, 1.0)
    methods = ["eap", "eap-ig", "gim"]
    scores = {m: method_scores(bridge, graph, data, m, 3, 2, "mib") for m in methods}
    sel = {m: selection_rule(m) for m in methods}
    many = lm_pairs.pair_curves_many(bridge, graph, data, scores, fr, 3, sel)
    for m in methods:
        one = lm_pairs.pair_curves(bridge, graph, data, scores[m], fr, 3, sel[m])
        for k in ("full", "empty", "signed", "absolute"):
            assert np.array_equal(many[m][k], one[k]), (m, k)
        assert many[m]["n_kept"] == one["n_kept"] and many[m]["n_edges"] == one["n_edges"]
    assert not np.array_equal(many["eap"]["signed"], many["gim"]["signed"])  # the methods differ


# ---------------------------------------------------------------- rule -----------
@pytest.mark.slow
def test_gim_lm_rules_plan_per_lm_and_none_without_lms(tmp_path):
    from test_workflow import configs, snakemake

    over = tmp_path / "lms.yaml"
    over.write_text("lms: {models: [smollm2-135m], scale: large}\ngim: {lms: {large: {n_eval: 40}}}\n")
    r = snakemake(
        "-n", "--directory", str(tmp_path), *configs(over), "-p", "--", "results/gim/lms/smollm2-135m/status.csv"
    )
    out = r.stdout + r.stderr
    assert "rule gim_lm:" in out and "rule gim_lm_data:" in out and "wildcards: lm=smollm2-135m" in out
    r = snakemake("-n", "--directory", str(tmp_path), *configs())  # test.yaml: lms: {models: []}
    assert "rule gim_lm" not in r.stdout + r.stderr
    over.write_text("lms: {models: [smollm2-135m]}\ngim: {lms: {n_eval: 30}}\n")
    r = snakemake("-n", "--directory", str(tmp_path), *configs(over), check=False)
    assert r.returncode != 0 and "gim.lms.batch_size (20) does not divide gim.lms.n_eval (30)" in r.stdout + r.stderr
