"""Paper A's protocol grid: cells, the authors' ablation site, per-cell statistics."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from hooked_gpt2 import hooked_logits
from selfrepair.core import components as C
from selfrepair.core import engine, models
from selfrepair.heroes import claims as heroes_claims
from selfrepair.heroes import grid, grid_tables, protocol
from selfrepair.heroes import scores as heroes
from selfrepair.heroes.grid import SITES
from selfrepair.tasks import sequences as S

BASE = {
    "padding": "per_batch",
    "init": "transformers",
    "g_normalization": "sqrt",
    "site": "hook_z",
    "n_eval": 1000,
    "role_boundary": "inclusive",
}


def test_cells_flip_one_switch_and_authors_flips_all():
    assert grid.cell_protocol("default", BASE) == BASE
    p = grid.cell_protocol("padding", BASE)
    assert p == {**BASE, "padding": "per_example"}
    assert grid.cell_protocol("n_eval", BASE)["n_eval"] == 100
    authors = grid.cell_protocol("authors", BASE)
    assert authors == {
        "padding": "per_example",
        "init": "torch",
        "g_normalization": "raw",
        "site": "attn_out_slice",
        "n_eval": 100,
        "role_boundary": "strict",
    }
    # a base that already has the authors' value flips back to v3's
    assert grid.cell_protocol("init", {**BASE, "init": "torch"})["init"] == "transformers"
    assert grid.train_key(authors) == "per_example-torch"
    assert grid.parse_train_key("per_example-torch") == ("per_example", "torch")
    # only padding and init change training: every other cell shares the default models
    assert {
        grid.train_key(grid.cell_protocol(c, BASE))
        for c in grid.CELLS
        if not grid.SWITCHES.get(c, grid.Switch("", 0, 0, True)).trains
    } == {"per_batch-transformers"}
    with pytest.raises(ValueError, match="unknown protocol cell 'shuffle'"):
        grid.cell_protocol("shuffle", BASE)
    with pytest.raises(ValueError, match="not a training key"):
        grid.parse_train_key("per_batch")


@pytest.mark.parametrize(
    "delta, inclusive, strict",
    [
        (-6.0, "hero", "aligned"),
        (-6.5, "hero", "hero"),
        (6.0, "bloat", "aligned"),
        (7.0, "bloat", "bloat"),
        (5.5, "aligned", "aligned"),
    ],
)
def test_role_boundary_at_exactly_the_threshold(delta, inclusive, strict):
    assert protocol.classify(delta, 6, "inclusive") == inclusive
    assert protocol.classify(delta, 6, "strict") == strict


def test_c_scores_and_paired_se_by_hand():
    correct = np.array([[1, 1, 0, 1], [0, 1, 0, 1], [1, 1, 1, 1]], bool)
    c, se = protocol.c_scores(correct, 4)
    # component 1: diffs 1,0,0,0 -> C 0.25, sd 0.5 -> SE 0.25; component 2: 0,0,-1,0
    assert c == pytest.approx([0.25, -0.25])
    assert se == pytest.approx([0.25, 0.25])
    c2, _ = protocol.c_scores(correct, 2)
    assert c2 == pytest.approx([0.5, 0.0])
    with pytest.raises(ValueError, match="exceeds the 4 measured"):
        protocol.c_scores(correct, 5)


def test_within_noise_by_hand():
    n = 100
    base = np.ones(n, bool)
    always_wrong = np.zeros(n, bool)  # C = 1 exactly, SE 0: far from everything
    half = np.arange(n) % 2 == 0  # C = 0.5
    almost = np.arange(n) % 2 == 0
    almost[1] = True  # C = 0.49: within noise of 'half'
    correct = np.stack([base, always_wrong, half, almost])
    frac, zero = protocol.within_noise(correct)
    # pairs: (wrong, half) d=0.5 se~0.05 -> out; (wrong, almost) out; (half, almost) d=0.01 -> within
    assert frac == pytest.approx(1 / 3)
    assert zero == 0


def test_rho_by_sample_size_uses_disjoint_chunks():
    n_seq = 1000
    # four components with C = 0.1, 0.2, 0.3, 0.4 exactly in every chunk of 100 and 500
    rows = [np.ones(n_seq, bool)]
    for k in (1, 2, 3, 4):
        r = np.ones(n_seq, bool)
        for start in range(0, n_seq, 100):
            r[start : start + 10 * k] = False
        rows.append(r)
    correct = np.stack(rows)
    g = np.array([4.0, 3.0, 2.0, 1.0])  # opposite order: rho = -1 in every chunk
    df = protocol.rho_by_sample_size(g, correct, [100, 500, 1000])
    assert list(df.groupby("n").size()) == [10, 2, 1]
    assert list(df["rho"]) == pytest.approx([-1.0] * 13)


def test_superadditivity_ratio_of_means_with_bootstrap():
    out = grid_tables.superadditivity([0.01, 0.03], [0.2, 0.4], n_boot=500)
    assert out["ratio"] == pytest.approx(0.3 / 0.02)
    assert out["n_seeds"] == 2
    assert out["ci_lo"] <= out["ratio"] <= out["ci_hi"]
    # seeds: (0.01, 0.2) alone gives 20, (0.03, 0.4) alone 13.3: the CI spans them
    assert out["ci_lo"] == pytest.approx(0.4 / 0.03) and out["ci_hi"] == pytest.approx(20.0)
    assert math.isnan(grid_tables.superadditivity([], [])["ratio"])


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_at_both_sites_equals_full_hooked_forwards(trained_sort_folder, mode):
    """ablation_correct (the engine) at each site against one full forward of the Hugging Face model
    per set, the ablation written in by hooks: at hook_z, and at the authors' slice of the
    attention output (zeros or the head's mean z on its d_head-wide slice, after c_proj)."""
    hf = models.load_hf(trained_sort_folder)
    batch = S.eval_set("sort", 5, 64, seed=3)
    comps = C.all_components(hf.config.n_layer, hf.config.n_head)
    means = engine.means(hf, [S.eval_set("sort", 5, 64, seed=4).tokens])
    sets = [[]] + [[c] for c in comps] + [comps[:3], [comps[1], comps[0]]]
    got = {}
    for site in SITES:
        got[site] = heroes.ablation_correct(hf, batch, sets, mode, means, rows=40, site=site)
        for s, row in zip(sets, got[site]):
            logits = hooked_logits(hf, batch.tokens, s, mode, means, site)
            assert torch.equal(row, heroes.exact_match(logits, batch.targets, batch.mask)), (site, s)
    # the slice site leaves the MLP rows and the intact row unchanged and moves head rows
    mlp_rows = [0] + [1 + i for i, c in enumerate(comps) if not c.is_head]
    assert torch.equal(got["hook_z"][mlp_rows], got["attn_out_slice"][mlp_rows])
    assert not torch.equal(got["hook_z"], got["attn_out_slice"])
    with pytest.raises(ValueError, match="unknown ablation site"):
        heroes.ablation_correct(hf, batch, sets, mode, means, site="hook_attn_out")
    assert SITES == engine.SITES  # the grid's config check and the engine name the same sites


def test_cell_components_normalizes_g_and_counts_roles():
    names = ["L0H0", "L0MLP"]
    g_raw = [64.0, 512.0]
    numel = [4096, 65536]  # sqrt: 64, 256 -> G 1.0 and 2.0
    correct = np.array([[1, 1], [0, 1], [1, 1]], bool)
    sq = protocol.cell_components(names, g_raw, numel, correct, {**BASE, "n_eval": 2}, [1])
    assert list(sq["G"]) == pytest.approx([1.0, 2.0])
    assert list(sq["C"]) == pytest.approx([0.5, 0.0])
    assert list(sq["delta"]) == pytest.approx([-1.0, 1.0])
    assert list(sq["role_t1"]) == ["hero", "bloat"]
    strict = protocol.cell_components(
        names, g_raw, numel, correct, {**BASE, "n_eval": 2, "role_boundary": "strict", "g_normalization": "raw"}, [1]
    )
    assert list(strict["G"]) == pytest.approx(g_raw)
    assert list(strict["role_t1"]) == ["aligned", "aligned"]


def test_claims_table_scales_layer_counts_and_marks_status():
    rho = pd.DataFrame({"cell": ["default", "default"], "task": ["reverse", "sort"], "rho_mean": [0.7, 0.6]})
    layers = pd.DataFrame(
        {
            "cell": ["default"] * 2,
            "task": ["sort"] * 2,
            "threshold": [6, 6],
            "layer": [1, 3],
            "hero_per10": [0.0, 16.0],
            "bloat_per10": [22.0, 0.0],
        }
    )
    sup = pd.DataFrame(
        {
            "cell": ["default"],
            "task": ["sort"],
            "group": ["bloat"],
            "mean_individual": [0.02],
            "mean_joint": [0.3],
            "ratio": [15.0],
        }
    )
    grad = pd.DataFrame({"cell": ["default"] * 2, "task": ["sort"] * 2, "layer": [1, 3], "G_mean": [0.17, 0.05]})
    claims = [
        {"id": "rho_reverse", "claim": "r", "value": 0.72, "tolerance": 0.08},
        {"id": "rho_sort", "claim": "s", "value": 0.27, "tolerance": 0.24},
        {"id": "sort_layer1_bloats", "claim": "b", "value": 21, "tolerance": 5},
        {"id": "bloat_superadditivity", "claim": "x", "value": 14.0, "tolerance": 5.0},
        {"id": "hero_ablation_reverse_pct", "claim": "h", "value": -36.4, "tolerance": 22.8},
    ]
    t = heroes_claims.claims_table(rho, layers, sup, grad, claims, 6).set_index("id")
    assert t.loc["rho_reverse", "status"] == "reproduced"
    assert t.loc["rho_sort", "status"] == "differs"  # 0.6 - 0.27 > 0.24
    assert t.loc["sort_layer1_bloats", "value"] == 22.0
    assert t.loc["bloat_superadditivity", "status"] == "reproduced"
    assert t.loc["hero_ablation_reverse_pct", "status"] == "not run"
    assert (t["change_vs_default"].fillna(0) == 0).all()  # only the default cell here
    two = heroes_claims.claims_table(
        pd.concat([rho, rho.assign(cell="authors", rho_mean=[0.75, 0.3])]), layers, sup, grad, claims, 6
    )
    a = two[two["cell"] == "authors"].set_index("id")
    assert a.loc["rho_sort", "change_vs_default"] == pytest.approx(-0.3)
    assert bool(a.loc["rho_sort", "closer_than_default"]) and a.loc["rho_sort", "status"] == "reproduced"
    assert not bool(a.loc["rho_reverse", "closer_than_default"])  # |0.75 - 0.72| = 0.03 > |0.70 - 0.72|


def test_claims_table_per_seed_rho_role_counts_and_bloat_ablation_from_components():
    rho = pd.DataFrame({"cell": ["default", "authors"], "task": ["sort", "sort"], "rho_mean": [0.6, 0.3]})
    sup = pd.DataFrame(
        {
            "cell": ["authors"],
            "task": ["sort"],
            "group": ["bloat"],
            "mean_individual": [0.02],
            "mean_joint": [0.075],
            "ratio": [3.75],
        }
    )
    empty = pd.DataFrame(columns=["cell", "task", "layer", "threshold", "G_mean", "hero_per10", "bloat_per10"])

    def comp(cell, seed, status, rho, roles):  # roles: component -> role at threshold 6
        return [
            {"cell": cell, "task": "sort", "seed": seed, "status": status, "rho": rho, "component": c, "role_t6": r}
            for c, r in roles.items()
        ]

    rows = (
        comp("authors", 42, "kept", 0.1, {"L3H3": "hero", "L1H1": "bloat", "L1H3": "aligned"})
        + comp("authors", 456, "kept", 0.25, {"L3H3": "hero", "L1H1": "aligned", "L1H3": "aligned"})
        + comp("authors", 123, "kept", 0.5, {"L3H3": "aligned", "L1H1": "aligned", "L1H3": "aligned"})
        + comp("authors", 789, "kept", 0.4, {"L3H3": "aligned", "L1H1": "aligned", "L1H3": "aligned"})
        + comp("authors", 2020, "skipped", float("nan"), {"L3H3": "hero", "L1H1": "bloat", "L1H3": "bloat"})
    )
    claims = [
        {"id": "bloat_ablation_pct", "claim": "a", "value": -10.1, "tolerance": 10.4},
        {"id": "rho_sort_seed456", "claim": "s456", "value": 0.0, "tolerance": 0.15},
        {"id": "rho_sort_seed2020", "claim": "s2020", "value": -0.18, "tolerance": 0.15},
        {"id": "sort_L3H3_hero", "claim": "h", "value": 7, "tolerance": 2},
        {"id": "sort_L1H1_bloat", "claim": "b1", "value": 6, "tolerance": 2},
        {"id": "sort_L1H3_bloat", "claim": "b3", "value": 6, "tolerance": 2},
    ]
    t = heroes_claims.claims_table(rho, empty, sup, empty, claims, 6, components=pd.DataFrame(rows))
    a = t[t["cell"] == "authors"].set_index("id")
    assert a.loc["bloat_ablation_pct", "value"] == pytest.approx(-7.5)  # minus the joint drop, in points
    assert a.loc["bloat_ablation_pct", "status"] == "reproduced"  # |-7.5 + 10.1| <= 10.4
    assert a.loc["rho_sort_seed456", "value"] == 0.25 and a.loc["rho_sort_seed456", "status"] == "differs"
    assert a.loc["rho_sort_seed2020", "status"] == "not run"  # the seed was skipped in this cell
    # 4 kept seeds: L3H3 a hero in 2 -> 5 per 10; L1H1 a bloat in 1 -> 2.5; L1H3 in none (the skipped seed does not count)
    assert a.loc["sort_L3H3_hero", "value"] == 5.0 and a.loc["sort_L3H3_hero", "status"] == "reproduced"  # |5 - 7| <= 2
    assert a.loc["sort_L1H1_bloat", "value"] == 2.5
    assert a.loc["sort_L1H3_bloat", "value"] == 0.0
    d = t[t["cell"] == "default"].set_index("id")  # no components of the default cell here
    assert set(d["status"]) == {"not run"}
    without = heroes_claims.claims_table(rho, empty, sup, empty, claims, 6).set_index(["id", "cell"])
    assert without.loc[("sort_L3H3_hero", "authors"), "status"] == "not run"  # no components table
