"""One Conv call's shapes and choices, and how its work is split across the pool."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..window import Window
from .config import ROWS_PER_THREAD


@dataclass(frozen=True)
class _Problem:
    """One call's shapes and choices; built at the start of :meth:`ConvKernel.run`."""

    window: Window
    batch: int
    channels: int
    groups: int
    filters: int
    algorithm: str
    plan: str  # "serial", "blas", "batch_and_groups", "output_rows", "filters", "region"
    tile: int = 0  # winograd's outputs per tile along each axis: 2 or 4 (F(2x2, 3x3), F(4x4, 3x3))

    @property
    def group_channels(self) -> int:
        return self.channels // self.groups

    @property
    def group_filters(self) -> int:
        return self.filters // self.groups

    @property
    def depth(self) -> int:
        """K: products summed per output element."""
        return self.group_channels * math.prod(self.window.kernel)


#: The compiled kernels that split their work inside their call (plan ``region``: one numba
#: region over the session's threads), never on the pool.
REGION_ALGORITHMS = frozenset({"depthwise", "depthwise_blocked", "filters_blocked", "columns_blocked",
                               "im2col_units"})


def _winograd_applies(kernel: Sequence[int], strides: Sequence[int] | None,
                      dilations: Sequence[int] | None) -> bool:
    """Whether winograd can compute a convolution: 2-D, 3x3, stride 1 and dilation 1."""
    return (tuple(kernel) == (3, 3) and all(s == 1 for s in strides or (1,))
            and all(d == 1 for d in dilations or (1,)))



def _plan(split: str, problem: _Problem, threads: int) -> str:
    """The parallel plan on the pool of a call that is worth more than one thread (not for
    :data:`REGION_ALGORITHMS`, which split inside their compiled call)."""
    if split == "blas":
        return "blas"
    items = problem.batch * problem.groups
    if split == "auto":
        many_filters = problem.group_filters > math.prod(problem.window.output)
        if items >= threads and (items % threads == 0 or items >= 4 * threads):
            split = "batch_and_groups"
        elif many_filters and (all(k == 1 for k in problem.window.kernel)
                               or problem.window.output[0] < ROWS_PER_THREAD * threads):
            # few output positions: share them, split the weights (of a 1x1 convolution,
            # strided or padded too, the weights are most of what each thread would pack)
            split = "filters"
        else:
            split = "output_rows"
    sizes = {"batch_and_groups": items, "output_rows": problem.window.output[0],
             "filters": problem.filters}
    order = {"batch_and_groups": ("batch_and_groups", "output_rows", "filters"),
             "output_rows": ("output_rows", "filters", "batch_and_groups"),
             "filters": ("filters", "output_rows", "batch_and_groups")}[split]
    for plan in order:
        if sizes[plan] >= 2:
            return plan
    return "blas"

