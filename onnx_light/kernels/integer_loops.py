"""Compiled loops of the integer products: byte dot products, zero-point corrections and
requantization.

The products multiply raw bytes (uint8 or int8, unshifted) into int32 sums; the zero points
come in afterwards through the row sums of both operands::

    sum_k (a_ik - za_i)(b_jk - zb_j) = sum_k a_ik b_jk - zb_j A_i - za_i B_j + K za_i zb_j

(``A_i``, ``B_j`` the row sums), every step in int32 arithmetic that wraps modulo 2**32, so the
result is exact whenever the true value fits int32 (always for bytes with K below 33,000). Both
operands are rows along the reduced axis: :func:`dot_tiles` computes ``out[i, j] = a[i] . b[j]``,
a reduction over contiguous bytes that LLVM turns into the processor's integer dot-product
instructions (AVX-VNNI ``vpdpwssd`` where the processor has them).

:func:`requantize` is onnxruntime's arithmetic: ``float32(acc) * multiplier`` in float32,
rounded half to even, plus the output zero point, saturated to the output type.
:func:`row_sums` gives the operands' row sums. :func:`depthwise_sums` is the depthwise
convolution's (one input channel per output channel) int32 sums, one channel at a time;
:func:`pointwise_sums` a 1x1 convolution's (stride 1, no padding), a block of positions at a
time. Both requantize as they write when asked; :func:`finish_sums` adds the bias to exact
sums computed elsewhere (a convolution's float32 BLAS product) and requantizes them.
"""

from __future__ import annotations

import numpy as np

from .byte_vectors import LANES, WORD_BYTES, dot, store, store_requantized, zeros
from .compiled import compiled, fused_multiply_add
from .tile_matrices import TILE_BYTES, TILE_ROWS, tile_configuration
from .tile_matrices import configure as tile_configure
from .tile_matrices import dot as tile_dot
from .tile_matrices import load as tile_load
from .tile_matrices import release as tile_release
from .tile_matrices import store as tile_store
from .tile_matrices import zero as tile_zero

__all__ = ["EXACT_CHANNELS", "PACKED_LANES", "PACKED_ROWS", "SHORT_ROW", "TILE_LANES", "TILE_QUADS",
           "add_residual", "add_terms", "correct", "depthwise_sums", "dot_tiles", "finish_sums",
           "pack_columns", "pack_windows", "packed_sums", "pad_planes", "pointwise_sums", "requantize",
           "row_sums", "tile_sums"]


@compiled
def dot_tiles(a, b, row_start, row_stop, column_start, column_stop,
              tile_rows, tile_columns, out):
    """``out[i, j] = sum_k a[i, k] * b[j, k]`` (int32) over a block of rows and columns, in
    tiles of ``tile_rows`` x ``tile_columns`` (the rows of ``a`` and ``b`` a tile reads stay
    in cache while it runs)."""
    depth = a.shape[1]
    for i0 in range(row_start, row_stop, tile_rows):
        i1 = min(row_stop, i0 + tile_rows)
        for j0 in range(column_start, column_stop, tile_columns):
            j1 = min(column_stop, j0 + tile_columns)
            for i in range(i0, i1):
                left = a[i]
                for j in range(j0, j1):
                    right = b[j]
                    total = np.int32(0)
                    for k in range(depth):
                        total += np.int32(left[k]) * np.int32(right[k])
                    out[i, j] = total


@compiled
def correct(acc, row_start, row_stop, column_start, column_stop,
            a_zero, a_sums, b_zero, b_sums, depth, row_bias, column_bias):
    """Apply the zero points (per row of each operand) and the int32 biases (one per row and
    one per column) to a block of raw sums, in place, wrapping like int32: ``acc[i, j] +=
    (depth za_i - A_i) zb_j - za_i B_j + row_bias_i + column_bias_j``. The inner loops index
    with unsigned integers (no negative-index fix-up), which lets LLVM vectorise them."""
    for i in range(row_start, row_stop):
        za = np.int32(a_zero[i])
        scaled = np.int32(depth * za - a_sums[i])
        offset = row_bias[i]
        row = acc[i]
        for j in range(np.uintp(column_start), np.uintp(column_stop)):
            row[j] = row[j] + scaled * b_zero[j] - za * b_sums[j] + offset + column_bias[j]


@compiled
def requantize(acc, row_start, row_stop, column_start, column_stop,
               multiplier, zero, low, high, out):
    """``out = saturate(round_half_even(float32(acc) * multiplier) + zero)`` over a block;
    ``multiplier`` is float32 of shape (1 or rows, 1 or columns)."""
    per_row = multiplier.shape[0] > 1
    per_column = multiplier.shape[1] > 1
    lowest, highest, shift = np.float32(low), np.float32(high), np.float32(zero)
    for i in range(row_start, row_stop):
        source, target, scales = acc[i], out[i], multiplier[i if per_row else 0]
        if per_column:
            for j in range(np.uintp(column_start), np.uintp(column_stop)):
                value = np.rint(np.float32(source[j]) * scales[j]) + shift
                target[j] = min(max(value, lowest), highest)
        else:
            scale = scales[0]
            for j in range(np.uintp(column_start), np.uintp(column_stop)):
                value = np.rint(np.float32(source[j]) * scale) + shift
                target[j] = min(max(value, lowest), highest)


@compiled
def row_sums(data, out):
    """``out[r] = sum(data[r])`` in int32 (the zero-point correction's sums)."""
    for r in range(data.shape[0]):
        row = data[r]
        total = np.int32(0)
        for k in range(row.shape[0]):
            total += np.int32(row[k])
        out[r] = total




#: Output rows shorter than this (in elements) :func:`depthwise_sums` requantizes along the
#: whole run at once, not row by row (a short row's loop runs scalar).
SHORT_ROW = 32


@compiled(fastmath={"contract"})
def depthwise_sums(x, zero, w, bias, out, first, last, strides, pads, phases, rows, columns,
                   multiplier, out_zero, low, high, scaled):
    """A depthwise convolution (one input channel per output channel) of bytes, channels
    ``first:last`` of ``out`` (N * C, OH, OW) from ``x`` (N * C, H, W), ``w`` (C, KH, KW)
    weights with their zero points subtracted and the int32 ``bias`` (C,): the int32 sums
    ``bias + sum_taps (x - zero) * w``, wrapping; with ``scaled`` they are requantized as
    :func:`requantize` does (``multiplier`` float32 (C,), ``out_zero``, ``low``, ``high``)
    as they are written.

    The plane is Conv's depthwise one (:func:`~onnx_light.kernels.conv.depthwise.plane_layout`
    gives ``phases``, ``rows`` and ``columns``), in ``w``'s type and holding ``x - zero``, so
    that the padding, left 0, adds nothing: each kernel row is one contiguous pass of its
    taps over the output rows at a phase's width, whatever the strides. ``w`` is int32, or
    float32 when a window has at most :data:`EXACT_CHANNELS` taps: every product and partial
    sum of shifted bytes is then an integer below 2**24, exact in float32 in any order, fused
    multiply-adds included (``contract``), and the bias joins in int32 afterwards."""
    height, width = x.shape[1], x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    channels, kernel_h = w.shape[0], w.shape[1]
    stride_h, stride_w = np.uintp(strides[0]), np.uintp(strides[1])
    phase_rows, phase_width = np.uintp(phases[0]), np.uintp(phases[1])
    phase_size = phase_rows * phase_width
    run = np.uintp(out_h) * phase_width
    # the run in whole vectors (no scalar remainder loops: a small plane's rows are short);
    # the plane's slack past its end holds zeros that only the dropped outputs read
    span = -(-run // np.uintp(LANES)) * np.uintp(LANES)
    plane = np.zeros(stride_w * stride_h * phase_size + span - run, w.dtype)
    result = np.empty(span, w.dtype)
    requantized = np.empty(span, np.uint8)  # the byte written through its low eight bits
    source, target, taps = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    kernel_w = np.uintp(len(columns))
    shift = np.int32(zero)  # the differences wrapped back to int32: no int64 vectors
    # a 3x3 kernel sums its nine taps in one pass (their plane offsets in ``reach``)
    square = kernel_h == 3 and kernel_w == 3
    reach = np.zeros(9, np.uintp)
    if square:
        for t in range(9):
            reach[t] = rows[t // 3] + np.uintp(columns[t % 3])
    # stride 2 over an even width of a vector of words or more (shorter rows run scalar either
    # way): the rows start at even bytes, so each pair of columns is one little-endian word, its
    # low byte (an even column) to one phase, its high byte to the other; an int8 byte's value
    # is (b ^ 128) - 128
    sign = -np.int32(np.iinfo(source.dtype).min)
    signed_shift = sign + shift
    paired = stride_w == 2 and width % 2 == 0 and width >= 2 * LANES
    words = source.view(np.uint16) if paired else np.zeros(1, np.uint16)
    odd_phase = stride_h * phase_size
    low_at = np.uintp(pads[1] // 2) + (odd_phase if pads[1] % 2 else np.uintp(0))
    high_at = np.uintp((pads[1] + 1) // 2) + (np.uintp(0) if pads[1] % 2 else odd_phase)
    row_into = np.empty(height, np.uintp)  # where each input row starts in the plane
    for ih in range(np.uintp(height)):
        p = ih + np.uintp(pads[0])
        row_into[ih] = (p % stride_h) * phase_size + (p // stride_h) * phase_width
    for pair in range(first, last):
        c = np.uintp(pair % channels)
        start = np.uintp(pair) * np.uintp(height * width)
        for ih in range(np.uintp(height)):
            into = row_into[ih]
            if stride_w == 1:
                into += np.uintp(pads[1])
                for iw in range(np.uintp(width)):
                    plane[into + iw] = np.int32(np.int32(source[start + iw]) - shift)
            elif stride_w == 2 and paired:  # each pair of columns read as one 16-bit word
                half, lows, highs = start >> np.uintp(1), low_at + into, high_at + into
                for m in range(np.uintp(width // 2)):
                    word = words[half + m]
                    plane[lows + m] = np.int32((np.int32(word & np.uint16(255)) ^ sign) - signed_shift)
                    plane[highs + m] = np.int32((np.int32(word >> np.uint16(8)) ^ sign) - signed_shift)
            elif stride_w == 2:  # pairs of columns to the two phases, one contiguous read
                even, odd = into, into + stride_h * phase_size
                first_column = np.uintp(pads[1] % 2)  # the first input column of an even one
                if first_column:
                    plane[odd + np.uintp(pads[1] // 2)] = np.int32(np.int32(source[start]) - shift)
                pairs = (np.uintp(width) - first_column) // np.uintp(2)
                base = np.uintp((pads[1] + 1) // 2)
                read = start + first_column
                for m in range(pairs):
                    plane[even + base + m] = np.int32(np.int32(source[read + np.uintp(2) * m]) - shift)
                    plane[odd + base + m] = np.int32(np.int32(source[read + np.uintp(2) * m + np.uintp(1)])
                                                     - shift)
                last = np.uintp(width) - np.uintp(1)
                if first_column + np.uintp(2) * pairs <= last:
                    plane[even + base + pairs] = np.int32(np.int32(source[start + last]) - shift)
            else:
                for r in range(strides[1]):
                    lowest = max(0, -(-(pads[1] - r) // strides[1]))
                    highest = (pads[1] + width - 1 - r) // strides[1]
                    phase = into + np.uintp(r) * stride_h * phase_size
                    read = start + np.uintp(lowest * strides[1] + r - pads[1])
                    for m in range(np.uintp(max(0, highest + 1 - lowest))):
                        plane[phase + np.uintp(lowest) + m] = np.int32(np.int32(source[read + m * stride_w])
                                                                       - shift)
            start += np.uintp(width)
        initial = bias[c]
        if square:
            _nine_taps(taps, c * np.uintp(9), plane, reach, result, span)
        else:
            for j in range(run):
                result[j] = 0
            for kh in range(np.uintp(kernel_h)):
                tap, offset = (c * np.uintp(kernel_h) + kh) * kernel_w, rows[kh]
                for j in range(run):
                    total = result[j]
                    for k in range(kernel_w):
                        total += taps[tap + k] * plane[offset + j + np.uintp(columns[k])]
                    result[j] = total
        into = np.uintp(pair) * np.uintp(out_h * out_w)
        scale = multiplier[c]
        whole = scaled and out_w < SHORT_ROW
        if whole:  # short rows: the whole run at once (one long loop), then the rows' outputs copied
            for j in range(span):
                total = np.int32(np.int32(result[j]) + initial)
                value = np.rint(np.float32(total) * scale) + np.float32(out_zero)
                requantized[j] = np.uint8(np.int32(min(max(value, np.float32(low)), np.float32(high))))
        for oh in range(np.uintp(out_h)):
            line = oh * phase_width
            if whole:
                for ow in range(np.uintp(out_w)):
                    target[into + ow] = requantized[line + ow]
            elif scaled:
                for ow in range(np.uintp(out_w)):
                    total = np.int32(np.int32(result[line + ow]) + initial)
                    value = np.rint(np.float32(total) * scale) + np.float32(out_zero)
                    target[into + ow] = np.uint8(np.int32(min(max(value, np.float32(low)),
                                                              np.float32(high))))
            else:
                for ow in range(np.uintp(out_w)):
                    target[into + ow] = np.int32(np.int32(result[line + ow]) + initial)
            into += np.uintp(out_w)


@compiled(fastmath={"contract"})
def _nine_taps(taps, first, plane, reach, result, run):
    """``result[j] = sum_t taps[first + t] * plane[reach[t] + j]`` over the nine taps of a 3x3
    window, in one pass (the taps and offsets held in registers, so that LLVM vectorizes
    along ``j``); exact in any order for :func:`depthwise_sums`' operands."""
    t0, t1, t2 = taps[first], taps[first + np.uintp(1)], taps[first + np.uintp(2)]
    t3, t4, t5 = taps[first + np.uintp(3)], taps[first + np.uintp(4)], taps[first + np.uintp(5)]
    t6, t7, t8 = taps[first + np.uintp(6)], taps[first + np.uintp(7)], taps[first + np.uintp(8)]
    r0, r1, r2, r3, r4 = reach[0], reach[1], reach[2], reach[3], reach[4]
    r5, r6, r7, r8 = reach[5], reach[6], reach[7], reach[8]
    for j in range(np.uintp(run)):
        result[j] = (t0 * plane[r0 + j] + t1 * plane[r1 + j] + t2 * plane[r2 + j] + t3 * plane[r3 + j]
                     + t4 * plane[r4 + j] + t5 * plane[r5 + j] + t6 * plane[r6 + j] + t7 * plane[r7 + j]
                     + t8 * plane[r8 + j])


@compiled
def finish_sums(sums, bias, out, multiplier, out_zero, low, high, scaled):
    """``out = sums + bias`` in int32 (wrapping) for ``sums`` (R, P) holding exact integers
    (float32 or int32) and the int32 ``bias`` (R,); with ``scaled`` requantized as
    :func:`requantize` does (``multiplier`` float32 (R,))."""
    lowest, highest, offset = np.float32(low), np.float32(high), np.float32(out_zero)
    for r in range(sums.shape[0]):
        source, target, initial = sums[r], out[r], bias[r]
        if scaled:
            scale = multiplier[r]
            for j in range(np.uintp(sums.shape[1])):
                total = np.int32(np.int32(source[j]) + initial)
                value = np.rint(np.float32(total) * scale) + offset
                target[j] = min(max(value, lowest), highest)
        else:
            for j in range(np.uintp(sums.shape[1])):
                target[j] = np.int32(source[j]) + initial


@compiled
def pad_planes(x, out, top, left):
    """Copy the planes of ``x`` (P, H, W) bytes into ``out`` (P, H', W') at row ``top`` and
    column ``left`` of each plane, whose padding the caller has filled: one contiguous copy
    per row (numpy's strided assignment into a padded array took 0.07 ms for ResNet-50's
    128-channel 56x56 input, at some 10 ns a row)."""
    height, width = np.uintp(x.shape[1]), np.uintp(x.shape[2])
    rows, columns = np.uintp(out.shape[1]), np.uintp(out.shape[2])
    source, target = x.reshape(-1), out.reshape(-1)
    read = np.uintp(0)
    for p in range(np.uintp(x.shape[0])):
        into = (p * rows + np.uintp(top)) * columns + np.uintp(left)
        for _ in range(height):
            for j in range(width):
                target[into + j] = source[read + j]
            read += width
            into += columns


#: Positions :func:`pointwise_sums` computes at a time (their shifted inputs stay in cache).
POINTWISE_BLOCK = 256
#: Input channels whose products of shifted bytes (at most 255 x 255 each) sum exactly in
#: float32 (every partial sum below 2**24).
EXACT_CHANNELS = (1 << 24) // (255 * 255)


@compiled(fastmath={"contract"})
def pointwise_sums(x, zero, w, bias, out, first, last, multiplier, out_zero, low, high, scaled):
    """A 1x1 convolution (stride 1, no padding) of bytes, positions ``first:last`` of ``out``
    (M, P) from ``x`` (C, P), ``w`` (M, C) float32 weights with their zero points subtracted
    and the int32 ``bias`` (M,): the int32 sums ``bias + sum_c (x - zero) * w``, wrapping;
    with ``scaled`` requantized as :func:`requantize` does (``multiplier`` float32 (M,)).

    The positions go in blocks of :data:`POINTWISE_BLOCK`: each block's inputs minus the
    zero point are copied once into float32 rows, then each pair of output channels sums one
    contiguous pass per four input channels (each input row loaded once for both), fused
    multiply-adds (``contract``: the only fast-math flag, exact here). Every product and
    partial sum is an integer below 2**24, exact in float32 in any order, over runs of
    :data:`EXACT_CHANNELS` channels, each run then added in int32."""
    channels, filters = x.shape[0], w.shape[0]
    block = POINTWISE_BLOCK
    shifted = np.empty((channels, block), np.float32)
    acc = np.empty((2, block), np.float32)
    total = np.empty((2, block), np.int32)
    shift = np.float32(zero)
    lowest, highest, offset = np.float32(low), np.float32(high), np.float32(out_zero)
    for start in range(first, last, block):
        base, width = np.uintp(start), np.uintp(min(block, last - start))
        for c in range(channels):
            source, line = x[c], shifted[c]
            for j in range(width):
                line[j] = np.float32(source[base + j]) - shift
        for m0 in range(0, filters, 2):
            pair = min(2, filters - m0)
            u, v = w[m0], w[m0 + pair - 1]  # an odd last channel computed twice
            a0, a1, s0, s1 = acc[0], acc[1], total[0], total[1]
            for j in range(width):
                s0[j] = 0
                s1[j] = 0
            for c0 in range(0, channels, EXACT_CHANNELS):
                c1 = min(channels, c0 + EXACT_CHANNELS)
                for j in range(width):
                    a0[j] = 0
                    a1[j] = 0
                for c in range(c0, c1 - 3, 4):
                    l0, l1, l2, l3 = shifted[c], shifted[c + 1], shifted[c + 2], shifted[c + 3]
                    u0, u1, u2, u3 = u[c], u[c + 1], u[c + 2], u[c + 3]
                    v0, v1, v2, v3 = v[c], v[c + 1], v[c + 2], v[c + 3]
                    for j in range(width):
                        e0, e1, e2, e3 = l0[j], l1[j], l2[j], l3[j]
                        a0[j] += u0 * e0 + u1 * e1 + u2 * e2 + u3 * e3
                        a1[j] += v0 * e0 + v1 * e1 + v2 * e2 + v3 * e3
                for c in range(c1 - (c1 - c0) % 4, c1):
                    line, t0, t1 = shifted[c], u[c], v[c]
                    for j in range(width):
                        a0[j] += t0 * line[j]
                        a1[j] += t1 * line[j]
                for j in range(width):
                    s0[j] += np.int32(a0[j])
                    s1[j] += np.int32(a1[j])
            for r in range(pair):
                target, sums, initial = out[m0 + r], total[r], bias[m0 + r]
                if scaled:
                    scale = multiplier[m0 + r]
                    for j in range(width):
                        value = np.rint(np.float32(np.int32(sums[j] + initial)) * scale) + offset
                        target[base + j] = min(max(value, lowest), highest)
                else:
                    for j in range(width):
                        target[base + j] = sums[j] + initial


#: Rows of the repeated operand one micro-tile of :func:`packed_sums` takes.
PACKED_ROWS = 4
#: Columns (lanes) of one vector of :func:`packed_sums`; a full micro-tile holds three.
PACKED_LANES = LANES


#: Quads the packers gather before writing them to the panels: each panel then takes one
#: run of this many quads instead of one write per quad, across as many pages as panels.
PACK_QUADS = 16


@compiled
def _scatter_panels(lines, words, first, count):
    """Quads ``first:first + count`` of every panel of ``words`` (width / L, Q, L) uint32 from
    ``lines`` (``count`` rows of width)."""
    flat = words.reshape(-1)
    panel_lanes = np.uintp(words.shape[2])
    panel_words = np.uintp(words.shape[1]) * panel_lanes
    into = np.uintp(first) * panel_lanes
    for panel in range(words.shape[0]):
        at = np.uintp(panel) * panel_lanes
        for r in range(count):
            line = lines[r]
            for lane in range(panel_lanes):
                flat[into + np.uintp(r) * panel_lanes + lane] = line[at + lane]
        into += panel_words


@compiled
def _word_parts(per, starts, masks, shifts, first, stop):
    """Where each part ``r`` of a word (``per`` parts: 4 bytes, or 2 int16) whose first row of
    the reduced axis is ``first`` comes from: ``starts[r]`` its row ``first + r`` (0 past
    ``stop``), ``shifts[r]`` its place in the word, ``masks[r]`` its bits (0 when absent:
    ``r`` not a part, or its row past ``stop``)."""
    bits = np.uint32(32 // per)
    for r in range(4):
        starts[r], masks[r], shifts[r] = 0, 0, 0
        if r < per and first + r < stop:
            starts[r] = first + r
            shifts[r] = np.uint32(r) * bits
            masks[r] = ((np.uint32(1) << bits) - np.uint32(1)) << shifts[r]


@compiled
def pack_columns(source, words, per):
    """``source`` (K, C) bytes packed for :func:`packed_sums`: ``words`` (width / L, Q, L)
    uint32, panels of L columns (8; :data:`TILE_LANES` for :func:`tile_sums`), each one run of
    its Q words (``per`` rows of the reduced axis each: four bytes, or two int16 holding the
    bytes' values, in a uint32 per column; Q at least ceil(K / per)), zeros past the last row
    and column."""
    depth, columns = source.shape
    lines = np.zeros((PACK_QUADS, words.shape[0] * words.shape[2]), np.uint32)
    starts = np.zeros(4, np.intp)
    masks = np.zeros(4, np.uint32)
    shifts = np.zeros(4, np.uint32)
    for q in range(words.shape[1]):
        line = lines[q % PACK_QUADS]
        _word_parts(per, starts, masks, shifts, per * q, depth)
        r0, r1, r2, r3 = source[starts[0]], source[starts[1]], source[starts[2]], source[starts[3]]
        m0, m1, m2, m3 = masks[0], masks[1], masks[2], masks[3]
        h1, h2, h3 = shifts[1], shifts[2], shifts[3]
        for j in range(columns):
            line[j] = ((np.uint32(np.int32(r0[j])) & m0) | ((np.uint32(np.int32(r1[j])) << h1) & m1)
                       | ((np.uint32(np.int32(r2[j])) << h2) & m2)
                       | ((np.uint32(np.int32(r3[j])) << h3) & m3))
        if q % PACK_QUADS == PACK_QUADS - 1 or q == words.shape[1] - 1:
            _scatter_panels(lines, words, q - q % PACK_QUADS, q % PACK_QUADS + 1)


@compiled
def _word(pixels, at, s0, s1, s2, s3, m0, m1, m2, m3, per):
    """The word of the pixels at ``at`` from the starts ``s0``-``s3``, masked by ``m0``-``m3``:
    four bytes (``per`` 4) or two int16 holding the bytes' values (``per`` 2: ``s2``, ``s3``
    unused)."""
    if per == 2:
        return ((np.uint32(np.int32(pixels[s0 + at])) & m0)
                | ((np.uint32(np.int32(pixels[s1 + at])) << 16) & m1))
    return ((np.uint32(pixels[s0 + at]) & m0) | ((np.uint32(pixels[s1 + at]) << 8) & m1)
            | ((np.uint32(pixels[s2 + at]) << 16) & m2) | ((np.uint32(pixels[s3 + at]) << 24) & m3))


@compiled
def _window_lines(line, pixels, starts, masks, per, out_h, out_w, stride_h, stride_w, row):
    """``line`` (OH x OW words) of one word (:func:`_word`) of every window, the pixels at
    each window's offset from ``starts``. Strides 1 and 2 are constants to LLVM, which then
    vectorizes the reads (and takes the test of ``per`` out of the loops)."""
    s0, s1, s2, s3 = starts[0], starts[1], starts[2], starts[3]
    m0, m1, m2, m3 = masks[0], masks[1], masks[2], masks[3]
    step = np.uintp(stride_w)
    for oh in range(out_h):
        shift = np.uintp(oh * stride_h) * row
        at = np.uintp(oh * out_w)
        if stride_w == 1:
            for ow in range(np.uintp(out_w)):
                line[at + ow] = _word(pixels, shift + ow, s0, s1, s2, s3, m0, m1, m2, m3, per)
        elif stride_w == 2:
            for ow in range(np.uintp(out_w)):
                line[at + ow] = _word(pixels, shift + ow * np.uintp(2), s0, s1, s2, s3, m0, m1, m2, m3, per)
        else:
            for ow in range(np.uintp(out_w)):
                line[at + ow] = _word(pixels, shift + ow * step, s0, s1, s2, s3, m0, m1, m2, m3, per)


@compiled
def pack_windows(image, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, words,
                 per, first, last):
    """The windows of a padded image ``image`` (C, H, W) of bytes packed for
    :func:`packed_sums` as :func:`pack_columns` packs the im2col (C x KH x KW, OH x OW) of
    a convolution (``per`` rows of it per word: 4 or 2), without the im2col: words
    ``first:last`` of ``words``, written to the panels :data:`PACK_QUADS` words at a time."""
    height, row = image.shape[1], np.uintp(image.shape[2])
    taps = kernel_h * kernel_w
    depth = image.shape[0] * taps
    out_w = (image.shape[2] - dilation_w * (kernel_w - 1) - 1) // stride_w + 1
    out_h = (height - dilation_h * (kernel_h - 1) - 1) // stride_h + 1
    pixels = image.reshape(-1)
    lines = np.zeros((PACK_QUADS, words.shape[0] * words.shape[2]), np.uint32)
    rows = np.zeros(4, np.intp)
    starts = np.zeros(4, np.uintp)
    masks = np.zeros(4, np.uint32)
    shifts = np.zeros(4, np.uint32)
    # where each tap of a window starts in a channel's plane, and the rows of the reduced axis
    # counted along (channel, tap) without a division per row
    tap_starts = np.empty(taps, np.uintp)
    for t in range(taps):
        tap_starts[t] = np.uintp((t // kernel_w) * dilation_h) * row + np.uintp((t % kernel_w) * dilation_w)
    plane = np.uintp(height) * row
    k = per * first
    c, tap = k // taps, k % taps
    for q in range(first, last):
        line = lines[(q - first) % PACK_QUADS]
        _word_parts(per, rows, masks, shifts, per * q, depth)
        for r in range(per):
            starts[r] = np.uintp(c) * plane + tap_starts[tap] if k < depth else np.uintp(0)
            k += 1
            tap += 1
            if tap == taps:
                tap = 0
                c += 1
        _window_lines(line, pixels, starts, masks, per, out_h, out_w, stride_h, stride_w, row)
        done = (q - first) % PACK_QUADS + 1
        if done == PACK_QUADS or q == last - 1:
            _scatter_panels(lines, words, q + 1 - done, done)


@compiled
def packed_sums(lanes, repeated, row_first, row_stop, column_first, column_stop, tile_rows,
                tile_columns, row_zero, row_sums, column_zero, column_sums, depth, row_bias,
                column_bias, multiplier, out_zero, low, high, scaled, out, residual, combine, mode):
    """The exact product of two byte operands over rows ``row_first:row_stop`` and columns
    ``column_first:column_stop`` of ``out``, corrected for the zero points as
    :func:`correct` does, plus the biases, and requantized as :func:`requantize` does with
    ``scaled`` (else the int32 sums).

    ``repeated`` (rows rounded up to :data:`PACKED_ROWS`, P * Q) holds the left operand's
    rows, ``lanes`` (width / 8, Q, 8, P) the right one's columns packed by
    :func:`pack_columns` (panels of eight columns, each read as one stream), in one of two
    layouts of 32-bit words: P = 4 bytes, one operand uint8 and the other int8 (the byte dot
    product, ``vpdpbusd``), or P = 2 int16 holding the bytes' values (``vpmaddwd``, for
    processors without the byte dot product: exact for every pair of byte types);
    ``row_first`` and ``column_first`` are multiples of :data:`PACKED_ROWS` and
    :data:`PACKED_LANES`. Each micro-tile of four rows and 24 (int16 pairs: 16; at the end of
    a row, 8) columns sums in vector registers, one word of products per lane and step
    (:data:`~onnx_light.kernels.byte_vectors.dot`, at byte offsets), then goes through a scratch panel to
    the correction and the requantization while in cache (the requantized byte written
    through its low eight bits, the same for uint8 and int8 outputs); a whole micro-tile
    of four real rows and 24 columns whose correction is a row constant, with one finite
    multiplier per row and output rows of contiguous bytes, is requantized from its
    registers instead (:data:`~onnx_light.kernels.byte_vectors.store_requantized`, the same
    bits). The work goes in blocks of
    ``tile_rows`` x ``tile_columns`` (rounded up to whole micro-tiles): a block's left rows
    stay in cache while its columns stream. A ``residual`` with rows (``out``'s shape and
    type; else empty) is added to each strip of four requantized rows while they are in
    cache, as :func:`add_residual` adds it with ``combine`` (a QLinearAdd fused into the
    convolution). ``mode`` is :data:`~onnx_light.kernels.byte_vectors.dot`'s: np.int16 where
    the caller promises that each two byte products of a word sum within int16 (AVX2 then
    sums the bytes with ``vpmaddubsw``, in the narrower micro-tiles of the pairs), else
    np.int32."""
    quads = lanes.shape[1]
    stride = np.uintp(repeated.strides[0])  # bytes, as every offset below
    step = np.uintp(WORD_BYTES * PACKED_LANES)
    panel_bytes = np.uintp(quads) * step
    source = lanes.reshape(-1)
    shared = repeated.reshape(-1)
    block_rows = -(-max(tile_rows, 1) // PACKED_ROWS) * PACKED_ROWS
    wide = 3 * PACKED_LANES
    # the pairs' micro-tiles are 16 columns wide: 4 x 24 needs 17 vector registers there
    # (a temporary per vpmaddwd), which spills three accumulators (docs/quantization.md);
    # the bytes summed in int16 too (a temporary, and the ones)
    pairs, narrow = lanes.itemsize == 2 or mode != 0, 2 * PACKED_LANES
    block_columns = -(-max(tile_columns, 1) // wide) * wide
    panel = np.empty(PACKED_ROWS * block_columns, np.int32)
    simple = _row_constant(row_first, row_stop, column_first, column_stop, row_zero, column_zero,
                           column_bias)
    direct = _direct(simple, scaled, multiplier, out)
    lowest, highest, shift = np.float32(low), np.float32(high), np.float32(out_zero)
    bases = np.zeros(PACKED_ROWS, np.int32)
    scales = np.zeros(PACKED_ROWS, np.float32)
    row_step = np.uintp(out.strides[0] // out.itemsize)
    for r0 in range(row_first, row_stop, block_rows):
        r1 = min(row_stop, r0 + block_rows)
        for c0 in range(column_first, column_stop, block_columns):
            c1 = min(column_stop, c0 + block_columns)
            span = -(-(c1 - c0) // PACKED_LANES) * PACKED_LANES
            for m0 in range(r0, r1, PACKED_ROWS):
                first = np.uintp(m0) * stride
                # whole micro-tiles of four real rows go from the registers to the output
                # (the tiles requantized as the epilogue does), the others through the panel
                whole = direct and m0 + PACKED_ROWS <= r1
                if whole:
                    _row_terms(m0, c0, row_zero, row_sums, column_zero, depth, row_bias, multiplier,
                               bases, scales)
                done = 0
                j = 0
                while pairs and j + narrow <= span:
                    a00 = zeros(); a01 = zeros(); a10 = zeros(); a11 = zeros()  # noqa: E702
                    a20 = zeros(); a21 = zeros(); a30 = zeros(); a31 = zeros()  # noqa: E702
                    at = np.uintp((c0 + j) // PACKED_LANES) * panel_bytes
                    w0 = first
                    for _ in range(quads):
                        w1, w2, w3 = w0 + stride, w0 + 2 * stride, w0 + 3 * stride
                        b1 = at + panel_bytes
                        a00 = dot(a00, source, at, shared, w0, mode)
                        a01 = dot(a01, source, b1, shared, w0, mode)
                        a10 = dot(a10, source, at, shared, w1, mode)
                        a11 = dot(a11, source, b1, shared, w1, mode)
                        a20 = dot(a20, source, at, shared, w2, mode)
                        a21 = dot(a21, source, b1, shared, w2, mode)
                        a30 = dot(a30, source, at, shared, w3, mode)
                        a31 = dot(a31, source, b1, shared, w3, mode)
                        at += step
                        w0 += np.uintp(WORD_BYTES)
                    if whole and j == done and c0 + j + narrow <= c1:
                        o = np.uintp(m0) * row_step + np.uintp(c0 + j)
                        store_requantized(a00, bases[0], scales[0], shift, lowest, highest, out, o)
                        store_requantized(a01, bases[0], scales[0], shift, lowest, highest, out, o + 8)
                        o += row_step
                        store_requantized(a10, bases[1], scales[1], shift, lowest, highest, out, o)
                        store_requantized(a11, bases[1], scales[1], shift, lowest, highest, out, o + 8)
                        o += row_step
                        store_requantized(a20, bases[2], scales[2], shift, lowest, highest, out, o)
                        store_requantized(a21, bases[2], scales[2], shift, lowest, highest, out, o + 8)
                        o += row_step
                        store_requantized(a30, bases[3], scales[3], shift, lowest, highest, out, o)
                        store_requantized(a31, bases[3], scales[3], shift, lowest, highest, out, o + 8)
                        done = j + narrow
                    else:
                        o = np.uintp(j)
                        store(a00, panel, o); store(a01, panel, o + 8)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a10, panel, o); store(a11, panel, o + 8)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a20, panel, o); store(a21, panel, o + 8)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a30, panel, o); store(a31, panel, o + 8)  # noqa: E702
                    j += narrow
                while j + wide <= span:  # (never after the pairs' tiles: fewer than 16 columns left)
                    a00 = zeros(); a01 = zeros(); a02 = zeros()  # noqa: E702
                    a10 = zeros(); a11 = zeros(); a12 = zeros()  # noqa: E702
                    a20 = zeros(); a21 = zeros(); a22 = zeros()  # noqa: E702
                    a30 = zeros(); a31 = zeros(); a32 = zeros()  # noqa: E702
                    at = np.uintp((c0 + j) // PACKED_LANES) * panel_bytes
                    w0 = first
                    for _ in range(quads):
                        w1, w2, w3 = w0 + stride, w0 + 2 * stride, w0 + 3 * stride
                        b1, b2 = at + panel_bytes, at + 2 * panel_bytes
                        a00 = dot(a00, source, at, shared, w0, mode)
                        a01 = dot(a01, source, b1, shared, w0, mode)
                        a02 = dot(a02, source, b2, shared, w0, mode)
                        a10 = dot(a10, source, at, shared, w1, mode)
                        a11 = dot(a11, source, b1, shared, w1, mode)
                        a12 = dot(a12, source, b2, shared, w1, mode)
                        a20 = dot(a20, source, at, shared, w2, mode)
                        a21 = dot(a21, source, b1, shared, w2, mode)
                        a22 = dot(a22, source, b2, shared, w2, mode)
                        a30 = dot(a30, source, at, shared, w3, mode)
                        a31 = dot(a31, source, b1, shared, w3, mode)
                        a32 = dot(a32, source, b2, shared, w3, mode)
                        at += step
                        w0 += np.uintp(WORD_BYTES)
                    if whole and j == done and c0 + j + wide <= c1:
                        o = np.uintp(m0) * row_step + np.uintp(c0 + j)
                        b, s = bases[0], scales[0]
                        store_requantized(a00, b, s, shift, lowest, highest, out, o)
                        store_requantized(a01, b, s, shift, lowest, highest, out, o + 8)
                        store_requantized(a02, b, s, shift, lowest, highest, out, o + 16)
                        o += row_step
                        b, s = bases[1], scales[1]
                        store_requantized(a10, b, s, shift, lowest, highest, out, o)
                        store_requantized(a11, b, s, shift, lowest, highest, out, o + 8)
                        store_requantized(a12, b, s, shift, lowest, highest, out, o + 16)
                        o += row_step
                        b, s = bases[2], scales[2]
                        store_requantized(a20, b, s, shift, lowest, highest, out, o)
                        store_requantized(a21, b, s, shift, lowest, highest, out, o + 8)
                        store_requantized(a22, b, s, shift, lowest, highest, out, o + 16)
                        o += row_step
                        b, s = bases[3], scales[3]
                        store_requantized(a30, b, s, shift, lowest, highest, out, o)
                        store_requantized(a31, b, s, shift, lowest, highest, out, o + 8)
                        store_requantized(a32, b, s, shift, lowest, highest, out, o + 16)
                        done = j + wide
                    else:
                        o = np.uintp(j)
                        store(a00, panel, o); store(a01, panel, o + 8); store(a02, panel, o + 16)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a10, panel, o); store(a11, panel, o + 8); store(a12, panel, o + 16)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a20, panel, o); store(a21, panel, o + 8); store(a22, panel, o + 16)  # noqa: E702
                        o += np.uintp(block_columns)
                        store(a30, panel, o); store(a31, panel, o + 8); store(a32, panel, o + 16)  # noqa: E702
                    j += wide
                while j < span:
                    a00 = zeros(); a10 = zeros(); a20 = zeros(); a30 = zeros()  # noqa: E702
                    at = np.uintp((c0 + j) // PACKED_LANES) * panel_bytes
                    w0 = first
                    for _ in range(quads):
                        a00 = dot(a00, source, at, shared, w0, mode)
                        a10 = dot(a10, source, at, shared, w0 + stride, mode)
                        a20 = dot(a20, source, at, shared, w0 + 2 * stride, mode)
                        a30 = dot(a30, source, at, shared, w0 + 3 * stride, mode)
                        at += step
                        w0 += np.uintp(WORD_BYTES)
                    o = np.uintp(j)
                    store(a00, panel, o)
                    store(a10, panel, o + np.uintp(block_columns))
                    store(a20, panel, o + np.uintp(2 * block_columns))
                    store(a30, panel, o + np.uintp(3 * block_columns))
                    j += PACKED_LANES
                if c0 + done < c1:  # the panel's columns (the panel read from column ``done``)
                    _finish_rows(panel[done:], block_columns, m0, min(m0 + PACKED_ROWS, r1), c0 + done, c1,
                                 simple, row_zero, row_sums, column_zero, column_sums, depth, row_bias,
                                 column_bias, multiplier, out_zero, low, high, scaled, out)
                if residual.shape[0]:
                    add_residual(out, residual, m0, min(m0 + PACKED_ROWS, r1), c0, c1, combine)


@compiled
def _direct(simple, scaled, multiplier, out):
    """Whether :func:`packed_sums` may requantize whole micro-tiles from their registers
    (:data:`~onnx_light.kernels.byte_vectors.store_requantized`): a requantized byte output
    with contiguous rows, a row constant correction, one finite multiplier per row."""
    if not (simple and scaled and multiplier.shape[1] == 1 and out.itemsize == 1
            and out.strides[1] == 1):
        return False
    for i in range(multiplier.shape[0]):  # noqa: SIM110 (a compiled loop: no generators)
        if not np.isfinite(multiplier[i, 0]):
            return False
    return True


@compiled
def _row_terms(row_first, column_first, row_zero, row_sums, column_zero, depth, row_bias, multiplier,
               bases, scales):
    """The row constants of :func:`_finish_rows`' simple correction (``bases``) and the
    multipliers (``scales``) of the :data:`PACKED_ROWS` rows from ``row_first``."""
    per_row = multiplier.shape[0] > 1
    for r in range(PACKED_ROWS):
        i = row_first + r
        weight = np.int32(depth * np.int32(row_zero[i]) - row_sums[i])
        bases[r] = np.int32(np.int32(row_bias[i]) + weight * column_zero[column_first])
        scales[r] = multiplier[i if per_row else 0, 0]


#: Columns of one AMX tile of :func:`tile_sums` (its right operand's panels are this wide).
TILE_LANES = TILE_ROWS
#: Quads (four steps of the reduced axis) one tile of :func:`tile_sums` takes.
TILE_QUADS = TILE_BYTES // 4


@compiled
def tile_sums(lanes, repeated, row_first, row_stop, column_first, column_stop, tile_rows,
              tile_columns, row_zero, row_sums, column_zero, column_sums, depth, row_bias,
              column_bias, multiplier, out_zero, low, high, scaled, out, residual, combine, mode):
    """:func:`packed_sums` on AMX tiles (:mod:`~onnx_light.kernels.tile_matrices`; only
    where :func:`~onnx_light.kernels.tile_matrices.available`), the same arguments and
    output, in other layouts: ``repeated`` has its rows rounded up to :data:`TILE_ROWS` and
    its reduced axis to :data:`TILE_BYTES`, ``lanes`` (width / 16, Q, 16, 4) panels of
    :data:`TILE_LANES` columns with Q a multiple of :data:`TILE_QUADS`; ``row_first`` and
    ``column_first`` are multiples of 16.

    Each block of 32 rows x 32 columns sums in four int32 tiles (tiles 0-3), two tiles of
    left rows (4, 5) and two of right columns (6, 7) loaded per 64 steps of the reduced axis,
    four tile products each (fewer at the last rows and columns); the block goes through a
    scratch panel to the epilogue of :func:`packed_sums` a strip of 32 rows at a time (and
    the residual added to the strip likewise). ``mode`` is unread (the tiles' sums are
    exact)."""
    strip = 2 * TILE_ROWS
    steps = lanes.shape[1] // TILE_QUADS
    stride = np.uintp(repeated.shape[1])
    step_bytes = np.uintp(TILE_QUADS * TILE_LANES * 4)
    panel_bytes = np.uintp(steps) * step_bytes
    source = lanes.reshape(-1)
    shared = repeated.reshape(-1)
    block_rows = -(-max(tile_rows, 1) // strip) * strip
    block_columns = -(-max(tile_columns, 1) // strip) * strip
    panel = np.empty(strip * block_columns, np.int32)
    row_bytes = np.uintp(4 * block_columns)
    simple = _row_constant(row_first, row_stop, column_first, column_stop, row_zero, column_zero,
                           column_bias)
    # a reduced axis of one step reads only its own bytes (padded to 4), not the step's 64
    tile_configure(tile_configuration(min(TILE_BYTES, -(-max(depth, 1) // 4) * 4)))
    for r0 in range(row_first, row_stop, block_rows):
        r1 = min(row_stop, r0 + block_rows)
        for c0 in range(column_first, column_stop, block_columns):
            c1 = min(column_stop, c0 + block_columns)
            for m0 in range(r0, r1, strip):
                two_rows = m0 + TILE_ROWS < r1
                first = np.uintp(m0) * stride
                second = first + np.uintp(TILE_ROWS) * stride
                for j in range(c0, c1, strip):
                    two_columns = j + TILE_LANES < c1
                    tile_zero(0)
                    tile_zero(1)
                    tile_zero(2)
                    tile_zero(3)
                    at = np.uintp(j // TILE_LANES) * panel_bytes
                    w0 = first
                    w1 = second
                    for _ in range(steps):
                        tile_load(4, shared, w0, stride)
                        tile_load(6, source, at, 64)
                        tile_dot(0, 4, 6, repeated, lanes)
                        if two_columns:
                            tile_load(7, source, at + panel_bytes, 64)
                            tile_dot(1, 4, 7, repeated, lanes)
                        if two_rows:
                            tile_load(5, shared, w1, stride)
                            tile_dot(2, 5, 6, repeated, lanes)
                            if two_columns:
                                tile_dot(3, 5, 7, repeated, lanes)
                        at += step_bytes
                        w0 += np.uintp(TILE_BYTES)
                        w1 += np.uintp(TILE_BYTES)
                    o = np.uintp(j - c0)
                    tile_store(0, panel, o, row_bytes)
                    if two_columns:
                        tile_store(1, panel, o + np.uintp(TILE_LANES), row_bytes)
                    if two_rows:
                        o += np.uintp(TILE_ROWS * block_columns)
                        tile_store(2, panel, o, row_bytes)
                        if two_columns:
                            tile_store(3, panel, o + np.uintp(TILE_LANES), row_bytes)
                _finish_rows(panel, block_columns, m0, min(m0 + strip, r1), c0, c1, simple,
                             row_zero, row_sums, column_zero, column_sums, depth, row_bias,
                             column_bias, multiplier, out_zero, low, high, scaled, out)
                if residual.shape[0]:
                    add_residual(out, residual, m0, min(m0 + strip, r1), c0, c1, combine)
    tile_release()


@compiled(inline="always")
def add_terms(parameters):
    """QLinearAdd's constants in onnxruntime's x86 arithmetic (MLAS) from ``parameters``,
    float32 ``first_scale, first_zero, second_scale, second_zero, c_scale, c_zero``: the
    ratios ``r1 = first_scale / c_scale`` and ``r2 = second_scale / c_scale`` and
    ``fixed = c_zero - fma(r2, second_zero, r1 * first_zero)``; the sum of bytes ``f`` and
    ``s`` is then ``fma(s, r2, fma(f, r1, fixed))``, rounded half to even and saturated."""
    first_scale, first_zero, second_scale, second_zero = parameters[:4]
    c_scale, c_zero = parameters[4], parameters[5]
    first_ratio, second_ratio = first_scale / c_scale, second_scale / c_scale
    return first_ratio, second_ratio, c_zero - fused_multiply_add(second_ratio, second_zero,
                                                                  first_ratio * first_zero)


@compiled
def add_residual(out, residual, row_first, row_stop, column_first, column_stop, parameters):
    """QLinearAdd of the bytes of ``out`` and ``residual`` (same shape and type) over rows
    ``row_first:row_stop`` and columns ``column_first:column_stop``, written back to ``out``:
    the arithmetic of :func:`add_terms` with ``parameters`` (float32: its six, then the
    output's ``low, high``, then 1 when ``out`` holds the first operand, 0 the second), so
    the bytes of QLinearAdd's compiled pass on the same operands. A convolution calls it on
    the rows it has just requantized, while they are in cache (the residual addition fused
    into the convolution)."""
    first_ratio, second_ratio, fixed = add_terms(parameters)
    lowest, highest = parameters[6], parameters[7]
    out_first = parameters[8] != 0
    start, count = np.uintp(column_first), np.uintp(column_stop - column_first)
    for i in range(row_first, row_stop):
        row, other = out[i], residual[i]
        if out_first:
            for j in range(start, start + count):
                value = fused_multiply_add(np.float32(other[j]), second_ratio,
                                           fused_multiply_add(np.float32(row[j]), first_ratio, fixed))
                row[j] = np.uint8(np.int32(min(max(np.rint(value), lowest), highest)))
        else:
            for j in range(start, start + count):
                value = fused_multiply_add(np.float32(row[j]), second_ratio,
                                           fused_multiply_add(np.float32(other[j]), first_ratio, fixed))
                row[j] = np.uint8(np.int32(min(max(np.rint(value), lowest), highest)))


@compiled
def _row_constant(row_first, row_stop, column_first, column_stop, row_zero, column_zero, column_bias):
    """Whether the zero-point correction and bias of a block add a constant per row (one
    column zero point, no column bias, no row zero point)."""
    simple = True
    for j in range(column_first, column_stop):
        if column_zero[j] != column_zero[column_first] or column_bias[j] != 0:
            simple = False
    for i in range(row_first, row_stop):
        if row_zero[i] != 0:
            simple = False
    return simple


@compiled
def _finish_rows(panel, block_columns, row_first, row_stop, column_first, column_stop, simple,
                 row_zero, row_sums, column_zero, column_sums, depth, row_bias, column_bias,
                 multiplier, out_zero, low, high, scaled, out):
    """The epilogue of :func:`packed_sums` and :func:`tile_sums`: the raw sums of rows
    ``row_first:row_stop`` and columns ``column_first:column_stop``, in ``panel`` (one row
    of ``block_columns`` per row from ``row_first``, column ``column_first`` first),
    corrected for the zero points as :func:`correct` does, plus the biases, written to
    ``out`` requantized as :func:`requantize` does with ``scaled`` (the byte through its low
    eight bits, the same for uint8 and int8 outputs), else as int32 sums. ``simple``: the
    correction is a constant per row (:func:`_row_constant`). The panel is indexed flat, not
    sliced per row (slices of an argument were slower here: docs/quantization.md)."""
    per_row, per_column = multiplier.shape[0] > 1, multiplier.shape[1] > 1
    lowest, highest, shift = np.float32(low), np.float32(high), np.float32(out_zero)
    start, count = np.uintp(column_first), np.uintp(column_stop - column_first)
    for i in range(row_first, row_stop):
        za = np.int32(row_zero[i])
        weight = np.int32(depth * za - row_sums[i])
        offset = np.int32(row_bias[i])
        at = np.uintp((i - row_first) * block_columns)  # the row's sums: panel[at:at + count]
        base = np.int32(0)  # what the writing pass adds: the correction's row constant
        if simple:
            base = np.int32(offset + weight * column_zero[start])
        else:
            for j in range(count):
                panel[at + j] = np.int32(panel[at + j] + weight * column_zero[start + j]
                                         - za * column_sums[start + j] + offset
                                         + column_bias[start + j])
        target, scales = out[i], multiplier[i if per_row else 0]
        if not scaled:
            for j in range(count):
                target[start + j] = np.int32(panel[at + j] + base)
        elif per_column:
            for j in range(count):
                value = np.rint(np.float32(np.int32(panel[at + j] + base)) * scales[start + j]) + shift
                target[start + j] = np.uint8(np.int32(min(max(value, lowest), highest)))
        else:
            scale = scales[0]
            for j in range(count):
                value = np.rint(np.float32(np.int32(panel[at + j] + base)) * scale) + shift
                target[start + j] = np.uint8(np.int32(min(max(value, lowest), highest)))
