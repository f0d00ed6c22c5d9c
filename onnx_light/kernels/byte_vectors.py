"""Vectors of eight int32 lanes inside compiled kernels, and the byte dot product that adds to
them: what the packed integer product (:func:`~onnx_light.kernels.integer_loops.packed_sums`)
is written in.

numba has no vector type, and LLVM does not turn a compiled loop of byte products into the
processor's byte dot-product instruction (its loops widen the bytes to int16 and use
``vpdpwssd`` at best). These intrinsics give a kernel an ``int32x8`` value that lives in a
register (a 256-bit LLVM vector) and three operations on it:

- :data:`zeros`: eight int32 zeros;
- :data:`dot4`: ``acc[l] += sum_r u[l, r] * s[l, r]`` over the four bytes ``r`` of each lane
  ``l``, ``u`` unsigned and ``s`` signed: one operand is 32 bytes read from an array at an
  offset (the lanes' own bytes), the other 4 bytes read at an offset and repeated in every
  lane; which is unsigned follows the arrays' types (uint8 and int8, one each);
- :data:`store`: the eight lanes written to an int32 array at an offset.

Where the processor has AVX512-VNNI or AVX-VNNI (as numba's target machine reports),
:data:`dot4` is one ``vpdpbusd``: exact, since a lane's four products (at most 255 x 128 in
magnitude) add without saturation, and the sum wraps modulo 2**32 like int32. Elsewhere it is
the same arithmetic in portable LLVM vector operations (widened to int32: exact, slower).

numba is imported when a compiled kernel that uses them is first compiled, not before
(:class:`~onnx_light.kernels.compiled.CompiledIntrinsic`). numba's disk cache keys a kernel by
its own source file and the target machine, not by this module: a change here needs the
cache of the kernels using it cleared.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from .compiled import CompiledIntrinsic

__all__ = ["LANES", "dot4", "has_byte_dot_product", "store", "zeros"]

#: int32 lanes per vector (each lane sums four byte products per :data:`dot4`).
LANES = 8
_INSTRUCTION = "llvm.x86.avx512.vpdpbusd.256"


def has_byte_dot_product(features: str) -> bool:
    """Whether an LLVM feature string (``+avx512vnni,...``) has the 256-bit ``vpdpbusd``."""
    flags = set(features.split(","))
    return "+avxvnni" in flags or {"+avx512vnni", "+avx512vl"} <= flags


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The numba type and intrinsics (built once, when numba is loaded)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic, models, register_model

    vector = ir.VectorType(ir.IntType(32), LANES)
    byte_vector = ir.VectorType(ir.IntType(8), 4 * LANES)
    wide = ir.VectorType(ir.IntType(32), 4 * LANES)
    int32 = ir.IntType(32)

    class Int32x8(types.Type):
        def __init__(self) -> None:
            super().__init__(name="int32x8")

    int32x8 = Int32x8()

    @register_model(Int32x8)
    class Int32x8Model(models.PrimitiveModel):
        def __init__(self, dmm: Any, fe_type: Any) -> None:
            super().__init__(dmm, fe_type, vector)

    def address(context: Any, builder: Any, array_type: Any, array: Any, offset: Any) -> Any:
        return builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])

    @intrinsic
    def zeros(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return ir.Constant(vector, None)
        return int32x8(), codegen

    @intrinsic
    def store(typingctx: Any, acc: Any, out: Any, offset: Any) -> Any:
        if not (isinstance(out, types.Array) and out.dtype == types.int32):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value, array, at = args
            pointer = address(context, builder, signature.args[1], array, at)
            builder.store(value, builder.bitcast(pointer, vector.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.none(acc, out, offset), codegen

    @intrinsic
    def dot4(typingctx: Any, acc: Any, lanes: Any, lanes_offset: Any, repeated: Any,
             repeated_offset: Any) -> Any:
        kinds = {getattr(lanes, "dtype", None), getattr(repeated, "dtype", None)}
        if acc != int32x8 or kinds != {types.uint8, types.int8}:
            return None
        lanes_unsigned = lanes.dtype == types.uint8

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            total, own, own_at, shared, shared_at = args
            pointer = address(context, builder, signature.args[1], own, own_at)
            own_bytes = builder.load(builder.bitcast(pointer, byte_vector.as_pointer()), align=1)
            pointer = address(context, builder, signature.args[3], shared, shared_at)
            word = builder.load(builder.bitcast(pointer, int32.as_pointer()), align=1)
            spread = builder.insert_element(ir.Constant(vector, None), word, ir.Constant(int32, 0))
            spread = builder.shuffle_vector(spread, ir.Constant(vector, None),
                                            ir.Constant(vector, [0] * LANES))
            own_words = builder.bitcast(own_bytes, vector)
            unsigned, signed = (own_words, spread) if lanes_unsigned else (spread, own_words)
            if has_byte_dot_product(context.codegen()._tm_features):
                function = builder.module.declare_intrinsic(
                    _INSTRUCTION, fnty=ir.FunctionType(vector, [vector, vector, vector]))
                return builder.call(function, [total, unsigned, signed])
            products = builder.mul(builder.zext(builder.bitcast(unsigned, byte_vector), wide),
                                   builder.sext(builder.bitcast(signed, byte_vector), wide))
            for r in range(4):
                part = ir.Constant(vector, [4 * lane + r for lane in range(LANES)])
                total = builder.add(total, builder.shuffle_vector(products, products, part))
            return total
        return int32x8(acc, lanes, lanes_offset, repeated, repeated_offset), codegen

    return {"zeros": zeros, "store": store, "dot4": dot4}


zeros = CompiledIntrinsic(lambda numba: _build(numba)["zeros"], "zeros")
store = CompiledIntrinsic(lambda numba: _build(numba)["store"], "store")
dot4 = CompiledIntrinsic(lambda numba: _build(numba)["dot4"], "dot4")
