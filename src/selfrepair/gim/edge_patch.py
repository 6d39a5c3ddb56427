"""The hooks that patch every edge outside a circuit in one forward
(:func:`selfrepair.gim.evaluate.patched`): recording hooks write each node's difference to
its corrupted activation into one buffer, and each downstream hook subtracts its patched
parents' part with one matrix product per family of hooks that share their parents (plus
one product and one norm per parent layer behind a post-attention norm).
"""

from __future__ import annotations

import torch

from selfrepair.gim.graph import Graph
from selfrepair.gim.hooks import POST_NORM_INPUT, attn_post_norms, head_rows, node_rows, post_norm_shift


def _rows_of(mat: torch.Tensor, rows: torch.Tensor, n: int):
    """The rows of a product over ``rows`` (of a prefix of ``n``): the prefix slice
    itself when most of it is used (no copy), else the rows by index."""
    return slice(0, n) if len(rows) > 0.75 * n else rows


def _patch_hooks(bridge, graph: Graph, in_graph: torch.Tensor, corr: torch.Tensor) -> list:
    """The hooks of :func:`patched`, for corrupted activations ``corr`` [n_forward, B, T, d].

    Downstream hooks with the same parents (a layer's q, k and v inputs) form a family
    whose first hook to fire in a forward computes the corrections of all its slots in one
    product. The additive parents' part is, per family, whichever needs the smaller
    product: the patched edges' sum over their rows (``direct``), or (``complement``)
    the running sum of every additive row recorded so far (all of the family's additive
    parents, a prefix of the rows) minus the kept edges' sum, cheap for small circuits
    (the empty circuit: no product at all). Post-norm parents: one product per layer."""
    n_forward = len(graph.forward)
    out_edges = graph.valid & ~in_graph.to(graph.valid.device)  # edges that are patched
    norms = attn_post_norms(bridge)
    rows = head_rows(graph)
    behind_norm = torch.zeros(n_forward, dtype=torch.bool)  # rows that reach v through a post-norm
    if norms is not None:
        for r in rows:
            behind_norm[r] = True
    additive = ~behind_norm
    fixes, cache = _family_fixes(graph, out_edges, additive, norms, rows, corr.device, corr.dtype)
    run = _PatchRun(corr, norms, cache)
    hooks = [("blocks.0.hook_resid_pre", run.start)]
    for name, first, k in node_rows(graph):
        last = first + (1 if k is None else k)
        adds = bool(additive[first:last].all())
        assert adds or not additive[first:last].any()
        hooks.append((name, run.recorder(first, k, last, adds)))
    if norms is not None:
        for layer in sorted({nm[0] for _, _, _, plan in fixes for nm in plan["normed"]}):
            hooks.append((POST_NORM_INPUT.format(layer=layer), run.pre_recorder(layer)))
    hooks += [(name, run.fixer(name, slots, part, plan)) for name, slots, part, plan in fixes]
    return hooks if fixes else []


def _families(graph: Graph, out_edges: torch.Tensor) -> dict:
    """The downstream hooks with a patched edge, by their parents' rows: {rows' bytes:
    [(hook name, slots, [F, S] patched, [F, S] parents)]}."""
    families = {}  # parents' rows -> [(hook name, slots, [F, S] patched, [F, S] parents)]
    for name, cols in graph.backward_slots().items():
        groups = {}  # slot -> its columns (several: the heads of one kv group's k/v input)
        for j, s in cols:
            groups.setdefault(s, []).append(j)
        # a parent is patched into a slot when every column of the slot has it patched
        # (grouped-query attention: a group's k/v input keeps u if any head keeps it)
        m = torch.stack([out_edges[:, js].all(dim=1) for js in groups.values()], dim=1)  # [F, S]
        if not m.any():
            continue  # every edge into this hook is kept: x - 0 == x
        par = torch.stack([graph.valid[:, js].any(dim=1) for js in groups.values()], dim=1)
        families.setdefault(par.any(dim=1).numpy().tobytes(), []).append((name, list(groups), m, par))
    return families


def _family_fixes(graph: Graph, out_edges, additive, norms, rows, dev, dt) -> tuple[list, list]:
    """(fixes, cache): per downstream hook with a patched edge, (name, slots, its slice of
    the family's slots, the family's plan), and each family's state (what its first hook
    of a forward computed)."""
    fixes, cache = [], []
    for members in _families(graph, out_edges).values():
        plan = _family_plan(members, additive, norms, rows, dev, dt)
        plan["state"] = {"delta": None, "left": set()}
        cache.append(plan["state"])
        start = 0
        for name, slots, mm, _ in members:
            fixes.append((name, slots, slice(start, start + len(slots)), plan))
            start += len(slots)
    return fixes, cache


def _family_plan(members: list, additive, norms, rows, dev, dt) -> dict:
    """How one family's corrections are computed: ``direct`` or ``complement`` for its
    additive parents (the smaller product), and one product per layer behind a post-norm."""
    m = torch.cat([mm for _, _, mm, _ in members], dim=1)  # [F, S_all] patched edges
    par = torch.cat([pp for _, _, _, pp in members], dim=1)  # [F, S_all] parents
    width = m.shape[1]
    plan = {"width": width, "names": [name for name, _, _, _ in members], "mode": None, "normed": []}
    patched_rows = (m & additive[:, None]).any(dim=1).nonzero().flatten()
    if len(patched_rows):
        upto = int(par.any(dim=1).nonzero().max()) + 1  # rows recorded when the family fires
        prefix = additive.clone()
        prefix[upto:] = False
        kept = par & ~m & additive[:, None]
        kept_rows, kept_cols = kept.any(dim=1).nonzero().flatten(), kept.any(dim=0).nonzero().flatten()
        cost_direct = len(patched_rows) * width
        cost_complement = len(kept_rows) * len(kept_cols)
        n = int(patched_rows.max()) + 1
        plan["direct"] = (_rows_of(m, patched_rows, n), (m & additive[:, None])[:n])
        if torch.equal(par & additive[:, None], prefix[:, None].expand_as(par)) and cost_complement < cost_direct:
            plan["mode"] = "complement"
            plan["upto"] = upto
            if len(kept_rows):
                nk = int(kept_rows.max()) + 1
                sel = _rows_of(kept, kept_rows, nk)
                mat = kept[:nk][sel][:, kept_cols] if isinstance(sel, torch.Tensor) else kept[:nk][:, kept_cols]
                plan["kept"] = (sel, nk, kept_cols.to(dev), mat.to(dev, dt))
            else:
                plan["kept"] = None
        else:
            plan["mode"] = "direct"
        sel, mat = plan["direct"]
        plan["direct"] = (sel, n, (mat[sel] if isinstance(sel, torch.Tensor) else mat).to(dev, dt))
    if norms is not None:
        for layer, r in enumerate(rows):
            mr = m[r]  # [H, S_all]
            live = mr.any(dim=0).nonzero().flatten()
            if len(live):  # (layer, first row, last row + 1, slots it moves, [H, c] matrix)
                plan["normed"].append((layer, r[0], r[-1] + 1, live.to(dev), mr[:, live].to(dev, dt)))
    return plan


class _PatchRun:
    """What the hooks of :func:`_patch_hooks` share within one forward: the recorded
    differences a_u(now) - a_u(corrupt), the running sum of the additive rows, the
    post-norms' inputs, and each family's state (``cache``)."""

    def __init__(self, corr: torch.Tensor, norms, cache: list):
        self.corr, self.norms, self.cache, self.dev = corr, norms, cache, corr.device
        self.diff = torch.zeros_like(corr)  # a_u(now) - a_u(corrupt), written by the recording hooks
        self.run = {"sum": torch.zeros_like(corr[0]), "upto": 0}  # running sum of the additive rows recorded
        self.pre, self.base = {}, {}  # layer -> the post-norm's input in this run, and its norm

    def post_norm_base(self, layer):
        if layer not in self.base:
            self.base[layer] = self.norms[layer](self.pre[layer])
        return self.base[layer]

    def product(self, sel, n, mat):
        """mat.T @ the recorded rows ``sel`` (of the first ``n``): [c, B*T*d]."""
        src = self.diff[:n] if isinstance(sel, slice) else self.diff.index_select(0, sel.to(self.dev))
        return mat.T @ src.view(src.shape[0], -1)

    def corrections(self, plan):
        """[S_all, B, T, d]: what the family's slots lose, from the rows recorded so far."""
        diff, run, norms = self.diff, self.run, self.norms
        shape, width = diff.shape[1:], plan["width"]
        mode = plan["mode"]
        if mode == "complement" and run["upto"] != plan["upto"]:
            mode = "direct"  # not the rows expected at this point of the forward
        if mode == "complement":
            delta = run["sum"].view(1, -1).expand(width, -1).clone()
            if plan["kept"] is not None:
                sel, nk, cols, mat = plan["kept"]
                delta.index_add_(0, cols, self.product(sel, nk, mat), alpha=-1)
        elif mode == "direct":
            delta = self.product(*plan["direct"])
        else:
            delta = diff.new_zeros(width, shape.numel())
        for layer, r0, r1, live, mat in plan["normed"]:
            moved = (mat.T @ diff[r0:r1].view(r1 - r0, -1)).view(len(live), *shape)
            shift = post_norm_shift(norms[layer], self.pre[layer], -moved, self.post_norm_base(layer))
            delta.index_add_(0, live, shift.reshape(len(live), -1), alpha=-1)
        return delta.view(width, *shape)

    def fixer(self, name, slots, part, plan):
        """The hook that subtracts from hook ``name``'s ``slots`` their corrections."""
        state = plan["state"]

        def fix(x, hook):
            with torch.no_grad():
                if name not in state["left"]:  # the family's first hook in this forward
                    state["delta"], state["left"] = self.corrections(plan), set(plan["names"])
                state["left"].discard(name)
                delta = state["delta"][part]
                if not state["left"]:
                    state["delta"] = None
                if slots == [None]:
                    return x - delta[0]
                delta = delta.permute(1, 2, 0, 3)  # [B, T, S, d]
                if slots == list(range(x.shape[2])):
                    return x - delta
                x = x.clone()
                x[:, :, slots] = x[:, :, slots] - delta
                return x

        return fix

    def start(self, x, hook):  # a new forward: nothing computed in an earlier one is reused
        self.run["sum"].zero_()
        self.run["upto"] = 0
        for state in self.cache:
            state["delta"], state["left"] = None, set()

    def recorder(self, first, k, last, adds):
        """The hook that records a node's rows ``first`` .. ``last`` - 1 of ``diff``."""
        corr, diff, run = self.corr, self.diff, self.run

        def rec(x, hook, first=first, k=k, last=last, adds=adds):
            with torch.no_grad():
                if k is None:
                    torch.sub(x, corr[first], out=diff[first])
                else:
                    torch.sub(x.permute(2, 0, 1, 3)[:k], corr[first:last], out=diff[first:last])
                if adds:
                    run["sum"] += diff[first] if k is None else diff[first:last].sum(dim=0)
                run["upto"] = last if run["upto"] == first else -1  # -1: rows out of order

        return rec

    def pre_recorder(self, layer):
        """The hook that keeps layer ``layer``'s post-norm input of this forward."""

        def rec_pre(x, hook, layer=layer):
            self.pre[layer] = x
            self.base.pop(layer, None)

        return rec_pre
