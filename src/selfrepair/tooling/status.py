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
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# What the report reads (the run's files and processes) lives in run_state; its names stay
# importable from here (status.parse_run_log, status.job_processes, ...).
from selfrepair.tooling.run_state import (  # noqa: F401
    MISSING,
    Job,
    RunLog,
    decode_marker,
    incomplete_outputs,
    job_logs,
    job_processes,
    last_line,
    locks,
    newest_run_log,
    parse_configfiles,
    parse_run_log,
    parse_summary,
    signal_name,
    snakemake_processes,
    summary_args,
)

REPO_SNAKEFILE = Path(__file__).resolve().parents[3] / "Snakefile"


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


def _headline(lk: dict, procs, orphans: list[dict], run: RunLog, failed: list, now: float) -> tuple[str, str]:
    """The state word and the report's first line, from the locks, the Snakemake
    processes, the orphaned job processes and the newest run's log."""
    end_them = f"kill {' '.join(str(j['pid']) for j in orphans)}"
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
    else:
        word, head = _ended_headline(run, failed)
    return word, head


def _ended_headline(run: RunLog, failed: list) -> tuple[str, str]:
    """The state word and first line of a directory that no run holds (no lock)."""
    if run.path is None:
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
    return word, head


def _orphan_lines(orphans: list[dict], now: float) -> list[str]:
    """The report's lines on job processes whose Snakemake is gone (none if none)."""
    if not orphans:
        return []
    end_them = f"kill {' '.join(str(j['pid']) for j in orphans)}"
    lines = [
        f"ORPHAN JOBS ({len(orphans)}): job processes whose Snakemake is gone still run in this directory "
        "and write their outputs:"
    ]
    for j in orphans:
        since = f", started {_clock(j['started'])} ({_ago(now - j['started'])})" if j.get("started") else ""
        lines.append(f"  pid {j['pid']}: rule {j['rule']} (.snakemake/scripts/{j['script']}){since}")
    lines.append(
        f"  Wait for them to end, or end them ({end_them}), before snakemake --unlock or a new run "
        "in this directory: two processes would write the same files."
    )
    return lines


def _job_lines(directory: Path, open_jobs: list, failed: list, running: bool, now: float) -> list[str]:
    """The report's lines on the newest run's running (or interrupted) jobs, with their
    logs' last lines, and on its failed jobs, with how each ended."""
    lines = []
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
    return lines


def _leftover_lines(directory: Path, marked: dict, open_jobs: list, running: bool, n_logs: int) -> list[str]:
    """The report's lines on outputs marked incomplete that no open job makes, and on the
    newest job logs."""
    lines = []
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
    return lines


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
    open_jobs = [j for j in run.jobs.values() if j.state == "running" and j.rule != "all"]
    failed = [j for j in run.jobs.values() if j.state == "failed"]
    word, head = _headline(lk, procs, orphans, run, failed, now)
    lines = [f"Workflow in {directory.resolve()} at {_clock(now)}", head]
    lines += _orphan_lines(orphans, now)
    if run.path is not None:
        lines.append(f"  newest run: {run.path.relative_to(directory)}" + (f", {run.steps}" if run.steps else ""))
    running = word == "running"
    lines += _job_lines(directory, open_jobs, failed, running, now)
    lines += _leftover_lines(directory, marked, open_jobs, running, n_logs)
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
