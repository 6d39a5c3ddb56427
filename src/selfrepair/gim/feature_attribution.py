"""Token (feature) attribution: GIM against Gradient x Input, Integrated Gradients,
DeepLIFT (all three from ``captum``) and an LRP variant, with comprehensiveness,
sufficiency and agreement with the known relevant tokens.

Token attribution of GIM (and of the plain gradient): (embedding - baseline embedding)
. gradient of the target logit, summed over the hidden dimension; the embedding is the
input to block 0 (token + position embedding), the baseline replaces every token by
the baseline token. LRP variant: the conservative propagation of Ali et al. (2022,
"XAI for Transformers: better explanations through conservative propagation"), which is
Gradient x Input with the attention pattern and the LayerNorm scale held constant in
backward (the AH and LN rules); hand-written through the same hooks as GIM.

Comprehensiveness: mean over k = 1..min(50, n) of (full target logit - logit with the
top-k tokens replaced by the baseline token); sufficiency: mean over ratios 0.5, 0.8,
0.9, 0.95, 0.99 of (full - logit with the least important round(ratio * n) tokens
replaced); both divided by the full logit. The first and last tokens are not ranked.
Higher comprehensiveness is better; a lower sufficiency drop is better. This is paper
C's definition as its authors' evaluation computes it (the target's logit, not its
probability, divided per example by the unmasked logit, and averaged over the examples
the model answers correctly). The logit moves with a shift of all logits, which the
softmax ignores, and a ratio to it is unstable where the full logit is near 0 or
negative, so :func:`faithfulness_detail` also gives the target's softmax probability
and comprehensiveness and sufficiency on it (the same means of drops, divided by the
full probability: a share of the probability removed, at most 1, unmoved by a shift
of the logits).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import pandas as pd
import torch

from selfrepair.gim.backward import GIMConfig, freeze_norm, frozen, gim, with_hooks

METHODS = ("gim", "grad_x_input", "integrated_gradients", "deeplift", "lrp_cp")
RATIOS = (0.5, 0.8, 0.9, 0.95, 0.99)
# the per-example columns of :func:`evaluate` from :func:`faithfulness_detail`
DETAIL = (
    "comprehensiveness",
    "sufficiency",
    "comprehensiveness_prob",
    "sufficiency_prob",
    "comprehensiveness_logit",
    "sufficiency_logit",
    "target_logit",
    "target_prob",
    "foil_logit",
    "correct",
)


def _embed(bridge, tokens):
    """Input of block 0 (token + position embedding) for ``tokens``."""
    store = {}
    with torch.no_grad():
        bridge.run_with_hooks(
            tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: store.__setitem__("x", x.clone()))]
        )
    return store["x"]


def _logit(bridge, tokens, emb, pos, target):
    """Target logit with the block-0 input replaced by ``emb`` (batch may be larger)."""
    toks = tokens.expand(emb.shape[0], -1)
    logits = bridge.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: emb)])
    return logits[:, pos, target]


class _Wrapped(torch.nn.Module):
    def __init__(self, bridge, tokens, pos, target):
        super().__init__()
        self.bridge, self.tokens, self.pos, self.target = bridge, tokens, pos, target

    def forward(self, emb):
        return _logit(self.bridge, self.tokens, emb, self.pos, self.target)


def attribute(
    bridge,
    tokens: torch.Tensor,
    pos: int,
    target: int,
    baseline_id: int,
    method: str,
    ig_steps: int = 20,
    config: GIMConfig | None = None,
) -> torch.Tensor:
    """Attribution [T] of one sequence ``tokens`` [1, T] to the logit of ``target`` at ``pos``
    (``config``: which GIM modifications, for ``gim``; all three by default). The
    parameters are frozen for the call only (no ``.grad`` is left on the model)."""
    with frozen(bridge):
        return _attribute(bridge, tokens, pos, target, baseline_id, method, ig_steps, config)


def _attribute(bridge, tokens, pos, target, baseline_id, method, ig_steps, config):
    tokens = tokens.to(next(bridge.parameters()).device)  # host tokens follow the model (a no-op on the CPU)
    emb = _embed(bridge, tokens)
    base = _embed(bridge, torch.full_like(tokens, baseline_id))
    if method in ("gim", "lrp_cp"):
        x = emb.clone().requires_grad_(True)
        if method == "gim":
            ctx = gim(bridge, config or GIMConfig())
        else:
            ctx = _lrp_cp(bridge)
        with ctx:
            _logit(bridge, tokens, x, pos, target).sum().backward()
        return ((emb - base) * x.grad).sum(-1)[0]
    from captum.attr import DeepLift, InputXGradient, IntegratedGradients

    model = _Wrapped(bridge, tokens, pos, target)
    if method == "grad_x_input":
        a = InputXGradient(model).attribute(emb.clone().requires_grad_(True))
    elif method == "integrated_gradients":
        a = IntegratedGradients(model).attribute(
            emb.clone(), baselines=base, n_steps=ig_steps, internal_batch_size=ig_steps
        )
    elif method == "deeplift":
        a = DeepLift(model).attribute(emb.clone().requires_grad_(True), baselines=base)
    else:
        raise ValueError(f"unknown attribution method {method!r}; one of {METHODS}")
    return a.sum(-1)[0].detach()


@contextmanager
def _lrp_cp(bridge):
    with ExitStack() as stack:
        stack.enter_context(freeze_norm(bridge))
        names = [f"blocks.{i}.attn.hook_pattern" for i in range(bridge.cfg.n_layers)]
        stack.enter_context(with_hooks(bridge, [(n, lambda x, hook: x.detach()) for n in names]))
        yield


def _replaced_logits(bridge, tokens, pos, baseline_id, masks: torch.Tensor) -> torch.Tensor:
    """Logits [R, vocab] at ``pos`` for each row of ``masks`` [R, T] (True: token replaced
    by the baseline)."""
    toks = torch.where(
        masks, torch.full_like(masks, baseline_id, dtype=tokens.dtype), tokens.expand(masks.shape[0], -1)
    )
    with torch.no_grad():
        return bridge(toks)[:, pos]


def faithfulness_detail(
    bridge, tokens, pos, target, baseline_id, attribution: torch.Tensor, max_k: int = 50, foil: int | None = None
) -> dict:
    """Comprehensiveness and sufficiency of one attribution [T] (first and last token
    unranked), on the target's logit (paper C's, :func:`faithfulness_scores`) and on its
    softmax probability at ``pos``: {"comprehensiveness", "sufficiency" (logit drops over
    the full logit), "comprehensiveness_logit", "sufficiency_logit" (the mean logit drops
    themselves), "comprehensiveness_prob", "sufficiency_prob" (mean probability drops
    over the full probability), "target_logit", "target_prob"}; with ``foil`` also
    "foil_logit" and "correct" (the target's logit above the foil's: the prompt is
    answered)."""
    T = tokens.shape[1]
    if attribution.shape[-1] != T:
        raise ValueError(f"attribution has {attribution.shape[-1]} positions, the sequence {T}")
    rankable = torch.arange(1, T - 1, device=attribution.device)
    order = rankable[torch.argsort(attribution[1 : T - 1], descending=True)]
    n = len(order)
    if n == 0:
        raise ValueError(f"a sequence of {T} tokens has no rankable token (the first and last are not ranked)")
    ks = list(range(1, min(max_k, n) + 1))
    masks = torch.zeros(1 + len(ks) + len(RATIOS), T, dtype=torch.bool, device=tokens.device)  # row 0: unmasked
    for r, k in enumerate(ks):
        masks[1 + r, order[:k]] = True
    for r, ratio in enumerate(RATIOS):
        m = int(round(ratio * n))
        if m:
            masks[1 + len(ks) + r, order[n - m :]] = True
    # on the host, in float64: the same softmax and means whatever device ran the model
    logits = _replaced_logits(bridge, tokens, pos, baseline_id, masks).cpu().double()
    lg, pr = logits[:, target], torch.softmax(logits, -1)[:, target]
    comp, suff = slice(1, 1 + len(ks)), slice(1 + len(ks), None)
    out = {
        "target_logit": float(lg[0]),
        "target_prob": float(pr[0]),
        "comprehensiveness_logit": float((lg[0] - lg[comp]).mean()),
        "sufficiency_logit": float((lg[0] - lg[suff]).mean()),
        "comprehensiveness_prob": float((pr[0] - pr[comp]).mean() / pr[0]),
        "sufficiency_prob": float((pr[0] - pr[suff]).mean() / pr[0]),
    }
    full = out["target_logit"]  # a full logit of exactly 0 leaves the ratio undefined: NaN
    out["comprehensiveness"] = out["comprehensiveness_logit"] / full if full else float("nan")
    out["sufficiency"] = out["sufficiency_logit"] / full if full else float("nan")
    if foil is not None:
        out["foil_logit"] = float(logits[0, foil])
        out["correct"] = bool(lg[0] > logits[0, foil])
    return out


def faithfulness_scores(bridge, tokens, pos, target, baseline_id, attribution: torch.Tensor, max_k: int = 50):
    """(comprehensiveness, sufficiency) of one attribution [T] (first and last token
    unranked), on the target's logit as paper C defines them (:func:`faithfulness_detail`)."""
    d = faithfulness_detail(bridge, tokens, pos, target, baseline_id, attribution, max_k)
    return d["comprehensiveness"], d["sufficiency"]


def evaluate(bridge, data, truth: torch.Tensor, baseline_id: int, methods=METHODS, ig_steps: int = 20) -> pd.DataFrame:
    """One row per (example, method): comprehensiveness and sufficiency on the logit (paper
    C's) and on the probability, the target's full logit and probability, the foil's
    logit and whether the target's is above it (:data:`DETAIL`), and top-|S| agreement
    with the truly relevant positions ``truth`` [N, T]."""
    with frozen(bridge):
        return _evaluate(bridge, data, truth, baseline_id, methods, ig_steps)


def _evaluate(bridge, data, truth, baseline_id, methods, ig_steps) -> pd.DataFrame:
    rows = []
    device = next(bridge.parameters()).device  # each example follows the model (a no-op on the CPU)
    for i in range(len(data)):
        tokens = data.clean[i : i + 1].to(device)
        pos, target = int(data.pos[i]), int(data.answer[i])
        rel = truth[i].nonzero().flatten()
        for method in methods:
            a = attribute(bridge, tokens, pos, target, baseline_id, method, ig_steps)
            d = faithfulness_detail(bridge, tokens, pos, target, baseline_id, a, foil=int(data.foil[i]))
            inner = a.clone()
            inner[0] = inner[-1] = float("-inf")
            top = torch.topk(inner, len(rel)).indices
            hit = len(set(top.tolist()) & set(rel.tolist())) / max(1, len(rel))
            rows.append({"example": i, "method": method, **{k: d[k] for k in DETAIL}, "ground_truth_hit": hit})
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean (and standard error) per task, model and method."""
    g = df.groupby(["task", "model", "method"])
    out = g[["comprehensiveness", "sufficiency", "ground_truth_hit"]].mean()
    se = g[["comprehensiveness", "sufficiency", "ground_truth_hit"]].sem().add_suffix("_se")
    return out.join(se).reset_index().assign(n=g.size().values)
