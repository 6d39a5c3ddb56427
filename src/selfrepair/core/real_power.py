"""The power of the claims tested on the real LMs (:mod:`selfrepair.core.real_claims`):
for each claim, the sample size at which its interval would exclude the threshold if the
effect stayed as measured, and what that size would cost, from the CPU time each part of
the run measured.

An interval's half-width shrinks as 1/sqrt(n) with the n units it resamples (prompts,
pairs, sequences, truth prompts). Holding the effect d = measured - threshold and the
half h of the interval on the threshold's side (:func:`real_claims.threshold_half`) at
their measured values, the interval excludes the threshold once h sqrt(n / n') < |d|,
so at

    n' = ceil(n (h / |d|)^2)

units; at the family-wise level of the table's Holm verdicts, at most
n (h z_m / (z |d|))^2, where z_m is the normal quantile of 0.05 / (2 m) over the table's
m tested claims (Bonferroni's bound on Holm's last step). A claim with d = 0 is decided
by no n. These are projections from one run's effect and spread, not guarantees: the
effect at a larger n is whatever it is.

Each unit is a size in the config (:data:`UNITS`); the part of the run that grows with it
(paper B's IOI or induction experiment, paper C's localization or feature attribution on
the claim's task) was timed by its job (the status tables' ``cpu_s``), and the projected
cost is that part's measured CPU time scaled linearly to the size needed: the part's
fixed costs (loading, the BOS choice) are charged to its units too, so it is an upper
bound for a part whose cost is linear in its units.
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

from selfrepair.core import real_claims as R
from selfrepair.core.files import require_columns

# what a claim's interval resamples (the claims table's `resampled`, by its first words)
# -> (the config size that sets it, the part of the run that grows with it)
UNITS = {
    ("coax", "scored prompts"): ("n_prompts", "ioi"),
    ("coax", "truth prompts"): ("n_truth", "ioi"),
    ("coax", "evaluation sequences"): ("induction_prompts", "induction"),
    ("coax", "evaluation windows"): ("pruning_n_eval", "pruning"),
    ("gim", "pairs"): ("n_eval", "localization"),
    ("gim", "prompts"): ("fa_examples", "feature_attribution"),
}
COLUMNS = [
    "model",
    "paper",
    "id",
    "claim",
    "verdict",
    "verdict_holm",
    "effect",
    "half_width",
    "n",
    "resampled",
    "n_needed",
    "n_needed_holm",
    "size_key",
    "size",
    "size_needed",
    "size_needed_holm",
    "part",
    "part_cpu_s",
    "projected_cpu_s",
    "projected_cpu_s_holm",
    "note",
]


def n_needed(n: int, half: float, effect: float, z_ratio: float = 1.0) -> float:
    """The least n' at which an interval of half ``half`` at ``n`` units, shrinking as
    1/sqrt(n), would exclude the threshold an ``effect`` away (``z_ratio``: the wider
    interval's quantile over the 95% one's). Infinite for a zero effect."""
    if not (n > 0 and half >= 0 and math.isfinite(effect)):
        raise ValueError(f"n {n}, half-width {half} and effect {effect}: need n > 0, half >= 0, a finite effect")
    if effect == 0:
        return math.inf
    return float(max(1, math.ceil(n * (half * z_ratio / abs(effect)) ** 2 - 1e-9)))


def unit(paper: str, resampled: str) -> tuple[str, str]:
    """(config size, part of the run) of a claim whose interval resamples ``resampled``."""
    for (p, words), out in UNITS.items():
        if p == paper and str(resampled).startswith(words):
            return out
    raise ValueError(
        f"paper {paper!r}: no config size is known for an interval over {resampled!r} "
        f"(known: {', '.join(f'{p}: {w}' for p, w in UNITS)})"
    )


def task_of(claim: str) -> str:
    """The task of a paper C claim ('ioi: GIM has ...' -> 'ioi')."""
    task, sep, _ = str(claim).partition(":")
    if not sep:
        raise ValueError(f"claim {claim!r} names no task ('<task>: ...')")
    return task.strip()


def part_costs(coax_status: pd.DataFrame | None, gim_status: pd.DataFrame | None) -> pd.DataFrame:
    """Measured CPU seconds per (model, paper, part, task) from the jobs' status tables:
    paper B's experiments (``ioi``, ``induction``), paper C's parts summed over the methods
    of each task (``localization``, ``feature_attribution``)."""
    rows = []
    if coax_status is not None and len(coax_status):
        require_columns(coax_status, ("model", "experiment", "cpu_s"), "paper B's status table")
        for r in coax_status.itertuples():
            rows.append((r.model, "coax", r.experiment, "", float(r.cpu_s)))
    if gim_status is not None and len(gim_status):
        require_columns(gim_status, ("model", "task", "part", "cpu_s"), "paper C's status table")
        g = gim_status.dropna(subset=["part"]).groupby(["model", "part", "task"], sort=False)["cpu_s"].sum()
        rows += [(m, "gim", part, task, float(c)) for (m, part, task), c in g.items()]
    return pd.DataFrame(rows, columns=["model", "paper", "part", "task", "cpu_s"])


def power_table(claims: pd.DataFrame, costs: pd.DataFrame, sizes: dict, alpha: float = 1 - R.LEVEL) -> pd.DataFrame:
    """One row per claim with an interval (:data:`COLUMNS`). ``sizes``: (model, paper) ->
    {config size: value}; ``costs``: :func:`part_costs`. The claim's n over its size is
    the units per unit of the size (scored prompts per ``n_prompts``: one per data seed;
    the answered prompts per ``fa_examples``), and it is held at that."""
    require_columns(claims, ("model", "paper", "id", "claim", "measured", "ci_low", "ci_high", "threshold", "n",
                   "resampled", "verdict", "verdict_holm", "p"), "the claims table")  # fmt: skip
    tested = claims[claims["p"].notna()]
    m = max(len(tested), 1)
    z_ratio_holm = float(stats.norm.isf(alpha / (2 * m)) / stats.norm.isf(alpha / 2))
    rows = []
    for r in tested.itertuples():
        key, part = unit(r.paper, r.resampled)
        task = task_of(r.claim) if r.paper == "gim" else ""
        size_of = sizes.get((r.model, r.paper))
        if size_of is None or key not in size_of:
            raise ValueError(f"no size {key!r} given for {r.model} (paper {r.paper})")
        size = int(size_of[key])
        per_size = r.n / size  # units per unit of the size: data seeds x prompts, answered prompts
        effect = float(r.measured) - float(r.threshold)
        half = R.threshold_half(r.measured, r.ci_low, r.ci_high, r.threshold)
        need = n_needed(int(r.n), half, effect)
        need_holm = n_needed(int(r.n), half, effect, z_ratio_holm)
        size_need = math.ceil(need / per_size - 1e-9) if math.isfinite(need) else math.inf
        size_need_holm = math.ceil(need_holm / per_size - 1e-9) if math.isfinite(need_holm) else math.inf
        c = costs[(costs["model"] == r.model) & (costs["paper"] == r.paper) & (costs["part"] == part)]
        if task:
            c = c[c["task"] == task]
        cpu = float(c["cpu_s"].sum()) if len(c) else float("nan")
        rows.append({
            "model": r.model, "paper": r.paper, "id": r.id, "claim": r.claim, "verdict": r.verdict,
            "verdict_holm": r.verdict_holm, "effect": effect, "half_width": half, "n": int(r.n),
            "resampled": r.resampled, "n_needed": need, "n_needed_holm": need_holm, "size_key": key,
            "size": size, "size_needed": size_need, "size_needed_holm": size_need_holm,
            "part": f"{part} ({task})" if task else part, "part_cpu_s": cpu,
            "projected_cpu_s": cpu * size_need / size, "projected_cpu_s_holm": cpu * size_need_holm / size,
            "note": _note(r.verdict, need, int(r.n), r.resampled),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def _note(verdict: str, need: float, n: int, resampled: str) -> str:
    unit_words = str(resampled).split(" (")[0]
    if not math.isfinite(need):
        return "the effect is 0: no n decides it"
    if verdict in ("holds", "fails"):
        return f"decided at n = {n}; {int(need)} {unit_words} would still decide it if the effect stayed"
    return f"needs about {int(need)} {unit_words} (now {n}) if the effect stayed"
