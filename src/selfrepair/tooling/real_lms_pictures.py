"""The pictures of docs/results/real-lms.md, drawn from the committed reference tables by
the workflow's own drawing functions (:mod:`selfrepair.core.real_lms_figures`):

- the claims' forest plot from ``results/reference/real_lms_claims.csv`` (the default
  scale) and ``real_lms_claims_large.csv`` (the large one, where it is committed);
- paper C's faithfulness curves from ``real_lms_curves_<model>.csv`` (gim_lm's curves.csv);
- paper B's ROC curves from ``real_lms_scores_<model>.csv`` (coax_lm's ioi_scores.csv).

    python -m selfrepair.tooling.real_lms_pictures --out docs/results/img
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from selfrepair.coax.lm_roc import roc_points
from selfrepair.core import plots
from selfrepair.core import real_lms_figures as F

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "results" / "reference"
OUT = ROOT / "docs" / "results" / "img"
CLAIMS = {"default": "real_lms_claims.csv", "large": "real_lms_claims_large.csv"}
FILES = {
    "forest": "real_lms_forest.png",
    "faithfulness": "real_lms_faithfulness.png",
    "roc": "real_lms_roc.png",
}


def claims_tables(reference: Path = REFERENCE) -> dict[str, pd.DataFrame]:
    """{scale: claims table} of the scales whose reference table is committed."""
    return {
        s: F.read_table(reference / name, F.CLAIMS_COLUMNS)
        for s, name in CLAIMS.items()
        if (reference / name).is_file()
    }


def models(reference: Path = REFERENCE) -> list[str]:
    """The models of the default scale's reference claims, in its order."""
    return list(dict.fromkeys(F.read_table(reference / CLAIMS["default"], ["model"])["model"]))


def draw(out: Path = OUT, reference: Path = REFERENCE) -> dict[str, Path]:
    """Draw the three pictures into ``out`` from ``reference``; returns {picture: path}."""
    out = Path(out)
    lms = models(reference)
    paths = {k: out / name for k, name in FILES.items()}
    F.save(F.forest(claims_tables(reference)), paths["forest"])
    curves = pd.concat(
        [F.read_table(reference / f"real_lms_curves_{m}.csv", F.CURVES_COLUMNS) for m in lms], ignore_index=True
    )
    F.save(plots.faithfulness_curves(curves, panel=("model", "task")), paths["faithfulness"])
    points = pd.concat(
        [roc_points(m, pd.read_csv(reference / f"real_lms_scores_{m}.csv")) for m in lms], ignore_index=True
    )
    F.save(F.roc_figure(points), paths["roc"])
    return paths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder of the PNG files (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="folder of the reference tables")
    args = ap.parse_args(argv)
    for name, path in draw(args.out, args.reference).items():
        print(f"{name}: {path} ({path.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
