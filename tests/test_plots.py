"""The figures explain themselves: legends for every mark, readable titles, no overlap
(hand-made tables, values known by construction)."""

import runpy
import types
from pathlib import Path

import numpy as np
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
    assert round(float(marks["release 2.1.0 (GPT-2 small)"].get_offsets()[0][1]), 6) == 0.603  # single_r21
    bars = [
        c
        for c in ax.collections
        if c.get_label() == "mean over (model, prompt set)" or type(c).__name__ == "LineCollection"
    ]
    ys = sorted({round(float(seg[0][1]), 6) for b in bars for seg in b.get_segments() if seg[0][1] != 0.5})
    assert ys == sorted(round(v, 6) for v in summ["roc_auc"])  # the bars are the summary table's means
    assert b"CreationDate" not in (tmp_path / "f.pdf").read_bytes()
    plots.plt.close(kept[0])


# ---------------------------------------------------------------- ground truth ----
# Tables in the format of results/groundtruth/tables/{shapley,scores}.csv (rule
# groundtruth_tables: per-model tables of groundtruth_model.py concatenated), for the
# families one run holds: paper A alone (heroes), or all three papers.
GT_METHODS = (
    "single",
    "single_mean",
    "single_zero",
    "grad_norm",
    "grad_norm_raw",
    "atp",
    "eap_ig",
    "gim",
    "coax_single",
    "coax_cond",
    "coax_comp",
)


def _gt_models(papers):
    """(family, group, model, games, n_layers, n_heads) of the models a run holds."""
    out = []
    if "A" in papers:
        for task in ("reverse", "sort"):
            for seed in (42, 123, 456):
                out.append(("heroes", f"heroes/{task}", f"heroes/{task}/seed{seed}", ("logprob", "accuracy"), 4, 4))
    if "B" in papers:
        for seed in (1, 2, 3):
            out.append(("ioi", "ioi", f"ioi/seed{seed}", ("logit_diff",), 4, 8))
    if "C" in papers:
        for task in ("ioi", "mcqa", "arithmetic"):
            for name, n_layers in (("l2h4", 2), ("l3h4", 3)):
                for seed in (0, 1):
                    out.append(("gim", f"gim/{task}", f"gim/{task}/{name}/seed{seed}", ("logit_diff",), n_layers, 4))
    return out


def gt_tables(papers=("A",), seed=0):
    """shapley, scores: every head and MLP of every model, every method (made-up values).
    Two cases a run of paper A can meet are planted: sort's OOD accuracy is 0 (every
    coalition scores 0, so no method correlates there: an empty column), and COAX comp
    scores one component only (an empty row, and a one-point scatter panel)."""
    rng = np.random.default_rng(seed)
    shap, scores = [], []
    for family, group, model, games, n_layers, n_heads in _gt_models(papers):
        comps = [f"L{layer}H{h}" for layer in range(n_layers) for h in range(n_heads)]
        comps += [f"L{layer}MLP" for layer in range(n_layers)]
        n = len(comps)
        base = rng.standard_normal(n) * np.exp(rng.normal(0, 1, n)) * 0.2
        shared = None
        for game in games:
            zero = group == "heroes/sort" and game == "accuracy"
            phi = np.zeros(n) if zero else base * (0.5 if game == "accuracy" else 1.0)
            se = np.zeros(n) if n <= 12 or zero else np.abs(rng.normal(0, 0.03, n)) + 0.01
            single = np.zeros(n) if zero else phi * rng.uniform(0.2, 1.2, n)
            for c, p, s, d in zip(comps, phi, se, single):
                shap.append(
                    {"family": family, "group": group, "model": model, "game": game, "component": c}
                    | {"shapley": p, "se": s, "single": d, "estimator": "exact" if n <= 12 else "permutation"}
                )
            own = {"single": single, "single_mean": single, "single_zero": single * rng.uniform(0.5, 1.5, n)}
            if shared is None:  # the gradient and COAX methods: one set, on the first game's metric
                noise = lambda scale: rng.normal(0, scale, n)  # noqa: E731
                shared = {
                    "grad_norm": np.abs(base) + np.abs(noise(0.1)),
                    "grad_norm_raw": (np.abs(base) + np.abs(noise(0.1))) * 40,
                    "atp": base + noise(0.05),
                    "eap_ig": base + noise(0.03),
                    "gim": base + noise(0.04),
                    "coax_single": np.abs(base) * 3 + np.abs(noise(0.2)),
                    "coax_cond": np.abs(base) * 2 + np.abs(noise(0.3)),
                    "coax_comp": np.abs(noise(0.3)),
                }
            for method, vals in {**own, **shared}.items():
                keep = range(n)
                if method in ("coax_cond", "coax_comp"):  # the seed heads have none
                    keep = range(3, n)
                if method == "coax_comp" and family == "heroes":
                    keep = [3]
                for i in keep:
                    scores.append(
                        {"family": family, "group": group, "model": model, "game": game}
                        | {"method": method, "component": comps[i], "score": float(vals[i])}
                    )
    return pd.DataFrame(shap), pd.DataFrame(scores)


def gt_summary(papers=("A",)):
    """agreement.csv of those tables, by the code that writes it."""
    from selfrepair.groundtruth import tables as gt

    shap, scores = gt_tables(papers)
    return gt.agreement_summary(gt.agreement_models(scores, shap, k=5), n_boot=200)


PAPERS = {"one paper (A)": ("A",), "one paper (B)": ("B",), "three papers": ("A", "B", "C")}


@pytest.fixture
def gt_figure(monkeypatch):
    """Draws a ground-truth figure as it would be saved and closes it afterwards;
    ``drawn[fig]``: the texts the drawing rendered (visible, not empty; tick labels
    outside the view are not drawn)."""
    from matplotlib.text import Text

    from selfrepair.groundtruth import plots as gp

    figs, drawn, draw_text = [], {}, Text.draw

    def recording(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.setdefault(self.get_figure(root=True), []).append(self)
        return draw_text(self, renderer)

    monkeypatch.setattr(Text, "draw", recording)

    def draw(kind, papers):
        if kind == "agreement":
            fig = gp.agreement_figure(gt_summary(papers))
        else:
            fig = gp.scatter_figure(*gt_tables(papers))
        fig.canvas.draw()
        figs.append(fig)
        return fig

    draw.drawn = drawn
    yield draw
    for f in figs:
        plots.plt.close(f)


@pytest.mark.parametrize("papers", PAPERS.values(), ids=PAPERS.keys())
@pytest.mark.parametrize("kind", ["agreement", "scatter"])
def test_groundtruth_figures_read_at_one_paper_and_at_three(gt_figure, kind, papers):
    fig = gt_figure(kind, papers)
    renderer = fig.canvas.get_renderer()
    texts = gt_figure.drawn[fig]
    assert len(texts) > 20
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 9]
    assert not small  # points at the saved size: the figure is saved as drawn (no shrinking)
    (title,) = [fig._suptitle]
    assert "Shapley value" in title.get_text()
    box = fig.bbox
    for t in texts:  # the title and every other text lie wholly inside the figure
        e = t.get_window_extent(renderer)
        assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, t.get_text()
    axes_top = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes)
    assert title.get_window_extent(renderer).y0 >= axes_top - 1  # above the panels, not over them


def test_groundtruth_figures_are_saved_at_the_drawn_size(tmp_path):
    from PIL import Image

    from selfrepair.groundtruth import plots as gp

    shap, scores = gt_tables(("A",))
    gp.agreement_heatmap(gt_summary(("A",)), tmp_path / "agreement.png")
    gp.method_scatter(shap, scores, tmp_path / "scatter.png")
    fig = gp.agreement_figure(gt_summary(("A",)))
    want = tuple(round(v * gp.DPI) for v in fig.get_size_inches())
    plots.plt.close(fig)
    assert Image.open(tmp_path / "agreement.png").size == want
    assert Image.open(tmp_path / "scatter.png").size[0] >= 5 * 2 * gp.DPI  # five panels of 2+ inches


def _cell_texts(ax):
    """{(column, row): text} of the heat map's cell annotations (data coordinates)."""
    return {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}


def test_agreement_heatmap_writes_n_a_in_empty_cells(gt_figure):
    summary = gt_summary(("A", "B", "C"))
    fig = gt_figure("agreement", ("A", "B", "C"))
    ax = fig.axes[0]
    cols = [t.get_text() for t in ax.get_xticklabels()]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cells = _cell_texts(ax)
    assert len(cells) == len(cols) * len(rows) == summary.groupby(["group", "game"]).ngroups * 11
    empty = 0
    for r in summary.itertuples():
        j = next(k for k, c in enumerate(cols) if c.startswith(f"{r.group}\n{r.game}\n"))
        i = rows.index(r.method)
        assert cols[j].endswith(f"({r.n_models} models)")
        if np.isnan(r.spearman):
            assert cells[j, i] == "n/a"
            empty += 1
        else:
            assert cells[j, i] == f"{r.spearman:.2f}\n[{r.spearman_lo:.2f}, {r.spearman_hi:.2f}]"
    # sort's OOD accuracy (every coalition 0): the whole column; paper A's COAX comp: its row
    assert empty == 11 + 3
    assert [cells[cols.index("heroes/sort\naccuracy\n(3 models)"), i] for i in range(11)] == ["n/a"] * 11
    assert "Shapley values" in fig._suptitle.get_text() and "n/a" in fig._suptitle.get_text()


def test_agreement_heatmap_cell_missing_from_the_table_and_one_model(gt_figure):
    from selfrepair.groundtruth import plots as gp

    summary = gt_summary(("B",))
    summary = summary[summary["method"] != "coax_comp"]  # a method one group lacks
    other = summary.assign(group="gim/ioi", n_models=1, spearman_lo=np.nan, spearman_hi=np.nan)
    t = pd.concat([summary, other, pd.DataFrame([{**summary.iloc[0], "method": "coax_comp"}])])
    fig = gp.agreement_figure(t)
    fig.canvas.draw()
    ax = fig.axes[0]
    cols = [c.get_text() for c in ax.get_xticklabels()]
    rows = [c.get_text() for c in ax.get_yticklabels()]
    cells = _cell_texts(ax)
    assert cols == ["ioi\nlogit_diff\n(3 models)", "gim/ioi\nlogit_diff\n(1 model)"]
    assert rows[-1] == "coax_comp" and cells[1, len(rows) - 1] == "n/a"  # no row for it in gim/ioi
    single = summary.set_index("method").loc["single", "spearman"]
    assert cells[1, rows.index("single")] == f"{single:.2f}"  # one model: the mean, no interval
    plots.plt.close(fig)


def _panels(fig):
    """{(model, method): axes} of the scatter, from its labels (first row: method titles;
    first column: model on the y label's first line)."""
    axes = [ax for ax in fig.axes if ax.get_subplotspec() is not None]
    ncols = axes[0].get_subplotspec().get_gridspec().ncols
    methods = [ax.get_title() for ax in axes[:ncols]]
    models = [ax.get_ylabel().split("\n")[0] for ax in axes[::ncols]]
    return {(models[k // ncols], methods[k % ncols]): ax for k, ax in enumerate(axes)}


@pytest.mark.parametrize("papers", PAPERS.values(), ids=PAPERS.keys())
def test_scatter_says_why_a_panel_has_no_correlation(gt_figure, papers):
    shap, scores = gt_tables(papers)
    fig = gt_figure("scatter", papers)
    renderer = fig.canvas.get_renderer()
    panels = _panels(fig)
    notes = {k: [t.get_text() for t in ax.texts] for k, ax in panels.items()}
    for (model, method), ax in panels.items():
        game = "accuracy" if model.startswith("heroes") else "logit_diff"
        s = shap[(shap["model"] == model) & (shap["game"] == game)].set_index("component")["shapley"]
        sc = scores[(scores["model"] == model) & (scores["game"] == game) & (scores["method"] == method)]
        x = s.loc[sc["component"]]
        if ax.get_ylabel():  # the first column names the model and its game
            assert ax.get_ylabel() == f"{model}\nscore (game: {game})"
        if len(sc) == 1:
            assert notes[model, method] == ["one component scored:\nno rank correlation"]
        elif x.nunique() == 1:
            assert notes[model, method] == [f"every Shapley value is {x.iloc[0]:.3g}:\nno rank correlation"]
        else:
            assert notes[model, method] == []
            continue
        # the note hides no point: every point lies outside its box
        box = ax.texts[0].get_bbox_patch().get_window_extent(renderer)
        pts = ax.transData.transform(np.c_[x.to_numpy(), sc["score"].to_numpy()])
        assert not any(box.contains(px, py) for px, py in pts)
    if "A" in papers:  # paper A's toys: COAX comp scores one component; sort's accuracy is 0
        assert notes["heroes/reverse/seed42", "coax_comp"] == ["one component scored:\nno rank correlation"]
        assert notes["heroes/sort/seed42", "atp"] == ["every Shapley value is 0:\nno rank correlation"]
