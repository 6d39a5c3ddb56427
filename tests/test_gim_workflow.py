"""Tiny end-to-end run of paper C's part of the DAG (subprocess snakemake, test config)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = [
    "results/published/gim.csv",
    "results/gim/figures/faithfulness.png",
    "results/gim/figures/selfrepair.png",
    "results/gim/tables/speed.csv",
    "results/gim/tables/feature_attribution.csv",
]


@pytest.mark.skipif(shutil.which("snakemake") is None and not (Path(sys.executable).parent / "snakemake").exists(),
                    reason="snakemake not installed")
def test_tiny_gim_workflow(tmp_path):
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    cmd = [exe, "--cores", "1", *TARGETS, "--directory", str(tmp_path), "-s", str(ROOT / "Snakefile"),
           "--configfile", str(ROOT / "config/config.yaml"), str(ROOT / "config/test.yaml"),
           "--config", "papers=[gim]"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    for t in TARGETS:
        assert (tmp_path / t).stat().st_size > 0, t
    pub = pd.read_csv(tmp_path / "results/published/gim.csv")
    assert set(pub.status) <= {"reproduced", "differs", "not run"}
    assert pub.set_index("id").loc["gim_edges_gpt2", "status"] == "reproduced"
    loc = pd.read_csv(tmp_path / "results/gim/tables/localization.csv")
    assert set(loc.method) == {"eap", "eap-ig", "gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm"}
    curves = pd.read_csv(tmp_path / "results/gim/tables/curves.csv")
    full = curves[curves.fraction == 1.0]
    assert (full.faithfulness - 1).abs().max() < 1e-4  # the whole graph is the model
    import json
    circuit = json.loads(next((tmp_path / "results/gim").glob("*/*/circuits/gim.json")).read_text())
    assert set(circuit) == {"cfg", "nodes", "edges"} and circuit["cfg"]["n_layers"] == 1
