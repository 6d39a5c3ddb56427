"""The matmul FLOPs a piece of work executes, counted as torch counts them
(``torch.utils.flop_counter``'s formulas: linear layers, matmuls and the unembedding,
forward and backward; not the CPU's fused attention kernels): :class:`MatmulFlops`, a
plain dispatch mode, and :func:`executed` around one call.

Not torch's FlopCounterMode: its module hooks (for its per-module breakdown, not used
here) break ``torch.autograd.grad`` on a leaf tensor. The formulas, and so the totals,
are the same.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class MatmulFlops(TorchDispatchMode):
    """Within ``with MatmulFlops() as c:``, every operator torch has a FLOP formula for
    adds its FLOPs to ``c.total``."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def executed(fn: Callable) -> float:
    """The matmul FLOPs of one call ``fn()`` (its result is dropped)."""
    with MatmulFlops() as counter:
        fn()
    return float(counter.total)
