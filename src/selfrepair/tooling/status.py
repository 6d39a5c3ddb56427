"""Where a workflow stands: running, finished, failed or killed, and what it is doing.

    python -m selfrepair.tooling.status [--directory DIR] [--logs N] [--no-summary] [-- SNAKEMAKE_ARGS]
    make status [SNAKEMAKE_ARGS="--directory DIR --configfile ..."] [STATUS_ARGS=--no-summary]

Read from the working directory's files only (instant, safe while a run goes on; it
writes nothing there), and printed at once:

* ``.snakemake/locks/``: a Snakemake run holds the directory (or one was killed hard,
  e.g. ``kill -9``, out of memory, a power cut: then the lock is stale). On Linux the
  command also looks for a Snakemake process working in the directory.
* ``.snakemake/log/*.snakemake.log``, the newest run's own log: which jobs it started,
  which finished or failed, its ``k of n steps`` count, whether it ended. A failed job
  is named with how it ended, from the error Snakemake logged: killed by a signal (``died
  with <Signals.SIGKILL: 9>``, or a shell's exit status 128+n), or its exit status.
* ``.snakemake/incomplete/``: the outputs of jobs that started and did not finish
  (running now, or interrupted: the next run reruns them).
* ``logs/**/*.log``, the jobs' own logs: the last line of each running job's log (a
  training job writes a progress line with its ETA at least every 30 s) and of the
  newest logs.
* On Linux, ``/proc``: job processes that run a script of ``.snakemake/scripts/`` of the
  directory while no Snakemake process is above them (orphans of a killed run that
  still write outputs), named by pid: end them or let them end before ``--unlock``.

Then, unless ``--no-summary``, how many of the default target's output files exist:
``snakemake --summary --nolock`` in a subprocess. It costs what a dry run costs (it
builds the DAG and checks every output's date, code and params: about 4 s for a tiny
run on 2 cores, running or finished, benchmarks/bench_status.py; it takes no lock and
changes no result, but Snakemake writes a short log of it in .snakemake/log). It runs
Snakemake with its built-in executors only (a summary runs no job): plain ``snakemake``
also imports every installed executor plugin first, and the SLURM plugin runs
``scontrol show config`` then, which waits about 9 s where SLURM's tools are installed
but no controller answers (13-18 s in all). ``--plain-summary`` runs it plainly (and a
failed fast run is retried plainly).
It uses the Snakefile and config files the newest run used, in the order that run
applied them (the Snakefile's own ``configfile:`` first, then its ``--configfile`` files
as given), and that run's ``--config`` values, unless SNAKEMAKE_ARGS are given after
``--`` (``make status SNAKEMAKE_ARGS=...``). A ``--directory`` (``-d``) or ``--snakefile``
(``-s``) among them says which directory to look at (or Snakefile), as for the other
``make`` targets.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from selfrepair.core.runtime import proc_argv, proc_stat, snakemake_ancestor

REPO_SNAKEFILE = Path(__file__).resolve().parents[3] / "Snakefile"
MISSING = {"missing", "removed temp file", "file local to node", "pipe file", "service file"}


# ----------------------------------------------------------------------------------
# Snakemake's files
# ----------------------------------------------------------------------------------
def decode_marker(root: Path, path: Path) -> str:
    """The output file an ``.snakemake/incomplete`` marker stands for: Snakemake names it
    by the urlsafe base64 of the path, cut into pieces (all but the last start with @)."""
    parts = [p[1:] if p.startswith("@") else p for p in path.relative_to(root).parts]
    return base64.urlsafe_b64decode("".join(parts).encode()).decode()


def incomplete_outputs(directory: Path) -> dict[str, float]:
    """Output -> the time its job started (the marker's mtime)."""
    root = directory / ".snakemake" / "incomplete"
    out = {}
    for p in sorted(root.rglob("*")) if root.is_dir() else []:
        if p.is_file() and p.name != "migration_underway":
            try:
                out[decode_marker(root, p)] = p.stat().st_mtime
            except (ValueError, UnicodeDecodeError):
                continue
    return out


def locks(directory: Path) -> dict:
    """The lock files, the number of files they hold and since when."""
    files = sorted((directory / ".snakemake" / "locks").glob("*.lock"))
    held = {"input": 0, "output": 0}
    for f in files:
        kind = "output" if f.name.endswith(".output.lock") else "input"
        held[kind] += sum(1 for line in f.read_text(errors="replace").splitlines() if line.strip())
    since = min((f.stat().st_mtime for f in files), default=None)
    return {"files": [f.name for f in files], "inputs": held["input"], "outputs": held["output"], "since": since}


@dataclass
class Job:
    jobid: str
    rule: str
    started: str = ""
    outputs: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    state: str = "running"  # running, finished or failed
    # How a failed job ended, from the error Snakemake logged before its "Error in rule"
    # block: the signal that killed it (its number), or its exit status.
    signal: int | None = None
    exit_status: int | None = None

    def killed_by(self) -> int | None:
        """The signal that killed the failed job: the one Python saw, or n of a shell's
        exit status 128+n (a job run below a shell that did not exec it)."""
        if self.signal is not None:
            return self.signal
        n = None if self.exit_status is None else self.exit_status - 128
        return n if n is not None and 0 < n < 65 and signal_name(n).startswith("SIG") else None

    def ending(self) -> str:
        """How the failed job ended, in words ("" when its run log does not say)."""
        n = self.killed_by()
        if self.signal is not None:
            return f"killed by {signal_name(n)} (signal {n}{_SIGNAL_HINT.get(n, '')})"
        if n is not None:
            return f"exit status {self.exit_status}: killed by {signal_name(n)} (signal {n}{_SIGNAL_HINT.get(n, '')}, as a shell reports it: 128+{n})"
        return "" if self.exit_status is None else f"exit status {self.exit_status}"


@dataclass
class RunLog:
    path: Path | None = None
    command: str = ""
    snakefile: str = ""
    # In the order the run applied them: the Snakefile's own ``configfile:`` (workflow_configfiles,
    # relative to the working directory) first, then the ``--configfile`` files as given.
    configfiles: list[str] = field(default_factory=list)
    workflow_configfiles: list[str] = field(default_factory=list)
    config_md5: str = ""
    jobs: dict[str, Job] = field(default_factory=dict)
    steps: str = ""  # the last "k of n steps (x%) done"
    ended: bool = False  # the run wrote its closing line ("Complete log(s)")
    # the run found every requested file present and up to date: it ran no job and ends
    # its log without the closing line
    nothing_to_do: bool = False
    failed: bool = False
    killed_on_request: bool = False
    # Snakemake got SIGTERM: it starts no more jobs and exits when its running ones end
    stopping: bool = False


_BLOCK = re.compile(r"^(?:local)?rule (\S+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\S+)")
_ERROR = re.compile(r"^Error in rule (\S+):$")
_STEPS = re.compile(r"^(\d+ of \d+ steps \(\d+%\) done)")
# Python's CalledProcessError, as Snakemake logs it for a failed script or shell job:
# "Command '...' died with <Signals.SIGKILL: 9>." (killed by a signal), "... died with
# unknown signal 77.", or "... returned non-zero exit status 1."
_DIED = re.compile(r"' died with (?:<Signals\.\w+: (\d+)>|unknown signal (\d+))\.\s*$")
_EXIT = re.compile(r"' returned non-zero exit status (-?\d+)\.\s*$")
# the script's name in a script job's command: .snakemake/scripts/tmpXXXX.<its file name>
_SCRIPT = re.compile(r"\.snakemake/scripts/tmp[^./\s]*\.([^/\s]+)\.py\b")
_SIGNAL_HINT = {
    signal.SIGKILL: ": kill -9, or the kernel's out-of-memory killer",
    signal.SIGTERM: ": kill, or a scheduler's time limit",
    signal.SIGINT: ": Ctrl-C",
}


def signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


_CONFIGFILE = re.compile(r"(PosixPath\(|WindowsPath\(|Path\()?(?:'([^']*)'|\"([^\"]*)\")")


def parse_configfiles(listing: str) -> tuple[list[str], list[str]]:
    """The config files of a run log's ``Config file(s): [...]`` line, in the order the
    run applied them, and those of them that the Snakefile's ``configfile:`` named.

    Snakemake lists the ``--configfile`` files first (as absolute ``PosixPath``s, in the
    order given) and appends the Snakefile's own ``configfile:`` (a plain string, as
    written, relative to the working directory) when it exists; it applies that one first,
    and the ``--configfile`` files over it."""
    cli, own = [], []
    for m in _CONFIGFILE.finditer(listing):
        (cli if m.group(1) else own).append(m.group(2) if m.group(2) is not None else m.group(3))
    return own + cli, own


def parse_run_log(text: str, path: Path | None = None) -> RunLog:
    """What a ``.snakemake/log/*.snakemake.log`` says about its run."""
    run = RunLog(path=path)
    stamp, block, error = "", None, None
    # The endings logged (from a CalledProcessError) and not yet matched to the "Error in
    # rule" block that follows each: (the script's name or None, signal, status).
    endings: list[tuple[str | None, int | None, int | None]] = []
    for line in text.splitlines():
        died, exited = _DIED.search(line), _EXIT.search(line)
        if died or exited:
            script = _SCRIPT.search(line)
            sig = int(died.group(1) or died.group(2)) if died else None
            endings.append((script.group(1) if script else None, sig, int(exited.group(1)) if exited else None))
            continue
        s = line.strip()
        if s.startswith("Command: "):
            run.command = s[len("Command: ") :]
        elif s.startswith("Snakefile: "):
            run.snakefile = s[len("Snakefile: ") :]
        elif s.startswith("Config file(s): "):
            run.configfiles, run.workflow_configfiles = parse_configfiles(s[len("Config file(s): ") :])
        elif s.startswith("Config MD5: "):
            run.config_md5 = s[len("Config MD5: ") :]
        if line.startswith("[") and line.endswith("]"):
            stamp, block, error = line[1:-1], None, None
        elif m := _BLOCK.match(line):
            block, error = Job(jobid="", rule=m.group(1), started=stamp), None
        elif m := _ERROR.match(line):
            block, error = None, m.group(1)
            run.failed = True
        elif m := _FIELD.match(line):
            key, value = m.groups()
            if block is not None:
                if key in ("output", "log"):
                    setattr(
                        block,
                        "outputs" if key == "output" else "log",
                        [v.strip() for v in value.split(",") if v.strip()],
                    )
                elif key == "jobid":
                    block.jobid = value.strip()
                    run.jobs[block.jobid] = block
            elif error is not None and key == "jobid" and value.strip() in run.jobs:
                job = run.jobs[value.strip()]
                job.state = "failed"
                if endings:
                    # the one whose script is named after the rule (two jobs that failed
                    # at once may log their errors crosswise), else the oldest
                    i = next((k for k, e in enumerate(endings) if e[0] == job.rule), 0)
                    _, job.signal, job.exit_status = endings.pop(i)
        elif m := _FINISHED.match(line):
            if m.group(1) in run.jobs:
                run.jobs[m.group(1)].state = "finished"
        elif m := _STEPS.match(line):
            run.steps = m.group(1)
        elif line.startswith("Complete log(s):"):
            run.ended = True
        elif "Nothing to be done" in line:  # Snakemake writes the next banner on the same line
            run.nothing_to_do = True
        elif line.startswith("Terminating processes on user request"):
            run.killed_on_request = True
        elif line.startswith("Will exit after finishing currently running jobs"):
            run.stopping = True
        elif line.startswith("Exiting because a job execution failed"):
            run.failed = True
    return run


def newest_run_log(directory: Path) -> RunLog:
    """The newest log of a run that executed (not the short log of a --summary)."""
    logs = sorted((directory / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.name, reverse=True)
    for p in logs:
        text = p.read_text(errors="replace")
        if "Provided cores" in text or "Job stats:" in text or "Nothing to be done" in text:
            return parse_run_log(text, p)
    return RunLog()


def last_line(path: Path, width: int = 200) -> str:
    """The last non-empty line of a text file (read from its end), shortened to ``width``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def job_logs(directory: Path, n: int) -> list[tuple[Path, float]]:
    """The ``n`` most recently written ``logs/**/*.log``, newest first, with their mtime."""
    found = []
    for p in (directory / "logs").rglob("*.log") if (directory / "logs").is_dir() else []:
        try:
            found.append((p, p.stat().st_mtime))
        except OSError:
            continue
    return sorted(found, key=lambda x: (-x[1], str(x[0])))[:n]


def snakemake_processes(directory: Path) -> list[int] | None:
    """The Snakemake processes of this machine working in ``directory`` (None where /proc
    cannot tell: not Linux, or processes of other users)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    target, found, unreadable = directory.resolve(), [], False
    for p in proc.iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            words = [os.path.basename(a.decode(errors="replace")) for a in argv[:3]]
            if "snakemake" not in words and not (len(argv) > 2 and argv[1:3] == [b"-m", b"snakemake"]):
                continue
            if Path(os.readlink(p / "cwd")) == target:
                found.append(int(p.name))
        except PermissionError:
            unreadable = True
        except OSError:
            continue
    return found if found or not unreadable else None


def _boot_time() -> float:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def job_processes(directory: Path) -> list[dict] | None:
    """The processes of this machine that run a job script Snakemake wrote in
    ``directory/.snakemake/scripts`` (``tmpXXXX.<rule>.py``): pid, rule, script, start
    time and the pid of the Snakemake above them (None: an orphan, its Snakemake is
    gone). None where /proc cannot tell (not Linux)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    scripts = os.path.realpath(directory / ".snakemake" / "scripts")
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    boot, found = _boot_time(), []
    for p in proc.iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        pid = int(p.name)
        argv = proc_argv(pid)
        for a in argv[:4]:
            if ".snakemake" not in a or not a.endswith(".py"):
                continue
            path = a
            if not os.path.isabs(path):
                try:
                    path = os.path.join(os.readlink(p / "cwd"), path)
                except OSError:
                    continue
            if os.path.realpath(os.path.dirname(path)) != scripts:
                continue
            st = proc_stat(pid)
            if st is None or st[0] in "ZX":
                break
            name = os.path.basename(path)
            rule = ".".join(name.split(".")[1:-1]) or name
            found.append(
                {
                    "pid": pid,
                    "rule": rule,
                    "script": name,
                    "started": boot + st[2] / ticks if boot else None,
                    "snakemake": snakemake_ancestor(pid),
                }
            )
            break
    return sorted(found, key=lambda j: j["pid"])


# ----------------------------------------------------------------------------------
# The default target, through snakemake --summary
# ----------------------------------------------------------------------------------
def summary_args(run: RunLog, directory: Path | None = None) -> list[str]:
    """The newest run's config, in the order the run applied it: its config files (the
    Snakefile's own first, found from ``directory``, the run's working directory), then
    its ``--config`` values."""
    files = [
        str(directory / f) if directory is not None and f in run.workflow_configfiles and not os.path.isabs(f) else f
        for f in run.configfiles
    ]
    args = ["--configfile", *files] if files else []
    try:
        words = shlex.split(run.command) if run.command else []
    except ValueError:  # an unbalanced quote in a hand-typed command
        words = run.command.split()
    values = []
    for i, w in enumerate(words):
        if w in ("--config", "-C"):
            for v in words[i + 1 :]:
                if v.startswith("-"):
                    break
                values.append(v)
        elif w.startswith("--config="):
            values.append(w[len("--config=") :])
    if values:
        args += ["--config", *values]
    return args


def parse_summary(text: str) -> dict:
    """Counts of ``snakemake --summary`` rows: outputs, existing, up to date, to rebuild
    (with why), missing, and those whose job would run."""
    rows = [line.split("\t") for line in text.splitlines() if line.count("\t") >= 5]
    rows = [r for r in rows if r[0] != "output_file"]
    exist = [r for r in rows if r[-2] not in MISSING]
    why: dict[str, int] = {}
    for r in exist:
        if r[-2] != "ok":
            why[r[-2]] = why.get(r[-2], 0) + 1
    return {
        "outputs": len(rows),
        "exist": len(exist),
        "up_to_date": sum(r[-2] == "ok" and r[-1] == "no update" for r in exist),
        "missing": len(rows) - len(exist),
        "pending": sum(r[-1] == "update pending" for r in rows),
        "why": why,
    }


# How the count's subprocess starts Snakemake: through ``builtin_executors_main`` (below),
# or plainly (``--plain-summary``, and when the fast start fails).
_FAST_START = [
    "-c",
    f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
    "from selfrepair.tooling.status import builtin_executors_main; sys.exit(builtin_executors_main())",
]
_PLAIN_START = ["-m", "snakemake"]


def builtin_executors_main(argv: list[str] | None = None) -> int:
    """Snakemake's command line with only its built-in executors (local, dryrun, touch):
    for ``--summary``, which runs no job. Plain ``snakemake`` imports every installed
    executor plugin as it starts (``ExecutorPluginRegistry``), and importing the SLURM
    plugin runs ``scontrol show config`` (and pandas), which costs about 9 s where SLURM's
    tools are installed but no controller answers. The registry is a singleton that
    collects the plugins unless it holds them already, so it is given the built-in ones
    first. Where that cannot be done (another Snakemake), Snakemake starts plainly."""
    try:
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

        registry = ExecutorPluginRegistry.__new__(ExecutorPluginRegistry)
        if not hasattr(registry, "plugins"):
            from snakemake.executors import dryrun, local, touch

            registry.plugins = {}
            try:
                for name, module in (("local", local), ("dryrun", dryrun), ("touch", touch)):
                    registry.register_plugin(name, module)
            except Exception:
                del registry.plugins  # collect them all, as plain Snakemake does
                raise
    except Exception:
        pass
    from snakemake.cli import main

    try:
        main(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def target_summary(
    directory: Path, snakefile: Path, args: list[str], timeout: float = 600, plain: bool = False
) -> dict:
    """Counts of ``snakemake --summary`` (``parse_summary``), its seconds and command;
    ``plain``: start Snakemake plainly (every executor plugin), else with its built-in
    executors only, and plainly again if that fails."""
    out = _run_summary(directory, snakefile, args, timeout, _PLAIN_START if plain else _FAST_START)
    if not plain and "error" in out and not out.get("timed_out"):
        again = _run_summary(directory, snakefile, args, timeout, _PLAIN_START)
        return again | {"seconds": out.get("seconds", timeout) + again.get("seconds", timeout)}
    return out


def _run_summary(directory: Path, snakefile: Path, args: list[str], timeout: float, start: list[str]) -> dict:
    cmd = [
        sys.executable,
        *start,
        "-s",
        str(snakefile),
        "--directory",
        str(directory),
        "--summary",
        "--nolock",
        *args,
    ]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
        )
    except subprocess.TimeoutExpired:
        return {"error": f"snakemake --summary took more than {timeout:.0f} s", "command": cmd, "timed_out": True}
    out = {"seconds": time.perf_counter() - t0, "command": cmd}
    if r.returncode != 0:
        return out | {"error": "\n".join(r.stderr.strip().splitlines()[-6:])}
    md5 = re.search(r"Config MD5: (\S+)", r.stderr)
    return out | parse_summary(r.stdout) | {"config_md5": md5.group(1) if md5 else ""}


# ----------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------
def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    return f"{s // 3600}h{s % 3600 // 60:02d}m ago"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _outputs(files: list[str], n: int = 2) -> str:
    return ", ".join(files[:n]) + (f" (+{len(files) - n} more)" if len(files) > n else "")


def state(
    directory: Path,
    now: float | None = None,
    n_logs: int = 5,
    processes: list[int] | None | bool = False,
    jobs: list[dict] | None | bool = False,
) -> tuple[str, list[str]]:
    """The state word (running, stale lock, finished, failed, killed, not run) and the
    report's lines, from the directory's files (and /proc). ``processes`` is the answer
    of ``snakemake_processes``, ``jobs`` that of ``job_processes`` (False: ask them)."""
    now = time.time() if now is None else now
    lk, run, marked = locks(directory), newest_run_log(directory), incomplete_outputs(directory)
    procs = snakemake_processes(directory) if processes is False else processes
    jobs = job_processes(directory) if jobs is False else jobs
    orphans = [j for j in jobs or [] if j["snakemake"] is None]
    end_them = f"kill {' '.join(str(j['pid']) for j in orphans)}"
    open_jobs = [j for j in run.jobs.values() if j.state == "running" and j.rule != "all"]
    failed = [j for j in run.jobs.values() if j.state == "failed"]
    if lk["files"] and procs == [] and orphans:
        word = "stale lock"
        head = (
            f"STALE LOCK: .snakemake/locks holds {lk['outputs']} outputs since {_clock(lk['since'])}, and no Snakemake "
            f"process on this machine works in this directory, but {len(orphans)} job process(es) of the killed run "
            f"still run here and write their outputs (pid {', '.join(str(j['pid']) for j in orphans)}). Wait until "
            f"they end, or end them ({end_them}), and only then snakemake --unlock and run again: a run started "
            "beside them writes the same files."
        )
    elif lk["files"] and procs == []:
        word = "stale lock"
        head = (
            f"STALE LOCK? .snakemake/locks holds {lk['outputs']} outputs since {_clock(lk['since'])}, but no Snakemake "
            "process on this machine works in this directory: the run was killed hard (kill -9, out of memory, "
            "a power cut) or runs on another machine. If it was killed: snakemake --unlock, then run again "
            "(it reruns the interrupted jobs)."
        )
    elif lk["files"]:
        word = "running"
        pids = f" (pid {', '.join(map(str, procs))})" if procs else ""
        head = f"RUNNING{pids}: a Snakemake run holds the directory since {_clock(lk['since'])} ({_ago(now - lk['since'])}), locking {lk['outputs']} outputs."
        if run.stopping:
            head += " It was asked to stop (SIGTERM): it starts no more jobs and exits when its running ones end."
    elif run.path is None:
        word = "not run"
        head = "NOT RUN: no Snakemake run has executed jobs in this directory (.snakemake/log has no run log)."
    elif run.nothing_to_do and not run.ended and not run.jobs:
        word = "finished"
        head = (
            "FINISHED, NOTHING TO DO: the newest run found every requested file present and up to date, "
            "ran no job and holds no lock."
        )
    elif not run.ended:
        word = "killed"
        head = "KILLED: the newest run stopped without closing its log (and left no lock)."
    elif run.failed:
        word = "failed"
        killed = sorted({signal_name(n) for j in failed if (n := j.killed_by()) is not None})
        head = "FAILED: the newest run ended with a failed job" + (
            f", killed by {' and '.join(killed)} (see below)." if killed else " (see below and its log)."
        )
    elif run.killed_on_request:
        word = "killed"
        head = "STOPPED: the newest run was stopped on request (Ctrl-C or kill)."
    elif run.stopping:
        word = "killed"
        head = "STOPPED: the newest run was asked to stop (SIGTERM) and exited after its running jobs" + (
            f" ({run.steps}): the next run makes the rest." if run.steps else "."
        )
    else:
        word = "finished"
        head = "FINISHED: the newest run ended and holds no lock."
    lines = [f"Workflow in {directory.resolve()} at {_clock(now)}", head]
    if orphans:
        lines.append(
            f"ORPHAN JOBS ({len(orphans)}): job processes whose Snakemake is gone still run in this directory "
            "and write their outputs:"
        )
        for j in orphans:
            since = f", started {_clock(j['started'])} ({_ago(now - j['started'])})" if j.get("started") else ""
            lines.append(f"  pid {j['pid']}: rule {j['rule']} (.snakemake/scripts/{j['script']}){since}")
        lines.append(
            f"  Wait for them to end, or end them ({end_them}), before snakemake --unlock or a new run "
            "in this directory: two processes would write the same files."
        )
    if run.path is not None:
        lines.append(f"  newest run: {run.path.relative_to(directory)}" + (f", {run.steps}" if run.steps else ""))
    running = word == "running"
    if open_jobs:
        lines.append(f"{'Running' if running else 'Interrupted'} jobs ({len(open_jobs)}), by start:")
        for j in open_jobs:
            lines.append(f"  {j.rule} (jobid {j.jobid}, started {j.started}): {_outputs(j.outputs)}")
            for lg in j.log:
                p = directory / lg
                if p.exists():
                    lines.append(f"    {lg} (written {_ago(now - p.stat().st_mtime)}): {last_line(p)}")
                else:
                    lines.append(f"    {lg}: not written yet")
    for j in failed:
        ending, log = j.ending(), ""
        if j.log:
            first, last = directory / j.log[0], last_line(directory / j.log[0])
            # a killed job's log ends where the signal stopped it: its last line is no error
            what = "its last line before the signal" if j.killed_by() is not None else "its last line"
            said = f", {what}: {last}" if last else (": empty" if first.exists() else ": not written")
            log = f"; log {', '.join(j.log)}{said}"
        lines.append(
            f"Failed: {j.rule} (jobid {j.jobid}): {_outputs(j.outputs)}" + (f"; {ending}" if ending else "") + log
        )
    known = {o for j in open_jobs for o in j.outputs}
    left = {o: t for o, t in marked.items() if o not in known}
    if left:
        what = (
            "started, not finished"
            if running
            else "interrupted: the next run reruns them (snakemake may ask for --rerun-incomplete)"
        )
        lines.append(f"Outputs marked incomplete in .snakemake/incomplete ({len(left)}; {what}):")
        for o, t in sorted(left.items(), key=lambda x: x[1])[:10]:
            lines.append(f"  {o} (since {_clock(t)})")
        if len(left) > 10:
            lines.append(f"  ... and {len(left) - 10} more")
    logs = job_logs(directory, n_logs)
    if logs:
        lines.append("Newest job logs (logs/**/*.log):")
        for p, t in logs:
            lines.append(f"  {_clock(t)}  {p.relative_to(directory)}: {last_line(p, 160)}")
    return word, lines


def summary_lines(
    directory: Path, run: RunLog, snakefile: Path | None, args: list[str] | None, plain: bool = False
) -> list[str]:
    snakefile = Path(
        snakefile or run.snakefile or (REPO_SNAKEFILE if REPO_SNAKEFILE.exists() else directory / "Snakefile")
    )
    if not snakefile.exists():
        return [f"Default target: no Snakefile at {snakefile} (pass --snakefile)"]
    own = args is None
    args = summary_args(run, directory) if own else args
    s = target_summary(directory, snakefile, args, plain=plain)
    if "error" in s:
        return ["Default target: snakemake --summary failed:", *("  " + x for x in s["error"].splitlines())]
    why = ", ".join(f"{k}: {v}" for k, v in sorted(s["why"].items()))
    lines = [
        f"Default target (snakemake --summary, {s['seconds']:.1f} s{', the newest run’s config' if own and args else ''}):",
        f"  {s['exist']} of {s['outputs']} output files exist, {s['up_to_date']} up to date"
        + (f", {s['exist'] - s['up_to_date']} to be rebuilt ({why})" if s["exist"] > s["up_to_date"] else "")
        + f"; {s['missing']} missing; a run would (re)make {s['pending']}.",
    ]
    if run.config_md5 and s.get("config_md5") and s["config_md5"] != run.config_md5:
        lines.append("  note: this config differs from the newest run's (Config MD5): pass its arguments after --")
    return lines


# Snakemake's options that say where to look (the same for the status as for the count):
# taken out of the SNAKEMAKE_ARGS, which the count gets without them.
_WHERE = {"--directory": "directory", "-d": "directory", "--snakefile": "snakefile", "-s": "snakefile"}


def split_where(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``--directory``/``-d`` and ``--snakefile``/``-s`` of Snakemake arguments (as
    ``--directory X``, ``--directory=X`` or ``-dX``; the last one given counts, as in
    Snakemake), and the other arguments in their order."""
    where, rest, i = {}, [], 0
    while i < len(words):
        w = words[i]
        name, _, value = w.partition("=") if w.startswith("--") else (w[:2], "", w[2:])
        if name in _WHERE and (value or (w == name and i + 1 < len(words))):
            where[_WHERE[name]] = value or words[i + 1]
            i += 1 if value else 2
            continue
        rest.append(w)
        i += 1
    return where, rest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m selfrepair.tooling.status",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--directory",
        "-d",
        default=None,
        help="the workflow's working directory (default: a --directory among the SNAKEMAKE_ARGS, else .)",
    )
    ap.add_argument("--logs", type=int, default=5, help="how many of the newest job logs to show (default 5)")
    ap.add_argument("--no-summary", action="store_true", help="skip snakemake --summary (files only, instant)")
    ap.add_argument(
        "--plain-summary",
        action="store_true",
        help="start snakemake --summary plainly, with every executor plugin (slower: see above)",
    )
    ap.add_argument(
        "--snakefile", "-s", default=None, help="for --summary (default: the newest run's, else the repository's)"
    )
    ap.add_argument(
        "snakemake_args",
        nargs=argparse.REMAINDER,
        help="after --: the run's snakemake options, for snakemake --summary (e.g. --configfile ...); "
        "a --directory (-d) or --snakefile (-s) among them is used as the options above",
    )
    a = ap.parse_args(argv)
    extra = a.snakemake_args[1:] if a.snakemake_args[:1] == ["--"] else a.snakemake_args
    where, extra = split_where(extra)
    for key, plural in (("directory", "directories"), ("snakefile", "Snakefiles")):
        mine, theirs = getattr(a, key), where.get(key)
        if mine is not None and theirs is not None and Path(mine).resolve() != Path(theirs).resolve():
            ap.error(f"two {plural}: --{key} {mine} and, among the snakemake arguments, {theirs}")
    directory = Path(a.directory or where.get("directory") or ".")
    if not directory.is_dir():
        ap.error(f"no directory {directory}")
    word, lines = state(directory, n_logs=a.logs)
    print("\n".join(lines), flush=True)
    if not a.no_summary:
        print(
            "Counting the default target's outputs (snakemake --summary; --no-summary, in make STATUS_ARGS=--no-summary, skips it) ...",
            flush=True,
        )
        snakefile = a.snakefile or where.get("snakefile")
        run = newest_run_log(directory)
        print("\n".join(summary_lines(directory, run, snakefile, extra or None, plain=a.plain_summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
