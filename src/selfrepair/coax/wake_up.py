"""Wake-up (paper B): how much louder a head's output gets once a seed set of heads is
ablated, as the ratio of its mean output norm ||z_h W_O[h]|| with and without the
ablation, per head and along a growing seed set, and the heads a COAX ranking recovers
among those that wake up. Forward-only, through :mod:`selfrepair.core.interventions`;
:mod:`selfrepair.coax.score` imports these names back (``coax.wake_up_ratios`` as before).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch

from selfrepair.core import interventions
from selfrepair.core.components import Component
from selfrepair.core.interventions import Prefix


def _norms(bridge, z_of, heads, positions) -> dict[str, float]:
    """Mean norm of ||z_h W_O[h]|| per head, z_of(hook name) -> [B, T, H, D]."""
    out = {}
    for h in heads:
        z = z_of(h.hook)[:, :, h.head, :].float()  # [B, T, D]
        w = bridge.blocks[h.layer].attn.W_O[h.head].float().detach()  # [D, d_model]
        r = z @ w.to(z.device)
        if positions is not None:
            r = r[:, positions]
        out[h.name] = float(r.norm(dim=-1).mean())
    return out


def head_output_norms_sets(
    bridge,
    tokens,
    heads: Sequence[Component],
    sets: Sequence[Sequence[Component]],
    positions=None,
    mode="zero",
    means=None,
    prefix: Prefix | None = None,
) -> list[dict[str, float]]:
    """:func:`head_output_norms` for each ablation set of ``sets``, in one forward.

    The copies of the batch resume from the intact run (``prefix``, made here when not
    given) at the first layer any set ablates and stop after the last layer of ``heads``
    (no head output downstream of it is read); a head below that first layer has its
    intact output, read from the intact run. The same z as a full forward per set.
    """
    heads, sets = list(heads), [list(s) for s in sets]
    if not sets:
        return []
    pfx = prefix if prefix is not None and prefix.z else Prefix(bridge, tokens, keep_z=True)
    nl = pfx.n_layers
    start = min(interventions.first_layer(s, nl) for s in sets)
    stop = max(h.layer for h in heads) + 1 if heads else 0
    b, k = pfx.b, len(sets)
    store: dict[str, torch.Tensor] = {}
    if start < stop:

        def keep(name):  # bound to the name asked for (the bridge reports aliases)
            def fn(x, hook):
                store[name] = x.detach()
                return x

            return fn

        names = sorted({h.hook for h in heads if h.layer >= start})
        # the keeper runs after the ablation hook of the same point
        hooks = interventions.make_hooks(sets, b, mode, means) + [(n, keep(n)) for n in names]
        with torch.no_grad():
            pfx.run(start, k, hooks, stop=stop)
    out = []
    for i in range(k):

        def z_of(name, i=i):
            return store[name][i * b : (i + 1) * b] if name in store else pfx.z[name]

        out.append(_norms(bridge, z_of, heads, positions))
    return out


def head_output_norms(
    bridge,
    tokens,
    heads: Sequence[Component],
    ablate: Sequence[Component] = (),
    positions=None,
    mode="zero",
    means=None,
    prefix: Prefix | None = None,
) -> dict[str, float]:
    """Mean norm of each head's residual write ||z_h W_O[h]|| with ``ablate`` zeroed.

    Averaged over prompts and ``positions`` (default: all). Heads inside ``ablate``
    report 0. With no ablation, the intact run's z (``prefix``, made here when not given).
    """
    ablate = list(ablate)
    if not ablate:
        pfx = prefix if prefix is not None and prefix.z else Prefix(bridge, tokens, keep_z=True)
        return _norms(bridge, lambda name: pfx.z[name], heads, positions)
    return head_output_norms_sets(bridge, tokens, heads, [ablate], positions, mode, means, prefix)[0]


def _ratios(ab: dict, clean: dict, heads) -> dict[str, float]:
    return {h.name: (ab[h.name] / clean[h.name] if clean[h.name] > 0 else float("nan")) for h in heads}


def wake_up_ratios(
    bridge, tokens, heads, ablate, positions=None, mode="zero", means=None, clean=None, prefix=None
) -> dict[str, float]:
    """Output-norm ratio (with ``ablate`` zeroed) / (clean) of each head."""
    clean = clean or head_output_norms(bridge, tokens, heads, (), positions, mode, means, prefix)
    ab = head_output_norms(bridge, tokens, heads, ablate, positions, mode, means, prefix)
    return _ratios(ab, clean, heads)


def wake_up_curve(
    bridge, tokens, primaries, watch, positions=None, mode="zero", means=None, prefix=None
) -> pd.DataFrame:
    """Ratios of the ``watch`` heads as 0..|S| primaries are ablated (in the given order).

    The intact norms are those of the intact run (0 primaries: every ratio is clean /
    clean); the |S| ablated states run as copies of the batch in one forward
    (:func:`head_output_norms_sets`)."""
    primaries, watch = list(primaries), list(watch)
    pfx = prefix if prefix is not None and prefix.z else Prefix(bridge, tokens, keep_z=True)
    clean = head_output_norms(bridge, tokens, watch, (), positions, mode, means, pfx)
    sets = [primaries[:k] for k in range(1, len(primaries) + 1)]
    abl = [clean] + head_output_norms_sets(bridge, tokens, watch, sets, positions, mode, means, pfx)
    rows = []
    for k, ab in enumerate(abl):
        rows.extend({"n_ablated": k, "unit": u, "ratio": v} for u, v in _ratios(ab, clean, watch).items())
    return pd.DataFrame(rows)


def recovered_set(table: pd.DataFrame, wake: dict[str, float], k: int, min_ratio: float = 1.05) -> list[str]:
    """Top-k units by comp among those whose wake-up ratio exceeds ``min_ratio``."""
    t = table.dropna(subset=["comp"]).copy()
    t["wake"] = t["unit"].map(wake)
    t = t[t["wake"] > min_ratio].sort_values("comp", ascending=False)
    return list(t["unit"].head(k))
