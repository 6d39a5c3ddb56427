"""What every rule script does first, and safe file helpers.

A job started by Snakemake (``runtime.start`` or ``runtime.compute_setup``) also arms
a watchdog (``watch_snakemake``): when the Snakemake process that launched it dies
(``kill -9``, the out-of-memory killer), the job ends too, with its own children, so
that no orphan goes on writing outputs that the next run writes as well.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path


def start(smk) -> str | None:
    """Log to the rule's log file; for a rule with ``params.device`` (one that computes),
    use the rule's threads in torch and resolve the device ('cpu' or 'cuda').

    Rules without a device (tables, figures) never import torch, so they start fast.
    """
    if smk.log:
        Path(smk.log[0]).parent.mkdir(parents=True, exist_ok=True)
        sys.stderr = open(smk.log[0], "w", buffering=1)
    watch_snakemake()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    device = compute_setup(smk)
    logging.info("rule %s on %s with %d threads", getattr(smk, "rule", "?"), device, smk.threads)
    return device


def compute_setup(smk) -> str | None:
    """For a rule with ``params.device`` (one that computes): resolve the device, put the
    rule's numerics mode in force (``params.numerics``; it fails loudly when the pins are
    not), set torch's threads, and log what decided the job's floats.

    Every job that calls it (or ``start``) ends when its Snakemake dies (``watch_snakemake``)."""
    watch_snakemake()
    track(smk)
    device = getattr(smk.params, "device", None)
    if device is None:
        return None
    from selfrepair.core import numerics
    from selfrepair.core.device import resolve_device

    mode = getattr(smk.params, "numerics", None)
    if mode is None:
        raise ValueError(f"rule {getattr(smk, 'rule', '?')} computes (params.device) but has no params.numerics")
    device = resolve_device(device)
    numerics.apply(mode, smk.threads, device)
    global NUMERICS_RECORD
    NUMERICS_RECORD = numerics.record(mode, device)
    print("numerics:", json.dumps(NUMERICS_RECORD, sort_keys=True), file=sys.stderr, flush=True)
    count_flops(os.environ.get(FLOPS_ENV))
    return device


FLOPS_ENV = "SELFREPAIR_FLOPS_OUT"  # a JSON-lines file: count this job's matmul FLOPs into it
_COUNTING = False
_FAILED = False  # set by watch_failure's hook: this process ends by an uncaught exception


def count_flops(out: str | None) -> bool:
    """With ``out`` a path (the environment's :data:`FLOPS_ENV`, set by
    benchmarks/bench_lm_floor.py), count every matmul FLOP this process runs from here on
    (torch's FLOP formulas, ``torch.utils.flop_counter``: linear layers, matmuls and the
    unembedding, forward and backward; not the CPU's fused attention kernels) and, when it
    ends without an error, append one line to ``out``: {"rule", "wildcards", "flops",
    "cpu_s"} (the process's CPU seconds, counting included). The counting slows the job:
    its times are not the job's. Counted by :class:`selfrepair.core.flops.MatmulFlops`.
    Once per process; False when not counting."""
    global _COUNTING
    if not out or _COUNTING:
        return False
    import atexit
    import resource

    from selfrepair.core.flops import MatmulFlops

    counter = MatmulFlops()
    counter.__enter__()
    _COUNTING = True
    job = dict(JOB or {})
    watch_failure()

    def write():
        counter.__exit__(None, None, None)
        if _FAILED:
            return
        ru = resource.getrusage(resource.RUSAGE_SELF)
        line = {"rule": job.get("rule", "?"), "wildcards": job.get("wildcards", {}),
                "flops": float(counter.total), "cpu_s": ru.ru_utime + ru.ru_stime}  # fmt: skip
        with open(out, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")

    atexit.register(write)
    return True


def watch_failure() -> None:
    """Set ``_FAILED`` when this process ends by an uncaught exception, so that what it
    writes at exit (its tables' records, its FLOP line) is not written for a failed job:
    one hook before the one in place, armed once however many callers ask."""
    if getattr(sys.excepthook, "selfrepair_failure", False):
        return
    hook = sys.excepthook

    def failed(*exc):
        global _FAILED
        _FAILED = True
        hook(*exc)

    failed.selfrepair_failure = True
    sys.excepthook = failed


# safe file helpers (core.files) and the records of what each job wrote, and the checks of what it reads (core.records),
# importable from here as the rule scripts call them (runtime.check_inputs)
from selfrepair.core.files import (  # noqa: E402, F401
    atomic_path,
    load_tensors,
    read_json,
    save_tensors,
    sha256_file,
    write_json,
)
from selfrepair.core.records import (  # noqa: E402, F401
    RECORDS,
    TableChanged,
    check_inputs,
    content_sha256,
    folder_changes,
    folder_files,
    is_model_folder,
    record_path,
    write_records,
)

NUMERICS_RECORD: dict | None = None  # set by start() in a compute job: what decided its floats
JOB: dict | None = None  # set by start() in a workflow job: job_record(snakemake)
_TRACKED = False


def track(smk) -> dict:
    """Name this job (``JOB``) and, in a job Snakemake launched, check the files it reads
    that other rules wrote (:func:`check_inputs`, not strict), and record each of its
    outputs when it ends without an error: the rule, wildcards and parameters' SHA-256 that
    wrote it, and its content's SHA-256. Once per process."""
    global JOB, _TRACKED
    JOB = job_record(smk)
    if not _TRACKED and _launched_from_snakemake_scripts():
        import atexit

        check_inputs(smk, strict=False)
        _TRACKED = True
        watch_failure()
        atexit.register(lambda: None if _FAILED else write_records(JOB))
    return JOB


def job_record(smk) -> dict:
    """What names a workflow job: its rule, its wildcards, the SHA-256 of the parameters
    the rule passed it (its slice of the config), and its input and output paths."""
    import hashlib

    def items(x):
        try:
            return dict(x.items())
        except (AttributeError, TypeError):
            return {}

    params = json.dumps(items(getattr(smk, "params", None)), sort_keys=True, default=str)

    def paths(x):
        try:
            return [os.path.normpath(str(f)) for f in x]
        except TypeError:
            return []

    return {
        "rule": str(getattr(smk, "rule", "?")),
        "wildcards": {k: str(v) for k, v in items(getattr(smk, "wildcards", None)).items()},
        "params_sha256": hashlib.sha256(params.encode()).hexdigest(),
        "inputs": paths(getattr(smk, "input", [])),
        "outputs": paths(getattr(smk, "output", [])),
    }


def numerics_record() -> dict:
    """The numerics record of this compute job (stored beside its results)."""
    if NUMERICS_RECORD is None:
        raise RuntimeError("runtime.start() has not run in a compute job")
    return NUMERICS_RECORD


def cuda_available() -> bool:
    """Whether torch will find CUDA on this machine (what device 'auto' resolves to),
    cheaply: without a GPU device node (NVIDIA, WSL's dxg, ROCm's kfd) no, without
    importing torch; with one, torch decides (it honours CUDA_VISIBLE_DEVICES). Where
    torch is not importable (snakemake in its own env, jobs in conda), a node means yes.
    """
    dev = Path("/dev")
    if not any(next(dev.glob(p), None) for p in ("nvidia[0-9]*", "dxg", "kfd")):
        return False
    try:
        import torch
    except ImportError:
        return True
    return bool(torch.cuda.is_available())


# ----------------------------------------------------------------------------------
# A job ends when its Snakemake dies
# ----------------------------------------------------------------------------------
ORPHAN_EXIT = 3  # the exit status of a job stopped because its Snakemake died
WATCH_INTERVAL = 1.0  # seconds between two looks at the Snakemake process
WATCHDOG_ENV = "SELFREPAIR_WATCHDOG"  # set to 0 to never arm the watchdog
_WATCHED: int | None = None  # the Snakemake pid this process watches, once armed


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks since boot) of a process, from
    /proc/<pid>/stat; None when it is gone or /proc cannot tell (not Linux)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    rest = text[text.rindex(")") + 2 :].split()  # the name (field 2) may hold spaces and ')'
    return rest[0], int(rest[1]), int(rest[19])


def proc_argv(pid: int) -> list[str]:
    """A process's command line ([] when gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def _is_cmd(argv: list[str], name: str) -> bool:
    """Whether ``argv`` runs the command ``name`` (``name ...``, ``python .../name ...``
    or ``python -m name ...``)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == name:
        return True
    if not os.path.basename(argv[0]).startswith("python"):
        return False
    args = argv[1:4]
    return (len(args) > 0 and os.path.basename(args[0]) == name) or any(
        args[i] == "-m" and args[i + 1] == name for i in range(len(args) - 1)
    )


def is_snakemake(argv: list[str]) -> bool:
    return _is_cmd(argv, "snakemake")


def is_pytest(argv: list[str]) -> bool:
    return _is_cmd(argv, "pytest") or _is_cmd(argv, "py.test")


def snakemake_ancestor(pid: int | None = None) -> int | None:
    """The nearest Snakemake process above ``pid`` (default: this process) on this
    machine, walking the parent chain (through any shell between them). None when there
    is none (run by hand, by pytest, by a SLURM step without a Snakemake on this node),
    when a pytest process comes first, or where /proc cannot tell."""
    st = proc_stat(os.getpid() if pid is None else pid)
    for _ in range(64):
        if st is None or st[1] <= 0:
            return None
        parent = st[1]
        argv = proc_argv(parent)
        if is_pytest(argv):
            return None
        if is_snakemake(argv):
            return parent
        if parent == 1:
            return None
        st = proc_stat(parent)
    return None


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if p.name.isdigit() and (st := proc_stat(int(p.name))) is not None:
            children.setdefault(st[1], []).append(int(p.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        c = todo.pop()
        out.append(c)
        todo += children.get(c, [])
    return out


def _orphaned(why: str) -> None:
    """Say why on the job's stderr (its log), end this job's children, exit at once."""
    try:
        print(
            f"selfrepair: {why}; ending this job (pid {os.getpid()}) so that it writes no more outputs",
            file=sys.stderr,
            flush=True,
        )
    except Exception:
        pass
    for c in descendants(os.getpid()):
        try:
            os.kill(c, signal.SIGKILL)
        except OSError:
            pass
    os._exit(ORPHAN_EXIT)


def _launched_from_snakemake_scripts() -> bool:
    """Whether this process runs a script Snakemake wrote (.snakemake/scripts/tmp*.py)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return script is not None and script.parent.name == "scripts" and script.parent.parent.name == ".snakemake"


def watch_snakemake(interval: float = WATCH_INTERVAL) -> int | None:
    """In a job launched by Snakemake on this machine: watch that Snakemake process from a
    daemon thread (every ``interval`` s), and when it is gone (killed, its pid reused,
    a zombie) end this job and its children with one line on stderr (exit status
    ``ORPHAN_EXIT``). Returns the watched pid, or None where nothing is armed: no
    Snakemake above this process (a script run by hand or by pytest, a SLURM step without
    one on this node), a pytest process in between, this process being Snakemake or
    pytest, no /proc, or ``SELFREPAIR_WATCHDOG=0``. Arms once per process.

    A Snakemake script job whose Snakemake died before it got here (it has been handed to
    init, pid 1) ends at once."""
    global _WATCHED
    if _WATCHED is not None:
        return _WATCHED
    if os.environ.get(WATCHDOG_ENV, "1") == "0" or proc_stat(os.getpid()) is None:
        return None
    me = proc_argv(os.getpid())
    if is_snakemake(me) or is_pytest(me) or "_pytest" in sys.modules:
        return None
    pid = snakemake_ancestor()
    if pid is None:
        if os.getppid() == 1 and _launched_from_snakemake_scripts():
            _orphaned("the Snakemake that launched this job died before the job started")
        return None
    st = proc_stat(pid)
    if st is None or st[0] in "ZX":
        _orphaned(f"Snakemake (pid {pid}) that runs this job is gone")
    started = st[2]

    def watch() -> None:
        while True:
            time.sleep(interval)
            now = proc_stat(pid)
            if now is None or now[2] != started or now[0] in "ZX":
                _orphaned(f"Snakemake (pid {pid}) that ran this job is gone (killed?)")

    threading.Thread(target=watch, name="selfrepair-snakemake-watchdog", daemon=True).start()
    _WATCHED = pid
    return pid
