"""AMX tiles inside compiled kernels: what the ``amx`` integer product
(:func:`~onnx_light.kernels.integer_loops.tile_sums`) is written in.

Intel's Advanced Matrix Extensions hold eight tiles of up to 16 rows x 64 bytes; one
``tdpbusd`` adds to an int32 tile C (16 x 16) the byte products of a tile A (16 rows x 64
bytes of the reduced axis) and a tile B in the dot-product layout (16 rows of four reduced
steps x 16 columns, four bytes per column): ``C[m, n] += sum_k A[m, k] B[k / 4, 4 n + k % 4]``,
exact in int32 (wrapping), 1024 multiply-adds per instruction (fewer steps of the reduced
axis when configured so). These intrinsics give a kernel the instructions:

- :data:`configure`: load the tile configuration (:func:`tile_configuration`, 64 bytes:
  tiles 0-3 for sums, 4-5 for left rows, 6-7 for right columns);
- :data:`zero`: clear a tile;
- :data:`load`: a tile's rows (as configured) from a byte array at an offset, rows
  ``stride`` bytes apart;
- :data:`dot`: ``C += A . B`` of tiles, the instruction following the types of the arrays
  A and B were loaded from (``tdpbusd``, ``tdpbsud``, ``tdpbssd`` or ``tdpbuud``);
- :data:`store`: a tile's 16 rows of 16 int32 to an int32 array at an offset (in elements),
  rows ``stride`` bytes apart;
- :data:`release`: give the tiles back (the processor then saves no tile state).

Tile numbers are constants of the kernel's source (LLVM takes them as immediates).

Linux lets a process use the tiles only once it has asked for them
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); until then the first tile
instruction raises SIGILL. :func:`available` asks once, and says whether numba's target
machine has AMX-INT8 (the processor's, unless ``NUMBA_CPU_NAME`` names another) and the
permission was granted: a kernel uses the tiles only
when it says so, and the byte dot-product kernel otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from types import ModuleType
from typing import Any

import numpy as np

from .compiled import CompiledIntrinsic, compiled
from .compiled import target_features as _target_features

__all__ = ["TILE_BYTES", "TILE_ROWS", "available", "configure", "dot", "has_amx_int8", "load", "release",
           "store", "tile_configuration", "zero"]

#: Rows of a tile.
TILE_ROWS = 16
#: Bytes of a tile's row (64 reduced steps of A; four steps of 16 columns of B).
TILE_BYTES = 64

_ARCH_PRCTL = 158  # the x86-64 system call
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@compiled
def tile_configuration(depth_bytes):
    """The 64-byte configuration of palette 1: tiles 0-3 (the int32 sums) 16 rows x 64
    bytes, tiles 4 and 5 (left rows) 16 rows x ``depth_bytes``, tiles 6 and 7 (right columns)
    ``depth_bytes / 4`` rows x 64 bytes: ``depth_bytes`` (a multiple of 4, at most 64)
    steps of the reduced axis per product."""
    config = np.zeros(64, np.uint8)
    config[0] = 1
    for t in range(8):
        config[16 + 2 * t] = depth_bytes if t in (4, 5) else TILE_BYTES  # uint16 little-endian
        config[48 + t] = depth_bytes // 4 if t in (6, 7) else TILE_ROWS
    return config


def has_amx_int8(features: str) -> bool:
    """Whether an LLVM feature string (``+amx-tile,...``) has the AMX-INT8 tiles."""
    return {"+amx-tile", "+amx-int8"} <= set(features.split(","))


def _permission() -> bool:
    """Ask Linux for the tile data; False when refused or not Linux on x86-64."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def available() -> bool:
    """Whether compiled kernels may use the AMX-INT8 tiles in this process (asked once)."""
    try:
        return has_amx_int8(_target_features()) and _permission()
    except Exception:
        return False


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The intrinsics (built once, when numba is loaded)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    byte = ir.IntType(8)
    pointer = byte.as_pointer()
    void = ir.VoidType()

    def call(builder: Any, name: str, args: list[Any]) -> None:
        function = builder.module.declare_intrinsic(
            name, fnty=ir.FunctionType(void, [a.type for a in args]))
        builder.call(function, args)

    def tile(number: Any) -> Any:
        return ir.Constant(byte, number.literal_value)

    def literal(*numbers: Any) -> bool:
        return all(isinstance(n, types.IntegerLiteral) for n in numbers)

    def address(context: Any, builder: Any, array_type: Any, array: Any, offset: Any) -> Any:
        data = context.make_array(array_type)(context, builder, array).data
        return builder.bitcast(builder.gep(data, [offset]), pointer)

    def stride_of(context: Any, builder: Any, value: Any, value_type: Any) -> Any:
        return context.cast(builder, value, value_type, types.int64)

    @intrinsic
    def configure(typingctx: Any, config: Any) -> Any:
        if not (isinstance(config, types.Array) and config.dtype == types.uint8):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            zero_offset = ir.Constant(ir.IntType(64), 0)
            call(builder, "llvm.x86.ldtilecfg",
                 [address(context, builder, signature.args[0], args[0], zero_offset)])
            return context.get_dummy_value()
        return types.none(config), codegen

    @intrinsic(prefer_literal=True)
    def zero(typingctx: Any, number: Any) -> Any:
        if not literal(number):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            call(builder, "llvm.x86.tilezero", [tile(signature.args[0])])
            return context.get_dummy_value()
        return types.none(number), codegen

    @intrinsic(prefer_literal=True)
    def load(typingctx: Any, number: Any, array: Any, offset: Any, stride: Any) -> Any:
        if not (literal(number) and isinstance(array, types.Array)
                and array.dtype in (types.uint8, types.int8)):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            at = address(context, builder, signature.args[1], args[1], args[2])
            call(builder, "llvm.x86.tileloadd64",
                 [tile(signature.args[0]), at, stride_of(context, builder, args[3], signature.args[3])])
            return context.get_dummy_value()
        return types.none(number, array, offset, stride), codegen

    @intrinsic(prefer_literal=True)
    def dot(typingctx: Any, into: Any, left: Any, right: Any, left_array: Any, right_array: Any) -> Any:
        kinds = (getattr(left_array, "dtype", None), getattr(right_array, "dtype", None))
        signs = {types.uint8: "u", types.int8: "s"}
        if not (literal(into, left, right) and all(kind in signs for kind in kinds)):
            return None
        name = f"llvm.x86.tdpb{signs[kinds[0]]}{signs[kinds[1]]}d"

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            call(builder, name, [tile(t) for t in signature.args[:3]])
            return context.get_dummy_value()
        return types.none(into, left, right, left_array, right_array), codegen

    @intrinsic(prefer_literal=True)
    def store(typingctx: Any, number: Any, array: Any, offset: Any, stride: Any) -> Any:
        if not (literal(number) and isinstance(array, types.Array) and array.dtype == types.int32):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            at = address(context, builder, signature.args[1], args[1], args[2])
            call(builder, "llvm.x86.tilestored64",
                 [tile(signature.args[0]), at, stride_of(context, builder, args[3], signature.args[3])])
            return context.get_dummy_value()
        return types.none(number, array, offset, stride), codegen

    @intrinsic
    def release(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            call(builder, "llvm.x86.tilerelease", [])
            return context.get_dummy_value()
        return types.none(), codegen

    return {"configure": configure, "zero": zero, "load": load, "dot": dot, "store": store,
            "release": release}


configure = CompiledIntrinsic(lambda numba: _build(numba)["configure"], "configure")
zero = CompiledIntrinsic(lambda numba: _build(numba)["zero"], "zero")
load = CompiledIntrinsic(lambda numba: _build(numba)["load"], "load")
dot = CompiledIntrinsic(lambda numba: _build(numba)["dot"], "dot")
store = CompiledIntrinsic(lambda numba: _build(numba)["store"], "store")
release = CompiledIntrinsic(lambda numba: _build(numba)["release"], "release")
