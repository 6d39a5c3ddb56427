"""Regenerate the regression suite's golden files, deliberately.

    .venv/bin/python tests/golden/update.py            # scoring values from the committed checkpoints
    .venv/bin/python tests/golden/update.py --retrain  # retrain the checkpoints first, then the above
    .venv/bin/python tests/golden/update.py --retrain --papers coax,gim  # only these papers' files
    .venv/bin/python tests/golden/update.py --vendor-hashes  # this CPU vendor's rows only

--papers (default heroes,coax,gim) regenerates only the named papers' files: their
checkpoints under checkpoints/results/<paper>, their rows of checkpoints.csv (the other
papers' rows stay as they are) and their golden CSVs (heroes_tiny_*.csv and, with
--retrain, training.csv; coax_tiny_*.csv; gim_tiny_*.csv).

Training runs under golden_suite.TRAIN_NUMERICS (fast: the same bits on Intel and AMD),
scoring under the mode that the tests run (src/selfrepair/core/numerics.py). Run the scoring
update after a change that is meant to move a score; retrain only after a change that is
meant to move training (the model, the loop, the data, the numerics pins). A retrain
rewrites vendor_checkpoints.csv with this CPU vendor's rows alone (the other vendors' rows
were of the old training). --vendor-hashes retrains every paper of --papers in a temporary
folder and writes only this vendor's rows of vendor_checkpoints.csv (keyed results/<paper>/...,
the source naming the CPU's family and model), leaving the committed checkpoints as they
are: the way a machine of another vendor records what it trains. Commit the files with a
message that says why they moved. What lives here: tests/golden_suite.py.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from selfrepair.core import numerics  # noqa: E402  before anything imports torch

numerics.configure("fast")

import pandas as pd  # noqa: E402

import golden_suite as G  # noqa: E402


def retrain(d: Path, paper: str) -> None:
    G.snakemake("--cores", "2", *G.tiny_args(G.prepare(d), paper=paper), f"numerics={G.TRAIN_NUMERICS}",
                "--until", *G.TRAIN_RULES[paper])  # fmt: skip
    shutil.rmtree(G.CHECKPOINTS / "results" / paper, ignore_errors=True)
    for m in G.model_dirs(d / "results", (paper,)):
        G.copy_training_outputs(m, G.CHECKPOINTS / m.relative_to(d), paper)
    hashes = G.weight_hashes(G.CHECKPOINTS, (paper,))
    f = G.GOLDEN / "checkpoints.csv"
    rows = pd.read_csv(f) if f.exists() else pd.DataFrame(columns=["model", "sha256"])
    rows = rows[rows["model"].map(G.paper_of) != paper]  # the other papers' rows stay as they are
    rows = pd.concat([rows, pd.DataFrame({"model": list(hashes), "sha256": list(hashes.values())})])
    rows.sort_values("model").to_csv(f, index=False)
    print(f"{len(hashes)} {paper} checkpoints written to {G.CHECKPOINTS}")
    write_vendor_rows(hashes, (paper,), replace_others=True)


def write_vendor_rows(hashes: dict[str, str], papers, replace_others: bool) -> None:
    """This CPU vendor's rows of vendor_checkpoints.csv for ``papers`` (other papers' rows
    stay; other vendors' rows of those papers go when ``replace_others``)."""
    f, vendor = G.VENDOR_CHECKPOINTS, numerics.cpu_vendor()
    rows = pd.read_csv(f, dtype=str) if f.exists() else pd.DataFrame(columns=G.VENDOR_COLUMNS)
    family = numerics.cpu_family()  # '25/17': which CPU of a model name shared by many (a KVM guest's 'AMD EPYC')
    cpu = numerics.cpu_model() + (f" (family {family.replace('/', ' model ')})" if family != "?" else "")
    source = f"{cpu}, {G.TRAIN_NUMERICS} mode, {time.strftime('%Y-%m-%d')}"
    G.with_vendor_rows(rows, hashes, vendor, source, papers, replace_others).to_csv(f, index=False)
    print(f"{len(hashes)} {vendor} rows written to {f}")


def vendor_hashes(d: Path, paper: str) -> dict[str, str]:
    G.snakemake("--cores", "2", *G.tiny_args(G.prepare(d), paper=paper), f"numerics={G.TRAIN_NUMERICS}",
                "--until", *G.TRAIN_RULES[paper])  # fmt: skip
    return G.trained_hashes(d, (paper,))


def reach(d: Path) -> None:
    G.prepare(d)
    G.snakemake("--cores", "1", *G.tiny_args(d, G.reach_config(d)), f"numerics={G.TRAIN_NUMERICS}", "--",
                G.reach_target(d))  # fmt: skip
    meta = json.loads((d / G.reach_target(d)).read_text())
    row = {**G.TRAIN_REACH, "steps": meta["steps"], "reached_target": meta["reached_target"],
           "id_accuracy": meta["id_accuracy"]}  # fmt: skip
    pd.DataFrame([row]).to_csv(G.GOLDEN / "training.csv", index=False)
    print("training golden:", row)


def heroes_scores(d: Path) -> None:
    G.seed_checkpoints(G.prepare(d))
    before = G.weight_hashes(d / "results")
    G.snakemake("--cores", "2", *G.tiny_args(d), "--", "results/heroes/tables/seeds.csv",
                "results/heroes/tables/components.csv", "results/heroes/grid/tables/seeds.csv")  # fmt: skip
    if G.weight_hashes(d / "results") != before:
        raise SystemExit("the scoring run retrained a committed checkpoint: not a fixed-weight run")
    seeds = pd.read_csv(d / "results/heroes/tables/seeds.csv")
    cols = ["task", "seed", "status", "N", "train_steps", "id_accuracy", "ood_accuracy", "rho", "n_heroes", "n_bloats"]
    seeds[cols].to_csv(G.GOLDEN / "heroes_tiny_seeds.csv", index=False)
    comps = pd.read_csv(d / "results/heroes/tables/components.csv")
    cols = ["task", "seed", "component", "G", "C", "C_zero", "delta", "role"]
    comps[cols].to_csv(G.GOLDEN / "heroes_tiny_components.csv", index=False)
    grid = pd.read_csv(d / "results/heroes/grid/tables/seeds.csv")
    cols = ["cell", "task", "seed", "status", "N", "baseline_acc", "rho", "heroes", "bloats"]
    grid[cols].to_csv(G.GOLDEN / "heroes_tiny_grid.csv", index=False)
    print("scoring golden values written to", G.GOLDEN)


def scores(d: Path, paper: str) -> None:
    if paper == "heroes":
        return heroes_scores(d)
    G.seed_checkpoints(G.prepare(d), (paper,))
    before = G.weight_hashes(d / "results", (paper,))
    r = G.snakemake("--cores", "2", *G.tiny_args(d, paper=paper), "--", *G.SCORE_TARGETS[paper])
    if G.ran_training(r.stdout + r.stderr, paper) or G.weight_hashes(d / "results", (paper,)) != before:
        raise SystemExit(f"the {paper} scoring run retrained a committed checkpoint: not a fixed-weight run")
    for name, table in G.TABLES[paper](d).items():
        table.to_csv(G.GOLDEN / f"{name}.csv", index=False)
    print(f"{paper} scoring golden values written to", G.GOLDEN)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retrain", action="store_true", help="retrain the tiny checkpoints and the reach model first")
    ap.add_argument("--papers", default=",".join(G.PAPERS), help="comma-separated papers to regenerate (default: all)")
    ap.add_argument("--vendor-hashes", action="store_true",
                    help="only retrain in a temporary folder and write this CPU vendor's rows of vendor_checkpoints.csv")  # fmt: skip
    a = ap.parse_args()
    papers = a.papers.split(",")
    if unknown := set(papers) - set(G.PAPERS):
        ap.error(f"unknown papers {sorted(unknown)}; choose from {G.PAPERS}")
    if a.vendor_hashes:
        for paper in papers:
            with tempfile.TemporaryDirectory() as t:
                write_vendor_rows(vendor_hashes(Path(t), paper), (paper,), replace_others=False)
        sys.exit(0)
    for paper in papers:
        if a.retrain:
            with tempfile.TemporaryDirectory() as t:
                retrain(Path(t), paper)
            if paper == "heroes":
                with tempfile.TemporaryDirectory() as t:
                    reach(Path(t))
        with tempfile.TemporaryDirectory() as t:
            scores(Path(t), paper)
