"""The compiled loop of the tree ensembles: every row down every tree, leaf weights summed.

A :class:`~onnx_light.kernels.ml.trees.Forest` holds the trees as flat arrays (one entry per
node, children by index, leaves pointing at a run of (target, weight) pairs); this loop walks
a block of rows through all of them, so the pool can give each thread a block of rows. One
signature is compiled: float64 features (a float32 input is widened, which keeps every
comparison with a float32 threshold exact).
"""

from __future__ import annotations

import numpy as np

from ..compiled import compiled

__all__ = ["AVERAGE", "LEAF", "MAX", "MEMBER", "MIN", "MODES", "SUM", "initial_scores", "walk_rows"]

#: Node modes, as TreeEnsemble-5 numbers them, and LEAF for the legacy operators' leaves.
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
         "BRANCH_MEMBER", "LEAF")
MEMBER, LEAF = 6, 7
#: Aggregate functions, as TreeEnsemble-5 numbers them.
AVERAGE, SUM, MIN, MAX = 0, 1, 2, 3


@compiled
def walk_rows(x, roots, feature, threshold, mode, true_next, false_next, missing_true,
              members, member_start, member_stop, leaf_start, leaf_stop, leaf_target,
              leaf_weight, aggregate, out, start, stop):  # pragma: no cover (compiled)
    """For rows ``start:stop`` of ``x``: walk every tree from its root to a leaf, tree by tree, and
    aggregate the leaf's weights into ``out`` (initialised by the caller: zeros for SUM and
    AVERAGE, +inf for MIN, -inf for MAX). A comparison is true, or the value is NaN and the
    node sends missing values the true way (a NaN compares false but for BRANCH_NEQ, as in
    onnxruntime)."""
    for tree in range(roots.shape[0]):  # tree by tree: its nodes stay in cache for the block
        root = roots[tree]
        for row in range(start, stop):
            node = root
            while mode[node] != 7:
                value = x[row, feature[node]]
                m = mode[node]
                if value != value and missing_true[node] != 0:
                    go = True
                elif m == 0:
                    go = value <= threshold[node]
                elif m == 1:
                    go = value < threshold[node]
                elif m == 2:
                    go = value >= threshold[node]
                elif m == 3:
                    go = value > threshold[node]
                elif m == 4:
                    go = value == threshold[node]
                elif m == 5:
                    go = value != threshold[node]
                else:
                    go = False
                    for k in range(member_start[node], member_stop[node]):
                        if members[k] == value:
                            go = True
                            break
                node = true_next[node] if go else false_next[node]
            for k in range(leaf_start[node], leaf_stop[node]):
                target = leaf_target[k]
                weight = leaf_weight[k]
                if aggregate == 2:
                    if weight < out[row, target]:
                        out[row, target] = weight
                elif aggregate == 3:
                    if weight > out[row, target]:
                        out[row, target] = weight
                else:
                    out[row, target] += weight


def initial_scores(rows: int, targets: int, aggregate: int) -> np.ndarray:
    """The accumulator :func:`walk_rows` starts from for an aggregate function."""
    fill = np.inf if aggregate == MIN else -np.inf if aggregate == MAX else 0.0
    return np.full((rows, targets), fill)
