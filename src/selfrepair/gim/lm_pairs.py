"""Paper C on a real LM, per pair: task accuracy and its gate, faithfulness curves that
keep every pair's metric, and CPR / CMD with a bootstrap interval over the pairs.

The curves are :func:`evaluate.faithfulness_curves`' (the same circuits, the same
``run_circuits`` calls: the means are its numbers), but each circuit's per-pair logit
differences are kept. A bootstrap resample of the pairs then recomputes m(M), m(empty)
and m(C) as means over the resampled pairs, f(C) = (m(C) - m(empty)) / (m(M) - m(empty))
at each fraction, and CPR / CMD from those f: the interval needs no patching beyond the
curves' own runs. The interval is the percentile one of :func:`pair_bootstrap`.
"""

from __future__ import annotations

import numpy as np
import torch

from selfrepair.gim.evaluate import FRACTIONS, area, read_logits, run_circuits
from selfrepair.gim.graph import Graph, n_edges_at, select_edges
from selfrepair.gim.hooks import on_prepared
from selfrepair.tasks.counterfactual import CounterfactualBatch

GATE_MARGIN = 0.3  # a task runs on a model whose held-out accuracy is >= chance + this


# ---------------------------------------------------------------- accuracy -------
def correct(bridge, data: CounterfactualBatch, choices: torch.Tensor | None = None, batch_size: int = 20):
    """Per clean prompt, whether the model gets it right (bool [N]): logit[answer] >
    logit[foil] at the read position, or, with ``choices`` ([N, k] candidate ids, e.g.
    the MCQA labels), the answer has the largest logit among them."""
    out = []
    device = next(bridge.parameters()).device
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            b = data.slice(i, i + batch_size)
            last = read_logits(bridge, b.clean.to(device), b.pos).float().cpu()
            rows = torch.arange(len(b))
            if choices is None:
                out.append(last[rows, b.answer] > last[rows, b.foil])
            else:
                c = choices[i : i + batch_size]
                best = c[rows, last.gather(1, c).argmax(1)]
                out.append(best == b.answer)
    return torch.cat(out)


def gate(accuracy: float, chance: float, margin: float = GATE_MARGIN) -> tuple[bool, str]:
    """(solved, why): a task is solved when its held-out accuracy is at least chance +
    ``margin``."""
    need = chance + margin
    ok = accuracy >= need - 1e-12
    return ok, f"accuracy {accuracy:.3f} {'>=' if ok else '<'} chance {chance:.2f} + {margin:.2f}"


# ---------------------------------------------------------------- curves ---------
@on_prepared
def pair_curves(
    bridge, graph: Graph, data: CounterfactualBatch, scores, fractions=FRACTIONS, batch_size=20, selection="topn"
) -> dict:
    """Per-pair logit differences of the circuits of :func:`evaluate.faithfulness_curves`:
    {"full": [N], "empty": [N], "signed": [F, N], "absolute": [F, N], "n_edges": [F],
    "n_kept": {"signed": [F], "absolute": [F]}} (numpy, float64)."""
    return pair_curves_many(bridge, graph, data, {"": scores}, fractions, batch_size, {"": selection})[""]


@on_prepared
def pair_curves_many(
    bridge, graph: Graph, data: CounterfactualBatch, scores: dict, fractions=FRACTIONS, batch_size=20, selections=None
) -> dict:
    """:func:`pair_curves` of each method's ``scores`` ({method: edge scores}; its
    selection rule from ``selections``, top-n by default) in one :func:`run_circuits`
    call: the corrupted run of each batch, the whole model and the empty circuit are run
    once for all the methods, and a circuit two methods share (at 100% of the edges
    always, often at the smallest fractions) once. Each circuit's logit differences are
    those of its own run, so every method's numbers are bit for bit those of
    :func:`pair_curves` alone. {method: per-pair dict}."""
    selections = selections or {}
    circuits, kept, k = [graph.valid, torch.zeros_like(graph.valid)], {}, len(fractions)
    for method, sc in scores.items():
        kept[method] = {"signed": [], "absolute": []}
        for kind, absolute in (("signed", False), ("absolute", True)):
            for frac in fractions:
                mask = select_edges(
                    graph, sc, n_edges_at(frac, graph.n_edges), absolute, selections.get(method, "topn")
                )
                circuits.append(mask)
                kept[method][kind].append(int(mask.sum()))
    m = [r.double().cpu().numpy() for r in run_circuits(bridge, graph, data, circuits, batch_size)]
    out = {}
    for i, method in enumerate(scores):
        first = 2 + 2 * k * i
        out[method] = {
            "full": m[0].copy(),
            "empty": m[1].copy(),
            "signed": np.stack(m[first : first + k]),
            "absolute": np.stack(m[first + k : first + 2 * k]),
            "n_edges": [n_edges_at(f, graph.n_edges) for f in fractions],
            "n_kept": kept[method],
        }
    return out


def faithfulness(per_pair: dict, index=None) -> tuple[np.ndarray, np.ndarray]:
    """(signed f, absolute f) at each fraction from the means over the pairs ``index``
    (all pairs when None; a bootstrap sample may repeat pairs)."""
    idx = slice(None) if index is None else index
    full, empty = per_pair["full"][idx].mean(), per_pair["empty"][idx].mean()
    signed = (per_pair["signed"][:, idx].mean(1) - empty) / (full - empty)
    absolute = (per_pair["absolute"][:, idx].mean(1) - empty) / (full - empty)
    return signed, absolute


def cpr_cmd(per_pair: dict, fractions, index=None) -> tuple[float, float]:
    """(CPR, CMD) of the pairs ``index`` (:func:`faithfulness`, :func:`evaluate.area`)."""
    signed, absolute = faithfulness(per_pair, index)
    return area(fractions, signed), area(fractions, np.abs(1 - absolute))


def pair_bootstrap(per_pair: dict, fractions, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """CPR and CMD of all pairs, and their percentile intervals over ``n_boot`` resamples
    of the pairs with replacement (numpy ``default_rng(seed)``): {"cpr", "cpr_lo",
    "cpr_hi", "cmd", "cmd_lo", "cmd_hi", "n_pairs", "n_boot"}. A resample whose m(M) =
    m(empty) gives no f and is left out (NaN dropped)."""
    n = len(per_pair["full"])
    rng = np.random.default_rng(seed)
    draws = np.array([cpr_cmd(per_pair, fractions, rng.integers(0, n, n)) for _ in range(n_boot)])
    cpr, cmd = cpr_cmd(per_pair, fractions)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    out = {"cpr": cpr, "cmd": cmd, "n_pairs": n, "n_boot": n_boot}
    for j, name in enumerate(("cpr", "cmd")):
        col = draws[:, j][np.isfinite(draws[:, j])] if n_boot else np.array([])
        lo, hi = np.percentile(col, q) if len(col) else (np.nan, np.nan)
        out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out


def curve_rows(per_pair: dict, fractions) -> list[dict]:
    """The curve's rows (as :func:`localization.localize`'s): ranking, fraction, n_edges,
    n_kept, metric (mean over the pairs), faithfulness, m_full, m_empty."""
    signed, absolute = faithfulness(per_pair)
    m_full, m_empty = float(per_pair["full"].mean()), float(per_pair["empty"].mean())
    rows = []
    for kind, f in (("signed", signed), ("absolute", absolute)):
        for i, frac in enumerate(fractions):
            rows.append({"ranking": kind, "fraction": frac, "n_edges": per_pair["n_edges"][i],
                         "n_kept": per_pair["n_kept"][kind][i], "metric": float(per_pair[kind][i].mean()),
                         "faithfulness": float(f[i]), "m_full": m_full, "m_empty": m_empty})  # fmt: skip
    return rows


def paired_contrast(a: dict, b: dict, fractions, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """CPR(a) - CPR(b) and CMD(a) - CMD(b) of two methods' per-pair curves on the same
    pairs, with percentile intervals over ``n_boot`` resamples of the pairs, the same
    resample for both methods (a paired bootstrap: the pairs' shared difficulty cancels):
    {"d_cpr", "d_cpr_lo", "d_cpr_hi", "d_cmd", "d_cmd_lo", "d_cmd_hi", "n_pairs", "n_boot"}."""
    n = len(a["full"])
    if len(b["full"]) != n:
        raise ValueError(f"paired contrast of {n} and {len(b['full'])} pairs: the methods must score the same pairs")
    rng = np.random.default_rng(seed)

    def diff(index):
        (ca, ma), (cb, mb) = cpr_cmd(a, fractions, index), cpr_cmd(b, fractions, index)
        return ca - cb, ma - mb

    draws = np.array([diff(rng.integers(0, n, n)) for _ in range(n_boot)]).reshape(-1, 2)
    d_cpr, d_cmd = diff(None)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    out = {"d_cpr": d_cpr, "d_cmd": d_cmd, "n_pairs": n, "n_boot": n_boot}
    for j, name in enumerate(("d_cpr", "d_cmd")):
        col = draws[:, j][np.isfinite(draws[:, j])]
        lo, hi = np.percentile(col, q) if len(col) else (np.nan, np.nan)
        out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out


def contrast_rows(per_method: dict, reference: str, fractions, n_boot: int, seed: int) -> list[dict]:
    """``reference`` (GIM) against each other method of ``per_method`` ({method: per-pair
    curves}): one row each (:func:`paired_contrast`), none when the reference did not run."""
    if reference not in per_method:
        return []
    return [
        {"method": reference, "versus": m, **paired_contrast(per_method[reference], pp, fractions, n_boot, seed)}
        for m, pp in per_method.items()
        if m != reference
    ]
