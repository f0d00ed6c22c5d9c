"""The Conv kernel: reads the node, chooses the algorithm and the plan of each call, runs it.

The kernel (:class:`ConvKernel`, every ONNX version: 1, 11, 22) computes ``Y = W * X + B`` for
``X`` of shape (N, C, D1, ..., Dk), ``W`` (M, C / group, K1, ..., Kk) and an optional bias
(M,), with explicit ``pads`` or ``auto_pad`` (NOTSET, VALID, SAME_UPPER, SAME_LOWER),
``strides``, ``dilations`` and ``group`` (depthwise included). float32 and float64 compute in
their own type; float16 and bfloat16 compute in float32 and round the result once.

Everything that depends only on the node (attributes, the configuration) is read when the
kernel is built and configured; ``run`` derives the geometry and the plan from the input
shapes (remembered per shape), and a 1x1 convolution of one group calls its compiled
product directly (:meth:`ConvKernel._run_pointwise`, its units shared by the session's
threads in a numba region from ``pointwise.minimum_flops``), the views of the weights it
was last given kept; a depthwise one (``depthwise``, ``depthwise_blocked``) calls its
compiled kernel directly too (:meth:`ConvKernel._run_depthwise`); for the settled shape
and constant weights, ``settle`` binds those calls and the stems' ``filters_blocked``
(``_Direct``), which a run takes without ``run``'s checks and problem lookup. Constant weights reach the
kernel once, at session construction, through :meth:`ConvKernel.specialize` (equal filters,
or the weights kept for winograd, whose transform :meth:`ConvKernel.settle` computes for
the tiling of the inferred shapes;
the compiled depthwise and winograd kernels are compiled there too); a runtime may also set
``epilogue`` (a fused activation, applied to each finished block), ``prologue`` (a
per-channel map of the input of a 1x1 convolution,
:class:`~onnx_light.kernels.conv.blocks.Prologue`), ``residual`` (a fourth input, added to
each finished block before the epilogue: ResNet's shortcut) and ``channel_scale`` (a fifth
input, one factor per image and input channel that X is multiplied by first:
squeeze-and-excitation's gate, applied to the smaller of X and the weights' input channels).

Equal filters. When a session's weights are constant and some filters are bitwise equal
(group 1, float and double), each distinct filter is computed once and its channel copied to
the others: equal filters then give bitwise equal channels, which one blocked BLAS product
does not (it rounds the rows of a tile in two ways). Why a model needs it: ``docs/conv.md``.

BLAS threads follow :data:`onnx_light.parallel.BLAS`, the mechanism Gemm uses: one BLAS
thread on the serial and split paths, the session's thread count on the ``"blas"`` path, never
more, the previous count restored after each call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...parallel import in_region
from ...tuning.schema import Value
from ..base import Kernel, KernelError, NodeContext, Prepared, TensorSpec, compute_dtype
from ..packed_gemm import aligned_empty
from ..window import Window, WindowAttributes
from . import winograd
from .algorithms import _ALGORITHMS
from .blocks import Prologue, _execute
from .channel_blocked import (
    BlockedCall,
    blocked_applies,
    blocked_call,
    blocked_weights,
    compile_blocked,
    padded_bias,
    vector_lanes,
)
from .columns_blocked import columns_applies, columns_weights, compile_columns
from .config import (
    _WIDE_OVERHEAD,
    DEPTHWISE_COST,
    FILTERS_BLOCKED_CHANNELS,
    SHIFTED_FILTERS,
    SHIFTED_OUTPUTS,
    TUNING_ABI,
    ConvConfig,
)
from .depthwise import (
    DepthwiseCall,
    compile_depthwise,
    depthwise_applies,
    depthwise_call,
    read_only,
    region_threads,
)
from .filter_blocked import compile_filters, filters_applies, filters_call
from .finish import FINISHED_TYPES, Finish, compile_finish, fused_parts, scale_channels
from .im2col_units import compile_units, units_applies
from .pointwise import (
    PointwiseCall,
    compile_pointwise,
    pointwise_call,
    transposed_weights,
    uses_transposed,
    vector_weights,
)
from .pointwise_rows import rows_weights, uses_rows
from .problem import REGION_ALGORITHMS, _plan, _Problem, _winograd_applies

# The problems of the shapes met so far, by everything they depend on (ConvKernel.problem);
# emptied when it holds _MAX_PROBLEMS of them.
_PROBLEMS: dict[tuple, _Problem] = {}
_MAX_PROBLEMS = 4096


@dataclass(frozen=True)
class _DistinctFilters:
    """What :meth:`ConvKernel.specialize` found: the constant weights, their distinct filters,
    per filter the index of its distinct one, and the kernel that multiplies the distinct ones."""

    weights: np.ndarray
    distinct: np.ndarray
    inverse: np.ndarray
    plain: ConvKernel


class _WinogradFilters:
    """Constant weights (set by :meth:`ConvKernel.specialize`) and their Winograd transform
    for each tiling a call uses, computed once, when first needed: :meth:`ConvKernel.settle`
    computes the one of the inferred shapes (the tiling depends on the output's size)."""

    def __init__(self, weights: np.ndarray, groups: int) -> None:
        self.weights = weights
        self.groups = groups
        self._transforms: dict[int, np.ndarray] = {}

    def filters(self, tiling: winograd.Tiling) -> np.ndarray:
        """The transformed filters (alpha^2, groups, filters, channels) for ``tiling``."""
        transformed = self._transforms.get(tiling.tile)
        if transformed is None:
            w = self.weights
            shaped = w.reshape(self.groups, w.shape[0] // self.groups, w.shape[1], 3, 3)
            transformed = winograd.transform_filters(shaped, compute_dtype(w.dtype), tiling)
            self._transforms[tiling.tile] = transformed
        return transformed


@dataclass(frozen=True)
class _BlockedWeights:
    """Constant weights and their arrangement for ``depthwise_blocked`` or
    ``filters_blocked`` (:func:`~onnx_light.kernels.conv.channel_blocked.blocked_weights`),
    made once by
    :meth:`ConvKernel.specialize`."""

    weights: np.ndarray
    arranged: np.ndarray
    bias: np.ndarray | None  # the constant bias given with them (the stem's direct call)


@dataclass(frozen=True)
class _Direct:
    """The settled problem's call bound to the constant weights ``w`` and bias ``b``
    (:meth:`ConvKernel._settle_direct`) for X of ``x_shape`` and ``dtype``: ``run(x,
    residual, given, scaled)`` returns the output, or None where the general path runs
    (``scaled``: the weights a fused channel scale made of ``w`` on this run, or None).
    ``kernel``: the kernel it was made for (a copy of it made later goes the general way).
    ``into(x, out)``: the same call for such an X (C-contiguous) with no residual, writing
    into ``out`` (C-contiguous, of the output's shape and type), with nothing checked
    (:meth:`ConvKernel.prepare`'s step); None where the call takes no given output."""

    kernel: ConvKernel
    w: np.ndarray
    b: np.ndarray | None
    x_shape: tuple[int, ...]
    dtype: np.dtype
    run: Callable[[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None],
                  np.ndarray | None]
    into: Callable[[np.ndarray, np.ndarray], None] | None = None


@dataclass(frozen=True)
class _Settled:
    """What :meth:`ConvKernel.settle` decided for the shapes the session inferred."""

    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    transformed: bool
    problem: _Problem


class ConvKernel(Kernel):
    """ONNX Conv (since versions 1, 11, 22), tunable; see the module docstring."""

    op_type: ClassVar[str] = "Conv"
    tuning_abi: ClassVar[int] = TUNING_ABI
    accepts_epilogue: ClassVar[bool] = True

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if ctx.num_inputs and ctx.num_inputs not in (2, 3):
            raise ctx.error(f"expects 2 or 3 inputs (X, W, optional B), the node has {ctx.num_inputs}")
        self.attributes = WindowAttributes.read(ctx)
        self.group = int(ctx.attribute("group", 1))
        if self.group < 1:
            raise ctx.error(f"group must be positive, got {self.group}")
        self._distinct: _DistinctFilters | None = None  # set by specialize
        self._winograd: _WinogradFilters | None = None  # set by specialize
        self._blocked: _BlockedWeights | None = None  # set by specialize
        self.prologue: Prologue | None = None  # set by the runtime's fusion
        self.residual = False  # set by the runtime's fusion: a fourth input to add
        # set by the runtime's fusion: a fifth input, one factor per image and input channel
        self.channel_scale = False
        # set by the runtime's fusion: the epilogue as (low, high) when it is a clamp (Relu,
        # Clip), which the finishing pass applies with the bias and the residual
        self.clamp: tuple[float, float] | None = None
        self._settled: _Settled | None = None  # set by settle
        # direct_1x1's fused parts for (epilogue, clamp, type) and the last weights' and
        # bias's views (_run_pointwise), kept while those stay the same objects
        self._pointwise_parts: tuple = (None, None, None, None, None)
        self._pointwise_weights: tuple = (None, None, None, None)
        # the constant weights of a 1x1 convolution of 1x1 planes and their transpose for
        # pointwise_vector, taken by settle
        self._vector_weights: tuple = (None, None)
        # the constant weights and their packed transpose for pointwise_transposed, taken by settle
        self._transposed_weights: tuple = (None, None)
        # the constant weights and their packed rows for pointwise_rows, taken by settle
        self._rows_weights: tuple = (None, None)
        # the depthwise call of the last problem, and the last weights' and bias's operands
        # for it (_run_depthwise), kept while those stay the same objects
        self._depthwise_call: tuple = (None, None)
        self._depthwise_weights: tuple = (None, None, None, None, None)
        # the settled problem's call bound to the constant weights (settle: _Direct)
        self._direct: _Direct | None = None

    def accepts_prologue(self, w_shape: Sequence[int]) -> bool:
        """Whether a :class:`Prologue` can run inside this convolution with weights of this
        shape: 1x1, stride 1, no padding (what ``direct_1x1`` computes)."""
        attributes = self.attributes
        return (len(w_shape) >= 3 and all(k == 1 for k in w_shape[2:])
                and all(s == 1 for s in attributes.strides or (1,))
                and not any(attributes.pads or (0,)))

    def specialize(self, constants: Sequence[np.ndarray | None]) -> ConvKernel | None:
        """With constant weights: a kernel that computes each distinct filter once when
        filters repeat (group 1, float or double; see the module docstring), else one that
        keeps the weights for their Winograd transforms when its convolutions may use
        winograd. Compiles what its runs will call (the depthwise kernel, the pointwise tiles,
        the finishing pass), and takes what a 1x1 convolution's runs remember (its fused
        parts, the weights' views) now: a run then changes no state of the kernel."""
        dtype = self.ctx.input_dtype(0)
        if dtype is not None:
            compile_finish(compute_dtype(dtype))
        w = constants[1] if len(constants) > 1 else None
        if w is None or w.ndim < 3:
            return None
        if self.accepts_prologue(w.shape):  # a 1x1 convolution: direct_1x1's compiled tiles
            compile_pointwise(compute_dtype(w.dtype), self.config.pointwise_product, self.num_threads,
                              uses_transposed(w.dtype, 2, self.config.pointwise_transposed),
                              uses_rows(w.dtype, max(2, self.config.pointwise_rows),
                                        self.config.pointwise_rows))
            if w.dtype in FINISHED_TYPES and w.flags.c_contiguous:  # what its runs remember, now
                self._pointwise_fused(w.dtype)
                self._pointwise_operands(w, constants[2] if len(constants) > 2 else None)
        if self._compiles_depthwise(w):
            compile_depthwise(compute_dtype(w.dtype), w.shape[-1], self.num_threads)
        if units_applies(compute_dtype(w.dtype), w.ndim - 2, self.group) and self.config.algorithm in (
                "auto", "im2col_units"):
            compile_units(compute_dtype(w.dtype), self.num_threads)
        if w.ndim >= 3 and w.shape[1] == 1 and self.group > 1:  # depthwise: settle takes its operands
            self._depthwise_weights = (w, constants[2] if len(constants) > 2 else None, None, None, None)
        return (self._with_distinct_filters(w) or self._with_winograd_filters(w)
                or self._with_blocked_weights(w, constants[2] if len(constants) > 2 else None))

    def _with_blocked_weights(self, w: np.ndarray, b: np.ndarray | None) -> ConvKernel | None:
        """The kernel with the weights arranged for ``depthwise_blocked`` or
        ``filters_blocked`` when its runs may use it (compiled now)."""
        algorithm = self.config.algorithm
        attributes = self.attributes
        if w.ndim == 3 and w.dtype == np.float32 and vector_lanes() > 0 and (
                algorithm == "columns_blocked"
                or (algorithm == "auto" and self._columns(w.shape[1], w.shape[2:], self.group))):
            compile_columns(self.num_threads)
            return self.variant(_blocked=_BlockedWeights(w, columns_weights(w, self.group), b))
        if (filters_applies(w.dtype, w.ndim - 2, self.group, tuple(attributes.dilations or (1,)))
                and (algorithm == "filters_blocked"
                     or (algorithm == "auto" and self._stem(w.shape[1], w.shape[2:])))):
            compile_filters(self.num_threads)
            return self.variant(_blocked=_BlockedWeights(w, blocked_weights(w), b))
        if not (self._compiles_depthwise(w) or algorithm == "depthwise_blocked"):
            return None
        if not (blocked_applies(w.dtype, w.ndim - 2, w.shape[1], self.group, w.shape[0],
                                tuple(attributes.dilations or (1,)))
                and (algorithm == "depthwise_blocked" or self.config.blocked_outputs > 0)):
            return None
        compile_blocked(self.num_threads)
        return self.variant(_blocked=_BlockedWeights(w, blocked_weights(w), b))

    def _columns(self, group_channels: int, kernel: Sequence[int], groups: int) -> bool:
        """Whether ``auto`` computes a 1-D convolution with ``columns_blocked`` (where it
        applies): not 1x1, not depthwise, at most ``columns_blocked.maximum_channels`` input
        channels per group (docs/model-zoo.md, "wav2vec2")."""
        return (len(kernel) == 1 and kernel[0] != 1 and not (group_channels == 1 and groups > 1)
                and group_channels <= self.config.columns_channels)

    def _stem(self, group_channels: int, kernel: Sequence[int]) -> bool:
        """Whether ``auto`` computes a full convolution with ``filters_blocked`` (where it
        applies): few input channels and taps, not 1x1 (docs/conv.md)."""
        return (group_channels <= FILTERS_BLOCKED_CHANNELS and any(k != 1 for k in kernel)
                and group_channels * math.prod(kernel) <= self.config.filters_blocked_taps)

    def _compiles_depthwise(self, w: np.ndarray) -> bool:
        """Whether runs with these (constant) weights use the compiled ``depthwise``."""
        algorithm = self.config.algorithm
        return ((w.dtype.kind == "f" or w.dtype.name == "bfloat16")
                and depthwise_applies(w.ndim - 2, w.shape[1], self.group)
                and (algorithm == "depthwise"
                     or (algorithm == "auto" and self.config.auto_depthwise == "depthwise")))

    def _with_winograd_filters(self, w: np.ndarray) -> ConvKernel | None:
        if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            return None
        if not _winograd_applies(w.shape[2:], self.attributes.strides, self.attributes.dilations):
            return None
        algorithm = self.config.algorithm
        if algorithm == "auto":
            group_filters = w.shape[0] // self.group
            if (not self._winograd_channels(w.shape[1], group_filters)
                    and min(w.shape[1], group_filters) < self.config.large_tile_channels):
                return None  # neither tiling's channel threshold holds
        elif algorithm != "winograd":
            return None
        winograd.compile_transforms(compute_dtype(w.dtype))
        return self.variant(_winograd=_WinogradFilters(w, self.group))

    def _winograd_channels(self, group_channels: int, group_filters: int) -> bool:
        """Whether ``auto`` may use F(2x2, 3x3) for a group this wide (its channel threshold)."""
        return min(group_channels, group_filters) >= self.config.winograd_channels

    def _large_tile(self, group_channels: int, group_filters: int, outputs: int) -> bool:
        """Whether winograd computes F(4x4, 3x3) for a group this wide and this many output
        positions (its two thresholds)."""
        config = self.config
        return (min(group_channels, group_filters) >= config.large_tile_channels
                and outputs >= config.large_tile_outputs)

    def _with_distinct_filters(self, w: np.ndarray) -> ConvKernel | None:
        if self.group != 1 or w.shape[0] < 2 or w.dtype not in (np.float32, np.float64):
            return None
        bits = w.reshape(w.shape[0], -1).view(np.int32 if w.dtype == np.float32 else np.int64)
        # Equal filters have equal sums of their bits: one pass groups them (and rules most
        # weights out); each filter is then compared bit for bit with the first of its group.
        first_of, inverse = np.unique(bits.sum(axis=1, dtype=np.int64), return_index=True,
                                      return_inverse=True)[1:]
        if len(first_of) == w.shape[0] or not np.array_equal(bits, bits[first_of[inverse]]):
            return None  # all distinct, or two distinct filters share a sum: keep it simple
        # the distinct filters' product alone
        plain = self.variant(epilogue=None, residual=False, channel_scale=False)
        return self.variant(_distinct=_DistinctFilters(w, np.ascontiguousarray(w[first_of]),
                                                       inverse.reshape(-1), plain))

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.config = ConvConfig.from_values(values)

    def settle(self, input_shapes: Sequence[tuple[int, ...] | None]) -> ConvKernel | None:
        """A kernel holding the algorithm and parallel plan (:meth:`problem`) for X and W of
        the inferred shapes, decided once here instead of on every run."""
        x, w = (*input_shapes, None, None)[:2]
        if x is None or w is None or self._distinct is not None:
            return None
        transformed = self._winograd is not None  # the plan passes the weights it transformed
        try:
            problem = self.problem(x, w, transformed)
        except KernelError:
            return None  # a run with these shapes reports it
        if transformed and problem.algorithm == "winograd":
            self._winograd.filters(winograd.TILINGS[problem.tile])
        settled = self.variant(_settled=_Settled(tuple(x), tuple(w), transformed, problem))
        if problem.algorithm in ("depthwise", "depthwise_blocked"):
            settled._settle_depthwise(problem)
        constant = self._pointwise_weights[0]
        if problem.algorithm == "direct_1x1" and math.prod(x[2:]) == 1 and constant is not None:
            settled._vector_weights = (constant, vector_weights(constant))
        if (problem.algorithm == "direct_1x1" and constant is not None and problem.groups == 1
                and uses_rows(constant.dtype, math.prod(x[2:]), self.config.pointwise_rows)):
            settled._rows_weights = (constant, rows_weights(constant))
        elif (problem.algorithm == "direct_1x1" and constant is not None and problem.groups == 1
                and uses_transposed(constant.dtype, math.prod(x[2:]), self.config.pointwise_transposed)):
            settled._transposed_weights = (constant, transposed_weights(constant))
        settled._direct = settled._settle_direct(problem)
        return settled

    def _settle_direct(self, problem: _Problem) -> _Direct | None:
        """The settled problem's compiled call bound to the constant weights and bias
        (``direct_1x1`` without a prologue, ``depthwise``, ``depthwise_blocked``,
        ``filters_blocked``: the stems), which :meth:`_run` takes for X of the settled shape
        and type, C-contiguous, and those weights: the calls of the general path, with what
        they decide from the shapes and the constants decided once (the last three's calls
        bound by their call objects, ``bind``, to their compiled entries: no argument typed
        per run)."""
        settled, dtype = self._settled, self.ctx.input_dtype(0)
        if settled is None or dtype is None or compute_dtype(dtype) != dtype:
            return None
        if problem.algorithm == "direct_1x1" and self.prologue is None:
            w, b = self._pointwise_weights[:2]
            if w is None:
                return None
            return _Direct(self, w, b, settled.x_shape, np.dtype(dtype),
                           *self._bound_pointwise(problem, np.dtype(dtype), w, b))
        if problem.algorithm in ("depthwise", "depthwise_blocked") and not self.residual:
            w, b, call = self._depthwise_weights[:3]
            if call is None or self.prologue is not None or problem.depth == 0:
                return None  # no call taken (another type or layout): the general path
            threads = self.num_threads if problem.plan == "region" else 1
            if isinstance(call, BlockedCall):
                fused = self._pointwise_fused(np.dtype(dtype))
                bound = call.bind(*self._depthwise_weights[3:], problem.batch * problem.groups,
                                  *fused[3], fused[4], threads)
                views = ((-1,), (-1,))  # flat
            else:  # the kernel applies a fused clamp; any other epilogue runs on its blocks
                clamp = (-np.inf, np.inf) if self.clamp is None else self.clamp
                bound = call.bind(*self._depthwise_weights[3:], problem.batch * problem.filters,
                                  clamp, self.epilogue if self.clamp is None else None, threads)
                views = (call.x_shape, call.out_shape)
            return _Direct(self, w, b, settled.x_shape, np.dtype(dtype),
                           *self._bound_direct(problem, bound, *views))
        blocked = self._blocked
        if (problem.algorithm == "filters_blocked" and not self.residual and blocked is not None
                and dtype == np.float32 and problem.depth > 0):
            fused = self._pointwise_fused(np.dtype(np.float32))
            bound = filters_call(problem).bind(blocked.arranged,
                                               padded_bias(blocked.bias, problem.filters),
                                               problem.batch, *fused[3], fused[4],
                                               self.num_threads if problem.plan == "region" else 1)
            return _Direct(self, blocked.weights, blocked.bias, settled.x_shape, np.dtype(dtype),
                           *self._bound_direct(problem, bound, (-1,), (-1,)))
        return None

    def _bound_pointwise(self, problem: _Problem, dtype: np.dtype, w: np.ndarray,
                         b: np.ndarray | None) -> tuple[Callable[
                             [np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None],
                             np.ndarray | None], Callable[[np.ndarray, np.ndarray], None] | None]:
        """The :class:`_Direct` run and ``into`` of ``direct_1x1`` by the constant ``w`` and
        ``b``: where its call runs on one numba thread, the call bound to them and to the fused
        parts (:meth:`~onnx_light.kernels.conv.pointwise.PointwiseCall.bind`; ``into`` where it
        aligns no output), else (and for weights a channel scale made on this run)
        :meth:`_run_pointwise` and no ``into``."""
        pointwise = self._run_pointwise

        def general(x: np.ndarray, residual: np.ndarray | None, given: np.ndarray | None,
                    scaled: np.ndarray | None) -> np.ndarray | None:
            return pointwise(problem, x, w if scaled is None else scaled, b, residual)

        chosen = None
        if problem.groups == 1 and dtype in FINISHED_TYPES and w.flags.c_contiguous:
            chosen = self._pointwise_chosen(problem, self._settled.x_shape, dtype, w, b, True)
        if chosen is None or chosen[4] > 1:
            return general, None
        call, weights, bias, blas_threads, _ = chosen
        parts = self._pointwise_fused(dtype)
        bound, after = call.bind(weights, bias, *parts[3], blas_threads), parts[4]
        residual_of = self._pointwise_residual

        def run(x: np.ndarray, residual: np.ndarray | None, given: np.ndarray | None,
                scaled: np.ndarray | None) -> np.ndarray | None:
            if scaled is not None:
                return general(x, residual, given, scaled)
            if residual is not None:
                residual = residual_of(call, dtype, residual)
                if residual is False:
                    return None  # the general path reports it
            out = bound(x, residual)
            if after is not None:  # an epilogue with no compiled form, after the finishing
                after(out)
            return out

        if call.aligns(dtype):
            return run, None
        if after is None:
            def into(x: np.ndarray, out: np.ndarray) -> None:
                bound(x, None, out)
        else:
            def into(x: np.ndarray, out: np.ndarray) -> None:
                after(bound(x, None, out))

        return run, into

    @staticmethod
    def _bound_direct(problem: _Problem, bound: Callable[[np.ndarray, np.ndarray], None],
                      x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[Callable[
                          [np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None],
                          np.ndarray | None], Callable[[np.ndarray, np.ndarray], None] | None]:
        """A :class:`_Direct` run and ``into`` of ``bound`` (a call object's bound call): X
        viewed as ``x_shape``, the output (``given`` when it fits, else new) as ``out_shape``;
        None (the general path) for weights a channel scale made on this run or an empty
        output (and no ``into``)."""
        shape = (problem.batch, problem.filters, *problem.window.output)
        if math.prod(shape) == 0:
            return (lambda x, residual, given, scaled: None), None

        def run(x: np.ndarray, residual: np.ndarray | None, given: np.ndarray | None,
                scaled: np.ndarray | None) -> np.ndarray | None:
            if scaled is not None:
                return None
            if given is not None and given.shape == shape and given.dtype == x.dtype:
                out = given
            else:
                out = np.empty(shape, x.dtype)
            bound(x.reshape(x_shape), out.reshape(out_shape))
            return out

        def into(x: np.ndarray, out: np.ndarray) -> None:
            bound(x.reshape(x_shape), out.reshape(out_shape))

        return run, into

    def _settle_depthwise(self, problem: _Problem) -> None:
        """Take what :meth:`_run_depthwise` remembers for the settled problem now (its call,
        the fused parts, the constant weights' operands): a run then changes no state."""
        dtype = self.ctx.input_dtype(0)
        if dtype is None or compute_dtype(dtype) not in FINISHED_TYPES:
            return
        blocked = problem.algorithm == "depthwise_blocked"
        call = blocked_call(problem) if blocked else depthwise_call(problem)
        self._depthwise_call = (problem, call)
        if blocked:
            self._pointwise_fused(np.dtype(np.float32))
        w, b = self._depthwise_weights[:2]
        if w is not None and w.flags.c_contiguous:
            self._depthwise_weights = (w, b, call, *self._depthwise_operands(call, w, b))

    def decisions(self) -> Mapping[str, Any]:
        """The settled algorithm and parallel plan."""
        settled = self._settled
        return {} if settled is None else {"algorithm": settled.problem.algorithm,
                                           "parallel plan": settled.problem.plan}

    # ---------------------------------------------------------------- planning

    def problem(self, x_shape: Sequence[int], w_shape: Sequence[int], transformed: bool = False) -> _Problem:
        """Check the shapes and decide the algorithm and the parallel plan of one call;
        ``transformed``: the kernel holds the Winograd transform of the call's weights.

        A pure function of the node's attributes and input type, the configuration, the
        thread count and the shapes, remembered for the shapes already met (:data:`_PROBLEMS`):
        a model meets few, and deciding costs more than a small convolution's arithmetic."""
        key = (self.attributes, self.group, self.ctx.input_dtype(0), self.config, self.num_threads,
               tuple(x_shape), tuple(w_shape), transformed)
        problem = _PROBLEMS.get(key)
        if problem is None:
            problem = self._decide(x_shape, w_shape, transformed)
            if len(_PROBLEMS) >= _MAX_PROBLEMS:
                _PROBLEMS.clear()
            _PROBLEMS[key] = problem
        return problem

    def _decide(self, x_shape: Sequence[int], w_shape: Sequence[int], transformed: bool) -> _Problem:
        ctx = self.ctx
        if len(x_shape) < 3:
            raise ctx.error(f"X must have shape (N, C, D1, ...), got {list(x_shape)}")
        if len(w_shape) != len(x_shape):
            raise ctx.error(f"W must have the rank of X ({len(x_shape)}), got shape {list(w_shape)}")
        batch, channels = int(x_shape[0]), int(x_shape[1])
        filters, group_channels = int(w_shape[0]), int(w_shape[1])
        groups = self.group
        if group_channels * groups != channels:
            raise ctx.error(f"X has {channels} channels but W expects {group_channels} per group "
                            f"x {groups} groups")
        if filters % groups:
            raise ctx.error(f"W's {filters} filters do not divide into {groups} groups")
        window = self.attributes.window(ctx, tuple(int(d) for d in x_shape[2:]),
                                        tuple(int(k) for k in w_shape[2:]))
        algorithm = self._algorithm(window, group_channels, groups, filters, transformed)
        config = self.config
        threads = self.num_threads
        flops = batch * filters * math.prod(window.output) * group_channels * math.prod(window.kernel)
        if algorithm in ("depthwise", "depthwise_blocked"):
            flops *= DEPTHWISE_COST
        tile = 0
        if algorithm == "winograd":
            tile = 4 if self._large_tile(group_channels, filters // groups, math.prod(window.output)) else 2
        problem = _Problem(window, batch, channels, groups, filters, algorithm, "serial", tile)
        if algorithm in REGION_ALGORITHMS:  # both threads inside the compiled call, or one
            if threads < 2 or flops < config.region_flops or config.split == "blas":
                return problem
            return dataclasses.replace(problem, plan="region")
        if threads < 2 or flops < config.minimum_flops:
            return problem
        return dataclasses.replace(problem, plan=_plan(config.split, problem, threads))

    def _algorithm(self, window: Window, group_channels: int, groups: int, channels_out: int,
                   transformed: bool) -> str:
        """The algorithm of one call. The code below is ``auto``'s rule (the first that applies,
        in order; why each threshold: docs/conv.md); a forced algorithm that does not apply
        falls back to im2col."""
        pointwise = (all(k == 1 for k in window.kernel) and all(s == 1 for s in window.strides)
                     and not window.padded)
        depthwise = group_channels == 1 and groups > 1
        compiled_depthwise = depthwise_applies(len(window.input), group_channels, groups)
        dtype = self.ctx.input_dtype(0)
        blocked = dtype is not None and blocked_applies(dtype, len(window.input), group_channels,
                                                        groups, channels_out, window.dilations)
        filters = dtype is not None and filters_applies(dtype, len(window.input), groups,
                                                        window.dilations)
        columns = dtype is not None and columns_applies(dtype, len(window.input), math.prod(window.output))
        units = dtype is not None and units_applies(compute_dtype(dtype), len(window.input), groups)
        wide = len(window.input) >= 2 and all(s == 1 for s in window.strides[1:])
        tiled = _winograd_applies(window.kernel, window.strides, window.dilations)
        choice = self.config.algorithm
        if choice == "auto":
            if pointwise:
                return "direct_1x1"
            if compiled_depthwise and self.config.auto_depthwise == "depthwise":
                if blocked and math.prod(window.output) <= self.config.blocked_outputs:
                    return "depthwise_blocked"
                return "depthwise"
            if filters and self._stem(group_channels, window.kernel):
                return "filters_blocked"
            if columns and self._columns(group_channels, window.kernel, groups):
                return "columns_blocked"
            if units and self.config.units_columns > 0:
                return "im2col_units"
            outputs = math.prod(window.output)
            if tiled and transformed and (
                    self._large_tile(group_channels, channels_out // groups, outputs)
                    or (self._winograd_channels(group_channels, channels_out // groups)
                        and outputs >= self.config.winograd_outputs)):
                return "winograd"
            if (all(s == 1 for s in window.strides) and len(window.input) >= 2
                    and SHIFTED_FILTERS * (channels_out // groups) <= group_channels
                    and math.prod(window.output) >= SHIFTED_OUTPUTS):
                return "shifted"
            if wide:
                needed = math.prod(window.output[1:])
                computed = math.prod(p for p in window.padded_shape()[1:])
                # a depthwise product is cheap next to its copy, which whole rows make faster
                # (docs/conv.md)
                if depthwise or computed <= _WIDE_OVERHEAD * needed:
                    return "im2col_wide"
            return "im2col"
        unit_strides = len(window.input) >= 2 and all(s == 1 for s in window.strides)
        applies = {"im2col": True, "im2col_wide": wide, "direct_1x1": pointwise,
                   "per_filter": pointwise, "depthwise": compiled_depthwise,
                   "depthwise_blocked": blocked, "filters_blocked": filters,
                   "columns_blocked": columns, "im2col_units": units, "winograd": tiled,
                   "shifted": unit_strides}
        return choice if applies[choice] else "im2col"

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """Multiply-adds: each output element takes C/group x kernel size of them."""
        written = super().work(input_shapes, output_shapes)
        w = input_shapes[1] if len(input_shapes) > 1 else None
        if written is None or not w:
            return None
        return written * math.prod(w[1:])

    # ---------------------------------------------------------------- running

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """:meth:`run` writing into the memory plan's buffer, for float32 inputs of the
        shapes :meth:`settle` settled (none fused in: no residual, no channel scale, no
        distinct weights), but for ``direct_1x1`` where its output must be aligned (the
        general path's tiles, a large bound call's). With the settled direct call's constant
        weights and bias (checked by identity, the rest being the prepared step's contract:
        C-contiguous inputs of these specs) the step is that call into the buffer
        (``_Direct.into``), without :meth:`_run`'s checks."""
        settled = self._settled
        if (settled is None or self.residual or self.channel_scale or self._distinct is not None
                or len(inputs) not in (2, 3) or any(d != np.float32 for _, d in inputs)
                or (tuple(inputs[0][0]), tuple(inputs[1][0])) != (settled.x_shape, settled.w_shape)):
            return None
        problem = settled.problem
        direct = self._direct
        into = None if direct is None or direct.kernel is not self else direct.into
        if problem.algorithm == "direct_1x1" and into is None:
            return None
        def general(arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
            (result,) = self._run(arrays, out)
            if result is not out:  # a problem decided otherwise at run time (not settled's)
                np.copyto(out, result)

        shape = (problem.batch, problem.filters, *problem.window.output)
        if into is None:
            def prepared(*arrays: np.ndarray, out: np.ndarray) -> None:
                general(arrays, out)

            return Prepared(prepared, shape, np.dtype(np.float32))
        w, b = direct.w, direct.b

        def bound(x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None, *,
                  out: np.ndarray) -> None:
            if weights is w and bias is b:
                into(x, out)
            else:
                general((x, weights) if bias is None else (x, weights, bias), out)

        return Prepared(bound, shape, np.dtype(np.float32))

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        return self._run(inputs, None)

    def _run(self, inputs: Sequence[np.ndarray | None], given: np.ndarray | None
             ) -> Sequence[np.ndarray]:
        """:meth:`run`, writing into ``given`` (a C-contiguous array of the output's shape and
        compute type, :meth:`prepare`'s buffer) when its problem needs no aligned output."""
        if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
            raise self.ctx.error("needs inputs X and W")
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        residual = inputs[3] if self.residual and len(inputs) > 3 else None
        if self.residual and residual is None:
            raise self.ctx.error("needs the residual input (the fused addition's other operand)")
        scaled = None
        if self.channel_scale:
            x, scaled = self._scaled(x, w, inputs[4] if len(inputs) > 4 else None)
        direct = self._direct
        if (direct is not None and direct.kernel is self and w is direct.w and b is direct.b
                and x.shape == direct.x_shape and x.dtype == direct.dtype and x.flags.c_contiguous):
            out = direct.run(x, residual, given, None if scaled is w else scaled)
            if out is not None:
                return (out,)
        if scaled is not None:
            w = scaled
        if self._distinct is not None and w is self._distinct.weights:
            return self._run_distinct(x, b, residual)
        if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
            raise self.ctx.error(f"X, W and B must have the same type, got "
                                 f"{[a.dtype for a in (x, w, b) if a is not None]}")
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
            raise self.ctx.error(f"X must be a floating point tensor, got {x.dtype}")
        transformed = self._winograd is not None and w is self._winograd.weights
        settled = self._settled
        if (settled is not None and settled.x_shape == x.shape and settled.w_shape == w.shape
                and settled.transformed == transformed):
            problem = settled.problem
        else:
            problem = self.problem(x.shape, w.shape, transformed)
        if b is not None and b.shape != (problem.filters,):
            raise self.ctx.error(f"B must have shape ({problem.filters},), got {list(b.shape)}")
        if problem.algorithm == "direct_1x1" and self.prologue is None:
            out = self._run_pointwise(problem, x, w, b, residual)
            if out is not None:
                return (out,)
        if problem.algorithm in ("depthwise", "depthwise_blocked") and residual is None:
            out = self._run_depthwise(problem, x, w, b, given)
            if out is not None:
                return (out,)
        compute = compute_dtype(x.dtype)
        shape = (problem.batch, problem.filters, *problem.window.output)
        # direct_1x1's compiled tiles store whole rows of 64-byte blocks
        if (given is not None and given.shape == shape and given.dtype == compute
                and problem.algorithm != "direct_1x1"):
            out = given
        elif problem.algorithm == "direct_1x1":
            out = aligned_empty(shape, compute)
        else:
            out = np.empty(shape, compute)
        finish = self._finisher(out, residual, b is not None)
        if out.size == 0:
            return (out.astype(x.dtype, copy=False),)
        if problem.depth == 0:
            out[...] = 0 if b is None else b.astype(compute).reshape((-1,) + (1,) * len(problem.window.input))
            if finish is not None:
                finish(out)
            return (out.astype(x.dtype, copy=False),)
        xc = np.ascontiguousarray(x, dtype=compute)
        wc = np.ascontiguousarray(w, dtype=compute)
        bc = None if b is None else b.astype(compute, copy=False)
        prologue = self.prologue
        if prologue is not None and (problem.algorithm not in ("direct_1x1", "per_filter")
                                     or problem.plan == "filters"):
            xc, prologue = prologue.whole(xc), None  # every thread would need all of it
        options: dict[str, Any] = {}
        if problem.algorithm == "winograd":
            options["tiling"] = tiling = winograd.TILINGS[problem.tile]
            if transformed:
                options["filters"] = self._winograd.filters(tiling)
        if prologue is not None:  # direct_1x1 or per_filter
            options["prologue"] = prologue
        if problem.algorithm in ("depthwise_blocked", "filters_blocked", "columns_blocked"):
            if xc.dtype != np.float32:  # a node typed otherwise at construction
                problem = dataclasses.replace(problem, algorithm=(
                    "depthwise" if problem.algorithm == "depthwise_blocked" else "im2col"))
            elif self._blocked is not None and w is self._blocked.weights:
                options["arranged"] = self._blocked.arranged
        if problem.algorithm == "direct_1x1":
            options["product"] = self.config.pointwise_product
        if problem.plan == "region" and problem.algorithm in REGION_ALGORITHMS:
            options["threads"] = self.num_threads
        if problem.algorithm == "columns_blocked":
            options["tile_bytes"] = self.config.columns_tile
        if problem.algorithm == "im2col_units":
            options["columns"] = max(1, self.config.units_columns)
        algorithm = _ALGORITHMS[problem.algorithm](problem, xc, wc, bc, out, self.config.block_bytes,
                                                   finish, **options)
        _execute(problem, algorithm, self.pool, self.num_threads)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    def _run_pointwise(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                       residual: np.ndarray | None) -> np.ndarray | None:
        """``direct_1x1`` of one group straight through its compiled product
        (:func:`~onnx_light.kernels.conv.pointwise.pointwise_call`), with what depends on the
        shapes, the fused parts and the constant weights' view remembered. Its units run on
        the session's threads (a numba region) from ``pointwise.minimum_flops`` multiply-adds
        on, whatever the pool's plan, and on the calling thread below, the same units and
        bits either way; a ``blas`` plan runs them on the calling thread with the session's
        BLAS threads. An epilogue the compiled product does not apply runs on the finished
        output, as the general path runs it on each finished block. 1x1 planes take
        :func:`~onnx_light.kernels.conv.pointwise.pointwise_vector` on the calling thread (its
        own sum order: the bits of any thread count, not BLAS's). None where the general
        path runs: several groups, another type or layout, a residual it would reject, the
        packed product (``pointwise.product``) on a split plan."""
        if (problem.groups != 1 or x.dtype not in FINISHED_TYPES
                or not x.flags.c_contiguous or not w.flags.c_contiguous):
            return None
        # weights scaled on this run (a fused channel scale) are not remembered: a run then
        # changes no state of the kernel
        chosen = self._pointwise_chosen(problem, x.shape, x.dtype, w, b, not self.channel_scale)
        if chosen is None:
            return None
        call, weights, bias, blas_threads, threads = chosen
        flat_residual = self._pointwise_residual(call, x.dtype, residual)
        if flat_residual is False:
            return None  # the general path reports it
        if threads > 1 and in_region():
            threads = 1  # a branch of the graph on the pool's worker
        parts = self._pointwise_fused(x.dtype)
        out = call(x, weights, bias, flat_residual, *parts[3], blas_threads, threads)
        if parts[4] is not None:  # an epilogue with no compiled form, after the finishing
            parts[4](out)
        return out

    @staticmethod
    def _pointwise_residual(call: PointwiseCall, dtype: np.dtype, residual: np.ndarray | None
                            ) -> np.ndarray | bool | None:
        """The residual as ``call`` takes it (flat, read-only; None for none), or False for
        one of another shape or type."""
        if residual is None:
            return None
        if residual.shape != call.out_shape or residual.dtype != dtype:
            return False
        flat = np.ascontiguousarray(residual).reshape(-1)
        return read_only(flat) if flat.flags.writeable else flat

    def _pointwise_chosen(self, problem: _Problem, x_shape: tuple[int, ...], dtype: np.dtype,
                          w: np.ndarray, b: np.ndarray | None, remember: bool
                          ) -> tuple[PointwiseCall, np.ndarray, np.ndarray | None, int, int] | None:
        """What :meth:`_run_pointwise` calls for X of ``x_shape`` and ``dtype`` by ``w`` and
        ``b`` (group 1, C-contiguous): (its call, the weights and bias as it takes them, the
        BLAS threads, the numba threads, before the check of a pool's worker), the weights'
        views remembered when ``remember``; None where the general path runs."""
        constant, packed = self._transposed_weights  # the settled constant weights, packed
        rows_constant, rows = self._rows_weights
        plane = math.prod(x_shape[2:])
        by_rows = (rows_constant is w and rows is not None
                   and uses_rows(dtype, plane, self.config.pointwise_rows))
        call = pointwise_call(x_shape, w.shape, dtype, self.config.pointwise_product,
                              not by_rows and constant is w and packed is not None and uses_transposed(
                                  dtype, plane, self.config.pointwise_transposed), by_rows)
        if call is None or (call.gemm is None and not call.vector and not call.transposed
                            and not call.rows and problem.plan not in ("serial", "blas")):
            return None  # the packed product splits on the pool's plan
        operands = self._pointwise_operands(w, b, remember=remember)
        threads = self.num_threads
        if call.vector:  # 1x1 planes: the transposed weights, those settle took if constant
            constant, transposed = self._vector_weights
            return call, transposed if constant is w else vector_weights(w), operands[3], 1, 1
        if threads > 1 and call.multiply_adds < self.config.pointwise_minimum_flops:
            threads = 1  # a small product
        if call.transposed:
            return call, packed, operands[3], 1, threads
        if call.rows:
            return call, rows, operands[3], 1, threads
        if problem.plan == "blas":
            return call, operands[2], operands[3], self.num_threads, 1
        return call, operands[2], operands[3], 1, threads

    def _run_depthwise(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                       given: np.ndarray | None) -> np.ndarray | None:
        """``depthwise`` or ``depthwise_blocked`` straight through its call object
        (:func:`~onnx_light.kernels.conv.depthwise.depthwise_call`,
        :func:`~onnx_light.kernels.conv.channel_blocked.blocked_call`), without the algorithm
        object and the plan's layers, with the call of the last problem, the fused parts and
        the last weights' operands remembered: the same compiled calls with the same arguments
        as the general path, so the same bits, its threads split inside the call on plan
        ``region`` as there. Writes into ``given`` (:meth:`prepare`'s buffer) when it fits.
        None where the general path runs: a prologue, another type or layout
        (``depthwise_blocked`` takes float32), an empty output or sum."""
        dtype = x.dtype
        if (self.prologue is not None or dtype not in FINISHED_TYPES or problem.depth == 0
                or not x.flags.c_contiguous or not w.flags.c_contiguous):
            return None
        blocked = problem.algorithm == "depthwise_blocked"
        if blocked and dtype != np.float32:
            return None
        shape = (problem.batch, problem.filters, *problem.window.output)
        if given is not None and given.shape == shape and given.dtype == dtype:
            out = given
        else:
            out = np.empty(shape, dtype)
        if out.size == 0:
            return None
        last, call = self._depthwise_call
        if last is not problem:
            call = blocked_call(problem) if blocked else depthwise_call(problem)
            self._depthwise_call = (problem, call)
        operands = self._depthwise_weights
        if operands[0] is not w or operands[1] is not b or operands[2] is not call:
            operands = (w, b, call, *self._depthwise_operands(call, w, b))
            if not self.channel_scale:  # weights scaled on this run are not remembered
                self._depthwise_weights = operands
        threads = region_threads(self.num_threads) if problem.plan == "region" else 1
        if blocked:
            flat_x = x.reshape(-1)
            if flat_x.flags.writeable:  # a session's feeds and values are read-only already
                flat_x = read_only(flat_x)
            # the clamp, the compiled activation and what runs after, as the general path fuses them
            fused = self._pointwise_fused(dtype)
            call.run(flat_x, operands[3], operands[4], out.reshape(-1), 0,
                     problem.batch * problem.groups, *fused[3], fused[4], threads)
        else:
            planes = x.reshape(call.x_shape)
            if planes.flags.writeable:
                planes = read_only(planes)
            # the kernel applies a fused clamp; any other epilogue runs on its blocks
            clamp = (-np.inf, np.inf) if self.clamp is None else self.clamp
            after = self.epilogue if self.clamp is None else None
            call.run(planes, operands[3], operands[4], out.reshape(call.out_shape), 0,
                     problem.batch * problem.filters, clamp, after, threads)
        return out

    def _depthwise_operands(self, call: DepthwiseCall | BlockedCall, w: np.ndarray,
                            b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The weights and bias as ``call`` takes them: read-only views (zeros for no bias)
        for ``depthwise``; for ``depthwise_blocked`` arranged, those :meth:`specialize`
        arranged when ``w`` is its constant weights."""
        if isinstance(call, BlockedCall):
            arranged = (self._blocked.arranged if self._blocked is not None
                        and w is self._blocked.weights else blocked_weights(w))
            return arranged, padded_bias(b, call.channels)
        return (read_only(w.reshape(call.w_shape)),
                read_only(np.zeros(call.w_shape[0], w.dtype) if b is None else b))

    def _pointwise_fused(self, dtype: np.dtype) -> tuple:
        """The fused parts ``direct_1x1``'s compiled call takes for ``dtype`` (and what runs
        after it), remembered while the epilogue and clamp stay the same."""
        parts = self._pointwise_parts
        # (parts[2] is None first: numpy reads None as float64, so None == float64 holds)
        if (parts[0] is not self.epilogue or parts[1] != self.clamp or parts[2] is None
                or parts[2] != dtype):
            fused = fused_parts(Finish(np.empty(0, dtype), None, self.epilogue, self.clamp), dtype)
            parts = self._pointwise_parts = (self.epilogue, self.clamp, dtype, fused[1:3], fused[3])
        return parts

    def _pointwise_operands(self, w: np.ndarray, b: np.ndarray | None, remember: bool = True
                            ) -> tuple:
        """``w`` and ``b`` and their read-only views as the compiled call takes them (filters
        by depth, flat), remembered (``remember``) while they stay the same arrays."""
        operands = self._pointwise_weights
        if operands[0] is not w or operands[1] is not b:
            operands = (w, b, read_only(w.reshape(w.shape[0], -1)),
                        None if b is None else read_only(np.ascontiguousarray(b)))
            if remember:
                self._pointwise_weights = operands
        return operands

    def _scaled(self, x: np.ndarray, w: np.ndarray, scale: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
        """X and W of the convolution of ``x * scale`` (the fused squeeze-and-excitation
        product; ``scale`` (N, C, 1, ...)), in one compiled pass
        (:func:`~onnx_light.kernels.conv.finish.scale_channels`) over the smaller of the two:
        the weights' input channels (group 1, one scale for every image: the deep layers'
        weights outgrow their 7x7 planes, the early layers' planes their weights), else X,
        whose products are then the unfused Mul's, bit for bit. Constant weights packed once
        for the rows or transposed product keep it: X is scaled (EfficientNet-B0's
        projections, docs/conv.md)."""
        if scale is None:
            raise self.ctx.error("needs the channel scale input (the fused Mul's other operand)")
        shape, x_shape = scale.shape, x.shape
        if (len(shape) != len(x_shape) or shape[1] != x_shape[1] or shape[0] not in (1, x_shape[0])
                or scale.size != shape[0] * shape[1] or scale.dtype != x.dtype
                or (scale.size == 0 and any(d != 1 for d in shape[2:]))):
            raise self.ctx.error(f"the channel scale must have shape [{x_shape[0]}, {x_shape[1]}"
                                 f"{', 1' * (x.ndim - 2)}] and X's type {x.dtype}, got "
                                 f"{list(shape)} {scale.dtype}")
        if x.dtype not in FINISHED_TYPES:
            return np.multiply(x, scale), w
        factors = np.ascontiguousarray(scale.reshape(-1))
        packed = self._rows_weights[0] is w or self._transposed_weights[0] is w
        if (not packed and self.group == 1 and w.size < x.size and w.dtype == x.dtype and w.ndim == x.ndim
                and w.shape[1] == x_shape[1] and (shape[0] == 1 or x_shape[0] == 1)):
            source, by_row, inner = w, False, x_shape[1]
        else:
            if shape[0] != x_shape[0]:  # one scale for every image, one factor per row
                factors = np.tile(factors, x_shape[0])
            source, by_row, inner = x, True, x.size // max(1, x_shape[0] * x_shape[1])
        out = np.empty(source.shape, source.dtype)
        if out.size:
            scale_channels.dispatcher(np.ascontiguousarray(source).reshape(-1), factors,
                                      out.reshape(-1), inner, by_row)
        return (out, w) if by_row else (x, out)

    def _run_distinct(self, x: np.ndarray, b: np.ndarray | None,
                      residual: np.ndarray | None) -> Sequence[np.ndarray]:
        """Each distinct filter once, then its channel copied to every filter equal to it."""
        inverse = self._distinct.inverse
        if b is not None and (b.shape != inverse.shape or b.dtype != x.dtype):
            raise self.ctx.error(f"B must have shape ({inverse.size},) and X's type {x.dtype}, got "
                                 f"{list(b.shape)} {b.dtype}")
        channels = self._distinct.plain.run(x, self._distinct.distinct)[0]
        out = np.take(channels, inverse, axis=1)
        if b is not None:
            out += b.reshape((-1,) + (1,) * (out.ndim - 2))
        finish = self._finisher(out, residual, False)
        if finish is not None:
            finish(out)
        return (out,)

    def _finisher(self, out: np.ndarray, residual: np.ndarray | None, bias: bool
                  ) -> Callable[[np.ndarray], None] | None:
        """What each finished block of ``out`` gets, a :class:`Finish` (one pass with the
        bias where it can): the residual's same elements added (a block is a view into
        ``out``; the residual, laid out like ``out``, is read at the block's offset), then the
        epilogue; None when there is nothing to do."""
        epilogue = self.epilogue
        if residual is None and self.clamp is None and (not bias or out.dtype not in FINISHED_TYPES):
            return epilogue
        if residual is not None and (residual.shape != out.shape or residual.dtype != out.dtype):
            raise self.ctx.error(f"the residual must have the output's shape {list(out.shape)} "
                                 f"and type {out.dtype}, got {list(residual.shape)} {residual.dtype}")
        flat = None if residual is None else np.ascontiguousarray(residual).reshape(-1)
        return Finish(out, flat, epilogue, self.clamp)


