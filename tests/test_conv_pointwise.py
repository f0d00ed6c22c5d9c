"""``direct_1x1``'s compiled tiles (kernels/conv/pointwise.py): each tile one BLAS product (or,
for ``pointwise.product = packed``, the packed micro-kernel), finished while in cache, against
float64 products, over shapes with one and several tiles, groups, batches, both thread counts,
with and without the bias, the fused residual and clamp."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnx_light.kernels import conv, packed_gemm
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.compiled_activations import in_place
from onnx_light.kernels.conv import pointwise
from onnx_light.parallel import BLAS, ThreadPool


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _kernel(group, pool, values=None, element_type=TensorProto.FLOAT):
    ctx = NodeContext("conv", "Conv", "", 22, {"group": group}, (element_type,) * 3, (element_type,), 3, 1)
    kernel = conv.ConvKernel(ctx)
    kernel.bind(pool).configure(values)
    return kernel


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), group=st.sampled_from([1, 2]), channels=st.integers(1, 24),
       filters=st.integers(1, 70), height=st.integers(1, 24), width=st.integers(1, 24),
       bias=st.booleans(), residual=st.booleans(),
       clamp=st.sampled_from([None, (0.0, math.inf), (-0.5, 0.5)]),
       threads=st.sampled_from([1, 2]), split=st.sampled_from(["auto", "output_rows", "filters"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_tiles_equal_the_product_finished(pools, batch, group, channels, filters, height, width, bias,
                                          residual, clamp, threads, split, dtype, seed):
    channels, filters = channels * group, filters * group
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, channels, height, width)).astype(dtype)
    w = rng.uniform(-1, 1, (filters, channels // group, 1, 1)).astype(dtype)
    b = rng.uniform(-1, 1, filters).astype(dtype) if bias else None
    element_type = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    kernel = _kernel(group, pools[threads], {conv.SPLIT: split, conv.MINIMUM_FLOPS: 1}, element_type)
    wide = np.einsum("gmc,ngchw->ngmhw", w.astype(np.float64).reshape(group, filters // group, -1),
                     x.astype(np.float64).reshape(batch, group, channels // group, height, width))
    expected = wide.reshape(batch, filters, height, width)
    if b is not None:
        expected += b.astype(np.float64).reshape(-1, 1, 1)
    inputs = [x, w, b]
    if residual:
        shortcut = rng.uniform(-1, 1, expected.shape).astype(dtype)
        expected += shortcut
        inputs.append(shortcut)
        kernel.residual = True
    if clamp is not None:
        kernel.clamp = clamp
        kernel.epilogue = lambda block, low=clamp[0], high=clamp[1]: np.clip(block, low, high, out=block)
        expected = np.clip(expected, *clamp)
    got = kernel.run(*inputs)[0]
    assert got.dtype == dtype and got.shape == expected.shape
    tolerance = (channels // group + 3) * np.finfo(dtype).eps * 4
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)
    assert kernel.problem(x.shape, w.shape).algorithm == "direct_1x1"


def test_tiles_cut_small_weights_and_large_outputs_only():
    """Large weights keep one tile (each tile's product packs them again), and so does an
    output that fits in cache; the others are cut into equal tiles of about TILE_COLUMNS."""
    assert pointwise.tile_columns(2048, 512, 12544, 4) is None
    assert pointwise.tile_columns(40, 144, 784, 4) is None
    assert pointwise.tile_columns(16, 32, 12544, 4) == 256  # 49 tiles of 256
    assert pointwise.tile_columns(24, 96, 3136, 4) == 256  # 13 tiles: 12 of 256, one of 64
    assert pointwise.tile_columns(96, 16, 900, 4) == 240  # 4 tiles of 225 columns, rounded up


def test_a_multi_tile_plane_with_a_relu_and_residual_matches_numpy_bitwise(pools):
    """Several tiles (16 -> 64 channels at 40x40): each element the BLAS product of its tile
    (a BLAS may sum in another order for another shape), then the bias, the residual and the
    Relu in numpy's order, as the finishing pass computes them."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 40, 40)).astype(np.float32)
    w = rng.standard_normal((64, 16, 1, 1)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    shortcut = rng.standard_normal((1, 64, 40, 40)).astype(np.float32)
    columns = pointwise.tile_columns(64, 16, 40 * 40, 4)
    assert columns < 40 * 40
    kernel = _kernel(1, pools[1])
    kernel.residual, kernel.clamp = True, (0.0, math.inf)
    kernel.epilogue = lambda block: np.maximum(block, 0, out=block)
    got = kernel.run(x, w, b, shortcut)[0]
    rows = x.reshape(16, -1)
    product = np.concatenate([np.matmul(w.reshape(64, 16), rows[:, start:start + columns])
                              for start in range(0, rows.shape[1], columns)], axis=1).reshape(1, 64, 40, 40)
    expected = np.maximum((product + b.reshape(-1, 1, 1)) + shortcut, 0)
    np.testing.assert_array_equal(got, expected)


def test_constant_weights_compile_at_construction(pools):
    """``specialize`` compiles the tiles for the weights' type: runs with writable or read-only
    arrays, a bias or none, a residual or none, then need no other compiled version."""
    w = np.ones((4, 3, 1, 1), np.float64)
    kernel = _kernel(1, pools[1], element_type=TensorProto.DOUBLE)
    kernel.specialize([None, w, None])
    signatures = set(pointwise.pointwise_tiles.dispatcher.signatures)
    assert any(s[1].dtype.name == "float64" for s in signatures)
    x = np.ones((1, 3, 5, 5))
    kernel.run(x, w, np.zeros(4))
    x.flags.writeable = w.flags.writeable = False
    kernel.run(x, w)
    kernel.residual = True
    kernel.run(x, w, np.zeros(4), np.ones((1, 4, 5, 5)))
    assert set(pointwise.pointwise_tiles.dispatcher.signatures) == signatures


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("product", ["blas", "packed"])
def test_the_direct_call_equals_the_blocks_bitwise_across_shapes_and_weights(pools, threads, product):
    """``run`` calls ``direct_1x1``'s compiled product directly (what depends on the shape
    remembered per shape, the weights' view while they are the same array): the bits of the
    general path through the algorithm's blocks, for a second input shape, other weights
    fed, the same weights changed in place, a residual, no bias, a clamp set later."""
    rng = np.random.default_rng(5)
    kernel = _kernel(1, pools[threads], {conv.POINTWISE_PRODUCT: product})
    w = rng.standard_normal((24, 16, 1, 1)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)

    def check(x, w, b, *residual):
        general = kernel.variant()
        general._run_pointwise = lambda *arguments: None  # the algorithm's blocks
        got = kernel.run(x, w, b, *residual)[0]
        assert kernel._pointwise_weights[0] is w  # the direct call ran
        np.testing.assert_array_equal(got, general.run(x, w, b, *residual)[0])

    for shape in [(1, 16, 7, 7), (2, 16, 14, 14), (1, 16, 7, 7)]:
        check(rng.standard_normal(shape).astype(np.float32), w, b)
    x = rng.standard_normal((1, 16, 7, 7)).astype(np.float32)
    other = rng.standard_normal(w.shape).astype(np.float32)
    check(x, other, None)
    other *= 2  # changed in place: the remembered view reads the new values
    check(x, other, b)
    kernel.clamp = (0.0, 6.0)
    kernel.epilogue = lambda block: np.clip(block, 0.0, 6.0, out=block)
    check(x, w, b)
    kernel.residual = True
    check(x, w, b, rng.standard_normal((1, 24, 7, 7)).astype(np.float32))
    with pytest.raises(KernelError, match="residual"):
        kernel.run(x, w, b, np.ones((1, 24, 7, 6), np.float32))


@pytest.mark.parametrize("op_type", ["Sigmoid", "Swish", "HardSigmoid", "HardSwish"])
@pytest.mark.parametrize("size", [40, 6, 1], ids=["tiles", "one-tile", "vector"])
def test_a_compiled_activation_runs_in_the_tiles_bitwise(pools, op_type, size):
    """A fused compiled activation (SiLU as Swish, HardSwish, ...) applied in each tile gives
    the convolution, then the same activation applied to the finished output, bitwise."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((1, 16, size, size)) * 4).astype(np.float32)
    w = rng.standard_normal((64, 16, 1, 1)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    activation = in_place(op_type, {"alpha": 1.0} if op_type == "Swish" else {}, lambda block: None)
    kernel = _kernel(1, pools[1])
    kernel.epilogue = activation
    got = kernel.run(x, w, b)[0]
    expected = _kernel(1, pools[1]).run(x, w, b)[0]
    activation(expected)
    np.testing.assert_array_equal(got, expected)
    assert (got != _kernel(1, pools[1]).run(x, w, b)[0]).any()


def _sequential(x, w, b, residual, clamp):
    """``pointwise_vector``'s sum in numpy, in its order and type: each image's first
    product, then plus each next channel's product, then the bias, the residual, the clamp."""
    flat_w, flat_x = w.reshape(w.shape[0], -1), x.reshape(x.shape[0], -1)
    out = flat_w[:, 0][None, :] * flat_x[:, :1]
    for k in range(1, flat_x.shape[1]):
        out = out + flat_w[:, k][None, :] * flat_x[:, k:k + 1]
    if b is not None:
        out = out + b
    if residual is not None:
        out = out + residual.reshape(out.shape)
    if clamp is not None:
        out = np.minimum(np.maximum(out, out.dtype.type(clamp[0])), out.dtype.type(clamp[1]))
    return out.reshape(x.shape[0], w.shape[0], *x.shape[2:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 3), channels=st.integers(1, 300), filters=st.integers(1, 90),
       dims=st.integers(1, 2), bias=st.booleans(), residual=st.booleans(),
       clamp=st.sampled_from([None, (0.0, math.inf), (-0.5, 0.5)]), constant=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_one_by_one_planes_sum_in_order_within_the_bound_at_both_thread_counts(
        pools, batch, channels, filters, dims, bias, residual, clamp, constant, dtype, seed):
    """A 1x1 convolution of 1x1 planes (a squeeze-and-excitation's) is ``pointwise_vector``:
    the sum in channel order (bitwise that sum in numpy), within the module's bound of the
    float64 product, the same bits at one and two threads, with constant weights (transposed
    once by ``settle``, which a run then leaves as it is) or fed ones."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, channels) + (1,) * dims).astype(dtype)
    w = rng.uniform(-1, 1, (filters, channels) + (1,) * dims).astype(dtype)
    b = rng.uniform(-1, 1, filters).astype(dtype) if bias else None
    shortcut = rng.uniform(-1, 1, (batch, filters) + (1,) * dims).astype(dtype) if residual else None
    element_type = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    expected = _sequential(x, w, b, shortcut, clamp)
    results = []
    for threads in (1, 2):
        kernel = _kernel(1, pools[threads], {conv.MINIMUM_FLOPS: 1}, element_type)
        kernel.residual = residual
        if clamp is not None:
            kernel.clamp = clamp
            kernel.epilogue = lambda block, low=clamp[0], high=clamp[1]: np.clip(block, low, high, out=block)
        if constant:
            kernel = kernel.specialize([None, w, b]) or kernel
            kernel = kernel.settle([x.shape, w.shape]) or kernel
            assert kernel._vector_weights[0] is w
        state = dict(vars(kernel))
        got = kernel.run(x, w, b, *([shortcut] if residual else []))[0]
        assert all(vars(kernel)[name] is value for name, value in state.items()) or not constant
        assert got.dtype == dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
        results.append(got)
    np.testing.assert_array_equal(results[0], results[1])
    reference = np.einsum("fc,nc->nf", w.reshape(filters, -1).astype(np.float64),
                          x.reshape(batch, -1).astype(np.float64)).reshape(expected.shape)
    if b is not None:
        reference += b.astype(np.float64).reshape(-1, *(1,) * dims)
    if shortcut is not None:
        reference += shortcut
    if clamp is not None:
        reference = np.clip(reference, *clamp)
    bound = conv.error_bound(x, w, b, compute_dtype=dtype)
    if shortcut is not None:
        bound = bound + np.abs(shortcut) * np.finfo(dtype).eps
    assert (np.abs(results[0] - reference) <= bound).all()


def test_one_by_one_planes_keep_nan_infinities_and_signed_zeros(pools):
    """``pointwise_vector`` propagates NaN and infinities as the product does, keeps a
    one-channel product's -0.0, and reads fed weights changed in place."""
    kernel = _kernel(1, pools[1])
    x = np.array([1.0, np.nan, np.inf, 2.0], np.float32).reshape(1, 4, 1, 1)
    w = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, -1, 0], [1, 0, 0, 1]],
                 np.float32).reshape(5, 4, 1, 1)
    for values in ([1.0, np.inf, 2.0, 3.0], [1.0, 2.0, -np.inf, np.inf], [np.nan, 1.0, 2.0, 3.0]):
        x[0, :, 0, 0] = values
        with np.errstate(invalid="ignore"):
            expected = _sequential(x, w, None, None, None)
        np.testing.assert_array_equal(kernel.run(x, w)[0], expected)  # 0 x inf is NaN
    x[0, :, 0, 0] = [1.0, np.nan, np.inf, 2.0]
    x[0, 1:3] = 0
    w[1, 0] = -0.0
    got = kernel.run(np.ascontiguousarray(x[:, :1]), np.ascontiguousarray(w[:, :1]))[0].reshape(-1)
    np.testing.assert_array_equal(got, [1, 0, 0, 0, 1])
    assert np.signbit(got[1]) and not np.signbit(got[2])
    w *= 2  # fed weights changed in place: no stale transpose
    np.testing.assert_array_equal(kernel.run(x, w)[0].reshape(-1), [2, -0.0, 0, 0, 6])


packed_only = pytest.mark.skipif(not packed_gemm.available(), reason="needs AVX2 and FMA or AVX-512F")


def _random_case(seed, batch, channels, height, width, filters, bias, residual, clamp):
    """A random float32 1x1 convolution's inputs (X, W, B, then a residual when asked),
    the float64 result (clamped) and conv.numerics's bound (plus one rounding for the
    residual's addition)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, channels, height, width)).astype(np.float32)
    w = rng.uniform(-1, 1, (filters, channels, 1, 1)).astype(np.float32)
    b = rng.uniform(-1, 1, filters).astype(np.float32) if bias else None
    inputs = [x, w, b]
    expected = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    if b is not None:
        expected += b.astype(np.float64).reshape(-1, 1, 1)
    bound = conv.error_bound(x, w, b)
    if residual:
        shortcut = rng.uniform(-1, 1, expected.shape).astype(np.float32)
        expected += shortcut
        inputs.append(shortcut)
        bound = bound + np.abs(expected) * np.finfo(np.float32).eps
    if clamp is not None:
        expected = np.clip(expected, *clamp)
    return inputs, expected, bound


@packed_only
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 600), filters=st.integers(1, 40), height=st.integers(1, 21),
       width=st.integers(1, 23), batch=st.integers(1, 2), bias=st.booleans(), residual=st.booleans(),
       clamp=st.sampled_from([None, (0.0, 6.0)]), seed=st.integers(0, 2**16))
def test_packed_products_are_within_the_bound_and_split_to_the_same_bits(
        pools, monkeypatch, channels, filters, height, width, batch, bias, residual, clamp, seed):
    """``pointwise.product = packed`` (float32): each element within conv.numerics's bound of
    the float64 convolution (plus one rounding for the residual's addition), and the same bits
    at two threads, split by rows or by filters, and with tiles of 64 positions (the panels of
    the input read in place, the last positions of a tile past its whole panels packed; more
    than ``KC`` channels (128 or 512) take two passes of the sum)."""
    inputs, expected, bound = _random_case(seed, batch, channels, height, width, filters, bias,
                                           residual, clamp)

    def run(threads, split):
        kernel = _kernel(1, pools[threads], {conv.POINTWISE_PRODUCT: "packed", conv.SPLIT: split,
                                             conv.MINIMUM_FLOPS: 1})
        kernel.residual = residual
        if clamp is not None:
            kernel.clamp = clamp
            kernel.epilogue = lambda block: np.clip(block, *clamp, out=block)
        return kernel.run(*inputs)[0]

    got = run(1, "auto")
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= bound)
    for split in ("output_rows", "filters"):
        np.testing.assert_array_equal(run(2, split), got)
    with monkeypatch.context() as patch:
        patch.setattr(pointwise, "TILE_COLUMNS", 64)
        np.testing.assert_array_equal(run(1, "auto"), got)


@packed_only
@pytest.mark.parametrize("op_type", ["Swish", "HardSwish"])
def test_packed_products_run_a_compiled_activation_in_the_tiles_bitwise(pools, op_type):
    """The packed product's tiles apply a fused activation as the BLAS tiles do: the packed
    convolution, then the activation over the finished output, bitwise."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 70, 19, 17)) * 2).astype(np.float32)
    w = rng.standard_normal((29, 70, 1, 1)).astype(np.float32)
    b = rng.standard_normal(29).astype(np.float32)
    packed = {conv.POINTWISE_PRODUCT: "packed"}
    activation = in_place(op_type, {"alpha": 1.0} if op_type == "Swish" else {}, lambda block: None)
    kernel = _kernel(1, pools[1], packed)
    kernel.epilogue = activation
    got = kernel.run(x, w, b)[0]
    expected = _kernel(1, pools[1], packed).run(x, w, b)[0]
    activation(expected)
    np.testing.assert_array_equal(got, expected)
    assert pointwise.pointwise_product(np.float32, "packed") is pointwise.pointwise_packed.dispatcher
    assert pointwise.pointwise_product(np.float64, "packed").func is pointwise.pointwise_tiles.dispatcher


@packed_only
def test_packed_products_propagate_nan_and_infinities(pools):
    """A NaN input position makes its column NaN in every filter, an infinite one infinite
    (or NaN where the sum meets the opposite infinity), as the float64 product says, in the
    read-in-place panels and in the packed last ones alike (70 positions: 64 + 6)."""
    rng = np.random.default_rng(6)
    x = rng.uniform(0.5, 1, (1, 9, 7, 10)).astype(np.float32)
    w = rng.uniform(0.5, 1, (8, 9, 1, 1)).astype(np.float32)
    w[3, 2] = -1.0
    x[0, 2, 0, 3] = np.nan
    x[0, 4, 6, 8] = np.inf  # position 68, in the packed panel
    x[0, 2, 2, 1] = np.inf  # filter 3 meets -inf there
    x[0, 5, 2, 1] = np.inf
    got = _kernel(1, pools[1], {conv.POINTWISE_PRODUCT: "packed"}).run(x, w)[0]
    with np.errstate(invalid="ignore"):
        expected = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
    assert np.isnan(got[0, :, 0, 3]).all() and np.isposinf(got[0, :, 6, 8]).all()
    assert np.isnan(got[0, 3, 2, 1]) and np.isposinf(got[0, 0, 2, 1])


def test_without_the_packed_kernel_packed_falls_back_to_the_blas_tiles(pools, monkeypatch):
    """Where the packed kernel cannot run, ``packed`` runs the BLAS tiles: the same bits as
    ``blas``."""
    monkeypatch.setattr(packed_gemm, "available", lambda: False)
    assert pointwise.pointwise_product(np.float32, "packed").func is pointwise.pointwise_tiles.dispatcher
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 12, 20, 20)).astype(np.float32)
    w = rng.standard_normal((10, 12, 1, 1)).astype(np.float32)
    got = _kernel(1, pools[1], {conv.POINTWISE_PRODUCT: "packed"}).run(x, w)[0]
    np.testing.assert_array_equal(got, _kernel(1, pools[1], {conv.POINTWISE_PRODUCT: "blas"}).run(x, w)[0])


def test_units_cut_one_tile_products_from_a_size_on_along_the_cheaper_side():
    """A product kept in one tile is cut in two from CUT_MULTIPLY_ADDS on: by filters (blocks
    of a multiple of 8) where the input is smaller than the weights, else by columns; tiled
    products keep their tiles and every filter."""
    assert pointwise.product_units(16, 32, 12544, 4) == (256, 16)  # 49 tiles
    assert pointwise.product_units(8, 8, 9, 4) == (9, 8)  # small: one unit
    assert pointwise.product_units(160, 960, 49, 4) == (49, 160)  # below CUT_MULTIPLY_ADDS
    assert pointwise.product_units(1280, 320, 49, 4) == (49, 640)  # 7x7: halves of the filters
    assert pointwise.product_units(56, 4096, 49, 4) == (49, 32)  # 32 + 24 filters
    assert pointwise.product_units(32, 512, 784, 4) == (392, 32)  # 28x28: halves of the columns
    assert pointwise.product_units(96, 576, 196, 4) == (98, 96)
    for filters, depth, width in [(1280, 320, 49), (32, 512, 784), (2048, 512, 12544), (24, 96, 3136)]:
        tile, block = pointwise.product_units(filters, depth, width, 4)
        assert 0 < tile <= width and 0 < block <= filters


@pytest.fixture
def every_product_cut(monkeypatch):
    """Every one-tile product of at least 2 filters or columns cut in two (the shapes of the
    calls remembered so far forgotten before and after)."""
    monkeypatch.setattr(pointwise, "CUT_MULTIPLY_ADDS", 1)
    pointwise.pointwise_call.cache_clear()
    yield
    pointwise.pointwise_call.cache_clear()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), channels=st.integers(1, 300), filters=st.integers(1, 90),
       height=st.integers(1, 40), width=st.integers(1, 40), bias=st.booleans(), residual=st.booleans(),
       epilogue=st.sampled_from([None, "relu6", "Swish"]), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_units_give_the_same_bits_at_one_and_two_threads(pools, every_product_cut, batch, channels,
                                                          filters, height, width, bias, residual,
                                                          epilogue, dtype, seed):
    """``direct_1x1``'s units (tiles, or one tile cut by filters or by columns) shared by two
    numba threads give the bits of the same units on one thread (each unit's BLAS product and
    finishing the same whoever makes it; numpy's OpenBLAS called from both threads at once),
    within the tolerance of the float64 convolution; a compiled SiLU applied in each unit."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, channels, height, width)).astype(dtype)
    w = rng.uniform(-1, 1, (filters, channels, 1, 1)).astype(dtype)
    b = rng.uniform(-1, 1, filters).astype(dtype) if bias else None
    expected = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    if b is not None:
        expected += b.astype(np.float64).reshape(-1, 1, 1)
    inputs = [x, w, b]
    if residual:
        shortcut = rng.uniform(-1, 1, expected.shape).astype(dtype)
        expected += shortcut
        inputs.append(shortcut)
    swish = epilogue == "Swish" and dtype == np.float32
    if epilogue == "relu6":
        expected = np.clip(expected, 0.0, 6.0)
    elif swish:
        expected = expected / (1 + np.exp(-expected))
    element_type = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE

    def run(threads):
        kernel = _kernel(1, pools[threads], {conv.POINTWISE_MINIMUM_FLOPS: 1}, element_type)
        kernel.residual = residual
        if epilogue == "relu6":
            kernel.clamp = (0.0, 6.0)
            kernel.epilogue = lambda block: np.clip(block, 0.0, 6.0, out=block)
        elif swish:
            kernel.epilogue = in_place("Swish", {"alpha": 1.0}, lambda block: None)
        return kernel.run(*inputs)[0]

    got = run(1)
    assert got.dtype == dtype and got.shape == expected.shape
    tolerance = (channels + 4) * np.finfo(dtype).eps * 4 * (4 if swish else 1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)
    for _ in range(3):  # the threads meet in a different order each time
        np.testing.assert_array_equal(run(2), got)


class _Recorder:
    """A compiled function's stand-in that counts the calls of its dispatcher."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def dispatcher(self, *arguments):
        self.calls += 1
        return self.function.dispatcher(*arguments)


def test_units_run_on_the_threads_from_pointwise_minimum_flops(pools, every_product_cut, monkeypatch):
    """At two threads a product of several units runs in the numba region from
    ``pointwise.minimum_flops`` multiply-adds on (whatever the pool's plan), on the calling
    thread below it, at one thread, with a single unit, and inside a pool region (a branch on
    the pool's worker); the bits are the same every way."""
    parallel = _Recorder(pointwise.pointwise_units_parallel)
    monkeypatch.setattr(pointwise, "pointwise_units_parallel", parallel)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    w = rng.standard_normal((96, 64, 1, 1)).astype(np.float32)
    flops = 96 * 64 * 14 * 14
    reference = _kernel(1, pools[1], {conv.POINTWISE_MINIMUM_FLOPS: 1}).run(x, w)[0]

    def calls(threads, minimum, in_region=False):
        before = parallel.calls
        kernel = _kernel(1, pools[threads], {conv.POINTWISE_MINIMUM_FLOPS: minimum})
        if in_region:  # both blocks of a pool region run the convolution
            results = []
            # as a session's run holds it: two threads' own limits may overlap and end in
            # any order, which can leave one product to several OpenBLAS threads
            with BLAS.scope(1):
                pools[2].parallel_for(2, lambda start, stop: results.append(kernel.run(x, w)[0]))
        else:
            results = [kernel.run(x, w)[0]]
        for got in results:
            np.testing.assert_array_equal(got, reference)
        return parallel.calls - before

    assert calls(2, flops) == 1
    assert calls(2, flops + 1) == 0
    assert calls(1, 1) == 0
    assert calls(2, 1, in_region=True) == 0
    small = rng.standard_normal((1, 64, 3, 3)).astype(np.float32)
    assert pointwise.pointwise_call(small.shape, w.shape, np.dtype(np.float32), "blas").units == 2
    pointwise.pointwise_call.cache_clear()
    monkeypatch.setattr(pointwise, "CUT_MULTIPLY_ADDS", 1 << 40)
    assert pointwise.pointwise_call(small.shape, w.shape, np.dtype(np.float32), "blas").units == 1
    before = parallel.calls
    _kernel(1, pools[2], {conv.POINTWISE_MINIMUM_FLOPS: 1}).run(small, w)
    assert parallel.calls == before


def _settled(pool, w, b, x_shape, values, residual=False, clamp=None):
    """A float32 kernel with constant ``w`` and ``b`` (specialized) and the shapes settled, as
    a session builds it; ``pointwise.transposed_positions`` and the rest from ``values``."""
    kernel = _kernel(1, pool, values)
    kernel.residual = residual
    if clamp is not None:
        kernel.clamp = clamp
        kernel.epilogue = lambda block: np.clip(block, *clamp, out=block)
    kernel = kernel.specialize([None, w, b]) or kernel
    return kernel.settle([x_shape, w.shape]) or kernel


@packed_only
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 600), filters=st.one_of(st.integers(1, 40), st.integers(120, 170)),
       height=st.integers(1, 15), width=st.integers(2, 15), batch=st.integers(1, 2), bias=st.booleans(),
       residual=st.booleans(), clamp=st.sampled_from([None, (0.0, 6.0)]), seed=st.integers(0, 2**16))
def test_transposed_products_are_within_the_bound_and_the_same_bits_at_two_threads(
        pools, monkeypatch, channels, filters, height, width, batch, bias, residual, clamp, seed):
    """``pointwise.transposed_positions`` (float32, constant weights): each element within
    conv.numerics's bound of the float64 convolution (plus one rounding for the residual's
    addition), the same bits at two threads sharing its units (panels of filters), with the
    positions read in place and, from ``PACK_FILTERS`` filters, packed, and the transposed
    product is what ran."""
    case = _random_case(seed, batch, channels, height, width, filters, bias, residual, clamp)
    _check_settled_product(pools, monkeypatch, case, residual, clamp,
                           {conv.POINTWISE_TRANSPOSED: 1000, conv.POINTWISE_MINIMUM_FLOPS: 1},
                           pointwise, "pointwise_transposed")


def _check_settled_product(pools, monkeypatch, case, residual, clamp, values, module, name) -> None:
    """A settled 1x1 convolution with these Conv ``values`` on :func:`_random_case`'s ``case``:
    within its bound, the call bound at settle and the unbound one the same bits, ``module``'s
    compiled ``name`` what the unbound run called (once), and two threads the same bits."""
    inputs, expected, bound = case
    x, w, b = inputs[:3]
    kernel = _settled(pools[1], w, b, x.shape, values, residual, clamp)
    settled_run = kernel.run(*inputs)[0]  # the call bound at settle
    kernel._direct = None
    recorder = _Recorder(getattr(module, name))
    with monkeypatch.context() as patch:
        patch.setattr(module, name, recorder)
        got = kernel.run(*inputs)[0]
    assert recorder.calls == 1
    np.testing.assert_array_equal(settled_run, got)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= bound)
    for _ in range(2):
        np.testing.assert_array_equal(_settled(pools[2], w, b, x.shape, values, residual, clamp)
                                      .run(*inputs)[0], got)


@packed_only
def test_transposed_products_propagate_nan_and_infinities_and_leave_other_planes(pools):
    """NaN and infinities propagate through the transposed product's in-place rows; a plane
    larger than ``pointwise.transposed_positions``, weights fed at run time, and a 1x1 plane
    keep their own products (the same bits as without the value)."""
    rng = np.random.default_rng(5)
    w = rng.uniform(-1, 1, (20, 9, 1, 1)).astype(np.float32)
    x = rng.uniform(-1, 1, (1, 9, 7, 7)).astype(np.float32)
    x[0, 2, 3, 4] = np.nan
    x[0, 5, 6, 6] = np.inf
    values = {conv.POINTWISE_TRANSPOSED: 49}
    got = _settled(pools[1], w, None, x.shape, values).run(x, w)[0]
    expected = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    assert np.all(np.abs(got[finite] - expected[finite]) <= conv.error_bound(x, w, None)[finite])
    for shape in ((1, 9, 8, 8), (1, 9, 1, 1)):
        other = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_array_equal(_settled(pools[1], w, None, shape, values).run(other, w)[0],
                                      _kernel(1, pools[1]).run(other, w)[0])
    fed = w * 2
    np.testing.assert_array_equal(_settled(pools[1], w, None, x.shape, values).run(x, fed)[0],
                                  _kernel(1, pools[1]).run(x, fed)[0])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["units", "blas", "transposed", "vector"])
@pytest.mark.parametrize("fused", ["plain", "residual and clamp", "activation"])
def test_the_call_bound_at_settle_gives_the_unbound_calls_bits_and_leaves_the_kernel(
        pools, monkeypatch, threads, kind, fused):
    """A settled 1x1 convolution with constant weights runs the call bound at settle
    (``PointwiseCall.bind``: no ``PointwiseCall.__call__``) for each product (BLAS units, with
    ``parallel.split = blas`` too, the transposed packed product, 1x1 planes), with a residual and clamp
    or a compiled activation, at one and two threads (a small product: one numba thread):
    the bits of the unbound call and of the general path (where it computes the same
    product), and the kernel's state unchanged by the runs."""
    if kind == "transposed" and not packed_gemm.available():
        pytest.skip("needs AVX2 and FMA or AVX-512F")
    rng = np.random.default_rng(12)
    x_shape = (2, 8, 1, 1) if kind == "vector" else (2, 8, 4, 3)
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, (6, 8, 1, 1)).astype(np.float32)
    b = rng.uniform(-1, 1, 6).astype(np.float32)
    inputs = [x, w, b]
    values = {conv.POINTWISE_TRANSPOSED: 1000 if kind == "transposed" else 0}
    if kind == "blas":
        values[conv.SPLIT] = "blas"

    def settled():
        kernel = _kernel(1, pools[threads], values)
        if fused == "residual and clamp":
            kernel.residual, kernel.clamp = True, (-0.3, 0.5)
            kernel.epilogue = lambda block: np.clip(block, -0.3, 0.5, out=block)
        elif fused == "activation":
            kernel.epilogue = in_place("HardSwish", {}, lambda block: None)
        kernel = kernel.specialize([None, w, b]) or kernel
        return kernel.settle([x.shape, w.shape]) or kernel

    if fused == "residual and clamp":
        inputs.append(rng.uniform(-1, 1, (2, 6, *x_shape[2:])).astype(np.float32))
    kernel = settled()
    state = dict(vars(kernel))
    with monkeypatch.context() as patch:
        patch.setattr(pointwise.PointwiseCall, "__call__", None)  # the bound call alone runs
        got = kernel.run(*inputs)[0]
        np.testing.assert_array_equal(kernel.run(*inputs)[0], got)
    assert vars(kernel).keys() == state.keys()
    assert all(vars(kernel)[key] is value for key, value in state.items())
    unbound = settled()
    unbound._direct = None
    np.testing.assert_array_equal(unbound.run(*inputs)[0], got)
    if kind in ("units", "blas"):
        general = settled()
        general._direct = None
        general._run_pointwise = lambda *arguments: None
        np.testing.assert_array_equal(general.run(*inputs)[0], got)
