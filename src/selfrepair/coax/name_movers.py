"""IOI name movers found as Wang et al. (2022) define them, and the backups by
conditional ablation: paper B's primaries and ground truth on a model without a
documented circuit (SmolLM2, Gemma-3 ...).

Name mover (Wang et al. 2022, sec. 3.1, the definition the COAX paper seeds with): a
head at the END position (the last token) that attends to the IO name and whose output
writes the IO name's unembedding direction. Here, from one intact forward with every
head's ``hook_z`` and ``hook_pattern`` cached:

- attention: the mean over prompts of END's attention to the IO token's position
  (``att_io``) and to the S token's positions (``att_s``, summed over both occurrences);
- direct logit attribution (``dla``): the head's output at END, ``z_h W_O[h]``, carried
  to the logits with every normalization's scale frozen at its clean value (Gemma's
  post-attention norm of the head's layer, then the final norm), dotted with
  ``W_U[:, IO] - W_U[:, S]``, mean over prompts;
- name movers: the heads with ``att_io > att_s`` ranked by ``dla``; the primaries are
  the top ``n_primary`` with ``dla > 0`` (fewer when fewer qualify, then topped up by
  ``dla`` alone, each row saying how it was chosen).

Backups (no documented circuit): each candidate's ablation effect on the logit
difference with the primaries ablated minus without, beta_u = [m(P) - m(P + u)] -
[m() - m(u)] (2 + 2|U| passes, resumed from one intact run); the top ``backup_share``
of the candidates by beta, those with beta > 0.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from selfrepair.core.interventions import Prefix, run_resumed
from selfrepair.tasks.ioi import IOIPrompts, logit_diff


def _positions_of(tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, T] mask of the positions holding each row's token ``ids[b]``."""
    return tokens == ids.to(tokens.device)[:, None]


def _frozen_norm(module: nn.Module, x: torch.Tensor):
    """The linear map a normalization is with its scale frozen at the input ``x`` [B, d]:
    a function of [B, ..., d] vectors (centred first for a LayerNorm)."""
    d = x.shape[-1]
    w = getattr(module, "weight", None)
    gain = torch.ones(d, dtype=x.dtype, device=x.device) if w is None else w.detach().to(x.dtype)
    if "Gemma" in type(module).__name__:  # Gemma's RMSNorm scales by 1 + weight
        gain = 1.0 + gain
    if isinstance(module, nn.LayerNorm):
        scale = torch.sqrt(x.var(-1, unbiased=False) + module.eps)
        return lambda v: (v - v.mean(-1, keepdim=True)) * gain / scale.view(-1, *[1] * (v.dim() - 1))
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    scale = torch.sqrt(x.pow(2).mean(-1) + eps)
    return lambda v: v * gain / scale.view(-1, *[1] * (v.dim() - 1))


def _hf_layers(bridge):
    """The Hugging Face decoder layers under the bridge (for Gemma's post-attention norms)."""
    hf = bridge.original_model
    inner = getattr(hf, "model", None) or getattr(hf, "transformer", None)
    inner = getattr(inner, "language_model", inner)
    return getattr(inner, "layers", None) or getattr(inner, "h", None) or []


def name_mover_table(bridge, prompts: IOIPrompts) -> pd.DataFrame:
    """Per head: ``att_io``, ``att_s`` (END's mean attention to IO and to S) and ``dla``
    (direct logit attribution to logit[IO] - logit[S], norms' scales frozen); one forward."""
    nl, nh = int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)
    tokens = prompts.tokens.to(next(bridge.parameters()).device)
    keep = lambda n: n.endswith(("attn.hook_z", "attn.hook_pattern", "attn.hook_out")) or n == "ln_final.hook_in"  # noqa: E731
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=keep)
    end = tokens.shape[1] - 1
    io_at = _positions_of(tokens, prompts.io).float()
    s_at = _positions_of(tokens, prompts.s).float()
    w_u = bridge.original_model.get_output_embeddings().weight.detach()
    u = (w_u[prompts.io.to(w_u.device)] - w_u[prompts.s.to(w_u.device)]).float()  # [B, d]
    final = _frozen_norm(bridge.ln_final._original_component, cache["ln_final.hook_in"][:, end].float())
    layers = _hf_layers(bridge)
    rows = []
    for la in range(nl):
        pat = cache[f"blocks.{la}.attn.hook_pattern"][:, :, end, :].float()  # [B, H, T]
        z = cache[f"blocks.{la}.attn.hook_z"][:, end].float()  # [B, H, d_head]
        out = torch.einsum("bhd,hdm->bhm", z, bridge.blocks[la].attn.W_O.detach().float())
        post = getattr(layers[la], "post_attention_layernorm", None) if la < len(layers) else None
        if post is not None and hasattr(layers[la], "pre_feedforward_layernorm"):  # Gemma: a norm after attention
            out = _frozen_norm(post, cache[f"blocks.{la}.attn.hook_out"][:, end].float())(out)
        dla = (final(out) * u[:, None, :]).sum(-1)  # [B, H]
        att_io = (pat * io_at[:, None, :]).sum(-1)
        att_s = (pat * s_at[:, None, :]).sum(-1)
        for h in range(nh):
            rows.append(
                {
                    "unit": f"L{la}H{h}",
                    "att_io": float(att_io[:, h].mean()),
                    "att_s": float(att_s[:, h].mean()),
                    "dla": float(dla[:, h].mean()),
                }
            )
    return pd.DataFrame(rows)


def pick_primaries(table: pd.DataFrame, n_primary: int = 3) -> pd.DataFrame:
    """``table`` with ``name_mover`` (att_io > att_s and dla > 0), ``primary`` (the top
    ``n_primary`` name movers by dla; topped up by dla alone when fewer) and ``how``."""
    t = table.copy()
    t["name_mover"] = (t["att_io"] > t["att_s"]) & (t["dla"] > 0)
    movers = t[t["name_mover"]].sort_values("dla", ascending=False, kind="stable")
    chosen = list(movers["unit"].head(n_primary))
    how = {u: "name mover: attends IO over S, top DLA to logit[IO] - logit[S]" for u in chosen}
    if len(chosen) < n_primary:
        rest = t[~t["unit"].isin(chosen)].sort_values("dla", ascending=False, kind="stable")
        for u in rest["unit"].head(n_primary - len(chosen)):
            chosen.append(u)
            how[u] = "top-up: top DLA (too few heads attend IO over S)"
    t["primary"] = t["unit"].isin(chosen)
    t["how"] = t["unit"].map(how).fillna("")
    return t


def conditional_backups(
    bridge, prompts: IOIPrompts, heads, primaries, backup_share: float = 0.06, max_rows: int = 2048
) -> pd.DataFrame:
    """Per candidate (every head but the primaries): ``single`` = m() - m(u),
    ``conditional`` = m(P) - m(P + u), ``beta`` = conditional - single, and ``backup``:
    among the top ``round(backup_share * |U|)`` (at least 1) by beta, beta > 0.
    m: the mean logit difference at the last position; every run resumes from one
    intact run, unembedded at the last position only."""
    prim = list(primaries)
    cands = [h for h in heads if h not in prim]
    last = [prompts.tokens.shape[1] - 1]
    pfx = Prefix(bridge, prompts.tokens, positions=last)
    sets = [[], prim] + [[u] for u in cands] + [prim + [u] for u in cands]
    m = run_resumed(
        pfx, sets, reduce=lambda lg: float(logit_diff(lg.cpu(), prompts)), max_rows=max_rows, positions=last
    )
    n = len(cands)
    single = [m[0] - v for v in m[2 : 2 + n]]
    cond = [m[1] - v for v in m[2 + n :]]
    t = pd.DataFrame({"unit": [h.name for h in cands], "single": single, "conditional": cond})
    t["beta"] = t["conditional"] - t["single"]
    k = max(1, round(backup_share * n))
    top = set(t.sort_values("beta", ascending=False, kind="stable")["unit"].head(k))
    t["backup"] = t["unit"].isin(top) & (t["beta"] > 0)
    t.attrs["clean"], t.attrs["primaries_ablated"] = m[0], m[1]
    return t
