"""The quick tier (`make test-quick`): what counts as starting Snakemake, the guard that
fails an unmarked test doing so, and the documents' commands sorted into the tiers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import starts_snakemake
from test_docs import starts_snakemake as doc_starts_snakemake

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _inner_env() -> dict:
    """The environment of a generated suite's pytest: this run's, without its per-test
    profile file and its tier (the generated tests are not this suite's; a test that
    wants a tier sets it)."""
    return {k: v for k, v in os.environ.items() if k not in ("SELFREPAIR_TEST_PROFILE", "SELFREPAIR_TEST_TIER")}


@pytest.mark.parametrize(
    "args, expected",
    [
        ([str(BIN / "snakemake"), "-s", "Snakefile", "-n"], True),
        (["snakemake", "--lint"], True),
        ([sys.executable, "-m", "snakemake", "-c1"], True),
        ("HF_HUB_OFFLINE=1 .venv/bin/snakemake --cores 2", True),
        ([Path("/x/.venv/bin/snakemake"), "--version"], True),
        ([sys.executable, "/tmp/x/snakemake"], False),  # a script named snakemake (tests/test_orphans.py)
        ([sys.executable, "-c", "print('snakemake')"], False),
        (["make", "-n", "reproduce"], False),
        ([str(BIN / "snakefmt"), "--check", "Snakefile"], False),
        ([], False),
    ],
)
def test_what_starts_snakemake(args, expected):
    assert starts_snakemake(args) is expected


GUARDED = """
import subprocess, sys
import pytest

def test_unmarked():
    subprocess.run([sys.executable, "-m", "snakemake", "--version"], check=True)

@pytest.mark.slow
def test_marked():
    subprocess.run([sys.executable, "-m", "snakemake", "--version"], check=True)

def test_other_programs_run():
    assert subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True).stdout == "2\\n"
"""


def _pytest(tmp_path, tier, *args):
    """pytest on GUARDED with the project's conftest, in ``tier`` (SELFREPAIR_TEST_TIER)."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: as in pyproject.toml\n")
    env = dict(_inner_env(), SELFREPAIR_TEST_TIER=tier, PYTHONPATH=str(ROOT / "tests"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args, "test_guarded.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_quick_tier_fails_an_unmarked_test_that_starts_snakemake(tmp_path):
    """In the quick tier an unmarked test that starts Snakemake fails before Snakemake
    starts, naming the mark; a marked one is left out; other programs run."""
    r = _pytest(tmp_path, "quick", "-m", "not slow")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed, 1 passed, 1 deselected" in out, out
    assert "test_guarded.py::test_unmarked starts Snakemake" in out and "add @pytest.mark.slow" in out, out
    assert "FAILED test_guarded.py::test_unmarked" in out and "PASSED test_guarded.py::test_other_programs_run" in out


def test_outside_the_quick_tier_nothing_is_guarded(tmp_path):
    """The control: the same tests in the full suite (no tier) start Snakemake and pass."""
    r = _pytest(tmp_path, "")
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "cmd, expected",
    [
        ("make test", False),
        ("make test-quick", False),
        ("make status", False),
        ("python -m selfrepair.tooling.readme_table", False),
        ("python -m snakemake --version", True),
        ("snakemake --lint", False),  # in test_docs.SKIP: never run there
        ("snakemake -n --cores 1 --configfile config/config.yaml", True),
        ("make reproduce", True),
        ("make check-config", True),
        ("make verify MODEL=results/heroes/sort/seed42", True),  # checked against the default run's dry run
    ],
)
def test_the_documents_commands_that_start_snakemake_are_slow(cmd, expected):
    assert doc_starts_snakemake(cmd) is expected


# The two workers of `make test` (tests/conftest.py: made_once, LONGEST_FIRST).
SHARED = """

@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):  # as gim_tiny_run_made: made_once, and says where it was made
    def make(folder):
        with open(os.environ["MADE_LOG"], "a") as f:
            f.write("session " + os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")
        (folder / "made").write_text("x")
        return str(folder)

    return made_once(tmp_path_factory, "shared", make)
"""
MODULE = """
import os
from pathlib import Path
import pytest

@pytest.fixture(scope="module")
def made_here():
    with open(os.environ["MADE_LOG"], "a") as f:
        f.write("module {name} " + os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")

@pytest.mark.parametrize("i", range(4))
def test_module(made_here, i):
    pass

def test_reads_the_run(shared_run):
    assert (Path(shared_run) / "made").read_text() == "x"
"""


def test_two_workers_make_a_shared_run_and_a_module_fixture_once(tmp_path):
    """With make test's options (--dist loadfile --no-loadscope-reorder) every test module
    runs on one worker, so its module fixture is made once, and a session's shared run
    (made_once) is made once for both workers. The control: --dist load spreads a
    module's tests over both workers, and its module fixture is made on both."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text() + SHARED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: as in pyproject.toml\n")
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text(MODULE.format(name=name))
    env = dict(_inner_env(), PYTHONPATH=str(ROOT / "tests"))
    made = {}
    for dist in (["--dist", "loadfile", "--no-loadscope-reorder"], ["--dist", "load"]):
        log = tmp_path / f"made_{dist[1]}.log"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *dist]
        r = subprocess.run(cmd, cwd=tmp_path, env=dict(env, MADE_LOG=str(log)), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        assert r.returncode == 0 and "15 passed" in r.stdout, r.stdout + r.stderr
        lines = log.read_text().splitlines()
        made[dist[1]] = sorted(line.rsplit(" ", 1)[0] for line in lines)
        assert {line.rsplit(" ", 1)[1] for line in lines} == {"gw0", "gw1"}, lines  # both workers ran tests
    assert made["loadfile"] == ["module a", "module b", "module c", "session"]
    assert made["load"].count("session") == 1 and len(made["load"]) > 4, made["load"]


def test_the_longest_first_modules_exist():
    from conftest import LONGEST_FIRST

    assert [m for m in LONGEST_FIRST if not (ROOT / "tests" / m).is_file()] == []


PROFILED = """
import subprocess, sys

def test_starts_a_snakemake(tmp_path):
    exe = tmp_path / "snakemake"
    exe.write_text("#!/bin/sh\\nexit 0\\n")
    exe.chmod(0o755)
    subprocess.run([str(exe), "--version"], check=True)
    subprocess.run([str(exe), "-n"], check=True)

def test_burns_cpu_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_nothing():
    pass
"""


def test_the_profile_counts_each_tests_cpu_and_snakemake_starts(tmp_path):
    """SELFREPAIR_TEST_PROFILE: one line per test, with the CPU of the children it waited
    for and the Snakemake processes it started (a program named snakemake, twice);
    tests/profile_report.py sums them by module."""
    import profile_report

    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_p.py").write_text(PROFILED)
    out = tmp_path / "profile.jsonl"
    env = dict(_inner_env(), PYTHONPATH=str(ROOT / "tests"), SELFREPAIR_TEST_PROFILE=str(out))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_p.py"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
    rows = {row["test"].split("::")[1]: row for row in profile_report.read(out)}
    assert set(rows) == {"test_starts_a_snakemake", "test_burns_cpu_in_a_child", "test_nothing"}
    assert [rows[t]["snakemake"] for t in sorted(rows)] == [0, 0, 2]  # burns, nothing, starts
    assert rows["test_burns_cpu_in_a_child"]["cpu_children"] > 0.05 > rows["test_nothing"]["cpu_children"]
    (module,) = profile_report.by_module(list(rows.values()))
    assert module["tests"] == 3 and module["snakemake"] == 2
    assert abs(module["cpu"] - sum(r["cpu_self"] + r["cpu_children"] for r in rows.values())) < 1e-9
    assert "| test_p.py | 3 |" in profile_report.report(list(rows.values()))
    cli = subprocess.run([sys.executable, str(ROOT / "tests/profile_report.py"), str(out), "--top", "1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cli.returncode == 0 and "3 tests:" in cli.stdout and "test_burns_cpu_in_a_child |" in cli.stdout, cli
