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
from contextlib import contextmanager
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
    return device


NUMERICS_RECORD: dict | None = None  # set by start() in a compute job: what decided its floats
JOB: dict | None = None  # set by start() in a workflow job: job_record(snakemake)
# Where a job records what it wrote: one JSON per output, named by the output's path,
# under the working directory (the results tree holds the outputs only).
RECORDS = Path(".selfrepair") / "records"
_TRACKED = False
_FAILED = False


class TableChanged(RuntimeError):
    """An input of a rule is not what the rule that wrote it wrote."""


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
        hook = sys.excepthook

        def failed(*exc):
            global _FAILED
            _FAILED = True
            hook(*exc)

        sys.excepthook = failed
        atexit.register(lambda: None if _FAILED else write_records(JOB))
    return JOB


def content_sha256(path) -> str:
    """A file's SHA-256; a folder's: the SHA-256 of its files' relative paths and digests
    (less the ``.snakemake_timestamp`` Snakemake puts in a ``directory()`` output after its job)."""
    import hashlib

    path = Path(path)
    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for rel, digest in folder_files(path).items():
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def folder_files(path) -> dict[str, str]:
    """{relative path: SHA-256} of a folder's files, by path (less Snakemake's
    ``.snakemake_timestamp``): what a folder output's record holds, so that a check names
    the table in it that changed."""
    path = Path(path)
    files = sorted(q for q in path.rglob("*") if q.is_file() and q.name != ".snakemake_timestamp")
    return {f.relative_to(path).as_posix(): sha256_file(f) for f in files}


def folder_changes(recorded: dict, now: dict) -> list[str]:
    """What differs between a folder's recorded files and its files now, one phrase each
    (edited, gone, added), by relative path."""
    out = [f"{n} edited" for n in sorted(set(recorded) & set(now)) if recorded[n] != now[n]]
    out += [f"{n} gone" for n in sorted(set(recorded) - set(now))]
    return out + [f"{n} added" for n in sorted(set(now) - set(recorded))]


def is_model_folder(path) -> bool:
    """A model folder (its ``selfrepair.json`` beside the weights): each load checks its files."""
    return Path(path).is_dir() and (Path(path) / "selfrepair.json").is_file()


def record_path(output) -> Path | None:
    """Where the record of ``output`` lives (None: an output outside the working directory)."""
    rel = os.path.normpath(os.path.relpath(os.path.abspath(str(output))))
    if rel.startswith(".."):
        return None
    return RECORDS / (rel + ".json")


def write_records(job: dict | None) -> None:
    """The record of each output of ``job`` that exists (see :func:`track`)."""
    for out in (job or {}).get("outputs", []):
        rec = record_path(out)
        if rec is None or not Path(out).exists():
            continue
        entry = {k: job[k] for k in ("rule", "wildcards", "params_sha256")}
        if Path(out).is_dir() and not is_model_folder(out):  # a folder of tables: each by name
            entry["files"] = folder_files(out)
        write_json(rec, {"file": out, **entry, "sha256": content_sha256(out)})


def check_inputs(smk, under: str = "results", strict: bool = True) -> list[str]:
    """Refuse (TableChanged, naming the file and the fix) an input under ``under`` whose
    content differs from what its rule wrote (its record), or that has no record (not
    written by a rule of this workflow in this folder). Returns one line per checked input,
    for the job's log. What the published claims and the figures call before reading.
    Not ``strict`` (what every job checks first, :func:`track`): files and folders of
    tables with a record only; model folders (each load checks its ``selfrepair.json``)
    and files without one (committed checkpoints' logs seeded into a results tree) are
    left to the job. A changed folder is reported by the tables in it that changed."""
    lines = []
    for inp in map(str, smk.input):
        rel = os.path.normpath(os.path.relpath(os.path.abspath(inp)))
        if rel.split(os.sep)[0] != under or not Path(inp).exists():
            continue
        rec = record_path(inp)
        if not strict and (rec is None or not rec.is_file() or is_model_folder(inp)):
            continue
        if rec is None or not rec.is_file():
            raise TableChanged(
                f"{inp} has no record of the rule that wrote it ({rec}): it was not written by this "
                "workflow's rule in this folder (put there by hand or copied?), so the verdicts and figures "
                f"made from it cannot be trusted. Delete {inp} and rerun snakemake: its rule writes it again"
            )
        want = _read_record(rec, inp)
        now = content_sha256(inp)
        if now != want.get("sha256"):
            rule = want.get("rule", "?")
            what = f"{inp} changed since rule {rule} wrote it"
            if Path(inp).is_dir() and isinstance(want.get("files"), dict):
                what += f" ({'; '.join(folder_changes(want['files'], folder_files(inp)))})"
            raise TableChanged(
                f"{what} (sha256 {want.get('sha256')} recorded in {rec}, "
                f"{now} now): a table that another rule reads must be what its rule wrote. "
                f"Undo the edit, or rerun its rule: snakemake --forcerun {rule} (the rules that read it rerun too)"
            )
        lines.append(f"checked {inp}: sha256 {now[:16]} as rule {want.get('rule')} wrote it")
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


def _read_record(rec: Path, inp: str) -> dict:
    """The record ``rec`` of input ``inp``; TableChanged, naming both and the way out, when
    it is not a JSON object (cut short by a full disk, edited by hand)."""
    fix = f"Delete {inp} and rerun snakemake: its rule writes it and its record again"
    try:
        want = json.loads(rec.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableChanged(f"{rec}, the record of {inp}, is not valid JSON ({err}), so nothing shows "
                           f"{inp} is what its rule wrote. {fix}") from None  # fmt: skip
    if not isinstance(want, dict) or not isinstance(want.get("sha256"), str):
        raise TableChanged(f"{rec}, the record of {inp}, holds no sha256 of its content (a JSON "
                           f"{type(want).__name__} without one), so nothing shows {inp} is what its rule wrote. {fix}")  # fmt: skip
    return want


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


@contextmanager
def atomic_path(path):
    """A fresh temporary path beside ``path`` that replaces ``path`` when the block ends
    without an error (a crash never leaves half a file; on an error it is removed).

    The file gets the permissions a plain ``open(path, "w")`` gives (0o666 less the
    umask, and any default ACL), not ``tempfile.mkstemp``'s 0o600, which would hide
    results from the other users of a shared cluster. Every atomic write goes through here.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:  # mode 0o666: the kernel applies the umask, as for open()
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path) -> str:
    """The SHA-256 hex digest of the file at ``path``, read in 1 MiB blocks (weights, wheels)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path, obj) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"missing file: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"corrupted JSON file {path}: {err}") from err


def save_tensors(path, tensors: dict) -> None:
    """torch.save of a dict of tensors (and plain values), atomically."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: the archive's
        torch.save(tensors, f)  # inner name is fixed, not the random temporary name


def load_tensors(path) -> dict:
    """Load a file written by ``save_tensors`` with ``weights_only=True`` (safe)."""
    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing file: {path}")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise ValueError(f"corrupted tensor file {path}: {err}") from err
