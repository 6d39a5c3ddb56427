"""Silent cases made loud: each stops with an error that names the file or key.

1. MIB circuit files: ``in_graph`` must be a JSON boolean (``"false"`` is not), ``nodes``
   must name nodes of the graph.
2. A model folder whose weights changed after ``save_model`` wrote them (Snakemake does
   not see a file inside a ``directory()`` output change).
3. Weights files get the permissions of every other output (0o666 less the umask).
4. The default profile (``profiles/default``) loads by itself: a failed job's log is on
   the console.
5. A missing published-claims file (config key ``published``) stops the run at parse time.
"""

import hashlib
import json
import re
import stat

import pytest
import yaml

import golden_suite as G
from selfrepair.core import models
from selfrepair.gim.graph import CircuitFileError, from_mib_json, save_mib_json
from selfrepair.tasks import sequences as S

# ---------------------------------------------------------------- 1. MIB circuit files

# One layer, one head: every edge of the graph, written out by hand in MIB's format.
EDGES = [
    "input->a0.h0<q>",
    "input->a0.h0<k>",
    "input->a0.h0<v>",
    "input->m0",
    "a0.h0->m0",
    "input->logits",
    "a0.h0->logits",
    "m0->logits",
]
IN_CIRCUIT = {"input->a0.h0<v>", "a0.h0->logits"}


def hand_built() -> dict:
    return {
        "cfg": {"n_layers": 1, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 8},
        "nodes": {
            "input": {"in_graph": True},
            "a0.h0": {"in_graph": True, "score": 0.5},
            "m0": {"in_graph": False},
            "logits": {"in_graph": True},
        },
        "edges": {e: {"score": float(k) - 3.5, "in_graph": e in IN_CIRCUIT} for k, e in enumerate(EDGES)},
    }


def write(tmp_path, d) -> str:
    f = tmp_path / "circuit.json"
    f.write_text(json.dumps(d))
    return str(f)


def test_hand_built_mib_file_is_read(tmp_path):
    g, scores, in_graph = from_mib_json(write(tmp_path, hand_built()))
    assert g.n_edges == len(EDGES) and sorted(g.edge_names()) == sorted(EDGES)
    idx = g.edge_index()
    assert {e for e in EDGES if bool(in_graph[idx[e]])} == IN_CIRCUIT
    assert float(scores[idx["m0->logits"]]) == 7 - 3.5


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None], ids=["str-false", "str-true", "0", "1", "null"])
def test_edge_in_graph_must_be_a_json_boolean(tmp_path, value):
    d = hand_built()
    d["edges"]["input->m0"]["in_graph"] = value
    f = write(tmp_path, d)
    msg = f"{f}: edges['input->m0'].in_graph is {value!r}, not a JSON boolean"
    with pytest.raises(CircuitFileError, match=re.escape(msg)):
        from_mib_json(f)


def test_edge_without_in_graph_is_out_of_the_circuit(tmp_path):
    d = hand_built()
    del d["edges"]["a0.h0->logits"]["in_graph"]
    g, _, in_graph = from_mib_json(write(tmp_path, d))
    assert not bool(in_graph[g.edge_index()["a0.h0->logits"]]) and int(in_graph.sum()) == 1


def test_unknown_node_is_named(tmp_path):
    d = hand_built()
    d["nodes"]["a0.h1"] = {"in_graph": False}  # the graph has one head per layer
    f = write(tmp_path, d)
    with pytest.raises(CircuitFileError, match=re.escape(f"{f}: node 'a0.h1' is not in the graph")):
        from_mib_json(f)


@pytest.mark.parametrize(
    "node, message",
    [
        ({"in_graph": "false"}, "nodes['m0'].in_graph is 'false', not a JSON boolean"),
        ({"score": 1.0}, "nodes['m0'] lacks 'in_graph'"),
        (False, "node 'm0' is not an object: False"),
        ({"in_graph": True, "neurons": [True, False]}, "nodes['m0'].neurons selects neurons"),
    ],
    ids=["string", "missing", "bare-bool", "neurons"],
)
def test_bad_node_is_named(tmp_path, node, message):
    d = hand_built()
    d["nodes"]["m0"] = node
    f = write(tmp_path, d)
    with pytest.raises(CircuitFileError, match=re.escape(f"{f}: {message}")):
        from_mib_json(f)


def test_node_keys_mib_writes_are_accepted(tmp_path):
    d = hand_built()
    d["nodes"]["m0"] = {"in_graph": False, "score": 0.1, "neurons": [True] * 8, "neurons_scores": [0.0] * 8}
    del d["nodes"]["a0.h0"]  # MIB's reader leaves an absent node out of the circuit
    from_mib_json(write(tmp_path, d))


def test_missing_nodes_key_is_named(tmp_path):
    d = hand_built()
    del d["nodes"]
    f = write(tmp_path, d)
    with pytest.raises(CircuitFileError, match=re.escape(f"{f}: key 'nodes' is missing")):
        from_mib_json(f)


def test_written_file_passes_the_checks(tmp_path):
    """What save_mib_json writes (every node, booleans) reads back under the new checks."""
    g, scores, in_graph = from_mib_json(write(tmp_path, hand_built()))
    save_mib_json(tmp_path / "again.json", g, scores, in_graph)
    g2, s2, ig2 = from_mib_json(tmp_path / "again.json")
    assert g2.n_edges == g.n_edges and bool((s2 == scores).all()) and bool((ig2 == in_graph).all())


# ---------------------------------------------------------------- 2. and 3. model folders


@pytest.fixture
def saved(tmp_path):
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    folder = tmp_path / "model"
    models.save_model(models.build_gpt2_toy(cfg, seed=0), folder, {"task": "sort"})
    return folder


def flip_one_byte(folder):
    """Flip the lowest bit of the last tensor's last float's lowest byte: still a valid,
    finite checkpoint, other bits."""
    w = folder / "model.safetensors"
    b = bytearray(w.read_bytes())
    b[-4] ^= 1
    w.write_bytes(bytes(b))
    return hashlib.sha256(bytes(b)).hexdigest()


def test_save_model_records_the_hash_of_every_file_it_wrote(saved):
    meta = models.read_meta(saved)
    assert meta["task"] == "sort"
    names = ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in saved.iterdir()) == sorted(names + ["selfrepair.json"])
    assert meta["files_sha256"] == {n: hashlib.sha256((saved / n).read_bytes()).hexdigest() for n in names}
    models.load_hf(saved)  # the record matches: loads


def test_save_model_without_meta_records_the_hashes_too(tmp_path):
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=1, d_model=8, d_mlp=16, n_ctx=8)
    models.save_model(models.build_gpt2_toy(cfg), tmp_path / "m")
    assert set(models.read_meta(tmp_path / "m")) == {"files_sha256"}


def test_edited_weights_are_refused_naming_the_folder(saved):
    recorded = models.read_meta(saved)["files_sha256"]["model.safetensors"]
    now = flip_one_byte(saved)
    msg = f"model folder {saved} changed since it was saved: model.safetensors sha256 {recorded} recorded"
    for load in (models.load_hf, models.load_bridge):
        with pytest.raises(models.WeightsChanged, match=re.escape(msg)) as err:
            load(saved)
        assert f"{now} now" in str(err.value) and "--forcerun" in str(err.value)
    # not a CorruptCheckpoint: the loops that mark an unreadable real model "not run"
    # (gim.localization.run_mib, coax.real_models) must not swallow it
    assert not isinstance(err.value, models.CorruptCheckpoint)


@pytest.mark.parametrize("record", ["key-removed", "no-selfrepair-json"])
def test_folder_without_a_recorded_hash_loads_as_before(saved, record):
    meta_file = saved / "selfrepair.json"
    if record == "key-removed":
        meta = json.loads(meta_file.read_text())
        del meta["files_sha256"]
        meta_file.write_text(json.dumps(meta))
    else:
        meta_file.unlink()
    flip_one_byte(saved)  # unnoticed without a record, as before
    models.load_hf(saved)


@pytest.mark.parametrize(
    "edit, what",
    [
        # issue 33: n_head 2 -> 1 and gelu -> relu loaded silently and changed every CPR
        (lambda c: {**c, "n_head": 1}, "config.json sha256"),
        (lambda c: {**c, "activation_function": "relu"}, "config.json sha256"),
    ],
)
def test_edited_config_is_refused_naming_the_file(saved, edit, what):
    f = saved / "config.json"
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))
    for load in (models.load_hf, models.load_bridge):
        with pytest.raises(
            models.WeightsChanged, match=re.escape(f"model folder {saved} changed since it was saved: {what}")
        ) as err:
            load(saved)
        assert "--forcerun" in str(err.value)


def test_removed_or_added_model_file_is_refused(saved):
    (saved / "generation_config.json").unlink()
    with pytest.raises(models.WeightsChanged, match=re.escape("generation_config.json sha256 ")) as err:
        models.load_hf(saved)
    assert "(file missing) now" in str(err.value)


def test_a_weights_file_that_appeared_after_the_save_is_refused(saved):
    import shutil

    shutil.copy(saved / "model.safetensors", saved / "model-00002-of-00002.safetensors")
    msg = "model-00002-of-00002.safetensors appeared (not among the files recorded"
    with pytest.raises(models.WeightsChanged, match=re.escape(msg)):
        models.load_hf(saved)


def test_edited_tokenizer_of_a_trained_toy_is_refused(tmp_path):
    """Paper C's toys save their word-level tokenizer with the model: it is in the record,
    and an edited vocabulary stops the load."""
    from selfrepair.tasks.counterfactual import save_word_tokenizer

    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=1, d_model=8, d_mlp=16, n_ctx=8)
    folder = tmp_path / "m"
    vocab = [f"w{i}" for i in range(S.VOCAB)]
    models.save_model(models.build_gpt2_toy(cfg), folder, {}, tokenizer=lambda f: save_word_tokenizer(f, vocab))
    assert "tokenizer.json" in models.read_meta(folder)["files_sha256"]
    models.load_bridge(folder)
    t = folder / "tokenizer.json"
    t.write_text(t.read_text().replace('"w3"', '"w3x"'))
    with pytest.raises(models.WeightsChanged, match=re.escape("tokenizer.json sha256 ")):
        models.load_bridge(folder)


def test_older_weights_only_record_still_checks_the_weights(saved):
    """A folder saved before every file was recorded (the committed golden checkpoints)
    keeps its weights check; its config is not covered."""
    f = saved / "selfrepair.json"
    meta = json.loads(f.read_text())
    meta["weights_sha256"] = {"model.safetensors": meta.pop("files_sha256")["model.safetensors"]}
    f.write_text(json.dumps(meta))
    models.load_hf(saved)
    flip_one_byte(saved)
    with pytest.raises(models.WeightsChanged, match="model.safetensors sha256"):
        models.load_hf(saved)


def test_unreadable_selfrepair_json_is_named(saved):
    (saved / "selfrepair.json").write_text("{")
    with pytest.raises(models.CorruptCheckpoint, match=re.escape(f"{saved / 'selfrepair.json'} is not valid JSON")):
        models.load_hf(saved)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def test_model_files_respect_the_umask(tmp_path, mask, mode):
    import os

    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=1, d_model=8, d_mlp=16, n_ctx=8)
    old = os.umask(mask)
    try:
        models.save_model(models.build_gpt2_toy(cfg), tmp_path / "m", {"seed": 0})
    finally:
        os.umask(old)
    files = sorted((tmp_path / "m").iterdir())
    assert "model.safetensors" in [f.name for f in files]
    assert not [f.name for f in files if f.name.endswith(".tmp")]  # no temporary left
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == mode, f.name


# ---------------------------------------------------------------- 4. the default profile


def test_default_profile_is_where_snakemake_looks():
    """Snakemake 9 loads profiles/default/ beside the Snakefile by itself."""
    prof = yaml.safe_load((G.ROOT / "profiles" / "default" / "profile.yaml").read_text())
    assert prof == {"show-failed-logs": True, "rerun-incomplete": True, "keep-going": True, "printshellcmds": True}
    assert not (G.ROOT / "workflow" / "profiles" / "default").exists()


@pytest.mark.slow
def test_failed_job_shows_its_log_without_a_profile_argument(tmp_path):
    """A real failing job (a truncated checkpoint), no --profile: its log's error is on the console."""
    d = G.prepare(tmp_path)
    G.seed_checkpoints(d, ("heroes",))
    w = d / "results/heroes/reverse/seed42/model/model.safetensors"
    w.write_bytes(w.read_bytes()[:200])
    target = "results/heroes/reverse/seed42/ood.json"
    # run from the working directory, not the repository: the profile is found beside the Snakefile
    r = G.snakemake("--cores", "1", *G.tiny_args(d), "--", target, check=False, cwd=d)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "Using workflow specific profile" in out and str(G.ROOT / "profiles" / "default") in out
    assert "Logfile logs/heroes/reverse/seed42/ood.log:" in out
    assert "CorruptCheckpoint: cannot load the checkpoint in results/heroes/reverse/seed42/model" in out


# ---------------------------------------------------------------- 5. published claims


@pytest.mark.slow
def test_missing_published_claims_fail_at_parse_time(tmp_path):
    d = G.prepare(tmp_path)
    r = G.snakemake("-n", *G.tiny_args(d), "published=config/nowhere.yaml", check=False)
    assert r.returncode != 0
    err = r.stdout + r.stderr
    assert "config key published: the published-claims file config/nowhere.yaml does not exist" in err
    assert str(d / "config" / "nowhere.yaml") in err and str(G.ROOT / "config" / "nowhere.yaml") in err
    assert "Nothing to be done" not in err


@pytest.mark.slow
def test_published_claims_in_the_working_directory_are_used(tmp_path):
    d = G.prepare(tmp_path)
    (d / "config" / "published.yaml").rename(d / "claims.yaml")
    r = G.snakemake("-n", *G.tiny_args(d), "published=claims.yaml")
    assert "heroes_published" in r.stdout


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    """A Llama config.json over GPT-2 weights: no checkpoint tensor fits, and transformers
    would run a random Llama; refused, naming the folder and the first missing weights."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

    folder = tmp_path / "m"
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(folder)
    models.load_hf(folder)  # as saved: loads
    llama = LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    (folder / "config.json").write_text(json.dumps(llama.to_dict()))
    with pytest.raises(models.CorruptCheckpoint) as err:
        models.load_hf(folder)
    msg = str(err.value)
    assert msg.startswith(f"the weights in {folder} do not fit the architecture its config.json names: ")
    assert "weights of LlamaForCausalLM are not in the checkpoint (first: lm_head.weight, " in msg
    assert "checkpoint tensors are not LlamaForCausalLM's (first: transformer.h.0." in msg
