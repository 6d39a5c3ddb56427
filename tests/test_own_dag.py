"""The `own:` config section (workflow/rules/own.smk, selfrepair.own): the papers'
analyses on tiny random models of two architectures (a GPT-2 and a Llama, saved as a
user saves theirs) and dataset files of both formats (plain JSONL and CSV, MIB's rows).

One Snakemake run (module fixture ``dag``) runs docs/OWN_MODEL.md's example
(config/own.yaml) with more entries: the other formats, a missing model, pairs longer
than the context, G vs C. Its tables must equal, bit for bit, what the library's own
functions give for the same model and data, in this process (CSV floats are written as
the shortest round-trip repr: equal frames read back with ``float_precision=
"round_trip"`` mean equal bits)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from selfrepair.core import numerics
from selfrepair.own import entries

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "fast"))  # conftest's
# words t2..t9 of the word tokenizer (t0 is its unknown and padding token, t1 its BOS)
GOOD = [(2, 3, 4), (5, 6, 7), (8, 9, 2), (3, 5, 8), (4, 7, 9), (6, 2, 5)]
SETTINGS = {  # every setting of the runs that the values depend on, given explicitly
    "gim": {"ig_steps": 2, "ifr_tie_orders": 2, "fractions": [0.1, 0.5, 1.0], "circuit_fraction": 0.2},
    "groundtruth": {"n_primary": 3, "ig_steps": 2, "exact_max_players": 12, "max_permutations": 64, "min_pairs": 32},
    "coax": {"top_r": 192, "max_rows": 2048},
}


def words(*ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def write_data(d: Path) -> None:
    """pairs.jsonl / pairs.csv (plain), mib_ioi.jsonl (MIB's IOI rows), long.jsonl; each
    with malformed rows after the good ones."""
    d.mkdir(parents=True, exist_ok=True)
    plain = [
        {"clean": words(a, b, c, a), "corrupt": words(b, b, c, a), "answer": f"t{b}", "foil": f"t{c}"}
        for a, b, c in GOOD
    ]
    lines = [json.dumps(r) for r in plain]
    lines += ['{"clean": "t2 t3", "corrupt"', json.dumps({"clean": "t2", "corrupt": "t3", "answer": "t4"})]
    lines += [json.dumps({"clean": "t2 t3", "corrupt": "t4", "answer": "t5", "foil": "t6"})]  # lengths differ
    (d / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    pd.DataFrame(plain + [{"clean": "t2 t3", "corrupt": "t4 t5", "answer": "t6", "foil": None}]).to_csv(
        d / "pairs.csv", index=False
    )
    mib = [
        {"prompt": words(a, b, c, a), "s2_io_flip_counterfactual": words(a, c, c, a),
         "metadata": {"indirect_object": f"t{b}", "subject": f"t{a}"}}
        for a, b, c in GOOD
    ] + [{"prompt": "t2 t3", "s2_io_flip_counterfactual": "t3 t2"}]  # fmt: skip
    (d / "mib_ioi.jsonl").write_text("\n".join(json.dumps(r) for r in mib) + "\n")
    long = {"clean": words(*[2, 3] * 10), "corrupt": words(*[3, 2] * 10), "answer": "t4", "foil": "t5"}
    (d / "long.jsonl").write_text(json.dumps(long) + "\n")


def write_models(d: Path) -> None:
    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, save_model
    from selfrepair.tasks import sequences as S
    from selfrepair.tasks.counterfactual import save_word_tokenizer
    from tiny_models import save_toy_gpt2, tiny_llama

    save_toy_gpt2(d / "my-gpt2", vocab_size=20, n_ctx=16)
    tiny_llama(vocab_size=20, n_kv_heads=4).save_pretrained(d / "my-llama")  # as a user saves theirs
    save_word_tokenizer(d / "my-llama", [f"t{i}" for i in range(20)])
    save_model(
        build_gpt2_toy(gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)), d / "sort"
    )


EXTRA = [
    {"name": "gpt2-csv", "model": "models/my-gpt2", "task": "data/pairs.csv", "analyses": ["coax"], "n_eval": 4},
    {"name": "gpt2-mib", "model": "models/my-gpt2", "task": "data/mib_ioi.jsonl", "analyses": ["shapley"]},
    {"name": "llama-jsonl", "model": "models/my-llama", "task": "data/pairs.jsonl", "analyses": ["coax"], "n_eval": 4},
    {"name": "llama-csv", "model": "models/my-llama", "task": "data/pairs.csv", "analyses": ["shapley"]},
    {"name": "missing", "model": "models/no-such-model", "task": "data/pairs.jsonl", "analyses": ["edges"]},
    {"name": "too-long", "model": "models/my-gpt2", "task": "data/long.jsonl", "analyses": ["coax"]},
    {"name": "sort", "model": "models/sort", "task": "sort", "analyses": ["g_vs_c"], "n_eval": 8, "length": 3},
]


def snakemake(wd: Path, *args, dry=False):
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "Snakefile"),
        *(["-n"] if dry else []),
        "--directory",
        str(wd),
        *args,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def run_args(wd: Path) -> list[str]:
    cfg = ["--configfile", "config/config.yaml", str(wd / "run.yaml"), "--config", f"numerics={NUMERICS}"]
    return ["--cores", "2", "results/own/status.csv", *cfg]


@pytest.fixture(scope="module")
def dag(tmp_path_factory):
    """The working directory after one run of config/own.yaml's entries and EXTRA."""
    wd = tmp_path_factory.mktemp("own_dag")
    shutil.copytree(ROOT / "config", wd / "config")
    write_models(wd / "models")
    write_data(wd / "data")
    doc = yaml.safe_load((ROOT / "config" / "own.yaml").read_text())["own"]
    (wd / "run.yaml").write_text(yaml.safe_dump({"own": doc + EXTRA, **SETTINGS}))
    r = snakemake(wd, *run_args(wd))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return wd


def read(path) -> pd.DataFrame:
    return pd.read_csv(path, float_precision="round_trip", keep_default_na=False, na_values=[""])


def same(got: pd.DataFrame, want: pd.DataFrame, tmp: Path) -> None:
    """Equal bits: ``want`` through the same CSV round trip as the job's table."""
    want.to_csv(tmp / "want.csv", index=False)
    pd.testing.assert_frame_equal(got, read(tmp / "want.csv"), check_exact=True)


def pairs(wd: Path, model: str, task: str, n: int = 8, bos: str = "tokenizer"):
    from transformers import PreTrainedTokenizerFast

    from selfrepair.own.data import load_pairs

    return load_pairs(wd / task, PreTrainedTokenizerFast.from_pretrained(str(wd / "models" / model)), n, bos=bos)[0]


# ---------------------------------------------------------------- quick ----------
def test_load_pairs_reads_both_formats_and_names_each_bad_row(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from selfrepair.own.data import load_pairs
    from selfrepair.tasks.counterfactual import save_word_tokenizer

    write_data(tmp_path)
    save_word_tokenizer(tmp_path / "tok", [f"t{i}" for i in range(20)])
    tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    clean = torch.tensor([[a, b, c, a] for a, b, c in GOOD])  # word tN is id N
    for name, corrupt, answer, foil, bad in (
        ("pairs.jsonl", [[b, b, c, a] for a, b, c in GOOD], [g[1] for g in GOOD], [g[2] for g in GOOD],
         ["row 6: not valid JSON", "row 7: field 'foil' is missing", "row 8: clean and corrupt prompts are 2 and 1"]),
        ("pairs.csv", [[b, b, c, a] for a, b, c in GOOD], [g[1] for g in GOOD], [g[2] for g in GOOD],
         ["row 6: field 'foil' is empty"]),
        ("mib_ioi.jsonl", [[a, c, c, a] for a, b, c in GOOD], [g[1] for g in GOOD], [g[0] for g in GOOD],
         ["row 6: field 'metadata' is missing"]),
    ):  # fmt: skip
        data, dropped, usable, notes = load_pairs(tmp_path / name, tok, 100)
        assert torch.equal(data.clean, clean) and torch.equal(data.corrupt, torch.tensor(corrupt)), name
        assert data.answer.tolist() == answer and data.foil.tolist() == foil and data.pos.tolist() == [3] * 6
        assert usable == 6 and len(dropped) == len(bad) and notes == [], dropped
        for d, b in zip(dropped, bad):
            assert d.startswith(f"{tmp_path / name}: {b}"), (d, b)
        assert len(load_pairs(tmp_path / name, tok, 2)[0]) == 2  # the first n usable pairs


def test_config_problems_name_the_entry_and_key():
    e = {"task": "ioi", "analyses": ["edges"]}
    assert entries.problems([{**e, "name": "a"}]) == []
    bad = entries.problems([{**e, "name": "a", "analyses": ["g_vs_c"]}, {**e, "name": "b", "task": "sort"}])
    assert bad[0].startswith("own.0 (a).analyses: g_vs_c is paper A's G against C on a sequence task")
    assert bad[1].startswith("own.1 (b).analyses: edges needs counterfactual pairs")
    assert entries.problems([{**e, "name": "c", "task": "pairs.txt"}])[0].startswith(
        "own.0 (c).task: 'pairs.txt' is neither a built-in task"
    )


def test_coax_keeps_the_pairs_of_the_most_common_length():
    from selfrepair.own.analyses import one_length
    from selfrepair.tasks.counterfactual import CounterfactualBatch

    clean = torch.tensor([[2, 3, 0], [4, 5, 6], [7, 8, 0], [9, 2, 3]])  # lengths 2, 3, 2, 3: a tie, the longest wins
    data = CounterfactualBatch(clean, clean + 1, torch.arange(4), torch.arange(4) + 4, torch.tensor([1, 2, 1, 2]))
    got, n = one_length(data)
    assert n == 3 and got.clean.tolist() == [[4, 5, 6], [9, 2, 3]] and got.foil.tolist() == [5, 7]
    data.pos[3] = 1  # lengths 2, 3, 2, 2
    got, n = one_length(data)
    assert n == 2 and got.clean.tolist() == [[2, 3], [7, 8], [9, 2]] and got.pos.tolist() == [1, 1, 1]


def test_a_missing_model_gives_a_not_run_row_and_empty_tables(tmp_path):
    from selfrepair.own.run import run_analysis

    out = {t: tmp_path / f"{t}.csv" for t in (*entries.TABLES["edges"], "status")} | {"circuits": tmp_path / "c"}
    s = {"name": "x", "model": str(tmp_path / "nowhere"), "task": "ioi", "search_paths": []}
    row = run_analysis("edges", s, out).iloc[0]
    assert row["status"] == "not run" and row["reason"].startswith(f"weights not found for '{tmp_path / 'nowhere'}'")
    assert row["dataset_sha256"] == "built-in:ioi" and (tmp_path / "c").is_dir()
    assert all(out[t].exists() for t in entries.TABLES["edges"])


def test_the_docs_example_is_config_own_yaml():
    text = (ROOT / "docs" / "OWN_MODEL.md").read_text()
    block = re.search(r"```yaml\n(own:\n.*?)```", text, re.S)
    assert block and yaml.safe_load(block.group(1)) == yaml.safe_load((ROOT / "config" / "own.yaml").read_text())


# ---------------------------------------------------------------- slow: one run ----
@pytest.mark.slow
def test_status_has_one_row_per_analysis_with_identity_hash_and_reasons(dag):
    from selfrepair.core.models import model_identity

    st = read(dag / "results/own/status.csv").fillna("")
    doc = yaml.safe_load((ROOT / "config" / "own.yaml").read_text())["own"]
    assert [(r["name"], r["analysis"]) for _, r in st.iterrows()] == [
        (e["name"], a) for e in doc + EXTRA for a in e["analyses"]
    ]
    ran = st[st["status"] == "ran"]
    assert set(st[st["status"] != "ran"]["name"]) == {"missing", "too-long"}
    for _, r in ran.iterrows():
        assert r["identity"] == model_identity(dag / r["model"]), r["name"]
        want = "built-in:sort" if r["task"] == "sort" else entries.dataset_sha256(str(dag / r["task"]))
        assert r["dataset_sha256"] == want, r["name"]
    mine = st[st["name"] == "my-gpt2"].iloc[0]
    assert mine["reason"].startswith(
        "6 pairs used of 6 usable; 3 rows dropped: data/pairs.jsonl: row 6: not valid JSON"
    )
    missing = st[st["name"] == "missing"].iloc[0]["reason"]
    assert missing.startswith("weights not found for 'models/no-such-model'")
    long = st[st["name"] == "too-long"].iloc[0]["reason"]
    assert (
        long
        == "the pairs of data/long.jsonl are 20 tokens long, longer than models/my-gpt2's context of 16 tokens (n_ctx)"
    )
    for e in doc + EXTRA:  # every analysis has its benchmark and log; edges its figure, ran or not
        assert (dag / f"results/own/{e['name']}/figures/faithfulness.png").exists() == ("edges" in e["analyses"])
        for a in e["analyses"]:
            assert (dag / f"benchmarks/own/{e['name']}/{a}.tsv").exists() and (
                dag / f"logs/own/{e['name']}/{a}.log"
            ).exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, model, task", [("my-gpt2", "my-gpt2", "data/pairs.jsonl"), ("my-llama", "my-llama", "data/mib_ioi.jsonl")]
)
def test_edges_equal_the_api_bit_for_bit(dag, tmp_path, name, model, task):
    from selfrepair.core.models import load_bridge
    from selfrepair.gim import edge_table, localize, write_circuit

    entry = next(e for e in yaml.safe_load((ROOT / "config" / "own.yaml").read_text())["own"] if e["name"] == name)
    # edges: MIB's conventions (gim.kv_inputs per_query_head, gim.bos mib), the defaults
    bridge, data = load_bridge(dag / "models" / model, ungroup=True), pairs(dag, model, task, bos="mib")
    d = dag / f"results/own/{name}/edges"
    summaries, curves, edges = [], [], []
    for m in entry["methods"]:
        graph, scores, curve, summary = localize(bridge, data, m, (0.1, 0.5, 1.0), 32, 2, "example", 2)
        write_circuit(tmp_path / f"{m}.json", graph, scores, m, 0.2)
        assert (tmp_path / f"{m}.json").read_text() == (d / "circuits" / f"{m}.json").read_text(), m
        summaries.append({**summary, "kv_inputs": "per_query_head", "bos": "mib"})
        curves.append(curve)
        edges.append(edge_table(graph, scores).assign(method=m))
    same(read(d / "localization.csv"), pd.DataFrame(summaries), tmp_path)
    same(read(d / "curves.csv"), pd.concat(curves, ignore_index=True), tmp_path)
    same(read(d / "edges.csv"), pd.concat(edges, ignore_index=True), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, model, task", [("my-gpt2", "my-gpt2", "data/pairs.jsonl"), ("my-llama", "my-llama", "data/mib_ioi.jsonl")]
)
def test_shapley_and_coax_equal_the_api_bit_for_bit(dag, tmp_path, name, model, task):
    from selfrepair.coax import coax_scores
    from selfrepair.core import components as C
    from selfrepair.core import interventions
    from selfrepair.core.models import load_bridge, load_hf
    from selfrepair.gim import logit_diff
    from selfrepair.groundtruth import GameSpec, Settings, counterfactual_reduce, model_tables

    bridge, data = load_bridge(dag / "models" / model), pairs(dag, model, task)
    comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [data.clean], comps)
    metric = lambda lg: logit_diff(lg, data).mean()  # noqa: E731
    spec = GameSpec("logit_diff", metric, engine=counterfactual_reduce(data))
    settings = Settings(mode="mean", n_primary=3, ig_steps=2, exact_max_players=12, max_permutations=64)
    hf = load_hf(dag / "models" / model) if model == "my-gpt2" else None  # a GPT-2's games run on the engine
    want = model_tables(bridge, data.clean, [spec], comps, means, settings, hf_model=hf)
    d = dag / f"results/own/{name}"
    for t in ("shapley", "interactions", "scores"):
        same(read(d / f"shapley/{t}.csv"), want[t], tmp_path)
    got = read(d / "coax/scores.csv")
    seed = got["seed_set"].iloc[0].split()
    if name == "my-gpt2":  # no seed set given: the heads of largest single drop (the Shapley table's)
        single = want["shapley"].set_index("component")["single"]
        heads = single[[c for c in single.index if "H" in c]]
        assert seed == list(heads.sort_values(ascending=False, kind="stable").index[:3])
    else:
        assert seed == ["L1H0"]
    table = coax_scores(bridge, data.clean, seed, metric, protocol="v2", top_r=192, ig_steps=2, max_rows=2048)
    same(got, table.assign(seed_set=" ".join(seed)), tmp_path)


@pytest.mark.slow
def test_g_vs_c_equals_paper_a_api(dag, tmp_path):
    from selfrepair.core.models import load_hf
    from selfrepair.heroes import causal_importance, gradient_importance
    from selfrepair.tasks import sequences as S

    model = load_hf(dag / "models/sort")
    batches = S.fixed_length_batches("sort", 3, 4, 16, 0)
    got = read(dag / "results/own/sort/g_vs_c/g_vs_c.csv")
    want = gradient_importance(model, batches).merge(
        causal_importance(model, S.eval_set("sort", 3, 8, 1), mean_batches=batches)
    )
    same(got[list(want.columns)], want, tmp_path)
    assert set(got["role"].dropna()) <= {"hero", "bloat", "aligned"} and got["role"].notna().sum() == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry, messages",
    [
        ({"analyses": ["edges", "nonsense"]}, ["own.0.analyses.1: 'nonsense' is not one of"]),
        # two problems the schema cannot see, both named in one message
        (
            {"analyses": ["g_vs_c"], "task": "pairs.txt"},
            [
                "own.0 (x).analyses: g_vs_c is paper A's G against C on a sequence task",
                "own.0 (x).task: 'pairs.txt' is neither a built-in task",
            ],
        ),
        # before: Snakemake's ChildIOException (results/own/status.csv/edges/...), no key named
        (
            {"name": "status.csv"},
            ["own.0 (status.csv).name: 'status.csv' is the name of the section's own file results/own/status.csv"],
        ),
        ({"name": "x"}, ["own: name 'x' appears 2 times (each entry needs its own name)"]),
    ],
)
def test_bad_entries_stop_the_parse_naming_the_key(tmp_path, entry, messages):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    e = {"name": "x", "model": "gpt2", "task": "ioi", "analyses": ["edges"], **entry}
    others = [{**e, "name": "x"}] if entry.get("name") == "x" else []  # a second entry of the same name
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"own": [e, *others]}))
    r = snakemake(tmp_path, "--configfile", "config/config.yaml", str(tmp_path / "bad.yaml"), dry=True)
    assert r.returncode != 0, r.stdout[-2000:]
    for m in messages:
        assert m in r.stdout + r.stderr, (m, (r.stdout + r.stderr)[-2000:])


@pytest.mark.slow
def test_an_empty_own_section_adds_no_job(tmp_path):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    r = snakemake(tmp_path, "--configfile", "config/config.yaml", "config/test.yaml", dry=True)
    assert r.returncode == 0 and not re.search(r"\bown_(edges|shapley|coax|g_vs_c|status)\b", r.stdout), r.stdout[
        -2000:
    ]


@pytest.mark.slow
def test_the_status_table_asked_for_with_an_empty_own_section_says_what_to_give(tmp_path):
    """Before: the job failed with "ValueError: No objects to concatenate"."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    r = snakemake(tmp_path, "results/own/status.csv", "--configfile", "config/config.yaml", dry=True)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert entries.EMPTY in out and "--configfile config/config.yaml config/own.yaml" in entries.EMPTY, out[-2000:]


@pytest.mark.slow
def test_the_report_shows_every_analysis(dag):
    r = snakemake(dag, *run_args(dag), "--report", "results/report.html")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    html = (dag / "results/report.html").read_text()
    assert "Own models" in html and "System Message" not in html
    for name in ("my-gpt2", "my-llama", "missing"):  # the figure of each entry with edges, ran or not
        assert f"results/own/{name}/figures/faithfulness.png" in html, name
