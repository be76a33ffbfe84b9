"""Frame preprocessing kernels shared by the Atari and toy environments (numpy only).

Each kernel works in place on preallocated buffers: they run once per agent step in every
simulator, so an allocation or a strided copy here shows up directly in the sampler's throughput.
"""

from __future__ import annotations

import sys

import numpy as np


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """Integer weights [n_out, n_in]: how much of input cell j output cell i covers.

    On a grid of n_in * n_out units, output cell i spans [i * n_in, (i + 1) * n_in) and input
    cell j spans [j * n_out, (j + 1) * n_out); the weight is the length of their overlap, so each
    row adds up to n_in. Example: `area_weights(3, 2)` is `[[2, 1, 0], [0, 1, 2]]`.
    """
    weights = np.zeros((n_out, n_in), np.int64)
    for i in range(n_out):
        lo, hi = i * n_in, (i + 1) * n_in
        for j in range(lo // n_out, min(-(-hi // n_out), n_in)):
            weights[i, j] = min(hi, (j + 1) * n_out) - max(lo, j * n_out)
    return weights


def area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Weights [n_out, n_in] that average each output cell over the input span it covers
    (`area_weights / n_in`, float32).

    Example: `area_matrix(4, 2)` is `[[.5, .5, 0, 0], [0, 0, .5, .5]]`; `area_matrix(3, 2)` is
    `[[2/3, 1/3, 0], [0, 1/3, 2/3]]` (each output covers 1.5 inputs).
    """
    return (area_weights(n_in, n_out) / n_in).astype(np.float32)


class Resizer:
    """Area resize of a [h, w] uint8 frame to [height, width]: the exact mean of the area each
    output pixel covers, halves rounded up (docs/policy.md, for clients in any language).

    An exact ×2 reduction (the paper's 208×160 → 104×80) takes a fast path of integer sums,
    (a + b + c + d + 2) // 4; any other size computes `area_weights(h, height) @ frame @
    area_weights(w, width).T` in integers, as a few weighted sums of whole rows and then of whole
    columns (each output cell covers at most a few input cells: `taps`), and rounds,
    (2 * sum + h * w) // (2 * h * w). Integers make it exact on any CPU, and no BLAS call is
    made: in env workers a threaded BLAS product ran 9 times slower (its threads of 4 workers
    contending for 2 cores). Both paths give the same result on a ×2 reduction.
    """

    def __init__(self, in_shape: tuple[int, int], out_shape: tuple[int, int]):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        (h, w), (height, width) = self.in_shape, self.out_shape
        if height <= 0 or width <= 0 or height > h or width > w:
            raise ValueError(
                f"cannot resize {h}x{w} frames to {height}x{width}: sizes must be 1..input"
            )
        self.halves = (h, w) == (2 * height, 2 * width)
        self.identity = (h, w) == (height, width)
        self._area = h * w  # the sum of an output pixel's weights
        sum_type = np.int32 if (2 * 255 + 1) * self._area < 2**31 else np.int64
        row_cells, row_weights = taps(area_weights(h, height))
        col_cells, col_weights = taps(area_weights(w, width))
        # The weights in the sums' type: their product with a uint8 frame is of that type.
        self._row_taps = row_cells, row_weights.astype(sum_type)[:, :, None]  # [K, H, 1]
        self._col_taps = col_cells, col_weights.astype(sum_type)  # [K, W]
        self._pair_rows = scratch((height, w), np.uint16, "resize-rows")
        self._out = scratch((height, width), np.uint16, "resize-out")
        self._frame = scratch((height, width), np.uint8, "resize-frame")

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Returns the resized frame; the array is reused by the next call (of any Resizer)."""
        if self.identity:
            return frame
        if self.halves:
            rows = self._pair_rows
            np.add(frame[0::2], frame[1::2], out=rows, dtype=np.uint16)  # [H, w]
            out = self._out
            np.add(rows[:, 0::2], rows[:, 1::2], out=out)  # [H, W] sums of 2x2 blocks
            out += 2
            out >>= 2
            np.copyto(self._frame, out, casting="unsafe")
            return self._frame
        (row_cells, row_weights), (col_cells, col_weights) = self._row_taps, self._col_taps
        rows = row_weights[0] * frame[row_cells[0]]  # [H, w]
        for cells, weights in zip(row_cells[1:], row_weights[1:], strict=True):
            rows += weights * frame[cells]
        sums = col_weights[0] * rows[:, col_cells[0]]  # [H, W]
        for cells, weights in zip(col_cells[1:], col_weights[1:], strict=True):
            sums += weights * rows[:, cells]
        return ((2 * sums + self._area) // (2 * self._area)).astype(np.uint8)  # [H, W]


def taps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero entries of `area_weights` by output cell: input cells [K, n_out] and their
    weights [K, n_out], K the most input cells an output cell covers (the rest weight 0).

    Example: `taps(area_weights(3, 2))` is `([[0, 1], [1, 2]], [[2, 1], [1, 2]])`: output 0 is
    2 x cell 0 + 1 x cell 1, output 1 is 1 x cell 1 + 2 x cell 2.
    """
    covered = weights > 0
    depth = int(covered.sum(axis=1).max())
    cells = np.zeros((depth, len(weights)), np.intp)
    values = np.zeros((depth, len(weights)), np.int32)
    for i, row in enumerate(weights):
        (inputs,) = np.nonzero(covered[i])
        cells[: len(inputs), i], values[: len(inputs), i] = inputs, row[inputs]
    return cells, values


_SCRATCH: dict[tuple, np.ndarray] = {}


def scratch(shape: tuple[int, ...], dtype, tag: str = "") -> np.ndarray:
    """A work array shared by every caller in this process that asks for the same shape and tag.

    The envs of a worker run one after another and consume their work arrays within one call, so
    they can share them: 16 envs per worker then touch 16 stacks, not 16 sets of work buffers,
    which keeps a worker's working set in cache. Not for use across threads.
    """
    key = (tuple(shape), np.dtype(dtype).str, tag)
    if key not in _SCRATCH:
        _SCRATCH[key] = np.zeros(shape, dtype)
    return _SCRATCH[key]


class FrameStack:
    """The last `depth` frames as one [H, W, depth] uint8 array, oldest first, zeros at a start.

    With depth 4 on a little-endian machine, the 4 bytes of a pixel form one uint32, so pushing a
    frame is a shift and an or over H*W words (about 10x faster than moving a strided last axis).
    """

    def __init__(self, height: int, width: int, depth: int):
        self.array = np.zeros((height, width, depth), np.uint8)
        self._words = None
        if depth == 4 and sys.byteorder == "little":
            self._words = self.array.view(np.uint32).reshape(height, width)
            self._incoming = scratch((height, width), np.uint32, "stack-incoming")

    def clear(self) -> None:
        """Zeroes the stack: an episode starts on blank planes."""
        self.array.fill(0)

    def push(self, frame: np.ndarray) -> np.ndarray:
        """Appends `frame` [H, W] as the newest plane; returns the stack (reused, not a copy)."""
        if self._words is not None:
            np.right_shift(self._words, 8, out=self._words)
            np.left_shift(frame, 24, out=self._incoming, dtype=np.uint32)
            np.bitwise_or(self._words, self._incoming, out=self._words)
        else:
            self.array[:, :, :-1] = self.array[:, :, 1:]
            self.array[:, :, -1] = frame
        return self.array
