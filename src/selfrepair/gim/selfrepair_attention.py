"""Attention self-repair (paper C): several keys with large attention and similar values,
so that removing one attention score barely matters, because the softmax gives its
weight to the others.

* occurrences: per input, the number of (layer, head, query) rows with more than one
  important key (attention weight > ``threshold``);
* ablations: for the rows at the prediction position with more than one important key,
  the top two keys' scores are set to -inf singly and jointly (pre-softmax, so the
  softmax renormalizes), and the change of the logit difference is measured;
  interaction = (both - first - second) / both, on absolute effects.
Many ablations share one forward pass: the batch holds one copy of an input per ablation.
"""

from __future__ import annotations

import pandas as pd
import torch

from selfrepair.gim.evaluate import logit_diff
from selfrepair.tasks.counterfactual import CounterfactualBatch


def patterns(bridge, tokens: torch.Tensor) -> torch.Tensor:
    """Attention patterns [N, L, H, T, T] of a clean run."""
    store = {}
    n_layers = bridge.cfg.n_layers
    hooks = [
        (
            f"blocks.{layer}.attn.hook_pattern",
            (lambda layer: lambda x, hook: store.__setitem__(layer, x.detach()))(layer),
        )
        for layer in range(n_layers)
    ]
    with torch.no_grad():
        bridge.run_with_hooks(tokens.to(next(bridge.parameters()).device), fwd_hooks=hooks)  # host tokens follow
    return torch.stack([store[layer] for layer in range(n_layers)], dim=1)


def occurrences(pat: torch.Tensor, threshold: float) -> torch.Tensor:
    """Per input: rows (layer, head, query) with more than one key above ``threshold``."""
    return ((pat > threshold).sum(-1) > 1).flatten(1).sum(1)


def _ablate(bridge, data: CounterfactualBatch, jobs: list[tuple], batch_size: int) -> torch.Tensor:
    """Logit difference of each job (input, layer, head, query, keys) with those scores at -inf."""
    out = []
    for a in range(0, len(jobs), batch_size):
        chunk = jobs[a : a + batch_size]
        idx = torch.tensor([j[0] for j in chunk])
        sub = CounterfactualBatch(data.clean[idx], data.corrupt[idx], data.answer[idx], data.foil[idx], data.pos[idx])
        by_layer = {}
        for r, (_, layer, head, q, keys) in enumerate(chunk):
            for k in keys:
                by_layer.setdefault(layer, []).append((r, head, q, k))

        def make(entries):
            r, h, q, k = (list(v) for v in zip(*entries))

            def fn(x, hook):
                x = x.clone()
                x[r, h, q, k] = float("-inf")
                return x

            return fn

        hooks = [(f"blocks.{layer}.attn.hook_attn_scores", make(e)) for layer, e in by_layer.items()]
        with torch.no_grad():
            logits = bridge.run_with_hooks(sub.clean, fwd_hooks=hooks)
        out.append(logit_diff(logits, sub))
    return torch.cat(out) if out else torch.zeros(0)


def attention_selfrepair(bridge, data: CounterfactualBatch, threshold: float = 0.1, batch_size: int = 256):
    """(per-input occurrences, per-row single/joint ablation effects) as DataFrames."""
    data = data.to(next(bridge.parameters()).device)  # host data follows the model (a no-op on the CPU)
    pat = patterns(bridge, data.clean)
    occ = occurrences(pat, threshold)
    with torch.no_grad():
        base = logit_diff(bridge(data.clean), data)
    jobs, rows = [], []
    n_layers, n_heads = pat.shape[1], pat.shape[2]
    for i in range(len(data)):
        q = int(data.pos[i])
        for layer in range(n_layers):
            for head in range(n_heads):
                w = pat[i, layer, head, q]
                if int((w > threshold).sum()) < 2:
                    continue
                top = torch.topk(w, 2)
                k1, k2 = int(top.indices[0]), int(top.indices[1])
                rows.append(
                    {
                        "input": i,
                        "layer": layer,
                        "head": head,
                        "query": q,
                        "key1": k1,
                        "key2": k2,
                        "w1": float(top.values[0]),
                        "w2": float(top.values[1]),
                    }
                )
                jobs += [(i, layer, head, q, (k1,)), (i, layer, head, q, (k2,)), (i, layer, head, q, (k1, k2))]
    ld = _ablate(bridge, data, jobs, batch_size)
    for n, row in enumerate(rows):
        b = float(base[row["input"]])
        e1, e2, e12 = (abs(b - float(ld[3 * n + j])) for j in range(3))
        row.update(
            effect1=e1, effect2=e2, effect_joint=e12, interaction=(e12 - e1 - e2) / e12 if e12 > 0 else float("nan")
        )
    per_input = pd.DataFrame({"input": range(len(data)), "occurrences": occ.tolist()})
    return per_input, pd.DataFrame(
        rows,
        columns=[
            "input",
            "layer",
            "head",
            "query",
            "key1",
            "key2",
            "w1",
            "w2",
            "effect1",
            "effect2",
            "effect_joint",
            "interaction",
        ],
    )


def summarize(occ: pd.DataFrame, abl: pd.DataFrame) -> pd.DataFrame:
    """Per task and model: occurrences per input, and how often joint > sum of singles."""
    rows = []
    for (task, model), o in occ.groupby(["task", "model"]):
        a = abl[(abl.task == task) & (abl.model == model)]
        sup = a.effect_joint > a.effect1 + a.effect2
        rows.append(
            {
                "task": task,
                "model": model,
                "n_inputs": len(o),
                "occurrences_mean": o.occurrences.mean(),
                "occurrences_min": o.occurrences.min(),
                "occurrences_max": o.occurrences.max(),
                "n_rows_ablated": len(a),
                "frac_joint_exceeds_sum": float(sup.mean()) if len(a) else float("nan"),
                "interaction_median": float(a.interaction.median()) if len(a) else float("nan"),
                "effect_joint_mean": float(a.effect_joint.mean()) if len(a) else float("nan"),
                "effect_sum_mean": float((a.effect1 + a.effect2).mean()) if len(a) else float("nan"),
            }
        )
    return pd.DataFrame(rows)
