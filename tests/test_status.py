"""`python -m selfrepair.workflow.status`: the state of a workflow from its directory's files
(hand-made Snakemake markers, locks and logs, values known by construction), and the
default target's counts on a dry-run state."""

import os
import types

import pytest
from snakemake.persistence.file import FilePersistence

import golden_suite as G
from selfrepair.workflow import status

T0 = 1_790_000_000.0  # the hand-made run's clock

RUN_LOG = """Assuming unrestricted shared filesystem usage.

SNAKEMAKE
=========
  Command: /x/.venv/bin/snakemake -s /x/Snakefile --cores 2 --directory /d --configfile /x/config/config.yaml /x/config/test.yaml --config papers=[heroes] device=cpu -- results/a.csv
  Snakefile: /x/Snakefile
  Config file(s): [PosixPath('/x/config/config.yaml'), PosixPath('/x/config/test.yaml')]
  Config MD5: abc123

Building DAG of jobs...
Provided cores: 2
Job stats:
job      count
-------  -------
total          3

Select jobs to execute...
Execute 2 jobs...
[Mon Nov 30 06:09:58 2026]
localrule heroes_ood:
    input: results/heroes/sort/seed1/model
    output: results/heroes/sort/seed1/ood.json, results/heroes/sort/seed1/ood_batches.pt
    log: logs/heroes/sort/seed1/ood.log
    jobid: 4
    reason: Missing output files: results/heroes/sort/seed1/ood.json
    wildcards: task=sort, seed=1
    resources: tmpdir=/tmp
[Mon Nov 30 06:09:58 2026]
localrule heroes_train:
    output: results/heroes/sort/seed2/model, results/heroes/sort/seed2/train_log.csv, results/heroes/sort/seed2/train.json
    log: logs/heroes/sort/seed2/train.log
    jobid: 7
    reason: Missing output files: results/heroes/sort/seed2/train.json
    resources: tmpdir=/tmp
[Mon Nov 30 06:10:07 2026]
Finished jobid: 4 (Rule: heroes_ood)
1 of 3 steps (33%) done
"""

TRAIN_LINE = "2026-11-30 06:20:00,000 train step 1200/15000 (8%) | loss 0.4123 | eval acc 0.9120 at step 1000 | 45.2 steps/s | elapsed 0:00:26 | eta 0:05:05 to max_steps"


def _marker(directory, output):
    """An incomplete marker written the way Snakemake names it (its own encoder)."""
    root = directory / ".snakemake" / "incomplete"
    fake = types.SimpleNamespace(_fetch_max_len=lambda subject: 255)
    p = FilePersistence._record_path(fake, str(root), output)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write('{"external_jobid": null}')
    os.utime(p, (T0 + 10, T0 + 10))
    return p


def _write(path, text, mtime):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "run"
    _write(d / ".snakemake/log/2026-11-30T060958.000000.snakemake.log", RUN_LOG, T0)
    _write(
        d / ".snakemake/log/2026-11-30T070000.000000.snakemake.log", "Building DAG of jobs...\n", T0 + 50
    )  # a --summary's log
    _write(d / ".snakemake/locks/0.output.lock", "results/a.csv\nresults/b.csv\nresults/c.csv\n", T0)
    _write(d / ".snakemake/locks/0.input.lock", "config/x.yaml\n", T0)
    for o in ("results/heroes/sort/seed2/model", "results/heroes/sort/seed2/train.json"):
        _marker(d, o)
    long = "results/" + "/".join(["a_rather_long_folder_name"] * 9) + "/out.csv"  # > 255 base64 characters
    assert os.path.basename(os.path.dirname(_marker(d, long))).startswith("@")
    _write(d / "logs/heroes/sort/seed2/train.log", "numerics: {}\n" + TRAIN_LINE + "\n\n", T0 + 40)
    _write(d / "logs/heroes/sort/seed1/ood.log", "2026-11-30 06:10:06,000 done\n", T0 + 9)
    return d, long


def test_decode_marker_inverts_snakemake(tmp_path, workdir):
    d, long = workdir
    assert status.incomplete_outputs(d) == {
        "results/heroes/sort/seed2/model": T0 + 10,
        "results/heroes/sort/seed2/train.json": T0 + 10,
        long: T0 + 10,
    }


def test_parse_run_log():
    run = status.parse_run_log(RUN_LOG)
    assert run.jobs["4"].state == "finished" and run.jobs["7"].state == "running"
    assert run.jobs["7"].rule == "heroes_train" and run.jobs["7"].log == ["logs/heroes/sort/seed2/train.log"]
    assert run.jobs["7"].outputs[0] == "results/heroes/sort/seed2/model" and len(run.jobs["7"].outputs) == 3
    assert run.steps == "1 of 3 steps (33%) done" and not run.ended and not run.failed
    assert run.configfiles == ["/x/config/config.yaml", "/x/config/test.yaml"] and run.config_md5 == "abc123"
    assert status.summary_args(run) == [
        "--configfile",
        "/x/config/config.yaml",
        "/x/config/test.yaml",
        "--config",
        "papers=[heroes]",
        "device=cpu",
    ]
    failed = status.parse_run_log(
        RUN_LOG + "[Mon Nov 30 06:11:00 2026]\nError in rule heroes_train:\n    message: None\n    jobid: 7\n"
        "    output: results/heroes/sort/seed2/model\nExiting because a job execution failed. Look above for error messages\n"
        "Complete log(s): /d/.snakemake/log/x.log\n"
    )
    assert failed.jobs["7"].state == "failed" and failed.failed and failed.ended


def test_running_workflow(workdir):
    d, long = workdir
    word, lines = status.state(d, now=T0 + 45, processes=[4242])
    text = "\n".join(lines)
    assert word == "running"
    assert "RUNNING (pid 4242)" in text and "locking 3 outputs" in text
    assert "newest run: .snakemake/log/2026-11-30T060958.000000.snakemake.log, 1 of 3 steps (33%) done" in text
    assert "Running jobs (1), by start:" in text
    assert (
        "heroes_train (jobid 7, started Mon Nov 30 06:09:58 2026): results/heroes/sort/seed2/model, results/heroes/sort/seed2/train_log.csv (+1 more)"
        in text
    )
    assert f"logs/heroes/sort/seed2/train.log (written 5s ago): {TRAIN_LINE}" in text
    # markers of no running job of the newest run: listed apart
    assert "Outputs marked incomplete in .snakemake/incomplete (1; started, not finished)" in text and long in text
    newest = [x for x in lines if x.startswith("  ") and "logs/heroes/sort/seed" in x and "written" not in x]
    assert newest[0].endswith(f"logs/heroes/sort/seed2/train.log: {TRAIN_LINE}") and newest[1].endswith(
        "logs/heroes/sort/seed1/ood.log: 2026-11-30 06:10:06,000 done"
    )


def test_stale_lock_killed_and_finished(workdir):
    d, _ = workdir
    word, lines = status.state(d, now=T0 + 45, processes=[])
    assert word == "stale lock" and "snakemake --unlock" in lines[1]
    for f in (d / ".snakemake/locks").iterdir():
        f.unlink()
    word, lines = status.state(d, now=T0 + 45, processes=None)
    assert word == "killed" and "Interrupted jobs (1)" in "\n".join(lines)
    assert "interrupted: the next run reruns them" in "\n".join(lines)
    log = d / ".snakemake/log/2026-11-30T060958.000000.snakemake.log"
    log.write_text(RUN_LOG + "Finished jobid: 7 (Rule: heroes_train)\n3 of 3 steps (100%) done\nComplete log(s): x\n")
    word, lines = status.state(d, now=T0 + 45, processes=None)
    assert word == "finished" and "3 of 3 steps (100%) done" in lines[2] and "Running jobs" not in "\n".join(lines)


def test_nothing_run_yet(tmp_path, capsys):
    assert status.main(["--directory", str(tmp_path), "--no-summary"]) == 0
    out = capsys.readouterr().out
    assert "NOT RUN" in out and "Default target" not in out


def test_parse_summary_counts():
    text = "output_file\tdate\trule\tlog-file(s)\tstatus\tplan\n" + "\n".join(
        [
            "a\tMon\tr\t-\tok\tno update",
            "b\tMon\tr\t-\tparams changed\tupdate pending",
            "c\t-\tr\t-\tmissing\tupdate pending",
            "d\tMon\tr\t-\tupdated input files\tupdate pending",
        ]
    )
    assert status.parse_summary(text) == {
        "outputs": 4,
        "exist": 3,
        "up_to_date": 1,
        "missing": 1,
        "pending": 3,
        "why": {"params changed": 1, "updated input files": 1},
    }


@pytest.mark.slow
def test_default_target_counts_on_a_dry_run_state(tmp_path):
    """The tiny paper-A config in an empty directory: every output is missing; with one
    final output made by hand, one exists (snakemake --summary, about 2 s)."""
    d = G.prepare(tmp_path)
    args = G.tiny_args(d)[2:]  # the config arguments, without --directory
    empty = status.target_summary(d, G.ROOT / "Snakefile", args)
    assert empty["outputs"] > 50 and empty["exist"] == 0 and empty["missing"] == empty["outputs"] == empty["pending"]
    (d / "results/published").mkdir(parents=True)
    (d / "results/published/summary.csv").write_text("id\n")
    one = status.target_summary(d, G.ROOT / "Snakefile", args)
    assert (one["outputs"], one["exist"], one["missing"]) == (empty["outputs"], 1, empty["outputs"] - 1)
    lines = status.summary_lines(d, status.RunLog(), None, args)
    assert lines[1].startswith(f"  1 of {empty['outputs']} output files exist")


# A run with an overlay config in its own working directory (`snakemake --configfile
# config/config.yaml config/test.yaml`): Snakemake lists the --configfile files first and
# the Snakefile's own `configfile: "config/config.yaml"` last, but applies that one first.
OVERLAY_LOG = RUN_LOG.replace(
    "  Config file(s): [PosixPath('/x/config/config.yaml'), PosixPath('/x/config/test.yaml')]",
    "  Config file(s): [PosixPath('/d/config/config.yaml'), PosixPath('/d/config/test.yaml'), 'config/config.yaml']",
)


def test_config_files_in_the_order_the_run_applied_them(tmp_path):
    run = status.parse_run_log(OVERLAY_LOG)
    assert run.configfiles == ["config/config.yaml", "/d/config/config.yaml", "/d/config/test.yaml"]
    assert run.workflow_configfiles == ["config/config.yaml"]
    assert status.summary_args(run, tmp_path) == [
        "--configfile",
        str(tmp_path / "config/config.yaml"),  # the Snakefile's own, from the run's working directory
        "/d/config/config.yaml",
        "/d/config/test.yaml",  # the overlay last
        "--config",
        "papers=[heroes]",
        "device=cpu",
    ]
    assert status.parse_configfiles("""[PosixPath("/a/it's.yaml"), 'b.yaml']""") == (
        ["b.yaml", "/a/it's.yaml"],
        ["b.yaml"],
    )
    run.command = "snakemake -C a=1 --cores 1 --config=b=2"
    assert status.summary_args(run)[-3:] == ["--config", "a=1", "b=2"]


@pytest.mark.slow
def test_overlay_config_run_counts_as_up_to_date(tmp_path):
    """A finished run with the tiny config over the default one, from its own working
    directory (where the Snakefile's `configfile:` exists): its output counts as up to
    date (re-applying config/config.yaml last made it "params changed"). About 10 s."""
    d = G.prepare(tmp_path)
    for name in ("config.yaml", "test.yaml"):
        (d / "config" / name).write_text((G.ROOT / "config" / name).read_text())
    target = "results/coax/synthetic/auc.csv"  # one job; its params differ between the two configs
    G.snakemake(
        "--cores", "1", "--configfile", "config/config.yaml", "config/test.yaml",
        "--config", "papers=[coax]", "device=cpu", "--", target, cwd=d,
    )  # fmt: skip
    run = status.newest_run_log(d)
    assert run.configfiles[0] == "config/config.yaml" and run.configfiles[-1] == str(d / "config/test.yaml")
    s = status.target_summary(d, G.ROOT / "Snakefile", status.summary_args(run, d))
    assert (s["exist"], s["up_to_date"], s["why"]) == (1, 1, {}), s
    lines = status.summary_lines(d, run, None, None)
    assert "1 of" in lines[1] and "1 up to date;" in lines[1] and "to be rebuilt" not in lines[1], lines
    assert not any("differs" in x for x in lines)


def test_orphan_job_is_named_with_its_pid(workdir):
    """A job process of a killed run (its Snakemake gone) that still runs here: named by
    pid, and the stale lock's advice says to end it before --unlock."""
    d, _ = workdir
    orphan = {
        "pid": 31337,
        "rule": "heroes_train",
        "script": "tmpab12cd.heroes_train.py",
        "started": T0 + 1,
        "snakemake": None,
    }
    word, lines = status.state(d, now=T0 + 45, processes=[], jobs=[orphan])
    assert word == "stale lock" and "pid 31337" in lines[1] and "(kill 31337)" in lines[1] and "--unlock" in lines[1]
    assert lines[2].startswith("ORPHAN JOBS (1)")
    assert lines[3] == "  pid 31337: rule heroes_train (.snakemake/scripts/tmpab12cd.heroes_train.py), started " + (
        f"{status._clock(T0 + 1)} (44s ago)"
    )
    assert "end them (kill 31337), before snakemake --unlock" in lines[4]
    # a job whose Snakemake is alive is no orphan
    word, lines = status.state(d, now=T0 + 45, processes=[4242], jobs=[orphan | {"snakemake": 4242}])
    assert word == "running" and not any("ORPHAN" in x for x in lines)
    word, lines = status.state(d, now=T0 + 45, processes=[], jobs=[])
    assert word == "stale lock" and "ORPHAN" not in "\n".join(lines)
