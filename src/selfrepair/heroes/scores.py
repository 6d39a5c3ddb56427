"""Paper A: gradient magnitude G vs causal importance C on sequence tasks.

Exact-match accuracy needs one forward pass per batch: greedy decoding reproduces the
whole target iff, under teacher forcing, the argmax at every target position is the
target token (each correct step feeds the decoder exactly the teacher-forced prefix).
That holds for an ablated model too, since the ablations here are causal.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from selfrepair.core import engine
from selfrepair.core.components import Component
from selfrepair.core.train import masked_lm_loss
from selfrepair.tasks import sequences as S


def exact_match(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Bool [B]: every target position's argmax equals its target token."""
    ok = (logits.argmax(-1) == targets) | ~mask
    return ok.all(-1)


def forward_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of a bridge (called on tokens) or of a Hugging Face model."""
    if hasattr(model, "run_with_hooks"):
        return model(tokens)
    return model(input_ids=tokens).logits


def target_positions(mask: torch.Tensor) -> slice:
    """The smallest slice of sequence positions holding every target of ``mask`` [B, T]."""
    cols = mask.any(0).nonzero().flatten()
    if cols.numel() == 0:
        raise ValueError("the batch has no target positions (its mask is all False)")
    return slice(int(cols[0]), int(cols[-1]) + 1)


def ablation_correct(
    model,
    batch: S.Batch,
    sets: Sequence[Sequence[Component]],
    mode: str = "zero",
    means: dict | None = None,
    rows: int | None = None,
    reuse: bool = True,
    site: str = "hook_z",
) -> torch.Tensor:
    """Bool [len(sets), B]: exact match of every sequence with each set ablated (heads at
    ``site``, see ``engine.SITES``).

    Runs on :class:`selfrepair.core.engine.AblationEngine` (``model`` a Hugging Face
    GPT-2 LM from ``models.load_hf``): each set resumes from the intact model's or the
    previous set's residual stream at its first differing layer (``reuse``), the last
    layer runs at the target positions only, rows in chunks of ``rows`` sequences
    (default: 256 on a CPU, where it is fastest, the whole batch on a GPU; on the CPU the
    chunking changes no bit). The logits are those of a full forward of the ablated
    model, bit for bit. Put a pruning curve's sets in order (each one component more than
    the last) to let every point start at the component it adds."""
    pos = target_positions(batch.mask)
    device = engine.hf_model(model).transformer.wte.weight.device  # the batch follows the model
    targets, mask = batch.targets[:, pos].to(device), batch.mask[:, pos].to(device)
    if rows is None:
        rows = 256 if device.type == "cpu" else max(1, len(batch))
    eng = engine.AblationEngine(model, mode, means, rows=rows, reuse=reuse, site=site)
    rows_out = eng.run(batch.tokens, sets, lambda lg, r: exact_match(lg, targets[r], mask[r]), positions=pos)
    return torch.stack(rows_out)


def correct(model, batch: S.Batch, rows: int | None = None) -> torch.Tensor:
    """Per-sequence exact match of the intact model (the engine's empty set)."""
    return ablation_correct(model, batch, [[]], rows=rows)[0]


def greedy_decode_correct(model, task: str, values: torch.Tensor) -> bool:
    """Reference: decode one sequence token by token (the original protocol)."""
    n = values.shape[-1]
    prompt = torch.cat([torch.tensor([S.START]), values, torch.tensor([S.SEP])])
    seq = prompt[None]
    with torch.no_grad():
        for _ in range(n + 1):
            nxt = forward_logits(model, seq)[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    target = torch.cat([S.solve(task, values[None])[0], torch.tensor([S.END])])
    return bool((seq[0, n + 2 :] == target).all())


def id_accuracy(model, task: str, min_len: int, max_len: int, n: int, seed: int, padding: str = "per_batch") -> float:
    """In-distribution exact match: ``n`` sequences per length (per_batch), or ``n`` padded
    batches' worth of examples of mixed lengths (per_example), as the model was trained."""
    if padding == "per_batch":
        accs = [
            correct(model, S.eval_set(task, length, n, seed + length)).float().mean().item()
            for length in range(min_len, max_len + 1)
        ]
        return float(np.mean(accs))
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return correct(model, S.make_padded_batch(task, lengths, g)).float().mean().item()


def select_ood_length(acc_by_length: dict[int, float], lengths: Sequence[int], window: Sequence[float]) -> int | None:
    """The first length whose accuracy lies in the closed window [lo, hi], else None."""
    lo, hi = window
    for n in lengths:
        a = acc_by_length[n]
        if lo <= a <= hi:
            return int(n)
    return None


def ood_accuracies(model, task: str, lengths: Sequence[int], n: int, seed: int) -> dict[int, float]:
    return {int(L): correct(model, S.eval_set(task, L, n, seed + 1000 * L)).float().mean().item() for L in lengths}


def lm_loss(logits: torch.Tensor, batch: S.Batch) -> torch.Tensor:
    return masked_lm_loss(logits, batch.targets, batch.mask)


def causal_scores(
    model, batch: S.Batch, components: Sequence[Component], mode: str, means: dict | None
) -> pd.DataFrame:
    """C = baseline accuracy - accuracy with the component ablated, with its paired SE."""
    correct = ablation_correct(model, batch, [[]] + [[c] for c in components], mode, means)
    return causal_table(correct, [c.name for c in components], mode)


def causal_table(correct: torch.Tensor, names: Sequence[str], mode: str) -> pd.DataFrame:
    """C and its paired SE from exact-match rows [1 + n, B] (row 0 intact, row 1 + i with
    component i ablated), as ablation_correct returns them: a rule that keeps the
    per-sequence outcomes (heroes_scores' outcomes.pt) computes C from them."""
    res = correct.float()
    base = res[0]
    rows = []
    n = base.numel()
    for name, r in zip(names, res[1:]):
        diff = base - r
        se = float(diff.std(unbiased=True) / math.sqrt(n)) if n > 1 else float("nan")
        rows.append(
            {
                "component": name,
                "mode": mode,
                "baseline_acc": float(base.mean()),
                "ablated_acc": float(r.mean()),
                "C": float(diff.mean()),
                "C_se": se,
                "n": n,
            }
        )
    return pd.DataFrame(rows)


def joint_drops(base: float, individual: Sequence[float], joint: float) -> dict:
    """Joint vs individual ablation from accuracies: drops are baseline - ablated accuracy;
    superadditivity = joint drop / sum of individual drops (NaN when the sum is 0)."""
    total = float(sum(base - x for x in individual))
    drop = base - joint
    return {
        "n": len(individual),
        "baseline_acc": base,
        "sum_individual": total,
        "mean_individual": total / len(individual),
        "joint": drop,
        "superadditivity": drop / total if total > 0 else float("nan"),
    }


EMPTY_GROUP = {
    "n": 0,
    "sum_individual": float("nan"),
    "joint": float("nan"),
    "mean_individual": float("nan"),
    "superadditivity": float("nan"),
}


def joint_vs_individual(model, batch: S.Batch, group: Sequence[Component], mode: str, means: dict | None) -> dict:
    """Ablate every member alone and all at once (:func:`joint_drops`)."""
    if not group:
        return dict(EMPTY_GROUP)
    res = ablation_correct(model, batch, [[]] + [[c] for c in group] + [list(group)], mode, means).float().mean(1)
    return joint_drops(float(res[0]), [float(x) for x in res[1:-1]], float(res[-1]))


def pruning_curve(model, batch: S.Batch, order: Sequence[Component], mode: str, means: dict | None) -> list[float]:
    """Accuracy after ablating the first k components of ``order``, k = 0..len(order)."""
    sets = [list(order[:k]) for k in range(len(order) + 1)]
    return ablation_correct(model, batch, sets, mode, means).float().mean(1).tolist()


def saved_means(outcomes: dict, source) -> dict[str, torch.Tensor]:
    """The component means heroes_scores keeps in outcomes.pt (``source`` names the file
    in the error when they are missing: an outcomes.pt written before the engine)."""
    if "means" not in outcomes:
        raise ValueError(
            f"{source} holds no component means (written before the ablation engine): "
            "rerun heroes_scores for this seed (snakemake --forcerun heroes_scores ...)"
        )
    return outcomes["means"]


def probe_ablations(
    model,
    batch: S.Batch,
    groups: dict[str, Sequence[Component]],
    orders: dict[str, Sequence[Component]],
    mode: str,
    means: dict | None,
    known: dict[str, torch.Tensor] | None = None,
) -> tuple[dict[str, dict], dict[str, list[float]]]:
    """heroes_probe's ablations in one engine call: :func:`joint_vs_individual` of every
    group and :func:`pruning_curve` of every order, the same numbers.

    ``known`` maps ``"baseline"`` and component names to exact-match rows [B] already
    measured on this batch with this mode and these means (heroes_scores' outcomes.pt):
    the intact model and those single ablations are not run again. Each set runs once
    (the curves share their ends), in curve order, so that every point resumes at the
    component it adds."""
    known = known or {}

    def label(key: frozenset) -> str | None:
        if not key:
            return "baseline"
        return next(iter(key)).name if len(key) == 1 else None

    wanted: dict[frozenset, None] = {}
    for order in orders.values():
        for k in range(len(order) + 1):
            wanted[frozenset(order[:k])] = None
    for group in groups.values():
        if group:
            for key in [frozenset()] + [frozenset([c]) for c in group] + [frozenset(group)]:
                wanted[key] = None
    acc = {key: float(known[label(key)].float().mean()) for key in wanted if label(key) in known}
    todo = [key for key in wanted if key not in acc]
    if todo:
        rows = ablation_correct(model, batch, [list(k) for k in todo], mode, means)
        acc.update(zip(todo, rows.float().mean(1).tolist()))
    joint = {
        name: joint_drops(acc[frozenset()], [acc[frozenset([c])] for c in group], acc[frozenset(group)])
        if group
        else dict(EMPTY_GROUP)
        for name, group in groups.items()
    }
    curves = {name: [acc[frozenset(order[:k])] for k in range(len(order) + 1)] for name, order in orders.items()}
    return joint, curves


def attention_stats(patterns: Sequence[torch.Tensor]) -> pd.DataFrame:
    """Per head, from each layer's attention patterns [B, H, Tq, Tk]
    (:meth:`engine.AblationEngine.attention_patterns`): mean attention entropy (nats),
    mean attention to position 0 (the START token, a sink), and the mean distance
    |query - argmax key| over query positions >= 1."""
    rows = []
    for layer, pat in enumerate(patterns):
        pat = pat.float()
        t = pat.shape[-1]
        q = torch.arange(t, device=pat.device)
        ent = -(pat.clamp_min(1e-12).log() * pat).sum(-1)  # [B, H, Tq]
        for h in range(pat.shape[1]):
            p = pat[:, h, 1:, :]
            rows.append(
                {
                    "component": f"L{layer}H{h}",
                    "entropy": float(ent[:, h, 1:].mean()),
                    "sink_mass": float(p[..., 0].mean()),
                    "argmax_distance": float((q[1:] - p.argmax(-1)).abs().float().mean()),
                }
            )
    return pd.DataFrame(rows)


def mean_attention_pattern(patterns: Sequence[torch.Tensor], layer: int, head: int) -> np.ndarray:
    """Attention pattern [T, T] of one head, averaged over the batch."""
    return patterns[layer][:, head].float().mean(0).cpu().numpy()
