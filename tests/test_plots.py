"""The figures explain themselves: legends for every mark, readable titles, no overlap
(hand-made tables, values known by construction)."""

import runpy
import types
from pathlib import Path

import pandas as pd
import pytest

from selfrepair.core import plots

ROOT = Path(__file__).resolve().parents[1]


def _components(tasks=("reverse", "sort"), n=12):
    rows = []
    for task in tasks:
        for seed in (1, 2):
            for i in range(n):
                comp = f"L{i // 4}H{i % 4}" if i % 4 != 3 else f"L{i // 4}MLP"
                rows.append(
                    {
                        "task": task,
                        "seed": seed,
                        "component": comp,
                        "layer": i // 4,
                        "G": 0.01 * (i + 1),
                        "C": 0.0 if task == "reverse" else 0.02 * (n - i),
                        "delta": float(i - n // 2),
                        "role": "hero" if i < 2 else "bloat" if i > n - 3 else "aligned",
                        "status": "kept",
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch):
    """The figure a plotting function would save, drawn and kept open."""
    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, paths: (fig.canvas.draw(), figs.append(fig)))
    yield figs
    for f in figs:
        plots.plt.close(f)


def test_rho_title():
    rho = pd.DataFrame(
        {
            "task": ["a", "b", "c"],
            "measure": "rho",
            "mean": [float("nan"), 0.5, 0.91],
            "sd": [float("nan"), float("nan"), 0.12],
            "n_kept": [0, 1, 2],
        }
    )
    title = {t: plots._rho_title(t, rho[rho["task"] == t]) for t in ("a", "b", "c", "d")}
    assert title == {
        "a": "a: no kept seeds with a defined rho",
        "b": "b: rho = 0.50 (1 seed)",
        "c": "c: rho = 0.91 ± 0.12 (2 seeds)",
        "d": "d: no kept seeds with a defined rho",
    }


def test_g_vs_c_says_no_kept_seeds_not_nan(drawn):
    rho = pd.DataFrame(
        {
            "task": ["reverse", "sort"],
            "measure": "rho",
            "mean": [float("nan"), 0.9],
            "sd": [float("nan"), 0.1],
            "n_kept": [0, 2],
        }
    )
    plots.g_vs_c(_components(), rho, [])
    titles = [ax.get_title() for ax in drawn[0].axes]
    assert titles == ["reverse: no kept seeds with a defined rho", "sort: rho = 0.90 ± 0.10 (2 seeds)"]


def test_waterfall_has_a_role_legend_and_no_overlap(drawn):
    plots.waterfall(_components(), [], threshold=4)
    fig = drawn[0]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["hidden hero (Δ ≤ −4)", "gradient bloat (Δ ≥ 4)", "aligned"]
    colors = [tuple(h.get_facecolor()) for h in legend.legend_handles]
    assert colors == [plots.matplotlib.colors.to_rgba(plots.ROLE_COLORS[r]) for r in ("hero", "bloat", "aligned")]
    top, bottom = fig.axes[:2]
    renderer = fig.canvas.get_renderer()
    lowest_label = min(t.get_window_extent(renderer).y0 for t in top.get_xticklabels() if t.get_text())
    assert lowest_label > bottom.title.get_window_extent(renderer).y1  # the names clear the next title
    assert legend.get_window_extent(renderer).y0 >= top.title.get_window_extent(renderer).y1


def test_pdf_has_no_creation_date(tmp_path):
    fig, _ = plots.plt.subplots()
    plots.save(fig, [tmp_path / "f.pdf"])
    assert b"CreationDate" not in (tmp_path / "f.pdf").read_bytes()


def test_coax_discovery_figure_explains_its_marks(tmp_path, monkeypatch):
    methods = ["single", "atp", "eap_ig", "atp_star", "coax"]
    disc = pd.DataFrame(
        [
            {"model_seed": 1, "data_seed": d, "method": m, "roc_auc": 0.6 + 0.05 * i + 0.01 * d}
            for d in (1, 2)
            for i, m in enumerate(methods)
        ]
    )
    summ = pd.DataFrame({"method": methods, "roc_auc": [0.615 + 0.05 * i for i in range(5)]})
    disc.to_csv(tmp_path / "d.csv", index=False)
    summ.to_csv(tmp_path / "s.csv", index=False)
    smk = types.SimpleNamespace(
        params=types.SimpleNamespace(figure="discovery"),
        input={
            "discovery": tmp_path / "d.csv",
            "summary": tmp_path / "s.csv",
            "claims": ROOT / "config/published.yaml",
        },
        output=[tmp_path / "f.png", tmp_path / "f.pdf"],
        log=[],
        threads=1,
        rule="coax_fig",
    )
    kept = []
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: None)
    monkeypatch.setattr(
        plots.plt,
        "subplots",
        (lambda orig: lambda *a, **k: (lambda r: (kept.append(r[0]), r)[1])(orig(*a, **k)))(plots.plt.subplots),
    )
    runpy.run_path(str(ROOT / "scripts/coax_figure.py"), init_globals={"snakemake": smk})
    ax = kept[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "one (model, prompt set)",
        "mean over (model, prompt set)",
        "paper (GPT-2 small)",
        "release 2.1.0 (GPT-2 small)",
        "chance (0.5)",
    ]
    # the published marks are config/published.yaml's values (paper: ioi_auc_*; release: *_r21)
    marks = {c.get_label(): c for c in ax.collections if "GPT-2" in str(c.get_label())}
    assert round(float(marks["paper (GPT-2 small)"].get_offsets()[0][1]), 6) == 0.33  # ioi_auc_single
    assert round(float(marks["release 2.1.0 (GPT-2 small)"].get_offsets()[0][1]), 6) == 0.581  # eap_ig_r21
    bars = [
        c
        for c in ax.collections
        if c.get_label() == "mean over (model, prompt set)" or type(c).__name__ == "LineCollection"
    ]
    ys = sorted({round(float(seg[0][1]), 6) for b in bars for seg in b.get_segments() if seg[0][1] != 0.5})
    assert ys == sorted(round(v, 6) for v in summ["roc_auc"])  # the bars are the summary table's means
    assert b"CreationDate" not in (tmp_path / "f.pdf").read_bytes()
    plots.plt.close(kept[0])
