"""Golden model of the whole core: the ISA machine of docs/isa.md on numpy images of HBM,
SBUF, PSUM and the semaphores, with the same results and error codes as the RTL core.

The three engines run in round robin (0, 1, 2). In its turn an unfinished engine fetches
the instruction at its pc, checks it (opcode, semaphore indices, then the instruction's
rules, ``BAD_FIELD`` before ``OUT_OF_RANGE``) and, if its wait holds, executes it
atomically: it completes at once, its signal applies and the pc advances. Checking comes
before waiting, as in the hardware's sequencer. Because semaphores only increment and waits
are ``>=``, a correctly synchronised program has one result whatever the interleaving; the
round robin only decides which of two independent faults is reported first.

A full round in which no engine makes progress while one is unfinished is ``DEADLOCK``
(every unfinished engine waits and nothing is in flight). The first fault ends the run; the
images are as the completed instructions left them (a ``DMA`` that finishes with an error
has moved what the DMA moves before it reports; it is the faulting instruction: it neither
retires nor signals).

Timing is the RTL's: the golden machine knows only the ``dma_bytes`` and ``macs`` counters.
"""

from dataclasses import dataclass

import numpy as np

from opentrn import isa, numerics
from opentrn.config import ConfigError
from opentrn.hdl import host_registers
from opentrn.hdl.dma import ErrorCode, Space, _addr_bits, buffer_geometry

from . import activation_engine, dma, fp_adder, tensor_engine
from .processing_element import wrap

__all__ = ["COUNTERS", "Outcome", "Core", "run"]

#: The core's performance counters (docs/registers.md), in register order.
COUNTERS = tuple(host_registers.COUNTERS)

#: The counters the golden machine computes; the others are timing, known only to the RTL.
_KNOWN_COUNTERS = ("dma_bytes", "macs")

_SEMAPHORE_MASK = (1 << 32) - 1     # 32-bit counters

#: The opcode bytes each engine accepts (an unknown byte is in none).
_ENGINE_CODES = {engine: frozenset(int(op) for op in ops)
                 for engine, ops in isa.ENGINE_OPCODES.items()}


@dataclass
class Outcome:
    """How a run ended, and the state it left."""
    fault: isa.Fault            # NONE when every engine reached END
    engine: isa.Engine | None   # faulting engine (None if no fault)
    pc: int | None              # byte address of the faulting instruction
    dma_error_code: int         # the DMA ErrorCode with DMA_ERROR, else 0
    counters: dict              # name -> int, or None for the counters only the RTL knows
    hbm: np.ndarray             # final images (uint8); the RTL runner fills only hbm
    sbuf: np.ndarray | None
    psum: np.ndarray | None
    retired: dict               # isa.Engine -> instructions completed (END included)
    semaphores: list[int]
    timeline: object = None     # an RTL run's opentrn.timeline.Timeline, when asked for


class _Fault(Exception):
    def __init__(self, fault, dma_error_code=0):
        super().__init__(fault)
        self.fault = isa.Fault(fault)
        self.dma_error_code = int(dma_error_code)


def _require(condition, fault):
    if not condition:
        raise _Fault(fault)


def _initial(name, value, shape):
    """A private copy of an initial buffer image (zeros by default)."""
    if value is None:
        return np.zeros(shape, np.uint8)
    array = np.asarray(value)
    if array.shape != shape or array.dtype != np.uint8:
        raise ValueError(f"{name} is {array.dtype} {array.shape}: must be uint8 {shape}")
    return array.copy()


class _Machine:
    """The state of one run."""

    def __init__(self, config, images, programs):
        self.config = config
        self.images = images
        # The golden PSUM's tensor-engine writes and activation reads, on our image.
        self.pcs = [int(p) for p in programs]
        self.finished = [False] * len(isa.Engine)
        self.retired = {engine: 0 for engine in isa.Engine}
        self.semaphores = [0] * config.semaphores
        self.counters = {name: 0 for name in _KNOWN_COUNTERS}
        # Tensor engine: the stationary tile in use, its (rows, cols), and whether a load
        # has happened / has not been followed by a matmul yet.
        self.stationary = None
        self.tile = None
        self.load_pending = False
        self.tile_format = None          # the DataFormat of the latest load
        self.addr_limit = 1 << _addr_bits(config)
        self.checks = {
            isa.Opcode.END: lambda f: None, isa.Opcode.NOP: lambda f: None,
            isa.Opcode.DMA: self._check_dma,
            isa.Opcode.LOAD_STATIONARY: self._check_load,
            isa.Opcode.MATMUL: self._check_matmul,
            isa.Opcode.ACTIVATE: self._check_activate,
        }
        self.executes = {
            isa.Opcode.END: lambda f: None, isa.Opcode.NOP: lambda f: None,
            isa.Opcode.DMA: self._dma,
            isa.Opcode.LOAD_STATIONARY: self._load,
            isa.Opcode.MATMUL: self._matmul,
            isa.Opcode.ACTIVATE: self._activate,
        }

    # -- fetch, check, wait, execute --------------------------------------------------------

    def _fetch(self, engine, pc):
        """``(opcode, fields, size)`` of the instruction at ``pc``, as the engine's sequencer
        sees it: an opcode the engine does not accept is refused on its first word (another
        engine's ``DMA`` is not fetched whole)."""
        hbm = self.images.hbm
        _require(pc % isa.WORD_BYTES == 0 and pc + isa.WORD_BYTES <= len(hbm),
                 isa.Fault.FETCH_ERROR)
        code = int(hbm[pc])
        if code not in _ENGINE_CODES[engine]:
            raise _Fault(isa.Fault.ILLEGAL_OPCODE)
        # Only the DMA engine accepts the two-word DMA: it reads the second word.
        size = isa.instruction_bytes(code)
        _require(pc + size <= len(hbm), isa.Fault.FETCH_ERROR)
        opcode, fields = isa.decode(bytes(hbm[pc:pc + size]))
        return opcode, fields, size

    def step(self, engine):
        """One turn of ``engine``: True if it completed an instruction."""
        pc = self.pcs[engine]
        opcode, f, size = self._fetch(engine, pc)
        count = self.config.semaphores
        _require(not (f["wait"] and f["wait_sem"] >= count)
                 and not (f["signal"] and f["signal_sem"] >= count), isa.Fault.BAD_FIELD)
        self.checks[opcode](f)
        if f["wait"] and self.semaphores[f["wait_sem"]] < f["wait_value"]:
            return False
        self.executes[opcode](f)
        if f["signal"]:
            index = f["signal_sem"]
            self.semaphores[index] = (self.semaphores[index] + 1) & _SEMAPHORE_MASK
        self.retired[engine] += 1
        self.pcs[engine] = pc + size
        if opcode == isa.Opcode.END:
            self.finished[engine] = True
        return True

    # -- DMA --------------------------------------------------------------------------------

    def _check_dma(self, f):
        for side in ("src", "dst"):
            for name in ("addr", "stride1", "stride2"):
                _require(f[f"{side}_{name}"] < self.addr_limit, isa.Fault.OUT_OF_RANGE)

    def _dma(self, f):
        def side(prefix):
            code = f[f"{prefix}_space"]
            # Space 3 is not a Space; the DMA refuses it itself (BAD_SPACE).
            space = Space(code) if code < len(Space) else code
            return dma.Side(space, addr=f[f"{prefix}_addr"],
                            partition=f[f"{prefix}_partition"],
                            stride1=f[f"{prefix}_stride1"], stride2=f[f"{prefix}_stride2"],
                            pstep1=f[f"{prefix}_pstep1"], pstep2=f[f"{prefix}_pstep2"])

        desc = dma.Descriptor(side("src"), side("dst"), n0=f["n0"], n1=f["n1"], n2=f["n2"],
                              elem_log2=f["elem_log2"])
        code = dma.execute(self.config, self.images, desc)
        if code != ErrorCode.OK:
            raise _Fault(isa.Fault.DMA_ERROR, code)
        self.counters["dma_bytes"] += desc.row_bytes * desc.n1 * desc.n2

    # -- tensor engine ----------------------------------------------------------------------

    def _column_bytes(self, f):
        """Bytes of one column of the instruction's ``format`` in a partition
        (``numerics.column_bytes``: its MACs per PE per cycle x its element bytes);
        ``ILLEGAL_OPCODE`` for a format the build lacks."""
        codes = {fmt.code: fmt for fmt in numerics.matmul_formats(self.config)}
        _require(f["format"] in codes, isa.Fault.ILLEGAL_OPCODE)
        return numerics.column_bytes(self.config, codes[f["format"]].name)

    def _check_scale_partition(self, f):
        """An MX instruction's ``scale_partition`` is a multiple of the build's blocks
        (``mx_blocks``), else ``BAD_FIELD``."""
        if numerics.format_of_code(f["format"]).mx:
            _require(f["scale_partition"] % numerics.mx_blocks(self.config) == 0,
                     isa.Fault.BAD_FIELD)

    def _check_scales(self, f, count):
        """An MX instruction's scales (``count`` bytes from ``scale_offset`` in the blocks'
        partitions from ``scale_partition``) lie in the SBUF, else ``OUT_OF_RANGE``."""
        cfg = self.config
        if numerics.format_of_code(f["format"]).mx:
            _require(f["scale_offset"] + count <= cfg.sbuf_bytes_per_partition
                     and f["scale_partition"] + numerics.mx_blocks(cfg) <= cfg.sbuf_partitions,
                     isa.Fault.OUT_OF_RANGE)

    def _scales(self, rows, f, count):
        """The E8M0 scales of ``count`` columns of a tile of ``rows`` rows (partitions):
        ``[blocks, count]`` for the ``mx_blocks`` blocks of 32 elements of K
        (``mx_block_rows`` partitions each), block ``b``'s from SBUF partition
        ``scale_partition + b`` at ``scale_offset``; blocks that start past ``rows`` get 127
        (``2**0``)."""
        blocks = numerics.mx_blocks(self.config)
        used = -(-rows // numerics.mx_block_rows(self.config))
        scales = np.full((blocks, count), numerics.E8M0_BIAS, np.int64)
        first, offset = f["scale_partition"], f["scale_offset"]
        scales[:used] = self.images.sbuf[first:first + used, offset:offset + count]
        return scales

    def _check_load(self, f):
        cfg = self.config
        size = self._column_bytes(f)
        _require(not self.load_pending, isa.Fault.BAD_FIELD)
        _require(1 <= f["rows"] <= cfg.pe_rows and 1 <= f["cols"] <= cfg.pe_cols,
                 isa.Fault.BAD_FIELD)
        _require(f["sbuf_offset"] % size == 0, isa.Fault.BAD_FIELD)
        self._check_scale_partition(f)
        _require(f["sbuf_offset"] + f["cols"] * size <= cfg.sbuf_bytes_per_partition,
                 isa.Fault.OUT_OF_RANGE)
        self._check_scales(f, f["cols"])

    def _elements(self, rows, offset, count, fmt):
        """``count`` columns of ``fmt`` from byte ``offset`` of SBUF partitions ``< rows``:
        int8 values, or the codes of a float format, ``[rows * r, count]`` int64 with ``r``
        the format's MACs per PE per cycle: column ``c`` of partition ``p`` holds the ``r``
        consecutive elements ``p * r .. p * r + r - 1`` of K, the first at the lowest
        address."""
        rate = self.config.macs_per_pe_cycle(fmt.name)
        raw = self.images.sbuf[:rows, offset:offset + count * rate * fmt.bytes].copy()
        if fmt.element is None:
            values = raw.view(np.int8)
        else:
            values = raw.view(np.dtype(fmt.element.uint_type).newbyteorder("<"))
        values = values.astype(np.int64).reshape(rows, count, rate)
        return values.transpose(0, 2, 1).reshape(rows * rate, count)

    def _load(self, f):
        cfg = self.config
        rows, cols, offset = f["rows"], f["cols"], f["sbuf_offset"]
        fmt = numerics.format_of_code(f["format"])
        tile = np.zeros((tensor_engine.contraction(cfg, fmt.name), cfg.pe_cols), np.int64)
        elements = self._elements(rows, offset, cols, fmt)
        tile[:len(elements), :cols] = elements
        self.stationary, self.tile, self.load_pending = tile, (rows, cols), True
        self.tile_format = fmt
        if fmt.mx:
            self.tile_scales = np.full((numerics.mx_blocks(cfg), cfg.pe_cols),
                                       numerics.E8M0_BIAS, np.int64)
            self.tile_scales[:, :cols] = self._scales(rows, f, cols)

    def _check_matmul(self, f):
        cfg = self.config
        size = self._column_bytes(f)
        _require(self.stationary is not None, isa.Fault.BAD_FIELD)
        _require(1 <= f["n"] <= cfg.moving_max, isa.Fault.BAD_FIELD)
        _require(f["sbuf_offset"] % size == 0, isa.Fault.BAD_FIELD)
        _require(f["format"] == self.tile_format.code, isa.Fault.BAD_FIELD)
        self._check_scale_partition(f)
        _require(f["sbuf_offset"] + f["n"] * size <= cfg.sbuf_bytes_per_partition
                 and f["psum_bank"] < cfg.psum_banks
                 and f["psum_entry"] + f["n"] <= cfg.psum_bank_entries,
                 isa.Fault.OUT_OF_RANGE)
        self._check_scales(f, f["n"])

    def _matmul(self, f):
        cfg = self.config
        n, offset = f["n"], f["sbuf_offset"]
        fmt = self.tile_format
        rows, cols = self.tile
        # Outside the tile nothing contributes: partitions >= rows enter as 0, PSUM
        # partitions >= cols receive 0 (a float 0 * inf would be NaN).
        moving = np.zeros((tensor_engine.contraction(cfg, fmt.name), n), np.int64)
        elements = self._elements(rows, offset, n, fmt)
        moving[:len(elements)] = elements
        bank, entry = f["psum_bank"], f["psum_entry"]
        if fmt.element is None:
            out = tensor_engine.matmul(cfg, self.stationary, moving)      # [M, n], wrapped
            if f["accumulate"]:
                out = wrap(self._psum_read(bank, entry, n) + out, cfg.acc_bits)
        else:
            # FP32 codes, summed down the column, then into the PSUM (docs/numerics.md).
            scales = {}
            if fmt.mx:
                scales = {"scale_stationary": self.tile_scales,
                          "scale_moving": self._scales(rows, f, n)}
            out = tensor_engine.matmul_float(self.stationary, moving, fmt.name, **scales)
            out[cols:] = 0
            if f["accumulate"]:
                psum = self._psum_read(bank, entry, n) & 0xFFFF_FFFF
                out = fp_adder.add(psum, out)
        self._psum_store(bank, entry, out)
        self.counters["macs"] += rows * cfg.macs_per_pe_cycle(fmt.name) * cols * n
        self.load_pending = False

    def _psum_entries(self, bank, entry, n):
        """The bytes of entries ``entry .. entry + n - 1`` of ``bank`` in every partition:
        a view of the image, ``[pe_cols, n, 4]``."""
        first = (bank * self.config.psum_bank_entries + entry) * 4
        return self.images.psum[:, first:first + 4 * n].reshape(self.config.pe_cols, n, 4)

    def _psum_read(self, bank, entry, n):
        """``[pe_cols, n]`` entries as ``acc_bits`` signed values (as PSUM's ``act_read``,
        golden/psum.py, reads one)."""
        stored = self._psum_entries(bank, entry, n).copy().view("<i4")[..., 0]
        return wrap(stored.astype(np.int64), self.config.acc_bits)

    def _psum_store(self, bank, entry, values):
        """Results ``[pe_cols, n]`` (``acc_bits`` values, or FP32 codes) into consecutive
        entries (as PSUM's ``te_write`` writes one), as 32-bit little-endian words: an
        integer sign-extended, a code as it is."""
        entries = self._psum_entries(bank, entry, values.shape[1])
        words = (np.asarray(values, np.int64) & 0xFFFF_FFFF).astype("<u4")
        entries[...] = words.view(np.uint8).reshape(entries.shape)

    # -- activation engine ------------------------------------------------------------------

    def _check_activate(self, f):
        cfg = self.config
        formats = {fmt.code: fmt for fmt in numerics.activation_formats(cfg)}
        _require(f["out_format"] in formats, isa.Fault.ILLEGAL_OPCODE)
        out = formats[f["out_format"]]
        n, size, floating = f["n"], out.bytes, out.element is not None
        _require(1 <= n <= cfg.moving_max, isa.Fault.BAD_FIELD)
        _require(f["dst_offset"] % size == 0, isa.Fault.BAD_FIELD)
        _require(not f["bias"] or f["bias_offset"] % 4 == 0, isa.Fault.BAD_FIELD)
        _require(not floating or (not f["src"] and f["shift"] == 0), isa.Fault.BAD_FIELD)
        if f["src"]:
            src, dst = f["src_offset"], f["dst_offset"]
            disjoint = src + n <= dst or dst + n * size <= src
            in_place = src == dst and out.name == "int8"
            _require(disjoint or in_place, isa.Fault.BAD_FIELD)
        if f["src"]:
            _require(f["src_offset"] + n <= cfg.sbuf_bytes_per_partition,
                     isa.Fault.OUT_OF_RANGE)
        else:
            _require(f["psum_bank"] < cfg.psum_banks
                     and f["psum_entry"] + n <= cfg.psum_bank_entries, isa.Fault.OUT_OF_RANGE)
        _require(f["dst_offset"] + n * size <= cfg.sbuf_bytes_per_partition,
                 isa.Fault.OUT_OF_RANGE)
        _require(not f["bias"] or f["bias_offset"] + 4 <= cfg.sbuf_bytes_per_partition,
                 isa.Fault.OUT_OF_RANGE)

    def _activate(self, f):
        cfg = self.config
        lanes, n = cfg.pe_cols, f["n"]
        out = numerics.format_of_code(f["out_format"])
        floating = out.element is not None
        sbuf = self.images.sbuf
        if f["bias"]:
            offset = f["bias_offset"]
            bias = sbuf[:lanes, offset:offset + 4].copy().view("<i4" if not floating
                                                                else "<u4").reshape(lanes)
        else:
            bias = np.zeros(lanes, np.int32)
        if f["src"]:
            offset = f["src_offset"]
            x = sbuf[:lanes, offset:offset + n].view(np.int8).astype(np.int64)
        else:
            x = self._psum_read(f["psum_bank"], f["psum_entry"], n)
            if floating:
                x = x & 0xFFFF_FFFF                     # the FP32 codes
        y = activation_engine.activate(cfg, x, function=f["function"],
                                       multiplier=f["multiplier"], shift=f["shift"],
                                       bias=bias.astype(np.int64), out_format=out.name)
        offset, size = f["dst_offset"], out.bytes
        # Little-endian, the low ``size`` bytes of each result (int8/int32 two's complement).
        words = (np.asarray(y, np.int64) & 0xFFFF_FFFF).astype("<u4").view(np.uint8)
        sbuf[:lanes, offset:offset + size * n] = words.reshape(lanes, n, 4)[..., :size] \
            .reshape(lanes, size * n)


class Core:
    """The golden core of ``config``: the formats of its ``dtypes``, at their MACs per PE
    per cycle."""

    def __init__(self, config):
        if config.pe_cols > config.sbuf_partitions:
            raise ConfigError(f"pe_cols={config.pe_cols}: the core requires pe_cols <= "
                              f"sbuf_partitions={config.sbuf_partitions} (one activation "
                              "lane per SBUF partition)")
        self.config = config

    def run(self, hbm, programs, *, sbuf=None, psum=None, max_instructions=10_000_000):
        """Run the three streams at ``programs`` (byte addresses: DMA, tensor, activation)
        on a copy of ``hbm`` (zero-extended to ``hbm_bytes``) and of the initial ``sbuf`` and
        ``psum`` images (zeros by default). Raises ``RuntimeError`` after
        ``max_instructions`` completed instructions (a guard: streams cannot loop)."""
        cfg = self.config
        if isinstance(hbm, bytes | bytearray):
            hbm = np.frombuffer(hbm, np.uint8)
        hbm = np.asarray(hbm)
        if hbm.ndim != 1 or hbm.dtype != np.uint8 or len(hbm) > cfg.hbm_bytes:
            raise ValueError(f"hbm is {hbm.dtype} {hbm.shape}: must be uint8 of at most "
                             f"hbm_bytes={cfg.hbm_bytes} bytes")
        programs = list(programs)
        if len(programs) != len(isa.Engine) or any(
                isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 0
                for p in programs):
            raise ValueError(f"programs={programs!r}: must be {len(isa.Engine)} byte "
                             "addresses (DMA, tensor, activation)")
        image = np.zeros(cfg.hbm_bytes, np.uint8)
        image[:len(hbm)] = hbm
        images = dma.Images(
            image, _initial("sbuf", sbuf, buffer_geometry(cfg, Space.SBUF)),
            _initial("psum", psum, buffer_geometry(cfg, Space.PSUM)))
        machine = _Machine(cfg, images, programs)
        fault, engine, pc, dma_error_code = isa.Fault.NONE, None, None, 0
        try:
            # The sequencers check their pointers at start, before any fetch.
            for e in isa.Engine:
                if programs[e] % isa.WORD_BYTES:
                    engine = e
                    raise _Fault(isa.Fault.FETCH_ERROR)
            executed = 0
            while not all(machine.finished):
                progress = False
                for e in isa.Engine:
                    if machine.finished[e]:
                        continue
                    engine = e
                    if machine.step(e):
                        progress = True
                        executed += 1
                        if executed > max_instructions:
                            raise RuntimeError(f"more than max_instructions="
                                               f"{max_instructions} instructions")
                if not progress:
                    engine = next(e for e in isa.Engine if not machine.finished[e])
                    raise _Fault(isa.Fault.DEADLOCK)
            engine = None
        except _Fault as exc:
            fault, dma_error_code = exc.fault, exc.dma_error_code
            pc = machine.pcs[engine]
        counters = {name: machine.counters.get(name) for name in COUNTERS}
        return Outcome(fault=fault, engine=engine, pc=pc, dma_error_code=dma_error_code,
                       counters=counters, hbm=images.hbm, sbuf=images.sbuf, psum=images.psum,
                       retired=dict(machine.retired), semaphores=list(machine.semaphores))


def run(config, hbm, programs, **kw):
    """``Core(config).run(hbm, programs, **kw)``."""
    return Core(config).run(hbm, programs, **kw)
