"""benchmarks/gpu (the GPU run in one call) checked on the CPU: pip's check of made-up
wheel folders (offline: what is missing, extra, changed, off the lock or for another
platform), the placeholders, the LZMA re-zip and the install, the probe, the table, and
the dry run of the run's Snakemake steps; the prepared folder itself when there is one
(`bash benchmarks/gpu/run.sh prepare`: the lock's versions, minus the GPU machine's)."""

from __future__ import annotations

import importlib.util
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
import gpu_measure as gm  # noqa: E402  (benchmarks/gpu, on sys.path through gpu_bench)


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


@pytest.fixture
def folder(tmp_path):
    """A made-up folder as prepare leaves it: alpha and beta from the index, the project,
    and the GPU machine's torch and the left-out wandb as placeholders; its lock."""
    src = tmp_path / "src"
    (src / "selfrepair").mkdir(parents=True)
    (src / "selfrepair" / "__init__.py").write_text("X = 1\n")
    d = tmp_path / "wheels"
    d.mkdir()
    make_wheel(d, "alpha", "1.0", ["beta>=2", "torch>=2.6", 'wandb; python_version >= "3.9"', 'nope; os_name == "nt"'])
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "selfrepair", "0.1.0", ["alpha", "torch==2.13.0"], files={"selfrepair/__init__.py": "X = 1\n"})
    gb.write_pins(d)
    gb.placeholders(d / "gpu-has", {"torch": "2.13.0", "wandb": "0.31.0"})
    lock = tmp_path / "requirements.lock"
    lock.write_text("alpha==1.0\nbeta==2.0\ntorch==2.13.0\nwandb==0.31.0\n")
    return d, src, lock


def test_a_complete_folder_passes(folder):
    d, src, lock = folder
    assert gb.check_folder(d, src, lock) == []
    pins = (d / "gpu-has" / "requirements.txt").read_text()
    gb.placeholders(d / "gpu-has", {"torch": "2.13.0", "wandb": "0.31.0"})
    assert (d / "gpu-has" / "requirements.txt").read_text() == pins, "placeholders differ from one call to the next"


def repin(change):
    return lambda d: (change(d), gb.write_pins(d))


@pytest.mark.parametrize(
    "change, problem",
    [
        (repin(lambda d: (d / "beta-2.0-py3-none-any.whl").unlink()), r"beta"),
        (lambda d: make_wheel(d, "gamma", "1.0"), r"gamma-1\.0-py3-none-any\.whl: pip does not take it"),
        (lambda d: make_wheel(d, "beta", "2.1"), r"beta-2\.1-py3-none-any\.whl: pip does not take it"),
        (repin(lambda d: make_wheel(d, "alpha", "1.0", ["beta", "gamma"])), r"gamma"),
        (repin(lambda d: make_wheel(d, "alpha", "1.0", ["beta<2"])), r"alpha 1\.0 depends on beta<2"),
        (repin(lambda d: make_wheel(d, "alpha", "1.0", ["numpy"])), r"numpy"),  # neither sent nor on the GPU machine
        (lambda d: make_wheel(d, "alpha", "1.0", ["beta"]), r"(?i)hash"),  # changed after prepare
        (
            repin(lambda d: make_wheel(d, "selfrepair", "0.1.0", files={"selfrepair/__init__.py": "X = 2\n"})),
            "not this tree",
        ),
        (lambda d: (d / "requirements.txt").unlink(), "no requirements.txt"),
    ],
)
def test_the_folder_check_names_what_is_wrong(folder, change, problem):
    d, src, lock = folder
    change(d)
    problems = gb.check_folder(d, src, lock)
    assert any(re.search(problem, p) for p in problems), problems


def test_a_drift_from_the_lock_is_an_error(folder):
    d, src, lock = folder
    lock.write_text(lock.read_text().replace("beta==2.0", "beta==2.1"))
    problems = gb.check_folder(d, src, lock)
    assert any("beta==2.1" in p and "constraint" in p for p in problems), problems


@pytest.mark.parametrize(
    "tag, ok",
    [
        ("cp312-cp312-manylinux_2_28_x86_64", True),
        ("cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64", True),
        ("cp311-abi3-manylinux_2_17_x86_64", True),
        ("cp311-cp311-manylinux_2_28_x86_64", False),
        ("cp312-cp312-manylinux_2_34_x86_64", False),
        ("cp312-cp312-musllinux_1_2_x86_64", False),
        ("cp312-cp312-manylinux_2_28_aarch64", False),
        ("cp312-cp312-macosx_11_0_arm64", False),
    ],
)
def test_only_wheels_for_cpython_3_12_on_manylinux_x86_64(folder, tag, ok):
    d, src, lock = folder
    (d / "beta-2.0-py3-none-any.whl").unlink()
    make_wheel(d, "beta", "2.0", tag=tag)
    gb.write_pins(d)
    assert (gb.check_folder(d, src, lock) == []) == ok


def test_placeholders_stand_for_the_gpu_machine_over_the_index(folder):
    """A placeholder (version+gpu) wins over a wheel of the same version, as over PyPI's,
    and brings none of its requirements."""
    d, src, lock = folder
    make_wheel(d, "torch", "2.13.0", ["gamma"])
    links = ["--find-links", d, "--find-links", d / "gpu-has", "-c", lock]
    used = gb.pip(
        "install", "--isolated", "--dry-run", "--ignore-installed", "--no-index", *links, "alpha", report=True
    )
    assert {u["metadata"]["name"]: u["metadata"]["version"] for u in used}["torch"] == "2.13.0+gpu"


def test_a_re_zipped_wheel_keeps_its_files_and_installs(tmp_path):
    code = "VALUE = 'x' * 3\n" + "".join(f"V{i} = {i * i}\n" for i in range(3000))
    src = make_wheel(tmp_path, "alpha", "1.0", files={"alpha/__init__.py": code})
    d = tmp_path / "carried"
    d.mkdir()
    gb.repack_lzma(src, d / src.name)
    with zipfile.ZipFile(d / src.name) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_LZMA}
    gb.write_pins(d)
    gb.install(d, tmp_path / "site")
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
    recs = gm.read_probe(log)
    assert len(recs) == 1, recs
    assert recs[0]["rule"] == "heroes_train" and recs[0]["wildcards"] == {"task": "sort", "seed": "42"}
    assert recs[0]["cuda"] is False and recs[0]["end"] >= recs[0]["start"]


@pytest.mark.slow
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
    assert [(p["rule"], p["wildcards"]) for p in gm.read_probe(log)] == [("a", {"x": "7"})]


def test_rule_steps_are_the_reference_steps():
    """Every benchmarked rule's (part, step) is the one benchmarks/runtime_summary.py gives
    its benchmark file, and results/reference/runtime.csv has it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_summary import part_and_step

    ref = set(pd.read_csv(gb.REFERENCE)[["part", "step"]].itertuples(index=False, name=None))
    values = dict(
        task="sort",
        seed="42",
        tkey="default",
        cmodel="T10",
        dseed="11",
        gseed="0",
        gtask="ioi",
        gmodel="l2h4",
        lm="smollm2-135m",
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
        assert gm.rule_step(rule) == step, rule
        if rule not in LARGE_SCALE_ONLY:
            assert step in ref, f"{rule}: {step} is not in {gb.REFERENCE.name}"
    # the exemption holds while the default run does not prune
    import yaml

    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "coax.schema.yaml").read_text())
    assert schema["properties"]["lms"]["properties"]["pruning"]["properties"]["scales"]["default"] == ["large"]


# rules the default run never runs (coax.lms.pruning.scales: large), so the reference
# run's runtime.csv has no row for them
LARGE_SCALE_ONLY = {"coax_lm_pruning"}


def test_the_samplers_output_is_parsed():
    pmon = (
        "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   ccpm    command\n"
        "# Idx           #    C/G      %      %      %      %      %      %     MB     MB    name\n"
        "    0       4242     C     37      5      -      -      -      -    612      0    python3\n"
        "    0       4243     C      -      -      -      -      -      -    500      0    python3\n"
        "    0          -     -      -      -      -      -      -      -      -      -    -\n"
    )
    assert gm.parse_pmon(pmon) == [{"pid": 4242, "sm": 37.0, "fb": 612.0}, {"pid": 4243, "sm": None, "fb": 500.0}]
    dev = gm.parse_device("2026/01/02 03:04:05.500, 87, 10240\nbad line\n")
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
    table = gm.build_table(phases, bench, probes, pmon, device, ref)
    assert list(table.columns) == gm.TABLE_COLUMNS
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


@pytest.mark.slow
def test_the_dry_run_plans_both_steps_on_cuda():
    """The run's two Snakemake steps, dry-run with the gpu profile; the probe and the
    helper compile; run.sh parses."""
    assert gb.check_steps() == []


@pytest.mark.skipif(not (gb.WHEELS / "requirements.txt").exists(), reason="no prepared folder (run.sh prepare)")
def test_the_prepared_folder_resolves_fits_and_sends_the_lock_minus_the_gpu_machine():
    assert gb.check_folder(gb.WHEELS) == []
    wheels, tree, problems = gb.size_report(gb.WHEELS)
    assert not problems, problems
    lock = dict(re.findall(r"^([\w.-]+)==(\S+)", gb.LOCK.read_text(), re.M))
    lock = {gb.canon(n): v for n, v in lock.items()}

    def pins(path):
        return dict(re.findall(r"^([\w.-]+)==(\S+) ", path.read_text(), re.M))

    sent, there = pins(gb.WHEELS / "requirements.txt"), pins(gb.WHEELS / "gpu-has" / "requirements.txt")
    assert all(lock[n] == v for n, v in sent.items() if n != gb.PROJECT), "a version differs from the lock"
    for n in ("snakemake", "snakemake-executor-plugin-slurm", "transformer-lens", "datasets", "captum", *MUST_TRAVEL):
        assert n in sent, n
    for n in (*gb.GPU_HAS, "numpy", "huggingface-hub", "tokenizers", "safetensors", "pyyaml", "jinja2", *gb.LEFT_OUT):
        assert n in there and n not in sent, n
    for n in IMAGE_HAS:
        assert n in there and n not in sent, n
    assert "opentelemetry-sdk" not in sent, "wandb's own dependencies travel although wandb does not"
    assert set(there) <= on_image() | set(gb.LEFT_OUT), set(there) - on_image()
    assert gb.check_needed(gb.WHEELS) == []
    assert wheels + tree <= 56, (wheels, tree)


# Measured on the GPU machine (../shared/gpu/README.md): Snakemake needs these, the image
# lacks them. And what the image has that the first bundle carried (pyarrow: 40 MB).
MUST_TRAVEL = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
IMAGE_HAS = ("pyarrow", "accelerate", "attrs", "certifi", "charset-normalizer", "einops", "jaxtyping", "protobuf",
             "psutil", "requests", "sentencepiece", "tabulate", "urllib3", "wadler-lindig", "wrapt", "xxhash")  # fmt: skip


def on_image() -> set[str]:
    lines = (gb.HERE / "image-packages.txt").read_text().splitlines()
    return {gb.canon(n) for n in lines if n and not n.startswith("#")}


def test_every_distribution_the_run_needs_is_carried_or_on_the_image():
    """The run's requirements (this environment's metadata, markers for the GPU
    machine's Python 3.12): each one the image lacks travels (the four Snakemake needs
    among them), each one it has does not; the copy of the image's list is the shared one."""
    need = gb.needed_distributions()
    image = on_image()
    shared = Path("/work/shared/gpu/image-packages.txt")
    if shared.exists():
        assert image == {gb.canon(n) for n in shared.read_text().split()}, "the copy differs from the shared list"
    assert len(image) > 150 and {"torch", "transformers", "pyarrow"} <= image
    for n, where in need.items():
        assert where == ("image" if n in image else "left out" if n in gb.LEFT_OUT else "carried"), n
    for n in MUST_TRAVEL:
        assert need.get(n) == "carried", n
    for n in ("snakemake", "transformer-lens", "selfrepair", "sqlmodel"):
        assert need[n] == "carried", n
    for n in ("torch", "pyarrow", "numpy", "requests"):
        assert need[n] == "image", n


def test_a_placeholder_the_image_lacks_is_refused(folder, tmp_path):
    d, src, lock = folder
    image = tmp_path / "image.txt"
    image.write_text("# made up\nnumpy\n")
    problems = gb.check_folder(d, src, lock, image)
    assert len(problems) == 1 and "gpu-has/ takes torch to be there" in problems[0], problems
    image.write_text("torch\n")
    assert gb.check_folder(d, src, lock, image) == []


def test_a_step_is_stopped_at_its_deadline(tmp_path):
    t = time.time()
    ph = gb.run_snakemake(["sleep", "60"], dict(os.environ), t + 1, tmp_path / "log")
    assert ph["status"] == "stopped at the deadline" and ph["end"] - t < 30
    ph = gb.run_snakemake(["bash", "-c", "exit 3"], dict(os.environ), t + 60, tmp_path / "log")
    assert ph["status"] == "failed (3)"
    assert (tmp_path / "log").read_text().startswith("$ bash -c exit 3")


@pytest.mark.slow
def test_the_large_lms_script_plans_every_real_lm_job_of_the_large_scale_on_cuda():
    r = subprocess.run(["bash", str(gb.HERE / "large_lms.sh"), "--dry-run"], capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for rule in ("coax_lm", "coax_lm_pruning", "gim_lm"):  # one job per packaged LM each
        assert re.search(rf"^{rule}\s+2$", out, re.M), (rule, out[-3000:])
    assert re.search(r"^real_lms_claims\s+1$", out, re.M)
    r = subprocess.run(["bash", str(gb.HERE / "large_lms.sh"), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
