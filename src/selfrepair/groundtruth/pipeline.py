"""One model's ground truth and method scores (rules groundtruth_{heroes,ioi,gim} run it for each model of a group).

For each game of the model (paper A: the smooth log-probability game and exact-match
accuracy; toy IOI and paper C's toys: the logit difference), over every head and MLP:

- Shapley values: exact (all 2^n coalitions) when n <= ``exact_max_players``, else the
  antithetic permutation estimator with its standard errors (truncated at the game's
  floor where it has one: accuracy 0);
- every pair's joint-minus-individual drop (1 + n + n(n-1)/2 coalitions), and the
  exact Shapley interaction index where the Shapley values are exact;
- the single drops in both ablation modes;

and every method of :mod:`selfrepair.groundtruth.methods` on the same batch, with the
gradient methods on the first (differentiable) game's metric.

Game values (every coalition above) come from the bridge's hooks
(:class:`games.AblationGame`, one full forward per coalition), or, given the model's
Hugging Face GPT-2 (``hf_model``), from paper A's ablation engine (:class:`games.EngineGames`,
prefix reuse; each game's :attr:`GameSpec.engine`), the same values to float rounding.
On the engine, the games of one model share their coalitions: one :class:`games.EngineGames`
per ablation mode runs each coalition once and reads every game's value from it (paper
A's accuracy game draws the log-probability game's permutations, so its Shapley values
cost almost nothing more). The gradient methods run on the bridge; COAX's ablated runs on
the engine too when it is given. Mean ablation uses
``means`` in both: each component's mean over every example and every position of the
batch the caller pooled (the workflow: the evaluation batch, first token included).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from selfrepair.core.components import Component
from selfrepair.groundtruth import games, methods, players
from selfrepair.groundtruth import shapley as sh
from selfrepair.heroes import scores as heroes


@dataclass
class GameSpec:
    """A game of the model: v(logits) (a scalar tensor), whether it is differentiable
    (the gradient methods use the first such game), and its floor (absorbing minimum,
    or None)."""

    name: str
    reduce: Callable[[torch.Tensor], torch.Tensor]
    differentiable: bool = True
    floor: float | None = None
    engine: games.EngineReduce | None = None  # the same v on paper A's ablation engine


def heroes_specs(batch, names: Sequence[str] = ("logprob", "accuracy")) -> list[GameSpec]:
    """Paper A's games on ``batch`` (a :class:`tasks.sequences.Batch`), in this order:
    ``logprob`` (mean log-probability of the targets; differentiable, so it carries the
    gradient methods) and ``accuracy`` (exact match; floor 0), each with its engine form,
    those of ``names`` kept."""
    specs = [
        GameSpec("logprob", lambda lg: -heroes.lm_loss(lg, batch), engine=games.logprob_reduce(batch)),
        GameSpec(
            "accuracy",
            lambda lg: heroes.exact_match(lg, batch.targets, batch.mask).float().mean(),
            differentiable=False,
            floor=0.0,
            engine=games.exact_match_reduce(batch),
        ),
    ]
    unknown = set(names) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"unknown paper-A games {sorted(unknown)}; expected logprob, accuracy")
    return [s for s in specs if s.name in names]


@dataclass
class Settings:
    mode: str = "mean"
    exact_max_players: int = 12
    max_permutations: int = 128
    rel_se: float = 0.05
    min_pairs: int = sh.MIN_PAIRS
    pairs_per_round: int = 8
    seed: int = 0
    max_rows: int = 256
    n_primary: int = 3
    ig_steps: int = 5
    protocol: str = "v2"
    top_r: int = 192
    players: str = "all"  # who plays: all, top (n_players and the rest), layers (players.py)
    n_players: int = 16
    rest: str = "player"

    def __post_init__(self):
        players.check(self.players, self.n_players, self.rest)
        # the permutation estimator's own checks, made here so that a configuration that
        # could not sample fails before any model is loaded, sampled or not
        if not isinstance(self.min_pairs, int) or self.min_pairs < 2:
            raise ValueError(f"min_pairs must be an integer >= 2, got {self.min_pairs!r}")
        if self.max_permutations < 2 * self.min_pairs:
            raise ValueError(
                f"max_permutations = {self.max_permutations} is below 2 x min_pairs = {2 * self.min_pairs}: "
                "the permutation estimator runs at least min_pairs antithetic pairs"
            )


def _games(bridge, hf_model, tokens, specs: Sequence[GameSpec], mode: str, means, max_rows: int):
    """{spec name: its game}: on the engine when ``hf_model`` is given (one
    :class:`games.EngineGames` for all specs, so each coalition runs once; ``max_rows``
    sequences per engine chunk), else on the bridge's hooks (``max_rows`` sequences per
    forward)."""
    if hf_model is None:
        return {s.name: games.AblationGame(bridge, tokens, s.reduce, mode, means, max_rows) for s in specs}
    missing = [s.name for s in specs if s.engine is None]
    if missing:
        raise ValueError(f"games {missing} have no engine form (GameSpec.engine): they cannot run on the engine")
    shared = games.EngineGames(hf_model, tokens, {s.name: s.engine for s in specs}, mode, means, rows=max_rows)
    return {s.name: shared.game(s.name) for s in specs}


def _n_run(games_: dict) -> int:
    """Coalitions run so far by the games of a ``_games`` dict (the engine's shared count,
    or each bridge game's own)."""
    shared = {id(g.shared): g.shared for g in games_.values() if hasattr(g, "shared")}
    if shared:
        return sum(e.n_run for e in shared.values())
    return sum(g.n_coalitions for g in games_.values())


def _singles(game, components) -> dict[str, float]:
    v = game([[]] + [[c] for c in components])
    return {c.name: float(v[0] - v[i + 1]) for i, c in enumerate(components)}


def shapley_rows(res, components, game: str | None = None, single: dict | None = None) -> list[dict]:
    """The rows of shapley.csv for one game's estimate ``res`` (:func:`shapley_of`): per
    component its value, se and ci95 (0 where exact), the estimator's counts and v(empty),
    v(full); with ``game`` that column first, with ``single`` (component name -> drop)
    each component's single-ablation drop."""
    rows = []
    for c, phi, s, ci in zip(components, res.values, res.se, res.ci95):
        row = {} if game is None else {"game": game}
        row.update(component=c.name, shapley=float(phi), se=float(s), ci95=float(ci))
        if single is not None:
            row["single"] = float(single[c.name])
        row.update(estimator=res.method, n_permutations=res.n_permutations, n_pairs=res.n_pairs,
                   n_evaluations=res.n_evaluations, n_truncated=res.n_truncated,
                   converged=bool(res.converged), v_empty=res.v_empty, v_full=res.v_full)  # fmt: skip
        rows.append(row)
    return rows


def coalition_bound(n_layers: int, n_heads: int, settings: Settings) -> tuple[int, int]:
    """(players, the most coalitions their Shapley values take) on a model of ``n_layers``
    layers of ``n_heads`` heads and an MLP: every coalition when the players are at most
    ``exact_max_players``, else ``max_permutations`` permutations of ``players + 1``
    coalitions each (the stopping rule may take fewer), before the single drops and methods."""
    n = {
        "all": n_layers * (n_heads + 1),
        "top": settings.n_players + (settings.rest == "player"),
        "layers": n_layers,
    }[settings.players]
    if n <= settings.exact_max_players:
        return n, 2**n
    return n, settings.max_permutations * (n + 1)


def shapley_of(game, components, settings: Settings, floor=None):
    """Shapley values of ``game`` over ``components`` as the ground truth computes them:
    exact from every coalition's value up to ``settings.exact_max_players`` players
    (returns those values too), else the permutation estimator with the settings' stopping
    rule (values None)."""
    n = len(components)
    if n <= settings.exact_max_players:
        values = sh.coalition_values(game, components, max_players=settings.exact_max_players)
        phi, se = sh.shapley_from_values(values), np.zeros(n)
        res = sh.ShapleyResult(
            components, phi, se, float(values[0]), float(values[-1]), "exact", n_evaluations=len(values)
        )
        return res, values
    res = sh.permutation_shapley(
        game,
        components,
        max_permutations=settings.max_permutations,
        rel_se=settings.rel_se,
        min_pairs=settings.min_pairs,
        pairs_per_round=settings.pairs_per_round,
        seed=settings.seed,
        floor=floor,
        chunk=4096,
    )
    return res, None


def _game_shapley(game, components: list, settings: Settings, floor):
    """(Shapley result, its players, the exact coalition values or None, every
    component's single drop or None) of one game: over ``components`` themselves when
    ``settings.players`` is ``all`` (single drops None: the pairs table gives them), else
    over :func:`players.choose`'s players, chosen from every component's single drop."""
    if settings.players == "all":
        res, values = shapley_of(game, components, settings, floor)
        return res, components, values, None
    single = _singles(game, components)
    who = players.choose(components, single, settings.players, settings.n_players, settings.rest)
    res, values = shapley_of(players.grouped(game), who, settings, floor)
    return res, who, values, single


def _scored(components: list, who: list, settings: Settings) -> list:
    """The components the methods score: every one, except with ``top`` players, where
    they score the players that are components (what the agreement compares; the single
    drops of the game's mode stay every component's): a real LM's COAX scan and
    other-mode single drops over every component would cost more than its Shapley values."""
    if settings.players != "top":
        return components
    return [p for p in who if not isinstance(p, players.Group)]


def model_tables(
    bridge,
    tokens: torch.Tensor,
    specs: Sequence[GameSpec],
    components: Sequence[Component],
    means: dict | None,
    settings: Settings,
    hf_model=None,
) -> dict[str, pd.DataFrame]:
    """Tables ``shapley`` (game, component, shapley, se, ci95, single, estimator,
    n_permutations, n_pairs, ...; ``ci95`` the half-width of the 95% t interval on
    ``n_pairs`` antithetic pairs, 0 and 0 where exact),
    ``interactions`` (game, u, v, interaction, shapley_interaction) and ``scores``
    (game, method, component, score) of one model; ``timing`` (part, seconds: wall,
    cpu_s: this process's CPU seconds, coalitions: asked for, run: evaluated in that
    part, fewer where the games share them; part ``methods``: every method but the single
    drops, once per model; parts ``method relp`` and ``method eap_gp``: those two alone,
    within ``methods``, so not to be added to it).

    ``hf_model``: the model's Hugging Face GPT-2 (``models.load_hf`` of the bridge's
    folder): every game value (Shapley, pairs, single drops in both modes) then comes
    from paper A's ablation engine (each spec needs its ``engine`` form); None: from the
    bridge. The tables have the same files and columns either way."""
    components = list(components)
    grad_spec = next((s for s in specs if s.differentiable), None)
    if grad_spec is None:
        raise ValueError("no differentiable game: the gradient methods need one")
    other = "zero" if settings.mode == "mean" else "mean"
    shap_rows, inter_frames, score_frames, timing = [], [], [], []
    method_scores = None
    by_game = _games(bridge, hf_model, tokens, specs, settings.mode, means, settings.max_rows)
    other_games = _games(bridge, hf_model, tokens, specs, other, means, settings.max_rows)
    for spec in specs:
        t0, c0 = time.perf_counter(), time.process_time()
        run0 = _n_run(by_game)
        game = by_game[spec.name]
        res, who, values, single = _game_shapley(game, components, settings, spec.floor)
        sii = sh.interaction_index_from_values(values) if values is not None else None
        t1, c1 = time.perf_counter(), time.process_time()
        t_shap = t1 - t0
        run1, other_run = _n_run(by_game), _n_run(other_games)
        single_who, pairs = _pairs_table(players.grouped(game) if who is not components else game, spec.name, who, sii)
        single = single if single is not None else single_who
        inter_frames.append(pairs)
        shap_rows += shapley_rows(res, who, game=spec.name, single=single_who)
        timing.append(_timing_row(f"shapley {spec.name}", t_shap, c1 - c0, res.n_evaluations, run1 - run0))
        scored = _scored(components, who, settings)
        by_mode = {
            settings.mode: single,
            other: _singles(other_games[spec.name], scored),
        }
        t2, c2 = time.perf_counter(), time.process_time()
        if method_scores is None and spec is grad_spec:
            method_scores, timing_methods, method_timing = _methods_once(
                bridge, tokens, scored, spec, by_mode, means, settings, hf_model, t2, c2
            )
        t3, c3 = time.perf_counter(), time.process_time()
        score_frames.append(_single_scores(single, by_mode).assign(game=spec.name))
        seconds, cpu_s = (t2 - t1) + (time.perf_counter() - t3), (c2 - c1) + (time.process_time() - c3)
        run = _n_run(by_game) + _n_run(other_games) - run1 - other_run
        timing.append(_timing_row(f"pairs and singles {spec.name}", seconds, cpu_s, 0, run))
    timing.append(timing_methods)
    timing += method_timing
    # the gradient and COAX methods (one set, on the differentiable game's metric) stand
    # beside every game's Shapley values; the single drops are each game's own
    shared = method_scores[~method_scores["method"].str.startswith("single")]
    for spec in specs:
        score_frames.append(shared.assign(game=spec.name))
    scores = pd.concat(score_frames, ignore_index=True)[["game", "method", "component", "score"]]
    return {
        "shapley": pd.DataFrame(shap_rows),
        "interactions": pd.concat(inter_frames, ignore_index=True),
        "scores": scores,
        "timing": pd.DataFrame(timing),
        "primaries": method_scores.attrs["primaries"],
    }


def _timing_row(part: str, seconds: float, cpu_s: float, coalitions: int, run: int) -> dict:
    """One row of the ``timing`` table."""
    return {"part": part, "seconds": seconds, "cpu_s": cpu_s, "coalitions": coalitions, "run": run}


def _pairs_table(game, name: str, components: list, sii) -> tuple[dict, pd.DataFrame]:
    """(single drop per component, the pairs table of game ``name``: each pair's
    interaction and, from the exact values, its Shapley interaction index; NaN without)."""
    singles, pairs = sh.pairwise_interactions(game, components)
    single = dict(zip(singles["unit"], singles["drop"]))
    idx = {c.name: i for i, c in enumerate(components)}
    pairs["shapley_interaction"] = (
        [float(sii[idx[u], idx[v]]) for u, v in zip(pairs["u"], pairs["v"])] if sii is not None else np.nan
    )
    pairs.insert(0, "game", name)
    return single, pairs


def _methods_once(bridge, tokens, components, spec, by_mode, means, settings: Settings, hf_model, t2, c2):
    """Every method's scores on the differentiable game ``spec`` (once per model), the
    timing row of part ``methods`` (from ``t2``, ``c2``) and those of its newest methods."""
    method_scores = methods.all_methods(
        bridge,
        tokens,
        components,
        spec.reduce,
        by_mode,
        settings.mode,
        means,
        settings.n_primary,
        settings.ig_steps,
        settings.protocol,
        settings.top_r,
        settings.max_rows,
        hf_model=hf_model,
    )
    timing_methods = {
        "part": "methods",
        "seconds": time.perf_counter() - t2,
        "cpu_s": time.process_time() - c2,
        "coalitions": 0,
        "run": 0,
    }
    # the newest methods on their own too (their time is within part "methods")
    method_timing = [
        {"part": f"method {m}", **t, "coalitions": 0, "run": 0}
        for m, t in method_scores.attrs.get("timing", {}).items()
    ]
    return method_scores, timing_methods, method_timing


def _single_scores(single: dict, by_mode: dict) -> pd.DataFrame:
    """The single-drop methods' scores (``single``, and ``single_<mode>`` per mode)."""
    rows = [
        {"method": m, "component": k, "score": v}
        for m, d in [("single", single)] + [(f"single_{md}", d) for md, d in by_mode.items()]
        for k, v in d.items()
    ]
    return pd.DataFrame(rows)


def run_on_model(
    bridge, data, settings: Settings, top_k: int = 5, single_frac: float = 0.1, name: str = "model", hf_model=None
) -> dict[str, pd.DataFrame]:
    """The ground truth of one model on counterfactual pairs ``data`` (a
    :class:`tasks.counterfactual.CounterfactualBatch` on the model's device), for a thin
    script or the ``own:`` section: the game is the mean logit difference of answer over
    foil at each pair's read position on the clean prompts, the players every head and MLP
    (or ``settings.players``' subset), ablated under ``settings.mode`` with the means of
    the clean prompts. Any bridged model, grouped-query attention included
    (:mod:`selfrepair.core.attribution` says what a head's G is there); ``hf_model``: the
    model's Hugging Face GPT-2, to play on paper A's ablation engine (the same values).

    Returns tables ``shapley``, ``interactions``, ``scores`` (:func:`model_tables`, game
    ``logit_diff``), ``agreement`` (each method against the Shapley values of the players
    that are components: rank correlations, top-``top_k`` overlap, recall of the
    components whose single drop is below ``single_frac`` of the largest; group ``own``,
    model ``name``; empty with ``layers`` players) and ``timing``."""
    from selfrepair.core import components as C
    from selfrepair.core import interventions
    from selfrepair.gim.evaluate import logit_diff
    from selfrepair.groundtruth import tables

    comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [data.clean], comps)
    # fewer sequences per forward on a 262k-token vocabulary (Gemma-3's logits of 256 pairs
    # of 18 tokens are 4.8 GB); max_rows as given on every toy model and GPT-2's vocabulary
    settings = replace(settings, max_rows=interventions.fit_rows(bridge, data.clean.shape[1], settings.max_rows))
    spec = GameSpec("logit_diff", lambda lg: logit_diff(lg, data).mean(), engine=games.counterfactual_reduce(data))
    out = model_tables(bridge, data.clean, [spec], comps, means, settings, hf_model=hf_model)
    who = {"group": "own", "model": name}
    scored = out["scores"][out["scores"]["component"].isin(out["shapley"]["component"])]  # players that are components
    out["agreement"] = (
        tables.agreement_models(scored.assign(**who), out["shapley"].assign(**who), int(top_k), float(single_frac))
        if len(scored)
        else pd.DataFrame()
    )
    return {k: out[k] for k in ("shapley", "interactions", "scores", "agreement", "timing")}
