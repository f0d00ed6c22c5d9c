"""ImageDecoder: lossless files decode to the pixels encoded, in every pixel format; bad bytes
and a missing Pillow are the node's errors."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light.kernels.base import KernelError
from onnx_light.runtime import RuntimeSession

PIL_Image = pytest.importorskip("PIL.Image")
RNG = np.random.default_rng(20)


def _session(pixel_format: str) -> RuntimeSession:
    node = helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=pixel_format)
    graph = helper.make_graph(
        [node],
        "decode",
        [helper.make_tensor_value_info("data", TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("image", TensorProto.UINT8, None)],
    )
    return RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


def _encoded(pixels: np.ndarray, file_format: str) -> np.ndarray:
    with io.BytesIO() as f:
        PIL_Image.fromarray(pixels).save(f, format=file_format)
        return np.frombuffer(f.getvalue(), np.uint8)


@pytest.mark.parametrize("file_format", ["PNG", "BMP", "TIFF"])
def test_lossless_files_decode_to_their_pixels_in_rgb_and_bgr(file_format):
    pixels = RNG.integers(0, 256, (13, 21, 3), dtype=np.uint8)
    data = _encoded(pixels, file_format)
    (rgb,) = _session("RGB").run(None, {"data": data})
    (bgr,) = _session("BGR").run(None, {"data": data})
    np.testing.assert_array_equal(rgb, pixels)
    np.testing.assert_array_equal(bgr, pixels[:, :, ::-1])
    assert rgb.dtype == np.uint8 and bgr.flags.c_contiguous


def test_grayscale_is_the_itu_601_luma_with_one_channel():
    pixels = RNG.integers(0, 256, (9, 8, 3), dtype=np.uint8)
    (gray,) = _session("Grayscale").run(None, {"data": _encoded(pixels, "PNG")})
    luma = pixels.astype(np.float64) @ [0.299, 0.587, 0.114]
    assert gray.shape == (9, 8, 1)
    np.testing.assert_allclose(gray[:, :, 0], luma, atol=1.0)


def test_bytes_that_are_no_image_are_the_nodes_error():
    with pytest.raises(KernelError, match=r"ImageDecoder\): cannot decode the image \(5 bytes\)"):
        _session("RGB").run(None, {"data": np.arange(5, dtype=np.uint8)})


def test_a_pixel_format_onnx_does_not_define_is_refused():
    with pytest.raises(KernelError, match="pixel_format must be 'RGB', 'BGR' or 'Grayscale'"):
        _session("CMYK")


def test_without_pillow_the_node_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(KernelError, match=r"needs Pillow: pip install 'onnx_light\[image\]'"):
        _session("RGB")
