"""The regression suite's fixed parts, shared by the tests and tests/golden/update.py.

tests/golden/ holds
- checkpoints/: the tiny models of papers A, B and C (config/test.yaml), trained once
  under the fast numerics mode (TRAIN_NUMERICS: the same bits on Intel and AMD CPUs) on
  one CPU (its vendor is in every model's record), every output of their training rules
  (TRAIN_RULES) laid out as the workflow writes them (results/heroes/...,
  results/coax/..., results/gim/...), and checkpoints.csv with the SHA-256 of every
  weights file;
- vendor_checkpoints.csv: the SHA-256 that TRAIN_NUMERICS trains for each of those models,
  per CPU vendor that measured it (model, cpu_vendor, sha256, source): the committed
  checkpoints' own vendor, and every other one whose machine retrained them
  (update.py --vendor-hashes). The golden training tests compare with their own vendor's
  rows, and with another vendor's where this one has none and the committed fingerprints
  show both vendors training the same bits under TRAIN_NUMERICS (expected_hashes);
- heroes_tiny_*.csv: what the tiny DAG computes from those fixed weights (G, C, roles,
  rho, the protocol grid), the scoring half of the suite; coax_tiny_*.csv and
  gim_tiny_*.csv the same for papers B and C (COAX and baseline head scores, AUCs; GIM
  edge scores, CPR/CMD);
- training.csv: the training half: steps to the target of one tiny model trained longer
  (TRAIN_REACH), under TRAIN_NUMERICS.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
CHECKPOINTS = GOLDEN / "checkpoints"
BIN = Path(sys.executable).parent

# The numerics mode the committed checkpoints were trained under, and that the golden
# training tests retrain under: the one whose bits do not depend on the CPU vendor.
TRAIN_NUMERICS = "fast"
# The training targets of the tiny config whose outputs are committed.
TINY_CONFIGS = [ROOT / "config" / "config.yaml", ROOT / "config" / "test.yaml"]
MODEL_FILES = ("model", "train.json", "train_log.csv")
PAPERS = ("heroes", "coax", "gim")
# The three papers together, as --config papers=[...] takes them (the session's shared tiny run).
ALL_PAPERS = ",".join(PAPERS)
# Per paper: the rules whose outputs are committed, and what each writes per model folder
# (the folder above model/: results/<paper>/.../seedN, .../induction/t1, .../pruning).
TRAIN_RULES = {
    "heroes": ("heroes_train", "heroes_grid_train"),
    "coax": ("coax_ioi_train", "coax_induction_train", "coax_lm_train"),
    "gim": ("gim_train",),  # the circuit tasks' models and the classify model of gim_fa
}
TRAIN_OUTPUTS = {"heroes": MODEL_FILES, "coax": ("model", "train_log.csv"), "gim": ("model",)}

# One tiny model trained to its target (not in the tiny DAG, whose models stop at 600
# steps): the native-numerics check compares its steps to the target with the golden.
TRAIN_REACH = {"task": "sort", "seed": 123, "max_steps": 3000, "eval_every": 200, "eval_size": 100, "target": 0.9}


def snakemake(*args, cwd=ROOT, check=True, timeout=1800, env=None):
    env = dict(os.environ if env is None else env, HF_HUB_OFFLINE="1")
    cmd = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def tiny_args(d: Path, *extra_configs, paper: str = "heroes") -> list[str]:
    return [
        "--directory", str(d),
        "--configfile", *map(str, TINY_CONFIGS), *map(str, extra_configs),
        "--config", f"papers=[{paper}]", "device=cpu",
    ]  # fmt: skip


# Paper C's tiny run as the README shows it: the options of its report command for a run
# in its own folder, without --report (tests/test_docs.py checks that the README still
# shows these). The session-scoped fixture gim_tiny_run (tests/conftest.py) makes it once
# per pytest run, from the repository root, for the tests that read it.
GIM_TINY_RUN = ("--configfile", "config/config.yaml", "config/test.yaml", "--config", "papers=[gim]")


def gim_tiny_args(d: Path) -> list[str]:
    return [*GIM_TINY_RUN, "--directory", str(d)]


def tree_hashes(d: Path) -> dict[str, str]:
    """{path relative to d: SHA-256} of every file below a run's folder ``d``, Snakemake's
    own records (.snakemake/: its logs of every start) left out."""
    return {str(f.relative_to(d)): sha256(f) for f in sorted(Path(d).rglob("*"))
            if f.is_file() and f.relative_to(d).parts[0] != ".snakemake"}  # fmt: skip


def prepare(d: Path) -> Path:
    (d / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "config" / "published.yaml", d / "config" / "published.yaml")
    return d


def model_dirs(root: Path, papers=PAPERS) -> list[Path]:
    """Every trained-model folder (results/heroes/.../seedN, results/coax/ioi/seedN, ...)
    below ``root``, of the given papers."""
    return sorted(m for m in (p.parent.parent for p in root.rglob("model/model.safetensors"))
                  if paper_of(m) in papers)  # fmt: skip


def paper_of(path) -> str:
    """The paper of a path .../results/<paper>/... (a model folder, a checkpoints.csv row)."""
    parts = Path(path).parts
    return parts[len(parts) - 1 - parts[::-1].index("results") + 1]


def copy_training_outputs(src: Path, dest: Path, paper: str) -> None:
    """Copy what ``paper``'s training rule wrote in the model folder ``src`` to ``dest``.

    The copies get fresh modification times, as if the training rule had just written
    them: Snakemake reruns a rule whose script is newer than its outputs, and the
    committed checkpoints must score as fixed weights whenever a training script was
    last edited (a checkout's file times are arbitrary)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in TRAIN_OUTPUTS[paper]:
        target = dest / name
        if (src / name).is_dir():
            shutil.copytree(src / name, target, dirs_exist_ok=True, copy_function=shutil.copy)
            for f in sorted(target.rglob("*")):
                os.utime(f)
        else:
            shutil.copy(src / name, target)
        os.utime(target)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


VENDOR_CHECKPOINTS = GOLDEN / "vendor_checkpoints.csv"
VENDOR_COLUMNS = ["model", "cpu_vendor", "sha256", "source"]


def vendor_rows():
    import pandas as pd

    return pd.read_csv(VENDOR_CHECKPOINTS, dtype=str)  # a SHA-256 of digits stays a string


def trained_hashes(d: Path, papers=PAPERS) -> dict[str, str]:
    """{model: SHA-256} of the models a run in ``d`` trained, keyed as checkpoints.csv and
    vendor_checkpoints.csv key them (``results/<paper>/...``, relative to ``d``)."""
    return {str(Path("results") / m): h for m, h in weight_hashes(d / "results", papers).items()}


def with_vendor_rows(rows, hashes: dict[str, str], vendor: str, source: str, papers, replace_others: bool):
    """vendor_checkpoints.csv's ``rows`` (a DataFrame) with ``vendor``'s rows of ``papers``
    replaced by ``hashes`` ({model: SHA-256}, every model one of those papers'); the other
    papers' rows stay, and so do the other vendors' rows of those papers unless
    ``replace_others``."""
    import pandas as pd

    for m in hashes:
        try:
            paper = paper_of(m)
        except ValueError:
            paper = None
        if not m.startswith("results/") or paper not in papers:
            raise ValueError(f"vendor row {m!r}: a model is named results/<paper>/... with <paper> one of "
                             f"{sorted(papers)} (the keys of trained_hashes)")  # fmt: skip
    ours = rows["model"].map(paper_of).isin(papers)
    drop = ours if replace_others else ours & (rows["cpu_vendor"] == vendor)
    new = pd.DataFrame([{"model": m, "cpu_vendor": vendor, "sha256": h, "source": source} for m, h in hashes.items()],
                       columns=VENDOR_COLUMNS)  # fmt: skip
    out = pd.concat([rows[~drop], new]) if len(rows[~drop]) else new
    return out[VENDOR_COLUMNS].sort_values(["model", "cpu_vendor"]).reset_index(drop=True)


def vendor_hashes(vendor: str) -> dict[str, str]:
    """{model: SHA-256} that TRAIN_NUMERICS trains on a CPU of ``vendor`` ({} when no
    machine of that vendor has retrained the golden checkpoints)."""
    rows = vendor_rows()
    rows = rows[rows["cpu_vendor"] == vendor]
    return dict(zip(rows["model"], rows["sha256"]))


def expected_hashes(vendor: str, training_same: bool | None) -> tuple[dict[str, str], str]:
    """The hashes a CPU of ``vendor`` must train under TRAIN_NUMERICS, and where they come
    from: its own vendor's rows; else, where the committed fingerprints show the vendors
    training the same bits (``training_same``), those of the vendor that trained the
    committed checkpoints; else none ({})."""
    own = vendor_hashes(vendor)
    if own:
        return own, f"measured on {vendor} CPUs"
    if training_same:
        v = checkpoints_vendor()
        return vendor_hashes(
            v
        ), f"measured on {v} CPUs; the committed fingerprints show both vendors training the same bits"
    return {}, "none"


def checkpoints_vendor() -> str:
    """The CPU vendor that trained the committed checkpoints (one for all of them)."""
    vendors = {train_meta(m)["numerics"]["cpu_vendor"] for m in model_dirs(CHECKPOINTS)}
    if len(vendors) != 1:
        raise AssertionError(f"the committed checkpoints were trained on CPUs of several vendors: {sorted(vendors)}")
    return vendors.pop()


def weight_hashes(root: Path, papers=PAPERS) -> dict[str, str]:
    """{seed folder relative to root: SHA-256 of its model.safetensors}."""
    return {str(m.relative_to(root)): sha256(m / "model" / "model.safetensors") for m in model_dirs(root, papers)}


def train_meta(m: Path) -> dict:
    """The training metadata of a model folder: train.json (paper A) or the
    model/selfrepair.json that save_model writes (papers B and C)."""
    f = m / "train.json"
    return json.loads((f if f.exists() else m / "model" / "selfrepair.json").read_text())


def seed_checkpoints(d: Path, papers=("heroes",)) -> None:
    """Put the committed tiny checkpoints of ``papers`` where the workflow writes them,
    so that a run in ``d`` scores fixed weights instead of training."""
    if not CHECKPOINTS.is_dir():
        raise FileNotFoundError(f"no golden checkpoints in {CHECKPOINTS}: run tests/golden/update.py --retrain")
    for p in papers:
        if not model_dirs(CHECKPOINTS, (p,)):
            raise FileNotFoundError(f"no golden checkpoints of {p}: run tests/golden/update.py --retrain --papers {p}")
    for m in model_dirs(CHECKPOINTS, papers):
        copy_training_outputs(m, d / m.relative_to(CHECKPOINTS), paper_of(m))


def reach_config(d: Path) -> Path:
    """A config file for TRAIN_REACH (merged over the tiny config)."""
    t = TRAIN_REACH
    f = d / "reach.yaml"
    f.write_text(
        "heroes:\n"
        f"  tasks: [{t['task']}]\n"
        f"  seeds: [{t['seed']}]\n"
        f"  train: {{max_steps: {t['max_steps']}, eval_every: {t['eval_every']}, "
        f"eval_size: {t['eval_size']}, target_accuracy: {t['target']}}}\n"
        "  grid: {cells: []}\n"
    )
    return f


def reach_target(d: Path) -> str:
    return f"results/heroes/{TRAIN_REACH['task']}/seed{TRAIN_REACH['seed']}/train.json"


# Papers B and C: what their tiny DAGs compute from the committed weights (the scoring
# half of the suite for them), as {golden file stem: table}; update.py writes the tables
# to tests/golden/<stem>.csv, tests/test_coax_workflow.py and test_gim_workflow.py
# compare a run's tables with them.
SCORE_TARGETS = {
    "coax": [
        "results/coax/tables/ioi_discovery.csv",
        "results/coax/tables/induction.csv",
        "results/coax/tables/pruning.csv",
    ],
    "gim": [
        "results/gim/tables/localization.csv",
        "results/gim/tables/feature_attribution.csv",
    ],
}


def ran_training(log: str, paper: str) -> list[str]:
    """The training rules of ``paper`` that a snakemake log shows as executed."""
    return [r for r in TRAIN_RULES[paper] if f"rule {r}:" in log]


# The per-head columns of paper B's scores.csv kept in coax_tiny_ioi_heads.csv.
COAX_SCORE_COLUMNS = ["single", "atp", "eap_ig", "atp_star", "cond", "comp", "wake", "backup",
                      "atp_mag", "cond_grad", "atp_star_2s", "amp_ratio"]  # fmt: skip


def coax_tables(d: Path) -> dict:
    import pandas as pd

    res = d / "results" / "coax"
    heads = []
    for f in sorted(res.glob("ioi/seed*/data*/scores.csv")):
        s = pd.read_csv(f)
        truth = pd.read_csv(f.parent.parent / "truth.csv").rename(columns={"drop": "truth_drop"})
        truth.insert(0, "model_seed", s["model_seed"].iloc[0])
        truth.insert(1, "data_seed", s["data_seed"].iloc[0])
        key = ["model_seed", "data_seed", "unit"]
        heads.append(truth.merge(s[key + COAX_SCORE_COLUMNS], on=key, how="left"))
    ind = []
    for f in sorted(res.glob("induction/*/heads.csv")):
        h = pd.read_csv(f)
        h.insert(0, "model", f.parent.name)
        ind.append(h)
    return {
        # per head of each toy IOI model: the ground truth (drop, backup score, role) and
        # the single-ablation, AtP, EAP-IG, AtP* and COAX (cond, comp) scores, then the
        # release-2.1.0 baselines (AtP of magnitudes, conditional gradient, two-state AtP*,
        # amplification ratio); primaries, which are not candidates, have no scores
        "coax_tiny_ioi_heads": pd.concat(heads, ignore_index=True),
        # backup discovery per run and method: ROC-AUC, hits in the top k
        "coax_tiny_ioi_discovery": pd.read_csv(res / "tables/ioi_discovery.csv")[
            ["model_seed", "data_seed", "method", "roc_auc", "top_k", "hits", "n_backups", "n_candidates"]],
        # induction: per head of each model (induction score, single and COAX scores) and the
        # co-ablation drops per k
        "coax_tiny_induction_heads": pd.concat(ind, ignore_index=True),
        "coax_tiny_induction": pd.read_csv(res / "tables/induction.csv"),
        # pruning: perplexity per method and sparsity
        "coax_tiny_pruning": pd.read_csv(res / "tables/pruning.csv"),
    }  # fmt: skip


def gim_tables(d: Path) -> dict:
    import pandas as pd

    res = d / "results" / "gim"
    edges = []
    for f in sorted(res.glob("*/*/seed*/circuits/*.json")):
        task, model, seed = f.parts[-5], f.parts[-4], int(f.parts[-3].removeprefix("seed"))
        for e, v in json.loads(f.read_text())["edges"].items():
            edges.append({"task": task, "model": model, "seed": seed, "method": f.stem, "edge": e,
                          "score": v["score"], "in_graph": v["in_graph"]})  # fmt: skip
    cols = ["task", "model", "seed", "method", "n_edges", "cpr", "cmd", "m_full", "m_empty"]
    return {
        # every edge's score and circuit membership, per model and method (MIB circuit files)
        "gim_tiny_edges": pd.DataFrame(edges),
        # CPR / CMD per model and method
        "gim_tiny_localization": pd.read_csv(res / "tables/localization.csv")[cols],
        # feature attribution on the classify model: means over the examples per method
        "gim_tiny_feature_attribution": pd.read_csv(res / "tables/feature_attribution.csv"),
    }


TABLES = {"coax": coax_tables, "gim": gim_tables}


def golden_for(got: dict) -> dict:
    """The committed golden tables (``GOLDEN/<key>.csv``) of ``got``'s keys, after checking
    that each has the same columns, in order, and the same number of rows as ``got``'s."""
    import pandas as pd

    gold = {k: pd.read_csv(GOLDEN / f"{k}.csv") for k in got}
    for k in got:
        assert list(got[k].columns) == list(gold[k].columns), k
        assert len(got[k]) == len(gold[k]), k
    return gold


def close(got, golden, **tol) -> bool:
    """Element-wise ``pytest.approx`` of two sequences (NaN equals NaN)."""
    import pytest

    return list(got) == pytest.approx(list(golden), nan_ok=True, **tol)
