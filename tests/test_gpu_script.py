"""benchmarks/gpu (the GPU run in one call) checked on the CPU: the wheel list against the
lock, the folder check on made-up wheels, the LZMA re-zip and both installs, the probe,
the table, and the dry run of the run's Snakemake steps; the prepared folder itself
when there is one (`bash benchmarks/gpu/run.sh prepare`)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu" / "gpu_bench.py")
gb = importlib.util.module_from_spec(_spec)
sys.modules["gpu_bench"] = gb
_spec.loader.exec_module(gb)


@pytest.fixture(scope="module")
def plan():
    return gb.lock_plan()


def test_the_wheel_list_is_the_lock_minus_what_the_gpu_machine_has(plan):
    lock = gb.read_lock()
    assert all(lock[n] == v for n, v in plan.needed.items())
    for n in ("snakemake", "snakemake-executor-plugin-slurm", "transformer-lens", "datasets", "pyarrow", "captum"):
        assert n in plan.needed, n
    for n in (*gb.GPU_HAS, "numpy", "huggingface-hub", "tokenizers", "safetensors", "pyyaml", "jinja2"):
        assert n in plan.gpu and n not in plan.needed, n
    assert set(plan.left_out) == {"wandb", "pulp"} and not set(plan.left_out) & set(plan.needed)
    assert "opentelemetry-sdk" not in plan.needed, "wandb's own dependencies travel although wandb does not"
    requires_of = gb.installed_requires(lock)
    for name in plan.needed:  # closed: every requirement is sent, on the GPU machine, or left out
        for dep, _ in gb.dependencies(requires_of(name)):
            assert dep in plan.allowed(), f"{name} needs {dep}"


def test_a_drift_from_the_lock_is_an_error():
    lock = gb.read_lock()
    with pytest.raises(gb.PlanError, match="snakemake is 9.* here but 0.1 in requirements.lock"):
        gb.make_plan({**lock, "snakemake": "0.1"}, gb.installed_requires({**lock, "snakemake": "0.1"}), ["snakemake"])
    short = {n: v for n, v in lock.items() if n != "yte"}
    with pytest.raises(gb.PlanError, match="not pinned in requirements.lock: yte"):
        gb.make_plan(short, gb.installed_requires(short), ["snakemake"])


def test_markers_are_read_for_python_3_12_on_linux():
    deps = gb.dependencies(
        ['a; python_version < "3.12"', 'b; python_version >= "3.12"', 'c; sys_platform == "win32"', 'd; extra == "x"']
    )
    assert [n for n, _ in deps] == ["b"]
    assert [n for n, _ in gb.dependencies(['d; extra == "x"'], frozenset({"x"}))] == ["d"]


@pytest.mark.parametrize(
    "name, ok",
    [
        ("pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl", True),
        ("pyyaml-6.0.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
        ("attrs-26.1.0-py3-none-any.whl", True),
        ("x-1.0-cp311-abi3-manylinux_2_17_x86_64.whl", True),
        ("x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", False),
        ("x-1.0-cp312-cp312-manylinux_2_34_x86_64.whl", False),
        ("x-1.0-cp312-cp312-musllinux_1_2_x86_64.whl", False),
        ("x-1.0-cp312-cp312-manylinux_2_28_aarch64.whl", False),
        ("x-1.0-cp312-cp312-macosx_11_0_arm64.whl", False),
        ("x-1.0.tar.gz", False),
    ],
)
def test_only_wheels_for_cpython_3_12_on_manylinux_x86_64(name, ok):
    if ok:
        assert gb.wheel_name(name)[0] in ("pyarrow", "pyyaml", "attrs", "x")
    else:
        with pytest.raises(gb.PlanError):
            gb.wheel_name(name)


def make_wheel(folder: Path, name: str, version: str, requires=(), tag="py3-none-any", files=None) -> Path:
    path = folder / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f, text in (files or {f"{name}/__init__.py": f"VERSION = {version!r}\n"}).items():
            z.writestr(f, text)
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def write_manifest(folder: Path) -> None:
    wheels = [{"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in folder.glob("*.whl")]
    (folder / "manifest.json").write_text(json.dumps({"wheels": wheels}))


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    (src / "selfrepair").mkdir(parents=True)
    (src / "selfrepair" / "__init__.py").write_text("X = 1\n")
    d = tmp_path / "wheels"
    d.mkdir()
    make_wheel(d, "alpha", "1.0", ["beta>=2", "torch>=2.6", 'wandb; python_version >= "3.9"', 'nope; os_name == "nt"'])
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "selfrepair", "0.1.0", ["alpha", "torch==2.13.0"], files={"selfrepair/__init__.py": "X = 1\n"})
    write_manifest(d)
    plan = gb.Plan({"alpha": "1.0", "beta": "2.0"}, {"torch"}, {"wandb": "not used"})
    return d, plan, src


def test_a_complete_folder_passes(folder):
    d, plan, src = folder
    assert gb.check_folder(d, plan, src) == []


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda d: (d / "beta-2.0-py3-none-any.whl").unlink(), r"no wheel of beta==2\.0"),
        (lambda d: make_wheel(d, "gamma", "1.0"), r"gamma is not needed|not in manifest"),
        (lambda d: make_wheel(d, "beta", "2.1"), r"two wheels of beta"),
        (lambda d: make_wheel(d, "alpha", "1.0", ["gamma"]), r"needs gamma: not in the folder"),
        (lambda d: make_wheel(d, "alpha", "1.0", ["beta<2"]), r"needs beta<2, the folder has beta 2\.0"),
        (lambda d: make_wheel(d, "selfrepair", "0.1.0", files={"selfrepair/__init__.py": "X = 2\n"}), "not this tree"),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    ],
)
def test_the_folder_check_names_what_is_wrong(folder, change, problem):
    d, plan, src = folder
    change(d)
    problems = gb.check_folder(d, plan, src)
    assert any(re.search(problem, p) for p in problems), problems


def test_a_wrong_version_or_platform_is_caught(folder):
    d, plan, src = folder
    (d / "beta-2.0-py3-none-any.whl").unlink()
    make_wheel(d, "beta", "2.1", tag="cp312-cp312-macosx_11_0_arm64")
    make_wheel(d, "beta", "2.1")
    write_manifest(d)
    problems = gb.check_folder(d, plan, src)
    assert any("beta 2.1, the lock has 2.0" in p for p in problems), problems
    assert any("no tag CPython 3.12" in p for p in problems), problems


@pytest.mark.parametrize("use_pip", [True, False])
def test_a_re_zipped_wheel_keeps_its_files_and_installs(tmp_path, use_pip):
    code = "VALUE = 'x' * 3\n" + "".join(f"V{i} = {i * i}\n" for i in range(3000))
    src = make_wheel(tmp_path, "alpha", "1.0", files={"alpha/__init__.py": code})
    d = tmp_path / "carried"
    d.mkdir()
    gb.repack_lzma(src, d / src.name)
    with zipfile.ZipFile(d / src.name) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_LZMA}
    gb.install(d, tmp_path / "site", use_pip=use_pip)
    r = subprocess.run(
        [sys.executable, "-c", "import alpha; print(alpha.VALUE)"],
        env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "xxx", r.stderr


def test_the_probe_records_a_snakemake_job_and_nothing_else(tmp_path):
    log = tmp_path / "probe.jsonl"
    env = dict(os.environ, PYTHONPATH=str(gb.PROBE_DIR), SELFREPAIR_GPU_PROBE=str(log))
    job = (
        "import __main__, types;"
        "__main__.snakemake = types.SimpleNamespace(rule='heroes_train', wildcards={'task': 'sort', 'seed': '42'})"
    )
    for code in (job, "print('not a job')"):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    recs = gb.read_probe(log)
    assert len(recs) == 1, recs
    assert recs[0]["rule"] == "heroes_train" and recs[0]["wildcards"] == {"task": "sort", "seed": "42"}
    assert recs[0]["cuda"] is False and recs[0]["end"] >= recs[0]["start"]


def test_the_probe_sees_a_real_snakemake_script_job(tmp_path):
    (tmp_path / "Snakefile").write_text('rule a:\n    output: "out/{x}.txt"\n    script: "s.py"\n')
    (tmp_path / "s.py").write_text("open(snakemake.output[0], 'w').write('done')\n")
    log = tmp_path / "probe.jsonl"
    env = dict(os.environ, PYTHONPATH=str(gb.PROBE_DIR), SELFREPAIR_GPU_PROBE=str(log))
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-c1",
        "-s",
        str(tmp_path / "Snakefile"),
        "-d",
        str(tmp_path),
        "out/7.txt",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "7.txt").read_text() == "done"
    assert [(p["rule"], p["wildcards"]) for p in gb.read_probe(log)] == [("a", {"x": "7"})]


def test_rule_steps_are_the_reference_steps():
    """Every benchmarked rule's (part, step) is the one benchmarks/runtime_summary.py gives
    its benchmark file, and results/reference/runtime.csv has it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_summary import part_and_step

    ref = set(pd.read_csv(gb.REFERENCE)[["part", "step"]].itertuples(index=False, name=None))
    values = dict(
        task="sort", seed="42", tkey="default", cmodel="T10", dseed="11", gseed="0", gtask="ioi", gmodel="l2h4"
    )
    found = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for m in re.finditer(r"^(?:rule (\w+):|use rule \w+ as (\w+) with:)(.*?)(?=^\S)", smk.read_text(), re.M | re.S):
            bench = re.search(r"benchmark:\s*\n\s*f?\"([^\"]+)\"", m.group(3))
            if bench:
                path = ROOT / bench.group(1).replace("{{", "{").replace("}}", "}").format(**values)
                found[m.group(1) or m.group(2)] = part_and_step(path, ROOT / "benchmarks")
    assert len(found) >= 20, found
    for rule, step in found.items():
        assert gb.rule_step(rule) == step, rule
        assert step in ref, f"{rule}: {step} is not in {gb.REFERENCE.name}"


def test_the_samplers_output_is_parsed():
    pmon = (
        "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   ccpm    command\n"
        "# Idx           #    C/G      %      %      %      %      %      %     MB     MB    name\n"
        "    0       4242     C     37      5      -      -      -      -    612      0    python3\n"
        "    0       4243     C      -      -      -      -      -      -    500      0    python3\n"
        "    0          -     -      -      -      -      -      -      -      -      -    -\n"
    )
    assert gb.parse_pmon(pmon) == [{"pid": 4242, "sm": 37.0, "fb": 612.0}, {"pid": 4243, "sm": None, "fb": 500.0}]
    dev = gb.parse_device("2026/01/02 03:04:05.500, 87, 10240\nbad line\n")
    assert len(dev) == 1 and dev[0]["util"] == 87.0 and dev[0]["mem"] == 10240.0
    assert dev[0]["t"] % 1 == pytest.approx(0.5)


def test_the_table_joins_jobs_probes_samplers_and_the_reference():
    t = 1000.0
    phases = [
        {"name": "install", "start": t, "end": t + 30, "status": "finished"},
        {"name": "step1", "start": t + 30, "end": t + 130, "status": "finished"},
    ]
    bench = [
        {"phase": "step1", "part": "heroes", "step": "train", "s": 40.0, "cpu_s": 35.0},
        {"phase": "step1", "part": "heroes", "step": "train", "s": 60.0, "cpu_s": 50.0},
        {"phase": "step1", "part": "gim", "step": "train", "s": 10.0, "cpu_s": 9.0},
    ]
    mib = 2**20
    probes = [
        {"pid": 1, "rule": "heroes_train", "start": t + 31, "cuda": True, "max_allocated": 100 * mib, "max_reserved": 128 * mib},
        {"pid": 2, "rule": "heroes_train", "start": t + 32, "cuda": True, "max_allocated": 150 * mib, "max_reserved": 160 * mib},
        {"pid": 3, "rule": "gim_train", "start": t + 33, "cuda": True, "max_allocated": 50 * mib, "max_reserved": 64 * mib},
        {"pid": 4, "rule": "heroes_roles", "start": t + 34, "cuda": False},
    ]  # fmt: skip
    pmon = [{"pid": 1, "sm": 20.0, "fb": 1}, {"pid": 2, "sm": None, "fb": 1}, {"pid": 3, "sm": 90.0, "fb": 1}]
    device = [{"t": t + 40, "util": 50.0, "mem": 2000.0}, {"t": t + 50, "util": 70.0, "mem": 3000.0}]
    ref = pd.DataFrame(
        [
            {"part": "heroes", "step": "train", "jobs": 20, "wall_s": 5000.0, "cpu_s": 4000.0},
            {"part": "gim", "step": "train", "jobs": 10, "wall_s": 200.0, "cpu_s": 150.0},
        ]
    )
    table = gb.build_table(phases, bench, probes, pmon, device, ref)
    assert list(table.columns) == gb.TABLE_COLUMNS
    row = table[(table.phase == "step1") & (table.part == "heroes")].iloc[0]
    assert (row.jobs, row.wall_s, row.wall_per_job_s, row.longest_job_s, row.cpu_s) == (2, 100.0, 50.0, 60.0, 85.0)
    assert row.gpu_mem_peak_mib == 150.0 and row.gpu_mem_reserved_peak_mib == 160.0
    assert row.gpu_util_mean_pct == 10.0 and row.gpu_util_max_pct == 20.0  # pid 2's '-' counts as 0
    assert row.ref_wall_per_job_s == 250.0 and row.ref_cpu_per_job_s == 200.0 and row.speedup == 5.0
    gim = table[(table.phase == "step1") & (table.part == "gim")].iloc[0]
    assert gim.gpu_util_mean_pct == 90.0 and gim.ref_wall_same_jobs_s == 20.0
    total = table[(table.phase == "step1") & (table.part == "all")].iloc[0]
    assert (total.jobs, total.wall_s, total.gpu_util_mean_pct, total.gpu_mem_peak_mib) == (3, 100.0, 60.0, 3000.0)
    assert total.ref_wall_same_jobs_s == 520.0
    install = table[table.phase == "install"]
    assert len(install) == 1 and install.iloc[0].wall_s == 30.0


def test_run_refuses_another_python_clearly(tmp_path):
    if sys.version_info[:2] == gb.PYTHON:
        pytest.skip("this is the GPU machine's Python")
    with pytest.raises(SystemExit, match=r"the wheels are for Python 3\.12"):
        gb.run(tmp_path / "out", 60, folder=tmp_path)


def test_run_sh_rejects_an_unknown_mode():
    r = subprocess.run(["bash", str(gb.HERE / "run.sh"), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def test_the_dry_run_plans_both_steps_on_cuda():
    """The run's two Snakemake steps, dry-run with the gpu profile; the probe and the
    helper compile; run.sh parses."""
    assert gb.check_steps() == []


@pytest.mark.skipif(not (gb.WHEELS / "manifest.json").exists(), reason="no prepared folder (run.sh prepare)")
def test_the_prepared_folder_resolves_and_fits(plan):
    assert gb.check_folder(gb.WHEELS, plan) == []
    wheels, tree, problems = gb.size_report(gb.WHEELS)
    assert not problems, problems


def test_a_step_is_stopped_at_its_deadline(tmp_path):
    t = time.time()
    ph = gb.run_snakemake(["sleep", "60"], dict(os.environ), t + 1, tmp_path / "log")
    assert ph["status"] == "stopped at the deadline" and ph["end"] - t < 30
    ph = gb.run_snakemake(["bash", "-c", "exit 3"], dict(os.environ), t + 60, tmp_path / "log")
    assert ph["status"] == "failed (3)"
    assert (tmp_path / "log").read_text().startswith("$ bash -c exit 3")
