import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The numerics mode is set before anything imports torch or numpy: tests (and the
# workflows they start, which inherit the environment) run the fast pinned mode, one
# thread, unless SELFREPAIR_TEST_NUMERICS=exact or native asks for another. The golden
# training tests train under fast whatever this says (tests/golden_suite.TRAIN_NUMERICS).
from selfrepair.core import numerics  # noqa: E402  imports no torch

NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "fast"))
numerics.configure(NUMERICS, threads=2)

import pytest  # noqa: E402
import torch  # noqa: E402

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


@pytest.fixture(scope="session")
def trained_sort_folder(tmp_path_factory):
    """A small model trained briefly on sorting (lengths 2..4) so that exact match varies."""
    from selfrepair.core import train
    from selfrepair.heroes import scores as heroes

    torch.manual_seed(0)
    cfg = models.gpt2_toy_config(S.VOCAB, n_layers=2, n_heads=2, d_model=64, d_mlp=128, n_ctx=32)
    model = models.build_gpt2_toy(cfg, seed=1)
    g = torch.Generator().manual_seed(1)
    train.train(
        model,
        lambda s: S.training_batch("sort", 64, 2, 4, g),
        lambda m: heroes.id_accuracy(m, "sort", 2, 4, 50, 7),
        lr=3e-3,
        max_steps=400,
        eval_every=400,
        target_accuracy=None,
    )
    folder = tmp_path_factory.mktemp("trained") / "model"
    models.save_model(model, folder)
    return folder
