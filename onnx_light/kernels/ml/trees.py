"""Tree ensembles of ai.onnx.ml: TreeEnsembleRegressor, TreeEnsembleClassifier (opsets 1 and
3, the ``*_as_tensor`` attributes of 3 included) and TreeEnsemble (opset 5).

Both attribute layouts become one :class:`Forest` at construction: flat per-node arrays with
children by index and a run of (target, weight) pairs per leaf, checked once (every child
exists, no tree loops back on itself). The rows then go through the compiled loop of
:mod:`~onnx_light.kernels.ml.tree_walk`, in blocks of rows across the session's threads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import Kernel, NodeContext, numpy_dtype
from ..compiled import read_only
from ..declaration import KernelDeclaration, declare, dispatch_table
from .linear import labels_of_scores
from .transforms import (
    DOMAIN,
    NUMERIC_INPUTS,
    as_features,
    class_labels,
    post_transform,
    post_transform_named,
)
from .tree_walk import AVERAGE, LEAF, MAX, MEMBER, MIN, MODES, SUM, initial_scores, walk_rows

__all__ = [
    "DECLARATIONS", "KERNELS", "Forest", "TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor",
]

AGGREGATES = {"AVERAGE": AVERAGE, "SUM": SUM, "MIN": MIN, "MAX": MAX}
# Walks (rows x trees) per block below which a run stays on one thread: a walk takes tens of
# nanoseconds, a pool region some microseconds.
MINIMUM_WALKS_PER_BLOCK = 4096


@dataclass(frozen=True)
class Forest:
    """Trees as flat arrays, ready for :func:`~onnx_light.kernels.ml.tree_walk.walk_rows`."""

    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    mode: np.ndarray
    true_next: np.ndarray
    false_next: np.ndarray
    missing_true: np.ndarray
    members: np.ndarray
    member_start: np.ndarray
    member_stop: np.ndarray
    leaf_start: np.ndarray
    leaf_stop: np.ndarray
    leaf_target: np.ndarray
    leaf_weight: np.ndarray
    targets: int
    aggregate: int

    # The arrays' types, fixed (and each array a private, writable, contiguous copy) so that the
    # walk compiles once: numba types a read-only array apart from a writable one.
    _TYPES = {"mode": np.int8, "missing_true": np.uint8, "threshold": np.float64,
              "members": np.float64, "leaf_weight": np.float64}

    def __post_init__(self) -> None:
        for name in ("roots", "feature", "threshold", "mode", "true_next", "false_next",
                     "missing_true", "members", "member_start", "member_stop", "leaf_start",
                     "leaf_stop", "leaf_target", "leaf_weight"):
            array = np.array(getattr(self, name), dtype=self._TYPES.get(name, np.int64), order="C")
            object.__setattr__(self, name, array)

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.roots, self.feature, self.threshold, self.mode, self.true_next,
                self.false_next, self.missing_true, self.members, self.member_start,
                self.member_stop, self.leaf_start, self.leaf_stop, self.leaf_target,
                self.leaf_weight)

    @functools.cached_property
    def features(self) -> int:
        """How many features the input needs (one past the highest one a node reads)."""
        used = self.feature[self.mode != LEAF]
        return int(used.max()) + 1 if used.size else 0

    def compile(self) -> None:
        """Compile the walk for these arrays' types now (a run of no rows), not in a first run."""
        walk_rows(read_only(np.zeros((0, 1))), *self.arrays, self.aggregate,
                  np.zeros((0, self.targets)), 0, 0)

    def scores(self, ctx: NodeContext, x: np.ndarray, kernel: Kernel) -> np.ndarray:
        """The aggregated leaf weights of every row, float64 [N, targets] (an average divided
        by the tree count; MIN or MAX of a target no leaf gave: 0)."""
        features = read_only(np.ascontiguousarray(as_features(ctx, x, np.float64), dtype=np.float64))
        if features.shape[1] < self.features:
            raise ctx.error(f"the trees read feature {self.features - 1}, the input has "
                            f"{features.shape[1]} feature(s)")
        rows = features.shape[0]
        out = initial_scores(rows, self.targets, self.aggregate)
        arguments = (features, *self.arrays, self.aggregate, out)
        walk = walk_rows.dispatcher
        blocks = min(kernel.num_threads, rows * len(self.roots) // MINIMUM_WALKS_PER_BLOCK)
        if blocks > 1 and kernel.pool is not None:
            kernel.pool.parallel_for(rows, lambda start, stop: walk(*arguments, start, stop),
                                     max_blocks=blocks)
        else:
            walk(*arguments, 0, rows)
        if self.aggregate == AVERAGE:
            out /= len(self.roots)
        elif self.aggregate in (MIN, MAX):
            out[np.isinf(out)] = 0.0
        return out


def _lookup(ctx: NodeContext, tree_ids: np.ndarray, node_ids: np.ndarray, wanted_trees: np.ndarray,
            wanted_nodes: np.ndarray, what: str) -> np.ndarray:
    """The index of each (tree id, node id) of ``wanted`` among the nodes, or the node's error."""
    span = int(max(node_ids.max(initial=0), wanted_nodes.max(initial=0))) + 1
    keys = tree_ids * span + node_ids
    order = np.argsort(keys, kind="stable")
    wanted = wanted_trees * span + wanted_nodes
    found = np.searchsorted(keys[order], wanted)
    found = np.minimum(found, len(keys) - 1)
    bad = keys[order][found] != wanted
    if bad.any():
        k = int(np.argmax(bad))
        raise ctx.error(f"{what} names node {int(wanted_nodes[k])} of tree {int(wanted_trees[k])}, "
                        "which does not exist")
    return order[found]


def _check_acyclic(ctx: NodeContext, roots: np.ndarray, mode: np.ndarray, true_next: np.ndarray,
                   false_next: np.ndarray) -> None:
    """Walk the trees level by level: a level past the node count means a loop."""
    frontier = np.unique(roots)
    for _ in range(len(mode) + 1):
        inner = frontier[mode[frontier] != LEAF]
        if not inner.size:
            return
        frontier = np.unique(np.concatenate([true_next[inner], false_next[inner]]))
    raise ctx.error("the trees' child links form a loop")


def _leaf_runs(nodes: int, leaf_nodes: np.ndarray, targets_of: np.ndarray,
               weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """(start, stop) per node into the (target, weight) pairs sorted by their node."""
    order = np.argsort(leaf_nodes, kind="stable")
    sorted_nodes = leaf_nodes[order]
    everything = np.arange(nodes)
    return (np.searchsorted(sorted_nodes, everything, "left"),
            np.searchsorted(sorted_nodes, everything, "right"),
            np.ascontiguousarray(targets_of[order], dtype=np.int64),
            np.ascontiguousarray(weights[order], dtype=np.float64))


def _attribute_array(ctx: NodeContext, name: str, dtype: type, default: Sequence | None = None,
                     length: int | None = None) -> np.ndarray:
    """A list or tensor attribute (``name`` or ``name_as_tensor``) as an array; a required
    one missing, or one of the wrong length, is the node's error."""
    value = ctx.attribute(name)
    if value is None:
        value = ctx.attribute(f"{name}_as_tensor")
    if value is None:
        if default is None:
            raise ctx.error(f"attribute {name} is required")
        value = default if length is None or len(default) else [0] * length
    array = np.asarray(value, dtype=dtype).reshape(-1)
    if length is not None and len(array) != length:
        raise ctx.error(f"attribute {name} has {len(array)} value(s), the trees have {length} node(s)")
    return array


def legacy_forest(ctx: NodeContext, prefix: str, targets: int) -> Forest:
    """The forest of a TreeEnsembleRegressor (``prefix`` 'target') or TreeEnsembleClassifier
    ('class') node with ``targets`` outputs per row."""
    tree_ids = _attribute_array(ctx, "nodes_treeids", np.int64)
    nodes = len(tree_ids)
    if not nodes:
        raise ctx.error("the ensemble has no nodes")
    node_ids = _attribute_array(ctx, "nodes_nodeids", np.int64, length=nodes)
    names = ctx.attribute("nodes_modes")
    if names is None or len(names) != nodes:
        raise ctx.error(f"attribute nodes_modes must give one mode per node ({nodes})")
    unknown = sorted(set(names) - set(MODES[:6]) - {"LEAF"})
    if unknown:
        raise ctx.error(f"unknown node mode(s) {unknown}; valid: {[*MODES[:6], 'LEAF']}")
    codes = {name: code for code, name in enumerate(MODES)}
    mode = np.array([codes[name] for name in names], dtype=np.int8)
    inner = mode != LEAF
    true_ids = _attribute_array(ctx, "nodes_truenodeids", np.int64, length=nodes)
    false_ids = _attribute_array(ctx, "nodes_falsenodeids", np.int64, length=nodes)
    true_next = np.arange(nodes, dtype=np.int64)
    false_next = true_next.copy()
    true_next[inner] = _lookup(ctx, tree_ids, node_ids, tree_ids[inner], true_ids[inner],
                               "a true child")
    false_next[inner] = _lookup(ctx, tree_ids, node_ids, tree_ids[inner], false_ids[inner],
                                "a false child")
    _, first = np.unique(tree_ids, return_index=True)
    roots = first.astype(np.int64)
    _check_acyclic(ctx, roots, mode, true_next, false_next)
    leaf_trees = _attribute_array(ctx, f"{prefix}_treeids", np.int64)
    pairs = len(leaf_trees)
    leaf_nodes = _lookup(ctx, tree_ids, node_ids, leaf_trees,
                         _attribute_array(ctx, f"{prefix}_nodeids", np.int64, length=pairs),
                         f"a {prefix} weight")
    leaf_targets = _attribute_array(ctx, f"{prefix}_ids", np.int64, length=pairs)
    if pairs and (leaf_targets.min() < 0 or leaf_targets.max() >= targets):
        raise ctx.error(f"{prefix}_ids must lie in [0, {targets}), got {sorted(set(leaf_targets.tolist()))}")
    weights = _attribute_array(ctx, f"{prefix}_weights", np.float64, length=pairs)
    aggregate = ctx.attribute("aggregate_function", "SUM")
    if aggregate not in AGGREGATES:
        raise ctx.error(f"aggregate_function must be one of {list(AGGREGATES)}, got {aggregate!r}")
    empty = np.zeros(nodes, dtype=np.int64)
    return Forest(roots, _attribute_array(ctx, "nodes_featureids", np.int64, length=nodes),
                  _attribute_array(ctx, "nodes_values", np.float64, length=nodes), mode,
                  true_next, false_next,
                  _attribute_array(ctx, "nodes_missing_value_tracks_true", np.uint8, (), nodes),
                  np.zeros(0), empty, empty,
                  *_leaf_runs(nodes, leaf_nodes, leaf_targets, weights),
                  targets, AGGREGATES[aggregate])


def _base_values(ctx: NodeContext, targets: int) -> np.ndarray | None:
    base = ctx.attribute("base_values")
    if base is None:
        base = ctx.attribute("base_values_as_tensor")
    if base is None or not len(base):
        return None
    base = np.asarray(base, dtype=np.float64).reshape(-1)
    if len(base) not in (1, targets):
        raise ctx.error(f"base_values has {len(base)} value(s) for {targets} output(s)")
    return base


class _Trees(Kernel):
    """A tree ensemble kernel: its forest compiled at construction."""

    forest: Forest

    def _compile(self, forest: Forest) -> None:
        self.forest = forest
        forest.compile()


class TreeEnsembleRegressor(_Trees):
    op_type = "TreeEnsembleRegressor"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        targets = int(ctx.attribute("n_targets", 1))
        self._compile(legacy_forest(ctx, "target", targets))
        self.base = _base_values(ctx, targets)
        self.transform = post_transform(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        scores = self.forest.scores(self.ctx, x, self)
        if self.base is not None:
            scores += self.base
        return (self.transform(scores.astype(np.float32)),)


class TreeEnsembleClassifier(_Trees):
    op_type = "TreeEnsembleClassifier"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.labels = class_labels(ctx, "classlabels_int64s", "classlabels_strings")
        if self.labels is None:
            raise ctx.error("one of classlabels_int64s and classlabels_strings must be set")
        classes = len(self.labels)
        self._compile(legacy_forest(ctx, "class", classes))
        self.base = _base_values(ctx, classes)
        self.transform = post_transform(ctx)
        # Two classes and weights for one of them only (gradient boosting's binary form) with at
        # most one base value: that class's score s decides, as in onnxruntime. With weights all
        # positive (probabilities) s > 0.5 picks the second label and the scores are [1 - s, s];
        # otherwise s > 0 does, and the scores are [-s, s] (LOGISTIC: their logistic). The
        # post-transform applies to neither but LOGISTIC's.
        used = set(np.unique(self.forest.leaf_target).tolist())
        self.binary_class = used.pop() if classes == 2 and len(used) == 1 and (
            self.base is None or len(self.base) == 1) else None
        self.probabilities = bool((self.forest.leaf_weight >= 0).all())
        self.logistic = ctx.attribute("post_transform", "NONE") == "LOGISTIC"

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        scores = self.forest.scores(self.ctx, x, self)
        if self.base is not None:
            scores += self.base
        if self.binary_class is None:
            return labels_of_scores(self.labels, scores), self.transform(scores.astype(np.float32))
        positive = scores[:, self.binary_class].astype(np.float32)
        if self.probabilities:
            labels = self.labels[(positive > 0.5).astype(np.int64)]
            return labels, np.stack([1 - positive, positive], axis=1)
        labels = self.labels[(positive > 0).astype(np.int64)]
        pair = np.stack([-positive, positive], axis=1)
        return labels, self.transform(pair) if self.logistic else pair


class TreeEnsemble(_Trees):
    op_type = "TreeEnsemble"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._compile(self._forest(ctx))
        self.transform = post_transform_named(ctx, ctx.attribute("post_transform", 0))

    @staticmethod
    def _forest(ctx: NodeContext) -> Forest:
        feature = _attribute_array(ctx, "nodes_featureids", np.int64)
        inner = len(feature)
        mode = _attribute_array(ctx, "nodes_modes", np.int8, length=inner)
        if inner and (mode.min() < 0 or mode.max() > MEMBER):
            raise ctx.error(f"nodes_modes must lie in 0..{MEMBER} ({', '.join(MODES[:7])})")
        weights = _attribute_array(ctx, "leaf_weights", np.float64)
        leaves = len(weights)
        targets_of = _attribute_array(ctx, "leaf_targetids", np.int64, length=leaves)
        targets = int(ctx.attribute("n_targets", 1))
        if leaves and (targets_of.min() < 0 or targets_of.max() >= targets):
            raise ctx.error(f"leaf_targetids must lie in [0, {targets})")

        def children(side: str) -> np.ndarray:
            ids = _attribute_array(ctx, f"nodes_{side}nodeids", np.int64, length=inner)
            is_leaf = _attribute_array(ctx, f"nodes_{side}leafs", np.int64, length=inner) != 0
            limit = np.where(is_leaf, leaves, inner)
            if ((ids < 0) | (ids >= limit)).any():
                raise ctx.error(f"nodes_{side}nodeids name nodes or leaves that do not exist")
            return np.where(is_leaf, ids + inner, ids)

        true_next, false_next = children("true"), children("false")
        tree_roots = _attribute_array(ctx, "tree_roots", np.int64)
        if ((tree_roots < 0) | (tree_roots >= max(inner, 1))).any():
            raise ctx.error("tree_roots name nodes that do not exist")
        # A tree that is a single leaf: a root whose two children are the same leaf.
        roots = tree_roots.copy()
        if inner:
            single = ((true_next[tree_roots] == false_next[tree_roots])
                      & (true_next[tree_roots] >= inner))
            roots[single] = true_next[tree_roots][single]
        nodes = inner + leaves
        pad = np.zeros(leaves, dtype=np.int64)
        mode = np.concatenate([mode, np.full(leaves, LEAF, np.int8)])
        true_next = np.concatenate([true_next, np.arange(inner, nodes)])
        false_next = np.concatenate([false_next, np.arange(inner, nodes)])
        _check_acyclic(ctx, roots, mode, true_next, false_next)
        member_start = np.zeros(nodes, dtype=np.int64)
        member_stop = np.zeros(nodes, dtype=np.int64)
        members = np.zeros(0)
        member_nodes = np.flatnonzero(mode == MEMBER)
        if member_nodes.size:
            values = _attribute_array(ctx, "membership_values", np.float64)
            separators = np.flatnonzero(np.isnan(values))
            if len(separators) != len(member_nodes):
                raise ctx.error(f"membership_values has {len(separators)} NaN-ended set(s) for "
                                f"{len(member_nodes)} BRANCH_MEMBER node(s)")
            member_stop[member_nodes] = separators
            member_start[member_nodes] = np.concatenate([[0], separators[:-1] + 1])
            members = values
        aggregate = int(ctx.attribute("aggregate_function", SUM))
        if aggregate not in AGGREGATES.values():
            raise ctx.error(f"aggregate_function must be one of 0..3 ({', '.join(AGGREGATES)}), "
                            f"got {aggregate}")
        return Forest(
            roots, np.concatenate([feature, pad]),
            np.concatenate([_attribute_array(ctx, "nodes_splits", np.float64, length=inner),
                            np.zeros(leaves)]),
            mode, true_next, false_next,
            np.concatenate([_attribute_array(ctx, "nodes_missing_value_tracks_true", np.uint8,
                                             (), inner), np.zeros(leaves, np.uint8)]),
            members, member_start, member_stop,
            *_leaf_runs(nodes, np.arange(inner, nodes), targets_of, weights), targets, aggregate)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        dtype = x.dtype if x.dtype.kind == "f" else numpy_dtype(T.FLOAT)
        scores = self.forest.scores(self.ctx, x, self)
        return (self.transform(scores).astype(dtype),)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(TreeEnsembleRegressor, (1, 3), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(TreeEnsembleClassifier, (1, 3), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(TreeEnsemble, (5,), types=(T.FLOAT, T.DOUBLE, T.FLOAT16), domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
