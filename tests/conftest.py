import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The numerics mode is set before anything imports torch or numpy: tests (and the
# workflows they start, which inherit the environment) run the fast pinned mode, one
# thread, unless SELFREPAIR_TEST_NUMERICS=exact or native asks for another. The golden
# training tests train under fast whatever this says (tests/golden_suite.TRAIN_NUMERICS).
from selfrepair.core import numerics  # noqa: E402  imports no torch

NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "fast"))
numerics.configure(NUMERICS, threads=2)

import pytest  # noqa: E402

from selfrepair.core import models  # noqa: E402
from selfrepair.tasks import sequences as S  # noqa: E402

numerics.apply(NUMERICS, threads=2)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A tiny randomly initialized paper-A GPT-2 saved with save_pretrained."""
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=32)
    model = models.build_gpt2_toy(cfg, seed=0)
    folder = tmp_path_factory.mktemp("tiny") / "model"
    models.save_model(model, folder)
    return folder


# The committed tiny sorting model (paper A's test config: 2 layers x 2 heads, d_model 64,
# lengths 2..4, trained 600 steps under fast; exact match about 0.77, so it varies): the
# tests that need a trained model read it, and no test trains one for them.
TRAINED_SORT = "results/heroes/sort/seed42"


@pytest.fixture(scope="session")
def trained_sort_folder(tmp_path_factory):
    """A copy of the committed tiny sorting model's weights (tests/golden/checkpoints), so
    that no test can change the committed files."""
    import shutil

    import golden_suite

    src = golden_suite.CHECKPOINTS / TRAINED_SORT / "model"
    if not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"no committed checkpoint at {src}: run tests/golden/update.py --retrain")
    folder = tmp_path_factory.mktemp("trained") / "model"
    shutil.copytree(src, folder)
    return folder


def made_run(tmp_path_factory, name: str, make) -> tuple[Path, dict[str, str]]:
    """(folder, {file: SHA-256}) of a run that ``make(folder)`` makes in a folder of its
    own and returns, made once per pytest run, for both workers too (made_once)."""
    import golden_suite as G

    def made(folder):
        d = make(folder)
        return [str(d), G.tree_hashes(d)]

    d, hashes = made_once(tmp_path_factory, name, made)
    return Path(d), hashes


def left_as_made(made: tuple[Path, dict[str, str]]):
    """A session fixture's body for a shared run (made_run) that tests only read: yields
    its folder, and after the session fails if any file differs from what the run left
    (a test that writes works on a copy: copy_run)."""
    import golden_suite as G

    d, hashes = made
    yield d
    assert G.tree_hashes(d) == hashes, f"a test changed the shared run in {d}: give it a copy"


def copy_run(src: Path, dest: Path) -> Path:
    """A copy of a finished run's folder that Snakemake sees as finished too: every file
    keeps its modification time (and .snakemake/ its records), so nothing reruns."""
    import shutil

    shutil.copytree(src, dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def tiny_runs_made(tmp_path_factory):
    """(folder, {file: SHA-256}) of the three papers' tiny DAGs run together (made_run):
    golden_suite.tiny_args with papers=[heroes,coax,gim] and device=cpu, --cores 2, on the
    committed checkpoints (nothing trains). tests/test_slurm.py compares its SLURM run
    with it byte for byte, tests/test_coax_workflow.py reads it, tests/test_workflow.py
    works on a copy."""
    import golden_suite as G

    def make(folder):
        d = G.prepare(folder / "run")
        G.seed_checkpoints(d, G.PAPERS)
        r = G.snakemake("--cores", "2", *G.tiny_args(d, paper=G.ALL_PAPERS), timeout=5400)
        trained = [t for p in G.PAPERS for t in G.ran_training(r.stdout + r.stderr, p)]
        assert not trained, f"the tiny run retrained committed checkpoints: {trained}"
        committed = G.weight_hashes(G.CHECKPOINTS)
        assert G.weight_hashes(d) == committed and len(committed) > 3
        return d

    return made_run(tmp_path_factory, "tiny_runs", make)


@pytest.fixture(scope="session")
def tiny_runs(tiny_runs_made):
    """The shared tiny run of the three papers (tiny_runs_made), read-only (left_as_made)."""
    yield from left_as_made(tiny_runs_made)


@pytest.fixture(scope="session")
def gim_tiny_run_made(tmp_path_factory):
    """(folder, {file: SHA-256}) of paper C's whole tiny DAG (made_run): the README's tiny
    run (golden_suite.GIM_TINY_RUN: config/test.yaml, papers=[gim], device auto, which is
    the CPU on a machine without CUDA) in a fresh folder, on the committed checkpoints
    (nothing trains), started as tests/test_docs.py starts the documents' commands (from
    the repository root, SELFREPAIR_ASSUME_CUDA=1)."""
    import golden_suite as G

    def make(folder):
        d = folder / "run"
        d.mkdir()
        G.seed_checkpoints(d, ("gim",))
        env = dict(os.environ, SELFREPAIR_ASSUME_CUDA="1")
        r = G.snakemake("--cores", "2", *G.gim_tiny_args(d), env=env, timeout=1200)
        assert not G.ran_training(r.stdout + r.stderr, "gim"), "the tiny run retrained a committed checkpoint"
        committed = G.weight_hashes(G.CHECKPOINTS, ("gim",))
        assert G.weight_hashes(d, ("gim",)) == committed and len(committed) == 3
        return d

    return made_run(tmp_path_factory, "gim_tiny", make)


@pytest.fixture(scope="session")
def gim_tiny_run(gim_tiny_run_made):
    """The shared tiny paper-C run's folder (gim_tiny_run_made), read-only (left_as_made;
    tests/test_gim_workflow.py's last test checks it too)."""
    yield from left_as_made(gim_tiny_run_made)


# The quick tier (`make test-quick`: pytest -m "not slow" with SELFREPAIR_TEST_TIER=quick)
# leaves out every test marked slow: those that start Snakemake (a run, a dry run, --lint)
# or train a model. In that tier a test without the mark that starts Snakemake anyway
# fails at once, naming the mark it needs, so the tier stays quick as tests are added.
QUICK = os.environ.get("SELFREPAIR_TEST_TIER", "") == "quick"


def starts_snakemake(args) -> bool:
    """Whether a subprocess command line runs Snakemake: its program is a snakemake
    executable, or a Python's ``-m snakemake``."""
    if isinstance(args, (str, bytes, os.PathLike)):
        words = os.fsdecode(args).split()
    else:
        words = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # a shell line's VAR=value words
        words.pop(0)
    if not words:
        return False
    if os.path.basename(words[0]) == "snakemake":
        return True
    return any(words[i : i + 2] == ["-m", "snakemake"] for i in range(len(words) - 1))


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_snakemake(request, monkeypatch):
    if not QUICK or request.node.get_closest_marker("slow"):
        yield
        return
    import subprocess

    real_init = subprocess.Popen.__init__

    def init(self, args, *a, **k):
        if starts_snakemake(args):
            raise AssertionError(
                f"{request.node.nodeid} starts Snakemake ({args!r}) but is not marked slow: "
                "add @pytest.mark.slow (the quick tier, make test-quick, runs no Snakemake)"
            )
        real_init(self, args, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield


# Two workers (`make test`: pytest-xdist, --dist loadfile --no-loadscope-reorder): each
# test module runs on one worker, so that its module-scoped fixtures (a tiny run) are made
# once, and a session's shared run is made once by whichever worker asks first
# (made_once). The modules go out longest first (LONGEST_FIRST, measured with --durations
# under two workers: docs/TESTING.md), so that no long one starts last; the rest follow
# in the order pytest collects them. A run in one process keeps pytest's order.
LONGEST_FIRST = (
    "test_slurm.py",
    "test_workflow.py",
    "test_gim_workflow.py",
    "test_real_lm_smoke.py",
    "test_own_dag.py",
    "test_coax_workflow.py",
    "test_docs.py",
    "test_real_size.py",
    "test_numerics.py",
    "test_golden.py",
    "test_failures.py",
    "test_status.py",
    "test_device_check.py",
    "test_gpu_script.py",
)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {it: (rank.get(it.path.name, len(rank)), i) for i, it in enumerate(items)}
    items.sort(key=order.__getitem__)


def made_once(tmp_path_factory, name: str, make):
    """What ``make(folder)`` returns (JSON), made once per pytest run however many workers
    ask: the first makes it in a folder of the run's temporary root that every worker
    sees, under a file lock; the others wait for it and read what it returned (or the
    error it raised)."""
    import json

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's root, above each worker's own folder
    record = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not record.is_file():
            folder = root / name
            folder.mkdir()
            try:
                made = {"value": make(folder)}
            except BaseException as e:
                made = {"error": f"{type(e).__name__}: {e}"}
                record.write_text(json.dumps(made))
                raise
            record.write_text(json.dumps(made))
        made = json.loads(record.read_text())
    if "error" in made:
        pytest.fail(f"making {name} failed in another worker: {made['error']}")
    return made["value"]


# Where the suite's time goes, per test: SELFREPAIR_TEST_PROFILE=<file> appends one JSON
# line per test (its id, worker, start in epoch seconds, wall seconds of setup, call and
# teardown, CPU seconds of the pytest process and of the children it waited for, and how
# many Snakemake processes it started). tests/profile_report.py sums such a file by module.
PROFILE = os.environ.get("SELFREPAIR_TEST_PROFILE")


def _cpu() -> tuple[float, float]:
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


if PROFILE:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        import json
        import subprocess
        import time

        started = []
        real_init = subprocess.Popen.__init__

        def init(self, args, *a, **k):
            if starts_snakemake(args):
                started.append(1)
            real_init(self, args, *a, **k)

        subprocess.Popen.__init__ = init
        (s0, c0), t0 = _cpu(), time.monotonic()
        try:
            yield
        finally:
            subprocess.Popen.__init__ = real_init
            (s1, c1), t1 = _cpu(), time.monotonic()
            row = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
                   "start": round(time.time() - (t1 - t0), 1), "wall": round(t1 - t0, 3), "cpu_self": round(s1 - s0, 3),
                   "cpu_children": round(c1 - c0, 3), "snakemake": len(started)}  # fmt: skip
            with open(PROFILE, "a") as f:
                f.write(json.dumps(row) + "\n")
