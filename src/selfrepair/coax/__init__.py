"""Paper B (COAX): the score, its baselines, pruning, and the IOI, induction and
language-model experiments and training runners. Beside workflow/rules/coax.smk.

On a model of one's own (docs/OWN_MODEL.md), a TransformerBridge
(``selfrepair.core.load_bridge``), prompts as token ids [N, T] and a metric of the
logits [N, T, V] (a scalar tensor, e.g. the mean logit difference):

- :func:`coax_scores`: the COAX scan of the heads outside a seed set S and every
  baseline on the same heads, one table (unit, single, atp, eap_ig, atp_star, cond,
  comp, ...): the scores rule coax_ioi_run writes, less its wake and backup columns;
- :func:`scan`: the COAX scan alone (single, cond, comp per unit; ``.table``);
- :func:`all_scores`: the baselines beside a scan's table; one by one :func:`atp`,
  :func:`atp_mag`, :func:`eap_ig`, :func:`cond_grad`, :func:`atp_2s`,
  :func:`atp_star_graddrop`, :func:`atp_star_2s`, :func:`amp_ratio`,
  :func:`amp_ratio_eps`, :func:`single_energies`; :data:`DISCOVERY_METHODS` ranks each;
- :func:`run_ioi`: the whole IOI experiment of the workflow (scores, discovery,
  wake-up, freezing, knockout).

Names load their module on first use (importing the package imports no torch).
"""

from selfrepair.core.lazy import lazy_exports

_LAZY = {
    "score": ["scan", "single_energies"],
    "ioi_experiment": ["run_ioi"],
    "baselines": [
        "all_scores",
        "atp",
        "atp_mag",
        "eap_ig",
        "cond_grad",
        "atp_2s",
        "atp_star_graddrop",
        "atp_star_2s",
        "amp_ratio",
        "amp_ratio_eps",
        "DISCOVERY_METHODS",
        "AMP_EPS",
    ],
}
__all__ = ["coax_scores", *(name for names in _LAZY.values() for name in names)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def coax_scores(
    bridge,
    tokens,
    seed,
    metric,
    heads=None,
    protocol: str = "v2",
    top_r: int = 192,
    ig_steps: int = 5,
    max_rows: int = 2048,
    amp_eps: float | None = None,
    logits_to_keep: int = 0,
):
    """COAX and its baselines for every head of ``heads`` (names or Components, default
    all) outside the seed set ``seed`` (S: the primaries, ablated for the conditional
    scores), on ``tokens`` [N, T], with ``metric`` (logits -> scalar) for the gradient
    baselines. ``protocol``/``top_r``: COAX's support (``v2``: the last position, the
    whole vocabulary); ``logits_to_keep`` = n > 0 when ``metric`` reads only the last n
    positions (then only those are unembedded; rule coax_ioi_run: 1). The same calls as
    :func:`run_ioi` makes, so the same values, bit for bit."""
    from selfrepair.coax import baselines, score
    from selfrepair.core.components import head_components, parse
    from selfrepair.core.interventions import Prefix

    def named(cs):
        return [parse(c) if isinstance(c, str) else c for c in cs]

    seed = named(seed)
    heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads) if heads is None else named(heads)
    cands = [h for h in heads if h not in seed]
    pfx = Prefix(bridge, tokens)  # the intact run every ablated or interpolated run resumes from
    sc = score.scan(bridge, tokens, cands, seed, protocol, top_r, max_rows=max_rows, prefix=pfx)
    return baselines.all_scores(
        bridge, tokens, cands, metric, sc.table, ig_steps, primaries=seed,
        amp_eps=baselines.AMP_EPS if amp_eps is None else amp_eps, logits_to_keep=logits_to_keep, prefix=pfx,
    )  # fmt: skip
