"""Exact edge patching: EActP (:func:`exact_edge_patching`, every edge's exact effect
with the runs of one input's parents batched together) and its brute-force check
(:func:`per_edge_patching`, one masked run per edge), with the batch weightings that
:func:`selfrepair.gim.attribute.edge_scores` shares.
"""

from __future__ import annotations

import torch

from selfrepair.gim.evaluate import logit_diff, run_circuit
from selfrepair.gim.graph import Graph
from selfrepair.gim.hooks import (
    POST_NORM_INPUT,
    attn_post_norms,
    forward_activations,
    head_rows,
    on_prepared,
    post_norm_shift,
)
from selfrepair.tasks.counterfactual import CounterfactualBatch

# edge_scores(weighting=...): "example": the sum over examples / N (a per-example mean,
# whatever the batches); "mib": each batch's sum / its size, summed over batches, / N
# (MIB's run_attribution: the metric's mean within a batch, EAP-IG attribute()'s / N).
# With equal batches of B, "mib" = "example" / B.
WEIGHTINGS = ("example", "mib")


def _device(bridge) -> torch.device:
    """The device of the model's weights (where its activations and gradients live)."""
    return next(bridge.parameters()).device


def _repeat(b: CounterfactualBatch, k: int) -> CounterfactualBatch:
    """``b`` stacked ``k`` times (copy c holds rows c*len(b) .. (c+1)*len(b)-1)."""
    return CounterfactualBatch(
        b.clean.repeat(k, 1), b.corrupt.repeat(k, 1), b.answer.repeat(k), b.foil.repeat(k), b.pos.repeat(k)
    )


def _column_groups(graph: Graph):
    """(hook name, slot, [columns]) per physical downstream input: a column per edge
    target, except that under grouped-query attention the k (v) inputs of the heads of
    one key/value group are one input."""
    out = {}
    for name, cols in graph.backward_slots().items():
        for j, s in cols:
            out.setdefault((name, s), []).append(j)
    return [(name, s, js) for (name, s), js in out.items()]


def exact_patching_rows(graph: Graph, n_examples: int) -> int:
    """The rows :func:`exact_edge_patching` runs through the model: per example its clean
    and corrupted runs, and one patched run per (parent, downstream input)."""
    runs = sum(int(graph.valid[:, cols[0]].sum()) for _, _, cols in _column_groups(graph))
    return n_examples * (2 + runs)


@on_prepared
def exact_edge_patching(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    batch_size: int = 64,
    max_rows: int = 4096,
    weighting: str = "example",
) -> torch.Tensor:
    """EActP: every edge's exact effect, [n_forward, n_backward] (zero off the graph).

    score(u->v) = mean over examples of logit_diff(clean) - logit_diff(clean with only
    u->v patched to corrupt), the quantity EAP estimates (same sign: positive favours
    the answer), what :func:`per_edge_patching` computes one masked run at a time.
    ``weighting`` (:data:`WEIGHTINGS`): ``"example"`` (default) is that per-example
    mean whatever the batches; ``"mib"`` is the mean over batches of each batch's mean
    (MIB's ``exact``: EAP-IG's ``get_scores_exact`` takes ``.mean()`` of the batch-mean
    metric's per-batch values), so an unequal last batch weighs its examples more. With
    equal batches the two are the same numbers, bit for bit (each batch's sum is
    weighted by N / (n_batches * B) = 1.0 exactly).
    With one edge patched nothing upstream of v changes, so v's input just shifts by
    a_u(corrupt) - a_u(clean); the runs of all parents of one input are batched
    together (at most ``max_rows`` rows and about 2^27 logits per forward) and the
    activations are computed once per batch. On a grouped bridge (``gim.kv_inputs:
    per_group``) an edge into a head's k (v) input patches its group's shared input and
    scores that effect divided by the group size (the convention of :func:`edge_scores`). With
    post-attention norms (Gemma-2, Gemma-3) a head parent h of layer L shifts v's input by
    N_L(pre_L + r_h(corrupt) - r_h(clean)) - N_L(pre_L), pre_L the norm's clean input:
    the patching convention of :func:`evaluate.patched` (MIB's).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; one of {WEIGHTINGS}")
    rep = graph.n_heads // graph.n_kv_heads
    total = torch.zeros(graph.valid.shape, device=_device(bridge))  # returned on the CPU
    norms = attn_post_norms(bridge)
    n_batches = -(-len(data) // batch_size)
    for b in data.batches(batch_size, _device(bridge)):
        # "mib": sum_b S_b / (n_batches |b|) = (sum_b w_b S_b) / N with w_b below
        weight = len(data) / (n_batches * len(b)) if weighting == "mib" else 1.0
        pre = {}  # layer -> the post-norm's clean input

        def keep_pre(layer):
            return POST_NORM_INPUT.format(layer=layer), lambda x, hook: pre.__setitem__(layer, x.detach())

        keep = [] if norms is None else [keep_pre(layer) for layer in range(graph.n_layers)]
        logits, a_clean = forward_activations(bridge, graph, b.clean, hooks=keep)
        _, a_corr = forward_activations(bridge, graph, b.corrupt)
        base = logit_diff(logits, b)  # [B]
        n, t, vocab = logits.shape
        per_run = max(1, min(max_rows, 2**27 // (t * vocab)) // n)  # parents per forward
        shift = (a_corr - a_clean).permute(2, 0, 1, 3)  # [F, B, T, d]
        if norms is not None:
            with torch.no_grad():
                for layer, rows in enumerate(head_rows(graph)):
                    for i in rows:
                        shift[i] = post_norm_shift(norms[layer], pre[layer], shift[i])
        for name, slot, cols in _column_groups(graph):
            parents = graph.valid[:, cols[0]].nonzero().flatten().tolist()
            for c in range(0, len(parents), per_run):
                chunk = parents[c : c + per_run]
                d = shift[chunk].reshape(len(chunk) * n, t, -1)

                def move(x, hook, d=d, slot=slot):
                    x = x.clone()
                    if slot is None:
                        return x + d
                    x[:, :, slot] = x[:, :, slot] + d
                    return x

                with torch.no_grad():
                    out = bridge.run_with_hooks(b.clean.repeat(len(chunk), 1), fwd_hooks=[(name, move)])
                effect = (base.repeat(len(chunk)) - logit_diff(out, _repeat(b, len(chunk)))).view(len(chunk), n)
                share = 1.0 / rep if (slot is not None and not name.endswith("q_input")) else 1.0
                for j in cols:
                    total[chunk, j] += effect.sum(1) * (share * weight)
    return (total.cpu() / len(data)) * graph.valid


@on_prepared
def per_edge_patching(bridge, graph: Graph, data: CounterfactualBatch, batch_size: int = 64) -> torch.Tensor:
    """Ground-truth edge effects by brute force: for every edge, the change of the mean
    -logit difference when only that edge is patched (one patched run per edge)."""
    base = run_circuit(bridge, graph, data, graph.valid, batch_size).mean()
    out = torch.zeros(graph.valid.shape)
    for i, j in graph.valid.nonzero().tolist():
        mask = graph.valid.clone()
        mask[i, j] = False
        out[i, j] = -(run_circuit(bridge, graph, data, mask, batch_size).mean() - base)
    return out
