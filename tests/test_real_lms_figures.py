"""The real-LM pictures: the forest plot's rows, the ROC points and AUCs, the faithfulness
panels, on hand-made tables whose values are worked out here (by hand or by counting
pairs); the reference tables behind docs/results/real-lms.md's pictures agree with the
reference claims; the documented command redraws the pictures the page shows."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from selfrepair.coax import lm_roc
from selfrepair.core import plots
from selfrepair.core import real_lms_figures as F
from selfrepair.tooling import real_lms_pictures

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "real-lms.md"
MAX_BYTES = 200 * 1024


def _pairs_auc(scores, labels) -> float:
    """AUC by counting (backup, other) pairs: 1 where the backup scores higher, 1/2 tied."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


# ---- ROC ------------------------------------------------------------------------------------


def test_roc_curve_of_four_heads_by_hand():
    # ranked 0.9 (backup), 0.8 (other), 0.7 (backup), 0.1 (other): up, right, up, right
    fpr, tpr = lm_roc.roc_curve([0.7, 0.1, 0.9, 0.8], [1, 0, 1, 0])
    assert fpr.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert tpr.tolist() == [0.0, 0.5, 0.5, 1.0, 1.0]
    assert np.trapezoid(tpr, fpr) == 0.75 == _pairs_auc([0.7, 0.1, 0.9, 0.8], [1, 0, 1, 0])


def test_roc_curve_steps_diagonally_over_a_tie():
    # 0.9 (backup), then a backup and an other tied at 0.5, then 0.2 (other)
    fpr, tpr = lm_roc.roc_curve([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1])
    assert fpr.tolist() == [0.0, 0.0, 0.5, 1.0]
    assert tpr.tolist() == [0.0, 0.5, 1.0, 1.0]
    assert np.trapezoid(tpr, fpr) == 0.875 == _pairs_auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1])


def test_roc_curve_needs_both_classes():
    with pytest.raises(ValueError, match="0 backups"):
        lm_roc.roc_curve([0.1, 0.2], [0, 0])


def _scores(rng, n=9, seedings=("name_movers", "single_drop")) -> pd.DataFrame:
    rows = []
    for seeding in seedings:
        for i in range(n):
            rows.append(
                {
                    "model_seed": 0,
                    "data_seed": 1,
                    "seeding": seeding,
                    "unit": f"L{i // 3}H{i % 3}",
                    "backup": i % 3 == 0,
                    **{c: rng.normal() for c in ("single", "atp", "eap_ig", "atp_star", "comp", "cond")},
                }
            )
    return pd.DataFrame(rows)


def test_roc_points_use_the_claims_scores_and_signs():
    """COAX ranks by ``comp`` (not ``cond``), AtP by |atp|; each AUC counts the pairs."""
    t = _scores(np.random.default_rng(0))
    t.loc[t["backup"], "atp"] = -5.0  # large negative AtP on every backup: |atp| ranks them first
    pts = lm_roc.roc_points("toy", t)
    assert list(pts.columns) == list(F.ROC_COLUMNS) == lm_roc.COLUMNS and set(pts["method"]) == set(lm_roc.METHODS)
    for seeding, g in t.groupby("seeding"):
        y = g["backup"].tolist()
        want = {
            "coax": _pairs_auc(g["comp"], y),
            "single": _pairs_auc(g["single"], y),
            "atp": _pairs_auc(g["atp"].abs(), y),
            "eap_ig": _pairs_auc(g["eap_ig"], y),
            "atp_star": _pairs_auc(g["atp_star"], y),
        }
        assert want["atp"] == 1.0
        got = pts[pts["seeding"] == seeding].groupby("method")
        for m, w in want.items():
            p = got.get_group(m)
            assert p["auc"].iloc[0] == pytest.approx(w, abs=1e-12), m
            assert np.trapezoid(p["tpr"], p["fpr"]) == pytest.approx(w, abs=1e-12), m
            assert (p["fpr"].iloc[0], p["tpr"].iloc[0], p["fpr"].iloc[-1], p["tpr"].iloc[-1]) == (0, 0, 1, 1)
    assert F.roc_panels(pts) == [("toy", "name_movers"), ("toy", "single_drop")]
    legend = F.roc_legend(pts)
    g = t[t["seeding"] == "name_movers"]
    assert legend["toy", "name_movers", "atp"] == "atp: AUC 1.000"
    assert legend["toy", "name_movers", "coax"] == f"coax: AUC {_pairs_auc(g['comp'], g['backup'].tolist()):.3f}"


def test_roc_points_name_a_missing_score_column():
    t = _scores(np.random.default_rng(1)).drop(columns="comp")
    with pytest.raises(ValueError, match="ioi_scores of toy: lacks column.*comp"):
        lm_roc.roc_points("toy", t)


def test_roc_figure_has_a_panel_per_model_and_seeding():
    pts = pd.concat([lm_roc.roc_points(m, _scores(np.random.default_rng(2))) for m in ("a", "b")])
    fig = F.roc_figure(pts)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"{m}\n{s} as primaries" for m in ("a", "b") for s in ("name movers", "single drop")]
    F.plt.close(fig)


# ---- forest plot ----------------------------------------------------------------------------


def _claims(model="m1") -> pd.DataFrame:
    nan = float("nan")
    rows = [
        # (id, claim, measured, lo, hi, threshold, side, verdict, note)
        ("a", "effect above 0", 2.0, 1.0, 3.0, 0.0, "above", "holds", "primaries: name movers; more"),
        ("b", "CMD below 0", -2.0, -3.0, -1.0, 0.0, "below", "holds", "GIM minus eap"),
        ("c", "share above a half", 0.6, 0.4, 0.8, 0.5, "above", "inconclusive", "primaries: largest drops; x"),
        ("d", "effect above 0", -1.0, -2.0, -0.5, 0.0, "above", "fails", ""),
        ("e", "not measured", nan, nan, nan, 0.0, "above", "not run", "its part did not run"),
    ]
    cols = ["id", "claim", "measured", "ci_low", "ci_high", "threshold", "side", "verdict", "note"]
    t = pd.DataFrame(rows, columns=cols)
    t.insert(0, "model", model)
    t.insert(1, "paper", "coax")
    return t


def test_forest_rows_are_distances_from_the_threshold_in_half_widths():
    d = F.forest_data({"default": _claims()}).set_index("id")
    assert len(d) == 5 and (d["scale"] == "default").all()
    # a: half-width 1, threshold 0: 1, 2, 3
    assert d.loc["a", ["x_lo", "x", "x_hi"]].tolist() == [1.0, 2.0, 3.0]
    # b: claim below 0, so flipped: -(-3)/1 = 3, -(-2) = 2, -(-1) = 1, ends sorted
    assert d.loc["b", ["x_lo", "x", "x_hi"]].tolist() == [1.0, 2.0, 3.0]
    # c: half-width 0.2, threshold 0.5: (0.4-0.5)/0.2 = -0.5, 0.5, 1.5
    assert d.loc["c", ["x_lo", "x", "x_hi"]].tolist() == pytest.approx([-0.5, 0.5, 1.5])
    # d: half-width 0.75: -2/0.75, -1/0.75, -0.5/0.75
    assert d.loc["d", ["x_lo", "x", "x_hi"]].tolist() == pytest.approx([-8 / 3, -4 / 3, -2 / 3])
    assert d.loc["e", ["x_lo", "x", "x_hi"]].isna().all() and d.loc["e", "numbers"] == "not run"
    assert d["color"].to_dict() == {
        "a": "#1e8449",
        "b": "#1e8449",
        "c": "#d68910",
        "d": "#c0392b",
        "e": "#95a5a6",
    }
    # the verdict reads off the picture: holds right of 0, fails wholly left of it
    assert (d.loc[["a", "b"], "x_lo"] > 0).all() and d.loc["d", "x_hi"] <= 0
    assert d.loc["b", "numbers"] == "-2 [-3, -1] (claim < 0)"
    assert d.loc["c", "numbers"] == "0.6 [0.4, 0.8] (claim > 0.5)"
    assert d.loc["a", "label"] == "coax: effect above 0 [primaries: name movers]"
    assert d.loc["b", "label"] == "coax: CMD below 0"


def test_forest_names_a_missing_column_and_its_table():
    with pytest.raises(ValueError, match=r"scale 'large'.*lacks column\(s\) threshold"):
        F.forest_data({"large": _claims().drop(columns="threshold")})
    bad = _claims().assign(side="left")
    with pytest.raises(ValueError, match="side"):
        F.forest_data({"default": bad})


def test_read_table_names_the_file_and_the_column(tmp_path):
    f = tmp_path / "real_lms.csv"
    _claims().drop(columns=["side"]).to_csv(f, index=False)
    with pytest.raises(ValueError, match=rf"{re.escape(str(f))}: lacks column\(s\) side"):
        F.read_table(f, F.CLAIMS_COLUMNS)


def test_forest_puts_the_scales_side_by_side_and_names_one_not_run():
    both = {"default": pd.concat([_claims("m1"), _claims("m2")]), "large": _claims("m1")}
    fig = F.forest(both)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["m1, scale default", "m1, scale large", "m2, scale default", ""]
    assert [t.get_text() for t in fig.axes[3].texts] == ["m2: no claims at scale large"]
    assert "not run" not in fig._suptitle.get_text()
    F.plt.close(fig)
    fig = F.forest({"default": _claims("m1")})
    assert [ax.get_title() for ax in fig.axes] == ["m1, scale default"]
    assert fig._suptitle.get_text().endswith("scale large: not run (no claims table)")
    threshold_lines = [ln for ln in fig.axes[0].lines if list(ln.get_xdata()) == [0, 0]]
    assert len(threshold_lines) == 1
    F.plt.close(fig)


# ---- faithfulness curves --------------------------------------------------------------------


def test_faithfulness_has_a_panel_per_model_and_task():
    rows = [
        {"model": m, "task": t, "method": meth, "ranking": r, "fraction": f, "faithfulness": f}
        for m, t in (("lm1", "ioi"), ("lm2", "ioi"), ("lm2", "addition"))
        for meth in ("eap", "gim")
        for r in ("signed", "absolute")
        for f in (0.01, 0.1, 1.0)
    ]
    fig = plots.faithfulness_curves(pd.DataFrame(rows), panel=("model", "task"))
    top = [ax.get_title().split("\n")[0] for ax in fig.axes[:3]]
    assert top == ["lm1 / ioi", "lm2 / ioi", "lm2 / addition"]
    assert [ax.get_title().split("\n")[1] for ax in fig.axes] == ["CPR (signed)"] * 3 + ["CMD (absolute)"] * 3
    assert [len(ax.get_lines()) for ax in fig.axes] == [3] * 6  # two methods and the line at 1
    plots.plt.close(fig)


# ---- the reference tables behind the page's pictures ------------------------------------------


REF = real_lms_pictures.REFERENCE


def test_reference_scores_give_the_reference_claims_auc_gap():
    """The AUCs the ROC picture shows are the ones behind the claim COAX - best baseline."""
    claims = pd.read_csv(REF / "real_lms_claims.csv")
    for model in real_lms_pictures.models():
        pts = lm_roc.roc_points(model, pd.read_csv(REF / f"real_lms_scores_{model}.csv"))
        auc = pts.groupby(["seeding", "method"])["auc"].first()
        for seeding, sfx in (("name_movers", ""), ("single_drop", "_single_drop")):
            gap = auc[seeding, "coax"] - max(auc[seeding, m] for m in ("single", "atp", "eap_ig", "atp_star"))
            row = claims[(claims["model"] == model) & (claims["id"] == f"lm_coax_auc_beats_baselines{sfx}")]
            assert gap == pytest.approx(float(row["measured"].iloc[0]), abs=1e-9), (model, seeding)


def test_reference_curves_give_the_reference_claims_cpr_difference():
    """CPR is the area under the signed curve: GIM's minus the strongest other's is the claim."""
    claims = pd.read_csv(REF / "real_lms_claims.csv")
    for model in real_lms_pictures.models():
        curves = pd.read_csv(REF / f"real_lms_curves_{model}.csv")
        signed = curves[curves["ranking"] == "signed"].sort_values("fraction")
        for task in curves["task"].unique():
            row = claims[(claims["model"] == model) & (claims["id"] == f"lm_gim_best_cpr_{task}")].iloc[0]
            other = re.match(r"GIM minus (\S+)", row["note"])[1]
            area = {
                m: np.trapezoid(g["faithfulness"], g["fraction"])
                for m, g in signed[signed["task"] == task].groupby("method")
            }
            assert area["gim"] - area[other] == pytest.approx(row["measured"], abs=1e-6), (model, task)


# ---- the page's pictures and the command that draws them --------------------------------------


def test_the_documented_command_redraws_the_pages_pictures(tmp_path):
    cmd = "python -m selfrepair.tooling.real_lms_pictures --out docs/results/img"
    assert cmd in PAGE.read_text()
    real_lms_pictures.main(["--out", str(tmp_path)])
    for name in real_lms_pictures.FILES.values():
        new, shown = tmp_path / name, ROOT / "docs" / "results" / "img" / name
        assert new.stat().st_size < MAX_BYTES, name
        a = np.asarray(Image.open(new).convert("RGB"), float)
        b = np.asarray(Image.open(shown).convert("RGB"), float)
        # the page shows what the reference tables draw now (text rendering may differ a
        # little between machines: a mean of under 1 of 255 per channel)
        assert a.shape == b.shape, f"{name}: redraw it with `{cmd}`"
        assert np.abs(a - b).mean() < 1.0, f"{name}: redraw it with `{cmd}`"


def test_every_picture_the_page_shows_exists_and_is_small():
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", PAGE.read_text())
    assert len(links) == 3
    for link in links:
        f = (PAGE.parent / link).resolve()
        assert f.is_file(), link
        assert f.stat().st_size < MAX_BYTES, link
        assert Image.open(f).format == "PNG", link


# ---- the rules' scripts, on hand-made tables ---------------------------------------------------


class _Files(list):
    """snakemake.input / output: a list of paths, named ones also as attributes and keys."""

    def __init__(self, named: dict):
        self._named = {k: [str(x) for x in v] if isinstance(v, list) else str(v) for k, v in named.items()}
        super().__init__([x for v in self._named.values() for x in (v if isinstance(v, list) else [v])])

    def __getattr__(self, name):
        try:
            return self._named[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        return self._named[key] if isinstance(key, str) else list.__getitem__(self, key)


def _run(script: str, tmp_path, inputs: dict, outputs: dict, **params):
    import runpy
    import types

    smk = types.SimpleNamespace(
        input=_Files(inputs),
        output=_Files(outputs),
        params=types.SimpleNamespace(**params),
        log=[],  # no log file: runtime.start would send this process's stderr there
        threads=1,
        rule=script,
    )
    runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), init_globals={"snakemake": smk})


def test_the_rules_scripts_draw_their_tables(tmp_path):
    claims = tmp_path / "real_lms.csv"
    _claims().to_csv(claims, index=False)
    _run("real_lms_forest", tmp_path, {"claims": claims}, {"png": tmp_path / "forest.png"}, scale="default")
    assert Image.open(tmp_path / "forest.png").format == "PNG"

    _claims().drop(columns="side").to_csv(claims, index=False)
    with pytest.raises(ValueError, match=rf"{re.escape(str(claims))}: lacks column\(s\) side"):
        _run("real_lms_forest", tmp_path, {"claims": claims}, {"png": tmp_path / "forest.png"}, scale="default")

    folder = tmp_path / "tables"
    folder.mkdir()
    t = _scores(np.random.default_rng(3), seedings=("name_movers",))
    t.to_csv(folder / "ioi_scores.csv", index=False)
    out = {"csv": tmp_path / "roc_points.csv", "png": tmp_path / "roc.png"}
    _run("real_lms_roc", tmp_path, {"coax_toy": folder}, out, lms=["toy"])
    pts = pd.read_csv(out["csv"])
    auc = pts.groupby("method")["auc"].first()
    assert auc["coax"] == pytest.approx(_pairs_auc(t["comp"], t["backup"].tolist()), abs=1e-12)
    assert auc["atp"] == pytest.approx(_pairs_auc(t["atp"].abs(), t["backup"].tolist()), abs=1e-12)
    assert out["png"].stat().st_size > 0

    curves = tmp_path / "curves.csv"
    pd.DataFrame(
        [
            {"model": "toy", "task": "ioi", "method": "gim", "ranking": r, "fraction": f, "faithfulness": f}
            for r in ("signed", "absolute")
            for f in (0.1, 1.0)
        ]
    ).to_csv(curves, index=False)
    _run("real_lms_faithfulness", tmp_path, {"curves": [curves]}, {"png": tmp_path / "f.png"})
    assert Image.open(tmp_path / "f.png").format == "PNG"
