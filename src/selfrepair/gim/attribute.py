"""Edge scores of the localization methods: EAP, EAP-IG and GIM-EAP (one forward and one
backward per batch), exact per-edge activation patching (EActP), information flow routes
(IFR), and brute-force per-edge patching; ``method_scores`` dispatches on the method's name.

Grouped-query attention: k and v inputs belong to key/value heads. The edge
``u->a{L}.h{H}<k>`` scores the shared input of H's group divided by the group size (so
the edge scores still sum to the first-order total).
"""

from __future__ import annotations

import numpy as np
import torch

from selfrepair.gim import relp as relp_rules
from selfrepair.gim.backward import GIMConfig, with_hooks
from selfrepair.gim.evaluate import logit_diff, run_circuit
from selfrepair.gim.graph import Graph
from selfrepair.gim.hooks import (
    POST_NORM_INPUT,
    activation_recorder,
    attn_post_norms,
    forward_activations,
    head_rows,
    on_prepared,
    post_norm_shift,
)
from selfrepair.tasks.counterfactual import CounterfactualBatch

METHODS = ("eap", "eap-ig", "gim", "gim-no-tsg", "gim-no-ln", "gim-no-norm", "relp", "relp-ah", "eap-gp")
PATH_METHODS = ("eap-ig", "eap-gp")  # integrate along a path from the corrupt to the clean input
GRADIENT_POINTS = ("clean", "corrupted")  # edge_scores(gradient_at=...): noising, denoising
# edge_scores(weighting=...): "example": the sum over examples / N (a per-example mean,
# whatever the batches); "mib": each batch's sum / its size, summed over batches, / N
# (MIB's run_attribution: the metric's mean within a batch, EAP-IG attribute()'s / N).
# With equal batches of B, "mib" = "example" / B.
WEIGHTINGS = ("example", "mib")


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

    Post-attention norms (Gemma-2): as in MIB (EAP-IG ``get_scores_eap`` and
    ``get_scores_eap_ig`` use the same hooks on every model), a head's a_u is its
    pre-norm ``hook_result`` and dL/d(input of v) is taken at v's input, so a head edge's
    score omits the Jacobian of the post-norm in between: it is not the first-order
    estimate of the edge's patching effect there (:func:`evaluate.patched` recomputes
    the norm). MLP and input edges are unaffected (``hook_mlp_out`` is post-norm).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {METHODS}")
    if gradient_at not in GRADIENT_POINTS:
        raise ValueError(f"unknown gradient_at {gradient_at!r}; one of {GRADIENT_POINTS}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; one of {WEIGHTINGS}")
    if gradient_at != "clean" and method in PATH_METHODS:
        raise ValueError(f"{method} integrates along the corrupt -> clean path; gradient_at applies to eap and gim*")
    cfg = _method_config(method)
    slots = graph.backward_slots()
    rep = graph.n_heads // graph.n_kv_heads
    # the contraction per hook: the parent rows (a prefix) of its columns, and per column its slot
    plan = []
    for name, cols in slots.items():
        n = int(graph.valid[:, [j for j, _ in cols]].any(dim=1).nonzero().max()) + 1
        order = list(dict.fromkeys(s for _, s in cols))
        share = rep if (order != [None] and not name.endswith("q_input")) else 1
        plan.append((name, n, order, [j for j, _ in cols], [order.index(s) for _, s in cols], share))
    # the gradient forward's node activations are recorded in it: its values are the
    # model's own, bit for bit, under every GIM and RelP modification (test_gim_backward)
    record = method not in PATH_METHODS
    device = _device(bridge)  # sums on the model's device, returned on the CPU (as graph.valid)
    total = torch.zeros(len(graph.forward), len(graph.backward), device=device)
    for b in data.batches(batch_size, device):  # each batch on the model's device
        at = b.clean if gradient_at == "clean" else b.corrupt
        other = b.corrupt if gradient_at == "clean" else b.clean
        a_at = None
        if method == "eap-ig":
            _, a_clean = forward_activations(bridge, graph, b.clean)
            _, a_corr = forward_activations(bridge, graph, b.corrupt)
            steps = [k / ig_steps for k in range(ig_steps)]
        elif method == "eap-gp":
            corr_logits, a_corr = forward_activations(bridge, graph, b.corrupt)
            _, a_clean = forward_activations(bridge, graph, b.clean)
            steps = gradpath_inputs(bridge, b, a_clean[:, :, 0], a_corr[:, :, 0], corr_logits.float(), ig_steps, path)
        else:
            _, a_other = forward_activations(bridge, graph, other)
            steps = [None]
        grads_sum = {}
        for alpha in steps:
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
                    logits = bridge(at)
                    loss = -logit_diff(logits, b).sum()
                    loss.backward()
            if alpha is None:
                a_at = recorded() if record else forward_activations(bridge, graph, at)[1]
            for name in slots:
                g = (
                    grads[name]
                    if name in grads
                    else torch.zeros(like[name][0], dtype=like[name][1], device=like[name][2])
                )
                grads_sum[name] = g if name not in grads_sum else grads_sum[name] + g
        if method not in PATH_METHODS:
            a_clean, a_corr = (a_at, a_other) if gradient_at == "clean" else (a_other, a_at)
        # [B*T, F, d]; in place: neither buffer is read again
        diff = a_corr.sub_(a_clean).flatten(0, 1)
        del a_clean, a_corr, a_at
        scale = 1.0 / len(steps) / (len(b) if weighting == "mib" else 1)
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
    return (total.cpu() / len(data)) * graph.valid


def _device(bridge) -> torch.device:
    """The device of the model's weights (where its activations and gradients live)."""
    return next(bridge.parameters()).device


# ---------------------------------------------------------------- EActP, IFR -----
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
    activations are computed once per batch. Under grouped-query attention an edge
    into a head's k (v) input patches its group's shared input and scores that effect
    divided by the group size (the convention of :func:`edge_scores`). With
    post-attention norms (Gemma-2) a head parent h of layer L shifts v's input by
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


def input_node_hook(bridge) -> str:
    """The hook whose output is MIB's input node: the token embedding (EAP-IG's graph reads
    ``hook_embed``), which is ``blocks.0.hook_resid_pre`` less the position embedding in a
    model with absolute positions (GPT-2) and all of ``hook_resid_pre`` in a rotary one.
    Patching and gradients cannot tell the two apart (clean and corrupt prompts share
    positions; d/d embed = d/d resid_pre); IFR's proximities can."""
    standard = getattr(bridge.cfg, "positional_embedding_type", "standard") == "standard"
    return "hook_embed" if standard and "hook_embed" in bridge.hook_dict else "blocks.0.hook_resid_pre"


def mib_processing(bridge, graph: Graph) -> tuple[torch.Tensor, bool]:
    """What MIB's HookedTransformer (``from_pretrained``'s default weight processing) does
    to the activations IFR reads, as (value-bias terms [n_forward, d_model], centre):

    * fold_value_biases (after fold_ln has put the attention norm's bias b_ln into b_V):
      a head's values carry the constant b_V + b_ln @ W_V, which reaches its output as
      (b_V + b_ln @ W_V) @ W_O (attention weights sum to 1); folded into the layer's
      output bias, it leaves the head's output and stays in the residual stream. Under
      grouped-query attention head h reads key/value group h // (n_heads / n_kv_heads).
    * center_writing_weights, for LayerNorm models only (TransformerLens skips it under
      RMSNorm): every write to the residual stream, so every part and every input,
      loses its mean over d_model.
    * fold_ln and center_unembed move nothing IFR reads."""
    cfg = bridge.cfg
    centre = getattr(cfg, "normalization_type", None) in ("LN", "LNPre")
    vb = torch.zeros(len(graph.forward), cfg.d_model)
    with torch.no_grad():
        w_o = bridge.W_O.detach().float().cpu()  # [n_layers, n_heads, d_head, d_model]
        w_v = bridge.W_V.detach().float().cpu()  # [n_layers, n_heads or n_kv_heads, d_model, d_head]
        rep = w_o.shape[1] // w_v.shape[1]
        for layer, rows in enumerate(head_rows(graph)):
            b_v = _value_bias(bridge, layer, w_v[layer])  # [n_heads or n_kv_heads, d_head] or None
            if b_v is None:
                continue
            for h, i in enumerate(rows):
                vb[i] = b_v[h // rep] @ w_o[layer, h]
    return vb, centre


def _value_bias(bridge, layer: int, w_v: torch.Tensor) -> torch.Tensor | None:
    """The constant part of layer ``layer``'s values, [n_kv_heads, d_head]: b_V plus the
    attention norm's bias through W_V (fold_ln puts that bias into b_V before
    fold_value_biases moves b_V out); None when there is neither (Llama, Gemma-2)."""
    try:
        b_v = bridge.blocks[layer].attn.b_V.detach().float().cpu()
    except AttributeError:  # bias-free value projections
        b_v = None
    ln = getattr(bridge.blocks[layer], "ln1", None)
    ln_b = getattr(getattr(ln, "original_component", None), "bias", None)
    if ln_b is not None:
        from_ln = torch.einsum("d,hde->he", ln_b.detach().float().cpu(), w_v)
        b_v = from_ln if b_v is None else b_v.reshape(from_ln.shape) + from_ln
    return None if b_v is None else b_v.reshape(w_v.shape[0], w_v.shape[2])


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
        _, a = forward_activations(bridge, graph, b.clean, hooks=hooks, stop_after="ln_final.hook_in")
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
