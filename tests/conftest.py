import os
import re

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


@pytest.fixture(scope="session")
def gim_tiny_run_made(tmp_path_factory):
    """(folder, {file: SHA-256}) of paper C's whole tiny DAG, made once per pytest run:
    the README's tiny run (golden_suite.GIM_TINY_RUN: config/test.yaml, papers=[gim],
    device auto, which is the CPU on a machine without CUDA) in a fresh folder, on the
    committed checkpoints (nothing trains), started as tests/test_docs.py starts the
    documents' commands (from the repository root, SELFREPAIR_ASSUME_CUDA=1)."""
    import golden_suite as G

    d = tmp_path_factory.mktemp("gim_tiny") / "run"
    d.mkdir()
    G.seed_checkpoints(d, ("gim",))
    env = dict(os.environ, SELFREPAIR_ASSUME_CUDA="1")
    r = G.snakemake("--cores", "2", *G.gim_tiny_args(d), env=env, timeout=1200)
    assert not G.ran_training(r.stdout + r.stderr, "gim"), "the tiny run retrained a committed checkpoint"
    committed = G.weight_hashes(G.CHECKPOINTS, ("gim",))
    assert G.weight_hashes(d, ("gim",)) == committed and len(committed) == 3
    return d, G.tree_hashes(d)


@pytest.fixture(scope="session")
def gim_tiny_run(gim_tiny_run_made):
    """The shared tiny paper-C run's folder (gim_tiny_run_made), for tests that only read
    it: a test that writes in it works on a copy. After the session every file is checked
    to be as the run left it (and by tests/test_gim_workflow.py's last test)."""
    import golden_suite as G

    d, made = gim_tiny_run_made
    yield d
    assert G.tree_hashes(d) == made, f"a test changed the shared tiny run in {d}: give it a copy"


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
