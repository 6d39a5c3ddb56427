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
    env = dict(os.environ, SELFREPAIR_TEST_TIER=tier, PYTHONPATH=str(ROOT / "tests"))
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
