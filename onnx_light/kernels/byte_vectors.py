"""Vectors of eight int32 lanes inside compiled kernels, and the dot product of 32-bit words
that adds to them: what the packed integer product
(:func:`~onnx_light.kernels.integer_loops.packed_sums`) is written in.

numba has no vector type, and LLVM does not turn a compiled loop of byte products into the
processor's dot-product instructions (its loops widen the bytes to int16 and use
``vpdpwssd`` at best). These intrinsics give a kernel an ``int32x8`` value that lives in a
register (a 256-bit LLVM vector) and three operations on it:

- :data:`zeros`: eight int32 zeros;
- :data:`dot`: ``acc[l] += sum_r u[l, r] * s[l, r]`` over the parts ``r`` of each lane's
  32-bit word: one operand is 32 bytes read from an array at a byte offset (the lanes' own
  words), the other one word read at a byte offset and repeated in every lane. The arrays'
  types say what a word holds: four bytes, one array uint8 and the other int8 (which is
  unsigned follows the types), or two int16 in both. Its last argument's type is a promise
  of the caller's: int32, none; int16, that each two adjacent byte products of a word
  (parts 0 and 1, 2 and 3) sum within int16 (the operands' range ensures it: signed bytes of
  at most 64 in magnitude against unsigned ones), which lets AVX2 without the byte dot
  product sum the bytes by ``vpmaddubsw`` (its int16 pair sums saturate, so are exact only
  then) and ``vpmaddwd`` by ones;
- :data:`store`: the eight lanes written to an int32 array at an offset (in elements);
- :data:`store_requantized`: the eight lanes plus an int32 constant (wrapping), requantized as
  :func:`~onnx_light.kernels.integer_loops.requantize` does (float32 product with a multiplier,
  rounded half to even, plus the zero point, saturated), their low bytes written to a uint8 or
  int8 array at an offset (the int32 values to an int32 one): the same bits as the scalar loop,
  for finite multipliers.

Four bytes per word: where the processor has AVX512-VNNI or AVX-VNNI (as numba's target
machine reports, :func:`has_byte_dot_product`), one ``vpdpbusd``: exact, since a lane's four
products (at most 255 x 128 in magnitude) add without saturation, and the sum wraps modulo
2**32 like int32. Two int16 per word: where the processor has AVX2, one ``vpmaddwd`` and one
``vpaddd``, exact for int16 holding bytes (each pair of products is at most 2 x 255 x 255).
Four bytes per word on AVX2 without it, under the int16 promise: ``vpmaddubsw``, ``vpmaddwd``
by ones and ``vpaddd``: three instructions per 32 products against four for the int16 pairs,
exact under the promise. Elsewhere the same arithmetic in portable LLVM vector operations
(widened to int32: exact, slower).

numba is imported when a compiled kernel that uses them is first compiled, not before
(:class:`~onnx_light.kernels.compiled.CompiledIntrinsic`). numba's disk cache keys a kernel by
its own source file and the target machine, not by this module: a change here needs the
cache of the kernels using it cleared.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from .compiled import CompiledIntrinsic, target_features

__all__ = ["LANES", "WORD_BYTES", "available", "dot", "has_byte_dot_product", "store", "store_requantized",
           "zeros"]

#: int32 lanes per vector (each lane sums one 32-bit word of products per :data:`dot`).
LANES = 8
#: Bytes of a lane's word (four byte products or two int16 ones per :data:`dot`).
WORD_BYTES = 4
_BYTE_DOT = "llvm.x86.avx512.vpdpbusd.256"
_PAIR_DOT = "llvm.x86.avx2.pmadd.wd"
_SHORT_DOT = "llvm.x86.avx2.pmadd.ub.sw"


def has_byte_dot_product(features: str) -> bool:
    """Whether an LLVM feature string (``+avx512vnni,...``) has the 256-bit ``vpdpbusd``."""
    flags = set(features.split(","))
    return "+avxvnni" in flags or {"+avx512vnni", "+avx512vl"} <= flags


@functools.cache
def available() -> bool:
    """Whether numba's target machine has the byte dot product (:func:`has_byte_dot_product`),
    so that :data:`dot` on bytes is one instruction (asked once)."""
    try:
        return has_byte_dot_product(target_features())
    except Exception:
        return False


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The numba type and intrinsics (built once, when numba is loaded)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic, models, register_model

    int32 = ir.IntType(32)
    vector = ir.VectorType(int32, LANES)
    byte = ir.IntType(8)

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

    def byte_address(context: Any, builder: Any, array_type: Any, array: Any, offset: Any,
                     target: Any) -> Any:
        data = builder.bitcast(context.make_array(array_type)(context, builder, array).data,
                               byte.as_pointer())
        return builder.bitcast(builder.gep(data, [offset]), target.as_pointer())

    def parts_sum(builder: Any, total: Any, unsigned: Any, signed: Any, part: Any, count: int,
                  zero_extend: bool) -> Any:
        """``total`` plus the products of the ``count`` parts of each lane, widened to int32."""
        parts = ir.VectorType(part, count * LANES)
        wide = ir.VectorType(int32, count * LANES)
        first = builder.bitcast(unsigned, parts)
        first = builder.zext(first, wide) if zero_extend else builder.sext(first, wide)
        products = builder.mul(first, builder.sext(builder.bitcast(signed, parts), wide))
        for r in range(count):
            chosen = ir.Constant(vector, [count * lane + r for lane in range(LANES)])
            total = builder.add(total, builder.shuffle_vector(products, products, chosen))
        return total

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
    def store_requantized(typingctx: Any, acc: Any, base: Any, scale: Any, shift: Any, lowest: Any,
                          highest: Any, out: Any, offset: Any) -> Any:
        written = (types.uint8, types.int8, types.int32)
        if not (acc == int32x8 and isinstance(out, types.Array) and out.dtype in written
                and base == types.int32 and scale == shift == lowest == highest == types.float32):
            return None
        lane = int32 if out.dtype == types.int32 else byte
        real = ir.VectorType(ir.FloatType(), LANES)

        def splat(builder: Any, value: Any, kind: Any) -> Any:
            spread = builder.insert_element(ir.Constant(kind, None), value, ir.Constant(int32, 0))
            return builder.shuffle_vector(spread, ir.Constant(kind, None), ir.Constant(vector, [0] * LANES))

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value, offset_by, multiplier, zero, low, high, array, at = args
            total = builder.add(value, splat(builder, offset_by, vector))
            scaled = builder.fmul(builder.sitofp(total, real), splat(builder, multiplier, real))
            rint = builder.module.declare_intrinsic(f"llvm.rint.v{LANES}f32",
                                                    fnty=ir.FunctionType(real, [real]))
            shifted = builder.fadd(builder.call(rint, [scaled]), splat(builder, zero, real))
            floor, ceiling = splat(builder, low, real), splat(builder, high, real)
            clamped = builder.select(builder.fcmp_ordered(">", shifted, floor), shifted, floor)
            clamped = builder.select(builder.fcmp_ordered("<", clamped, ceiling), clamped, ceiling)
            narrow = builder.fptosi(clamped, vector)
            if lane is byte:
                narrow = builder.trunc(narrow, ir.VectorType(byte, LANES))
            pointer = address(context, builder, signature.args[6], array, at)
            builder.store(narrow, builder.bitcast(pointer, ir.VectorType(lane, LANES).as_pointer()), align=1)
            return context.get_dummy_value()
        return types.none(acc, base, scale, shift, lowest, highest, out, offset), codegen

    @intrinsic
    def dot(typingctx: Any, acc: Any, lanes: Any, lanes_offset: Any, repeated: Any,
            repeated_offset: Any, mode: Any) -> Any:
        kinds = (getattr(lanes, "dtype", None), getattr(repeated, "dtype", None))
        pairs = kinds == (types.int16, types.int16)
        if (acc != int32x8 or not (pairs or set(kinds) == {types.uint8, types.int8})
                or mode not in (types.int16, types.int32)):
            return None
        lanes_unsigned = kinds[0] == types.uint8
        short = mode == types.int16 and not pairs

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            total, own, own_at, shared, shared_at, _ = args
            own_words = builder.load(byte_address(context, builder, signature.args[1], own, own_at,
                                                  vector), align=1)
            word = builder.load(byte_address(context, builder, signature.args[3], shared, shared_at,
                                             int32), align=1)
            spread = builder.insert_element(ir.Constant(vector, None), word, ir.Constant(int32, 0))
            spread = builder.shuffle_vector(spread, ir.Constant(vector, None),
                                            ir.Constant(vector, [0] * LANES))
            features = set(context.codegen()._tm_features.split(","))
            if pairs:
                if "+avx2" not in features:
                    return parts_sum(builder, total, own_words, spread, ir.IntType(16), 2, False)
                halves = ir.VectorType(ir.IntType(16), 2 * LANES)
                function = builder.module.declare_intrinsic(
                    _PAIR_DOT, fnty=ir.FunctionType(vector, [halves, halves]))
                return builder.add(total, builder.call(function, [builder.bitcast(own_words, halves),
                                                                  builder.bitcast(spread, halves)]))
            unsigned, signed = (own_words, spread) if lanes_unsigned else (spread, own_words)
            if has_byte_dot_product(",".join(features)):
                function = builder.module.declare_intrinsic(
                    _BYTE_DOT, fnty=ir.FunctionType(vector, [vector, vector, vector]))
                return builder.call(function, [total, unsigned, signed])
            if short and "+avx2" in features:
                halves, quarters = ir.VectorType(ir.IntType(16), 2 * LANES), ir.VectorType(byte, 4 * LANES)
                pairs_of = builder.module.declare_intrinsic(
                    _SHORT_DOT, fnty=ir.FunctionType(halves, [quarters, quarters]))
                halved = builder.call(pairs_of, [builder.bitcast(unsigned, quarters),
                                                 builder.bitcast(signed, quarters)])
                widen = builder.module.declare_intrinsic(
                    _PAIR_DOT, fnty=ir.FunctionType(vector, [halves, halves]))
                ones = ir.Constant(halves, [1] * (2 * LANES))
                return builder.add(total, builder.call(widen, [halved, ones]))
            return parts_sum(builder, total, unsigned, signed, byte, 4, True)
        return int32x8(acc, lanes, lanes_offset, repeated, repeated_offset, mode), codegen

    return {"zeros": zeros, "store": store, "store_requantized": store_requantized, "dot": dot}


zeros = CompiledIntrinsic(lambda numba: _build(numba)["zeros"], "zeros")
store = CompiledIntrinsic(lambda numba: _build(numba)["store"], "store")
store_requantized = CompiledIntrinsic(lambda numba: _build(numba)["store_requantized"], "store_requantized")
dot = CompiledIntrinsic(lambda numba: _build(numba)["dot"], "dot")
