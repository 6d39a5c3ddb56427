"""The workflow on one GPU in one call that fits a budget, timed part by part.

The GPU machine has Python 3.12 with torch (CUDA), transformers, pandas, scipy, seaborn
and matplotlib, and no package index: everything else travels with the working tree as
wheels, in benchmarks/gpu/wheels/ (git-ignored: pass it as a carried path).

    python benchmarks/gpu/gpu_bench.py prepare    # here, online: the wheels
    python benchmarks/gpu/gpu_bench.py check      # here, no GPU: the dry run
    python3 benchmarks/gpu/gpu_bench.py run --out DIR [--budget S]   # there (run.sh)

prepare: the lock's exact versions (requirements.lock) of what the GPU machine lacks:
Snakemake and its executor plugins, transformer_lens and its needs, captum, the project's
other dependencies, minus the closure of the packages it has (GPU_HAS) and minus
LEFT_OUT (with the reason), built for CPython 3.12 on manylinux x86-64, plus a wheel of
the project (`pip wheel --no-deps`). Large wheels are re-zipped with LZMA (the same files
and RECORD; pip reads it) so that the tree and the wheels fit the 64 MiB a call carries.

check: resolves the wheel list against the folder (every needed distribution there, at
the lock's version, for cp312/py3; every wheel's own requirements met by the folder,
GPU_HAS or LEFT_OUT; the project wheel equal to src/), then dry-runs the run's two
Snakemake steps (`snakemake -n`, the gpu profile: device cuda) and compiles the probe.
`check --plan-only` checks the wheel list against the lock without a folder.

run: installs the wheels (`pip install --no-index --no-deps --target`), then
(1) paper A's training and scoring of 2 models and one toy each of papers B and C
(PHASE1), (2) as much of the default DAG as the budget leaves (stopped at the
deadline), both `snakemake --workflow-profile workflow/profiles/gpu`. It writes
DIR/gpu_run.csv: per phase and step the jobs done, their wall and CPU seconds (the
rules' benchmark files), the GPU memory peak (torch.cuda.max_memory_allocated in each
job, via probe/sitecustomize.py), GPU utilisation (nvidia-smi pmon per job process;
per phase the device's utilization.gpu) and the same steps' CPU times from
results/reference/runtime.csv. The default budget (530 s) fills one 10-minute call; with
15 minutes of device time in all and a start that takes minutes, a first try with
BUDGET=240 (run.sh) leaves room for a second. Per-step utilisation needs pmon's pids to
be the jobs' (a container may hide them); the phase rows have the device's in any case.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # the project's stdlib-only helpers, before it is installed
from selfrepair.core.runtime import sha256_file as sha256  # noqa: E402

HERE = ROOT / "benchmarks" / "gpu"
WHEELS = HERE / "wheels"
PROBE_DIR = HERE / "probe"
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
REFERENCE = ROOT / "results" / "reference" / "runtime.csv"
PROFILE = "workflow/profiles/gpu"
PROJECT = "selfrepair"

GPU_HAS = ("torch", "transformers", "pandas", "scipy", "seaborn", "matplotlib")  # with their dependencies
# packages to ship beyond pyproject.toml's dependencies and the lock's Snakemake plugins
EXTRA_ROOTS: dict[str, str] = {}
LEFT_OUT = {
    "wandb": "transformer_lens imports it only in tools/training, which nothing here runs (20 MiB)",
    "pulp": "the ILP solver of Snakemake's default scheduler: the run passes --scheduler greedy (16 MiB)",
}
PYTHON = (3, 12)
# torch's CUDA wheels need glibc 2.28, so a machine that runs them takes manylinux_2_28.
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
CARRY_LIMIT_MB = 64.0  # MiB a call carries: the working tree and the wheels together
CARRY_MARGIN_MB = 4.0  # keep this much free
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


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------
# The wheel list: the lock, minus what the GPU machine has
# ----------------------------------------------------------------------------------
def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{canonical name: version} of requirements.lock (name==version lines)."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not m:
            raise PlanError(f"{path}:{n}: {line!r} is not a name==version pin")
        out[canon(m.group(1))] = m.group(2)
    return out


def project_dependencies(path: Path = PYPROJECT) -> list[str]:
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads(path.read_text())["project"]["dependencies"]
    return [canon(Requirement(d).name) for d in deps]


def dependencies(requires: list[str], extras: frozenset[str] = frozenset()) -> list[tuple[str, frozenset[str]]]:
    """(name, extras) of the Requires-Dist lines that apply on the GPU machine (CPython
    3.12, Linux x86-64) for a distribution installed with ``extras``."""
    from packaging.requirements import Requirement

    out = []
    for line in requires:
        r = Requirement(line)
        if r.marker is not None and not any(r.marker.evaluate({**MARKERS, "extra": e}) for e in ("", *extras)):
            continue
        out.append((canon(r.name), frozenset(r.extras)))
    return out


def closure(roots, requires_of, stop=()) -> set[str]:
    """Every distribution ``roots`` need, through ``requires_of(name) -> Requires-Dist
    lines``; the names in ``stop`` are reached but not entered."""
    seen: dict[str, frozenset[str]] = {}
    todo = [(canon(r), frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, frozenset()) | extras
        if name not in stop:
            todo.extend(dependencies(requires_of(name), seen[name]))
    return set(seen)


def installed_requires(lock: dict[str, str]):
    """requires_of from this environment's metadata, which must be the lock's."""
    import importlib.metadata as md

    from packaging.version import Version

    def requires_of(name: str) -> list[str]:
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            raise PlanError(f"{name} is not installed here: run this in the lock's environment (make env)") from None
        if name in lock and Version(d.version).public != Version(lock[name]).public:  # 2.13.0+cpu is 2.13.0
            raise PlanError(
                f"{name} is {d.version} here but {lock[name]} in requirements.lock: "
                "run this in the lock's environment (make env)"
            )
        return list(d.requires or [])

    return requires_of


@dataclass
class Plan:
    needed: dict[str, str]  # name -> the lock's version: the wheels to send
    gpu: set[str]  # what the GPU machine has (GPU_HAS and their dependencies)
    left_out: dict[str, str] = field(default_factory=dict)  # name -> why it is not sent

    def allowed(self) -> set[str]:
        return set(self.needed) | self.gpu | set(self.left_out) | {PROJECT}


def roots(lock: dict[str, str]) -> list[str]:
    plugins = [n for n in lock if n.startswith("snakemake-executor-plugin-")]
    return [*project_dependencies(), *plugins, *EXTRA_ROOTS]


def make_plan(lock: dict[str, str], requires_of, roots_: list[str]) -> Plan:
    gpu = closure(GPU_HAS, requires_of)
    want = closure(roots_, requires_of, stop=set(LEFT_OUT))
    needed = sorted(want - gpu - set(LEFT_OUT) - {PROJECT})
    missing = [n for n in needed if n not in lock]
    if missing:
        raise PlanError(f"needed but not pinned in {LOCK.name}: {', '.join(missing)}")
    return Plan({n: lock[n] for n in needed}, gpu, {n: r for n, r in LEFT_OUT.items() if n in want})


def lock_plan() -> Plan:
    lock = read_lock()
    return make_plan(lock, installed_requires(lock), roots(lock))


# ----------------------------------------------------------------------------------
# Wheels: tags, metadata, the folder check
# ----------------------------------------------------------------------------------
def supported_tags() -> set:
    from packaging import tags

    plats = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    cp = tags.cpython_tags(PYTHON, abis=[f"cp{PYTHON[0]}{PYTHON[1]}", "abi3", "none"], platforms=plats)
    return set(cp) | set(tags.compatible_tags(PYTHON, f"cp{PYTHON[0]}{PYTHON[1]}", plats))


def wheel_name(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file for the GPU machine; PlanError if it is
    not a wheel or not one CPython 3.12 on manylinux x86-64 installs."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, wtags = parse_wheel_filename(filename)
    except InvalidWheelFilename as err:
        raise PlanError(f"{filename}: not a wheel ({err})") from None
    if not wtags & supported_tags():
        raise PlanError(f"{filename}: no tag CPython 3.12 on manylinux x86-64 installs ({', '.join(map(str, wtags))})")
    return canon(name), str(version)


def wheel_metadata(path: Path) -> dict:
    """Name, Version and Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(meta) != 1:
            raise PlanError(f"{path.name}: {len(meta)} .dist-info/METADATA files")
        msg = Parser().parsestr(z.read(meta[0]).decode())
    return {"name": canon(msg["Name"]), "version": msg["Version"], "requires": msg.get_all("Requires-Dist") or []}


def check_folder(folder: Path, plan: Plan, src: Path = ROOT / "src") -> list[str]:
    """What is wrong with ``folder`` as the wheels for ``plan`` (empty: nothing)."""
    from packaging.requirements import Requirement

    problems = []
    manifest_file = folder / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else {"wheels": []}
    if not manifest_file.exists():
        problems.append(f"{folder}/manifest.json is missing (made by prepare)")
    listed = {w["file"]: w for w in manifest["wheels"]}
    found: dict[str, tuple[str, Path]] = {}
    for p in sorted(folder.glob("*.whl")):
        try:
            name, version = wheel_name(p.name)
        except PlanError as err:
            problems.append(str(err))
            continue
        if name in found:
            problems.append(f"two wheels of {name}: {found[name][1].name}, {p.name}")
        found[name] = (version, p)
        if p.name not in listed:
            problems.append(f"{p.name} is not in manifest.json")
        elif listed[p.name]["sha256"] != sha256(p):
            problems.append(f"{p.name} differs from the file manifest.json lists (sha256)")
    for name, version in plan.needed.items():
        if name not in found:
            problems.append(f"no wheel of {name}=={version}")
        elif found[name][0] != version:
            problems.append(f"{found[name][1].name}: {name} {found[name][0]}, the lock has {version}")
    for name in set(found) - set(plan.needed) - {PROJECT}:
        problems.append(f"{found[name][1].name}: {name} is not needed (the GPU machine has it or it is left out)")
    if PROJECT not in found:
        problems.append(f"no wheel of the project ({PROJECT}): run prepare")
    versions = {n: v for n, (v, _) in found.items()}
    for name, (_, p) in found.items():
        meta = wheel_metadata(p)
        if meta["name"] != name or meta["version"] != versions[name]:
            problems.append(f"{p.name}: its METADATA says {meta['name']} {meta['version']}")
        for line in meta["requires"]:
            r = Requirement(line)
            if r.marker is not None and not r.marker.evaluate(MARKERS):
                continue
            dep = canon(r.name)
            if dep in versions and not r.specifier.contains(versions[dep], prereleases=True):
                problems.append(f"{p.name} needs {line}, the folder has {dep} {versions[dep]}")
            elif dep not in versions and dep not in plan.gpu and dep not in plan.left_out:
                problems.append(f"{p.name} needs {dep}: not in the folder, not on the GPU machine, not left out")
    if PROJECT in found:
        problems += check_project_wheel(found[PROJECT][1], src)
    return problems


def check_project_wheel(path: Path, src: Path = ROOT / "src") -> list[str]:
    """The project wheel holds exactly src/selfrepair's Python files, byte for byte."""
    with zipfile.ZipFile(path) as z:
        inside = {n: z.read(n) for n in z.namelist() if n.startswith(f"{PROJECT}/") and n.endswith(".py")}
    here = {str(p.relative_to(src)): p.read_bytes() for p in sorted((src / PROJECT).rglob("*.py"))}
    stale = sorted(n for n in set(here) | set(inside) if here.get(n) != inside.get(n))
    if stale:
        return [f"{path.name} is not this tree's src/ ({len(stale)} files differ, e.g. {stale[0]}): run prepare again"]
    return []


def tree_bytes() -> int:
    """Bytes of the working tree a call carries: tracked and untracked-not-ignored files."""
    r = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return sum((ROOT / f).stat().st_size for f in r.stdout.decode().split("\0") if f and (ROOT / f).is_file())


def size_report(folder: Path) -> tuple[float, float, list[str]]:
    """(wheels MiB, tree MiB, problems) for the carry limit."""
    wheels = sum(p.stat().st_size for p in folder.glob("*")) / 2**20
    tree = tree_bytes() / 2**20
    problems = []
    if wheels + tree > CARRY_LIMIT_MB - CARRY_MARGIN_MB:
        problems.append(
            f"wheels {wheels:.1f} MiB + tree {tree:.1f} MiB = {wheels + tree:.1f} MiB: over "
            f"{CARRY_LIMIT_MB - CARRY_MARGIN_MB:.0f} of the {CARRY_LIMIT_MB:.0f} MiB a call carries"
        )
    return wheels, tree, problems


# ----------------------------------------------------------------------------------
# prepare (here, online)
# ----------------------------------------------------------------------------------
def _pip(*args: str, cwd: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd[:8]), "..." if len(cmd) > 8 else "", flush=True)
    r = subprocess.run(cmd, cwd=cwd)
    if r.returncode:
        raise PlanError(f"pip {args[0]} failed ({r.returncode})")


def repack_lzma(src: Path, dst: Path) -> None:
    """``src`` re-zipped with LZMA: the same members, bytes and CRCs (verified)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_LZMA) as zo:
        for info in zi.infolist():
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_LZMA
            zo.writestr(out, zi.read(info))
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
        if [(i.filename, i.CRC, i.file_size) for i in a.infolist()] != [
            (i.filename, i.CRC, i.file_size) for i in b.infolist()
        ] or b.testzip() is not None:
            raise PlanError(f"re-zipping {src.name} changed its contents")


def prepare(folder: Path = WHEELS) -> int:
    from packaging.utils import parse_sdist_filename

    plan = lock_plan()
    stage = folder / ".stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "built").mkdir(parents=True)
    # --no-deps: the list is complete already. Without --only-binary pip still takes a
    # wheel whenever one fits cp312/manylinux, an sdist only where PyPI has no wheel: those
    # are built here and must come out pure Python (checked by wheel_name below).
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    _pip(
        "download", "--no-deps", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
        *plats, "-d", str(stage), *(f"{n}=={v}" for n, v in plan.needed.items()),
    )  # fmt: skip
    for sdist in sorted(p for p in stage.iterdir() if p.name.endswith((".tar.gz", ".zip"))):
        name, version = parse_sdist_filename(sdist.name)
        print(f"{sdist.name}: no wheel on the index; building one (it must be pure Python)", flush=True)
        _pip("wheel", "--no-deps", "-w", str(stage / "built"), str(sdist))
        sdist.unlink()
    for p in (stage / "built").glob("*.whl"):
        p.rename(stage / p.name)
    with tempfile.TemporaryDirectory() as tmp:  # build from a copy: setuptools writes build/ in the tree
        shutil.copy(PYPROJECT, tmp)
        shutil.copytree(ROOT / "src", Path(tmp) / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(stage), tmp)
    entries = []
    for p in sorted(stage.glob("*.whl")):
        name, version = wheel_name(p.name)
        dst = folder / p.name
        repacked = p.stat().st_size > REPACK_OVER
        if repacked:
            repack_lzma(p, dst)
        else:
            shutil.copy(p, dst)
        entries.append(
            {
                "file": p.name,
                "name": name,
                "version": version,
                "sha256": sha256(dst),
                "index_sha256": sha256(p),
                "bytes": dst.stat().st_size,
                "index_bytes": p.stat().st_size,
                "repacked_lzma": repacked,
            }
        )
    keep = {e["file"] for e in entries} | {"manifest.json"}
    for p in folder.iterdir():
        if p.is_file() and p.name not in keep:
            p.unlink()
    shutil.rmtree(stage)
    manifest = {
        "lock_sha256": sha256(LOCK),
        "python": "3.12",
        "platforms": list(PLATFORMS),
        "gpu_has": sorted(plan.gpu),
        "left_out": plan.left_out,
        "wheels": entries,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return check(folder, steps=False)


# ----------------------------------------------------------------------------------
# check (here, no GPU): the dry run
# ----------------------------------------------------------------------------------
def snakemake_argv(python: str, targets=(), dry: bool = False) -> list[str]:
    """One step of the run: the gpu profile (device cuda), the greedy scheduler (pulp is
    left out), the targets (none: the default DAG)."""
    return [python, "-m", "snakemake", *(["-n"] if dry else []), "--workflow-profile", PROFILE,
            "--scheduler", "greedy", *targets]  # fmt: skip


def profile_config() -> dict[str, str]:
    import yaml

    prof = yaml.safe_load((ROOT / PROFILE / "profile.yaml").read_text())
    return dict(str(c).split("=", 1) for c in prof.get("config", []))


def check_steps() -> list[str]:
    """Dry-run both Snakemake steps from a scratch folder holding config/ (as the tests of
    the documents do), and compile the probe."""
    import py_compile

    problems = []
    if profile_config().get("device") != "cuda":
        problems.append(f"{PROFILE}/profile.yaml does not set device=cuda")
    with tempfile.TemporaryDirectory() as tmp:
        for f in (PROBE_DIR / "sitecustomize.py", Path(__file__)):
            try:
                py_compile.compile(str(f), cfile=str(Path(tmp) / f"{f.stem}.pyc"), doraise=True)
            except py_compile.PyCompileError as err:
                problems.append(str(err))
    r = subprocess.run(["bash", "-n", str(HERE / "run.sh")], capture_output=True, text=True)
    if r.returncode:
        problems.append(f"run.sh: {r.stderr.strip()}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env["HF_HUB_OFFLINE"] = "1"
    env["SELFREPAIR_ASSUME_CUDA"] = "1"  # device=cuda, planned here without a GPU (workflow/rules/common.smk)
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
            for t in targets:
                if t not in out:
                    problems.append(f"{name}: the plan does not make {t}")
    return problems


def check(folder: Path = WHEELS, steps: bool = True, plan_only: bool = False) -> int:
    plan = lock_plan()
    print(
        f"wheel list: {len(plan.needed)} distributions from {LOCK.name} "
        f"(the GPU machine has {len(plan.gpu)}; left out: {', '.join(plan.left_out) or 'none'})"
    )
    problems = []
    if not plan_only:
        if not (folder / "manifest.json").exists() and not any(folder.glob("*.whl")):
            problems.append(f"{folder} holds no wheels: run `bash benchmarks/gpu/run.sh prepare` first")
        else:
            problems += check_folder(folder, plan)
            wheels, tree, size_problems = size_report(folder)
            problems += size_problems
            print(f"carried: wheels {wheels:.1f} MiB + tree {tree:.1f} MiB = {wheels + tree:.1f} MiB")
    if steps:
        problems += check_steps()
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    print("dry run:", "FAILED" if problems else "ok", flush=True)
    return 1 if problems else 0


# ----------------------------------------------------------------------------------
# run (on the GPU machine)
# ----------------------------------------------------------------------------------
def install(folder: Path, site: Path, use_pip: bool | None = None) -> None:
    """Every wheel of ``folder`` into ``site`` (no index, no dependency resolution: the
    folder is the resolved list); without pip, unpacked as the wheel format says."""
    wheels = sorted(folder.glob("*.whl"))
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    if use_pip is None:
        use_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if use_pip:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*cmd, "--disable-pip-version-check", "--target", str(site), *map(str, wheels)], check=True)
        return
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(site)
        for data in site.glob("*.data"):
            for sub in ("purelib", "platlib"):
                if (data / sub).is_dir():
                    shutil.copytree(data / sub, site, dirs_exist_ok=True)
            shutil.rmtree(data)


class Sampler:
    """nvidia-smi in the background: the device's utilisation and memory every 0.5 s,
    and per process (pmon) SM utilisation and frame-buffer memory every second."""

    def __init__(self, out: Path):
        self.device_file, self.pmon_file = out / "nvidia_smi.csv", out / "nvidia_pmon.txt"
        q = ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        self.procs, self.files = [], []
        for cmd, path in (
            (q + ["-lms", "500"], self.device_file),
            (["nvidia-smi", "pmon", "-s", "um"], self.pmon_file),
        ):
            f = open(path, "w")
            self.files.append(f)
            try:
                self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))
            except OSError as err:
                f.write(f"# not started: {err}\n")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.files:
            f.close()


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


def benchmark_files(root: Path = ROOT / "benchmarks") -> set[Path]:
    return {p for p in root.rglob("*.tsv") if HERE not in p.parents}


def read_benchmarks(files, phase: str, root: Path = ROOT / "benchmarks") -> list[dict]:
    """One row per job of the rules' benchmark files: phase, part, step, s, cpu_s."""
    import pandas as pd

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_summary import part_and_step

    rows = []
    for f in sorted(files):
        t = pd.read_csv(f, sep="\t")
        if t.empty or "s" not in t:
            continue
        part, step = part_and_step(f, root)
        rows.append({"phase": phase, "part": part, "step": step, "s": float(t["s"].iloc[-1]),
                     "cpu_s": float(t["cpu_time"].iloc[-1])})  # fmt: skip
    return rows


RULE_STEPS = {"coax_lm_train": ("coax", "pruning_train"), "coax_pruning": ("coax", "pruning_run")}


def rule_step(rule: str) -> tuple[str, str]:
    """(part, step) of a rule as results/reference/runtime.csv names it (from the rule's
    benchmark file: benchmarks/runtime_summary.py)."""
    if rule in RULE_STEPS:
        return RULE_STEPS[rule]
    if rule.startswith("heroes_grid_"):
        return "heroes_grid", rule.removeprefix("heroes_grid_")
    part, _, step = rule.partition("_")
    return part, step


def read_probe(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_pmon(text: str) -> list[dict]:
    """Samples of ``nvidia-smi pmon -s um``: pid, sm (%), fb (MiB); '-' as None. The
    columns are read from the header (they differ between drivers)."""
    cols, out = None, []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if "pid" in words and cols is None:
                cols = words
            continue
        words = line.split()
        if cols is None or len(words) < len(cols) - 1:
            continue
        rec = dict(zip(cols, words))
        if not rec.get("pid", "-").isdigit():
            continue

        def num(k):
            v = rec.get(k, "-")
            return float(v) if re.fullmatch(r"[\d.]+", v) else None

        out.append({"pid": int(rec["pid"]), "sm": num("sm"), "fb": num("fb")})
    return out


def parse_device(text: str) -> list[dict]:
    """Samples of ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used``."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append({"t": t, "util": float(parts[1]), "mem": float(parts[2])})
        except ValueError:
            continue
    return out


# gpu_run.csv. A step row (phase step1/step2): its jobs done (benchmark files), their
# summed, mean and longest wall seconds and summed CPU seconds; the largest
# max_memory_allocated / max_memory_reserved of its jobs (MiB); the mean and largest SM
# utilisation pmon saw for its processes (a sample of '-' counts as 0); ref_*: the same
# step in results/reference/runtime.csv (the CPU run), per job, and times this run's jobs;
# speedup: the reference's wall per job / this run's. A phase's `all` row (and install):
# its elapsed seconds, the device's utilization.gpu and memory.used (MiB) over it.
TABLE_COLUMNS = [
    "phase", "part", "step", "status", "jobs", "wall_s", "wall_per_job_s", "longest_job_s", "cpu_s",
    "gpu_mem_peak_mib", "gpu_mem_reserved_peak_mib", "gpu_util_mean_pct", "gpu_util_max_pct", "util_from",
    "ref_jobs", "ref_wall_per_job_s", "ref_cpu_per_job_s", "ref_wall_same_jobs_s", "speedup",
]  # fmt: skip


def build_table(phases: list[dict], bench: list[dict], probes: list[dict], pmon: list[dict], device: list[dict],
                reference):  # fmt: skip
    """One row per (phase, part, step) with jobs done, then one per phase: see the module's
    docstring. ``phases``: name, start, end, status; ``reference``: runtime.csv."""
    import pandas as pd

    ref = reference.set_index(["part", "step"])
    rows = []
    for ph in phases:
        in_phase = [p for p in probes if p.get("cuda") and ph["start"] <= p["start"] <= ph["end"]]
        samples = [d for d in device if ph["start"] <= d["t"] <= ph["end"]]
        steps = sorted({(b["part"], b["step"]) for b in bench if b["phase"] == ph["name"]})
        jobs_ref = 0.0
        for part, step in steps:
            b = [x["s"] for x in bench if x["phase"] == ph["name"] and (x["part"], x["step"]) == (part, step)]
            c = [x["cpu_s"] for x in bench if x["phase"] == ph["name"] and (x["part"], x["step"]) == (part, step)]
            pr = [p for p in in_phase if rule_step(p["rule"] or "") == (part, step)]
            sm = [s["sm"] or 0.0 for s in pmon if s["pid"] in {p["pid"] for p in pr}]
            row = {"phase": ph["name"], "part": part, "step": step, "status": ph["status"], "jobs": len(b),
                   "wall_s": sum(b), "wall_per_job_s": sum(b) / len(b), "longest_job_s": max(b), "cpu_s": sum(c),
                   "gpu_mem_peak_mib": max((p["max_allocated"] for p in pr), default=None),
                   "gpu_mem_reserved_peak_mib": max((p["max_reserved"] for p in pr), default=None),
                   "gpu_util_mean_pct": sum(sm) / len(sm) if sm else None, "gpu_util_max_pct": max(sm, default=None),
                   "util_from": "pmon sm% of the step's processes" if sm else ""}  # fmt: skip
            for k in ("gpu_mem_peak_mib", "gpu_mem_reserved_peak_mib"):
                row[k] = row[k] / 2**20 if row[k] is not None else None
            if (part, step) in ref.index:
                r = ref.loc[(part, step)]
                row.update(ref_jobs=int(r["jobs"]), ref_wall_per_job_s=r["wall_s"] / r["jobs"],
                           ref_cpu_per_job_s=r["cpu_s"] / r["jobs"])  # fmt: skip
                row["ref_wall_same_jobs_s"] = row["ref_wall_per_job_s"] * len(b)
                row["speedup"] = row["ref_wall_per_job_s"] / row["wall_per_job_s"] if row["wall_per_job_s"] else None
                jobs_ref += row["ref_wall_same_jobs_s"]
            rows.append(row)
        util = [d["util"] for d in samples]
        total = {"phase": ph["name"], "part": "all", "step": "all", "status": ph["status"],
                 "jobs": sum(r["jobs"] for r in rows if r["phase"] == ph["name"] and r["part"] != "all"),
                 "wall_s": ph["end"] - ph["start"], "cpu_s": sum(x["cpu_s"] for x in bench if x["phase"] == ph["name"]),
                 "gpu_mem_peak_mib": max((d["mem"] for d in samples), default=None),
                 "gpu_util_mean_pct": sum(util) / len(util) if util else None, "gpu_util_max_pct": max(util, default=None),
                 "util_from": "nvidia-smi utilization.gpu (device); memory: memory.used" if util else "",
                 "ref_wall_same_jobs_s": jobs_ref or None}  # fmt: skip
        rows.append(total)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    numeric = [c for c in TABLE_COLUMNS if c not in ("phase", "part", "step", "status", "util_from")]
    table[numeric] = table[numeric].apply(pd.to_numeric)
    return table.round(2)


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
for d in ("torch", "transformers", "pandas", "scipy", "seaborn", "matplotlib", "numpy", "snakemake",
          "transformer-lens", "selfrepair"):
    try:
        print(d, md.version(d))
    except md.PackageNotFoundError:
        print(d, "absent")
"""


def run(out: Path, budget: float, folder: Path = WHEELS) -> int:
    import pandas as pd

    t0 = time.time()
    deadline = t0 + budget - TABLE_RESERVE_S
    out.mkdir(parents=True, exist_ok=True)
    if sys.version_info[:2] != PYTHON:
        raise SystemExit(f"the wheels are for Python {PYTHON[0]}.{PYTHON[1]}; this is {sys.version.split()[0]}")
    problems = check_project_wheel(next(folder.glob(f"{PROJECT}-*.whl"), folder / "none"))
    if not any(folder.glob(f"{PROJECT}-*.whl")) or problems:
        raise SystemExit(f"{folder}: {problems or 'no project wheel'}: run prepare here, carry the folder")
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
    sampler = Sampler(out)
    before = benchmark_files()
    bench = []
    try:
        for name, targets in (("step1", PHASE1), ("step2", ())):
            if deadline - time.time() < 20:
                phases.append({"name": name, "start": time.time(), "end": time.time(), "status": "no time left"})
                continue
            cmd = snakemake_argv(sys.executable, targets)
            ph = run_snakemake(cmd, env, deadline, out / f"snakemake_{name}.log")
            phases.append({"name": name, **ph})
            now = benchmark_files()
            bench += read_benchmarks(now - before, name)
            before = now
            print(f"{name}: {ph['status']} after {ph['end'] - ph['start']:.0f} s", flush=True)
    finally:
        sampler.stop()
    reference = pd.read_csv(REFERENCE)
    pmon = parse_pmon(sampler.pmon_file.read_text()) if sampler.pmon_file.exists() else []
    device = parse_device(sampler.device_file.read_text()) if sampler.device_file.exists() else []
    table = build_table(phases, bench, read_probe(out / "probe.jsonl"), pmon, device, reference)
    table.to_csv(out / "gpu_run.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.to_string(index=False))
    logs = out / "logs"
    for f in sorted((ROOT / "logs").rglob("*.log")) if (ROOT / "logs").exists() else []:
        if f.stat().st_size < 200_000:
            (logs / f.relative_to(ROOT / "logs")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, logs / f.relative_to(ROOT / "logs"))
    done = all((ROOT / t).exists() for t in PHASE1)
    print("step 1 complete" if done else "step 1 INCOMPLETE: see snakemake_step1.log", flush=True)
    return 0 if done else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="download and build the wheels (online)")
    c = sub.add_parser("check", help="the dry run: the wheel list, the folder, the Snakemake steps")
    c.add_argument("--plan-only", action="store_true", help="check the wheel list against the lock, no folder")
    c.add_argument("--no-steps", action="store_true", help="skip the Snakemake dry runs")
    r = sub.add_parser("run", help="on the GPU machine")
    r.add_argument("--out", type=Path, required=True, help="the folder whose files come back")
    r.add_argument("--budget", type=float, default=530, help="seconds for the whole call (default 530)")
    for p in (c, r, sub.choices["prepare"]):
        p.add_argument("--wheels", type=Path, default=WHEELS)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "prepare":
            a.wheels.mkdir(parents=True, exist_ok=True)
            return prepare(a.wheels)
        if a.cmd == "check":
            return check(a.wheels, steps=not a.no_steps, plan_only=a.plan_only)
        return run(a.out, a.budget, a.wheels)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
