"""The workflow itself: config validation, lint, format, and a tiny end-to-end run of
the paper-A DAG (tests/golden holds its regression values)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import golden_suite
from conftest import copy_run
from selfrepair.core import numerics, runtime

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOLDEN = ROOT / "tests" / "golden"


def snakemake(*args, cwd=ROOT, check=True, timeout=1800, env=None):
    env = dict(os.environ if env is None else env, HF_HUB_OFFLINE="1")
    cmd = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def configs(*extra):
    return ["--configfile", str(ROOT / "config/config.yaml"), str(ROOT / "config/test.yaml"), *map(str, extra)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, message",
    [
        ("heroes:\n  seeds: []\n", "heroes.seeds: [] should be non-empty"),
        ("heroes:\n  train: {lrate: 0.1}\n", "heroes.train: Additional properties are not allowed ('lrate'"),
        ("heroes:\n  seeds: [x]\n", "heroes.seeds.0: 'x' is not of type 'integer'"),
        ("devise: cpu\n", "Additional properties are not allowed ('devise'"),
        ("heroes:\n  tasks: [shuffle]\n", "heroes.tasks.0: 'shuffle' is not one of"),
        ("heroes:\n  train: {min_len: 9, max_len: 4}\n", "heroes.train.min_len (9) > heroes.train.max_len (4)"),
        ("heroes:\n  grid: {cells: [shuffle]}\n", "heroes.grid.cells.0: 'shuffle' is not one of"),
        ("coax:\n  real: {prompt_style: bos}\n", "coax.real.prompt_style: 'bos' is not one of"),
        ("heroes:\n  train: {lr: .nan}\n", "heroes.train.lr: nan is not a finite number"),
        ("gim:\n  train: {lr: .inf}\n", "gim.train.lr: inf is not a finite number"),
        (
            "gim:\n  models:\n    - {name: a, n_layers: 1, n_heads: 3, d_model: 16, d_mlp: 32}\n",
            "gim.models.0: n_heads (3) does not divide d_model (16)",
        ),
        (
            "gim:\n  models:\n    - {name: a, n_layers: 1, n_heads: 2, d_model: 16, d_mlp: 32}\n"
            "    - {name: a, n_layers: 2, n_heads: 2, d_model: 16, d_mlp: 32}\n",
            "gim.models: name 'a' appears 2 times",
        ),
        ("coax:\n  pruning: {sparsities: []}\n", "coax.pruning.sparsities: [] should be non-empty"),
        (  # MIB's batch weighting needs full batches
            "gim:\n  n_eval: 16\n  batch_size: 6\n",
            "gim.batch_size (6) does not divide gim.n_eval (16): under gim.weighting mib",
        ),
        (
            "gim:\n  mib: {n_eval: 100, batch_size: 16}\n",
            "gim.mib.batch_size (16) does not divide gim.mib.n_eval (100)",
        ),
        ("gim:\n  weighting: batch\n", "gim.weighting: 'batch' is not one of ['mib', 'example']"),
        (  # CPR and CMD, areas over them, changed sign
            "gim:\n  fractions: [1.0, 0.5, 0.1]\n",
            "gim.fractions: [1.0, 0.5, 0.1] is not in ascending order (each value must be larger than the one "
            "before; write [0.1, 0.5, 1.0])",
        ),
        # a learning rate of 0 (or below) in every section that trains
        ("heroes:\n  train: {lr: 0}\n", "heroes.train.lr: 0 is less than or equal to the minimum of 0"),
        ("coax:\n  ioi:\n    train: {lr: -0.001}\n", "coax.ioi.train.lr: -0.001 is less than or equal to the minimum"),
        (
            "coax:\n  induction:\n    train: {lr: 0}\n",
            "coax.induction.train.lr: 0 is less than or equal to the minimum",
        ),
        (
            "coax:\n  pruning:\n    train: {lr: 0.0}\n",
            "coax.pruning.train.lr: 0.0 is less than or equal to the minimum",
        ),
        ("gim:\n  train: {lr: 0}\n", "gim.train.lr: 0 is less than or equal to the minimum of 0"),
        pytest.param(
            "device: cuda\n",
            "device: 'cuda', but CUDA is not available on this machine",
            marks=pytest.mark.skipif(runtime.cuda_available(), reason="this check needs a machine without CUDA"),
        ),
        # names that must be among others of the config
        ("gim:\n  speed: {model: nosuch}\n", "gim.speed.model: 'nosuch' is not a model of gim.models (one of: tiny)"),
        ("gim:\n  speed: {task: ioi}\n", "gim.speed.task: 'ioi' is not one of gim.tasks (arithmetic)"),
        # more examples than a task has distinct prompts (arithmetic: 20 x 20 operands)
        ("gim:\n  n_eval: 5000\n", "gim.n_eval: 5000 exceeds the 400 distinct prompts of task arithmetic"),
        ("gim:\n  speed: {n_eval: 401}\n", "gim.speed.n_eval: 401 exceeds the 400 distinct prompts of task arithmetic"),
        # paper B's real-LM seeds are chosen again on each half of the truth prompts: 2 per template
        (
            "coax:\n  lms:\n    default: {n_truth: 3}\n",
            "coax.lms.default.n_truth: 3 truth prompts leave a half of them without a template (the seeds are "
            "chosen again on each half): at least 4 for templates ABBA, BABA",
        ),
        ("coax:\n  lms:\n    templates: [ABBA]\n    default: {n_truth: 2}\n", None),
    ],
)
def test_invalid_config_is_rejected_naming_the_key(tmp_path, bad, message):
    f = tmp_path / "bad.yaml"
    f.write_text(bad)
    env = {k: v for k, v in os.environ.items() if k != "SELFREPAIR_ASSUME_CUDA"}
    r = snakemake("-n", "--directory", str(tmp_path), *configs(f), check=False, env=env)
    if message is None:  # the valid edge of a check beside it: accepted
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


@pytest.mark.slow
def test_a_claim_without_its_number_is_rejected_naming_it(tmp_path):
    """config key published: a claim that lost its value (or tolerance) stops the parse,
    naming the file and the claim, not the job that compares it hours later."""
    claims = yaml.safe_load((ROOT / "config" / "published.yaml").read_text())
    del claims["heroes"][0]["value"]
    del claims["coax"][1]["tolerance"]
    f = tmp_path / "claims.yaml"
    f.write_text(yaml.safe_dump(claims, sort_keys=False))
    r = snakemake("-n", "--directory", str(tmp_path), *configs(), "--config", f"published={f}", check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"published: {f}: numeric claim {claims['heroes'][0]['id']!r} of 'heroes' needs a number 'value'" in out
    assert f"numeric claim {claims['coax'][1]['id']!r} of 'coax' needs a number 'tolerance'" in out


@pytest.mark.slow
def test_a_yaml_error_in_the_default_config_names_file_line_and_column(tmp_path):
    """The Snakefile's own `configfile: config/config.yaml` (of the working directory):
    Snakemake's message names neither file nor line; the parse's does."""
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "published.yaml", tmp_path / "config")
    lines = (ROOT / "config" / "config.yaml").read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("papers:"))
    lines[i] = "papers: [heroes, coax"  # the bracket never closes
    (tmp_path / "config" / "config.yaml").write_text("\n".join(lines) + "\n")
    r = snakemake("-n", "--directory", str(tmp_path), check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"{tmp_path / 'config' / 'config.yaml'}: not valid YAML at line " in out, out[-2000:]
    assert f"(while parsing a flow sequence at line {i + 1})" in out


def test_check_config_names_a_configfile_snakemake_cannot_read(tmp_path):
    """A --configfile that is missing or not YAML fails inside Snakemake's CLI, before the
    Snakefile (a traceback; "Config file is not valid JSON or YAML" without the file).
    `make check-config` with the run's options names the file and, for YAML, line and
    column; the good files pass."""
    from selfrepair.tooling.config_files import main, named_files, yaml_problem

    bad = tmp_path / "bad.yaml"
    bad.write_text("gim:\n  n_eval: 20\n  seeds: [0, 1\n")
    args = ["--configfile", "config/config.yaml", str(bad), "--config", "papers=[gim]", "--directory", "/x"]
    assert named_files(args) == [Path("config/config.yaml"), Path("config/config.yaml"), bad]
    assert named_files(["--configfile=a.yaml"])[1:] == [Path("a.yaml")]
    assert yaml_problem(ROOT / "config" / "test.yaml") is None
    msg = yaml_problem(bad)
    assert msg.startswith(f"{bad}: not valid YAML at line 4, column 1:"), msg
    assert "(while parsing a flow sequence at line 3)" in msg
    assert yaml_problem(tmp_path / "gone.yaml") == f"{tmp_path / 'gone.yaml'}: no such config file"
    assert main(["--configfile", str(ROOT / "config" / "test.yaml")]) == 0
    r = subprocess.run(
        ["make", "check-config", f"SNAKEMAKE_ARGS=--configfile config/config.yaml {bad} {tmp_path / 'gone.yaml'}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0
    assert f"invalid config: {bad}: not valid YAML at line 4" in r.stderr
    assert f"invalid config: {tmp_path / 'gone.yaml'}: no such config file" in r.stderr


@pytest.mark.slow
def test_an_empty_config_file_is_named_as_empty(tmp_path):
    """Issue 50: Snakemake's "Config file must be given as JSON or YAML" names no file.
    `make check-config` names an empty --configfile; the Snakefile an empty config/config.yaml."""
    from selfrepair.tooling.config_files import yaml_problem

    empty, comments, listed = tmp_path / "empty.yaml", tmp_path / "comments.yaml", tmp_path / "list.yaml"
    empty.write_text("")
    comments.write_text("# gim:\n#   n_eval: 20\n")
    listed.write_text("- device: cpu\n")
    for f in (empty, comments):
        assert yaml_problem(f) == (
            f"{f}: the config file is empty (no keys, or comments only): give it the keys to set "
            "(e.g. device: cpu), or leave it off the command line"
        )
    assert (
        yaml_problem(listed)
        == f"{listed}: holds a list, not keys at its top level (key: value lines, e.g. device: cpu)"
    )
    r = subprocess.run(
        ["make", "check-config", f"SNAKEMAKE_ARGS=--configfile config/config.yaml {empty}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0
    assert f"invalid config: {empty}: the config file is empty" in r.stderr
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("")
    r = snakemake("-n", "--directory", str(tmp_path), check=False)
    assert r.returncode != 0
    assert f"{tmp_path / 'config' / 'config.yaml'}: the config file is empty" in r.stdout + r.stderr


@pytest.mark.slow
def test_gpu_profile_shares_one_gpu_between_jobs(tmp_path):
    """The gpu profile lets several compute jobs share the one GPU (a slot count above 1,
    every compute job asking for one slot) and fits a 16-core host; checked by a dry run
    with the profile (no GPU needed)."""
    prof = ROOT / "workflow" / "profiles" / "gpu"
    p = yaml.safe_load((prof / "profile.yaml").read_text())
    slots = int(dict(x.split("=") for x in p["resources"])["gpu"])
    threads = int(dict(x.split("=") for x in p["config"])["threads"])
    assert 1 < slots and slots * threads <= 16
    r = snakemake(
        "-n",
        "--directory",
        str(tmp_path),
        "--workflow-profile",
        str(prof),
        *configs(),
        "--config",
        "papers=[gim]",
        "device=cuda",
        env=dict(os.environ, SELFREPAIR_ASSUME_CUDA="1"),  # plans a GPU run here, without a GPU
    )
    out = r.stdout + r.stderr
    compute = out.count("rule gim_train:")
    assert compute >= 2 and out.count("gpu=1") >= compute  # training jobs each take one slot
    assert "gpu=0" not in out


@pytest.mark.slow
def test_lint_is_clean():
    r = snakemake("--lint", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr


def test_snakefmt_is_clean():
    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    r = subprocess.run([str(BIN / "snakefmt"), "--check", *map(str, files)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command):
    r = subprocess.run(
        [str(BIN / "ruff"), *command, "src", "scripts", "tests", "benchmarks", "peers"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_conda_env_mirrors_the_lock():
    lock = [
        line.strip()
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    env = yaml.safe_load((ROOT / "envs" / "selfrepair.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert [p for p in pip if not p.startswith("-e")] == lock
    assert "torch==2.13.0" in lock


@pytest.fixture(scope="module")
def tiny_run(tiny_runs, tmp_path_factory):
    """The paper-A DAG on config/test.yaml (2 seeds x 2 tasks, protocol grid), scoring the
    committed checkpoints of tests/golden (fixed weights: no training job runs, so the
    values below do not depend on how this CPU trains; tests/test_golden.py checks that):
    a copy, for this module's tests that write in it, of the session's tiny run of the
    three papers together (tiny_runs, tests/conftest.py), with that run's options."""
    d = copy_run(tiny_runs, tmp_path_factory.mktemp("e2e") / "run")
    return d, golden_suite.tiny_args(d, paper=golden_suite.ALL_PAPERS)


def read(d, name):
    return pd.read_csv(d / "results" / "heroes" / "tables" / name)


@pytest.mark.slow
def test_tiny_run_outputs_exist_and_agree(tiny_run):
    d, _ = tiny_run
    figs = ["g_vs_c", "waterfall", "roles_by_layer", "role_stability", "redundancy", "pruning", "attention"]
    for f in figs:
        for ext in ("png", "pdf"):
            assert (d / "results" / "heroes" / "figures" / f"{f}.{ext}").stat().st_size > 1000
    seeds = read(d, "seeds.csv")
    assert sorted(zip(seeds["task"], seeds["seed"])) == [("reverse", 42), ("reverse", 123), ("sort", 42), ("sort", 123)]
    comps = read(d, "components.csv")
    kept = comps[comps["status"] == "kept"]
    # 2 layers x (2 heads + MLP) per kept seed; Delta = rank(G) - rank(C) recomputed here
    from scipy.stats import rankdata, spearmanr

    for (task, seed), s in kept.groupby(["task", "seed"]):
        assert len(s) == 6
        assert list(s["delta"]) == pytest.approx(list(rankdata(s["G"]) - rankdata(s["C"])))
        row = seeds[(seeds["task"] == task) & (seeds["seed"] == seed)].iloc[0]
        if s["C"].nunique() > 1:
            assert row["rho"] == pytest.approx(spearmanr(s["G"], s["C"]).statistic)
        abl = pd.read_csv(d / f"results/heroes/{task}/seed{seed}/ablations.csv")
        assert set(abl["mode"]) == {"mean", "zero"} and (abl["n"] == 200).all()
        grads = pd.read_csv(d / f"results/heroes/{task}/seed{seed}/gradients.csv")
        assert (grads["n_batches"] == 4).all() and (grads["G"] > 0).all()
        # the per-sequence outcomes behind C, and each role's stability
        import torch

        out = torch.load(d / f"results/heroes/{task}/seed{seed}/outcomes.pt", weights_only=True)
        for mode in ("mean", "zero"):
            m = abl[abl["mode"] == mode]
            o = out[mode].float()
            assert out[mode].dtype == torch.bool and tuple(o.shape) == (200, 1 + len(m))
            c = (o[:, :1] - o[:, 1:]).mean(0)
            idx = [out["columns"].index(n) - 1 for n in m["component"]]
            assert c[idx].tolist() == pytest.approx(list(m["C"]), abs=1e-6)
        assert s["stability"].between(0, 1).all() and (s["stable"] == (s["stability"] >= 0.9)).all()
        assert row["n_heroes_stable"] <= row["n_heroes"] and row["n_bloats_stable"] <= row["n_bloats"]
    pub = pd.read_csv(d / "results" / "published" / "heroes.csv")
    claims = yaml.safe_load((ROOT / "config" / "published.yaml").read_text())["heroes"]
    assert list(pub["id"]) == [c["id"] for c in claims]
    assert set(pub["status"]) <= {"reproduced", "differs", "fragile", "not run"}
    assert {"ci_low", "ci_high", "reproduced_stable"} <= set(pub.columns)
    assert pub.set_index("id")[["ci_low", "ci_high"]].loc["rho_sort"].notna().all()
    summary = pd.read_csv(d / "results" / "published" / "summary.csv")
    assert len(summary[summary["paper"] == "heroes"]) == len(pub)
    # the ground truth ran on the tiny paper-A models too: its paper-A findings are measured
    gt = summary[summary["paper"] == "groundtruth"].set_index("id")
    assert gt.loc["gt_heroes_spearman_single", "status"] == "new"
    assert gt.loc["gt_gim_minus_eap", "status"] == "new"  # paper C's models are in this run too


@pytest.mark.slow
def test_tiny_protocol_grid(tiny_run):
    """The protocol grid on the tiny config: cells default, site and authors."""
    d, _ = tiny_run
    g = d / "results" / "heroes" / "grid"
    for f in ("rho", "rho_vs_n", "superadditivity"):
        for ext in ("png", "pdf"):
            assert (g / "figures" / f"{f}.{ext}").stat().st_size > 1000
    comps = pd.read_csv(g / "tables" / "components.csv")
    cells = comps.groupby("cell")["seed"].unique().map(sorted).to_dict()
    assert cells == {"default": [42, 123], "site": [42], "authors": [42, 123]}
    # The default cell measures G and C again with other code (raw G rescaled, its own
    # ablation loop): it must give the main pipeline's numbers on the same models.
    main = read(d, "components.csv")
    main = main[main["status"] == "kept"].set_index(["task", "seed", "component"]).sort_index()
    dflt = (
        comps[(comps["cell"] == "default") & (comps["status"] == "kept")]
        .set_index(["task", "seed", "component"])
        .sort_index()
    )
    assert list(dflt.index) == list(main.index)
    assert list(dflt["G"]) == pytest.approx(list(main["G"]), rel=1e-6)
    assert list(dflt["C"]) == pytest.approx(list(main["C"]), abs=1e-6)
    # the site cell shares G and the MLPs' C with the default cell; heads move
    site = comps[comps["cell"] == "site"].set_index(["task", "seed", "component"])
    both = dflt.loc[site.index]
    assert list(site["G"]) == pytest.approx(list(both["G"]))
    mlp = site["kind"] == "mlp"
    assert list(site.loc[mlp, "C"]) == pytest.approx(list(both.loc[mlp, "C"]))
    # the authors' cell trained its own models under its protocol
    for task in ("reverse", "sort"):
        meta = yaml.safe_load((g / "train" / "per_example-torch" / task / "seed42" / "train.json").read_text())
        assert meta["protocol"] == {"padding": "per_example", "init": "torch"}
    authors = comps[(comps["cell"] == "authors") & (comps["status"] == "kept")]
    assert (authors["n_eval"] == 100).all()
    rho = pd.read_csv(g / "tables" / "rho.csv")
    assert set(rho["cell"]) == {"default", "site", "authors"}
    noise = pd.read_csv(g / "tables" / "noise.csv")
    assert sorted(noise["n"].unique()) == [50, 100, 200]
    claims = pd.read_csv(g / "tables" / "claims.csv")
    assert set(claims["status"]) <= {"reproduced", "differs", "fragile", "not run"}
    paired = pd.read_csv(g / "tables" / "paired.csv")
    assert set(paired["cell"]) == {"site", "authors"} and (paired["n_paired"] <= 2).all()
    assert set(claims.loc[claims["cell"] != "default", "change"]) <= {
        "raises",
        "lowers",
        "no clear change",
        "no clear change (one paired seed)",
        "no paired seeds",
        "no per-seed value",
    }


# Float-rounding tolerances of the fixed-weight scores, from the computation: G is a
# float32 gradient norm (products and sums of a few thousand terms: relative error of
# order 1e-6 between kernel orders; 1e-4 leaves room for any x86 kernel set). C and the
# accuracies are exact-match shares of n sequences: an argmax near a tie may flip on
# another CPU's kernels, so they may move by two sequences (2 / n).
G_REL = 1e-4
N_EVAL = 200  # config/test.yaml heroes.scores.n_eval
N_SELECT = 200  # config/test.yaml heroes.ood.n_select


def _same_counts(golden, got):
    """Roles and rho are functions of the ranks of C: compared exactly where every C of
    the model came back exactly (always under the portable mode)."""
    return (golden - got).abs().max() < 1e-12


@pytest.mark.slow
def test_tiny_run_matches_golden_values(tiny_run):
    """Regression on fixed weights: a code change that moves a score fails here until
    tests/golden is deliberately regenerated (python tests/golden/update.py)."""
    d, _ = tiny_run
    seeds = read(d, "seeds.csv").set_index(["task", "seed"]).sort_index()
    golden = pd.read_csv(GOLDEN / "heroes_tiny_seeds.csv").set_index(["task", "seed"]).sort_index()
    assert list(seeds.index) == list(golden.index)
    for col in ("N", "train_steps", "status"):
        assert list(seeds[col].fillna(-1)) == list(golden[col].fillna(-1)), col
    assert list(seeds["id_accuracy"]) == list(golden["id_accuracy"])  # from train.json, committed
    assert list(seeds["ood_accuracy"]) == pytest.approx(list(golden["ood_accuracy"]), abs=2 / N_SELECT + 1e-9)
    comps = read(d, "components.csv").set_index(["task", "seed", "component"]).sort_index()
    gcomps = pd.read_csv(GOLDEN / "heroes_tiny_components.csv").set_index(["task", "seed", "component"]).sort_index()
    assert list(comps.index) == list(gcomps.index)
    assert list(comps["G"]) == pytest.approx(list(gcomps["G"]), rel=G_REL)
    for col in ("C", "C_zero"):
        assert list(comps[col]) == pytest.approx(list(gcomps[col]), abs=2 / N_EVAL + 1e-9), col
    for key, g in gcomps.groupby(level=["task", "seed"]):
        got = comps.loc[g.index]
        if _same_counts(g["C"], got["C"]):
            assert list(got["role"]) == list(g["role"]), key
            assert list(got["delta"]) == list(g["delta"]), key
            row, grow = seeds.loc[key], golden.loc[key]
            assert [row["n_heroes"], row["n_bloats"]] == [grow["n_heroes"], grow["n_bloats"]], key
            assert row["rho"] == pytest.approx(grow["rho"], abs=1e-9, nan_ok=True), key
    grid = pd.read_csv(d / "results/heroes/grid/tables/seeds.csv").set_index(["cell", "task", "seed"]).sort_index()
    ggrid = pd.read_csv(GOLDEN / "heroes_tiny_grid.csv").set_index(["cell", "task", "seed"]).sort_index()
    assert list(grid.index) == list(ggrid.index)
    assert list(grid["N"]) == list(ggrid["N"])
    assert list(grid["baseline_acc"]) == pytest.approx(list(ggrid["baseline_acc"]), abs=2 / N_EVAL + 1e-9)
    exact = (grid["baseline_acc"] - ggrid["baseline_acc"]).abs() < 1e-12
    for col in ("heroes", "bloats"):
        assert list(grid.loc[exact, col].fillna(-1)) == list(ggrid.loc[exact, col].fillna(-1)), col
    assert list(grid.loc[exact, "rho"]) == pytest.approx(list(ggrid.loc[exact, "rho"]), abs=1e-9, nan_ok=True)


@pytest.mark.slow
def test_tiny_run_is_complete_resumes_and_is_deterministic(tiny_run):
    d, args = tiny_run
    r = snakemake("-n", *args)
    assert "Nothing to be done" in r.stdout + r.stderr
    # An interrupted run: one seed's analysis, the aggregate tables, the figures and the
    # published table are missing. Rerunning the default target rebuilds exactly those
    # (no training, no scoring), and they come back identical.
    seed_dir = d / "results/heroes/sort/seed42"
    tables = d / "results/heroes/tables"
    before = {f: (seed_dir / f).read_bytes() for f in ("roles.csv", "redundancy.csv", "pruning.csv")}
    before_tables = {f.name: f.read_bytes() for f in tables.glob("*.csv")}
    before_scores = (seed_dir / "ablations.csv").read_bytes()
    for f in before:
        (seed_dir / f).unlink()
    shutil.rmtree(tables)
    shutil.rmtree(d / "results/heroes/figures")
    shutil.rmtree(d / "results/published")
    r = snakemake("-n", *args)
    planned = r.stdout + r.stderr
    assert "heroes_roles" in planned and "heroes_aggregate" in planned
    assert "rule heroes_train:" not in planned and "rule heroes_scores:" not in planned
    snakemake("--cores", "2", *args)
    for f, content in before.items():
        assert (seed_dir / f).read_bytes() == content, f
    for name, content in before_tables.items():
        assert (tables / name).read_bytes() == content, name
    assert (seed_dir / "ablations.csv").read_bytes() == before_scores


@pytest.mark.slow
def test_report_renders_without_docutils_messages(tiny_run, tmp_path):
    """The HTML report of the tiny run: no docutils system message anywhere (a category
    name with ': ' once became a duplicate link target on every page)."""
    d, args = tiny_run
    out = tmp_path / "report.html"
    snakemake("--report", str(out), *args)
    html = out.read_text()
    assert len(html) > 10_000
    for bad in ("System Message", "Duplicate explicit target", "Unknown target name"):
        assert bad not in html, bad


@pytest.mark.slow
def test_strict_mode_fails_on_differs(tiny_run):
    d, args = tiny_run
    pub = pd.read_csv(d / "results" / "published" / "heroes.csv")
    assert (pub["status"] == "differs").any()  # the tiny model is not the paper's
    r = snakemake("--cores", "1", *args, "strict=True", "-R", "published_summary", check=False)
    assert r.returncode != 0
    log = (d / "logs" / "published_summary.log").read_text()
    assert "strict mode" in log and "published numbers differ" in log
    assert not (d / "results" / "published" / "summary.csv").exists()
    snakemake("--cores", "1", *args)  # restore it for the tests that follow


@pytest.mark.slow
def test_corrupted_checkpoint_fails_clearly_and_loses_nothing(tiny_run, tmp_path):
    d, args = tiny_run
    weights = next((d / "results/heroes/reverse/seed42/model").glob("*.safetensors"))
    saved = weights.read_bytes()
    other = (d / "results/heroes/reverse/seed123/ablations.csv").read_bytes()
    try:
        weights.write_bytes(saved[:200])
        target = "results/heroes/reverse/seed42/ood.json"  # relative to --directory
        r = snakemake(
            "--cores", "1", *args, "-R", "heroes_ood", "--allowed-rules", "heroes_ood", "--", target, check=False
        )
        assert r.returncode != 0
        log = (d / "logs/heroes/reverse/seed42/ood.log").read_text()
        assert "cannot load the checkpoint" in log and "seed42/model" in log
        assert not (d / "results/heroes/reverse/seed42/ood.json").exists()  # no partial output
        assert (d / "results/heroes/reverse/seed123/ablations.csv").read_bytes() == other
    finally:
        weights.write_bytes(saved)


@pytest.mark.slow
def test_cluster_path_submits_polls_and_collects(tiny_run):
    """Snakemake's generic cluster executor with the local stand-in for sbatch: jobs go
    through submission, status polling and collection."""
    d, args = tiny_run
    prof = ROOT / "workflow" / "profiles" / "local-cluster"
    target = "results/heroes/sort/seed123/ood.json"  # heroes_ood is not a localrule
    before = (d / target).read_bytes()
    r = snakemake(
        "--workflow-profile",
        str(prof),
        "--cluster-generic-submit-cmd",
        str(prof / "submit.sh"),
        "--cluster-generic-status-cmd",
        str(prof / "status.sh"),
        *args,
        "-R",
        "heroes_ood",
        "--allowed-rules",
        "heroes_ood",
        "--",
        target,
    )
    out = r.stdout + r.stderr
    assert "Submitted job" in out and "Finished jobid" in out
    ids = list((d / ".snakemake" / "local-cluster").glob("*.rc"))
    assert ids and all(f.read_text().strip() == "0" for f in ids)
    assert (d / target).read_bytes() == before


SEED_MAX = 2**32 - 1  # what torch, numpy's default_rng and a Snakemake wildcard all take


def _integers(node, path=""):
    """(key path, schema) of every integer of a schema, list items and nested objects too."""
    if isinstance(node, dict):
        t = node.get("type")
        if t == "integer" or (isinstance(t, list) and "integer" in t):
            yield path, node
        for k, v in (node.get("properties") or {}).items():
            yield from _integers(v, f"{path}.{k}" if path else k)
        for k in ("items", "additionalProperties"):
            if isinstance(node.get(k), dict):
                yield from _integers(node[k], f"{path}[]")


# schemas with no integer setting at all (lms: model names and a scale's name)
SCHEMAS_WITHOUT_NUMBERS = {"lms.schema.yaml"}


@pytest.mark.parametrize("schema", sorted(p.name for p in (ROOT / "workflow/schemas").glob("*.yaml")))
def test_every_integer_of_the_schema_has_a_ceiling_and_seeds_are_32_bit(schema):
    """Issue 50: a number that sizes memory or work, or becomes an RNG seed, is bounded in
    the schema (an unbounded one crashed in the job: torch's overflow, a 40 TB allocation)."""
    import yaml

    found = list(_integers(yaml.safe_load((ROOT / "workflow/schemas" / schema).read_text())))
    if schema in SCHEMAS_WITHOUT_NUMBERS:
        assert found == [], f"{schema} has numbers now: take it out of SCHEMAS_WITHOUT_NUMBERS"
        return
    assert found
    assert [p for p, s in found if "maximum" not in s] == []
    seeds = [(p, s.get("minimum"), s["maximum"]) for p, s in found if "seed" in p.rsplit(".", 1)[-1]]
    assert all((lo, hi) == (0, SEED_MAX) for _, lo, hi in seeds), seeds
    if schema != "config.schema.yaml":
        assert seeds


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, message",
    [
        # a Snakemake wildcard's PeriodicWildcardError, no key named
        ("heroes:\n  seeds: [99999999999999999999]\n", "heroes.seeds.0: 99999999999999999999 is greater than the maximum of 4294967295"),
        # torch's "Overflow when unpacking long long" in the training log
        ("gim:\n  seeds: [18446744073709551616]\n", "gim.seeds.0: 18446744073709551616 is greater than the maximum of 4294967295"),
        ("coax:\n  ioi: {seeds: [-1]}\n", "coax.ioi.seeds.0: -1 is less than the minimum of 0"),
        # DefaultCPUAllocator: you tried to allocate 40000000000000 bytes
        ("heroes:\n  scores: {n_eval: 1000000000000}\n", "heroes.scores.n_eval: 1000000000000 is greater than the maximum of 100000"),
        ("gim:\n  mib: {batch_size: 10000000}\n", "gim.mib.batch_size: 10000000 is greater than the maximum of 65536"),
    ],
)  # fmt: skip
def test_out_of_range_seeds_and_sizes_stop_at_parse_time_naming_the_key(tmp_path, bad, message):
    f = tmp_path / "bad.yaml"
    f.write_text(bad)
    r = snakemake("-n", "--directory", str(tmp_path), *configs(f), check=False)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(
    not numerics.can_pin(), reason="numerics exact preloads a compiled library on x86-64 with AVX2 only"
)
def test_an_unusable_cache_folder_stops_the_parse_naming_it(tmp_path):
    """Issue 50: the parse ended in FileExistsError and a seven-frame traceback."""
    (tmp_path / "a-file").write_text("")
    env = dict(os.environ, SELFREPAIR_CACHE=str(tmp_path / "a-file" / "cache"))
    r = snakemake("-n", "--directory", str(tmp_path), *configs(), "--config", "numerics=exact", check=False, env=env)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"numerics: the cache folder {tmp_path / 'a-file' / 'cache'} cannot be used" in out, out[-2000:]
    assert "SELFREPAIR_CACHE" in out and "FileExistsError" not in out and "NotADirectoryError" not in out


@pytest.mark.slow
def test_a_touched_script_reruns_its_rule_unless_script_times_are_ignored(tmp_path):
    """What docs/INTEGRITY.md says of Snakemake's code trigger (a touched script reran the
    whole of paper A): a script newer than the outputs reruns its rule with its content
    unchanged; the documented --rerun-triggers without `code` plans nothing."""
    (tmp_path / "Snakefile").write_text('rule a:\n    output: "a.txt"\n    script: "s.py"\n')
    (tmp_path / "s.py").write_text('open(snakemake.output[0], "w").write("1")\n')
    sm = [str(BIN / "snakemake"), "--cores", "1"]
    subprocess.run([*sm, "a.txt"], cwd=tmp_path, check=True, capture_output=True)
    later = (tmp_path / "a.txt").stat().st_mtime + 5
    os.utime(tmp_path / "s.py", (later, later))  # touched, content unchanged
    r = subprocess.run([*sm, "-n", "a.txt"], cwd=tmp_path, capture_output=True, text=True)
    assert "reason: Code has changed since last execution" in r.stdout + r.stderr
    triggers = ["--rerun-triggers", "mtime", "params", "input", "software-env", "--"]
    r = subprocess.run([*sm, "-n", *triggers, "a.txt"], cwd=tmp_path, capture_output=True, text=True)
    assert "Nothing to be done" in r.stdout + r.stderr
    assert "--rerun-triggers mtime params input software-env" in (ROOT / "docs/INTEGRITY.md").read_text().replace(
        "\n", " "
    )


def test_the_c_yaml_loader_reads_every_config_and_schema_as_safe_load_does():
    """selfrepair.core.yaml_text (libyaml's parser, which the workflow uses at parse time):
    the same objects as yaml.safe_load for every file it reads there, and the C loader in
    force where PyYAML has libyaml (the pinned wheel has)."""
    import yaml

    from selfrepair.core import yaml_text

    files = sorted([*(ROOT / "workflow/schemas").glob("*.yaml"), *(ROOT / "config").glob("*.yaml")])
    assert len(files) > 6
    for f in files:
        assert yaml_text.load(f.read_text()) == yaml.safe_load(f.read_text()), f
    assert yaml_text.LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert yaml.__with_libyaml__


@pytest.mark.parametrize("schema", sorted(p.name for p in (ROOT / "workflow/schemas").glob("*.yaml")))
def test_the_parse_fills_the_defaults_as_snakemakes_validate_does(schema):
    """selfrepair.core.config_schema (the Snakefile's parse) against
    snakemake.utils.validate, the reference it replaces, on the schema's section of every
    config file in config/ (each over config/config.yaml, as --configfile adds it) and on
    an empty one: no error, and the same filled section."""
    import copy

    import yaml
    from snakemake.utils import update_config, validate

    from selfrepair.core import config_schema

    path = ROOT / "workflow/schemas" / schema
    loaded = yaml.safe_load(path.read_text())
    key = schema.removesuffix(".schema.yaml")
    kind = {"object": dict, "array": list}[loaded["type"]]
    sections = [] if loaded.get("required") else [kind()]
    default = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    for f in sorted((ROOT / "config").glob("*.yaml")):
        if f.name == "published.yaml":  # the claims, not a config
            continue
        data = copy.deepcopy(default)
        update_config(data, yaml.safe_load(f.read_text()) or {})  # an overlay on the default
        section = data if key == "config" else data.get(key)
        if isinstance(section, kind) and section:
            sections.append(section)
    filled = 0
    for section in sections:
        ours, theirs = copy.deepcopy(section), copy.deepcopy(section)
        assert config_schema.problems(ours, loaded, key) == [], (schema, section)
        config_schema.fill_defaults(ours, loaded)
        validate(theirs, str(path))
        assert ours == theirs, (schema, section)
        filled += ours != section
    assert len(sections) > 1
    if kind is dict and not loaded.get("required"):
        assert filled, "no default filled in: the comparison compared nothing"
    elif kind is list:
        assert not filled  # a list (own's entries) is left as it is
