"""The ground truth on a packaged real LM (rule ``groundtruth_lm``): the IOI pairs that
paper C's real-LM rules make (MIB's row format, ``tasks.mib_synth``), read in the
checkpoint's own tokenizer, and :func:`pipeline.run_on_model` on them with the top
components by single drop as players and the rest as one more player (every head is not
tractable on these models: ``docs/results/groundtruth.md``, "Real LMs")."""

from __future__ import annotations

import logging
import time

import pandas as pd

log = logging.getLogger(__name__)
TABLES = ("shapley", "interactions", "scores", "agreement", "timing")


def run_lm(folder, data_dir, name: str, lm: dict, settings: dict, top_k: int, device: str = "cpu") -> dict:
    """Tables :data:`TABLES` of model ``folder`` on ``lm["n_pairs"]`` IOI pairs of
    ``data_dir``; ``lm``: players, n_players, rest, mode; ``settings``: the ground truth's
    estimator settings (:class:`pipeline.Settings`)."""
    from selfrepair.core.models import folder_tokenizer, load_bridge
    from selfrepair.groundtruth.pipeline import Settings, run_on_model
    from selfrepair.tasks import mib

    t0 = time.process_time()
    bridge = load_bridge(folder, device)
    tokenizer = folder_tokenizer(str(folder), None)  # as gim_lm reads the same pairs
    data = mib.load("ioi", tokenizer, int(lm["n_pairs"]), [str(data_dir)], split="test").to(device)
    log.info("%s: %d IOI pairs of %d tokens", name, len(data), data.clean.shape[1])
    s = Settings(
        mode=str(lm["mode"]), players=str(lm["players"]), n_players=int(lm["n_players"]), rest=str(lm["rest"]),
        **settings,
    )  # fmt: skip
    out = run_on_model(bridge, data, s, top_k=top_k, name=name)
    out["timing"] = pd.concat(
        [out["timing"], pd.DataFrame([{"part": "job (load, pairs, every part)", "cpu_s": time.process_time() - t0}])],
        ignore_index=True,
    )
    return {k: out.get(k, pd.DataFrame()) for k in TABLES}
