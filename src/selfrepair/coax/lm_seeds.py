"""Paper B's seeds on a real LM, and the per-prompt measurements its verdicts resample.

Paper B seeds COAX with the IOI name movers (the primaries) and, on a model without a
documented circuit, takes the backups from conditional ablation
(:mod:`selfrepair.coax.name_movers`). Chosen on a few prompts, both can be noise. This
module makes them checkable:

- prompts of both IOI templates: ABBA ("When IO and S went ..., S gave ...", the COAX
  release's only one) and BABA ("When S and IO ..."), alternating, so no seed is a fact
  about one word order (:func:`draw`);
- two seedings side by side: ``name_movers`` (Wang et al.'s rule: attends IO over S,
  top direct logit attribution) and ``single_drop`` (the heads whose single ablation
  lowers the logit difference most, whatever they attend to; the rule misses a head that
  attends to S and still writes logit[IO] - logit[S]);
- backup candidates downstream of a primary only: a head in a layer at or below the
  earliest primary's cannot respond to the primaries' ablation in the forward pass, so
  it is left out (role ``upstream``) rather than labelled by noise;
- the conditional-ablation matrix per truth prompt (:func:`truth_matrix`), so that the
  backups can be chosen again on any subset of the truth prompts: on each half
  (stability, :func:`stability`) and in each bootstrap resample of the claims
  (:func:`backups_from`);
- per scored prompt, the logit difference intact, with the primaries ablated, with the
  knockout sets ablated and with the backups or every candidate frozen
  (:func:`prompt_table`): the damage, freeze and knockout claims resample prompts.

The logit difference is logit[IO] - logit[S] at the last position, as everywhere in
paper B's IOI.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from selfrepair.core.components import Component, parse
from selfrepair.core.interventions import Prefix, first_layer, make_hooks, run_resumed
from selfrepair.tasks.ioi import IOIPrompts, logit_diff

TEMPLATES = ("ABBA", "BABA")
SEEDINGS = ("name_movers", "single_drop")


def to_baba(prompts: IOIPrompts) -> IOIPrompts:
    """The same prompts with the first mentions of IO and S swapped ("When S and IO went
    ..., S gave a ... to"): the BABA template of Wang et al. Each name is one token (the
    release draws only those), so the swap is exact and the length unchanged."""
    tok = prompts.tokens.clone()
    for b in range(tok.shape[0]):
        io_at = (tok[b] == prompts.io[b]).nonzero().flatten()
        s_at = (tok[b] == prompts.s[b]).nonzero().flatten()
        if len(io_at) != 1 or len(s_at) != 2:
            raise ValueError(f"prompt {b} has IO {len(io_at)} times and S {len(s_at)} times (expected 1 and 2)")
        i, j = int(io_at[0]), int(s_at[0])
        tok[b, i], tok[b, j] = prompts.s[b], prompts.io[b]
    return IOIPrompts(tok, prompts.io.clone(), prompts.s.clone())


def template_names(n: int, templates=TEMPLATES) -> np.ndarray:
    """The template of each of ``n`` prompts: prompt i in ``templates[i % len]``."""
    bad = set(templates) - set(TEMPLATES)
    if not templates or bad:
        raise ValueError(f"IOI templates must be a non-empty list of {TEMPLATES}, not {list(templates)}")
    return np.array([templates[i % len(templates)] for i in range(n)])


def draw(prompts: IOIPrompts, templates=TEMPLATES) -> tuple[IOIPrompts, np.ndarray]:
    """``prompts`` (the release's ABBA draw) with prompt i in ``templates[i % len]``:
    (prompts, the template of each)."""
    names = template_names(len(prompts), templates)
    if not (names == "BABA").any():
        return prompts, names
    baba = to_baba(prompts)
    pick = torch.tensor(names == "BABA")
    tokens = torch.where(pick[:, None], baba.tokens, prompts.tokens)
    return IOIPrompts(tokens, prompts.io, prompts.s), names


def subset(prompts: IOIPrompts, idx) -> IOIPrompts:
    idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
    return IOIPrompts(prompts.tokens[idx], prompts.io[idx], prompts.s[idx])


def halves(templates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint halves of the prompts, each with half of every template's prompts
    (alternately): the indices of half A and of half B. A template with fewer than two
    prompts would leave a half without it: ValueError."""
    a, b = [], []
    for t in dict.fromkeys(templates):
        idx = np.flatnonzero(templates == t)
        if len(idx) < 2:
            raise ValueError(
                f"template {t} has {len(idx)} truth prompt(s): each half of the truth prompts needs one of every "
                f"template (at least 2 per template, {2 * len(set(templates))} in all)"
            )
        a += list(idx[0::2])
        b += list(idx[1::2])
    return np.array(sorted(a), dtype=int), np.array(sorted(b), dtype=int)


def downstream(heads, primaries) -> tuple[list[Component], list[Component]]:
    """(candidates, upstream): the heads other than the primaries in a layer after the
    earliest primary's, which can respond to the primaries' ablation, and the others."""
    first = min(p.layer for p in primaries)
    rest = [h for h in heads if h not in primaries]
    return [h for h in rest if h.layer > first], [h for h in rest if h.layer <= first]


def per_prompt(pfx: Prefix, prompts: IOIPrompts, sets, max_rows: int) -> np.ndarray:
    """[len(sets), B] logit difference of every prompt with each set zero-ablated (each
    run resumed from the intact run ``pfx`` and unembedded at the last position)."""
    last = [prompts.tokens.shape[1] - 1]
    out = run_resumed(
        pfx, sets, reduce=lambda lg: logit_diff(lg.cpu(), prompts, reduce=False), max_rows=max_rows, positions=last
    )
    return torch.stack(out).double().numpy()


def drop_matrix(pfx: Prefix, prompts: IOIPrompts, heads, max_rows: int) -> np.ndarray:
    """[1 + H, B] per-prompt logit difference: intact, then each head ablated alone."""
    return per_prompt(pfx, prompts, [[]] + [[h] for h in heads], max_rows)


def top_drops(matrix: np.ndarray, units, n_primary: int, cols=None) -> pd.DataFrame:
    """Per head: the mean drop of the logit difference with it ablated alone (``drop``,
    on the prompts ``cols``, all by default) and ``primary``: the ``n_primary`` largest."""
    m = matrix if cols is None else matrix[:, np.asarray(cols)]
    t = pd.DataFrame({"unit": list(units), "drop": (m[0] - m[1:]).mean(1)})
    top = set(t.sort_values("drop", ascending=False, kind="stable")["unit"].head(n_primary))
    t["primary"] = t["unit"].isin(top)
    return t


def truth_matrix(pfx: Prefix, prompts: IOIPrompts, primaries, cands, max_rows: int, drops=None, heads=None):
    """[2 + 2n, B] per-prompt logit difference: intact, the primaries ablated, each of the
    n candidates alone, each with the primaries (:func:`backups_from` reads it). With
    ``drops`` (:func:`drop_matrix` of ``heads`` on the same prompts) the intact and
    single-ablation rows are taken from it: the same runs (a row's logits do not depend on
    the rows batched with it), not run again."""
    prim = list(primaries)
    if drops is None:
        sets = [[], prim] + [[u] for u in cands] + [prim + [u] for u in cands]
        return per_prompt(pfx, prompts, sets, max_rows)
    at = {h: i for i, h in enumerate(heads)}
    with_p = per_prompt(pfx, prompts, [prim] + [prim + [u] for u in cands], max_rows)
    return np.vstack([drops[:1], with_p[:1], drops[[1 + at[u] for u in cands]], with_p[1:]])


def backups_from(matrix: np.ndarray, units, share: float, cols=None, n_other: int | None = None) -> pd.DataFrame:
    """The conditional-ablation backups from :func:`truth_matrix`'s rows, on the prompts
    ``cols`` (all by default; repeats allowed, as a bootstrap resample has): per
    candidate ``single`` = m() - m(u), ``conditional`` = m(P) - m(P + u), ``beta`` =
    conditional - single, and ``backup``: among the top ``round(share * n_other)`` (at
    least 1) by beta, beta > 0 (m: the mean logit difference over the prompts;
    ``n_other``: the model's heads other than the primaries, the count GPT-2 small's 8
    documented backups of 141 are a share of; the candidates' count by default)."""
    m = matrix if cols is None else matrix[:, np.asarray(cols)]
    m = m.mean(1)
    n = len(units)
    if len(m) != 2 + 2 * n:
        raise ValueError(f"the matrix has {len(m)} rows; {n} candidates need {2 + 2 * n}")
    t = pd.DataFrame({"unit": list(units), "single": m[0] - m[2 : 2 + n], "conditional": m[1] - m[2 + n :]})
    t["beta"] = t["conditional"] - t["single"]
    k = max(1, round(share * (n if n_other is None else n_other)))
    top = set(t.sort_values("beta", ascending=False, kind="stable")["unit"].head(k))
    t["backup"] = t["unit"].isin(top) & (t["beta"] > 0)
    return t


def matrix_table(matrix: np.ndarray, units, templates: np.ndarray, seeding: str, n_other: int) -> pd.DataFrame:
    """:func:`truth_matrix` as a long table: seeding, prompt, template, ablated (none,
    primaries, unit, primaries+unit), unit, logit_diff, and ``n_other`` (the model's heads
    other than the primaries: :func:`backups_from`'s count)."""
    n = len(units)
    kinds = ["none", "primaries"] + ["unit"] * n + ["primaries+unit"] * n
    names = ["", ""] + list(units) * 2
    rows = [
        (seeding, p, templates[p], kinds[r], names[r], matrix[r, p], n_other)
        for r in range(matrix.shape[0])
        for p in range(matrix.shape[1])
    ]
    return pd.DataFrame(rows, columns=["seeding", "prompt", "template", "ablated", "unit", "logit_diff", "n_other"])


def matrix_from_table(t: pd.DataFrame) -> tuple[np.ndarray, list[str], np.ndarray, int]:
    """:func:`matrix_table`'s inverse for one seeding: (matrix, candidate units,
    templates, n_other)."""
    t = t.assign(unit=t["unit"].fillna(""))  # the intact and primaries' rows name no unit
    units = list(t.loc[t["ablated"] == "unit", "unit"].drop_duplicates())
    order = [("none", ""), ("primaries", "")] + [("unit", u) for u in units] + [("primaries+unit", u) for u in units]
    piv = t.pivot(index=["ablated", "unit"], columns="prompt", values="logit_diff")
    tmpl = t.drop_duplicates("prompt").sort_values("prompt")["template"].to_numpy()
    n_other = t["n_other"].unique()
    if len(n_other) != 1:
        raise ValueError(f"one seeding's conditional-ablation table needs one n_other, not {list(n_other)}")
    return piv.loc[order].to_numpy(float), units, tmpl, int(n_other[0])


def stability(matrix, units, share, n_other, templates, primaries_a, primaries_b, seeding: str) -> pd.DataFrame:
    """The seeds chosen on each half of the truth prompts (:func:`halves`), side by
    side: per role (primaries, backups) the units of A and of B, their Jaccard overlap,
    and the share of A's units that B chose too. The primaries of each half are
    ``primaries_a``/``primaries_b`` (chosen there by the seeding's rule); the backups are
    those of the full truth set's primaries, chosen on each half's prompts."""
    a, b = halves(templates)
    rows = []
    back_a = backups_from(matrix, units, share, a, n_other)
    back_b = backups_from(matrix, units, share, b, n_other)
    for role, sa, sb in (
        ("primaries", primaries_a, primaries_b),
        ("backups", list(back_a.loc[back_a["backup"], "unit"]), list(back_b.loc[back_b["backup"], "unit"])),
    ):
        union = set(sa) | set(sb)
        rows.append(
            {
                "seeding": seeding,
                "role": role,
                "half_a": " ".join(sa),
                "half_b": " ".join(sb),
                "n_prompts_a": len(a),
                "n_prompts_b": len(b),
                "jaccard": len(set(sa) & set(sb)) / len(union) if union else float("nan"),
                "kept_share": len(set(sa) & set(sb)) / len(sa) if sa else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def _patched(bridge, pfx: Prefix, prompts: IOIPrompts, zero, freeze) -> np.ndarray:
    """[B] logit difference with ``zero`` heads zeroed and ``freeze`` heads held at their
    clean outputs (``pfx`` kept the clean z), resumed at the first zeroed layer."""
    patch = {}
    for c in list(zero) + list(freeze):
        z = patch.setdefault(c.hook, pfx.z[c.hook].clone())
        if c in zero:
            z[:, :, c.head, :] = 0.0
    hooks = make_hooks([list(zero) + list(freeze)], prompts.tokens.shape[0], "patch", patch)
    last = [prompts.tokens.shape[1] - 1]
    with torch.no_grad():
        lg = pfx.run(first_layer(zero, pfx.n_layers), 1, hooks, last)
    return logit_diff(lg.cpu(), prompts, reduce=False).double().numpy()


def prompt_table(bridge, prompts: IOIPrompts, templates, primaries, backups, cands, recovered, max_rows: int):
    """Per scored prompt: the logit difference intact (``ld_clean``), with the primaries
    ablated (``ld_primaries``), with COAX's recovered set too (``ld_primaries_coax``),
    with the ground-truth backups too (``ld_primaries_ground_truth``), and with the
    primaries ablated while the backups (``ld_frozen_backups``) or every candidate
    (``ld_frozen_all``) are held at their clean outputs."""
    last = [prompts.tokens.shape[1] - 1]
    pfx = Prefix(bridge, prompts.tokens, keep_z=True, positions=last)
    prim, back = list(primaries), list(backups)
    ko = per_prompt(pfx, prompts, [[], prim, prim + list(recovered), prim + back], max_rows)
    return pd.DataFrame(
        {
            "prompt": np.arange(len(prompts)),
            "template": templates,
            "ld_clean": ko[0],
            "ld_primaries": ko[1],
            "ld_primaries_coax": ko[2],
            "ld_primaries_ground_truth": ko[3],
            "ld_frozen_backups": _patched(bridge, pfx, prompts, prim, back),
            "ld_frozen_all": _patched(bridge, pfx, prompts, prim, cands),
        }
    )


def names(units) -> list[Component]:
    return [parse(u) for u in units]
