"""Regenerate the golden regression values of the tiny paper-A run.

Run deliberately, after a change that is meant to move the numbers:
    .venv/bin/python tests/golden/update.py
and commit the CSVs with a message that says why they moved.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    (d / "config").mkdir()
    shutil.copy(ROOT / "config/published.yaml", d / "config/published.yaml")
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s", str(ROOT / "Snakefile"),
        "--directory", str(d),
        "--cores", "2",
        "--configfile", str(ROOT / "config/config.yaml"), str(ROOT / "config/test.yaml"),
        "--config", "papers=[heroes]", "device=cpu",
        "--", "results/heroes/tables/seeds.csv", "results/heroes/tables/components.csv",
        "results/heroes/grid/tables/seeds.csv",
    ]
    subprocess.run(cmd, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    seeds = pd.read_csv(d / "results/heroes/tables/seeds.csv")
    cols = ["task", "seed", "status", "N", "train_steps", "id_accuracy", "ood_accuracy", "rho", "n_heroes", "n_bloats"]
    seeds[cols].to_csv(HERE / "heroes_tiny_seeds.csv", index=False)
    comps = pd.read_csv(d / "results/heroes/tables/components.csv")
    comps[["task", "seed", "component", "G", "C", "C_zero", "delta", "role"]].to_csv(HERE / "heroes_tiny_components.csv", index=False)
    grid = pd.read_csv(d / "results/heroes/grid/tables/seeds.csv")
    grid[["cell", "task", "seed", "status", "N", "baseline_acc", "rho", "heroes", "bloats"]].to_csv(HERE / "heroes_tiny_grid.csv", index=False)
    print("golden values written to", HERE)
