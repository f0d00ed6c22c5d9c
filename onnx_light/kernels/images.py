"""Image decoding: ImageDecoder, through Pillow.

The bytes of a JPEG, PNG, BMP, TIFF, WebP, PNM or JPEG 2000 file become an (H, W, 3) RGB or
BGR, or (H, W, 1) grayscale, uint8 tensor.

Pillow is an optional dependency (the ``image`` extra): a node is refused when it is built
without Pillow installed, naming the extra. Pillow is imported then, not at
``import onnx_light``. Not tunable.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "ImageDecoder"]

#: Pixel format -> the Pillow mode decoded to, and whether the channels are then reversed.
_FORMATS = {"RGB": ("RGB", False), "BGR": ("RGB", True), "Grayscale": ("L", False)}


def _pillow(ctx: NodeContext) -> Any:
    try:
        import PIL.Image
    except ImportError:
        raise ctx.error("decoding images needs Pillow: pip install 'onnx_light[image]'") from None
    return PIL.Image


class ImageDecoder(Kernel):
    """ONNX ImageDecoder (20): a 1-D uint8 tensor of an encoded image, decoded in
    ``pixel_format`` (RGB by default, BGR or Grayscale)."""

    op_type: ClassVar[str] = "ImageDecoder"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        pixel_format = ctx.attribute("pixel_format", "RGB")
        pixel_format = pixel_format.decode() if isinstance(pixel_format, bytes) else str(pixel_format)
        if pixel_format not in _FORMATS:
            raise ctx.error(f"pixel_format must be 'RGB', 'BGR' or 'Grayscale', got {pixel_format!r}")
        self.mode, self.reversed = _FORMATS[pixel_format]
        self.image = _pillow(ctx)

    def run(self, encoded: np.ndarray) -> Sequence[np.ndarray]:
        if encoded.ndim != 1:
            raise self.ctx.error(f"the encoded image must be a 1-D tensor, got shape {list(encoded.shape)}")
        try:
            with self.image.open(io.BytesIO(encoded.tobytes())) as picture:
                pixels = np.array(picture.convert(self.mode))
        except (OSError, ValueError) as error:  # Pillow's UnidentifiedImageError is an OSError
            raise self.ctx.error(f"cannot decode the image ({encoded.size} bytes): {error}") from None
        if self.mode == "L":
            return [pixels[:, :, np.newaxis]]
        return [np.ascontiguousarray(pixels[:, :, ::-1]) if self.reversed else pixels]


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare(ImageDecoder, (20,), types=(T.UINT8,)),)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
