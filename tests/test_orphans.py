"""A job ends when its Snakemake dies (runtime.watch_snakemake), and `make status` names
a job process that outlived its Snakemake (an orphan that still writes outputs).

Linux only (/proc). The watchdog tests run stand-ins of Snakemake (a Python file named
``snakemake``), a few seconds each; the end-to-end test kills a real Snakemake run."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from selfrepair.core import runtime
from selfrepair.tooling import status
from test_workflow import BIN, ROOT, configs

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
SRC = str(ROOT / "src")


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead and not yet reaped, does not)."""
    st = runtime.proc_stat(pid)
    return st is not None and st[0] not in "ZX"


def wait_for(predicate, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def read_pids(f: Path) -> dict:
    text = f.read_text() if f.exists() else ""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


# The job: arms the watchdog (every 0.1 s), starts a child of its own (`sleep`), says what
# it found in a file, then writes on, as a training job does.
JOB = """
import os, subprocess, sys, time
sys.path.insert(0, {src!r})
sys.stderr = open({log!r}, "w", buffering=1)
from selfrepair.core import runtime
watched = runtime.watch_snakemake(interval=0.1)
child = subprocess.Popen(["sleep", "300"])
with open({pids!r}, "a") as f:
    f.write(f"job={{os.getpid()}}\\nchild={{child.pid}}\\nwatched={{watched}}\\n")
while True:
    time.sleep(0.05)
"""

# The launcher, named `snakemake` (or else): starts the job directly or through a shell,
# then waits for ever.
LAUNCHER = """
import os, subprocess, sys, time
cmd = [sys.executable, {job!r}]
if {shell!r}:
    cmd = ["/bin/sh", "-c", f"{{sys.executable}} {job!s}; echo the job ended"]
subprocess.Popen(cmd)
with open({pids!r}, "a") as f:
    f.write(f"launcher={{os.getpid()}}\\n")
while True:
    time.sleep(1)
"""


def launch(tmp_path: Path, name: str, shell: bool):
    pids, log, job = tmp_path / "pids.txt", tmp_path / "job.log", tmp_path / "job.py"
    job.write_text(JOB.format(src=SRC, log=str(log), pids=str(pids)))
    launcher = tmp_path / name
    launcher.write_text(LAUNCHER.format(job=str(job), shell=shell, pids=str(pids)))
    env = {k: v for k, v in os.environ.items() if k != runtime.WATCHDOG_ENV}
    proc = subprocess.Popen([sys.executable, str(launcher)], cwd=tmp_path, env=env, start_new_session=True)
    assert wait_for(lambda: {"launcher", "job", "child"} <= set(read_pids(pids)), 30), "the job did not start"
    return proc, {k: v if k == "watched" else int(v) for k, v in read_pids(pids).items()}, log


def kill_all(proc, pids):
    """SIGKILL the live ``pids`` and ``proc``'s process group (test clean-up)."""
    for pid in pids:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def end(proc, pids):
    kill_all(proc, (pids.get("job"), pids.get("child")))
    proc.wait()


def test_argv_recognition():
    assert runtime.is_snakemake(["/x/.venv/bin/snakemake", "--cores", "2"])
    assert runtime.is_snakemake(["/x/.venv/bin/python", ".venv/bin/snakemake", "--cores", "2"])
    assert runtime.is_snakemake(["python3.11", "-m", "snakemake", "--target-jobs", "a"])
    assert not runtime.is_snakemake(["/bin/sh", "-c", "HF_HUB_OFFLINE=1 .venv/bin/snakemake --cores 2"])
    assert not runtime.is_snakemake(["python", "/x/.snakemake/scripts/tmpab.heroes_train.py"])
    assert runtime.is_pytest(["/x/.venv/bin/python", "-m", "pytest", "-q", "tests"])
    assert runtime.is_pytest(["/x/.venv/bin/pytest", "tests"]) and not runtime.is_pytest(["make", "test"])


def test_never_armed_in_pytest():
    """Scripts run in the test process (runpy, tests/test_plots.py) call runtime.start:
    the watchdog stays off there."""
    assert runtime.snakemake_ancestor() is None
    assert runtime.watch_snakemake() is None and runtime._WATCHED is None


@pytest.mark.parametrize("shell", [False, True], ids=["direct", "through-a-shell"])
def test_job_ends_with_its_snakemake(tmp_path, shell):
    proc, pids, log = launch(tmp_path, "snakemake", shell)
    try:
        assert pids["watched"] == str(pids["launcher"])
        assert alive(pids["job"]) and alive(pids["child"])
        os.kill(pids["launcher"], signal.SIGKILL)  # Snakemake only, not its process group
        assert wait_for(lambda: not alive(pids["job"]), 5), "the job outlived its Snakemake"
        assert wait_for(lambda: not alive(pids["child"]), 2), "the job's own child outlived it"
        text = log.read_text()
        assert f"selfrepair: Snakemake (pid {pids['launcher']}) that ran this job is gone (killed?)" in text
        assert f"ending this job (pid {pids['job']})" in text and len(text.strip().splitlines()) == 1
    finally:
        end(proc, pids)


@pytest.mark.parametrize("name", ["pytest", "other"])
def test_not_armed_without_a_snakemake_above(tmp_path, name):
    """Only a Snakemake ancestor arms it; a pytest process in between (a test that runs
    a script), or no Snakemake at all (a script run by hand, a SLURM step), leave the
    job alone."""
    proc, pids, log = launch(tmp_path, name, shell=False)
    try:
        assert pids["watched"] == "None"
        os.kill(pids["launcher"], signal.SIGKILL)
        time.sleep(1.0)  # ten of the watchdog's intervals
        assert alive(pids["job"]) and log.read_text() == ""
    finally:
        end(proc, pids)


def test_script_job_orphaned_before_it_started_ends(tmp_path):
    """A Snakemake script job whose Snakemake died before the job reached runtime.start
    (the job was handed to init, pid 1) ends there."""
    scripts = tmp_path / ".snakemake" / "scripts"
    scripts.mkdir(parents=True)
    out = tmp_path / "out.txt"
    script = scripts / "tmpab12cd.heroes_train.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {SRC!r})
        while os.getppid() == int(sys.argv[1]):  # until the shell that started it is gone
            time.sleep(0.02)
        if os.getppid() != 1:  # a subreaper took it, not init: nothing to test
            open({str(out)!r}, "w").write("subreaper")
            sys.exit(0)
        sys.stderr = open({str(out)!r}, "w", buffering=1)
        from selfrepair.core import runtime
        runtime.watch_snakemake()
        print("not ended", file=sys.stderr)
        """)
    )
    subprocess.run(["/bin/sh", "-c", f"{sys.executable} {script} $$ &"], cwd=tmp_path, check=True)
    assert wait_for(lambda: out.exists() and out.read_text().strip(), 10), "the script did not get far"
    time.sleep(0.2)
    text = out.read_text()
    if text == "subreaper":
        pytest.skip("orphans go to a subreaper here, not to init")
    assert "died before the job started" in text and "not ended" not in text


def test_status_names_a_live_orphan(tmp_path):
    """A process running a script of .snakemake/scripts with no Snakemake above it: named
    by pid in `make status`, which says to end it before --unlock."""
    d = tmp_path / "run"
    (d / ".snakemake" / "scripts").mkdir(parents=True)
    (d / ".snakemake" / "locks").mkdir()
    (d / ".snakemake" / "locks" / "0.output.lock").write_text("results/a.csv\n")
    script = d / ".snakemake" / "scripts" / "tmpab12cd.heroes_train.py"
    script.write_text("import time\ntime.sleep(60)\n")
    # relative to its working directory, as a user might start it; Snakemake gives the full path
    orphan = subprocess.Popen([sys.executable, ".snakemake/scripts/tmpab12cd.heroes_train.py"], cwd=d)
    try:
        assert wait_for(lambda: status.job_processes(d), 10)
        (job,) = status.job_processes(d)
        assert (job["pid"], job["rule"], job["snakemake"]) == (orphan.pid, "heroes_train", None)
        assert abs(job["started"] - time.time()) < 30
        word, lines = status.state(d)
        text = "\n".join(lines)
        assert word == "stale lock" and f"pid {orphan.pid}" in lines[1] and f"(kill {orphan.pid})" in lines[1]
        assert f"  pid {orphan.pid}: rule heroes_train (.snakemake/scripts/tmpab12cd.heroes_train.py), started" in text
    finally:
        orphan.kill()
        orphan.wait()
    assert status.job_processes(d) == []
    word, lines = status.state(d)
    assert word == "stale lock" and "ORPHAN" not in "\n".join(lines) and "snakemake --unlock" in lines[1]


def job_pids(d: Path) -> list[int]:
    """Live processes whose command line names ``d``'s .snakemake/scripts."""
    scripts = str(d / ".snakemake" / "scripts")
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and alive(int(p.name))
            and any(scripts in a for a in runtime.proc_argv(int(p.name)))]  # fmt: skip


@pytest.mark.slow
def test_kill_9_of_snakemake_ends_its_job(tmp_path):
    """SIGKILL of Snakemake alone (not its process group) while paper A's tiny training
    runs: the job's process ends within seconds, and writes no output after. About 20 s."""
    d = tmp_path
    (d / "config").mkdir()
    shutil.copy(ROOT / "config" / "published.yaml", d / "config" / "published.yaml")
    target = "results/heroes/sort/seed42/train.json"
    args = [target, "--directory", str(d), *configs(), "--config", "papers=[heroes]", "device=cpu"]
    cmd = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--cores", "1", *args]
    env = {k: v for k, v in os.environ.items() if k != runtime.WATCHDOG_ENV} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    log = d / "logs/heroes/sort/seed42/train.log"
    try:  # wait until the training job runs past runtime.start (its log names the rule)
        assert wait_for(lambda: log.exists() and "rule heroes_train on cpu" in log.read_text(), 120, 0.2), (
            "the training job did not start within 120 s"
        )
        assert proc.poll() is None, "snakemake ended before it was killed"
        assert len(job_pids(d)) == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_for(lambda: not job_pids(d), 10), f"job process(es) {job_pids(d)} outlived Snakemake"
    finally:
        kill_all(proc, job_pids(d))
    assert f"selfrepair: Snakemake (pid {proc.pid}) that ran this job is gone" in log.read_text().splitlines()[-1]
    assert not (d / target).exists()
    word, lines = status.state(d)
    assert word == "stale lock" and "ORPHAN" not in "\n".join(lines) and "heroes_train (jobid" in "\n".join(lines)
