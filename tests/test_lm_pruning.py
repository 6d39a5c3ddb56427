"""Paper B's pruning on a real LM (coax.lm_pruning, tasks.plays), on tiny local models of
the packaged LMs' architectures: sequential COAX against the scan-based order, the
perplexity against a hand-computed cross-entropy, the text and its windows."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from selfrepair.coax import lm_pruning, pruning
from selfrepair.coax import score as coax
from selfrepair.core.components import head_components
from selfrepair.core.interventions import Prefix, run_resumed
from selfrepair.core.models import load_bridge
from selfrepair.tasks import plays
from test_coax_lms import V, tiny_lm  # noqa: F401  (the fixture: a tiny Llama and a tiny Gemma-3)


def _calib(n=3, t=10, seed=1):
    return torch.randint(2, V, (n, t), generator=torch.Generator().manual_seed(seed))


def test_a_given_prefix_resumes_s_plus_u_from_us_own_layer(tiny_lm):  # noqa: F811
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tokens = _calib()
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    pos = lm_pruning.kept_positions(tokens.shape[1], 1)
    pfx = Prefix(bridge, tokens, positions=pos)
    removed = [heads[0]]  # layer 0: every other set resumes later than S's first layer
    cond, ref = lm_pruning.given(pfx, removed, pos)
    full_ref = run_resumed(pfx, [removed], positions=pos)[0]
    torch.testing.assert_close(ref, full_ref, rtol=1e-5, atol=1e-5)
    late = [h for h in heads if h.layer == bridge.cfg.n_layers - 1]
    want = run_resumed(pfx, [removed + [u] for u in late], positions=pos)
    for u, w in zip(late, want):
        got = cond.run(u.layer, 1, lm_pruning.make_hooks([removed + [u]], pfx.b), pos)
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5)


def test_sequential_coax_picks_what_the_scan_picks(tiny_lm):  # noqa: F811
    """The scan (pruning.coax_order's step: every single and conditional ablation from
    the first ablated layer) is the reference; stride 1 keeps its v1 positions."""
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tokens = _calib()
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    n = len(heads) - 1
    pos = lm_pruning.kept_positions(tokens.shape[1], 1)
    order, steps = lm_pruning.coax_order(bridge, tokens, heads, n, pos, 16, 64)
    want, _ = pruning.coax_order(bridge, tokens, heads, n, "v1", 16, 64)
    assert [h.name for h in order] == [h.name for h in want]
    # each step's energy is the scan's value of the pick
    removed = []
    for _, row in steps.iterrows():
        sc = coax.scan(bridge, tokens, [h for h in heads if h not in removed], removed, "v1", 16, max_rows=64)
        col = "cond" if removed else "single"
        got = float(sc.table.set_index("unit").loc[row["unit"], col])
        assert math.isclose(row["energy"], got, rel_tol=1e-4, abs_tol=1e-7)
        removed.append(next(h for h in heads if h.name == row["unit"]))
    assert list(steps["candidates"]) == list(range(len(heads), 1, -1))


def test_perplexity_is_the_cross_entropy_of_the_pruned_model(tiny_lm):  # noqa: F811
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    ev = _calib(5, 8, seed=7)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    orders = {"a": list(heads), "b": list(reversed(heads))}
    seqs = lm_pruning.perplexities(bridge, ev, orders, [0.0, 0.5], max_rows=2)
    t = lm_pruning.summary(seqs, 0.5)
    # by hand: zero the pruned heads' z with a hook, cross-entropy of every next token
    n = round(0.5 * len(heads))
    pruned = orders["b"][:n]

    def zero(layer):
        def fn(z, hook):
            z = z.clone()
            for h in pruned:
                if h.layer == layer:
                    z[:, :, h.head] = 0
            return z

        return fn

    hooks = [(f"blocks.{la}.attn.hook_z", zero(la)) for la in {h.layer for h in pruned}]
    with torch.no_grad():
        lg = bridge.run_with_hooks(ev, fwd_hooks=hooks)
    ce = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]).float(), ev[:, 1:].reshape(-1))
    row = t[(t["method"] == "b") & (t["sparsity"] == 0.5)].iloc[0]
    assert math.isclose(row["perplexity"], float(torch.exp(ce)), rel_tol=1e-5)
    assert row["n_pruned"] == n and row["n_windows"] == 5 and bool(row["is_headline"])
    # sparsity 0 is the dense model for both methods, run once
    dense = seqs[seqs["sparsity"] == 0.0].pivot(index="window", columns="method", values="nll")
    assert (dense["a"] == dense["b"]).all()


def test_a_sparsity_past_the_order_is_refused(tiny_lm):  # noqa: F811
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    with pytest.raises(ValueError, match="fewer than sparsity"):
        lm_pruning.perplexities(bridge, _calib(2, 6), {"coax": heads[:1]}, [0.5], max_rows=4)


def test_kept_positions_end_before_the_last():
    assert lm_pruning.kept_positions(10, 1) == list(range(9))
    assert lm_pruning.kept_positions(10, 4) == [0, 4, 8]
    with pytest.raises(ValueError, match="stride"):
        lm_pruning.kept_positions(10, 0)


def test_the_play_is_its_speeches_and_windows_do_not_overlap():
    txt = plays.text("hamlet")
    first = txt.splitlines()[0]
    assert first == "Bernardo: Who's there?"  # the play's first line; headings and directions gone
    assert "#" not in txt and "**" not in txt and "ACT I" not in txt
    assert "hamlet" in plays.names() and "othello" in plays.names()
    with pytest.raises(ValueError, match="no play 'hamlett'.*hamlet"):
        plays.text("hamlett")

    class Tok:  # one token per character
        bos_token_id = 0

        def encode(self, s, add_special_tokens=False):
            return [ord(c) for c in s]

    w = plays.windows(Tok(), "abcdefghij", 2, 4, bos=True, skip=1)
    assert w.tolist() == [[0, ord("d"), ord("e"), ord("f")], [0, ord("g"), ord("h"), ord("i")]]
    with pytest.raises(ValueError, match="fewer than the 4 asked for"):
        plays.windows(Tok(), "abcdefghij", 3, 4, bos=False, skip=1)


def test_the_heartbeats_plan_counts_the_rows_coax_order_runs(tiny_lm):  # noqa: F811
    from selfrepair.core.progress import Progress

    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tokens = _calib()
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    with Progress("tiny", "pruning", 1, every=3600) as prog:
        prog.watch(bridge)
        lm_pruning.coax_order(bridge, tokens, heads, 3, lm_pruning.kept_positions(10, 2), 8, 64)
    assert prog.rows == lm_pruning.coax_rows(len(heads), 3, tokens.shape[0])


def test_the_docs_block_shows_each_share_and_the_claim(tmp_path):
    from selfrepair.tooling import coax_lm_tables as T

    rows = [{"method": m, "sparsity": s, "n_pruned": n, "window": w, "nll": x + w * 0.01}
            for m, x50 in (("coax", 2.0), ("taylor", 3.0), ("random", 4.0))
            for s, n, x in ((0.0, 0, 1.0), (0.5, 36, x50)) for w in range(4)]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "real_lms_pruning_gemma-3-270m.csv", index=False)
    assert T.pruning_block(tmp_path / "nothing") == {}
    pd.DataFrame([{"model": "gemma-3-270m", "cpu_s": 600.0, "peak_rss_mb": 2048.0}]).to_csv(
        tmp_path / T.PRUNING_STATUS, index=False
    )
    md = T.pruning_block(tmp_path)["real_lms_pruning"]
    lines = md.splitlines()
    assert lines[0].startswith("**Gemma-3-270M** (heads removed at each share: 0, 36; 4 windows)")
    assert lines[2] == "| heads removed | random | taylor | coax |"
    # exp of the mean NLL over the windows (x + 0.015); the lowest in bold
    assert lines[5] == f"| 50% | {np.exp(4.015):.1f} | {np.exp(3.015):.1f} | **{np.exp(2.015):.1f}** |"
    assert "log-perplexity gap 1.000 [1.000, 1.000]" in md and "**holds**" in md
    assert "10.0 CPU-min, peak 2.00 GB" in md


@pytest.mark.slow
def test_the_rule_runs_at_the_scales_it_names_and_the_claims_read_it(tmp_path):
    import golden_suite as G

    over = tmp_path / "lms.yaml"
    over.write_text("lms: {models: [smollm2-135m, gemma-3-270m], scale: large}\n")
    r = G.snakemake("-n", *G.tiny_args(tmp_path, over, paper="coax"), "--", "results/published/real_lms.csv")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert out.count("rule coax_lm_pruning:") == 2 and "results/coax/lms/gemma-3-270m/pruning/sequences.csv" in out
    # the default scale: no pruning job, and the claim says where it runs
    over.write_text("lms: {models: [smollm2-135m, gemma-3-270m], scale: default}\n")
    r = G.snakemake("-n", *G.tiny_args(tmp_path, over, paper="coax"), "--", "results/published/real_lms.csv")
    assert r.returncode == 0 and "rule coax_lm_pruning:" not in r.stdout + r.stderr
    # the same play for both: refused at parse, naming the key
    over.write_text("lms: {models: [gemma-3-270m], scale: large}\ncoax: {lms: {pruning: {calibration: hamlet}}}\n")
    r = G.snakemake("-n", *G.tiny_args(tmp_path, over, paper="coax"), check=False)
    assert r.returncode != 0
    assert "coax.lms.pruning: calibration and evaluation are both 'hamlet'" in r.stdout + r.stderr


def test_a_killed_order_resumes_after_its_saved_steps(tiny_lm, tmp_path, caplog):  # noqa: F811
    _, folder = tiny_lm
    bridge = load_bridge(folder)
    tokens = _calib()
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    pos = lm_pruning.kept_positions(tokens.shape[1], 2)
    whole, whole_steps = lm_pruning.coax_order(bridge, tokens, heads, 4, pos, 8, 64)
    ck = tmp_path / "ck.csv"
    lm_pruning.coax_order(bridge, tokens, heads, 2, pos, 8, 64, checkpoint=ck, identity="m")  # "killed" after 2
    assert len(pd.read_csv(ck)) == 2
    with caplog.at_level("INFO", logger="selfrepair.coax.lm_pruning"):
        order, steps = lm_pruning.coax_order(bridge, tokens, heads, 4, pos, 8, 64, checkpoint=ck, identity="m")
    assert "resuming after the 2 steps saved" in caplog.text
    assert [h.name for h in order] == [h.name for h in whole]
    pd.testing.assert_frame_equal(steps, whole_steps)
    # another model's identity, or a damaged file: started over, and said
    caplog.clear()
    with caplog.at_level("INFO", logger="selfrepair.coax.lm_pruning"):
        order, _ = lm_pruning.coax_order(bridge, tokens, heads, 4, pos, 8, 64, checkpoint=ck, identity="other")
    assert "saved for other inputs or is damaged: starting over" in caplog.text
    assert [h.name for h in order] == [h.name for h in whole]
    ck.write_text("not,a\ncheckpoint")
    caplog.clear()
    with caplog.at_level("INFO", logger="selfrepair.coax.lm_pruning"):
        lm_pruning.coax_order(bridge, tokens, heads, 1, pos, 8, 64, checkpoint=ck, identity="m")
    assert "starting over" in caplog.text
    # the heartbeat's plan of a resumed order: the steps left only
    assert lm_pruning.coax_rows(8, 4, 3, start=2) == 3 * (1 + (1 + 8 - 2) + (1 + 8 - 3))
