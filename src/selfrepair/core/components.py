"""One name per component everywhere: ``L3H3`` (layer 3, head 3) and ``L1MLP``.

This module is the only place that maps those names to TransformerLens hook names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^L(\d+)MLP$")


@dataclass(frozen=True, order=True)
class Component:
    layer: int
    head: int | None  # None for the MLP of the layer

    @property
    def is_head(self) -> bool:
        return self.head is not None

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}" if self.is_head else f"L{self.layer}MLP"

    @property
    def hook(self) -> str:
        """TransformerLens hook whose output is this component's output.

        Heads are ablated at their own ``hook_z`` (before W_O), never at a slice of
        the summed attention output; an MLP at its output ``hook_mlp_out``.
        """
        if self.is_head:
            return f"blocks.{self.layer}.attn.hook_z"
        return f"blocks.{self.layer}.hook_mlp_out"

    def __str__(self) -> str:
        return self.name


def parse(name: str) -> Component:
    """Parse ``L3H3`` or ``L1MLP``; raise ValueError with the bad name otherwise."""
    m = _HEAD.match(name)
    if m:
        return Component(int(m.group(1)), int(m.group(2)))
    m = _MLP.match(name)
    if m:
        return Component(int(m.group(1)), None)
    raise ValueError(f"not a component name: {name!r} (expected like 'L3H3' or 'L1MLP')")


def all_components(n_layers: int, n_heads: int, mlps: bool = True) -> list[Component]:
    """Every component in layer order: heads of a layer first, then its MLP."""
    out: list[Component] = []
    for layer in range(n_layers):
        out.extend(Component(layer, h) for h in range(n_heads))
        if mlps:
            out.append(Component(layer, None))
    return out


def head_components(n_layers: int, n_heads: int) -> list[Component]:
    return all_components(n_layers, n_heads, mlps=False)
