"""Paper A (Hidden Heroes and Gradient Bloats): scores and roles, tables, the protocol
grid and its tables and figures, claim spread. Beside workflow/rules/heroes.smk and
heroes_grid.smk. Kept free of imports so that ``grid`` stays importable without torch:
the names below load their module on first use.

On a model of one's own (docs/OWN_MODEL.md), a Hugging Face GPT-2 LM
(``selfrepair.core.load_hf``) and teacher-forced batches
(:class:`selfrepair.tasks.sequences.Batch`: tokens, targets, mask):

- :func:`gradient_importance`: G per component (heads ``L0H0``, MLPs ``L0MLP``), the
  table rule heroes_scores writes as gradients.csv;
- :func:`causal_importance`: C per component and ablation mode, its ablations.csv;
- :func:`causal_scores`, :func:`ablation_correct`, :func:`causal_table`: C of one mode,
  the per-sequence exact match behind it, and C from that matrix;
- :func:`exact_match`, :func:`lm_loss`: the task metric and the loss G differentiates.
"""

from selfrepair.core.lazy import lazy_exports

_LAZY = {"scores": ["causal_scores", "ablation_correct", "causal_table", "exact_match", "lm_loss"]}
__all__ = ["gradient_importance", "causal_importance", *(name for names in _LAZY.values() for name in names)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _components(model, components):
    from selfrepair.core.components import all_components, parse

    if components is None:
        return all_components(model.config.n_layer, model.config.n_head)
    return [parse(c) if isinstance(c, str) else c for c in components]


def gradient_importance(model, batches, components=None, normalization: str = "sqrt"):
    """G per component: the mean over ``batches`` (a list of ``Batch``) of the norm of
    the component's weight gradient of the masked LM loss (``normalization``: ``sqrt``
    divides by the square root of the weight count, ``raw`` not), with its SD over the
    batches. ``model``: a Hugging Face GPT-2 LM; ``components``: names or Components,
    default every head and MLP. Columns: component, G, G_sd, n_batches, normalization,
    the values rule heroes_scores writes (gradients.csv, less its status column)."""
    import numpy as np
    import pandas as pd

    from selfrepair.core import attribution
    from selfrepair.heroes import scores

    comps = _components(model, components)
    nb = len(batches)
    norms = attribution.gradient_norms_gpt2(model, batches, comps, scores.lm_loss, normalization)
    rows = [
        {
            "component": c.name,
            "G": float(np.mean(norms[c.name])),
            "G_sd": float(np.std(norms[c.name], ddof=1)) if nb > 1 else float("nan"),
            "n_batches": nb,
            "normalization": normalization,
        }
        for c in comps
    ]
    return pd.DataFrame(rows)


def causal_importance(model, batch, components=None, modes=("mean", "zero"), mean_batches=None):
    """C per component and ablation mode: exact-match accuracy of ``batch`` (a ``Batch``)
    intact minus with the component ablated, and its paired SE. Mean ablation sets a
    component to its mean over every position of ``mean_batches`` (``Batch``es or token
    tensors; default ``[batch]``; rule heroes_scores takes the batches behind G).
    Columns: component, mode, baseline_acc, ablated_acc, C, C_se, n (ablations.csv)."""
    import pandas as pd

    from selfrepair.core import engine
    from selfrepair.heroes import scores

    comps = _components(model, components)
    names = [c.name for c in comps]
    pool = [batch] if mean_batches is None else list(mean_batches)
    means = engine.means(model, [getattr(b, "tokens", b) for b in pool], comps) if "mean" in modes else None
    tables = []
    for mode in modes:
        correct = scores.ablation_correct(model, batch, [[]] + [[c] for c in comps], mode, means)
        tables.append(scores.causal_table(correct, names, mode))
    return pd.concat(tables, ignore_index=True)
