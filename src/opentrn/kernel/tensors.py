"""Tensors in HBM, tiles in the SBUF and PSUM, views of them and DMA patterns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import _fail


@dataclass(frozen=True, eq=False)
class Tensor:
    """A 2-D row-major tensor in HBM (a dtype of :data:`FORMAT_DTYPES`), an input (with
    data) or an output."""
    index: int
    name: str
    shape: tuple
    dtype: np.dtype
    kind: str                       # "input" or "output"
    data: np.ndarray | None = field(default=None, repr=False)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def row_bytes(self):
        return self.shape[1] * self.itemsize

    @property
    def nbytes(self):
        return self.shape[0] * self.row_bytes

    @property
    def space(self):
        return "hbm"

    def __getitem__(self, key):
        return View._make(self, key, self.shape, "elements")


@dataclass(frozen=True, eq=False)
class SbufTile:
    """An SBUF tile: partitions ``0 .. partitions-1``, bytes ``offset .. offset+nbytes-1``.
    The byte range is reserved in every partition (the activation engine writes all
    ``pe_cols`` lanes), so a tile never shares bytes with another live tile."""
    index: int
    partitions: int
    offset: int
    nbytes: int

    @property
    def shape(self):
        return (self.partitions, self.nbytes)

    @property
    def space(self):
        return "sbuf"

    def __getitem__(self, key):
        return View._make(self, key, self.shape, "bytes")


@dataclass(frozen=True, eq=False)
class PsumTile:
    """A PSUM tile: entries ``entry .. entry+entries-1`` of bank ``bank`` in every PSUM
    partition (``pe_cols``); each entry is one 4-byte accumulator."""
    index: int
    bank: int
    entry: int
    entries: int
    partitions: int
    bank_entries: int

    @property
    def shape(self):
        return (self.partitions, self.entries)

    @property
    def nbytes(self):
        return 4 * self.entries

    @property
    def base(self):
        """Byte address of the first entry in the DMA's PSUM address space."""
        return (self.bank * self.bank_entries + self.entry) * 4

    @property
    def space(self):
        return "psum"

    def __getitem__(self, key):
        return View._make(self, key, self.shape, "entries")


@dataclass(frozen=True)
class View:
    """A rectangle of a tensor or tile: rows (tensor rows, tile partitions) ``r0:r1`` and
    columns ``c0:c1`` in the base's units (tensor elements, SBUF bytes, PSUM entries)."""
    base: Tensor | SbufTile | PsumTile
    r0: int
    r1: int
    c0: int
    c1: int

    @staticmethod
    def _make(base, key, shape, unit):
        if not isinstance(key, tuple):
            key = (key, slice(None))
        if len(key) != 2:
            _fail("index", key, "must be two slices: [rows, columns]")
        bounds = []
        for axis, (k, size, what) in enumerate(zip(key, shape, ("rows", unit), strict=True)):
            if isinstance(k, int | np.integer) and not isinstance(k, bool):
                k = slice(int(k), int(k) + 1) if k >= 0 else slice(size + k, size + k + 1)
            if not isinstance(k, slice) or k.step not in (None, 1):
                _fail(f"index[{axis}]", k, "must be an integer or a slice without step")
            start, stop, _ = k.indices(size)
            given = (k.start, k.stop)
            if any(g is not None and not -size <= g <= size for g in given) or stop <= start:
                _fail(f"index[{axis}]", k, f"must be a non-empty range of the {size} {what} "
                      f"of {_describe(base)}")
            bounds += [start, stop]
        return View(base, *bounds)

    @property
    def rows(self):
        return self.r1 - self.r0

    @property
    def cols(self):
        return self.c1 - self.c0

    @property
    def unit_bytes(self):
        """Bytes of one column unit."""
        base = self.base
        return base.itemsize if isinstance(base, Tensor) else 4 if isinstance(
            base, PsumTile) else 1

    @property
    def row_bytes(self):
        return self.cols * self.unit_bytes


def _describe(base):
    if isinstance(base, Tensor):
        return f"tensor {base.name!r} {base.shape} {base.dtype}"
    if isinstance(base, SbufTile):
        return f"SBUF tile #{base.index} ({base.partitions} partitions x {base.nbytes} bytes)"
    return f"PSUM tile #{base.index} (bank {base.bank}, {base.entries} entries)"


def _as_view(name, value, kinds):
    if isinstance(value, Tensor | SbufTile | PsumTile):
        value = value[:, :]
    if not isinstance(value, View) or not isinstance(value.base, kinds):
        _fail(name, value, "must be a view of " + " or ".join(k.__name__ for k in kinds))
    return value


@dataclass(frozen=True)
class Pattern:
    """One side of a general (3-D) DMA transfer (:meth:`Kernel.dma_pattern`): row
    ``(i1, i2)`` starts ``offset + i1 * stride1 + i2 * stride2`` bytes into ``base`` (a
    tensor: from its first byte; a tile: from its first byte) and, in a tile, in partition
    ``partition + i1 * pstep1 + i2 * pstep2``. Strides and steps are unsigned."""
    base: Tensor | SbufTile | PsumTile
    offset: int = 0
    stride1: int = 0
    stride2: int = 0
    partition: int = 0
    pstep1: int = 0
    pstep2: int = 0
