"""A workflow run's state as its working directory's files and /proc show it: the locks,
the newest run's own log (its jobs, how each ended, its config), the incomplete markers,
the jobs' logs, the Snakemake and orphaned job processes, and what ``snakemake --summary``
prints. Reading only; :mod:`selfrepair.tooling.status` turns it into the report (it
imports these names back: ``status.X`` works as before).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

from selfrepair.core.runtime import proc_argv, proc_stat, snakemake_ancestor

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
