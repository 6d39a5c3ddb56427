"""The workflow on one GPU in one call that fits a budget, timed part by part.

The GPU machine has Python 3.12 with pip, torch (CUDA), transformers, pandas, scipy,
seaborn and matplotlib, and no package index: everything else travels with the working
tree as wheels, in benchmarks/gpu/wheels/ (git-ignored: pass it as a carried path).

    python benchmarks/gpu/gpu_bench.py prepare    # here, online: the wheels
    python benchmarks/gpu/gpu_bench.py check      # here, no GPU: the dry run
    python3 benchmarks/gpu/gpu_bench.py run --out DIR [--budget S]   # there (run.sh)

pip does the packaging, for CPython 3.12 on manylinux x86-64 (TARGET), at the lock's
versions (-c requirements.lock). prepare: `pip wheel --no-deps` of the project, `pip
download --only-binary=:all: --platform ... --python-version 3.12` of it and the lock's
Snakemake plugins with all they need (`pip wheel` first of what the index has only as an
sdist: `pip install --dry-run --report`), pinned with hashes in wheels/requirements.txt.
check: `pip install --dry-run --ignore-installed --no-index --find-links --require-hashes`
of the pins for TARGET, then `snakemake -n` of the run's two steps (gpu profile: cuda).
run: `pip install --no-index --no-deps --require-hashes --target`.

What pip cannot do, and this file does:
- know what the GPU machine has: image-packages.txt beside this file lists it (IMAGE).
  prepare resolves the run's requirements (the project, the plugins, GPU_HAS) at the
  lock's versions and writes placeholder wheels of those on that list and of LEFT_OUT
  (wheels/gpu-has/: name, version+gpu, no files, no requirements). pip takes them for
  those (a local version ranks above the index's), so their dependencies stay out (the
  image brings its own); they are never installed. Everything else needed travels: check
  refuses a placeholder of a distribution the list does not have.
- evaluate environment markers for another Python: pip evaluates them for the one it
  runs under, whatever --python-version says (pypa/pip#11010). So it runs under a Python
  3.12 (`pip --python`: PYTHON312, python3.12 on PATH, or pyenv's); prepare needs one.
- fit the carry: wheels over 1 MiB are re-zipped with LZMA (the same files and RECORD;
  pip reads it); the tree and the wheels must fit the 64 MiB a call carries.
- tell this tree's project wheel from another of the same version: check compares the
  wheel's files with src/.

run: installs the wheels, runs (1) paper A's training and scoring of 2 models and one toy
each of papers B and C (PHASE1), (2) as much of the default DAG as the budget leaves, both
`snakemake --workflow-profile workflow/profiles/gpu`, and writes DIR/gpu_run.csv
(gpu_measure.py). The default budget (530 s) fills one 10-minute call; BUDGET=240 leaves
room for a second try in 15 minutes of device time.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "benchmarks" / "gpu"
sys.path[:0] = [str(ROOT / "src"), str(HERE)]  # the project's stdlib-only helpers, before it is installed
from gpu_measure import Sampler, benchmark_files, read_benchmarks, write_table  # noqa: E402
from packaging.utils import canonicalize_name as canon  # noqa: E402

from selfrepair.core.runtime import sha256_file as sha256  # noqa: E402

WHEELS = HERE / "wheels"
PROBE_DIR = HERE / "probe"
LOCK = ROOT / "requirements.lock"
REFERENCE = ROOT / "results" / "reference" / "runtime.csv"
PROFILE = "workflow/profiles/gpu"
PROJECT = "selfrepair"

GPU_HAS = ("torch", "transformers", "pandas", "scipy", "seaborn", "matplotlib")  # the run uses the image's
IMAGE = HERE / "image-packages.txt"  # what the GPU machine's image has (read from ../shared/gpu/)
LEFT_OUT = {
    "wandb": "transformer_lens imports it only in tools/training, which nothing here runs (20 MiB)",
    "pulp": "the ILP solver of Snakemake's default scheduler: the run passes --scheduler greedy (16 MiB)",
}
PYTHON = (3, 12)
# torch's CUDA wheels need glibc 2.28, so a machine that runs them takes manylinux_2_28 and older.
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + [f"manylinux{y}_x86_64" for y in (2014, 2010, 1)]
TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
TARGET += [a for p in PLATFORMS for a in ("--platform", p)]
CARRY_LIMIT_MB = 64.0  # MiB a call carries: the working tree and the wheels together
CARRY_MARGIN_MB = 8.0  # keep this much free: at most 56 MiB carried
REPACK_OVER = 1 << 20  # re-zip wheels above 1 MiB with LZMA

# Step 1: paper A's training and scoring for 2 models, one toy each of papers B and C
# (trained, then scored), at the default config's paths (step 2 reuses them).
PHASE1 = (
    "results/heroes/reverse/seed42/gradients.csv",
    "results/heroes/sort/seed42/gradients.csv",
    "results/coax/ioi/seed1/truth.csv",
    "results/gim/ioi/l2h4/seed0/localization.csv",
)
TABLE_RESERVE_S = 30  # seconds kept at the end of the budget for the table and the logs
STOP_GRACE_S = 20  # seconds Snakemake gets to stop its jobs before they are killed


class PlanError(RuntimeError):
    pass


# -------------------- The wheels, by pip -----------------------------------------
def image_packages(path: Path = IMAGE) -> set[str]:
    """The distributions the GPU machine's image has (canonical names)."""
    return {canon(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


# The GPU machine's markers: its requirements are evaluated for this environment.
GPU_MARKERS = {
    "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}  # fmt: skip


def run_roots() -> list[str]:
    """What the run installs: the project and the lock's Snakemake executor plugins."""
    lock = re.findall(r"^([A-Za-z0-9][\w.-]*)==", LOCK.read_text(), re.M)
    return [PROJECT, *sorted({canon(n) for n in lock if canon(n).startswith("snakemake-executor-plugin-")})]


def needed_distributions(roots=None, image: set[str] | None = None) -> dict[str, str]:
    """Every distribution the run needs, from the installed distributions' metadata (this
    environment holds the lock), with its requirements evaluated for the GPU machine
    (GPU_MARKERS): name -> 'image' (the image has it; its own requirements are the image's),
    'left out' (LEFT_OUT) or 'carried' (it must travel as a wheel)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    image = image_packages() if image is None else image
    seen: dict[str, str] = {}
    extras_seen: set[tuple[str, str]] = set()
    todo = [(canon(r), "") for r in (roots or run_roots())]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in extras_seen:
            continue
        extras_seen.add((name, extra))
        where = "image" if name in image else "left out" if name in LEFT_OUT else "carried"
        seen[name] = where
        if where != "carried":
            continue
        for text in metadata.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**GPU_MARKERS, "extra": extra}):
                todo += [(canon(req.name), e) for e in ("", *sorted(req.extras))]
    return seen


def python312() -> str | None:
    """A Python 3.12 for pip to run under: this one, PYTHON312, python3.12 or pyenv's."""
    if sys.version_info[:2] == PYTHON:
        return sys.executable
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = [os.environ.get("PYTHON312"), shutil.which("python3.12"), *glob.glob(f"{pyenv}/versions/3.12*/bin/python3")]
    ok = "import sys; assert sys.version_info[:2] == (3, 12)"
    return next((c for c in found if c and subprocess.run([c, "-c", ok], capture_output=True).returncode == 0), None)


def pip(*args, python: str | None = None, report: bool = False) -> list[dict]:
    """``pip ARGS`` (under ``python``); with ``report``, what it resolved (--report's
    install list). PlanError with pip's message where it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", *(["--python", python] if python else []), *map(str, args)]
        cmd += ["--disable-pip-version-check", *(["--report", f"{tmp}/report.json"] if report else [])]
        print("+ pip", *map(str, args[:6]), "..." if len(args) > 6 else "", flush=True)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode:
            lines = [line for line in r.stdout.splitlines() if line.strip() and "is ignored: it is neither" not in line]
            first = next((i for i, line in enumerate(lines) if line.startswith("ERROR")), max(0, len(lines) - 30))
            raise PlanError(f"pip {args[0]} failed ({r.returncode}):\n" + "\n".join(lines[first:]))
        return json.loads(Path(tmp, "report.json").read_text())["install"] if report else []


def write_pins(folder: Path) -> Path:
    """folder/requirements.txt: name==version --hash=sha256:... of its wheels."""
    pins: dict[str, list[str]] = {}
    for p in sorted(folder.glob("*.whl")):
        name, version = p.name.split("-")[:2]
        pins.setdefault(f"{canon(name)}=={version}", []).append(f"--hash=sha256:{sha256(p)}")
    (folder / "requirements.txt").write_text("".join(f"{k} {' '.join(h)}\n" for k, h in pins.items()))
    return folder / "requirements.txt"


def placeholders(folder: Path, dists: dict[str, str]) -> Path:
    """Wheels that stand for what the GPU machine has: name and version+gpu, nothing else
    (the same bytes each time), pinned in folder/requirements.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in dists.items():
        stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}+gpu"
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+gpu\n"
        wheel = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as z:
            for f, text in (("METADATA", meta), ("WHEEL", wheel), ("RECORD", "")):
                z.writestr(zipfile.ZipInfo(f"{stem}.dist-info/{f}"), text)
    return write_pins(folder)


def repack_lzma(src: Path, dst: Path) -> None:
    """``src`` re-zipped with LZMA: the same members, bytes and CRCs (verified)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_LZMA) as zo:
        for info in zi.infolist():
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr, out.compress_type = info.external_attr, zipfile.ZIP_LZMA
            zo.writestr(out, zi.read(info))
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
        members = [[(i.filename, i.CRC, i.file_size) for i in z.infolist()] for z in (a, b)]
        if members[0] != members[1] or b.testzip() is not None:
            raise PlanError(f"re-zipping {src.name} changed its contents")


def prepare(folder: Path = WHEELS) -> int:
    if not (py := python312()):
        raise PlanError("no Python 3.12 for pip to evaluate the GPU machine's markers with: set PYTHON312")
    lock = {canon(n): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==([^\s;#]+)", LOCK.read_text(), re.M)}
    shutil.rmtree(folder, ignore_errors=True)
    stage, has = folder / ".stage", folder / "gpu-has"
    built = stage / "built"  # wheels built here; stage: what pip download takes
    built.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:  # build from a copy: setuptools writes build/ in the tree
        shutil.copy(ROOT / "pyproject.toml", tmp)
        shutil.copytree(ROOT / "src", Path(tmp) / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        pip("wheel", "--no-deps", "--no-build-isolation", "-w", built, tmp)
    roots = [*built.glob(f"{PROJECT}-*.whl"), *sorted(n for n in lock if n.startswith("snakemake-executor-plugin-"))]
    # All the run needs, at the lock's versions; those the image has become placeholders.
    needed = pip("install", "--dry-run", "--ignore-installed", "-c", LOCK, *roots, *GPU_HAS, python=py, report=True)
    image = image_packages()
    found = {canon(d["metadata"]["name"]): d["metadata"]["version"] for d in needed}
    there = {n: v for n, v in found.items() if n in image} | {n: lock[n] for n in LEFT_OUT}
    placeholders(has, there)
    # --only-binary=:all: (which --platform needs) takes no sdist: where the index has only
    # one, its wheel is built here first (check says whether it fits the target). Without
    # the placeholders: a build would take them for its setuptools.
    for d in needed:
        if canon(d["metadata"]["name"]) not in there and not d["download_info"]["url"].endswith(".whl"):
            pip("wheel", "--no-deps", "-w", built, d["download_info"]["url"], python=py)
    pip("download", *TARGET, "-c", LOCK, "--find-links", has, "--find-links", built, "-d", stage, *roots, python=py)
    for p in sorted(stage.glob("*.whl")):
        if "+gpu-" not in p.name:  # pip copies the placeholders it took
            (repack_lzma if p.stat().st_size > REPACK_OVER else shutil.copy)(p, folder / p.name)
    shutil.rmtree(stage)
    write_pins(folder)
    return check(folder, steps=False)


def check_folder(folder: Path, src: Path = ROOT / "src", lock: Path = LOCK, image: Path = IMAGE) -> list[str]:
    """What is wrong with ``folder`` as the GPU machine's wheels (empty: nothing): pip
    resolves the run offline from the wheels and the placeholders, and each placeholder
    stands for a distribution the image has (``image``) or one LEFT_OUT."""
    pins, has = folder / "requirements.txt", folder / "gpu-has"
    if not pins.exists() or not (has / "requirements.txt").exists():
        return [f"{folder}: no requirements.txt or gpu-has/: run `bash benchmarks/gpu/run.sh prepare`"]
    on_image = image_packages(image) | set(LEFT_OUT)
    absent = sorted(
        n for n in re.findall(r"^([\w.-]+)==", (has / "requirements.txt").read_text(), re.M) if n not in on_image
    )
    if absent:
        why = f"not on the GPU machine ({image.name}) nor LEFT_OUT: they must travel as wheels"
        return [f"gpu-has/ takes {', '.join(absent)} to be there, {why}: run prepare again"]
    if not (py := python312()):
        print("note: no Python 3.12 here, so pip evaluates the markers for this Python", file=sys.stderr)
    offline = ["install", "--isolated", "--dry-run", "--ignore-installed", "--no-index", "--require-hashes", *TARGET]
    args = ["--find-links", folder, "--find-links", has, "-c", lock, "-r", pins, "-r", has / "requirements.txt"]
    try:
        used = pip(*offline, *args, python=py, report=True)
    except PlanError as err:
        return [f"the folder does not resolve for the GPU machine: {err}"]
    names = {Path(unquote(urlparse(d["download_info"]["url"]).path)).name for d in used}
    why = "pip does not take it (not pinned, or not for the target)"
    problems = [f"{p.name}: {why}" for p in sorted(folder.glob("*.whl")) if p.name not in names]
    project = next((p for p in folder.glob(f"{PROJECT}-*.whl") if p.name in names), None)
    return problems + (check_project_wheel(project, src) if project else [f"no wheel of the project ({PROJECT})"])


def check_project_wheel(path: Path, src: Path = ROOT / "src") -> list[str]:
    """The project wheel holds exactly src/selfrepair's Python files, byte for byte."""
    with zipfile.ZipFile(path) as z:
        inside = {n: z.read(n) for n in z.namelist() if n.startswith(f"{PROJECT}/") and n.endswith(".py")}
    here = {str(p.relative_to(src)): p.read_bytes() for p in sorted((src / PROJECT).rglob("*.py"))}
    stale = sorted(n for n in set(here) | set(inside) if here.get(n) != inside.get(n))
    if stale:
        return [f"{path.name} is not this tree's src/ ({len(stale)} files differ, e.g. {stale[0]}): run prepare again"]
    return []


def size_report(folder: Path) -> tuple[float, float, list[str]]:
    """(wheels MiB, tree MiB, problems) against the carry limit; the tree is what a call
    carries: tracked and untracked-not-ignored files."""
    ls = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(ls, cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file()) / 2**20
    wheels = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
    room = CARRY_LIMIT_MB - CARRY_MARGIN_MB
    over = f"wheels {wheels:.1f} + tree {tree:.1f} MiB: over {room:.0f} of the {CARRY_LIMIT_MB:.0f} MiB a call carries"
    return wheels, tree, [over] if wheels + tree > room else []


# -------------------- check (here, no GPU): the dry run --------------------------
def snakemake_argv(python: str, targets=(), dry: bool = False) -> list[str]:
    """One step of the run: the gpu profile (device cuda), the greedy scheduler (pulp is
    left out), the targets (none: the default DAG)."""
    return [python, "-m", "snakemake", *(["-n"] if dry else []), "--workflow-profile", PROFILE,
            "--scheduler", "greedy", *targets]  # fmt: skip


def check_steps() -> list[str]:
    """Dry-run both Snakemake steps from a scratch folder holding config/ (as the tests of
    the documents do); compile the probe and this file; parse run.sh."""
    import yaml

    problems = []
    prof = yaml.safe_load((ROOT / PROFILE / "profile.yaml").read_text())
    if "device=cuda" not in prof.get("config", []):
        problems.append(f"{PROFILE}/profile.yaml does not set device=cuda")
    for f in (PROBE_DIR / "sitecustomize.py", Path(__file__), HERE / "gpu_measure.py"):
        try:
            compile(f.read_text(), str(f), "exec")
        except SyntaxError as err:
            problems.append(f"{f.name}: {err}")
    r = subprocess.run(["bash", "-n", str(HERE / "run.sh")], capture_output=True, text=True)
    problems += [f"run.sh: {r.stderr.strip()}"] if r.returncode else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env.update(HF_HUB_OFFLINE="1", SELFREPAIR_ASSUME_CUDA="1")  # device=cuda planned without a GPU (common.smk)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "config", Path(tmp) / "config")
        for name, targets in (("step 1", PHASE1), ("step 2", ())):
            cmd = snakemake_argv(sys.executable, targets, dry=True)
            cmd[4:4] = ["--directory", tmp]
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            out = r.stdout + r.stderr
            if r.returncode:
                problems.append(f"{name}: snakemake -n failed:\n{out[-2000:]}")
                continue
            jobs = re.search(r"^total\s+(\d+)$", out, re.M)
            print(f"{name}: snakemake -n plans {jobs.group(1) if jobs else '?'} jobs", flush=True)
            problems += [f"{name}: the plan does not make {t}" for t in targets if t not in out]
    return problems


def check_needed(folder: Path) -> list[str]:
    """Every distribution the run needs (needed_distributions) is carried in ``folder``
    or on the image; the carried ones are exactly those."""
    if not (folder / "requirements.txt").exists():
        return []
    sent = set(re.findall(r"^([\w.-]+)==", (folder / "requirements.txt").read_text(), re.M))
    carried = {n for n, where in needed_distributions().items() if where == "carried"}
    problems = [f"{n} is needed, not on the GPU machine ({IMAGE.name}) and not carried" for n in sorted(carried - sent)]
    return problems + [f"{n} is carried but the run does not need it" for n in sorted(sent - carried)]


def check(folder: Path = WHEELS, steps: bool = True) -> int:
    problems = check_folder(folder) + (check_needed(folder) if folder == WHEELS else [])
    if folder.exists():
        wheels, tree, over = size_report(folder)
        print(f"carried: wheels {wheels:.1f} MiB + tree {tree:.1f} MiB = {wheels + tree:.1f} MiB")
        problems += over
    problems += check_steps() if steps else []
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    print("dry run:", "FAILED" if problems else "ok", flush=True)
    return 1 if problems else 0


# -------------------- run (on the GPU machine) -----------------------------------
def install(folder: Path, site: Path) -> None:
    """The pinned wheels of ``folder`` into ``site``: no index, no resolution (check did it)."""
    shutil.rmtree(site, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--require-hashes", "--find-links", folder, "--target", site, "-r", folder / "requirements.txt"]
    subprocess.run(list(map(str, cmd)), check=True)


def run_snakemake(cmd: list[str], env: dict, deadline: float, log: Path) -> dict:
    """Run one step until it ends or ``deadline``; then Snakemake is asked to stop (SIGINT:
    it cancels its jobs), and killed with them after STOP_GRACE_S."""
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        status = "finished"
        try:
            p.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            status = "stopped at the deadline"
            p.send_signal(signal.SIGINT)
            try:
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if status == "finished" and p.returncode:
        status = f"failed ({p.returncode})"
    return {"start": t0, "end": time.time(), "status": status, "returncode": p.returncode}


# What the run's environment is: each import (a failing transformer_lens still lets paper
# A's steps run), CUDA, and the versions that differ from the lock on the GPU machine.
SMOKE = """
import importlib, importlib.metadata as md
for mod in ("torch", "snakemake", "selfrepair", "transformer_lens", "captum", "datasets"):
    try:
        importlib.import_module(mod)
        print("import", mod, "ok")
    except Exception as err:
        print("import", mod, "FAILED", type(err).__name__, err)
import torch
ok = torch.cuda.is_available()
print("cuda", ok, torch.version.cuda, torch.cuda.get_device_name(0) if ok else "-")
for d in ("torch", "transformers", "pandas", "scipy", "seaborn", "matplotlib", "numpy", "snakemake", "transformer-lens",
          "selfrepair"):
    try:
        print(d, md.version(d))
    except md.PackageNotFoundError:
        print(d, "absent")
"""


def run(out: Path, budget: float, folder: Path = WHEELS) -> int:
    t0 = time.time()
    deadline = t0 + budget - TABLE_RESERVE_S
    out.mkdir(parents=True, exist_ok=True)
    if sys.version_info[:2] != PYTHON:
        raise SystemExit(f"the wheels are for Python {PYTHON[0]}.{PYTHON[1]}; this is {sys.version.split()[0]}")
    project = next(folder.glob(f"{PROJECT}-*.whl"), None)
    problems = check_project_wheel(project) if project else ["no project wheel"]
    if problems:
        raise SystemExit(f"{folder}: {problems}: run prepare here, carry the folder")
    site = Path(tempfile.gettempdir()) / "selfrepair-gpu-site"
    install(folder, site)
    phases = [{"name": "install", "start": t0, "end": time.time(), "status": "finished"}]
    env = dict(os.environ, HF_HUB_OFFLINE="1", SELFREPAIR_GPU_PROBE=str(out / "probe.jsonl"))
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(PROBE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(site / "bin"), os.environ.get("PATH", "")])
    (out / "probe.jsonl").unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-c", SMOKE], env=env, cwd=ROOT, capture_output=True, text=True)
    pip_check = subprocess.run([sys.executable, "-m", "pip", "check"], env=env, capture_output=True, text=True)
    (out / "environment.txt").write_text(r.stdout + r.stderr + "\n$ pip check\n" + pip_check.stdout)
    print(r.stdout + r.stderr, flush=True)
    if r.returncode or "cuda True" not in r.stdout or re.search(r"import (snakemake|selfrepair) FAILED", r.stdout):
        print("Snakemake or the project does not import, or there is no CUDA: see environment.txt", file=sys.stderr)
        return 1
    sampler, before, bench = Sampler(out), benchmark_files(), []
    try:
        for name, targets in (("step1", PHASE1), ("step2", ())):
            if deadline - time.time() < 20:
                phases.append({"name": name, "start": time.time(), "end": time.time(), "status": "no time left"})
                continue
            ph = run_snakemake(snakemake_argv(sys.executable, targets), env, deadline, out / f"snakemake_{name}.log")
            phases.append({"name": name, **ph})
            now = benchmark_files()
            bench += read_benchmarks(now - before, name)
            before = now
            print(f"{name}: {ph['status']} after {ph['end'] - ph['start']:.0f} s", flush=True)
    finally:
        sampler.stop()
    write_table(out, phases, bench, sampler, REFERENCE)
    for f in sorted((ROOT / "logs").rglob("*.log")) if (ROOT / "logs").exists() else []:
        if f.stat().st_size < 200_000:
            (out / "logs" / f.relative_to(ROOT / "logs")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, out / "logs" / f.relative_to(ROOT / "logs"))
    done = all((ROOT / t).exists() for t in PHASE1)
    print("step 1 complete" if done else "step 1 INCOMPLETE: see snakemake_step1.log", flush=True)
    return 0 if done else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="resolve, download and pin the wheels (online; pip under a Python 3.12)")
    c = sub.add_parser("check", help="the dry run: the folder resolved by pip offline, the Snakemake steps")
    c.add_argument("--no-steps", action="store_true", help="skip the Snakemake dry runs")
    r = sub.add_parser("run", help="on the GPU machine")
    r.add_argument("--out", type=Path, required=True, help="the folder whose files come back")
    r.add_argument("--budget", type=float, default=530, help="seconds for the whole call (default 530)")
    for s in (p, c, r):
        s.add_argument("--wheels", type=Path, default=WHEELS)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "prepare":
            return prepare(a.wheels)
        if a.cmd == "check":
            return check(a.wheels, steps=not a.no_steps)
        return run(a.out, a.budget, a.wheels)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
