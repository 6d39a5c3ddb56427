"""Information flow routes (IFR, Ferrando & Voita 2024) on the edge graph: each parent's
proximity share within a node's input on the clean run, averaged per example over its
positions (MIB's order), and the L1 distances and position weights they are made of.
"""

from __future__ import annotations

import numpy as np
import torch

from selfrepair.gim.graph import LOGITS_INPUT, Graph
from selfrepair.gim.hooks import forward_activations, on_prepared
from selfrepair.gim.mib_weights import input_node_hook, mib_processing
from selfrepair.gim.patching import _column_groups, _device
from selfrepair.tasks.counterfactual import CounterfactualBatch


def proximity_shares(parts: torch.Tensor, total: torch.Tensor, first: int | None = None) -> torch.Tensor:
    """Information-flow-routes importance (Ferrando & Voita 2024) of each part of a sum.

    ``parts`` [..., K, d], ``total`` [..., d]: proximity_k = max(|total|_1 -
    |total - part_k|_1, 0), normalised to sum 1 over k (all zero where every proximity
    is zero). Returns [..., K]. ``first``: the shares among ``parts[..., :first, :]``
    only, [..., first] (read as a view, not copied). The L1 distances are
    :func:`l1_distances`."""
    if first is not None:
        parts = parts[..., :first, :]
    dist = l1_distances(parts, total)
    prox = (total.abs().sum(-1, keepdim=True) - dist).clamp(min=0)
    return prox / prox.sum(-1, keepdim=True).clamp(min=torch.finfo(prox.dtype).tiny)


L1_CHUNK = 2**18  # elements of l1_distances' work buffer (1 MiB in fp32: it stays in cache)


def l1_distances(parts: torch.Tensor, total: torch.Tensor, chunk: int = L1_CHUNK) -> torch.Tensor:
    """|total - part_k|_1 for ``parts`` [..., K, d] (any strides: a prefix view of a
    larger buffer is read in place) and ``total`` [..., d]: [..., K]. Computed a few rows
    at a time in one reused buffer (subtract, abs, sum over d), so neither a [..., K, d]
    temporary nor a contiguous copy of ``parts`` is made; on a 2-core Xeon at GPT-2
    small's width this is 3x faster than ``torch.cdist(p=1)`` on the whole buffer and
    far faster on a prefix. Each sum runs over d in ATen's order for ``sum(-1)``."""
    lead, (k, d) = parts.shape[:-2], parts.shape[-2:]
    p = parts.reshape(-1, k, d)
    t = total.reshape(-1, 1, d)
    n = p.shape[0]
    out = torch.empty(n, k, dtype=torch.result_type(p, t), device=p.device)
    rows = max(1, chunk // max(1, k * d))
    buf = torch.empty(min(rows, n), k, d, dtype=out.dtype, device=p.device)
    for i in range(0, n, rows):
        b = buf[: min(rows, n - i)]
        torch.sub(t[i : i + rows], p[i : i + rows], out=b)
        b.abs_()
        torch.sum(b, -1, out=out[i : i + rows])
    return out.reshape(*lead, k)


def position_weights(pos: torch.Tensor, n_pos: int) -> torch.Tensor:
    """[B, n_pos] weights of a per-example mean over positions: 1 / (pos_b + 1) at the
    positions 0 .. pos_b of example b (up to the one whose logits are read), 0 after.
    Summed against per-position values they give each example's mean over its own
    positions, whatever its length; dividing the sum over examples by their number then
    averages the examples (not the pooled (example, position) pairs)."""
    live = (torch.arange(n_pos)[None, :] <= pos[:, None]).float()
    return live / live.sum(1, keepdim=True).clamp(min=1)


IFR_PROCESSING = ("mib", "none")  # information_flow_routes(processing=...)


@on_prepared
def information_flow_routes(
    bridge, graph: Graph, data: CounterfactualBatch, batch_size: int = 64, processing: str = "mib"
) -> torch.Tensor:
    """Information flow routes on the clean run only (no corrupted input, no gradient).

    score(u->v) = :func:`proximity_shares` of a_u within v's actual input (the residual
    stream v reads, biases included, so the parents' shares can sum to less than 1),
    averaged per example over the positions up to the one whose logits are read (later
    positions cannot reach it; with right padding and the logits read at the last
    token, these are the example's unpadded positions), then averaged over examples:
    MIB's order (EAP-IG ``get_scores_information_flow_routes``), so an example counts
    the same whatever its length. Scores are >= 0, so the signed and the absolute
    rankings are the same.

    The input node's a_u is the token embedding (:func:`input_node_hook`, MIB's graph).
    ``processing="mib"`` reads the activations as MIB's processed HookedTransformer has
    them (:func:`mib_processing`: value biases folded out of the heads, writes centred
    under LayerNorm); ``"none"`` as the Hugging Face model has them.
    """
    if processing not in IFR_PROCESSING:
        raise ValueError(f"IFR processing {processing!r}: one of {IFR_PROCESSING}")
    total = torch.zeros(graph.valid.shape)
    groups = _column_groups(graph)
    embed_hook = input_node_hook(bridge)
    vb, centre = mib_processing(bridge, graph) if processing == "mib" else (None, False)
    for b in data.batches(batch_size, _device(bridge)):
        inputs, uniform = {}, set()

        def keep(name):  # bound to the name asked for (the bridge reports aliases)
            def fn(x, hook):
                x = x.detach()
                if x.dim() == 4 and _slots_equal(x):
                    # one slot per head, all equal (the q, k and v inputs of a layer's heads
                    # are one residual stream): one copy is kept, the bridge's buffer freed
                    x = x[:, :, 0].clone()
                    uniform.add(name)
                inputs[name] = x

            return fn

        names = dict.fromkeys(g[0] for g in groups)
        hooks = [(name, keep(name)) for name in names] + [(embed_hook, keep("input node"))]
        # the last input read is the logits node's (ln_final.hook_in): the unembedding is skipped
        _, a = forward_activations(bridge, graph, b.clean, hooks=hooks, stop_after=LOGITS_INPUT)
        a[:, :, 0] = inputs.pop("input node")
        if vb is not None:
            a -= vb.to(a.device, a.dtype)
        if centre:
            a -= a.mean(-1, keepdim=True)
        live = position_weights(b.pos.cpu(), a.shape[1]).to(a.device, a.dtype)  # [B, T]
        done = {}  # parents -> [(input, its scores)]: inputs equal bit for bit share them
        for name, slot, cols in groups:
            y = inputs[name] if slot is None or name in uniform else inputs[name][:, :, slot]
            parents = graph.valid[:, cols[0]]
            seen = done.setdefault(parents.numpy().tobytes(), [])
            s = next((s for y2, s in seen if y2 is y), None)
            if s is None:  # a tensor not seen yet: the scores of an equal one, else its own
                s = next((s for y2, s in seen if _values_equal(y2, y)), None)
                if s is None:
                    yc = y - y.mean(-1, keepdim=True) if centre else y
                    k = int(parents.sum())
                    if parents[:k].all():  # the parents are the first k rows
                        shares = proximity_shares(a, yc, first=k)  # [B, T, K]
                    else:
                        shares = proximity_shares(a[:, :, parents], yc)
                    s = torch.einsum("btk,bt->k", shares, live).to(total.device)
                seen.append((y, s))
            for j in cols:
                total[parents, j] += s
    return (total / len(data)) * graph.valid


_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)


def _values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` (same shape, equal values; NaN equals nothing), through numpy for
    CPU tensors, where it is several times faster."""
    if a.device.type == b.device.type == "cpu" and a.dtype == b.dtype and a.dtype in _NUMPY_DTYPES:
        return a.shape == b.shape and bool(np.array_equal(a.numpy(), b.numpy()))
    return torch.equal(a, b)


def _slots_equal(x: torch.Tensor) -> bool:
    """Whether every ``x[:, :, h]`` of ``x`` [B, T, n, d] equals ``x[:, :, 0]``."""
    if x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES:
        xn = x.numpy()
        return bool((xn == xn[:, :, :1]).all())
    return torch.equal(x, x[:, :, :1].expand_as(x))
