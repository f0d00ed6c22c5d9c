"""One-node kernel cases the kernel tests share: the model onnx's reference runs, and our
kernel for the same node, built as the runtime builds it (attributes decoded, bound to a pool)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import DECLARATIONS
from onnx_light.kernels.base import Kernel, NodeContext
from onnx_light.parallel import ThreadPool

POOL = ThreadPool(1)


def decode(attribute: onnx.AttributeProto) -> Any:
    """An attribute as the runtime hands it to kernels: str, numpy arrays, Python values."""
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def kernel_state(kernel: Kernel) -> dict[str, object]:
    """A kernel's attributes by identity (and a copy of any dict, list or set): equal before
    and after a run that did no lazy work."""
    return {name: (id(value), dict(value) if isinstance(value, dict) else
                   list(value) if isinstance(value, (list, set)) else None)
            for name, value in vars(kernel).items()}


def element_type(array: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(array.dtype)


def build(op: str, inputs: list[np.ndarray | None], opset: int, outputs: int = 1,
          **attributes: Any) -> tuple[onnx.ModelProto, Kernel]:
    """The one-node model and our kernel for it (inputs ``x0, x1, ...``, None for an absent
    optional input; outputs ``y0, y1, ...``)."""
    names = ["" if x is None else f"x{i}" for i, x in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], name=f"{op.lower()}_node",
                            **attributes)
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(n, element_type(x), x.shape)
         for n, x in zip(names, inputs, strict=True) if x is not None],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    ctx = NodeContext(node.name, op, "", opset, {a.name: decode(a) for a in node.attribute},
                      tuple(None if x is None else element_type(x) for x in inputs),
                      (None,) * outputs, len(inputs), outputs)
    kernel = DECLARATIONS["", op].kernel(ctx)
    kernel.bind(POOL)
    return model, kernel


def ours_and_reference(op: str, inputs: list[np.ndarray | None], opset: int, outputs: int = 1,
                       **attributes: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The outputs of our kernel and of onnx's reference for the same one-node case."""
    model, kernel = build(op, inputs, opset, outputs, **attributes)
    feeds = {f"x{i}": x for i, x in enumerate(inputs) if x is not None}
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = list(kernel.run(*inputs))
    assert len(actual) == len(expected)
    return actual, expected


def random_bytes(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    """Uniform values over the whole range of an integer ``dtype``."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def integer_product(algorithm: str, tile_rows: int = 64, tile_columns: int = 768,
                    minimum_macs: int = 1 << 40, pool: ThreadPool | None = None) -> Any:
    """A MatMulInteger kernel configured with one integer-product configuration, whose
    ``product`` the integer-product tests call directly."""
    from onnx_light.kernels.integer_gemm import ALGORITHM, MINIMUM_MACS, TILE_COLUMNS, TILE_ROWS

    a, b = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.int8)
    kernel = build("MatMulInteger", [a, b], 10)[1]
    kernel.configure({ALGORITHM: algorithm, TILE_ROWS: tile_rows, TILE_COLUMNS: tile_columns,
                      MINIMUM_MACS: minimum_macs})
    return kernel.bind(pool)


def byte_product_case(rng: np.random.Generator, left: Any, right: Any, rows: int, depth: int,
                      columns: int, zero_points: bool, per_channel: bool
                      ) -> tuple[np.ndarray, np.ndarray, Any, Any, np.ndarray, np.ndarray]:
    """Random operands of an integer product (``a`` rows x depth of type ``left``, ``b``
    columns x depth of ``right``), their zero points (per row of ``a``; per column of ``b``
    with ``per_channel``, else one), an int32 bias and the exact int64 sums."""
    a, b = random_bytes(rng, left, (rows, depth)), random_bytes(rng, right, (columns, depth))
    a_zero = random_bytes(rng, left, rows).astype(np.int32) if zero_points else 0
    b_zero = (random_bytes(rng, right, columns).astype(np.int32) if per_channel
              else int(random_bytes(rng, right, ())) if zero_points else 0)
    bias = rng.integers(-2**20, 2**20, (1, columns)).astype(np.int32)
    expected = ((a.astype(np.int64) - np.reshape(a_zero, (-1, 1)))
                @ (b.astype(np.int64) - np.reshape(b_zero, (-1, 1))).T + bias)
    return a, b, a_zero, b_zero, bias, expected
