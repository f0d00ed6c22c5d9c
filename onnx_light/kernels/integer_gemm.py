"""The tunable integer product that MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv
share: rows of bytes times rows of bytes into int32 sums, then an epilogue per block.

Both operands are :class:`ByteRows`, matrices of uint8 or int8 whose rows run along the reduced
axis, with a zero point per row. ``product(left, right)`` computes
``(left - left.zero) @ (right - right.zero).T`` exactly in int32 (wrapping modulo 2**32), adds
an int32 bias per column, and hands each finished block to an epilogue (the QLinear
operators' requantization) while it is in cache.

Parameters (one schema per operator and element type, :func:`integer_parameters`):

``product.algorithm``
    ``"packed"``: the register-blocked byte dot-product micro-kernel of
    :func:`~onnx_light.kernels.integer_loops.packed_sums` on a right operand packed in panels
    (:class:`PackedColumns`), requantizing as it writes: one ``vpdpbusd`` per four byte
    products of eight lanes where the processor has VNNI, portable vector code (slow) where
    not. ``"pairs"``: the same micro-kernel on operands widened to int16 pairs, one
    ``vpmaddwd`` per two products (AVX2; what processors without VNNI run fastest).
    ``"amx"``: the same on AMX tiles (:func:`~onnx_light.kernels.integer_loops.tile_sums`)
    where the processor has AMX-INT8 and Linux lets the process use them
    (:func:`~onnx_light.kernels.tile_matrices.available`), else ``"packed"``. ``"auto"`` (the
    default): the host's fastest of the three by its features (:func:`packed_layout`).
    ``"compiled"``: the byte dot
    products of :func:`~onnx_light.kernels.integer_loops.dot_tiles`, compiled by numba for
    this processor. ``"blas"``: float32 BLAS products of the raw bytes in chunks of the
    reduced axis short enough that every partial sum is an integer float32 holds exactly (at
    most 2**24: 514 terms of uint8 x int8), summed in int32. All are exact, so they give
    identical outputs; which is fastest depends on the processor's instructions and BLAS.
``tile.rows``, ``tile.columns``
    ``auto``, ``packed``, ``pairs``, ``amx``: the rows and columns of a block (rounded up
    to whole micro-tiles) whose left rows stay in cache while its columns stream.
    ``compiled``: the rows of each operand one tile reads while it stays in cache, and the
    smallest parallel block.
``parallel.minimum_macs``
    Multiply-adds (rows x columns x depth) from which the product's output is split across the
    session's pool (along its longer side).

docs/quantization.md has the measurements behind the portable defaults.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ..parallel import BLAS, get_pool
from ..tuning.calibration import Budget, CalibrationResult, configuration_search
from ..tuning.keys import ElementType as T
from ..tuning.keys import KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.schema import Parameter, Value
from . import byte_vectors, tile_matrices
from .base import Kernel, NodeContext
from .calibration import without_compilation
from .declaration import KernelDeclaration
from .integer_loops import (
    PACKED_LANES,
    PACKED_ROWS,
    TILE_LANES,
    TILE_QUADS,
    correct,
    dot_tiles,
    pack_columns,
    packed_sums,
    requantize,
    row_sums,
    tile_sums,
)

__all__ = ["ALGORITHM", "LAYOUTS", "MINIMUM_MACS", "PACKED_ALGORITHMS", "PRODUCT_CORPUS", "SHORT_WEIGHT",
           "TILE_COLUMNS", "TILE_ROWS", "ByteRows", "IntegerProductKernel", "PackedColumns", "PackedPlan",
           "Requantization", "Residual", "calibrate_integer_product", "integer_candidates",
           "integer_parameters", "no_residual", "packed_layout", "packed_product", "short_sums"]

ALGORITHM = "product.algorithm"
TILE_ROWS = "tile.rows"
TILE_COLUMNS = "tile.columns"
MINIMUM_MACS = "parallel.minimum_macs"
ALGORITHMS = ("auto", "amx", "packed", "pairs", "compiled", "blas")
#: The algorithms whose right operand is a :class:`PackedColumns`.
PACKED_ALGORITHMS = ("auto", "amx", "packed", "pairs")
#: The layouts of a :class:`PackedColumns`: those algorithms' that are not ``auto``.
LAYOUTS = ("amx", "packed", "pairs")
_DEFAULTS: dict[str, Value] = {ALGORITHM: "auto", TILE_ROWS: 64, TILE_COLUMNS: 768,
                               MINIMUM_MACS: 1 << 25}
# The largest magnitude of each byte type, for the exact float32 chunk length.
_MAGNITUDE = {np.dtype(np.uint8): 255, np.dtype(np.int8): 128}

#: ``epilogue(acc, row_start, row_stop, column_start, column_stop)``: a finished block.
Epilogue = Callable[[np.ndarray, int, int, int, int], None]
#: A requantized output: ``y`` (rows, columns), the float32 multiplier (1 or rows, 1 or
#: columns), the output zero point and the saturation range.
Requantization = tuple[np.ndarray, np.ndarray, int, int, int]
#: A residual added to a requantized output (QLinearAdd fused into its convolution): its
#: bytes (the output's shape and type) and QLinearAdd's float32 parameters
#: (:func:`~onnx_light.kernels.integer_loops.add_residual`).
Residual = tuple[np.ndarray, np.ndarray]


def integer_parameters(element_type: int | None = T.UINT8) -> tuple[Parameter, ...]:
    """The parameters of an integer product's schema (the same for every byte type)."""
    return (
        Parameter(ALGORITHM, "str", _DEFAULTS[ALGORITHM], choices=ALGORITHMS,
                  description="'auto': the host's fastest of 'amx', 'packed' and 'pairs' by its "
                              "features; 'amx': AMX tiles on packed columns where the processor "
                              "has them, else 'packed'; 'packed': register-blocked byte "
                              "dot-product instructions on packed columns; 'pairs': the same "
                              "on int16 pairs (vpmaddwd); 'compiled': numba's byte dot "
                              "products; 'blas': exact float32 BLAS products of the bytes in short "
                              "chunks of the reduced axis"),
        Parameter(TILE_ROWS, "int", _DEFAULTS[TILE_ROWS], minimum=1, maximum=4096,
                  description="rows of the left operand per tile (and the smallest parallel block)"),
        Parameter(TILE_COLUMNS, "int", _DEFAULTS[TILE_COLUMNS], minimum=1, maximum=4096,
                  description="rows of the right operand per tile (and the smallest parallel block)"),
        Parameter(MINIMUM_MACS, "int", _DEFAULTS[MINIMUM_MACS], minimum=1,
                  description="multiply-adds from which the output is split across the pool"),
    )


def packed_layout(algorithm: str) -> str:
    """The layout of the right operand (one of :data:`LAYOUTS`) a packed ``algorithm`` runs
    on in this process: ``amx`` where the tiles are available
    (:func:`~onnx_light.kernels.tile_matrices.available`), else ``packed``; ``auto`` the same
    but ``pairs`` where the processor lacks the byte dot product too
    (:func:`~onnx_light.kernels.byte_vectors.available`); ``packed`` and ``pairs`` as named."""
    if algorithm in ("packed", "pairs"):
        return algorithm
    if tile_matrices.available():
        return "amx"
    return "packed" if algorithm == "amx" or byte_vectors.available() else "pairs"


def _per_row(zero: np.ndarray | int, size: int) -> np.ndarray:
    """A zero point per row or column: int32, ``size`` values, writable (a scalar's without
    ``np.ndim``, which costs a run of a small convolution microseconds)."""
    if not isinstance(zero, np.ndarray) or zero.ndim == 0:
        values = np.empty(size, np.int32)
        values.fill(zero)
        return values
    return np.array(np.broadcast_to(np.asarray(zero, np.int32), (size,)))


class ByteRows:
    """One operand of a product: ``data`` (R, K) uint8 or int8, C-contiguous, its zero point
    per row (int32, R values) and the row sums the zero-point correction needs."""

    __slots__ = ("__dict__", "data", "zero")

    def __init__(self, data: np.ndarray, zero: np.ndarray | int) -> None:
        self.data = np.ascontiguousarray(data)
        self.zero = _per_row(zero, self.data.shape[0])

    @functools.cached_property
    def sums(self) -> np.ndarray:
        """The row sums (int32, wrapping; made when a product first needs them)."""
        sums = np.empty(self.data.shape[0], np.int32)
        if sums.size:
            row_sums.dispatcher(self.data, sums)
        return sums

    @functools.cached_property
    def magnitude(self) -> int:
        """The largest magnitude of the bytes (0 without any; made once)."""
        return int(np.abs(self.data.astype(np.int16)).max(initial=0))

    @functools.cached_property
    def real(self) -> np.ndarray:
        """The bytes as float32 (for the BLAS product; made once per operand)."""
        return self.data.astype(np.float32)

    def packed(self, layout: str = "packed") -> PackedColumns:
        """These rows as a packed algorithm's right operand in ``layout`` (one of
        :data:`LAYOUTS`; made once per layout)."""
        made = self.__dict__.setdefault("_packed", {})
        if layout not in made:
            made[layout] = PackedColumns.of(self.data.T, self.zero, layout=layout)
        return made[layout]

    def repeated(self, lanes: np.dtype, layout: str = "packed") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """These rows as a packed algorithm's left operand against right-operand lanes of
        type ``lanes`` in ``layout`` (made once per type and layout), padded with zeros to a
        multiple of four rows and of four along the reduced axis (``amx``: of 16 rows and
        64; ``pairs``: of four rows and two); their zero points and row sums. The bytes are
        those of the other signedness than ``lanes`` (uint8 ``v`` as int8 ``v - 128``, int8
        ``v`` as uint8 ``v + 128``, the zero points moved alike, so that the differences
        stay), or for ``pairs`` their values as int16."""
        made = self.__dict__.setdefault("_repeated", {})
        key = (np.dtype(lanes), layout)
        row_unit, depth_unit = {"amx": (TILE_LANES, 4 * TILE_QUADS), "packed": (PACKED_ROWS, 4),
                                "pairs": (PACKED_ROWS, 2)}[layout]
        if key not in made:
            target = np.dtype(np.int16 if layout == "pairs" else np.int8 if key[0] == np.uint8 else np.uint8)
            data, zero = self.data, self.zero
            if target.itemsize == 1 and data.dtype != target:
                data = (data.view(np.uint8) ^ np.uint8(0x80)).view(target)
                zero = zero + np.int32(128 if target == np.uint8 else -128)
            rows, depth = data.shape
            padded = np.zeros((-(-rows // row_unit) * row_unit, -(-depth // depth_unit) * depth_unit),
                              target)
            padded[:rows, :depth] = data
            sums = np.empty(padded.shape[0], np.int32)
            row_sums.dispatcher(padded, sums)
            made[key] = padded, np.array(zero, np.int32), sums
        return made[key]


class PackedColumns:
    """A packed algorithm's right operand: in the ``packed`` layout ``lanes`` (width / 8,
    ceil(K / 4), 8, 4) bytes, ``pairs`` (width / 8, ceil(K / 2), 8, 2) int16 holding the
    bytes' values, ``amx`` (width / 16, Q, 16, 4) bytes with Q rounded up to 16: the layout
    of :func:`~onnx_light.kernels.integer_loops.pack_columns` (:meth:`of` packs a matrix,
    :func:`~onnx_light.kernels.integer_loops.pack_windows` a convolution's windows),
    ``columns`` of them real, with their zero points (int32) and sums over the reduced axis
    (None: computed when a product needs them)."""

    __slots__ = ("columns", "lanes", "sums", "zero")

    def __init__(self, lanes: np.ndarray, columns: int, zero: np.ndarray | int,
                 sums: np.ndarray | None = None) -> None:
        self.lanes, self.columns, self.sums = lanes, columns, sums
        self.zero = _per_row(zero, columns)

    @staticmethod
    def empty(depth: int, columns: int, dtype: np.dtype, layout: str = "packed") -> np.ndarray:
        """Uninitialised lanes for ``columns`` columns of ``depth`` bytes of type ``dtype``
        in ``layout`` (one of :data:`LAYOUTS`)."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown packed layout {layout!r}: expected one of {LAYOUTS}")
        if layout == "pairs":
            return np.empty((-(-columns // PACKED_LANES), -(-depth // 2), PACKED_LANES, 2), np.int16)
        width, quads = (TILE_LANES, TILE_QUADS) if layout == "amx" else (PACKED_LANES, 1)
        return np.empty((-(-columns // width), -(-depth // (4 * quads)) * quads, width, 4), dtype)

    @property
    def layout(self) -> str:
        """The layout these lanes are in (one of :data:`LAYOUTS`)."""
        return ("pairs" if self.lanes.dtype == np.int16
                else "amx" if self.lanes.shape[2] == TILE_LANES else "packed")

    @staticmethod
    def words(lanes: np.ndarray) -> np.ndarray:
        """``lanes`` as the packers write them: one uint32 per column and word (whose
        ``lanes.shape[3]`` values the packers take as their ``per``)."""
        return lanes.view(np.uint32).reshape(lanes.shape[:3])

    @classmethod
    def of(cls, source: np.ndarray, zero: np.ndarray | int, sums: np.ndarray | None = None,
           layout: str = "packed") -> PackedColumns:
        """``source`` (K, C) bytes packed: C columns of K bytes each, in ``layout``."""
        lanes = cls.empty(*source.shape, source.dtype, layout)
        pack_columns.dispatcher(source, cls.words(lanes), lanes.shape[3])
        return cls(lanes, source.shape[1], zero, sums)

    def column_sums(self) -> np.ndarray:
        """The columns' sums over the reduced axis (int32, wrapping)."""
        if self.sums is None:
            self.sums = self.sums_of(self.lanes, self.columns)
        return self.sums

    @staticmethod
    def sums_of(lanes: np.ndarray, columns: int) -> np.ndarray:
        """The sums over the reduced axis of the first ``columns`` columns of ``lanes``."""
        return np.ascontiguousarray(lanes.sum(axis=(1, 3), dtype=np.int32).reshape(-1)[:columns])


def _chunk(left: np.dtype, right: np.dtype) -> int:
    """The longest run of the reduced axis whose byte products sum exactly in float32."""
    return (1 << 24) // (_MAGNITUDE[left] * _MAGNITUDE[right])


class PackedPlan(NamedTuple):
    """What one packed product reads besides its right operand's lanes and their column
    sums (:meth:`IntegerProductKernel.packed_plan`): the compiled loop, the left operand
    repeated with its zero points and row sums, the right one's zero points, its column sums
    when they are constant (zeros when no row zero point needs them; None: the lanes'), the
    biases, the requantization, the shape, the units of its split and the byte dot product's
    mode (:data:`~onnx_light.kernels.byte_vectors.dot`: np.int16 where the bytes' products sum
    in int16 pairs exactly, :func:`short_sums`)."""

    run: Callable[..., None]
    repeated: np.ndarray
    row_zero: np.ndarray
    row_sums: np.ndarray
    column_zero: np.ndarray
    column_sums: np.ndarray | None
    depth: int
    row_bias: np.ndarray
    column_bias: np.ndarray
    multiplier: np.ndarray
    zero: int
    low: int
    high: int
    requantized: bool
    rows: int
    columns: int
    units: tuple[int, int]
    mode: np.integer


class IntegerProductKernel(Kernel):
    """The integer products' configuration and their blocked, exact product."""

    # 2: ``product.algorithm`` took ``auto`` (the new default) and ``pairs``.
    tuning_abi: ClassVar[int] = 2

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.algorithm = str(values[ALGORITHM])
        self.tile_rows = int(values[TILE_ROWS])
        self.tile_columns = int(values[TILE_COLUMNS])
        self.minimum_macs = int(values[MINIMUM_MACS])
        #: The right operands' layout of the packed products (:func:`packed_layout`).
        self.layout = packed_layout(self.algorithm) if self.algorithm in PACKED_ALGORITHMS else "packed"

    def product(self, left: ByteRows, right: ByteRows | PackedColumns, bias: np.ndarray | None = None,
                epilogue: Epilogue | None = None, requantization: Requantization | None = None,
                short: bool = False) -> np.ndarray | None:
        """The int32 sums ``(left - zero) @ (right - zero).T + bias`` (``bias`` int32 of shape
        (rows, 1) or (1, columns)); each block goes to ``epilogue`` once final. Returns the
        (rows, columns) int32 accumulator; with ``requantization`` writes its output instead
        (requantized as :func:`~onnx_light.kernels.integer_loops.requantize` does) and
        returns None. A :class:`PackedColumns` right operand takes the packed algorithm of its
        layout whatever the configuration; ``short``: as :meth:`packed_plan` says."""
        rows, depth = left.data.shape
        packed = isinstance(right, PackedColumns)
        columns = right.columns if packed else right.data.shape[0]
        row_bias, column_bias = np.zeros(rows, np.int32), np.zeros(columns, np.int32)
        if bias is not None:
            (row_bias if bias.shape[0] > 1 or columns == 1 else column_bias)[:] = bias.reshape(-1)
        if packed or self.algorithm in PACKED_ALGORITHMS:
            return self._packed(left, right if packed else right.packed(self.layout), row_bias,
                                column_bias, epilogue, requantization, short)
        if requantization is not None:
            epilogue = _requantizing(requantization)
        acc = np.empty((rows, columns), np.int32)
        blas = self.algorithm == "blas"
        dot = None if blas else dot_tiles.dispatcher
        fix = correct.dispatcher
        chunk = _chunk(left.data.dtype, right.data.dtype)

        def block(r0: int, r1: int, c0: int, c1: int) -> None:
            if r0 >= r1 or c0 >= c1:
                return
            if blas:
                _blas_block(left.real, right.real, r0, r1, c0, c1, chunk, acc)
            else:
                dot(left.data, right.data, r0, r1, c0, c1, self.tile_rows, self.tile_columns, acc)
            fix(acc, r0, r1, c0, c1, left.zero, left.sums, right.zero, right.sums, depth,
                row_bias, column_bias)
            if epilogue is not None:
                epilogue(acc, r0, r1, c0, c1)

        with BLAS.limited(1 if blas else None):
            self._split(rows, columns, depth, self.tile_rows, self.tile_columns, block)
        return None if requantization is not None else acc

    def _split(self, rows: int, columns: int, depth: int, row_unit: int, column_unit: int,
               block: Callable[[int, int, int, int], None]) -> None:
        """Run ``block(r0, r1, c0, c1)`` over the output, split across the pool from
        ``parallel.minimum_macs`` multiply-adds along its longer side, in blocks of whole
        units (rows, columns): each thread reads the whole of the shorter side's operand
        and its share of the other."""
        threads = self.num_threads
        if threads < 2 or depth == 0 or rows * columns * depth < self.minimum_macs:
            block(0, rows, 0, columns)
            return
        row_units, column_units = -(-rows // row_unit), -(-columns // column_unit)
        if rows >= columns:
            self.pool.parallel_for(row_units, lambda s, e: block(s * row_unit, min(rows, e * row_unit),
                                                                  0, columns),
                                   max_blocks=min(threads, row_units))
        else:
            self.pool.parallel_for(column_units, lambda s, e: block(0, rows, s * column_unit,
                                                                     min(columns, e * column_unit)),
                                   max_blocks=min(threads, column_units))

    def _packed(self, left: ByteRows, right: PackedColumns, row_bias: np.ndarray,
                column_bias: np.ndarray, epilogue: Epilogue | None,
                requantization: Requantization | None, short: bool) -> np.ndarray | None:
        """The packed algorithms' product (:func:`~onnx_light.kernels.integer_loops.packed_sums`),
        or the ``amx`` one's (:func:`~onnx_light.kernels.integer_loops.tile_sums`) for a right
        operand in its layout."""
        plan = self.packed_plan(left, right, row_bias, column_bias, requantization, short)
        out = np.empty((left.data.shape[0], right.columns), np.int32) if requantization is None \
            else requantization[0]
        sums = right.column_sums() if plan.column_sums is None else plan.column_sums
        self.run_packed(plan, right.lanes, sums, out, epilogue)
        return None if requantization is not None else out

    def packed_plan(self, left: ByteRows, right: PackedColumns, row_bias: np.ndarray,
                    column_bias: np.ndarray, requantization: Requantization | None,
                    short: bool = False) -> PackedPlan:
        """What a packed product of ``left`` and right operands shaped as ``right`` (its
        layout, columns and zero points) reads besides the right operand's lanes, made once
        for a convolution's shape (:meth:`run_packed` runs it); ``requantization``'s output
        is not kept (each run writes its own). ``short``: bytes whose products sum exactly in
        int16 pairs (:func:`short_sums`, the caller's check), in the ``packed`` layout."""
        repeated, row_zero, sums = left.repeated(right.lanes.dtype, right.layout)
        # count_nonzero, not any(): the latter's Python layers cost a small product microseconds
        column_sums = None if np.count_nonzero(row_zero) else _zeros(right.columns)
        if requantization is None:
            multiplier, zero, low, high = _ONE, 0, 0, 0
        else:
            multiplier, zero, low, high = requantization[1:]
            # writable, as the warm-up's: one compiled signature whatever the caller's flags
            # (tested first: ``np.require`` alone costs more than a small product)
            flags = multiplier.flags
            if multiplier.dtype != np.float32 or not (flags.c_contiguous and flags.writeable):
                multiplier = np.require(multiplier, np.float32, ("C", "W"))
        amx = right.layout == "amx"
        short = short and right.layout == "packed"
        return PackedPlan((tile_sums if amx else packed_sums).dispatcher, repeated, row_zero, sums,
                          right.zero, column_sums, left.data.shape[1], row_bias, column_bias,
                          multiplier, zero, low, high, requantization is not None,
                          left.data.shape[0], right.columns,
                          (2 * TILE_LANES, 2 * TILE_LANES) if amx
                          else (PACKED_ROWS, _tile_columns("pairs" if short else right.layout)),
                          _SHORT if short else _EXACT)

    def run_packed(self, plan: PackedPlan, lanes: np.ndarray, column_sums: np.ndarray, out: np.ndarray,
                   epilogue: Epilogue | None = None, residual: Residual | None = None) -> None:
        """:meth:`packed_plan`'s product on right-operand ``lanes`` whose column sums are
        ``column_sums``, written to ``out`` (int32 sums, or the requantized output), split
        across the pool as :meth:`_split` does; a requantized output gets ``residual`` (its
        bytes of ``out``'s shape and type, and QLinearAdd's parameters) added to each strip
        of rows while in cache (:func:`~onnx_light.kernels.integer_loops.add_residual`)."""
        run, tiles = plan.run, (self.tile_rows, self.tile_columns)
        added, combine = residual if residual is not None else (no_residual(out.dtype), _NO_COMBINE)
        if epilogue is None and self.num_threads < 2:  # no closure, no split: a small product's run
            run(lanes, plan.repeated, 0, plan.rows, 0, plan.columns, *tiles, plan.row_zero, plan.row_sums,
                plan.column_zero, column_sums, plan.depth, plan.row_bias, plan.column_bias,
                plan.multiplier, plan.zero, plan.low, plan.high, plan.requantized, out, added, combine,
                plan.mode)
            return

        def block(r0: int, r1: int, c0: int, c1: int) -> None:
            run(lanes, plan.repeated, r0, r1, c0, c1, *tiles, plan.row_zero, plan.row_sums,
                plan.column_zero, column_sums, plan.depth, plan.row_bias, plan.column_bias,
                plan.multiplier, plan.zero, plan.low, plan.high, plan.requantized, out, added, combine,
                plan.mode)
            if epilogue is not None:
                epilogue(out, r0, r1, c0, c1)

        self._split(plan.rows, plan.columns, plan.depth, *plan.units, block)

    def compile_short(self, output: np.dtype | None, swapped: bool = False) -> None:
        """Compile the packed product of byte products summed in int16 pairs
        (:func:`short_sums`: int8 weights on the left, uint8 on the right) for int32 sums
        and the requantized ``output`` type (None: the sums alone), at session construction;
        with ``swapped`` also the other way round, written transposed (as
        :meth:`compile_for`)."""
        weights, inputs = ByteRows(np.zeros((1, 1), np.int8), 0), ByteRows(np.zeros((1, 1), np.uint8), 0)
        self.product(weights, inputs.packed(), short=True)
        if output is not None:
            self.product(weights, inputs.packed(), short=True,
                         requantization=(np.zeros((1, 1), output), _ONE, 0, 0, 1))
        if swapped:
            self.product(ByteRows(np.zeros((2, 1), np.uint8), 0), weights.packed(), short=True)
        if swapped and output is not None:
            self.product(ByteRows(np.zeros((2, 1), np.uint8), 0), weights.packed(), short=True,
                         requantization=(np.zeros((1, 2), output).T, _ONE, 0, 0, 1))

    def compile_for(self, left: np.dtype, right: np.dtype, output: np.dtype | None = None,
                    swapped: bool = False) -> None:
        """Compile the loops this kernel's product runs for operands of these types and the
        requantized ``output`` type (None: int32 sums), at session construction, so that no
        run pays for it; with ``swapped`` also the product of the operands the other way
        round written transposed (a convolution's :data:`~onnx_light.kernels.
        quantized_products.SWAPPED_POSITIONS` path)."""
        one = ByteRows(np.zeros((1, 1), left), 0)
        self.product(one, ByteRows(np.zeros((1, 1), right), 0))
        if output is not None:
            self.product(one, ByteRows(np.zeros((1, 1), right), 0),
                         requantization=(np.zeros((1, 1), output), _ONE, 0, 0, 1))
        if swapped:  # the weights packed whatever the algorithm, the output written transposed (F)
            weights = ByteRows(np.zeros((2, 1), left), 0).packed(self.layout)
            self.product(ByteRows(np.zeros((1, 1), right), 0), weights)
        if swapped and output is not None:
            self.product(ByteRows(np.zeros((2, 1), right), 0), weights,
                         requantization=(np.zeros((2, 2), output).T, np.ones((1, 2), np.float32), 0, 0, 1))


_ONE = np.ones((1, 1), np.float32)
#: What the packed loops take for "no residual" (:meth:`IntegerProductKernel.run_packed`):
#: QLinearAdd's parameters, unread.
_NO_COMBINE = np.zeros(9, np.float32)
#: :data:`~onnx_light.kernels.byte_vectors.dot`'s modes: exact sums whatever the bytes, or
#: the bytes' products summed in int16 pairs (:func:`short_sums`).
_EXACT, _SHORT = np.int32(0), np.int16(1)
#: The largest magnitude of signed bytes whose products with unsigned ones sum exactly in
#: int16 pairs (2 x 255 x 64 = 32640).
SHORT_WEIGHT = 64


def short_sums(weights: ByteRows, inputs: np.dtype) -> bool:
    """Whether a packed product of ``weights`` (either operand) and bytes of type ``inputs``
    (the other) may sum its byte products in int16 pairs, exactly: int8 weights of at
    most :data:`SHORT_WEIGHT` in magnitude (7-bit weights, as onnxruntime's quantizer writes
    them with ``reduce_range``) against uint8. AVX2 without the byte dot product sums them
    so (:data:`~onnx_light.kernels.byte_vectors.dot`): three instructions per 32 products
    against the int16 pairs' four, and bytes packed, not int16."""
    return (weights.data.dtype == np.int8 and np.dtype(inputs) == np.uint8
            and 0 < weights.magnitude <= SHORT_WEIGHT)
_NO_RESIDUAL = {np.dtype(t): np.empty((0, 0), t) for t in (np.uint8, np.int8, np.int32)}


def no_residual(dtype: np.dtype) -> np.ndarray:
    """The empty residual of the packed loops for an output of ``dtype`` (the same array
    type as a residual of that output's, so no other compiled signature)."""
    return _NO_RESIDUAL[dtype]


def _tile_columns(layout: str) -> int:
    """The columns a split of a packed product's output keeps together: whole micro-tiles of
    :func:`~onnx_light.kernels.integer_loops.packed_sums` (24 columns, or 16 on int16 pairs:
    48 for both)."""
    return 6 * PACKED_LANES if layout == "pairs" else 3 * PACKED_LANES


def _packed_operands(left: ByteRows, right: PackedColumns
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`~onnx_light.kernels.integer_loops.packed_sums` reads of the left operand
    (its repeated rows, zero points and row sums) and the right one's column sums (zeros
    when no row zero point needs them)."""
    repeated, row_zero, sums = left.repeated(right.lanes.dtype, right.layout)
    # count_nonzero, not any(): the latter's Python layers cost a small product microseconds
    column_sums = right.column_sums() if np.count_nonzero(row_zero) else _zeros(right.columns)
    return repeated, row_zero, sums, column_sums


def packed_product(left: ByteRows, right: PackedColumns) -> np.ndarray:
    """The int32 sums ``(left - zero) @ (right - zero)`` of the packed algorithm of
    ``right``'s layout with the portable tiles, on the calling thread:
    the products of kernels that have no tuned integer product of their own (the
    ``com.microsoft`` quantized products)."""
    rows, depth = left.data.shape
    repeated, row_zero, sums, column_sums = _packed_operands(left, right)
    out = np.empty((rows, right.columns), np.int32)
    run = (tile_sums if right.layout == "amx" else packed_sums).dispatcher
    run(right.lanes, repeated, 0, rows, 0, right.columns, _DEFAULTS[TILE_ROWS],
        _DEFAULTS[TILE_COLUMNS], row_zero, sums, right.zero, column_sums, depth,
        _zeros(rows), _zeros(right.columns), _ONE, 0, 0, 0, False, out, no_residual(out.dtype), _NO_COMBINE,
        _EXACT)
    return out


def _zeros(size: int) -> np.ndarray:
    return np.zeros(size, np.int32)


def _requantizing(requantization: Requantization) -> Epilogue:
    """The epilogue writing each block of sums requantized into the output."""
    out, multiplier, zero, low, high = requantization
    run = requantize.dispatcher

    def epilogue(acc: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> None:
        run(acc, r0, r1, c0, c1, multiplier, zero, low, high, out)

    return epilogue


def _blas_block(left: np.ndarray, right: np.ndarray, r0: int, r1: int, c0: int, c1: int,
                chunk: int, acc: np.ndarray) -> None:
    """``acc[r0:r1, c0:c1] = left[r0:r1] @ right[c0:c1].T`` from float32 products over chunks
    of the reduced axis, each exact, summed in int32."""
    depth = left.shape[1]
    a, b = left[r0:r1], right[c0:c1].T
    target = acc[r0:r1, c0:c1]
    target[...] = np.matmul(a[:, :chunk], b[:chunk])
    for k in range(chunk, depth, chunk):
        target += np.matmul(a[:, k:k + chunk], b[k:k + chunk]).astype(np.int32)


# ---------------------------------------------------------------- calibration

SEED = 20261202
# (name, rows, depth, columns): products quantized models make (a transformer's projection,
# a 3x3 convolution's im2col, a classifier head, a small 1x1 convolution).
PRODUCT_CORPUS: tuple[tuple[str, int, int, int], ...] = (
    ("projection 128x256x256", 128, 256, 256),
    ("conv3x3 64x576x784", 64, 576, 784),
    ("head 1x1024x1000", 1, 1024, 1000),
    ("conv1x1 32x64x3136", 32, 64, 3136),
)


def integer_candidates() -> list[dict[str, Value]]:
    """What a calibration tries: every algorithm but ``auto`` (one of them), three tiles,
    three thresholds."""
    return [{ALGORITHM: algorithm, TILE_ROWS: rows, TILE_COLUMNS: columns, MINIMUM_MACS: 1 << exp}
            for algorithm in ALGORITHMS[1:] for rows, columns in ((64, 192), (64, 768), (16, 1536))
            for exp in (17, 21, 25)]


class _Inputs(NamedTuple):
    case: str
    left: ByteRows
    right: ByteRows
    bias: np.ndarray


class IntegerProductConfigurations:
    """The configuration search's problem for an integer product of one element type: the
    left operand of that type, int8 weights on the right, a bias, outputs compared exactly."""

    def __init__(self, declaration: KernelDeclaration, element_type: int, num_threads: int) -> None:
        self.declaration, self.element_type = declaration, element_type
        self.pool = get_pool(num_threads)
        self.corpus = {entry[0]: entry for entry in PRODUCT_CORPUS}
        self.cases = tuple(self.corpus)
        self._kernels: dict[tuple[Any, ...], IntegerProductKernel] = {}

    def _kernel(self, values: dict[str, Value]) -> IntegerProductKernel:
        cache_key = tuple(sorted(values.items()))
        kernel = self._kernels.get(cache_key)
        if kernel is None:
            op = self.declaration.op_type
            ctx = NodeContext(f"calibrate_{op}", op, "", max(self.declaration.versions), {},
                              (self.element_type,), (self.element_type,), 1)
            kernel = self.declaration.kernel(ctx).bind(self.pool)
            kernel.configure(values)
            self._kernels[cache_key] = kernel
        return kernel

    def work(self, case: str) -> int:
        return math.prod(self.corpus[case][1:])

    def input_bytes(self, case: str) -> int:
        _, m, k, n = self.corpus[case]
        return 5 * (m * k + n * k) + 4 * m * n

    def make_inputs(self, case: str) -> _Inputs:
        _, m, k, n = self.corpus[case]
        rng = np.random.default_rng([SEED, self.cases.index(case)])
        dtype = np.uint8 if self.element_type == T.UINT8 else np.int8
        info = np.iinfo(dtype)
        left = ByteRows(rng.integers(info.min, info.max + 1, (m, k)).astype(dtype),
                        rng.integers(info.min, info.max + 1, m).astype(np.int32))
        right = ByteRows(rng.integers(-128, 128, (n, k)).astype(np.int8),
                         rng.integers(-3, 4, n).astype(np.int32))
        return _Inputs(case, left, right, rng.integers(-5000, 5000, (1, n)).astype(np.int32))

    def run(self, values: dict[str, Value], inputs: _Inputs) -> np.ndarray:
        return self._kernel(values).product(inputs.left, inputs.right, inputs.bias)

    def same_output(self, reference: np.ndarray, candidate: np.ndarray) -> bool:
        """Bit-exact: every configuration computes the same int32 sums."""
        return reference.dtype == candidate.dtype and np.array_equal(reference, candidate)


def calibrate_integer_product(declaration: KernelDeclaration, key: KernelTuningKey,
                              descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
    """The configuration search of an integer product over :data:`PRODUCT_CORPUS`."""
    threads = min(descriptor.num_threads, budget.max_threads)
    problem = IntegerProductConfigurations(declaration, key.element_type, threads)
    portable = dict(declaration.schema(key.element_type).defaults)
    return without_compilation(configuration_search, key, problem, portable, integer_candidates(),
                               Budget(budget.max_duration_s, budget.max_memory_bytes, threads))
