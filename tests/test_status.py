"""`python -m selfrepair.tooling.status`: the state of a workflow from its directory's files
(hand-made Snakemake markers, locks and logs, values known by construction; and a real
run whose job is killed by a signal), where to look (SNAKEMAKE_ARGS' --directory), and
the default target's counts on a dry-run state."""

import os
import signal
import subprocess
import sys
import time
import types

import pytest
from snakemake.persistence.file import FilePersistence

import golden_suite as G
from selfrepair.tooling import status

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
    # a Snakemake sent SIGTERM waits for its running jobs and exits: stopped, not finished
    log.write_text(
        RUN_LOG + "Will exit after finishing currently running jobs (scheduler).\n"
        "Finished jobid: 7 (Rule: heroes_train)\n2 of 3 steps (67%) done\nShutting down, this might take some time.\n"
        "Complete log(s): x\nWorkflowError:\nAt least one job did not complete successfully.\n"
    )
    word, lines = status.state(d, now=T0 + 45, processes=None)
    assert word == "killed" and lines[1] == (
        "STOPPED: the newest run was asked to stop (SIGTERM) and exited after its running jobs "
        "(2 of 3 steps (67%) done): the next run makes the rest."
    )


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
    final output made by hand, one exists (snakemake --summary, 3-4 s each), as plain
    Snakemake counts it (--plain-summary)."""
    d = G.prepare(tmp_path)
    args = G.tiny_args(d)[2:]  # the config arguments, without --directory
    empty = status.target_summary(d, G.ROOT / "Snakefile", args)
    assert empty["outputs"] > 50 and empty["exist"] == 0 and empty["missing"] == empty["outputs"] == empty["pending"]
    (d / "results/published").mkdir(parents=True)
    (d / "results/published/summary.csv").write_text("id\n")
    one = status.target_summary(d, G.ROOT / "Snakefile", args)
    assert (one["outputs"], one["exist"], one["missing"]) == (empty["outputs"], 1, empty["outputs"] - 1)
    # Snakemake started with its built-in executors only counts what plain Snakemake counts
    plain = status.target_summary(d, G.ROOT / "Snakefile", args, plain=True)
    assert plain["command"][1:3] == ["-m", "snakemake"] and one["command"][1] == "-c"
    assert {k: v for k, v in plain.items() if k not in ("seconds", "command")} == {
        k: v for k, v in one.items() if k not in ("seconds", "command")
    }
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


# How Snakemake 9.27 logs a script job that died (copied from real runs: the job killed
# with SIGKILL, or exiting after a traceback), before the run's "Error in rule" block.
def _died(rule, jobid, how, script="tmpab12cd"):
    return (
        "RuleException:\n"
        'CalledProcessError in file "/x/workflow/rules/heroes.smk", line 87:\n'
        f"Command 'set -euo pipefail;  /x/.venv/bin/python /d/.snakemake/scripts/{script}.{rule}.py' {how}.\n"
        "[Mon Nov 30 06:11:00 2026]\n"
        f"Error in rule {rule}:\n"
        "    message: None\n"
        f"    jobid: {jobid}\n"
        "    output: results/x\n"
        "    log: logs/heroes/sort/seed2/train.log (check log file(s) for error details)\n"
    )


KILLED_LOG = (
    RUN_LOG
    + _died("heroes_train", 7, "died with <Signals.SIGKILL: 9>")
    + "Exiting because a job execution failed. Look above for error messages\n"
    "Complete log(s): /d/.snakemake/log/x.log\n"
)


def test_how_a_failed_job_ended_is_read_from_the_run_log():
    run = status.parse_run_log(KILLED_LOG)
    job = run.jobs["7"]
    assert (job.state, job.signal, job.exit_status, job.killed_by()) == ("failed", 9, None, 9)
    assert job.ending() == "killed by SIGKILL (signal 9: kill -9, or the kernel's out-of-memory killer)"
    # a shell's 128+n, a plain failure, and two failures logged in the other order: each
    # ending goes to the job whose script it names
    log = (
        RUN_LOG
        + _died("heroes_train", 7, "returned non-zero exit status 143")
        + _died("heroes_ood", 4, "returned non-zero exit status 1")
    )
    run = status.parse_run_log(log)
    assert run.jobs["7"].ending() == (
        "exit status 143: killed by SIGTERM (signal 15: kill, or a scheduler's time limit, as a shell reports it: 128+15)"
    )
    assert (run.jobs["4"].ending(), run.jobs["4"].killed_by()) == ("exit status 1", None)
    crosswise = (
        RUN_LOG
        + _died("heroes_ood", 4, "died with <Signals.SIGTERM: 15>").split("[")[0]
        + _died("heroes_train", 7, "returned non-zero exit status 1")
        + _died("heroes_ood", 4, "x").split("]\n")[1]
    )
    run = status.parse_run_log(crosswise)
    assert (run.jobs["7"].exit_status, run.jobs["4"].signal) == (1, 15)
    # a rule that runs another rule's script (use rule heroes_train as heroes_grid_train)
    grid = RUN_LOG.replace("localrule heroes_train:", "localrule heroes_grid_train:") + _died(
        "heroes_train", 7, "died with <Signals.SIGKILL: 9>"
    ).replace("Error in rule heroes_train:", "Error in rule heroes_grid_train:")
    assert status.parse_run_log(grid).jobs["7"].signal == 9
    assert (
        status.parse_run_log(RUN_LOG + _died("heroes_train", 7, "died with unknown signal 77")).jobs["7"].signal == 77
    )


def test_a_killed_job_is_reported_killed_not_failed_at_its_last_line(workdir):
    """The job's log ends with a progress line (the signal stopped it there): the status
    names the signal, and gives that line as the last one before it."""
    d, _ = workdir
    for f in (d / ".snakemake/locks").iterdir():
        f.unlink()
    (d / ".snakemake/log/2026-11-30T060958.000000.snakemake.log").write_text(KILLED_LOG)
    word, lines = status.state(d, now=T0 + 45, processes=None, jobs=None)
    assert (
        word == "failed"
        and lines[1] == "FAILED: the newest run ended with a failed job, killed by SIGKILL (see below)."
    )
    (failed,) = [x for x in lines if x.startswith("Failed: ")]
    assert "heroes_train (jobid 7)" in failed and "; killed by SIGKILL (signal 9: kill -9" in failed
    assert failed.endswith(f"; log logs/heroes/sort/seed2/train.log, its last line before the signal: {TRAIN_LINE}")


@pytest.mark.slow
def test_a_job_killed_by_a_signal_in_a_real_run(tmp_path):
    """A real run's training job killed with SIGKILL (as by kill -9 or the out-of-memory
    killer) after its log's first progress line: named killed by SIGKILL, that line given
    as its last before the signal. About 20 s."""
    d = G.prepare(tmp_path)
    long = d / "long.yaml"  # a training that would run long past the kill
    long.write_text("heroes:\n  train: {max_steps: 100000, target_accuracy: 1.0, eval_every: 50}\n")
    target = "results/heroes/sort/seed42/train.json"
    # the target before --configfile, which takes every following word as a config file
    cmd = [str(G.BIN / "snakemake"), "-s", str(G.ROOT / "Snakefile"), "--cores", "1", target, *G.tiny_args(d, long)]
    proc = subprocess.Popen(
        cmd,
        cwd=G.ROOT,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log = d / "logs/heroes/sort/seed42/train.log"
    deadline = time.monotonic() + 120
    try:
        while not (log.exists() and "train step" in log.read_text()):
            assert proc.poll() is None, "snakemake ended before the job was killed"
            assert time.monotonic() < deadline, "the training job logged no progress within 120 s"
            time.sleep(0.2)
        (job,) = [j for j in status.job_processes(d) if j["rule"] == "heroes_train"]
        os.kill(job["pid"], signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    last = status.last_line(log)
    assert "train step" in last
    word, lines = status.state(d)
    assert word == "failed" and "killed by SIGKILL" in lines[1], lines
    (failed,) = [x for x in lines if x.startswith("Failed: ")]
    assert failed.startswith("Failed: heroes_train (jobid ") and "killed by SIGKILL (signal 9" in failed, failed
    assert failed.endswith(f"its last line before the signal: {last}"), failed


def test_the_directory_among_the_snakemake_args(workdir, tmp_path, monkeypatch, capsys):
    """`make status SNAKEMAKE_ARGS="--directory X ..."` looks at X, as `make report` does;
    the count gets the other arguments."""
    d, _ = workdir
    where, rest = status.split_where(
        ["--configfile", "a.yaml", "--directory", "X", "-sS", "--config", "p=1", "--", "t"]
    )
    assert where == {"directory": "X", "snakefile": "S"}
    assert rest == ["--configfile", "a.yaml", "--config", "p=1", "--", "t"]
    assert status.split_where(["--directory=Y", "-d", "Z"])[0] == {"directory": "Z"}  # the last, as in Snakemake
    monkeypatch.chdir(tmp_path)  # not the run's directory
    assert status.main(["--no-summary", "--", "--configfile", "x.yaml", "--directory", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"Workflow in {d.resolve()}" in out and "newest run: .snakemake/log/2026-11-30T060958" in out
    with pytest.raises(SystemExit):
        status.main(["-d", str(tmp_path), "--no-summary", "--", "-d", str(d)])
    assert "two directories" in capsys.readouterr().err
    # through make, with the Makefile's own recipe
    r = subprocess.run(
        ["make", "-s", "status", f"VENV={sys.prefix}", "STATUS_ARGS=--no-summary", f"SNAKEMAKE_ARGS=--directory {d}"],
        cwd=G.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and f"Workflow in {d.resolve()}" in r.stdout and "NOT RUN" not in r.stdout, r


def test_a_failed_fast_count_is_retried_plainly(tmp_path, monkeypatch):
    """The count starts Snakemake with its built-in executors only; if that fails, it
    starts it plainly (with every executor plugin, e.g. for a profile that names one)."""
    plain = "print('output_file\\tdate\\trule\\tlog\\tstatus\\tplan'); print('a\\tMon\\tr\\t-\\tok\\tno update')"
    monkeypatch.setattr(status, "_FAST_START", ["-c", "import sys; sys.exit('no such executor')"])
    monkeypatch.setattr(status, "_PLAIN_START", ["-c", plain])
    s = status.target_summary(tmp_path, tmp_path / "Snakefile", [])
    assert (s["outputs"], s["exist"], s["up_to_date"]) == (1, 1, 1) and s["command"][1:3] == ["-c", plain]
    assert status.target_summary(tmp_path, tmp_path / "Snakefile", [], plain=True)["command"][1:3] == ["-c", plain]


def test_the_count_starts_snakemake_without_its_executor_plugins():
    """What the count's subprocess runs: Snakemake's command line with its built-in
    executors, no executor plugin imported (the SLURM one runs `scontrol show config` as
    it is imported: about 9 s where no SLURM controller answers). About 2 s."""
    code = (
        "import sys; from selfrepair.tooling.status import builtin_executors_main as m; code = m(['--version']); "
        "from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry as R; "
        "print(code, sorted(R().plugins), [k for k in sys.modules if k.startswith('snakemake_executor_plugin')])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "0 ['dryrun', 'local', 'touch'] []", r.stdout


NOTHING_LOG = """Assuming unrestricted shared filesystem usage.

SNAKEMAKE
=========
  Command: /x/.venv/bin/snakemake -s /x/Snakefile --cores 2 --directory /d -- results/a.csv
  Config MD5: abc123

Building DAG of jobs...
Nothing to be done (all requested files are present and up to date).Assuming unrestricted shared filesystem usage.
"""


def test_a_run_with_nothing_to_do_is_finished_not_killed(tmp_path):
    """Issue 50: a rerun of a finished target ("Nothing to be done", rc 0) writes no closing
    line; status read it as KILLED."""
    d = tmp_path / "run"
    _write(d / ".snakemake/log/2026-11-30T060958.000000.snakemake.log", RUN_LOG + "Complete log(s): x\n", T0)
    _write(d / ".snakemake/log/2026-11-30T070000.000000.snakemake.log", NOTHING_LOG, T0 + 50)
    run = status.parse_run_log(NOTHING_LOG)
    assert run.nothing_to_do and not run.ended and not run.jobs
    word, lines = status.state(d, now=T0 + 60, processes=None, jobs=None)
    assert word == "finished" and lines[1].startswith("FINISHED, NOTHING TO DO: the newest run found every")
    assert "KILLED" not in "\n".join(lines)


@pytest.mark.slow
def test_a_real_run_with_nothing_to_do_is_finished(tmp_path):
    """The issue's case with Snakemake itself: run a target, run it again (nothing to do),
    then ask for the status (a one-rule Snakefile: two runs of a second each)."""
    (tmp_path / "Snakefile").write_text('rule a:\n    output: "a.txt"\n    shell: "echo 1 > {output}"\n')
    for _ in range(2):
        r = subprocess.run(
            [str(G.BIN / "snakemake"), "--cores", "1", "a.txt"], cwd=tmp_path, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
    assert "Nothing to be done" in r.stdout + r.stderr
    word, lines = status.state(tmp_path, processes=None, jobs=None)
    assert (word, lines[1].split(":")[0]) == ("finished", "FINISHED, NOTHING TO DO")
