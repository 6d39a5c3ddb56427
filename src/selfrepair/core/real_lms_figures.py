"""Pictures of the real-LM results, each drawn from a table the workflow wrote: the
claims' forest plot (the claims table of each scale, ``results/published/real_lms.csv``),
paper C's faithfulness curves (``gim_lm``'s ``curves.csv``, drawn by
:func:`selfrepair.core.plots.faithfulness_curves`) and paper B's ROC curves (a points
table that :func:`selfrepair.coax.lm_roc.roc_points` makes from ``coax_lm``'s
``ioi_scores.csv``). Small functions: a table to the figure's data, the data to a
matplotlib figure; the caller saves it.

The forest plot puts each claim on its own axis: the claims' effects are AUC differences,
logit differences, shares of a repair and CPR differences, on scales tens of times apart.
Each row is drawn as its distance from the claim's threshold in units of the half-width of
its own 95% interval, signed so that the claim's side is to the right: the threshold is
the line at 0, a claim *holds* where its whole interval is right of it and *fails* where
the whole interval is left of it (or touches it). The measured value and interval in the
claim's own units are written beside each row.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from selfrepair.core.files import require_columns as require  # noqa: E402

SCALES = ("default", "large")  # config lms.scale
VERDICT_COLORS = {"holds": "#1e8449", "fails": "#c0392b", "inconclusive": "#d68910", "not run": "#95a5a6"}
# the claims table's columns the forest plot reads (core.real_claims writes them)
CLAIMS_COLUMNS = tuple("model paper id claim measured ci_low ci_high verdict note threshold side".split())
CURVES_COLUMNS = ("model", "task", "method", "ranking", "fraction", "faithfulness")
ROC_COLUMNS = ("model", "seeding", "data_seed", "method", "fpr", "tpr", "auc")


def read_table(path, columns) -> pd.DataFrame:
    """The CSV file at ``path``, with ``columns`` required (:func:`require`)."""
    return require(pd.read_csv(path), columns, path)


# ---- forest plot of the claims ---------------------------------------------------------


def _seeding(note) -> str:
    """'primaries: name movers' from a note that opens with it (paper B's seedings), else ''."""
    head = str(note).split(";", 1)[0] if isinstance(note, str) else ""
    return head if head.startswith("primaries: ") else ""


def _label(r) -> str:
    seeding = _seeding(r["note"])
    text = f"{r['paper']}: {r['claim']}" + (f" [{seeding}]" if seeding else "")
    return "\n".join(textwrap.wrap(text, 80))


def _numbers(r) -> str:
    """The measured value and interval, and the claim's side of its threshold."""
    if r["verdict"] == "not run":
        return "not run"
    claim = f"claim {'>' if r['side'] == 'above' else '<'} {r['threshold']:g}"
    m = f"{r['measured']:.3g}" if math.isfinite(r["measured"]) else "n/a"
    if not (math.isfinite(r["ci_low"]) and math.isfinite(r["ci_high"])):
        return f"{m}, no interval ({claim})"
    return f"{m} [{r['ci_low']:.3g}, {r['ci_high']:.3g}] ({claim})"


def forest_data(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim of each scale's claims table (``{scale: table}``, the tables with
    :data:`CLAIMS_COLUMNS`): its label, colour, the numbers written beside it and its
    position ``x_lo``, ``x``, ``x_hi``: (value - threshold) / the interval's half-width,
    times -1 for a claim that the effect lies below its threshold. NaN where there is no
    interval (or it has no width)."""
    out = []
    for scale, t in tables.items():
        require(t, CLAIMS_COLUMNS, f"claims table of scale {scale!r}")
        bad = sorted(set(t["side"]) - {"above", "below"})
        if bad:
            raise ValueError(f"claims table of scale {scale!r}: side {bad} is not 'above' or 'below'")
        unknown = sorted(set(t["verdict"]) - set(VERDICT_COLORS))
        if unknown:
            raise ValueError(f"claims table of scale {scale!r}: unknown verdict(s) {unknown}")
        for _, r in t.iterrows():
            sign = 1.0 if r["side"] == "above" else -1.0
            half = (r["ci_high"] - r["ci_low"]) / 2
            ok = r["verdict"] != "not run" and math.isfinite(half) and half > 0
            ends = (
                sorted(sign * (v - r["threshold"]) / half for v in (r["ci_low"], r["ci_high"])) if ok else [np.nan] * 2
            )
            x = sign * (r["measured"] - r["threshold"]) / half if ok else np.nan
            out.append(
                {
                    "scale": scale,
                    "model": r["model"],
                    "id": r["id"],
                    "label": _label(r),
                    "verdict": r["verdict"],
                    "color": VERDICT_COLORS[r["verdict"]],
                    "threshold": float(r["threshold"]),
                    "side": r["side"],
                    "x_lo": ends[0],
                    "x": x,
                    "x_hi": ends[1],
                    "numbers": _numbers(r),
                }
            )
    cols = ["scale", "model", "id", "label", "verdict", "color", "threshold", "side", "x_lo", "x", "x_hi", "numbers"]
    return pd.DataFrame(out, columns=cols)


def forest_figure(data: pd.DataFrame, scales=SCALES, title: str = "Real-LM claims"):
    """The forest plot of :func:`forest_data`'s rows: one panel per model (rows of panels,
    height by its claims) and per scale of ``scales`` that has rows (columns); a scale
    without rows is named in the title as not run."""
    shown = [s for s in scales if (data["scale"] == s).any()]
    absent = [s for s in scales if s not in shown]
    models = list(dict.fromkeys(data["model"]))
    heights = [max(1, int((data["model"] == m).groupby(data["scale"]).sum().max())) for m in models]
    fig, axes = plt.subplots(
        max(1, len(models)),
        max(1, len(shown)),
        figsize=(7.6 + 4.6 * max(1, len(shown)), 1.0 + 0.32 * sum(heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights or [1]},
    )
    ends = data[["x_lo", "x_hi"]].to_numpy(float)
    ends = ends[np.isfinite(ends)]
    left, right = (min(-1.0, float(ends.min())), max(1.0, float(ends.max()))) if ends.size else (-1.0, 1.0)
    pad = 0.04 * (right - left)
    for i, model in enumerate(models):
        for j, scale in enumerate(shown):
            ax = axes[i, j]
            d = data[(data["model"] == model) & (data["scale"] == scale)].reset_index(drop=True)
            if d.empty:
                ax.text(0.5, 0.5, f"{model}: no claims at scale {scale}", ha="center", va="center", fontsize=8)
                ax.set_axis_off()
                continue
            y = np.arange(len(d))[::-1]
            for yy, (_, r) in zip(y, d.iterrows()):
                if math.isfinite(r["x"]):
                    ax.plot([r["x_lo"], r["x_hi"]], [yy, yy], color=r["color"], lw=2)
                    ax.plot([r["x"]], [yy], "o", color=r["color"], ms=4)
                else:
                    ax.plot([0], [yy], "x", color=r["color"], ms=5)
                ax.text(1.02, yy, r["numbers"], transform=ax.get_yaxis_transform(), va="center", fontsize=7)
            ax.axvline(0, color="k", lw=0.8)
            ax.set_xlim(left - pad, right + pad)
            ax.set_ylim(-0.7, len(d) - 0.3)
            ax.set_yticks(y, d["label"] if j == 0 else [""] * len(d), fontsize=7)
            ax.grid(axis="x", lw=0.3, alpha=0.5)
            ax.set_title(f"{model}, scale {scale}", fontsize=9)
            if i == len(models) - 1:
                ax.set_xlabel(
                    "(effect - threshold) / half-width of its 95% interval, claim's side to the right", fontsize=8
                )
    legend = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items()]
    note = f"; scale {', '.join(absent)}: not run (no claims table)" if absent else ""
    fig.suptitle(f"{title}{note}", fontsize=10)
    fig.legend(handles=legend, loc="upper right", ncols=4, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def forest(tables: Mapping[str, pd.DataFrame], scales=SCALES, title: str = "Real-LM claims"):
    """The forest plot of the claims tables ``{scale: table}``."""
    return forest_figure(forest_data(tables), scales, title)


# ---- ROC curves of COAX and the baselines ------------------------------------------------


def roc_panels(points: pd.DataFrame) -> list[tuple[str, str]]:
    """The (model, seeding) panels of a ROC points table, in its order."""
    require(points, ROC_COLUMNS, "ROC points table")
    return [tuple(p) for p in points[["model", "seeding"]].drop_duplicates().values.tolist()]


def roc_legend(points: pd.DataFrame) -> dict[tuple[str, str, str], str]:
    """{(model, seeding, method): its legend}: the method and its ROC-AUC, the mean over
    the prompt sets (``data_seed``) as the claim takes it where there are several."""
    out = {}
    for (model, seeding, method), g in points.groupby(["model", "seeding", "method"], sort=False):
        per = g.groupby("data_seed", sort=False)["auc"].first()
        sets = f" (mean of {len(per)} prompt sets)" if len(per) > 1 else ""
        out[model, seeding, method] = f"{method}: AUC {per.mean():.3f}{sets}"
    return out


def roc_figure(points: pd.DataFrame, title: str = "Backup heads found by COAX and the first-order baselines"):
    """One panel per (model, seeding): each method's ROC curve (every prompt set's, in
    one colour), its AUC in the legend, the diagonal of chance."""
    panels = roc_panels(points)
    legend = roc_legend(points)
    n = max(1, len(panels))
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.3 * nrows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no ROC curve: no IOI scores with backups", ha="center", va="center")
    for ax, (model, seeding) in zip(axes.flat, panels):
        d = points[(points["model"] == model) & (points["seeding"] == seeding)]
        for k, (method, g) in enumerate(d.groupby("method", sort=False)):
            color = f"C{k}"
            for i, (_, gs) in enumerate(g.groupby("data_seed", sort=False)):
                ax.plot(gs["fpr"], gs["tpr"], color=color, lw=2.2 if method == "coax" else 1.2,
                        drawstyle="default", label=legend[model, seeding, method] if i == 0 else None)  # fmt: skip
        ax.plot([0, 1], [0, 1], color="grey", lw=0.6, ls="--")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.set_aspect("equal")
        ax.set_xlabel("false positive rate (other candidate heads)", fontsize=8)
        ax.set_ylabel("true positive rate (backups)", fontsize=8)
        ax.set_title(f"{model}\n{seeding.replace('_', ' ')} as primaries", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save(fig, path, dpi: int = 100, colors: int = 256) -> None:
    """Write ``fig`` as a PNG of at most ``colors`` colours (a palette image, a third of the
    bytes of the full-colour one for these line drawings); no software or date in it: the
    same table, the same bytes."""
    from PIL import Image

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    rgb = Image.open(buf).convert("RGB")
    rgb.quantize(colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
