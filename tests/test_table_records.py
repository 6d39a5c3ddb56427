"""Issue 50, item 3: a table that feeds a published verdict or a figure is what its rule
wrote. Each job records what it wrote (rule, wildcards, parameters' and content's
SHA-256, under .selfrepair/records/); the published-claims and figure rules check their
inputs against the records and stop, naming the file and the fix, on a table edited by
hand (the issue: an edited rho.csv became "reproduced, 2 kept seeds of 2")."""

import json
import os
import re
import sys
from types import SimpleNamespace

import pytest

from job_stub import Named
from selfrepair.core import runtime


def _smk(rule, inputs=(), outputs=()):
    return SimpleNamespace(
        rule=rule,
        wildcards=Named(),
        params=Named(threshold=6),
        input=Named(**{f"i{k}": v for k, v in enumerate(inputs)}),
        output=Named(**{f"o{k}": v for k, v in enumerate(outputs)}),
    )


@pytest.fixture
def written(tmp_path, monkeypatch):
    """results/heroes/tables/rho.csv and a folder output, written and recorded by their rules."""
    monkeypatch.chdir(tmp_path)
    t = tmp_path / "results/heroes/tables"
    t.mkdir(parents=True)
    (t / "rho.csv").write_text("task,n_kept,rho\nreverse,0,\n")
    (t / "real").mkdir()
    (t / "real/a.csv").write_text("x\n1\n")
    runtime.write_records(runtime.job_record(_smk("heroes_tables", outputs=["results/heroes/tables/rho.csv"])))
    runtime.write_records(runtime.job_record(_smk("coax_real", outputs=["results/heroes/tables/real"])))
    return _smk(
        "heroes_published",
        inputs=["config/published.yaml", "results/heroes/tables/rho.csv", "results/heroes/tables/real"],
    )


def test_the_record_names_the_rule_and_the_content(written, tmp_path):
    rec = json.loads((tmp_path / ".selfrepair/records/results/heroes/tables/rho.csv.json").read_text())
    assert rec["rule"] == "heroes_tables" and rec["file"] == "results/heroes/tables/rho.csv"
    assert rec["sha256"] == runtime.sha256_file(tmp_path / "results/heroes/tables/rho.csv")
    assert re.fullmatch("[0-9a-f]{64}", rec["params_sha256"])


def test_unchanged_inputs_pass_and_are_listed(written):
    lines = runtime.check_inputs(written)
    assert [line.split(":")[0] for line in lines] == [
        "checked results/heroes/tables/rho.csv",
        "checked results/heroes/tables/real",
    ]  # config/published.yaml is the user's: not a rule's output
    assert "as rule heroes_tables wrote it" in lines[0]


def test_a_hand_edited_table_stops_the_verdict_naming_file_and_fix(written, tmp_path):
    f = tmp_path / "results/heroes/tables/rho.csv"
    f.write_text("task,n_kept,rho\nreverse,2,0.72\n")  # the edit
    with pytest.raises(runtime.TableChanged) as err:
        runtime.check_inputs(written)
    msg = str(err.value)
    assert msg.startswith("results/heroes/tables/rho.csv changed since rule heroes_tables wrote it (sha256 ")
    assert "Undo the edit, or rerun its rule: snakemake --forcerun heroes_tables" in msg


def test_snakemakes_timestamp_in_a_folder_output_is_not_content(written, tmp_path):
    """Snakemake writes .snakemake_timestamp into a directory() output after its job ended
    (after the record): the folder is still what its rule wrote."""
    (tmp_path / "results/heroes/tables/real/.snakemake_timestamp").write_text("")
    runtime.check_inputs(written)


def test_a_file_edited_in_a_folder_input_stops_too(written, tmp_path):
    (tmp_path / "results/heroes/tables/real/a.csv").write_text("x\n2\n")
    with pytest.raises(
        runtime.TableChanged, match=re.escape("results/heroes/tables/real changed since rule coax_real")
    ):
        runtime.check_inputs(written)


def test_a_table_without_a_record_stops_with_the_fix(written, tmp_path):
    os.remove(tmp_path / ".selfrepair/records/results/heroes/tables/rho.csv.json")
    with pytest.raises(runtime.TableChanged) as err:
        runtime.check_inputs(written)
    msg = str(err.value)
    assert msg.startswith("results/heroes/tables/rho.csv has no record of the rule that wrote it")
    assert "Delete results/heroes/tables/rho.csv and rerun snakemake" in msg


@pytest.mark.slow
def test_the_curves_a_figure_draws_are_checked_in_a_real_run(tmp_path):
    """End to end on the tiny config (paper C's faithfulness figure): the run records its
    tables; curves.csv edited by hand stops the redrawn figure (it was redrawn silently)."""
    import golden_suite as G

    d = G.prepare(tmp_path)
    fig, curves = "results/gim/figures/faithfulness.png", "results/gim/tables/curves.csv"
    args = ("--cores", "2", *G.tiny_args(d, paper="gim"))
    G.snakemake(*args, "--", fig)
    rec = json.loads((d / ".selfrepair/records" / (curves + ".json")).read_text())
    assert rec["rule"] == "gim_tables" and rec["sha256"] == runtime.sha256_file(d / curves)
    assert f"checked {curves}: sha256 " in (d / "logs/gim/faithfulness_figure.log").read_text()
    f = d / curves
    f.write_text(f.read_text().replace("0.", "0.9", 1))
    r = G.snakemake(*args, "--", fig, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert f"TableChanged: {curves} changed since rule gim_tables wrote it" in out, out[-3000:]
    assert "snakemake --forcerun gim_tables" in out


# ------------------------------------------ tables passed between computing rules -------
@pytest.fixture
def scores_written(tmp_path, monkeypatch):
    """Paper A's intermediate tables as rule heroes_scores writes and records them, a model
    folder without a record (a committed checkpoint seeded into the tree), and a job of
    rule heroes_roles that reads them, launched as Snakemake launches its scripts."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "results/heroes/sort/seed42"
    (d / "model").mkdir(parents=True)
    (d / "model/config.json").write_text("{}")
    (d / "gradients.csv").write_text("component,G\nL0H0,0.5\nL0H1,0.25\n")
    (d / "train_log.csv").write_text("step,loss\n0,1.0\n")  # seeded from tests/golden: no record
    out = [f"results/heroes/sort/seed42/{f}" for f in ("gradients.csv", "ablations.csv")]
    (d / "ablations.csv").write_text("component,C\nL0H0,0.1\nL0H1,0.2\n")
    runtime.write_records(runtime.job_record(_smk("heroes_scores", outputs=out)))
    monkeypatch.setattr(runtime, "_launched_from_snakemake_scripts", lambda: True)
    monkeypatch.setattr(runtime, "_TRACKED", False)
    monkeypatch.setattr(runtime, "JOB", None)  # track() names the job: undone after the test
    monkeypatch.setattr("atexit.register", lambda *a, **k: None)  # no records written at this test's exit
    monkeypatch.setattr("sys.excepthook", sys.excepthook)
    inputs = [*out, "results/heroes/sort/seed42/model", "results/heroes/sort/seed42/train_log.csv"]
    return _smk("heroes_roles", inputs=inputs, outputs=["results/heroes/sort/seed42/roles.csv"])


def test_every_job_checks_the_recorded_tables_it_reads(scores_written, capsys):
    runtime.track(scores_written)
    logged = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in logged] == [
        "checked results/heroes/sort/seed42/gradients.csv",
        "checked results/heroes/sort/seed42/ablations.csv",
    ]  # the model folder (checked by its selfrepair.json at load) and the seeded log: not here
    assert "as rule heroes_scores wrote it" in logged[0]


def test_an_edited_intermediate_table_stops_the_job_that_reads_it(scores_written, tmp_path):
    """Edited gradients moved paper A's rho_sort from 0.96 "differs" to -0.02 "fragile",
    without a word; the roles job now stops before it reads them."""
    f = tmp_path / "results/heroes/sort/seed42/gradients.csv"
    f.write_text("component,G\nL0H0,0.25\nL0H1,0.5\n")
    with pytest.raises(runtime.TableChanged) as err:
        runtime.track(scores_written)
    msg = str(err.value)
    assert msg.startswith("results/heroes/sort/seed42/gradients.csv changed since rule heroes_scores wrote it (sha256 ")
    assert "a table that another rule reads must be what its rule wrote" in msg
    assert msg.endswith(
        "Undo the edit, or rerun its rule: snakemake --forcerun heroes_scores (the rules that read it rerun too)"
    )


def test_outside_a_snakemake_job_nothing_is_checked(scores_written, tmp_path, monkeypatch):
    """A script run by hand (a test's stub job) reads what it is given."""
    (tmp_path / "results/heroes/sort/seed42/gradients.csv").write_text("component,G\n")
    monkeypatch.setattr(runtime, "_launched_from_snakemake_scripts", lambda: False)
    runtime.track(scores_written)


@pytest.mark.slow
def test_edited_gradients_stop_paper_as_roles_in_a_real_run(tiny_runs, tmp_path):
    """End to end on a copy of the shared tiny run: gradients.csv (heroes_scores') edited
    by hand; the roles job that reads it stops, naming the file and the fix (before:
    roles and rho were recomputed from the edit, rho_sort 0.96 "differs" -> -0.02)."""
    import golden_suite as G
    from conftest import copy_run

    d = copy_run(tiny_runs, tmp_path / "run")
    edited_run_stops(d, G)


def edited_run_stops(d, G) -> None:
    grads, roles = "results/heroes/sort/seed42/gradients.csv", "results/heroes/sort/seed42/roles.csv"
    rec = json.loads((d / ".selfrepair/records" / (grads + ".json")).read_text())
    assert rec["rule"] == "heroes_scores" and rec["sha256"] == runtime.sha256_file(d / grads)
    assert f"checked {grads}: sha256 " in (d / "logs/heroes/sort/seed42/roles.log").read_text()
    f = d / grads
    f.write_text(f.read_text().replace("0.", "0.9", 1))  # newer than roles.csv: heroes_roles reruns
    r = G.snakemake("--cores", "1", *G.tiny_args(d, paper=G.ALL_PAPERS), "--", roles, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert f"TableChanged: {grads} changed since rule heroes_scores wrote it" in out, out[-3000:]
    assert "snakemake --forcerun heroes_scores" in out
