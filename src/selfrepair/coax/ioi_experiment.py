"""Paper B's IOI experiments on the toy IOI language of :mod:`selfrepair.tasks.ioi`:
training a toy model with attention-head dropout (core.train), the ground truth by brute force, and
COAX with its baselines (discovery, wake-up, freezing, recovery and knockout)."""

from __future__ import annotations

import pandas as pd
import torch

from selfrepair.coax import baselines
from selfrepair.coax import score as coax
from selfrepair.core.components import parse
from selfrepair.core.interventions import Prefix, first_layer, make_hooks, run_resumed
from selfrepair.core.stats import recall_at_k, roc_auc
from selfrepair.core.train import train_gpt2_head_dropout
from selfrepair.tasks.ioi import TOY_SHAPE, IOIPrompts, accuracy, logit_diff, toy_training


# ----------------------------------------------------------------------------------
# Training a toy IOI model with attention-head dropout
# ----------------------------------------------------------------------------------
def train_toy(
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_mlp: int,
    seed: int,
    head_dropout: float = 0.1,
    lr: float = 1e-3,
    batch_size: int = 64,
    max_steps: int = 3000,
    eval_every: int = 250,
    target_accuracy: float | None = None,
    device: str = "cpu",
):
    """Train a GPT-2 toy IOI model from scratch with paper B's recipe (attention-head
    dropout, :func:`selfrepair.core.train.train_gpt2_head_dropout` on the toy IOI data of
    :func:`selfrepair.tasks.ioi.toy_training`); returns (model, TrainResult)."""
    return train_gpt2_head_dropout(
        TOY_SHAPE, toy_training, n_layers, n_heads, d_model, d_mlp, seed, head_dropout, lr, batch_size,
        max_steps, eval_every, target_accuracy, device,
    )  # fmt: skip


# ----------------------------------------------------------------------------------
# Ground truth by brute force, and the experiments of paper B on one model
# ----------------------------------------------------------------------------------
def ablation_drops(bridge, prompts: IOIPrompts, sets, mode="zero", means=None, max_rows=2048) -> list[float]:
    """Logit-difference drop m(clean) - m(ablated) of each ablation set."""

    # the metric reads the last position only: each set resumes from the intact run at
    # its first ablated layer and is unembedded there only (interventions.run_resumed)
    vals = run_resumed(
        Prefix(bridge, prompts.tokens),
        [[]] + list(sets),
        mode,
        means,
        reduce=lambda lg: float(logit_diff(lg.cpu(), prompts)),
        max_rows=max_rows,
        positions=[prompts.tokens.shape[1] - 1],
    )
    return [vals[0] - v for v in vals[1:]]


def ground_truth(bridge, prompts: IOIPrompts, heads, n_primary: int = 3, backup_frac: float = 0.1, max_rows=2048):
    """Every head's single ablation and every pair's joint ablation on the IOI metric.

    Primaries (name movers): the ``n_primary`` heads with the largest drop.
    Interaction I(u, v) = drop(u, v) - drop(u) - drop(v); a head h outside the
    primaries is a backup when max_p I(p, h) > ``backup_frac`` * max_p drop(p) (its
    ablation hurts far more once a primary is gone). Returns (heads table, pairs table,
    primaries, backups).
    """

    heads = list(heads)
    single = ablation_drops(bridge, prompts, [[h] for h in heads], max_rows=max_rows)
    pairs = [(i, j) for i in range(len(heads)) for j in range(i + 1, len(heads))]
    joint = ablation_drops(bridge, prompts, [[heads[i], heads[j]] for i, j in pairs], max_rows=max_rows)
    inter = {}
    rows = []
    for (i, j), dj in zip(pairs, joint):
        val = dj - single[i] - single[j]
        inter[(i, j)] = inter[(j, i)] = val
        rows.append(
            {
                "u": heads[i].name,
                "v": heads[j].name,
                "drop_u": single[i],
                "drop_v": single[j],
                "drop_uv": dj,
                "interaction": val,
            }
        )
    order = sorted(range(len(heads)), key=lambda i: -single[i])
    prim = order[:n_primary]
    thr = backup_frac * max(single[p] for p in prim)
    table = []
    for i, h in enumerate(heads):
        beta = max((inter[(p, i)] for p in prim if p != i), default=float("nan"))
        table.append(
            {
                "unit": h.name,
                "drop": single[i],
                "backup_score": beta,
                "role": "primary" if i in prim else ("backup" if beta > thr else "other"),
            }
        )
    t = pd.DataFrame(table)
    primaries = [heads[i] for i in prim]
    backups = [heads[i] for i in range(len(heads)) if table[i]["role"] == "backup"]
    return t, pd.DataFrame(rows), primaries, backups


def _patched_drop(bridge, prompts, zero, freeze, clean_z, prefix: Prefix | None = None, m0: float | None = None):
    """Drop of the logit difference with ``zero`` heads zeroed and ``freeze`` heads held
    at their clean outputs (one forward).

    With ``prefix`` (the intact run of the prompts), the run resumes at the first layer
    of ``zero``: below it every head's output is its clean one, so holding a head there at
    its clean output changes no value; it is unembedded at the last position only (the
    metric's). ``m0``: the intact logit difference, when already known."""

    patch = {}
    for c in list(zero) + list(freeze):
        z = patch.setdefault(c.hook, clean_z[c.hook].clone())
        if c in zero:
            z[:, :, c.head, :] = 0.0
    hooks = make_hooks([list(zero) + list(freeze)], prompts.tokens.shape[0], "patch", patch)
    last = [prompts.tokens.shape[1] - 1]
    with torch.no_grad():
        if prefix is None:
            m0 = float(logit_diff(bridge(prompts.tokens).cpu(), prompts)) if m0 is None else m0
            m = float(logit_diff(bridge.run_with_hooks(prompts.tokens, fwd_hooks=hooks).cpu(), prompts))
        else:
            m0 = float(logit_diff(prefix.logits(last).cpu(), prompts)) if m0 is None else m0
            start = first_layer(zero, prefix.n_layers)
            m = float(logit_diff(prefix.run(start, 1, hooks, last).cpu(), prompts))
    return m0 - m


def run_ioi(
    bridge,
    prompts: IOIPrompts,
    heads,
    primaries,
    backups,
    protocol: str = "v2",
    top_r: int = 192,
    top_k: int = 20,
    k_recovered: int | None = None,
    wake_min: float = 1.05,
    ig_steps: int = 5,
    max_rows: int = 2048,
    amp_eps: float = baselines.AMP_EPS,
    vocab: int | None = None,
    last_only: bool = False,
) -> dict:
    """Paper B's IOI experiments on one model and one prompt set.

    ``primaries`` seed COAX (and the conditional baselines); ``backups`` are the
    positives (ground truth); ``amp_eps``: the amplification ratio's eps share;
    ``vocab``: the bound on ``v2``'s full vocabulary (:func:`score.support_at`). Returns
    DataFrames: scores (per head), discovery (ROC-AUC and top-k recall per method),
    wake (wake-up curve), freeze, recovery and knockout, plus the forward-pass count.
    ``last_only``: the intact run is unembedded at the last position only (every part
    reads that one; a 262k vocabulary at every position is gigabytes).
    """

    heads, primaries, backups = list(heads), list(primaries), list(backups)
    cands = [h for h in heads if h not in primaries]
    metric = lambda lg: logit_diff(lg, prompts)  # noqa: E731
    last = [prompts.tokens.shape[1] - 1]
    # one intact run of the prompts, shared by every part below: each ablated or
    # interpolated run resumes from it at the first layer it changes (interventions.Prefix)
    pfx = Prefix(bridge, prompts.tokens, keep_z=True, positions=last if last_only else None)
    sc = coax.scan(
        bridge, prompts.tokens, cands, primaries, protocol, top_r, max_rows=max_rows, prefix=pfx, vocab=vocab
    )
    # wake-up curve: backups vs the other candidates, 0..|S| primaries ablated; its last
    # point (all of S ablated) is each candidate's wake-up ratio
    wc = coax.wake_up_curve(bridge, prompts.tokens, primaries, cands, positions=last, prefix=pfx)
    at_s = wc[wc["n_ablated"] == len(primaries)]
    wake = {u: float(r) for u, r in zip(at_s["unit"], at_s["ratio"])}
    # logit_diff reads the last position only: only it is unembedded (logits_to_keep=1)
    table = baselines.all_scores(
        bridge, prompts.tokens, cands, metric, sc.table, ig_steps, primaries=primaries, amp_eps=amp_eps,
        logits_to_keep=1, prefix=pfx,
    )  # fmt: skip
    table["wake"] = table["unit"].map(wake)
    bset = {b.name for b in backups}
    table["backup"] = table["unit"].isin(bset)
    disc = _discovery(table, bset, top_k, len(cands))

    wc["group"] = wc["unit"].map(lambda u: "backup" if u in bset else "other")

    freeze = _freeze(bridge, prompts, primaries, backups, cands, pfx, last)

    # attribution recovery and knockout
    k = k_recovered if k_recovered is not None else max(1, len(backups))
    rec = [parse_name(u) for u in coax.recovered_set(sc.table, wake, k, wake_min)]
    own = [parse_name(u) for u in table.assign(s=table["single"]).sort_values("s", ascending=False)["unit"].head(k)]
    sets = {
        "clean": [],
        "primaries": primaries,
        "primaries+coax": primaries + rec,
        "primaries+ground_truth": primaries + backups,
        "primaries+own_topk": primaries + own,
    }
    ko = _knockout(pfx, prompts, sets, max_rows, last)
    return {
        "scores": table,
        "discovery": disc,
        "wake": wc,
        "freeze": freeze,
        "knockout": ko,
        "forward_passes": sc.forward_passes,
        "recovered": [c.name for c in rec],
    }


def _discovery(table: pd.DataFrame, bset: set, top_k: int, n_candidates: int) -> pd.DataFrame:
    """ROC-AUC and top-k recall of the backups ``bset`` per discovery method, each
    method's ranking of the candidates in ``table``."""
    disc = []
    for name, fn in baselines.DISCOVERY_METHODS.items():
        s = fn(table)
        ranked = list(table.assign(s=s).sort_values("s", ascending=False)["unit"])
        hit, share = recall_at_k(ranked, bset, top_k)
        disc.append(
            {
                "method": name,
                "roc_auc": roc_auc(s, table["backup"]),
                "top_k": top_k,
                "hits": hit,
                "n_backups": len(bset),
                "n_candidates": n_candidates,
            }
        )
    return pd.DataFrame(disc)


def _freeze(bridge, prompts: IOIPrompts, primaries, backups, cands, pfx: Prefix, last) -> pd.DataFrame:
    """Freezing the backups at their clean outputs: the drop of the logit difference with
    the primaries ablated, with the backups (or every candidate) frozen too, and the
    share of the repair that freezing the backups removes."""
    clean_z = pfx.z
    with torch.no_grad():
        m0 = float(logit_diff(pfx.logits(last).cpu(), prompts))
    d_p = _patched_drop(bridge, prompts, primaries, [], clean_z, pfx, m0)
    d_fb = _patched_drop(bridge, prompts, primaries, backups, clean_z, pfx, m0)
    d_fa = _patched_drop(bridge, prompts, primaries, cands, clean_z, pfx, m0)
    repair = d_fa - d_p
    return pd.DataFrame(
        [
            {
                "drop_primaries": d_p,
                "drop_backups_frozen": d_fb,
                "drop_all_frozen": d_fa,
                "repair_total": repair,
                "repair_removed_share": (d_fb - d_p) / repair if repair != 0 else float("nan"),
            }
        ]
    )


def _knockout(pfx: Prefix, prompts: IOIPrompts, sets: dict, max_rows: int, last) -> pd.DataFrame:
    """The logit difference, its drop from the clean run and the accuracy with each of
    ``sets`` ({name: heads}, the first the clean run's empty set) ablated."""
    outs = run_resumed(
        pfx,
        list(sets.values()),
        reduce=lambda lg: (float(logit_diff(lg.cpu(), prompts)), accuracy(lg.cpu(), prompts)),
        max_rows=max_rows,
        positions=last,
    )
    m0 = outs[0][0]
    return pd.DataFrame(
        [
            {
                "set": n,
                "size": len(s),
                "units": " ".join(c.name for c in s),
                "logit_diff": o[0],
                "drop": m0 - o[0],
                "accuracy": o[1],
            }
            for (n, s), o in zip(sets.items(), outs)
        ]
    )


def parse_name(name):

    return parse(name)
