"""The builder: :class:`Kernel` records instructions on the three engine streams, inserts
the semaphore waits, and lays out the HBM image (see :mod:`opentrn.kernel`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opentrn import isa, numerics
from opentrn.config import Config
from opentrn.hdl.dma import _addr_bits

from .dependencies import _Tracker
from .errors import KernelError, _fail, _int
from .formats import _dtype_formats, _dtype_rule, tensor_format
from .program import Program
from .tensors import Pattern, PsumTile, SbufTile, Tensor, View, _as_view, _describe

#: Alignment of each instruction stream in the HBM image (an AXI4 4 KiB boundary).
PROGRAM_ALIGN = 4096
#: Alignment of each tensor in the HBM image.
TENSOR_ALIGN = 64
#: Activation functions by name, with their ``function`` code.
FUNCTIONS = {"identity": 0, "relu": 1}
#: Engine names, in engine-number order (``instruction_counts`` keys).
ENGINE_NAMES = ("dma", "tensor", "activation")
#: The byte written in output tensors before the run, so that a byte no instruction wrote
#: shows in the results.
OUTPUT_FILL = 0xA5

_DMA, _TENSOR, _ACT = isa.Engine.DMA, isa.Engine.TENSOR, isa.Engine.ACTIVATION
_SIZE_MAX = (1 << 16) - 1      # DMA n0, n1, n2 fields
_PART_MAX = (1 << 8) - 1       # DMA partition and partition-step fields
_SEM_MAX = (1 << 32) - 1       # semaphore values


def _align(value, alignment):
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class _HbmAddr:
    """An HBM address field resolved at build time: ``tensor`` start + ``offset``."""
    tensor: int
    offset: int


class Kernel:
    """Builds one kernel for ``config``; see :mod:`opentrn.kernel`."""

    def __init__(self, config: Config, name: str = "kernel"):
        if not isinstance(config, Config):
            _fail("config", config, "must be an opentrn.config.Config")
        if config.semaphores < len(isa.Engine):
            _fail("config.semaphores", config.semaphores,
                  f"must be at least {len(isa.Engine)}: one per engine")
        if config.pe_cols > config.sbuf_partitions:
            _fail("config.pe_cols", config.pe_cols,
                  f"must be at most sbuf_partitions={config.sbuf_partitions} (one "
                  "activation lane per SBUF partition)")
        self.config = config
        self.name = str(name)
        self.tensors: list[Tensor] = []
        self._names = set()
        self._streams = [[] for _ in isa.Engine]   # (opcode, fields) per instruction
        self._know = [[] for _ in isa.Engine]      # knowledge vector at each instruction
        self._known = [[0] * len(isa.Engine) for _ in isa.Engine]
        self._tracker = _Tracker()
        self._sbuf_live = {}      # tile index -> (b0, b1)
        self._psum_live = {}      # tile index -> (bank, e0, e1)
        self._next_tile = 0
        self._sbuf_align = max(4, config.dma_bus_bytes)
        # DMA addresses and strides must fit the build's descriptor fields (docs/isa.md).
        self._addr_limit = 1 << _addr_bits(config)
        self._stationary = None   # rows of the latest LOAD_STATIONARY, None before any
        self._load_pending = False
        self.macs = 0
        self._built = False

    # -- tensors and tiles --------------------------------------------------------------------

    def _new_name(self, name):
        if not isinstance(name, str) or not name:
            _fail("name", name, "must be a non-empty string")
        if name in self._names:
            _fail("name", name, "already names a tensor of this kernel")
        self._names.add(name)
        return name

    def _new_tensor(self, name, shape, dtype, kind, data=None):
        tensor = Tensor(len(self.tensors), name, shape, dtype, kind, data)
        self.tensors.append(tensor)
        self._tracker.new_key(("hbm", tensor.index), (0, tensor.nbytes))
        return tensor

    def input(self, name: str, array) -> Tensor:
        """An input tensor in HBM holding ``array`` (2-D, a dtype of
        :data:`FORMAT_DTYPES`)."""
        array = np.asarray(array)
        if array.ndim != 2 or 0 in array.shape:
            _fail(f"{name}.shape", array.shape, "must be 2-D and non-empty")
        if array.dtype not in _dtype_formats():
            _fail(f"{name}.dtype", str(array.dtype), _dtype_rule())
        name = self._new_name(name)
        return self._new_tensor(name, tuple(array.shape), array.dtype, "input", array.copy())

    def output(self, name: str, shape, dtype) -> Tensor:
        """An output tensor in HBM of ``shape`` (2-D) and ``dtype`` (of
        :data:`FORMAT_DTYPES`)."""
        try:
            shape = tuple(int(s) for s in shape)
        except TypeError:
            _fail(f"{name}.shape", shape, "must be a pair of positive integers")
        if len(shape) != 2 or min(shape) < 1:
            _fail(f"{name}.shape", shape, "must be a pair of positive integers")
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            _fail(f"{name}.dtype", dtype, _dtype_rule())
        if dtype not in _dtype_formats():
            _fail(f"{name}.dtype", str(dtype), _dtype_rule())
        name = self._new_name(name)
        return self._new_tensor(name, shape, dtype, "output")

    def sbuf(self, partitions: int, nbytes: int) -> SbufTile:
        """A tile of ``partitions`` partitions (from 0) x ``nbytes`` bytes, at the lowest
        free byte offset (aligned to ``max(4, dma_bus_bytes)``)."""
        cfg = self.config
        partitions = _int("partitions", partitions, 1, cfg.sbuf_partitions)
        size = cfg.sbuf_bytes_per_partition
        nbytes = _int("nbytes", nbytes, 1, size)
        start = self._find_space(sorted(self._sbuf_live.values()), nbytes, size,
                                 self._sbuf_align)
        if start is None:
            used = sum(b1 - b0 for b0, b1 in self._sbuf_live.values())
            _fail("nbytes", nbytes, f"no free SBUF range that large ({used} of {size} bytes "
                  f"per partition are in use by {len(self._sbuf_live)} tiles; free some)")
        tile = SbufTile(self._take_index(), partitions, start, nbytes)
        self._sbuf_live[tile.index] = (start, start + nbytes)
        self._tracker.new_key(("sbuf", tile.index), (start, start + nbytes))
        return tile

    def psum(self, entries: int, *, bank: int | None = None) -> PsumTile:
        """A tile of ``entries`` accumulators in one PSUM bank (the first with room, or
        ``bank``), in every PSUM partition."""
        cfg = self.config
        entries = _int("entries", entries, 1, cfg.psum_bank_entries)
        banks = range(cfg.psum_banks) if bank is None else [
            _int("bank", bank, 0, cfg.psum_banks - 1)]
        for b in banks:
            taken = sorted((e0, e1) for bb, e0, e1 in self._psum_live.values() if bb == b)
            start = self._find_space(taken, entries, cfg.psum_bank_entries, 1)
            if start is not None:
                tile = PsumTile(self._take_index(), b, start, entries, cfg.pe_cols,
                                cfg.psum_bank_entries)
                self._psum_live[tile.index] = (b, start, start + entries)
                self._tracker.new_key(("psum", tile.index), self._psum_span(tile))
                return tile
        _fail("entries", entries, f"no free range that large in PSUM bank(s) "
              f"{list(banks)} ({cfg.psum_bank_entries} entries per bank; free some)")

    @staticmethod
    def _psum_span(tile):
        return (tile.base, tile.base + 4 * tile.entries)

    def _take_index(self):
        self._next_tile += 1
        return self._next_tile

    @staticmethod
    def _find_space(taken, size, limit, alignment):
        position = 0
        for b0, b1 in taken:
            if position + size <= b0:
                return position
            position = max(position, _align(b1, alignment))
        return position if position + size <= limit else None

    def free(self, tile: SbufTile | PsumTile):
        """Return ``tile``'s space. Later tiles that reuse it are ordered after every
        instruction that used it (the accesses carry over)."""
        if isinstance(tile, SbufTile) and tile.index in self._sbuf_live:
            span = self._sbuf_live.pop(tile.index)
            self._tracker.retire(("sbuf", tile.index), span)
        elif isinstance(tile, PsumTile) and tile.index in self._psum_live:
            del self._psum_live[tile.index]
            self._tracker.retire(("psum", tile.index), self._psum_span(tile))
        else:
            _fail("tile", tile, "must be a live SBUF or PSUM tile of this kernel")

    def _check_live(self, name, view):
        base = view.base
        if isinstance(base, Tensor):
            if base.index >= len(self.tensors) or self.tensors[base.index] is not base:
                _fail(name, view, "is a tensor of another kernel")
        elif isinstance(base, SbufTile):
            if self._sbuf_live.get(base.index) != (base.offset, base.offset + base.nbytes):
                _fail(name, view, "is a view of a freed tile or one of another kernel")
        elif self._psum_live.get(base.index) != (base.bank, base.entry,
                                                  base.entry + base.entries):
            _fail(name, view, "is a view of a freed tile or one of another kernel")

    # -- regions ----------------------------------------------------------------------------

    def _key(self, base):
        return ("hbm" if isinstance(base, Tensor) else base.space, base.index)

    def _rect(self, view, all_rows=None):
        """The region of ``view``; ``all_rows`` replaces its rows (lanes an engine touches
        beyond the view)."""
        base = view.base
        r0, r1 = (view.r0, view.r1) if all_rows is None else all_rows
        if isinstance(base, Tensor):
            b0 = view.c0 * base.itemsize
            return (r0, r1, b0, b0 + view.row_bytes)
        start = base.offset if isinstance(base, SbufTile) else base.base
        b0 = start + view.c0 * view.unit_bytes
        return (r0, r1, b0, b0 + view.row_bytes)

    # -- emission ---------------------------------------------------------------------------

    def _emit(self, engine, opcode, fields, accesses):
        if self._built:
            raise KernelError(f"kernel {self.name!r}: already built; start a new Kernel")
        need = self._tracker.needs(engine, accesses)
        known = list(self._known[engine])
        waits = []
        while True:
            need = {f: v for f, v in need.items() if v > known[f]}
            if not need:
                break
            # Take first the wait that implies the most others (through what it knows).
            f, v = max(need.items(), key=lambda item: (self._implied(item, need), -item[0]))
            waits.append((f, v))
            self._learn(known, f, v)
        # Each NOP, then the instruction, knows what the waits up to its own imply.
        for f, v in waits[:-1]:
            self._learn(self._known[engine], f, v)
            self._append(engine, isa.Opcode.NOP, {"wait_sem": int(f), "wait_value": v})
        if waits:
            f, v = waits[-1]
            self._learn(self._known[engine], f, v)
            fields = {**fields, "wait_sem": int(f), "wait_value": v}
        idx = self._append(engine, opcode, fields)
        self._tracker.add(engine, idx, accesses)
        return idx

    def _implied(self, wait, need):
        f, v = wait
        vec = self._know[f][v - 1]
        return sum(1 for g, w in need.items() if g != f and vec[g] >= w)

    def _learn(self, known, f, v):
        """A stream with knowledge vector ``known`` waits for ``sem[f] >= v``: it now knows
        what instruction ``v - 1`` of ``f`` knew when it started, and that it completed."""
        vec = self._know[f][v - 1]
        for g in isa.Engine:
            known[g] = max(known[g], vec[g])
        known[f] = max(known[f], v)

    def _append(self, engine, opcode, fields):
        stream = self._streams[engine]
        idx = len(stream)
        if idx + 1 > _SEM_MAX:
            raise KernelError(f"kernel {self.name!r}: more than {_SEM_MAX} instructions on "
                              f"the {ENGINE_NAMES[engine]} stream (32-bit semaphores)")
        stream.append((opcode, {**fields, "signal_sem": int(engine)}))
        self._know[engine].append(tuple(self._known[engine]))
        return idx

    # -- DMA --------------------------------------------------------------------------------

    def dma(self, dst, src):
        """Copy view ``src`` to view ``dst`` (any of tensor, SBUF, PSUM views, of the same
        rows and row bytes). Rows of a tensor map to partitions of a tile in order."""
        dst = _as_view("dst", dst, (Tensor, SbufTile, PsumTile))
        src = _as_view("src", src, (Tensor, SbufTile, PsumTile))
        if dst.rows != src.rows:
            _fail("dst rows", dst.rows, f"must equal the src rows ({src.rows})")
        if dst.row_bytes != src.row_bytes:
            _fail("dst row bytes", dst.row_bytes, f"must equal the src row bytes "
                  f"({src.row_bytes}: {src.cols} x {src.unit_bytes} bytes)")
        sides = []
        for view in (src, dst):
            base = view.base
            if isinstance(base, Tensor):
                pattern = Pattern(base, offset=view.r0 * base.row_bytes + view.c0 *
                                  base.itemsize, stride1=base.row_bytes)
            else:
                pattern = Pattern(base, offset=view.c0 * view.unit_bytes,
                                  partition=view.r0, pstep1=1)
            sides.append(pattern)
        row = src.row_bytes
        # Whole elements of the wider side (int32, bf16...), larger ones if n0 needs it.
        unit = max(src.unit_bytes, dst.unit_bytes)
        elem = unit if row % unit == 0 else 1
        while row // elem > _SIZE_MAX and elem < 8 and row % (2 * elem) == 0:
            elem *= 2
        if row // elem > _SIZE_MAX:
            _fail("src row bytes", row, f"must be at most {_SIZE_MAX} elements of up to 8 "
                  "bytes (the DMA's n0); split the transfer")
        self.dma_pattern(sides[1], sides[0], n0=row // elem, n1=src.rows, elem_bytes=elem)

    def dma_pattern(self, dst: Pattern, src: Pattern, *, n0: int, n1: int = 1, n2: int = 1,
                    elem_bytes: int = 1):
        """One general DMA descriptor: ``n2 x n1`` rows of ``n0 * elem_bytes`` bytes from
        ``src`` to ``dst`` (:class:`Pattern`), as docs/isa.md's ``DMA``."""
        n0 = _int("n0", n0, 1, _SIZE_MAX)
        n1 = _int("n1", n1, 1, _SIZE_MAX)
        n2 = _int("n2", n2, 1, _SIZE_MAX)
        elem_bytes = _int("elem_bytes", elem_bytes, 1, 8)
        if elem_bytes not in (1, 2, 4, 8):
            _fail("elem_bytes", elem_bytes, "must be 1, 2, 4 or 8")
        row = n0 * elem_bytes
        fields = {"elem_log2": elem_bytes.bit_length() - 1, "n0": n0, "n1": n1, "n2": n2}
        accesses, extents = [], []
        for prefix, pattern in (("src", src), ("dst", dst)):
            if not isinstance(pattern, Pattern):
                _fail(prefix, pattern, "must be a Pattern")
            base = pattern.base
            self._check_live(prefix, View(base, 0, 1, 0, 1))
            for name in ("offset", "stride1", "stride2", "partition", "pstep1", "pstep2"):
                _int(f"{prefix}.{name}", getattr(pattern, name), 0)
            for name in ("stride1", "stride2"):
                # Even a stride of an axis of length 1 is a field the hardware checks.
                _int(f"{prefix}.{name}", getattr(pattern, name), 0, self._addr_limit - 1)
            last_byte = (pattern.offset + row - 1 + (n1 - 1) * pattern.stride1
                         + (n2 - 1) * pattern.stride2)
            last_part = (pattern.partition + (n1 - 1) * pattern.pstep1
                         + (n2 - 1) * pattern.pstep2)
            space = {Tensor: 0, SbufTile: 1, PsumTile: 2}[type(base)]
            size = base.nbytes
            if last_byte >= size:
                _fail(f"{prefix} pattern", pattern, f"reaches byte {last_byte} of "
                      f"{_describe(base)}, which has {size}")
            if space == 0:
                for name in ("partition", "pstep1", "pstep2"):
                    if getattr(pattern, name):
                        _fail(f"{prefix}.{name}", getattr(pattern, name),
                              "an HBM side has no partitions: partition, pstep1, pstep2 "
                              "must be 0")
                rect = self._hbm_rect(base, pattern, row, n1, n2)
                start = _HbmAddr(base.index, pattern.offset)
                extent = (space, base.index, pattern.offset, last_byte, (0, 0))
            else:
                if last_part >= base.partitions:
                    _fail(f"{prefix} pattern", pattern, f"reaches partition {last_part} of "
                          f"{_describe(base)}, which has {base.partitions}")
                for name in ("partition", "pstep1", "pstep2"):
                    _int(f"{prefix}.{name}", getattr(pattern, name), 0, _PART_MAX)
                origin = base.offset if space == 1 else base.base
                start = origin + pattern.offset
                rect = (pattern.partition, last_part + 1, start, origin + last_byte + 1)
                extent = (space, None, start, origin + last_byte,
                          (pattern.partition, last_part))
            extents.append(extent)
            fields.update({f"{prefix}_space": space, f"{prefix}_addr": start,
                           f"{prefix}_stride1": pattern.stride1,
                           f"{prefix}_stride2": pattern.stride2,
                           f"{prefix}_partition": pattern.partition,
                           f"{prefix}_pstep1": pattern.pstep1,
                           f"{prefix}_pstep2": pattern.pstep2})
            accesses.append((self._key(base), prefix == "dst", rect))
        (s_space, s_tensor, s_first, s_last, s_parts), \
            (d_space, d_tensor, d_first, d_last, d_parts) = extents
        if s_space == d_space and s_tensor == d_tensor:
            # The DMA refuses source and destination sharing bytes (and, in a buffer,
            # partitions): OVERLAP. Its test compares the extents, as here.
            bytes_meet = s_first <= d_last and d_first <= s_last
            parts_meet = s_parts[0] <= d_parts[1] and d_parts[0] <= s_parts[1]
            if bytes_meet and parts_meet:
                _fail("dst", dst, "shares bytes with src: the DMA refuses overlapping "
                      "transfers")
        self._emit(_DMA, isa.Opcode.DMA, fields, accesses)

    @staticmethod
    def _hbm_rect(tensor, pattern, row, n1, n2):
        """The rows x row-bytes bounding rectangle of a pattern over ``tensor``."""
        rb = tensor.row_bytes
        if n1 * n2 > 1 << 20:
            return (0, tensor.shape[0], 0, rb)
        starts = (pattern.offset + np.arange(n1, dtype=np.int64)[None, :] * pattern.stride1
                  + np.arange(n2, dtype=np.int64)[:, None] * pattern.stride2).ravel()
        first_rows, last_rows = starts // rb, (starts + row - 1) // rb
        r0, r1 = int(first_rows.min()), int(last_rows.max()) + 1
        if np.any(first_rows != last_rows):
            return (r0, r1, 0, rb)
        cols = starts % rb
        return (r0, r1, int(cols.min()), int(cols.max()) + row)

    # -- tensor engine ----------------------------------------------------------------------

    def _columns(self, name, view, fmt):
        """``(offset, columns)`` of an SBUF view of ``fmt`` columns
        (``numerics.column_bytes``: the format's MACs per PE per cycle x its element bytes):
        its bytes must be whole, aligned columns."""
        size = numerics.column_bytes(self.config, fmt.name)
        offset = view.base.offset + view.c0
        if offset % size or view.cols % size:
            per = self.config.macs_per_pe_cycle(fmt.name)
            what = f"{fmt.name} columns ({per} elements of K each)" if per > 1 else \
                f"{fmt.name} elements"
            _fail(f"{name} bytes", (offset, offset + view.cols), f"must be whole {what}: an "
                  f"offset and a length that are multiples of {size}")
        return offset, view.cols // size

    def _scale_view(self, name, scales, fmt, rows, cols):
        """``(fields, accesses)`` of the E8M0 scales of an MX operand of ``rows`` x ``cols``:
        an SBUF view of ``ceil(rows * r / 32)`` partitions from a multiple of ``mx_blocks``
        (block ``b`` in the view's partition ``b``: ``scale_partition``) and ``cols`` bytes;
        ``scales`` must be None for any other format."""
        if not fmt.mx:
            if scales is not None:
                _fail(name, scales, f"are for the MX formats, not {fmt.name}")
            return {}, []
        if scales is None:
            _fail(name, None, f"are required for {fmt.name}: an SBUF view of one E8M0 byte "
                  f"per column and block of {numerics.MX_BLOCK} rows")
        view = _as_view(name, scales, (SbufTile,))
        self._check_live(name, view)
        block_rows = numerics.mx_block_rows(self.config)
        blocks = -(-rows // block_rows)
        group = numerics.mx_blocks(self.config)      # the hardware's blocks a K tile
        if view.r0 % group or view.rows != blocks or view.cols != cols:
            _fail(name, view, f"must be {blocks} partition(s) from a multiple of {group} (one "
                  f"per block of {numerics.MX_BLOCK} elements of K: {block_rows} rows) x "
                  f"{cols} bytes (one per column)")
        return ({"scale_offset": view.base.offset + view.c0, "scale_partition": view.r0},
                [(self._key(view.base), False, self._rect(view))])

    def load_stationary(self, view, *, dtype: str = "int8", scales=None):
        """Load the stationary tile ``S[k, m]`` of ``dtype`` elements (a format of the
        build's ``dtypes``: ``int8``, ``bf16``, ``fp8e4m3``, ``fp8e5m2`` and the MX formats)
        from ``view``: rows are partitions ``0 .. rows-1`` (at most ``pe_rows``), columns
        ``column_bytes`` each (at most ``pe_cols``). A format with ``r`` MACs per PE per
        cycle (``Config.pe_macs_per_cycle``) has ``r`` elements of K per row and column,
        consecutive: ``S[p * r + j, m]`` is element ``j`` of column ``m`` of partition
        ``p`` (``r = 1``: ``S[k, m] = view[k, m]``).
        An MX format takes ``scales``, an SBUF view of ``ceil(rows * r / 32)`` partitions x
        ``cols`` bytes from a partition that is a multiple of ``numerics.mx_blocks(config)``
        (so the scales of several K tiles can share a byte range): the E8M0 scale of column
        ``m`` for K ``32 b .. 32 b + 31`` in the view's partition ``b``."""
        cfg = self.config
        fmt = tensor_format(self.config, dtype)
        view = _as_view("view", view, (SbufTile,))
        self._check_live("view", view)
        if view.r0 != 0:
            _fail("view rows", (view.r0, view.r1), "must start at partition 0 (the stationary "
                  "tile's row k is partition k)")
        if view.rows > cfg.pe_rows:
            _fail("view rows", view.rows, f"must be at most pe_rows={cfg.pe_rows}")
        offset, cols = self._columns("view", view, fmt)
        if cols > cfg.pe_cols:
            _fail("view columns", cols, f"must be at most pe_cols={cfg.pe_cols}")
        if self._load_pending:
            raise KernelError("load_stationary: the previous stationary tile has not been "
                              "used by a matmul yet (the two weight banks require one)")
        scale_fields, scale_accesses = self._scale_view("scales", scales, fmt, view.rows, cols)
        fields = {"sbuf_offset": offset, "rows": view.rows, "cols": cols,
                  "format": fmt.code, **scale_fields}
        self._emit(_TENSOR, isa.Opcode.LOAD_STATIONARY, fields,
                   [(self._key(view.base), False, self._rect(view)), *scale_accesses])
        self._stationary = (view.rows, cols, fmt)
        self._load_pending = True

    def matmul(self, psum, moving, *, accumulate: bool = False, scales=None):
        """``psum[m, j] (+)= sum_k S[k, m] * moving[k, j]`` with ``S`` the latest stationary
        tile, whose format the moving elements have: ``moving`` has that tile's rows
        (partitions from 0, each with ``r`` elements of K per column as the tile's) and
        ``n <= moving_max`` columns; ``psum`` (from partition 0) has
        ``n`` entries. Every PSUM partition is written (those past the tile's columns get
        0); ``accumulate`` adds in int32 (int8) or FP32 (the float formats). An MX tile
        takes the moving operand's ``scales`` (as :meth:`load_stationary`, ``n`` bytes)."""
        cfg = self.config
        psum = _as_view("psum", psum, (PsumTile,))
        moving = _as_view("moving", moving, (SbufTile,))
        self._check_live("psum", psum)
        self._check_live("moving", moving)
        if self._stationary is None:
            raise KernelError("matmul: no load_stationary before it")
        rows, cols, fmt = self._stationary
        if moving.r0 != 0 or moving.rows != rows:
            _fail("moving rows", (moving.r0, moving.r1), f"must be partitions 0..{rows - 1}, "
                  f"the rows of the stationary tile")
        offset, n = self._columns("moving", moving, fmt)
        if n > cfg.moving_max:
            _fail("moving columns", n, f"must be at most moving_max={cfg.moving_max}")
        if psum.r0 != 0:
            _fail("psum rows", (psum.r0, psum.r1), "must start at partition 0")
        if psum.cols != n:
            _fail("psum entries", psum.cols, f"must equal the moving columns ({n})")
        if not isinstance(accumulate, bool | np.bool_):
            _fail("accumulate", accumulate, "must be a bool")
        scale_fields, scale_accesses = self._scale_view("scales", scales, fmt, rows, n)
        fields = {"sbuf_offset": offset, "n": n,
                  "psum_bank": psum.base.bank, "psum_entry": psum.base.entry + psum.c0,
                  "accumulate": int(accumulate), "format": fmt.code, **scale_fields}
        self._emit(_TENSOR, isa.Opcode.MATMUL, fields, [
            (self._key(moving.base), False, self._rect(moving)),
            (self._key(psum.base), True, self._rect(psum, (0, cfg.pe_cols))),
            *scale_accesses])
        self._load_pending = False
        self.macs += rows * self.config.macs_per_pe_cycle(fmt.name) * cols * n

    # -- activation engine ------------------------------------------------------------------

    def activation(self, dst, src, *, function: str = "identity", multiplier: int = 1,
                   shift: int = 0, scale: float | None = None, bias=None, out: str = "int8"):
        """One ``ACTIVATE`` over every lane ``p < pe_cols`` (views from partition 0), ``n``
        results of ``out`` into ``dst`` (``n`` x its element bytes):

        * integer path (``out`` ``"int8"`` or ``"int32"``): ``dst[p, j] =
          saturate(f(round_half_even((src[p, j] * multiplier + bias[p]) / 2**shift)))``,
          ``src`` a PSUM view (accumulators) or an SBUF view (int8 bytes), ``bias`` an SBUF
          view of one int32 (4 bytes) per partition;
        * float path (``out`` ``"fp32"`` or a float format of the build): ``dst[p, j] =
          cast(f(src[p, j] * scale + bias[p]))`` in FP32 (docs/numerics.md), ``src`` a PSUM
          view (FP32 accumulators), ``scale`` a float (rounded to FP32; default 1.0),
          ``bias`` an SBUF view of one FP32 per partition."""
        cfg = self.config
        dst = _as_view("dst", dst, (SbufTile,))
        src = _as_view("src", src, (SbufTile, PsumTile))
        self._check_live("dst", dst)
        self._check_live("src", src)
        if not isinstance(function, str) or function not in FUNCTIONS:
            _fail("function", function, f"must be one of {', '.join(FUNCTIONS)}")
        outs = [f.name for f in numerics.activation_formats(cfg)]
        if out not in outs:
            _fail("out", out, f"must be one of this build's activation outputs: "
                  f"{', '.join(outs)}")
        fmt = numerics.data_format(out)
        floating = fmt.element is not None
        if floating:
            if multiplier != 1 or shift != 0:
                _fail("multiplier, shift", (multiplier, shift), f"the float path (out={out}) "
                      "takes scale=, not an integer multiplier and shift")
            scale = 1.0 if scale is None else scale
            if isinstance(scale, bool) or not isinstance(scale, int | float | np.floating):
                _fail("scale", scale, "must be a number")
            if not isinstance(src.base, PsumTile):
                _fail("src", src, f"must be a PSUM view for the float path (out={out}): the "
                      "SBUF source is int8")
            code = int(np.float32(scale).view(np.uint32))
            multiplier = code - (1 << 32) if code >> 31 else code     # the s32 field
        else:
            if scale is not None:
                _fail("scale", scale, f"is for the float path; out={out} takes multiplier "
                      "and shift")
            multiplier = _int("multiplier", multiplier, -(1 << 31), (1 << 31) - 1)
            shift = _int("shift", shift, 0, 63)
        lanes = (0, cfg.pe_cols)
        for name, view in (("dst", dst), ("src", src)):
            if view.r0 != 0:
                _fail(f"{name} rows", (view.r0, view.r1), "must start at partition 0 (lane p "
                      f"is partition p; all {cfg.pe_cols} lanes are computed)")
        n = src.cols
        if n > cfg.moving_max:
            _fail("src columns", n, f"must be at most moving_max={cfg.moving_max}")
        size = fmt.bytes
        if dst.cols != n * size:
            _fail("dst bytes", dst.cols, f"must be {n * size}: {n} results of {size} bytes")
        dst_offset = dst.base.offset + dst.c0
        if dst_offset % size:
            _fail("dst offset", dst_offset, f"must be a multiple of {size} for {out} results")
        fields = {"function": FUNCTIONS[function], "out_format": fmt.code,
                  "shift": shift, "n": n, "multiplier": multiplier, "dst_offset": dst_offset}
        accesses = [(self._key(dst.base), True, self._rect(dst, lanes))]
        if isinstance(src.base, PsumTile):
            fields.update(src=0, psum_bank=src.base.bank, psum_entry=src.base.entry + src.c0)
        else:
            src_offset = src.base.offset + src.c0
            disjoint = src_offset + n <= dst_offset or dst_offset + n * size <= src_offset
            if not (disjoint or (src_offset == dst_offset and out == "int8")):
                _fail("dst", dst, "must not overlap src unless it is the same bytes with "
                      "int8 results")
            fields.update(src=1, src_offset=src_offset)
        accesses.append((self._key(src.base), False, self._rect(src, lanes)))
        if bias is not None:
            bias = _as_view("bias", bias, (SbufTile,))
            self._check_live("bias", bias)
            kind = "FP32" if floating else "int32"
            if bias.r0 != 0 or bias.cols != 4:
                _fail("bias", bias, f"must be 4 bytes (one {kind}) per partition, from "
                      "partition 0")
            bias_offset = bias.base.offset + bias.c0
            if bias_offset % 4:
                _fail("bias offset", bias_offset, "must be a multiple of 4")
            fields.update(bias=1, bias_offset=bias_offset)
            accesses.append((self._key(bias.base), False, self._rect(bias, lanes)))
        self._emit(_ACT, isa.Opcode.ACTIVATE, fields, accesses)

    # -- build ------------------------------------------------------------------------------

    def build(self) -> Program:
        """The :class:`Program`: every stream ended by ``END``, laid out in one image."""
        if self._built:
            raise KernelError(f"kernel {self.name!r}: already built")
        if not any(t.kind == "output" for t in self.tensors):
            raise KernelError(f"kernel {self.name!r}: has no output tensor")
        self._built = True
        cfg = self.config
        streams = [s + [(isa.Opcode.END, {})] for s in self._streams]
        programs, position = [], 0
        for stream in streams:
            position = _align(position, PROGRAM_ALIGN)
            programs.append(position)
            position += sum(isa.instruction_bytes(op) for op, _ in stream)
        addrs = []
        for tensor in self.tensors:
            position = _align(position, TENSOR_ALIGN)
            addrs.append(position)
            position += tensor.nbytes
        total = _align(position, PROGRAM_ALIGN)
        if total > cfg.hbm_bytes:
            raise KernelError(f"kernel {self.name!r}: the image needs {total} bytes, more than "
                              f"hbm_bytes={cfg.hbm_bytes}")
        hbm = np.zeros(total, np.uint8)
        for start, stream in zip(programs, streams, strict=True):
            words = []
            for opcode, fields in stream:
                values = {k: (addrs[v.tensor] + v.offset if isinstance(v, _HbmAddr) else v)
                          for k, v in fields.items()}
                words.append(isa.encode(opcode, **values))
            code = b"".join(words)
            hbm[start:start + len(code)] = np.frombuffer(code, np.uint8)
        inputs, outputs = {}, {}
        for tensor, addr in zip(self.tensors, addrs, strict=True):
            if tensor.kind == "input":
                data = tensor.data.astype(tensor.dtype.newbyteorder("<")).tobytes()
                hbm[addr:addr + tensor.nbytes] = np.frombuffer(data, np.uint8)
                inputs[tensor.name] = (addr, tensor.shape, tensor.dtype.name)
            else:
                hbm[addr:addr + tensor.nbytes] = OUTPUT_FILL
                outputs[tensor.name] = (addr, tensor.shape, tensor.dtype.name)
        counts = {name: len(s) for name, s in zip(ENGINE_NAMES, streams, strict=True)}
        opcode_counts = {}
        for name, stream in zip(ENGINE_NAMES, streams, strict=True):
            per = {}
            for op, _ in stream:
                per[op.name] = per.get(op.name, 0) + 1
            opcode_counts[name] = per
        return Program(config=cfg, hbm=hbm, programs=tuple(programs), inputs=inputs,
                       outputs=outputs, instruction_counts=counts, macs=self.macs,
                       name=self.name, opcode_counts=opcode_counts)
