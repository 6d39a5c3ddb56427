"""Paper A's protocol grid: the cells and their protocols (pure Python: the Snakefile
imports it to build the DAG; the measurements are in :mod:`selfrepair.heroes.protocol`).

A *protocol* is the set of choices where the paper's versions and the authors' public
code differ. A *cell* of the grid is the v3 default protocol, the default with one
switch flipped, or the combination the authors' public code uses:

=================  =========================  ===================================
switch             v3 default (this workflow)  authors' public code
=================  =========================  ===================================
padding            one length per batch        one length per example, PAD
                                               between SEP and the target
init               GPT-2 N(0, 0.02)            PyTorch defaults
g_normalization    sqrt (G / sqrt(#entries))   raw Frobenius norm
site               head output ``hook_z``      a d_head-wide slice of the summed
                                               attention output (after W_O),
                                               replaced by the head's mean z
n_eval             1,000 fresh sequences        100
role_boundary      hero iff Delta <= -t         hero iff Delta < -t (strict)
=================  =========================  ===================================

Only ``padding`` and ``init`` change training, so a cell shares its models with every
other cell of the same *training key*. Everything else is computed from one measurement
per model (:func:`measure`): G per batch, and the exact match of every evaluation
sequence with each component ablated at each site. A cell's C at ``n_eval`` uses the
first ``n_eval`` of those sequences, so cells and evaluation-sample counts are compared
on the same models and the same data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    key: str  # the paper-A config key the v3 value comes from
    v3: object
    authors: object
    trains: bool  # does the switch change training?


SWITCHES: dict[str, Switch] = {
    "padding": Switch("train.padding", "per_batch", "per_example", True),
    "init": Switch("model.init", "transformers", "torch", True),
    "g_normalization": Switch("scores.g_normalization", "sqrt", "raw", False),
    "site": Switch("scores.site", "hook_z", "attn_out_slice", False),
    "n_eval": Switch("scores.n_eval", 1000, 100, False),
    "role_boundary": Switch("roles.boundary", "inclusive", "strict", False),
}
CELLS = ("default", *SWITCHES, "authors")
SITES = ("hook_z", "attn_out_slice")
BOUNDARIES = ("inclusive", "strict")


def base_protocol(heroes_cfg: dict) -> dict:
    """The default cell: paper A's main config (heads ablated at hook_z, inclusive roles)."""
    return {
        "padding": heroes_cfg["train"]["padding"],
        "init": heroes_cfg["model"]["init"],
        "g_normalization": heroes_cfg["scores"]["g_normalization"],
        "site": "hook_z",
        "n_eval": int(heroes_cfg["scores"]["n_eval"]),
        "role_boundary": "inclusive",
    }


def cell_protocol(cell: str, base: dict) -> dict:
    """The protocol of one cell: ``default`` is ``base``; a switch name flips that switch
    (to the authors' value, or to v3's when ``base`` already has the authors' value);
    ``authors`` takes every switch from the authors' code."""
    if cell == "default":
        return dict(base)
    if cell == "authors":
        return {k: s.authors for k, s in SWITCHES.items()}
    if cell not in SWITCHES:
        raise ValueError(f"unknown protocol cell {cell!r}; expected one of {list(CELLS)}")
    s = SWITCHES[cell]
    out = dict(base)
    out[cell] = s.v3 if base[cell] == s.authors else s.authors
    return out


def train_key(proto: dict) -> str:
    """Cells with equal keys share their models: ``per_batch-transformers``."""
    return f"{proto['padding']}-{proto['init']}"


def parse_train_key(key: str) -> tuple[str, str]:
    padding, _, init = key.partition("-")
    if padding not in ("per_batch", "per_example") or init not in ("transformers", "torch"):
        raise ValueError(f"not a training key: {key!r} (expected like 'per_example-torch')")
    return padding, init


def describe(proto: dict) -> str:
    return (
        f"padding={proto['padding']}, init={proto['init']}, G={proto['g_normalization']}, "
        f"site={proto['site']}, n_eval={proto['n_eval']}, roles={proto['role_boundary']}"
    )
