"""COAX: conditional co-ablation (paper B, SPEC.md "Paper B").

A backup unit is silent on the intact model, so every clean-state score misses it.
Ablate a seed set S of primaries first; a backup's ablation effect then grows. COAX
scores that growth in the Fisher geometry of the clean output distribution:

- clean logits z0; per kept position a fixed support (top-r logits, protocol ``v1``:
  every position but the last, r = 192; protocol ``v2``: the last position, full
  vocabulary) and p0 = softmax of z0 over that support;
- feature of a logit perturbation dz: d = sqrt(max(p0, 1e-12)) * (dz - E_p0[dz]) (the
  floor under p0 in the weight only, as COAX release 2.1.0 does; it matters only where
  some p0 < 1e-12); <d_u, d_v> = dz_u^T (diag(p0) - p0 p0^T) dz_v (Fisher quadratic
  form) up to that floor;
- energy E(dz) = mean over prompts and kept positions of ||d||^2;
- single_u = E(z0 - z_{u}), cond_u = E(z_S - z_{S+u}) (p0 still the clean one),
  comp_u = cond_u - single_u.

Everything here is forward-only: a scan of the units U (S inside U or not) runs the
clean model once, each single ablation once, S alone once and each S + u once, all
batched through :func:`selfrepair.core.interventions.run_ablated`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from selfrepair.coax.wake_up import (  # noqa: F401  (coax.wake_up_ratios, ... as before)
    _norms,
    _ratios,
    head_output_norms,
    head_output_norms_sets,
    recovered_set,
    wake_up_curve,
    wake_up_ratios,
)
from selfrepair.core.components import Component
from selfrepair.core.interventions import Prefix, run_ablated, run_resumed

PROTOCOLS = ("v1", "v2")


# ----------------------------------------------------------------------------------
# Fisher geometry
# ----------------------------------------------------------------------------------
@dataclass
class Support:
    """The fixed evaluation support: kept positions, top-r vocabulary and clean p0.

    ``positions`` [P] indexes the sequence; ``index`` [N, P, r] the kept logits;
    ``p0`` [N, P, r] the clean softmax over them; ``z0`` [N, P, r] the clean logits.
    """

    positions: torch.Tensor
    index: torch.Tensor
    p0: torch.Tensor
    z0: torch.Tensor
    protocol: str = "v1"

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, T, V] logits -> [N, P, r] logits on the support."""
        return self.gather_kept(logits[:, self.positions, :])

    def gather_kept(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, P, V] logits already at the kept positions -> [N, P, r] on the support."""
        x = logits.float()
        return x.gather(-1, self.index.to(x.device)).cpu()


def make_support(
    z0_full: torch.Tensor, protocol: str = "v1", top_r: int = 192, positions=None, vocab: int | None = None
) -> Support:
    """Build the support from the clean logits [N, T, V].

    ``v1``: every position except the last, the top ``top_r`` logits of each;
    ``v2``: the last position only, the full vocabulary (with ``vocab`` < V: the top
    ``vocab`` logits, :func:`support_at`). ``positions`` overrides the kept positions
    (e.g. only the second half of an induction sequence).
    """
    positions = support_positions(z0_full.shape[1], protocol, positions)
    return support_at(z0_full[:, positions, :], positions, protocol, top_r, vocab)


def support_positions(t: int, protocol: str = "v1", positions=None) -> torch.Tensor:
    """The kept positions of a length-``t`` sequence under ``protocol`` (or ``positions``)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if positions is None:
        positions = torch.arange(t - 1) if protocol == "v1" else torch.tensor([t - 1])
    return torch.as_tensor(positions, dtype=torch.long)


def release_vocab(bridge) -> int:
    """The full vocabulary of COAX release 2.1.0 on a real model: min(tokenizer
    ``vocab_size``, the model's output size) (its ``top_r = tokenizer.vocab_size``,
    capped at the logits' width). Smaller than the output on a padded vocabulary
    (Pythia: 50,254 tokens, 50,304 outputs); the output size without a tokenizer."""
    out = int(bridge.cfg.d_vocab)
    tok = getattr(bridge, "tokenizer", None)
    return out if tok is None else min(int(tok.vocab_size), out)


def support_at(
    z_kept: torch.Tensor, positions, protocol: str = "v1", top_r: int = 192, vocab: int | None = None
) -> Support:
    """:func:`make_support` from the clean logits at the kept ``positions`` only ([N, P, V]).

    ``vocab`` bounds ``v2``'s full vocabulary: with ``vocab`` < V the support is the top
    ``vocab`` clean logits of each position, as the release keeps (its top-r with r =
    min(tokenizer vocabulary, V), :func:`release_vocab`); ``None`` or >= V: all V."""
    positions = torch.as_tensor(positions, dtype=torch.long)
    z = z_kept.float().cpu()
    n, _, v = z.shape
    if protocol == "v1":
        r = min(int(top_r), v)
        index = z.topk(r, dim=-1).indices
    elif vocab is not None and int(vocab) < v:
        index = z.topk(int(vocab), dim=-1).indices
    else:
        index = torch.arange(v).expand(n, len(positions), v).clone()
    zs = z.gather(-1, index)
    return Support(positions, index, torch.softmax(zs, -1), zs, protocol)


P0_FLOOR = 1e-12  # floor under p0 in the Fisher weight sqrt(p0) (the release's clamp_min)


def features(dz: torch.Tensor, p0: torch.Tensor) -> torch.Tensor:
    """d = sqrt(max(p0, 1e-12)) * (dz - E_p0[dz]) over the last axis (the mean with p0 itself)."""
    mean = (p0 * dz).sum(-1, keepdim=True)
    return p0.clamp_min(P0_FLOOR).sqrt() * (dz - mean)


def energy(dz: torch.Tensor, p0: torch.Tensor) -> float:
    """Mean over prompts and positions of ||d||^2 (dz, p0: [N, P, r])."""
    d = features(dz, p0)
    return float((d**2).sum(-1).mean())


def fisher_inner(dz_u: torch.Tensor, dz_v: torch.Tensor, p0: torch.Tensor) -> float:
    """Mean over prompts and positions of <d_u, d_v>."""
    return float((features(dz_u, p0) * features(dz_v, p0)).sum(-1).mean())


# ----------------------------------------------------------------------------------
# Scans
# ----------------------------------------------------------------------------------
@dataclass
class ScanResult:
    table: pd.DataFrame  # unit, single, cond, comp (and wake when asked)
    forward_passes: int  # prompt-set forward passes (one = every prompt once)
    seed: list[str] = field(default_factory=list)


def _logits_on_support(bridge, tokens, sets, support, mode, means, max_rows):
    return run_ablated(bridge, tokens, sets, mode=mode, means=means, reduce=support.gather, max_rows=max_rows)


def clean_support(bridge, tokens, protocol="v1", top_r=192, positions=None, vocab=None) -> Support:
    with torch.no_grad():
        z0 = bridge(tokens)
    return make_support(z0, protocol, top_r, positions, vocab)


def scan(
    bridge,
    tokens: torch.Tensor,
    units: Sequence[Component],
    seed: Sequence[Component] = (),
    protocol: str = "v1",
    top_r: int = 192,
    mode: str = "zero",
    means: dict | None = None,
    positions=None,
    max_rows: int = 2048,
    support: Support | None = None,
    prefix: Prefix | None = None,
    vocab: int | None = None,
) -> ScanResult:
    """One COAX scan: single, cond and comp of every unit in ``units``.

    Forward passes (each over all prompts): 1 clean, |U| single ablations, 1 with S
    alone and one with S + u for each u in U outside S, i.e. 2 + 2|U| - |U & S|
    (1 + 2|U| when U holds one seed unit, as in the paper's count over all units).
    A unit inside S gets cond = comp = NaN (it cannot be ablated again). Each ablated
    run resumes from the intact run (``prefix``, made here when not given) at the first
    layer it ablates, and is unembedded at the kept positions only.
    """
    units = list(units)
    seed = list(seed)
    passes = 0
    # every set resumes from the intact run at the first layer it ablates, and the
    # unembedding runs at the kept positions only (interventions.Prefix): the same logits
    # there as full forwards of the ablated model
    pfx = prefix if prefix is not None else Prefix(bridge, tokens)
    if support is None:
        pos = support_positions(tokens.shape[1], protocol, positions)
        support = support_at(pfx.logits(pos.tolist()), pos, protocol, top_r, vocab)
        passes += 1
    z0, p0 = support.z0, support.p0
    pos = support.positions.tolist()
    gather = support.gather_kept

    def energy_from(ref):  # reduce each ablated run to its energy at once: no logits kept
        return lambda logits: energy(ref - gather(logits), p0)

    singles = run_resumed(pfx, [[u] for u in units], mode, means, energy_from(z0), max_rows, pos)
    passes += len(units)
    outside = [u for u in units if u not in seed]
    cond_of = {}
    if seed:
        # S alone first: its logits are the reference of every S + u
        zs = run_resumed(pfx, [seed], mode, means, gather, max_rows, pos)[0]
        conds = run_resumed(pfx, [seed + [u] for u in outside], mode, means, energy_from(zs), max_rows, pos)
        passes += 1 + len(outside)
        cond_of = dict(zip(outside, conds))
    rows = []
    for u, single in zip(units, singles):
        cond = cond_of.get(u, float("nan"))
        rows.append({"unit": u.name, "single": single, "cond": cond, "comp": cond - single})
    table = pd.DataFrame(rows)
    return ScanResult(table, passes, [s.name for s in seed])


def single_energies(
    bridge, tokens, units, protocol="v1", top_r=192, mode="zero", means=None, positions=None, max_rows=2048
):
    """The single-ablation energy baseline: E(z0 - z_u) per unit."""
    return scan(bridge, tokens, units, (), protocol, top_r, mode, means, positions, max_rows).table[["unit", "single"]]


def pairwise_synergy(
    bridge, tokens, units: Sequence[Component], support: Support, mode="zero", means=None, max_rows=2048
) -> pd.DataFrame:
    """I_uv = dz_uv - dz_u - dz_v (dz_X = z0 - z_X) for every pair; its Fisher energy.

    Costs |U| + |U|(|U|-1)/2 forward passes. Returns u, v, synergy (energy of I_uv)
    and inner (<d_I, d_u + d_v>, negative when the pair repairs each other).
    """
    units = list(units)
    singles = _logits_on_support(bridge, tokens, [[u] for u in units], support, mode, means, max_rows)
    pairs = [(i, j) for i in range(len(units)) for j in range(i + 1, len(units))]
    joint = _logits_on_support(bridge, tokens, [[units[i], units[j]] for i, j in pairs], support, mode, means, max_rows)
    z0 = support.z0
    rows = []
    for (i, j), zij in zip(pairs, joint):
        dzi, dzj, dzij = z0 - singles[i], z0 - singles[j], z0 - zij
        syn = dzij - dzi - dzj
        rows.append(
            {
                "u": units[i].name,
                "v": units[j].name,
                "synergy": energy(syn, support.p0),
                "inner": fisher_inner(syn, dzi + dzj, support.p0),
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------
# Synthetic benchmark (no model)
# ----------------------------------------------------------------------------------
def synthetic_trial(
    rng: np.random.Generator, r: int = 192, n_primary: int = 4, n_backup: int = 100, n_inert: int = 100
) -> dict:
    """One trial of SPEC's synthetic benchmark; returns scores and labels.

    Answer direction e; primaries w = normalize(0.7 e + 0.714 perp); backups
    normalize(random primary + 0.1 noise) with gate 0.04 clean and
    clip(0.42 + 0.1 noise, 0, 1.2) once the primaries are ablated; inert units random
    directions, gate 0.13 in both states; dz = gate * w + 0.05 noise.
    """

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    e = unit(rng.standard_normal(r))
    prim = []
    for _ in range(n_primary):
        p = rng.standard_normal(r)
        p = unit(p - (p @ e) * e)
        prim.append(unit(0.7 * e + 0.714 * p))
    prim = np.array(prim)
    wb = unit(prim[rng.integers(0, n_primary, n_backup)] + 0.1 * rng.standard_normal((n_backup, r)))
    wi = unit(rng.standard_normal((n_inert, r)))
    w = np.concatenate([wb, wi])
    g_clean = np.concatenate([np.full(n_backup, 0.04), np.full(n_inert, 0.13)])
    g_cond = np.concatenate([np.clip(0.42 + 0.1 * rng.standard_normal(n_backup), 0, 1.2), np.full(n_inert, 0.13)])
    n = n_backup + n_inert
    dz_clean = g_clean[:, None] * w + 0.05 * rng.standard_normal((n, r))
    dz_cond = g_cond[:, None] * w + 0.05 * rng.standard_normal((n, r))
    e_hat = unit(e + 0.15 * rng.standard_normal(r))
    labels = np.concatenate([np.ones(n_backup), np.zeros(n_inert)])
    return {
        "labels": labels,
        "clean_energy": (dz_clean**2).sum(1),
        "clean_answer": np.abs(dz_clean @ e),
        "cond_answer": np.abs(dz_cond @ e_hat),
        "coax": (dz_cond**2).sum(1) - (dz_clean**2).sum(1),
    }


SYNTHETIC_SCORES = ("clean_energy", "clean_answer", "cond_answer", "coax")


def synthetic_benchmark(trials: int = 40, seed: int = 0, **kw) -> pd.DataFrame:
    """ROC-AUC per score and trial (backups positive, inert units negative)."""
    from selfrepair.core.stats import roc_auc

    rng = np.random.default_rng(seed)
    rows = []
    for t in range(trials):
        d = synthetic_trial(rng, **kw)
        for s in SYNTHETIC_SCORES:
            rows.append({"trial": t, "score": s, "auc": roc_auc(d[s], d["labels"])})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------
# Tables across runs (the published claims read them: selfrepair.coax.claims)
# ----------------------------------------------------------------------------------
def ioi_summary(discovery: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mean (sd, n) ROC-AUC and top-k hits per method over (model, prompt set) runs,
    with a one-sided paired test of COAX against each baseline.

    The confidence intervals are over models, not runs (a model's prompt sets are not
    independent models): each model's runs are averaged, then a 95% Student-t interval
    of the mean over the ``n_models`` model means (``stats.t_interval``):
    ``roc_auc_ci_lo`` / ``roc_auc_ci_hi``, and for each baseline the paired difference
    COAX - baseline (per run, averaged per model) ``coax_minus_mean`` with
    ``coax_minus_ci_lo`` / ``coax_minus_ci_hi``, and ``coax_wins``, the runs (of
    ``n_runs``) where COAX's AUC is higher.
    """
    from selfrepair.core.stats import paired_test, t_interval

    rows = []
    piv = discovery.pivot_table(index=["model_seed", "data_seed"], columns="method", values="roc_auc")
    per_model = piv.groupby(level="model_seed").mean()
    for m, g in discovery.groupby("method", sort=False):
        ci = t_interval(per_model[m] if m in per_model else [], level)
        row = {
            "method": m,
            "roc_auc": g["roc_auc"].mean(),
            "roc_auc_sd": g["roc_auc"].std(ddof=1),
            "n_runs": len(g),
            "hits": g["hits"].mean(),
            "n_backups": g["n_backups"].mean(),
            "top_k": int(g["top_k"].iloc[0]),
        }
        if m != "coax" and "coax" in piv:
            t = paired_test(piv["coax"].to_numpy(), piv[m].to_numpy())
            row.update(p_wilcoxon_coax_gt=t["p_wilcoxon"], p_ttest_coax_gt=t["p_ttest"])
        row.update(n_models=ci["n"], roc_auc_ci_lo=ci["lo"], roc_auc_ci_hi=ci["hi"])
        if m != "coax" and "coax" in piv and m in piv:
            d = (piv["coax"] - piv[m]).groupby(level="model_seed").mean()
            dci = t_interval(d, level)
            row.update(
                coax_minus_mean=dci["mean"],
                coax_minus_ci_lo=dci["lo"],
                coax_minus_ci_hi=dci["hi"],
                coax_wins=int((piv["coax"] > piv[m]).sum()),
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.astype({"coax_wins": "Int64"}) if "coax_wins" in out else out
