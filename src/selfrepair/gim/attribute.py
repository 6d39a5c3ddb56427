"""Edge scores of the localization methods: the gradient ones, EAP, EAP-IG, EAP-GP,
GIM-EAP and RelP (one forward and one backward per batch, :func:`edge_scores`), and
``method_scores``, which dispatches on the method's name to them, to exact per-edge
activation patching (EActP, :mod:`selfrepair.gim.patching`) or to information flow routes
(IFR, :mod:`selfrepair.gim.flow_routes`; MIB's weight processing in
:mod:`selfrepair.gim.mib_weights`). The names of those modules stay importable from here
(``attribute.exact_edge_patching``, ``attribute.information_flow_routes``, ...).

Grouped-query attention (:data:`graph.KV_INPUTS`): on a bridge booted ungrouped (MIB's
``per_query_head``, the workflow's default) every query head has its own k and v input
and the edge ``u->a{L}.h{H}<k>`` is head H's own. On a grouped bridge (``per_group``) k
and v inputs belong to key/value heads: the edge scores the shared input of H's group
divided by the group size (so the edge scores still sum to the first-order total).
"""

from __future__ import annotations

import numpy as np
import torch

from selfrepair.gim import relp as relp_rules
from selfrepair.gim.backward import GIMConfig, with_hooks
from selfrepair.gim.evaluate import read_logit_diff
from selfrepair.gim.flow_routes import (  # noqa: F401
    IFR_PROCESSING,
    L1_CHUNK,
    information_flow_routes,
    l1_distances,
    position_weights,
    proximity_shares,
)
from selfrepair.gim.graph import LOGITS_INPUT, Graph
from selfrepair.gim.hooks import activation_recorder, forward_activations, on_prepared
from selfrepair.gim.mib_weights import input_node_hook, mib_processing  # noqa: F401
from selfrepair.gim.patching import (  # noqa: F401
    WEIGHTINGS,
    _device,
    exact_edge_patching,
    exact_patching_rows,
    per_edge_patching,
)
from selfrepair.tasks.counterfactual import CounterfactualBatch

METHODS = ("eap", "eap-ig", "gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm", "relp", "relp-ah", "eap-gp")
PATH_METHODS = ("eap-ig", "eap-gp")  # integrate along a path from the corrupt to the clean input
GRADIENT_POINTS = ("clean", "corrupted")  # edge_scores(gradient_at=...): noising, denoising


# ---------------------------------------------------------------- scores ---------
def _method_config(method: str):
    if method in ("eap",) + PATH_METHODS:
        return None
    if method in relp_rules.VARIANTS:
        return relp_rules.RelPConfig.variant(method)
    return GIMConfig.variant(method)


def gradpath_inputs(
    bridge,
    b: CounterfactualBatch,
    clean: torch.Tensor,
    corrupt: torch.Tensor,
    target: torch.Tensor,
    steps: int,
    path: str,
) -> list[torch.Tensor]:
    """EAP-GP's GradPath at the input node (arXiv 2502.06852): from the clean input
    embedding, ``steps`` steps, each of length ||clean - corrupt|| / steps (per example)
    against the gradient of ||logits - target||^2 (``target`` the corrupt run's logits;
    summed over the positions up to each example's ``pos``); returns the point after each
    step. ``path="straight"``: each step along corrupt - clean instead (the points are
    then EAP-IG's, corrupt + k/steps (clean - corrupt), k = 0..steps-1). One forward and
    one backward per step for ``gradpath``, none for ``straight``."""
    distance = (clean - corrupt).flatten(1).norm(dim=1)
    live = torch.arange(target.shape[1], device=target.device)[None, :] <= b.pos.to(target.device)[:, None]
    live = live[:, :, None].to(target.dtype)
    points, point = [], clean.detach()
    for length in relp_rules.step_lengths(distance, steps):
        if path == "straight":
            grad = clean - corrupt
        else:
            leaf = point.clone().requires_grad_(True)
            with torch.enable_grad(), with_hooks(bridge, [("blocks.0.hook_resid_pre", lambda x, hook: leaf)]):
                obj = ((bridge(b.clean).float() - target).pow(2) * live).sum()
                (grad,) = torch.autograd.grad(obj, leaf)
        point = relp_rules.gradpath_step(point, grad, length).detach()
        points.append(point)
    return points


@on_prepared
def edge_scores(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    method: str = "eap",
    batch_size: int = 32,
    ig_steps: int = 5,
    gradient_at: str = "clean",
    weighting: str = "example",
    path: str = "gradpath",
) -> torch.Tensor:
    """Edge scores [n_forward, n_backward] (zero off the graph).

    score(u->v) = sum over batch, position and hidden dim of
    (a_u(corrupt) - a_u(clean)) . dL/d(input of v), L = -logit_diff, divided by the
    number of examples. ``eap-ig``: gradients averaged over the input embeddings
    interpolated from corrupt to clean at k/steps, k = 0..steps-1. ``gim*``: EAP
    under the GIM backward (all three modifications, or all but one). ``relp``: EAP
    under RelP's LRP rules (:mod:`selfrepair.gim.relp`, the authors' default rule set;
    ``relp-ah``: with the AH-rule too).
    ``eap-gp``: ``eap-ig`` with its points on the GradPath of :func:`gradpath_inputs`
    (``path="straight"``: on EAP-IG's line, the check; ``steps`` more forwards and
    backwards per batch for the path itself).
    Per batch: one forward and one backward (per IG step for ``eap-ig``) plus one forward
    of the other input (``eap-ig``: of each input); at the gradient point (``eap``,
    ``gim*``, ``relp*``) the nodes' activations are recorded in the gradient's own
    forward, which every GIM and RelP modification leaves the model's own bit for bit.
    The scores of each hook's columns are, per (example, position), the product of their
    parents' activation differences (a prefix of the rows) with the hook's gradients,
    summed.

    ``gradient_at`` (``eap`` and ``gim*``), where dL/d(input of v) is taken:
    ``"clean"`` (default; MIB's and the papers' numbers): on the clean run, the
    noising estimate of L(clean with u->v patched to corrupt) - L(clean), which is
    what the faithfulness evaluation patches. ``"corrupted"``: on the corrupted run,
    the denoising estimate of logit_diff(corrupt with u->v restored to clean) -
    logit_diff(corrupt), TransformerLens's ``attribution_patch`` (edge granularity,
    summed over positions). Both have the same sign: positive favours the answer.

    ``weighting`` (:data:`WEIGHTINGS`): ``"example"`` (default) divides the sum over
    examples by their number; ``"mib"`` first divides each batch's sum by the batch's
    size, as MIB's code does (the scores are then ``"example"``'s / B with equal batches
    of B; a smaller last batch weighs its examples more).

    Post-attention norms (Gemma-2, Gemma-3): as in MIB (EAP-IG ``get_scores_eap`` and
    ``get_scores_eap_ig`` use the same hooks on every model), a head's a_u is its
    pre-norm ``hook_result`` and dL/d(input of v) is taken at v's input, so a head edge's
    score omits the Jacobian of the post-norm in between: it is not the first-order
    estimate of the edge's patching effect there (:func:`evaluate.patched` recomputes
    the norm). MLP and input edges are unaffected (``hook_mlp_out`` is post-norm).
    """
    _check_edge_args(method, gradient_at, weighting)
    cfg = _method_config(method)
    slots = graph.backward_slots()
    plan = _contraction_plan(graph, slots)
    # the gradient forward's node activations are recorded in it: its values are the
    # model's own, bit for bit, under every GIM and RelP modification (test_gim_backward)
    record = method not in PATH_METHODS
    device = _device(bridge)  # sums on the model's device, returned on the CPU (as graph.valid)
    total = torch.zeros(len(graph.forward), len(graph.backward), device=device)
    for b in data.batches(batch_size, device):  # each batch on the model's device
        at = b.clean if gradient_at == "clean" else b.corrupt
        other = b.corrupt if gradient_at == "clean" else b.clean
        a_at = None
        a_clean, a_corr, a_other, steps = _gradient_points(bridge, graph, b, method, other, ig_steps, path)
        grads_sum = {}
        for alpha in steps:
            recorded = _add_gradients(bridge, graph, b, at, alpha, slots, cfg, record, a_clean, a_corr, grads_sum)
            if alpha is None:
                a_at = recorded
        if method not in PATH_METHODS:
            a_clean, a_corr = (a_at, a_other) if gradient_at == "clean" else (a_other, a_at)
        # [B*T, F, d]; in place: neither buffer is read again
        diff = a_corr.sub_(a_clean).flatten(0, 1)
        del a_clean, a_corr, a_at
        scale = 1.0 / len(steps) / (len(b) if weighting == "mib" else 1)
        _contract(total, plan, grads_sum, diff, scale)
    return (total.cpu() / len(data)) * graph.valid


def _check_edge_args(method: str, gradient_at: str, weighting: str) -> None:
    """ValueError naming the choices when :func:`edge_scores` is asked for an unknown
    method, gradient point or weighting, or a gradient point a path method has not."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {METHODS}")
    if gradient_at not in GRADIENT_POINTS:
        raise ValueError(f"unknown gradient_at {gradient_at!r}; one of {GRADIENT_POINTS}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; one of {WEIGHTINGS}")
    if gradient_at != "clean" and method in PATH_METHODS:
        raise ValueError(f"{method} integrates along the corrupt -> clean path; gradient_at applies to eap and gim*")


def _contraction_plan(graph: Graph, slots: dict) -> list[tuple]:
    """The contraction per hook: the parent rows (a prefix) of its columns, and per column
    its slot, as (name, n parent rows, slot order, columns, each column's slot index,
    grouped-query share)."""
    rep = graph.n_heads // graph.n_kv_heads
    plan = []
    for name, cols in slots.items():
        n = int(graph.valid[:, [j for j, _ in cols]].any(dim=1).nonzero().max()) + 1
        order = list(dict.fromkeys(s for _, s in cols))
        share = rep if (order != [None] and not name.endswith("q_input")) else 1
        plan.append((name, n, order, [j for j, _ in cols], [order.index(s) for _, s in cols], share))
    return plan


def _gradient_points(bridge, graph: Graph, b: CounterfactualBatch, method: str, other, ig_steps: int, path: str):
    """(a_clean, a_corr, a_other, steps) of one batch: the activations the path methods
    need (``eap-ig``: both inputs'; ``eap-gp``: both, and the GradPath points) or, for the
    others, those of the input the gradient is not taken at, and the points the gradient
    is taken at (interpolation weights, GradPath inputs, or [None]: the input itself)."""
    a_clean = a_corr = a_other = None
    if method == "eap-ig":
        _, a_clean = forward_activations(bridge, graph, b.clean, stop_after=LOGITS_INPUT)
        _, a_corr = forward_activations(bridge, graph, b.corrupt, stop_after=LOGITS_INPUT)
        steps = [k / ig_steps for k in range(ig_steps)]
    elif method == "eap-gp":
        corr_logits, a_corr = forward_activations(bridge, graph, b.corrupt)
        _, a_clean = forward_activations(bridge, graph, b.clean, stop_after=LOGITS_INPUT)
        steps = gradpath_inputs(bridge, b, a_clean[:, :, 0], a_corr[:, :, 0], corr_logits.float(), ig_steps, path)
    else:
        _, a_other = forward_activations(bridge, graph, other, stop_after=LOGITS_INPUT)
        steps = [None]
    return a_clean, a_corr, a_other, steps


def _add_gradients(bridge, graph: Graph, b, at, alpha, slots: dict, cfg, record: bool, a_clean, a_corr, grads_sum):
    """One backward of -logit_diff at one point ``alpha`` (see :func:`_gradient_points`),
    under the method's modified backward ``cfg``: each hook's input gradient is added to
    ``grads_sum`` (zeros where no gradient flows). Returns the nodes' activations at the
    input ``at`` when ``alpha`` is None (recorded in the same forward when ``record``),
    else None."""
    grads, like = {}, {}
    bwd_hooks = []
    for name in slots:

        def cap(x, hook, name=name):
            # a view, its own node in the graph: its gradient is the flow into
            # this input only (the hook's own input may also feed the residual
            # stream), with no copy of the activations
            y = x.view_as(x)
            y.register_hook(lambda g, name=name: grads.__setitem__(name, g.detach()))
            like[name] = (y.shape, y.dtype, y.device)  # zeros where no gradient flows (relp-ah: q, k)
            return y

        bwd_hooks.append((name, cap))
    if isinstance(alpha, torch.Tensor):  # a GradPath point
        interp = alpha.detach().requires_grad_(True)
        bwd_hooks.insert(0, ("blocks.0.hook_resid_pre", lambda x, hook: interp))
    elif alpha is not None:
        inp_clean, inp_corr = a_clean[:, :, 0], a_corr[:, :, 0]
        interp = (inp_corr + alpha * (inp_clean - inp_corr)).detach().requires_grad_(True)
        bwd_hooks.insert(0, ("blocks.0.hook_resid_pre", lambda x, hook: interp))
    else:
        leaf = {}

        def make_leaf(x, hook):
            leaf["x"] = x.detach().requires_grad_(True)
            return leaf["x"]

        bwd_hooks.insert(0, ("blocks.0.hook_resid_pre", make_leaf))
        if record:
            rec_hooks, recorded = activation_recorder(graph)
            bwd_hooks += rec_hooks
    with relp_rules.modified_backward(bridge, cfg):
        with with_hooks(bridge, bwd_hooks):
            loss = -read_logit_diff(bridge, b, at).sum()
            loss.backward()
    a_at = None
    if alpha is None:
        a_at = recorded() if record else forward_activations(bridge, graph, at, stop_after=LOGITS_INPUT)[1]
    for name in slots:
        g = grads[name] if name in grads else torch.zeros(like[name][0], dtype=like[name][1], device=like[name][2])
        grads_sum[name] = g if name not in grads_sum else grads_sum[name] + g
    return a_at


def _contract(total: torch.Tensor, plan: list[tuple], grads_sum: dict, diff: torch.Tensor, scale: float) -> None:
    """Add to ``total`` each hook's scores: per (example, position) the product of its
    parents' activation differences ``diff`` [B*T, F, d] with its summed gradients, summed
    over examples, positions and hidden dim, times ``scale`` / the grouped-query share."""
    for name, n, order, js, pos, share in plan:
        g = grads_sum[name].flatten(0, 1)  # [B*T, S, d], or [B*T, d] for a one-slot hook
        if order == [None]:
            g = g.unsqueeze(1)
        elif order != list(range(g.shape[1])):
            g = g[:, order]  # the slots of this hook's columns
        # sum over batch, position and hidden dim: per row (b, t) a [n, d] x [d, S]
        # product of views (no transposed copy of either side), then the sum over rows
        block = torch.bmm(diff[:, :n], g.transpose(1, 2)).sum(0)
        total[:n, js] += block[:, pos] * (scale / share)


# ---------------------------------------------------------------- dispatch -------
EACTP_MAX_EDGES = 5000  # config gim.eactp_max_edges


def too_large(method: str, n_edges: int, eactp_max_edges: int = EACTP_MAX_EDGES) -> str | None:
    """Why ``method`` is not run on a graph of ``n_edges`` edges (None: it is run)."""
    if method == "eactp" and n_edges > eactp_max_edges:
        return f"eactp not run: {n_edges} edges > eactp_max_edges {eactp_max_edges} (one forward per edge and example)"
    return None


SCORERS = {
    "eactp": lambda bridge, graph, data, batch_size, ig_steps, weighting: exact_edge_patching(
        bridge, graph, data, batch_size, weighting=weighting
    ),
    "ifr": lambda bridge, graph, data, batch_size, ig_steps, weighting: information_flow_routes(
        bridge, graph, data, batch_size
    ),
}
ALL_METHODS = METHODS + tuple(SCORERS)


def method_scores(
    bridge,
    graph: Graph,
    data: CounterfactualBatch,
    method: str,
    batch_size: int = 64,
    ig_steps: int = 5,
    weighting: str = "example",
):
    """Edge scores of any localization method: the gradient ones (:data:`METHODS`,
    :func:`edge_scores`, with its ``weighting``), exact per-edge patching (``eactp``) or
    information flow routes (``ifr``). EActP takes the ``weighting`` too
    (:func:`exact_edge_patching`: under ``"mib"`` the mean of per-batch means, MIB's
    ``exact`` with its batch-mean metric; the same numbers with equal batches). IFR is a
    per-example mean under either weighting, as in MIB (its IFR divides the sum over
    examples by their number)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; one of {WEIGHTINGS}")
    if method in SCORERS:
        return SCORERS[method](bridge, graph, data, batch_size, ig_steps, weighting)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {ALL_METHODS}")
    return edge_scores(bridge, graph, data, method, batch_size=batch_size, ig_steps=ig_steps, weighting=weighting)


@on_prepared
def speed(bridge, data: CounterfactualBatch, batch_size: int = 64) -> dict:
    """Seconds to score every edge by EAP, by GIM-EAP and by per-edge activation patching."""
    import time

    graph = Graph.from_bridge(bridge)
    out = {"n_edges": graph.n_edges, "n_examples": len(data)}
    for method in ("eap", "gim"):
        t = time.perf_counter()
        edge_scores(bridge, graph, data, method, batch_size)
        out[f"{method}_s"] = time.perf_counter() - t
    t = time.perf_counter()
    truth = per_edge_patching(bridge, graph, data, batch_size)
    out["patching_s"] = time.perf_counter() - t
    for method in ("eap", "gim"):
        s = edge_scores(bridge, graph, data, method, batch_size)[graph.valid]
        out[f"{method}_corr_with_patching"] = float(np.corrcoef(s.numpy(), truth[graph.valid].numpy())[0, 1])
    return out
