"""The real-LM tables of the documents (tooling/real_lms_table.py): the README's headline
row per model, the full claims table, and the cost table read from benchmark: files."""

import pandas as pd

from selfrepair.core.real_claims import COLUMNS
from selfrepair.tooling import real_lms_table as rt

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _bench(path, s, rss_mb, cpu):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BENCH_HEADER + f"{s}\t0:00:00\t{rss_mb}\t0\t0\t0\t0\t0\t0\t{cpu}\n")


def test_cost_table_reads_each_rule_and_model_and_nothing_else(tmp_path):
    b = tmp_path / "benchmarks"
    _bench(b / "lms" / "smollm2-135m" / "convert.tsv", 60.0, 1024.0, 35.0)
    _bench(b / "coax" / "lms" / "smollm2-135m" / "run.tsv", 1200.0, 2048.0, 900.0)
    _bench(b / "gim" / "lms" / "gemma-3-270m" / "run.tsv", 600.0, 5120.0, 540.0)
    _bench(b / "groundtruth" / "lms" / "gemma-3-270m" / "run.tsv", 120.0, 3072.0, 90.0)
    _bench(b / "coax" / "ioi" / "run.tsv", 5.0, 100.0, 4.0)  # a toy rule: not a real-LM job
    _bench(b / "coax" / "lms" / "gemma-3-270m" / "pruning.tsv", 3000.0, 6144.0, 2400.0)  # large scale only
    t = rt.cost_table(b, scales=["large"])
    assert list(zip(t["rule"], t["model"])) == [
        ("lm_convert", "smollm2-135m"),
        ("coax_lm", "smollm2-135m"),
        ("coax_lm_pruning", "gemma-3-270m"),
        ("gim_lm", "gemma-3-270m"),
        ("groundtruth_lm", "gemma-3-270m"),
    ]
    assert t["cpu_s"].tolist() == [35.0, 900.0, 2400.0, 540.0, 90.0]
    assert t["peak_rss_gb"].tolist() == [1.0, 2.0, 6.0, 5.0, 3.0]
    assert t["default_run"].tolist() == [True, True, False, True, True]
    md = rt.cost_markdown(t)
    assert "| `coax_lm` | SmolLM2-135M | 15.0 min | 20.0 min | 2.00 GB |" in md
    assert "| `coax_lm_pruning` (not in the default run) | Gemma-3-270M | 40.0 min | 50.0 min | 6.00 GB |" in md
    # the default run's jobs only: (35+900+540+90)/60, (60+1200+600+120)/60
    assert "| all of the default run | 2 models | 26.1 min | 33.0 min (jobs one after another) | |" in md
    # a configuration that prunes at the default scale puts the job in the default run's sum
    md = rt.cost_markdown(rt.cost_table(b, scales=["default", "large"]))
    assert "| all of the default run | 2 models | 66.1 min | 83.0 min (jobs one after another) | |" in md


def test_pruning_scales_from_the_config_else_the_schema(tmp_path):
    assert rt.pruning_scales() == ["large"]  # config/config.yaml names none: the schema's default
    (tmp_path / "config").mkdir()
    (tmp_path / "workflow" / "schemas").mkdir(parents=True)
    schema = rt.ROOT / "workflow" / "schemas" / "coax.schema.yaml"
    (tmp_path / "workflow" / "schemas" / "coax.schema.yaml").write_text(schema.read_text())
    (tmp_path / "config" / "config.yaml").write_text("coax:\n  lms:\n    pruning: {scales: [default]}\n")
    assert rt.pruning_scales(tmp_path) == ["default"]
    (tmp_path / "config" / "config.yaml").write_text("papers: [coax]\n")  # no coax section: the default
    assert rt.pruning_scales(tmp_path) == ["large"]


def test_cost_table_takes_the_latest_run_of_a_file(tmp_path):
    b = tmp_path / "benchmarks"
    f = b / "lms" / "gemma-3-270m" / "convert.tsv"
    _bench(f, 200.0, 4096.0, 150.0)
    f.write_text(f.read_text() + "100.0\t0:00:00\t2048.0\t0\t0\t0\t0\t0\t0\t95.0\n")
    assert rt.cost_table(b)["cpu_s"].tolist() == [95.0]


def test_cost_main_refuses_a_run_without_real_lm_jobs(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit, match="no real-LM benchmark files"):
        rt.main([str(tmp_path), "--out", str(tmp_path / "cost.csv")])


def _claims():
    rows = [
        [
            "smollm2-135m",
            "B",
            "lm_coax_auc_beats_baselines",
            "COAX beats",
            -0.23,
            -0.46,
            -0.06,
            2,
            "heads",
            "fails",
            0.1,
            "",
        ],
        [
            "smollm2-135m",
            "C",
            "lm_gim_best_cpr_ioi",
            "GIM best",
            -0.05,
            -0.19,
            0.07,
            20,
            "pairs",
            "inconclusive",
            0.2,
            "x|y",
        ],
        ["smollm2-135m", "C", "lm_gim_norm", "norm matters", 0.27, 0.12, 0.42, 20, "pairs", "holds", None, ""],
        ["gemma-3-270m", "B", "lm_coax_auc_beats_baselines", "COAX beats", None, None, None, 0, "", "not run", 0.1, ""],
    ]
    added = ("threshold", "side", "p", "verdict_holm")  # the columns real_claims.table computes
    t = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in added])
    t = t.assign(
        threshold=0.0, side="above", p=float("nan"), verdict_holm=t["verdict"].str.replace("fails", "inconclusive")
    )
    return t[COLUMNS]


def test_headline_row_counts_verdicts_and_quotes_the_key_claims():
    smol, gemma = rt.headline_rows(_claims())
    assert smol.startswith("| B, C on SmolLM2-135M (real LM")
    assert "| 3 | 1 | 1 | 1 | 0 |" in smol  # claims; holds, inconclusive, fails, not run
    assert "COAX AUC - best baseline -0.23 [-0.46, -0.06] (fails)" in smol
    assert "IOI GIM CPR - best of EAP, EAP-IG -0.05 [-0.19, 0.07] (inconclusive)" in smol
    assert "| 1 | 0 | 0 | 0 | 1 |" in gemma and gemma.endswith("| COAX AUC - best baseline (not run) |")


def test_full_table_keeps_every_claim_and_escapes_pipes():
    md = rt.full_markdown(_claims()).splitlines()
    assert len(md) == 2 + 4
    assert md[2].split(" | ")[8:10] == ["fails", "inconclusive"]  # the plain verdict, then Holm's
    assert md[3].startswith(
        "| SmolLM2-135M | C | GIM best | -0.05 | -0.19 | 0.07 | 20 | pairs | inconclusive | inconclusive | 0.2 | x/y |"
    )


def _rows(rows):
    cols = ["model", "paper", "id", "measured", "ci_low", "ci_high", "verdict"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_conventions_table_puts_each_claim_beside_its_earlier_measures(tmp_path):
    now = _rows([
        ("smollm2-135m", "gim", "lm_gim_best_cpr_ioi", 0.12, 0.02, 0.2, "holds"),
        ("smollm2-135m", "gim", "lm_gim_needs_tsg_ioi", -0.01, -0.05, 0.03, "inconclusive"),
        ("smollm2-135m", "coax", "lm_coax_auc_beats_baselines", 0.1, 0.0, 0.2, "holds"),  # paper B: not shown
    ])  # fmt: skip
    old = _rows([("smollm2-135m", "gim", "lm_gim_best_cpr_ioi", -0.047, -0.194, 0.0649, "inconclusive")])
    md = rt.conventions_markdown(now, {"grouped": old})
    lines = md.splitlines()
    assert lines[0] == "| model | claim id | MIB's (per-query-head key/value, MIB's BOS) | grouped | verdict moved |"
    assert (
        lines[2]
        == "| SmolLM2-135M | lm_gim_best_cpr_ioi | 0.12 [0.02, 0.2] holds | -0.047 [-0.194, 0.0649] inconclusive | yes |"
    )
    assert lines[3] == "| SmolLM2-135M | lm_gim_needs_tsg_ioi | -0.01 [-0.05, 0.03] inconclusive | (absent) |  |"
    assert len(lines) == 4  # the COAX row is paper B's
    # the block: only where the reference holds an earlier convention's file
    now.to_csv(tmp_path / "real_lms_claims.csv", index=False)
    assert rt.conventions_block(tmp_path) == {}
    old.to_csv(tmp_path / "real_lms_claims_per_group.csv", index=False)
    assert rt.conventions_block(tmp_path)["real_lms_conventions"].splitlines()[2] == lines[2]


def test_cpr_beside_cmd_says_where_the_verdicts_part():
    t = _rows([
        ("gemma-3-270m", "gim", "lm_gim_best_cpr_ioi", -0.23, -0.42, -0.08, "fails"),
        ("gemma-3-270m", "gim", "lm_gim_best_cmd_ioi", -0.045, -0.083, -0.02, "holds"),
        ("gemma-3-270m", "gim", "lm_gim_needs_tsg_ioi", 0.12, 0.08, 0.17, "holds"),
        ("gemma-3-270m", "gim", "lm_gim_needs_tsg_cmd_ioi", 0.006, -0.001, 0.023, "inconclusive"),
        ("gemma-3-270m", "gim", "lm_gim_needs_norm_ioi", 0.17, 0.14, 0.2, "holds"),
        ("gemma-3-270m", "gim", "lm_gim_needs_norm_cmd_ioi", -0.09, -0.1, -0.06, "holds"),
        ("gemma-3-270m", "coax", "lm_coax_auc_beats_baselines", 0.1, 0.0, 0.2, "holds"),  # paper B: not shown
    ])  # fmt: skip
    lines = rt.metrics_markdown(t).splitlines()
    assert lines[0] == "| model | claim | CPR (higher is better) | CMD (lower is better) | the two |"
    assert lines[2:] == [
        "| Gemma-3-270M | ioi: GIM beats EAP and EAP-IG | -0.23 [-0.42, -0.08] fails | -0.045 [-0.083, -0.02] holds | opposite |",
        "| Gemma-3-270M | ioi: GIM needs TSG | 0.12 [0.08, 0.17] holds | 0.006 [-0.001, 0.023] inconclusive | differ |",
        "| Gemma-3-270M | ioi: GIM needs gradient normalization | 0.17 [0.14, 0.2] holds | -0.09 [-0.1, -0.06] holds | agree |",
    ]  # the norm freeze has neither row: left out


def _fa(model="smollm2-135m"):
    # two prompts, two methods; prompt 1 not answered (IO's logit below S's)
    return pd.DataFrame({
        "model": model, "example": [0, 0, 1, 1], "method": ["gim", "grad_x_input"] * 2,
        "comprehensiveness": [0.5, 0.25, 9.0, 15.0], "comprehensiveness_prob": [0.9, 0.8, 0.7, 0.6],
        "target_logit": [4.0, 4.0, -0.5, -0.5], "foil_logit": [2.0, 2.0, 3.0, 3.0],
        "target_prob": [0.2, 0.2, 0.001, 0.001], "correct": [True, True, False, False],
    })  # fmt: skip


def test_fa_table_shows_each_prompt_and_the_means(tmp_path):
    lines = rt.fa_markdown({"smollm2-135m": _fa()}).splitlines()
    assert lines[0] == (
        "| model | prompt | IO logit | S logit | answered | P(IO) | gim comp. | grad_x_input comp. "
        "| gim comp. (prob) | grad_x_input comp. (prob) |"
    )
    assert lines[2] == "| SmolLM2-135M | 0 | 4 | 2 | yes | 0.2 | 0.5 | 0.25 | 0.9 | 0.8 |"
    assert lines[3] == "| SmolLM2-135M | 1 | -0.5 | 3 | no | 0.001 | 9 | 15 | 0.7 | 0.6 |"
    assert lines[4] == "| SmolLM2-135M | mean, all 2 |  |  |  |  | 4.75 | 7.62 | 0.8 | 0.7 |"  # (0.25 + 15) / 2
    assert lines[5] == "| SmolLM2-135M | mean, the 1 answered |  |  |  |  | 0.5 | 0.25 | 0.9 | 0.8 |"
    assert lines[6] == "| SmolLM2-135M | median, the 1 answered |  |  |  |  | 0.5 | 0.25 | 0.9 | 0.8 |"
    # the block: each model's reference copy, in the models' order; none, no block
    assert rt.fa_block(tmp_path) == {}
    _fa("gemma-3-270m").to_csv(tmp_path / "real_lms_fa_gemma-3-270m.csv", index=False)
    _fa().to_csv(tmp_path / "real_lms_fa_smollm2-135m.csv", index=False)
    block = rt.fa_block(tmp_path)["real_lms_fa"].splitlines()
    assert block[2].startswith("| SmolLM2-135M | 0 |") and block[7].startswith("| Gemma-3-270M | 0 |")


def test_fa_table_refuses_an_older_table():
    import pytest

    with pytest.raises(ValueError, match="rerun"):
        rt.fa_markdown({"smollm2-135m": _fa().drop(columns=["correct"])})


def test_seeds_block_renders_each_models_halves_in_order(tmp_path):
    from selfrepair.tooling import coax_lm_tables as ct

    t = pd.DataFrame(
        {
            "seeding": ["name_movers", "name_movers"],
            "role": ["primaries", "backups"],
            "half_a": ["L23H0 L28H1", None],
            "half_b": ["L23H0 L24H2", "L25H1"],
            "n_prompts_a": [16, 16],
            "n_prompts_b": [16, 16],
            "jaccard": [1 / 3, 0.0],
            "kept_share": [0.5, float("nan")],
        }
    )
    t.to_csv(tmp_path / "real_lms_seeds_gemma-3-270m.csv", index=False)
    t.to_csv(tmp_path / "real_lms_seeds_smollm2-135m.csv", index=False)
    md = ct.seeds_block(tmp_path)["real_lms_seeds"].splitlines()
    assert len(md) == 2 + 4 and md[2].startswith("| SmolLM2-135M |") and md[4].startswith("| Gemma-3-270M |")
    assert md[2] == "| SmolLM2-135M | name movers | primaries | L23H0 L28H1 | L23H0 L24H2 | 16, 16 | 0.33 | 0.50 |"
    assert md[3] == "| SmolLM2-135M | name movers | backups | (none) | L25H1 | 16, 16 | 0.00 |  |"
    assert ct.seeds_block(tmp_path / "absent") == {}
