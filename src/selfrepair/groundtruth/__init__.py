"""One ground truth for every method: Shapley values and pairwise interactions
of components on a task metric, from ablation games through the workflow's intervention
layer; agreement of each method's scores with them; corrected toy-IOI backup labels.

Sits above the paper packages: it may import heroes, coax, gim, core and tasks, and
nothing in src/selfrepair imports it. Kept free of imports: the names below load their
module on first use.

On a model of one's own (docs/OWN_MODEL.md), a TransformerBridge
(``selfrepair.core.load_bridge``), tokens [N, T] and a metric of the logits (a scalar):

- :func:`shapley_values`: the Shapley value of every head and MLP (``L0H0``, ``L0MLP``)
  for the drop of the metric under ablation, exact up to ``exact_max_players`` players,
  else the antithetic permutation estimator; the values rules groundtruth_* write
  (shapley.csv);
- :func:`model_tables`: a model's whole ground truth (Shapley values, pairwise
  interactions, every method's scores) from :class:`GameSpec` games and :class:`Settings`;
  :func:`run_on_model`: the same on counterfactual pairs (the logit difference), with
  the agreement tables, for any bridged model, grouped-query attention included; on a
  model with many components, ``Settings.players`` (``top``: the ``n_players`` largest
  single drops and the ``rest``; ``layers``) names a subset of players;
- :func:`pairwise_interactions`, :func:`exact_shapley`, :func:`permutation_shapley` on
  a game: :class:`AblationGame` (any bridge) or, for a Hugging Face GPT-2, paper A's
  ablation engine (:class:`EngineGames`, its metrics :func:`ioi_reduce`,
  :func:`counterfactual_reduce`, :func:`logprob_reduce`, :func:`exact_match_reduce`);
- :func:`agreement_table`: a method's scores against the Shapley values.
"""

from selfrepair.core.lazy import lazy_exports

_LAZY = {
    "pipeline": ["model_tables", "run_on_model", "GameSpec", "Settings"],
    "games": [
        "AblationGame",
        "EngineGames",
        "ioi_reduce",
        "counterfactual_reduce",
        "logprob_reduce",
        "exact_match_reduce",
    ],
    "shapley": ["exact_shapley", "permutation_shapley", "pairwise_interactions"],
    "agreement": ["agreement_table"],
}
__all__ = ["shapley_values", *(name for names in _LAZY.values() for name in names)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def shapley_values(
    bridge,
    tokens,
    metric,
    components=None,
    *,
    means=None,
    hf_model=None,
    engine=None,
    floor=None,
    settings=None,
    **knobs,
):
    """Shapley values of ``components`` (names or Components; default every head and MLP)
    in the game v(S) = float(``metric``(logits of ``tokens`` with S ablated)), for the
    drop v(empty) - v(S): one row per component with shapley, se, ci95 (0 where exact),
    estimator, n_permutations, n_pairs, n_evaluations, n_truncated, converged, v_empty,
    v_full.

    ``settings`` (a :class:`Settings`) or its fields as keywords (``mode``: ``mean`` or
    ``zero`` ablation; ``exact_max_players``, ``max_permutations``, ``rel_se``,
    ``min_pairs``, ``pairs_per_round``, ``seed``, ``max_rows``; ``players``, ``n_players``,
    ``rest``: a subset of players, one row per player, :mod:`groundtruth.players`). Mean ablation uses
    ``means`` (default: each component's mean over every example and position of
    ``tokens``, as the workflow takes them). ``floor``: the metric's absorbing minimum,
    if any (the permutation estimator truncates there). The game runs on the bridge's
    hooks; given ``hf_model`` (the same model as a Hugging Face GPT-2, ``load_hf``) and
    ``engine`` (the metric's :class:`games.EngineReduce`), on paper A's ablation engine,
    as the workflow runs it: the same values, bit for bit, as its shapley.csv."""
    import pandas as pd

    from selfrepair.core import interventions
    from selfrepair.core.components import all_components, parse
    from selfrepair.groundtruth import pipeline

    if settings is not None and knobs:
        raise TypeError(f"pass settings or its fields, not both (got settings and {sorted(knobs)})")
    settings = settings if settings is not None else pipeline.Settings(**knobs)
    if components is None:
        comps = all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    else:
        comps = [parse(c) if isinstance(c, str) else c for c in components]
    if means is None and settings.mode == "mean":
        means = interventions.component_means(bridge, [tokens], comps)
    spec = pipeline.GameSpec("metric", metric, floor=floor, engine=engine)
    on_engine = hf_model if engine is not None else None
    game = pipeline._games(bridge, on_engine, tokens, [spec], settings.mode, means, settings.max_rows)["metric"]
    res, who, _, _ = pipeline._game_shapley(game, comps, settings, floor)  # as pipeline.model_tables
    rows = pipeline.shapley_rows(res, who)
    return pd.DataFrame(rows)
