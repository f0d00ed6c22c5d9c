"""Window geometry of Conv and the pooling kernels: where a sliding window goes along each
spatial axis (paddings, auto_pad, ceil_mode, output size), and the padded input it reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import NodeContext

__all__ = ["Window", "WindowAttributes", "pad_spatial"]


@dataclass(frozen=True)
class Window:
    """Where a sliding window goes along each spatial axis of one input shape.

    ``begin``/``end`` are the explicit (or auto_pad) paddings; ``extra`` is what ceil_mode
    adds after ``end`` so that the last window fits (it holds no input, padded or not).
    """

    input: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    extra: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def padded(self) -> bool:
        """Whether any padding (explicit, auto or ceil_mode) is needed."""
        return any(self.begin) or any(self.end) or any(self.extra)

    def padded_shape(self) -> tuple[int, ...]:
        """The spatial shape of the input once padded (ceil_mode extension included)."""
        return tuple(i + b + e + x for i, b, e, x in
                     zip(self.input, self.begin, self.end, self.extra, strict=True))


@dataclass(frozen=True)
class WindowAttributes:
    """The window attributes of a Conv or pooling node, read and checked once at build time."""

    kernel_shape: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    dilations: tuple[int, ...] | None
    pads: tuple[int, ...] | None
    auto_pad: str
    ceil_mode: bool

    @classmethod
    def read(cls, ctx: NodeContext, *, ceil_mode: bool = False) -> WindowAttributes:
        """Read ``kernel_shape``, ``strides``, ``dilations``, ``pads``, ``auto_pad``."""

        def ints(name: str) -> tuple[int, ...] | None:
            value = ctx.attribute(name)
            return None if value is None else tuple(int(v) for v in np.asarray(value).reshape(-1))

        auto_pad = ctx.attribute("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            raise ctx.error(f"auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got {auto_pad!r}")
        attributes = cls(ints("kernel_shape"), ints("strides"), ints("dilations"), ints("pads"),
                         auto_pad, ceil_mode)
        for name in ("kernel_shape", "strides", "dilations"):
            value = getattr(attributes, name)
            if value is not None and any(v < 1 for v in value):
                raise ctx.error(f"{name} must be positive, got {list(value)}")
        if attributes.pads is not None and any(p < 0 for p in attributes.pads):
            raise ctx.error(f"pads must not be negative, got {list(attributes.pads)}")
        return attributes

    def window(self, ctx: NodeContext, spatial: Sequence[int],
               kernel: Sequence[int] | None = None) -> Window:
        """The geometry for an input of spatial shape ``spatial`` (``kernel`` from the weights)."""
        rank = len(spatial)
        kernel = tuple(kernel) if kernel is not None else self.kernel_shape
        if kernel is None:
            raise ctx.error("attribute kernel_shape is required")
        if self.kernel_shape is not None and tuple(self.kernel_shape) != tuple(kernel):
            raise ctx.error(f"kernel_shape {list(self.kernel_shape)} differs from the weights' "
                            f"spatial shape {list(kernel)}")
        strides = self.strides or (1,) * rank
        dilations = self.dilations or (1,) * rank
        pads = self.pads or (0,) * (2 * rank)
        for name, value, size in (("kernel_shape", kernel, rank), ("strides", strides, rank),
                                  ("dilations", dilations, rank), ("pads", pads, 2 * rank)):
            if len(value) != size:
                raise ctx.error(f"{name} has {len(value)} values, the input has {rank} spatial "
                                f"axes (expected {size})")
        extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
        begin, end, extra, output = [], [], [], []
        for axis in range(rank):
            size, s, e = spatial[axis], strides[axis], extent[axis]
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-size // s)
                total = max(0, (out - 1) * s + e - size)
                small, large = total // 2, total - total // 2
                b, f = (small, large) if self.auto_pad == "SAME_UPPER" else (large, small)
            else:
                b, f = (0, 0) if self.auto_pad == "VALID" else (pads[axis], pads[axis + rank])
                span = size + b + f - e
                if span < 0:
                    raise ctx.error(f"the window ({e} positions along spatial axis {axis}) does "
                                    f"not fit in the padded input ({size + b + f})")
                if self.ceil_mode:
                    out = -(-span // s) + 1
                    if (out - 1) * s >= size + b:  # the last window would start in the end padding
                        out -= 1
                else:
                    out = span // s + 1
            begin.append(b)
            end.append(f)
            extra.append(max(0, (out - 1) * s + e - (size + b + f)))
            output.append(out)
        return Window(tuple(spatial), tuple(kernel), tuple(strides), tuple(dilations),
                      tuple(begin), tuple(end), tuple(extra), tuple(output))


def pad_spatial(x: np.ndarray, window: Window, value: Any = 0, extra_value: Any = None,
                tail: Sequence[int] = ()) -> np.ndarray:
    """``x`` (N, C, *spatial) padded with ``value`` (and the ceil_mode extension with
    ``extra_value``, default ``value``), plus ``tail[i]`` more entries of ``value`` at the end
    of spatial axis ``i``; ``x`` itself when nothing is needed."""
    if not window.padded and not any(tail):
        return x
    shape = list(window.padded_shape())
    for axis, extra in enumerate(tail):
        shape[axis] += extra
    fill = value if extra_value is None else extra_value
    if fill == 0:
        padded = np.zeros((*x.shape[:2], *shape), x.dtype)
    else:
        padded = np.empty((*x.shape[:2], *shape), x.dtype)
        padded.fill(fill)
    if extra_value is not None and extra_value != value:
        inner = tuple(slice(0, i + b + f) for i, b, f in zip(window.input, window.begin, window.end,
                                                              strict=True))
        padded[(slice(None), slice(None), *inner)] = value
    core = tuple(slice(b, b + i) for b, i in zip(window.begin, window.input, strict=True))
    padded[(slice(None), slice(None), *core)] = x
    return padded

