"""The tensor unit: executes the tensor engine's instructions (``LOAD_STATIONARY``,
``MATMUL``) by reading the SBUF, driving the systolic array and writing the PSUM."""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from opentrn import isa, numerics

from . import psum, sbuf
from .column_buffer import ColumnBuffer
from .delay_line import delayed
from .hierarchy import shared
from .params import refusing
from .partitioned_memory import (
    read_signature,
    vector_request_layout,
    vector_response_layout,
    vector_shape,
)
from .processing_element import MAX_MACS
from .tensor_engine import TensorEngine, formats, latency, mx_block_rows, mx_blocks

__all__ = ["TensorUnit", "load_jobs", "matmul_jobs", "load_words", "matmul_words"]


# The paths' buffers, for an SBUF read latency ``L`` (sbuf.read_latency: 1, and one per
# sbuf_input_stages): each cycle of latency keeps every job and word a cycle longer in its
# buffer, so each buffer holds one more per input stage (tests/test_tensor_unit.py's
# throughput tests run them at L = 1, 2 and 3).


def load_jobs(config):
    """Loads the load path holds (executing and queued), so that the next ones are accepted
    while the current ones run: loads alternate with matmuls, so two suffice at ``L = 1``
    (``L + 1``)."""
    return sbuf.read_latency(config) + 1


def matmul_jobs(config):
    """Matmuls the matmul path holds: four keep one-vector matmuls back to back at ``L = 1``
    (``L + 3``)."""
    return sbuf.read_latency(config) + 3


def matmul_words(config):
    """SBUF words the matmul path buffers (received or requested). With a request granted
    every cycle a word is reserved for ``L + 2`` cycles (its grant, ``L`` to its response,
    its use), so ``L + 2`` keep one-word matmuls back to back; one more absorbs irregular
    grants (the port is shared with two other readers)."""
    return sbuf.read_latency(config) + 3


def load_words(config):
    """SBUF words the load path buffers: a load's columns wait for the array anyway, so
    ``L + 1`` have them ready in time."""
    return sbuf.read_latency(config) + 1


def _sequence_bits(config):
    """Bits of an instruction's sequence number: twice the jobs that can be queued, so that
    the older of two queued jobs is told by the sign of the difference."""
    return ceil_log2(load_jobs(config) + matmul_jobs(config)) + 1


def _size_bits(config):
    """log2 of the widest column of the build's formats (``numerics.column_bytes``): 0 when
    every column is one byte, 1 with bf16 (or FP8 two MACs per cycle), 2 with four bytes..."""
    return max(exact_log2(numerics.column_bytes(config, name)) for name in config.dtypes)


def _common_job(config, count_max, *, columns=True):
    """The fields a column reader needs: the words to read and where the columns are
    (``columns``: of the build's formats, whose columns may be wider than a byte; else one
    byte each, as a scale reader's)."""
    _, word_bytes, depth = sbuf.vector_geometry(config)
    fields = {
        "first_word": range(depth), "last_word": range(depth),
        "lane": exact_log2(word_bytes),          # byte of column 0 within its word
        "count": range(count_max + 1),           # columns read from the SBUF
        "sequence": _sequence_bits(config),      # program order (wraps)
    }
    if columns and _size_bits(config):
        fields["size"] = range(_size_bits(config) + 1)   # log2 of the column's bytes
    return fields


def _path_job(config, count_max):
    """The fields both paths' jobs have: their column reader's, ``rows`` of the tile and,
    in a build with an MX format, ``mx`` (the scale reader has the job's scales)."""
    fields = {**_common_job(config, count_max), "rows": range(config.pe_rows + 1)}
    if mx_blocks(config):
        fields["mx"] = 1
    return fields


def _scale_job(config, count_max):
    """A scale reader's job: one E8M0 byte per column, from the partitions of ``group``
    (with more than one group)."""
    groups = numerics.mx_scale_groups(config)
    return data.StructLayout({**_common_job(config, count_max, columns=False),
                              **({"group": range(groups)} if groups > 1 else {})})


def _load_job(config):
    return data.StructLayout(_path_job(config, config.pe_cols))


def _matmul_job(config):
    return data.StructLayout({
        **_path_job(config, config.moving_max),
        "bank": range(config.psum_banks), "entry": range(config.psum_bank_entries),
        "accumulate": 1,
        "format": numerics.FORMAT_CODE_BITS,     # the moving vectors' format
        "swap": 1,                               # a load was accepted since the last matmul
        "macs": range(_max_macs(config) + 1),    # K x cols of its tile
        "cols": range(config.pe_cols + 1),       # of its tile: PSUM partitions it writes
    })


def _max_macs(config):
    """The most multiply-accumulates of one moving vector: a full tile of the fastest
    format."""
    return config.pe_rows * config.pe_cols * max(config.macs_per_pe_cycle(name)
                                                 for name in config.dtypes)


def _select(m, out, items, index):
    """``out = items[index]`` as a switch (one process: fast to simulate)."""
    with m.Switch(index):
        for position, item in enumerate(items):
            with m.Case(position):
                m.d.comb += out.eq(item)


def _wrap_increment(value, depth):
    return Mux(value == depth - 1, 0, value + 1)


def _wrap_add(value, step, depth):
    """``(value + step) % depth`` for ``value < depth`` and ``step <= depth``."""
    return Mux(value + step >= depth, value + step - depth, value + step)


class _ColumnReader:
    """One path's column reader: a queue of jobs, an address generator that requests each
    job's SBUF words in order, a buffer of ``words`` words (a slot is reserved before its
    request, since responses cannot be refused) and a byte extractor that presents the
    job's columns one by one. Builds its logic into ``m``; not a separate module, so the
    path logic around it stays readable in one place.

    Inputs (drive them): ``push``/``push_job`` (enqueue, only when ``space``), ``grant``
    (this reader's request was granted this cycle), ``response``/``response_data`` (the
    answer of this reader's request), ``take`` (the current column ``col`` was consumed),
    ``finish`` (the current job is complete: dequeue it). Outputs: ``space``,
    ``want``/``word`` (request), ``gen_job`` (the address generator's job), ``reserved``
    (words held or requested), ``job`` (the extractor's job), ``has_job``, ``col``,
    ``in_data`` (``col < job.count``), ``word_ready`` (the words of the presented columns
    are held), ``column`` (column ``col`` of the job in each of the first ``partitions``
    partitions, zero-extended to ``element_bits``: ``2 ** job.size`` adjacent bytes of one
    word, little-endian (one byte without ``size``); column-aligned offsets and columns of
    at most one word keep a column within one word). Only those partitions of a word are
    kept (a scale reader keeps one per MX block). With ``columns = 2`` a take consumes
    columns ``col`` and ``col + 1``: also ``in_data_next`` and ``column_next``, the second
    column, which is in the next word when the first ends its word (``word_ready`` then
    needs both words).
    """

    def __init__(self, m, name, *, config, layout, jobs, words, col_max, partitions,
                 element_bits, columns=1):
        all_partitions, word_bytes, depth = sbuf.vector_geometry(config)
        self.push = Signal(name=f"{name}_push")
        self.push_job = Signal(layout, name=f"{name}_push_job")
        self.grant = Signal(name=f"{name}_grant")
        self.response = Signal(name=f"{name}_response")
        self.response_data = Signal(vector_shape(all_partitions, word_bytes),
                                    name=f"{name}_response_data")
        self.take = Signal(name=f"{name}_take")
        self.finish = Signal(name=f"{name}_finish")
        self.space = Signal(name=f"{name}_space")
        self.want = Signal(name=f"{name}_want")
        self.word = Signal(range(depth), name=f"{name}_word")
        self.job = Signal(layout, name=f"{name}_job")
        self.has_job = Signal(name=f"{name}_has_job")
        self.col = Signal(range(col_max + 1), name=f"{name}_col")
        self.in_data = Signal(name=f"{name}_in_data")
        self.word_ready = Signal(name=f"{name}_word_ready")
        self.column = Signal(data.ArrayLayout(element_bits, partitions),
                             name=f"{name}_column")
        self.columns = columns
        if columns == 2:
            self.in_data_next = Signal(name=f"{name}_in_data_next")
            self.column_next = Signal(data.ArrayLayout(element_bits, partitions),
                                      name=f"{name}_column_next")
        sizes = range(layout.members["size"].stop) if "size" in layout.members \
            else range(1)

        # -- job queue: one write pointer, two read pointers (address generator, extractor)
        queue = [Signal(layout, name=f"{name}_queue_{i}") for i in range(jobs)]
        write_at = Signal(range(jobs), name=f"{name}_queue_write")
        gen_at = Signal(range(jobs), name=f"{name}_queue_gen")
        extract_at = Signal(range(jobs), name=f"{name}_queue_extract")
        size = Signal(range(jobs + 1), name=f"{name}_queue_size")
        to_generate = Signal(range(jobs + 1), name=f"{name}_queue_to_generate")
        m.d.comb += [self.space.eq(size != jobs), self.has_job.eq(size != 0)]
        with m.If(self.push):
            for i in range(jobs):
                with m.If(write_at == i):
                    m.d.sync += queue[i].eq(self.push_job)
            m.d.sync += write_at.eq(_wrap_increment(write_at, jobs))
        m.d.sync += size.eq(size + self.push - self.finish)

        # -- address generator: words first_word..last_word of each job, in job order ----
        # A job with a partition ``group`` (a scale reader's) keeps partitions
        # ``group * partitions + p`` of its words: the group of each word granted, for its
        # response ``sbuf.read_latency`` cycles later.
        groups = layout.members["group"].stop if "group" in layout.members else 1
        gen_job = Signal(layout, name=f"{name}_gen_job")
        gen_index = Signal(range(depth), name=f"{name}_gen_index")
        reserved = Signal(range(words + 1), name=f"{name}_reserved")   # held + in flight
        _select(m, gen_job, queue, gen_at)
        self.gen_job, self.reserved = gen_job, reserved
        m.d.comb += [
            self.word.eq(gen_job.first_word + gen_index),
            self.want.eq((to_generate != 0) & (reserved != words)),
        ]
        gen_done = Signal(name=f"{name}_gen_done")
        if groups > 1:
            fill_group = delayed(m, gen_job.group, sbuf.read_latency(config),
                                 name=f"{name}_fill_group")
        with m.If(self.grant):
            with m.If(self.word == gen_job.last_word):
                m.d.comb += gen_done.eq(1)
                m.d.sync += [gen_index.eq(0), gen_at.eq(_wrap_increment(gen_at, jobs))]
            with m.Else():
                m.d.sync += gen_index.eq(gen_index + 1)
        m.d.sync += to_generate.eq(to_generate + self.push - gen_done)

        # -- word buffer and extractor: one shared block per partition ------------------
        fill_at = Signal(range(words), name=f"{name}_fill")
        drain_at = Signal(range(words), name=f"{name}_drain")
        stored = Signal(range(words + 1), name=f"{name}_stored")
        with m.If(self.response):
            m.d.sync += fill_at.eq(_wrap_increment(fill_at, words))
        lane = Signal(exact_log2(word_bytes), name=f"{name}_lane")
        _select(m, self.job, queue, extract_at)
        size = self.job.size if len(sizes) > 1 else 0
        last_lane = word_bytes - (Const(1) << size)
        m.d.comb += [
            lane.eq(self.job.lane + (self.col << size)),   # wraps within the word
            self.in_data.eq(self.col < self.job.count),
        ]
        # A word is done after its last column or the job's last column (the next job
        # reads its own words, even the same one): pops, one per column that ends one.
        pops = [self.in_data & ((lane == last_lane) | (self.col == self.job.count - 1))]
        if columns == 1:
            m.d.comb += self.word_ready.eq(stored != 0)
        else:
            # The second column, in the next word when the first ends its word.
            lane_next = Signal.like(lane, name=f"{name}_lane_next")
            m.d.comb += [
                lane_next.eq(lane + (Const(1) << size)),
                self.in_data_next.eq(self.col + 1 < self.job.count),
                self.word_ready.eq((stored != 0) & ((stored > 1) | ~self.in_data_next
                                                    | (lane_next != 0))),
            ]
            pops.append(self.in_data_next & ((lane_next == last_lane)
                                             | (self.col + 1 == self.job.count - 1)))
        columns_out, next_out = [], []
        for p in range(partitions):
            part = ColumnBuffer(word_bytes=word_bytes, words=words, sizes=len(sizes),
                                element_bits=element_bits, columns=columns)
            m.submodules[f"{name}_partition_{p}"] = shared(part)
            m.d.comb += [
                part.fill.eq(self.response), part.fill_at.eq(fill_at),
                part.drain_at.eq(drain_at), part.lane.eq(lane),
            ]
            if groups == 1:
                m.d.comb += part.fill_data.eq(self.response_data[p])
            else:
                with m.Switch(fill_group):
                    for group in range(groups):
                        with m.Case(group):
                            m.d.comb += part.fill_data.eq(
                                self.response_data[group * partitions + p])
            if len(sizes) > 1:
                m.d.comb += part.size.eq(size)
            columns_out.append(part.column)
            if columns == 2:
                next_out.append(part.column_next)
        # One assignment: one per partition into a slice would be quadratic (Amaranth
        # passes over every bit of the signal per assignment).
        m.d.comb += self.column.eq(Cat(*columns_out))
        if columns == 2:
            m.d.comb += self.column_next.eq(Cat(*next_out))
        pop = Signal(range(columns + 1), name=f"{name}_pop")
        m.d.comb += pop.eq(Mux(self.take, sum(pops), 0))
        with m.If(pop != 0):
            m.d.sync += drain_at.eq(_wrap_add(drain_at, pop, words))
        m.d.sync += [
            stored.eq(stored + self.response - pop),
            reserved.eq(reserved + self.grant - pop),
        ]
        with m.If(self.finish):
            m.d.sync += [self.col.eq(0), extract_at.eq(_wrap_increment(extract_at, jobs))]
        with m.Elif(self.take):
            m.d.sync += self.col.eq(self.col + columns)


class TensorUnit(wiring.Component):
    """The tensor engine's execution unit: runs ``LOAD_STATIONARY`` and ``MATMUL``
    (docs/isa.md) on the systolic array (:class:`~opentrn.hdl.tensor_engine.TensorEngine`),
    reading the SBUF and writing the PSUM.

    The instruction stream splits into a load path and a matmul path, each with its own
    column reader (job queue, SBUF word address generator, word buffer, byte extractor).
    They share ``sbuf_read``, the older instruction first, so the next tile's columns are
    read and fed to the array's idle weight bank while the current matmul streams its moving
    vectors; the array keeps program order (a swap waits for the load, a load waits for the
    swap before it). One SBUF read (a vector word of ``Config.vector_word_bytes``) serves up
    to ``vector_word_bytes / bytes`` columns, where ``bytes`` is the column size of the
    instruction's ``format`` (``numerics.column_bytes``: ``macs_per_pe_cycle`` elements of
    1 byte for int8 and FP8, 2 for BF16); the array takes one moving column per cycle in
    every format, and ``config.load_columns`` stationary columns (1, or 2 with
    ``fast_weight_load = 2``, then from two words when a pair crosses one).

    * A load: ``pe_cols`` stationary columns in beats of ``config.load_columns``, column
      ``m < cols`` the ``bytes`` bytes at ``sbuf_offset + m * bytes`` of partitions
      ``< rows`` (others 0), zero-extended to ``in_bits``, then zero columns.
    * A matmul: ``n`` moving vectors of its ``format`` (the ``bytes`` bytes at
      ``sbuf_offset + j * bytes`` of partitions ``<`` the tile's ``rows``, others 0), the
      first with ``swap`` when a load was accepted since the previous matmul, the final one
      with ``last``; result ``j`` goes to PSUM ``(psum_bank, psum_entry + j)``, 0 in the
      partitions ``>=`` the tile's ``cols``, with ``float`` set for a float format (the PSUM
      accumulates FP32 codes). Zeroing both keeps whatever lies outside the tile out of the
      results, as the ISA says: for int8 the zero weights already do it, but a float
      ``0 * inf`` is NaN. A FIFO of ``pe_rows (1 + pe_add_stages) + pe_cols +
      pe_multiply_stages`` entries (the array's latency, and one) holds the destination of
      the matmuls whose results are in flight.
    * An MX format (with ``mx_blocks`` blocks of 32 elements of K, ``mx_block_rows``
      partitions each): each path has a second column reader for the scales, byte
      ``scale_offset + j`` of partitions ``scale_partition + b``, ``b < mx_blocks`` (block
      ``b``'s E8M0 scale of column ``j``; the reader keeps the ``mx_blocks`` partitions of
      the instruction's group of each word it receives), which go with column ``j`` (127,
      that is ``2**0``, for blocks that start at or past the tile's ``rows``). The four
      readers share
      ``sbuf_read`` by age as above (a path's two by the fewer words reserved), so an MX
      instruction reads twice the words of an FP8 one.
    * With ``psum_add_stages = N > 0`` a vector of a matmul that accumulates enters the
      array only when no vector into the same PSUM entry entered in the ``N`` cycles before
      (:class:`~opentrn.hdl.psum.PSUM` cannot forward a sum still in its adder; every
      vector's result reaches the PSUM the same number of cycles after it entered).
    * Instructions retire in program order: a load once its last column entered the array,
      a matmul ``2 + N`` cycles after its last result beat was accepted by the PSUM
      (readable).

    Members
    -------
    instruction : ``In(stream.Signature(isa.layout(isa.Opcode.MATMUL)))``
        Checked ``LOAD_STATIONARY`` and ``MATMUL`` words, in program order.
    check : ``In(isa.layout(isa.Opcode.MATMUL))``; check_valid : ``In(1)``
        An instruction to check.
    fault : ``Out(3)``
        Combinational: the :class:`~opentrn.isa.Fault` of ``check`` by the field rules and
        the state rules (from the instructions accepted so far: a load pending, the format
        of the latest load), in the order of docs/isa.md ("Errors"); 0 when fine, when
        ``check_valid`` is low, or for other opcodes.
    retire : ``Out(1)``
        One pulse per accepted instruction, in program order, when it completes.
    active : ``Out(1)``
        An accepted instruction has not retired yet.
    busy : ``Out(1)``
        A moving vector enters the array this cycle.
    macs : ``Out(range(...))``
        This cycle's multiply-accumulates: ``rows * r * cols`` of the tile the entering
        vector uses (``r`` the MACs per PE per cycle of the tile's format), 0 when none
        enters.
    sbuf_read : ``Out(read_signature(vector_request_layout, vector_response_layout))``
        To ``SBUF.te_read``.
    psum_write : ``Out(stream.Signature(psum.te_write_layout(config)))``
        To ``PSUM.te_write``.
    """

    def __init__(self, *, config):
        with refusing(self):
            formats(config)
        self._config = config
        partitions, word_bytes, depth = sbuf.vector_geometry(config)
        super().__init__({
            "instruction": In(stream.Signature(isa.layout(isa.Opcode.MATMUL))),
            "check": In(isa.layout(isa.Opcode.MATMUL)),
            "check_valid": In(1),
            "fault": Out(3),
            "retire": Out(1),
            "active": Out(1),
            "busy": Out(1),
            "macs": Out(range(_max_macs(config) + 1)),
            "sbuf_read": Out(read_signature(vector_request_layout(depth),
                                            vector_response_layout(partitions, word_bytes))),
            "psum_write": Out(stream.Signature(psum.te_write_layout(config))),
        })

    # -- checks --------------------------------------------------------------------------

    def _element(self, m, code, name):
        """``(legal, size, rate, mx)`` of a format code: a format of the build
        (``matmul_formats``), log2 of its column's bytes (``numerics.column_bytes``), log2 of
        its MACs per PE per cycle, an MX format."""
        cfg = self._config
        legal = Signal(name=f"{name}_legal")
        # At least one bit: a build of one-byte formats only still has the field (always 0).
        size = Signal(range(max(_size_bits(cfg) + 1, 2)), name=f"{name}_size")
        rate = Signal(range(exact_log2(MAX_MACS) + 1), name=f"{name}_rate")
        mx = Signal(name=f"{name}_mx")
        built = numerics.matmul_formats(cfg)
        m.d.comb += [
            legal.eq(Cat(code == fmt.code for fmt in built).any()),
            mx.eq(Cat(code == fmt.code for fmt in built if fmt.mx).any()),
        ]
        with m.Switch(code):
            for fmt in built:
                with m.Case(fmt.code):
                    m.d.comb += [
                        size.eq(exact_log2(numerics.column_bytes(cfg, fmt.name))),
                        rate.eq(exact_log2(cfg.macs_per_pe_cycle(fmt.name))),
                    ]
        return legal, size, rate, mx

    def _check(self, m, loaded, load_pending, tile_format):
        """``fault`` for the instruction on ``check`` (docs/isa.md, in its rule order):
        ``ILLEGAL_OPCODE`` for a format the build lacks, then ``BAD_FIELD``, then
        ``OUT_OF_RANGE`` (extents in bytes: columns of the format's size; an MX format's
        scales, one byte per column from ``scale_offset``)."""
        cfg = self._config
        k_rows, m_cols = cfg.pe_rows, cfg.pe_cols
        size = cfg.sbuf_bytes_per_partition
        load = data.View(isa.layout(isa.Opcode.LOAD_STATIONARY), self.check.as_value())
        mm = self.check
        load_legal, load_size, _, load_mx = self._element(m, load.format, "check_load")
        mm_legal, mm_size, _, mm_mx = self._element(m, mm.format, "check_matmul")

        def misaligned(offset, size):
            """``offset`` is not a multiple of ``2 ** size`` bytes."""
            return (offset & ((1 << size) - 1)) != 0

        # An MX instruction's scale partition: a multiple of the blocks, the blocks within
        # the partitions (mx_blocks and the partitions are powers of two).
        blocks = mx_blocks(cfg)
        block_bits = exact_log2(blocks) if blocks else 0

        def scale_partition_misaligned(partition):
            return partition[:block_bits] != 0 if block_bits else 0

        def scale_partition_past(partition):
            return partition + blocks > cfg.sbuf_partitions

        with m.If(self.check_valid):
            with m.Switch(mm.opcode):
                with m.Case(int(isa.Opcode.LOAD_STATIONARY)):
                    with m.If(~load_legal):
                        m.d.comb += self.fault.eq(int(isa.Fault.ILLEGAL_OPCODE))
                    with m.Elif(load_pending | (load.rows == 0) | (load.rows > k_rows)
                                | (load.cols == 0) | (load.cols > m_cols)
                                | misaligned(load.sbuf_offset, load_size)
                                | (load_mx & scale_partition_misaligned(load.scale_partition))):
                        m.d.comb += self.fault.eq(int(isa.Fault.BAD_FIELD))
                    with m.Elif((load.sbuf_offset + (load.cols << load_size) > size)
                                | (load_mx & ((load.scale_offset + load.cols > size)
                                              | scale_partition_past(load.scale_partition)))):
                        m.d.comb += self.fault.eq(int(isa.Fault.OUT_OF_RANGE))
                with m.Case(int(isa.Opcode.MATMUL)):
                    with m.If(~mm_legal):
                        m.d.comb += self.fault.eq(int(isa.Fault.ILLEGAL_OPCODE))
                    with m.Elif(~loaded | (mm.n == 0) | (mm.n > cfg.moving_max)
                                | misaligned(mm.sbuf_offset, mm_size)
                                | (mm.format != tile_format)
                                | (mm_mx & scale_partition_misaligned(mm.scale_partition))):
                        m.d.comb += self.fault.eq(int(isa.Fault.BAD_FIELD))
                    with m.Elif((mm.sbuf_offset + (mm.n << mm_size) > size)
                                | (mm_mx & ((mm.scale_offset + mm.n > size)
                                            | scale_partition_past(mm.scale_partition)))
                                | (mm.psum_bank >= cfg.psum_banks)
                                | (mm.psum_entry + mm.n > cfg.psum_bank_entries)):
                        m.d.comb += self.fault.eq(int(isa.Fault.OUT_OF_RANGE))

    def elaborate(self, platform):
        cfg = self._config
        k_rows, m_cols = cfg.pe_rows, cfg.pe_cols
        _, word_bytes, _ = sbuf.vector_geometry(cfg)
        lane_bits = exact_log2(word_bytes)
        offset_bits = ceil_log2(cfg.sbuf_bytes_per_partition)
        m = Module()
        m.submodules.engine = engine = TensorEngine(config=cfg)

        # -- program state: what the accepted instructions imply ----------------------------
        loaded = Signal()            # a LOAD_STATIONARY was accepted
        load_pending = Signal()      # ... and no MATMUL after it yet
        tile_macs = Signal(range(_max_macs(cfg) + 1))   # K * cols of the latest load
        tile_rows = Signal(range(k_rows + 1))
        tile_cols = Signal(range(m_cols + 1))
        tile_format = Signal(numerics.FORMAT_CODE_BITS)   # format of the latest load
        sequence = Signal(_sequence_bits(cfg))            # of the next instruction
        self._check(m, loaded, load_pending, tile_format)

        partitions = sbuf.vector_geometry(cfg)[0]
        per_beat = cfg.load_columns         # stationary columns per load beat
        loads = _ColumnReader(m, "load", config=cfg, layout=_load_job(cfg), jobs=load_jobs(cfg),
                              words=load_words(cfg), col_max=m_cols, partitions=partitions,
                              element_bits=cfg.in_bits, columns=per_beat)
        matmuls = _ColumnReader(m, "matmul", config=cfg, layout=_matmul_job(cfg),
                                jobs=matmul_jobs(cfg), words=matmul_words(cfg),
                                col_max=cfg.moving_max,
                                partitions=partitions, element_bits=cfg.in_bits)
        # With an MX format, each path has a second reader for its MX jobs' scales (block b
        # in partition b); its queue holds the path's MX jobs, in the same order.
        blocks = mx_blocks(cfg)
        block_rows = mx_block_rows(cfg) if blocks else 0
        block_bits = exact_log2(blocks) if blocks else 0
        scale_of = {}
        if blocks:
            for path, jobs, words, col_max in (
                    (loads, load_jobs(cfg), load_words(cfg), m_cols),
                    (matmuls, matmul_jobs(cfg), matmul_words(cfg), cfg.moving_max)):
                name = "load_scales" if path is loads else "matmul_scales"
                scale_of[path] = _ColumnReader(m, name, config=cfg,
                                               layout=_scale_job(cfg, col_max), jobs=jobs,
                                               words=words, col_max=col_max, partitions=blocks,
                                               element_bits=8, columns=path.columns)

        # Program order of retirement: one bit per accepted instruction (1: a load). Deep
        # enough for every instruction in the queues and the array with one-vector matmuls
        # (rows 1 + pe_add_stages cycles apart).
        order_depth = (2 * (k_rows * (1 + cfg.pe_add_stages) + m_cols) + load_jobs(cfg)
                       + matmul_jobs(cfg))
        m.submodules.order = order = SyncFIFO(width=1, depth=order_depth)

        # -- accept --------------------------------------------------------------------------
        word = self.instruction.payload
        load = data.View(isa.layout(isa.Opcode.LOAD_STATIONARY), word.as_value())
        is_load = Signal()
        m.d.comb += [
            is_load.eq(word.opcode == isa.Opcode.LOAD_STATIONARY),
        ]
        accept = self.instruction.valid & self.instruction.ready
        _, load_size, load_rate, load_mx = self._element(m, load.format, "accept_load")
        _, matmul_size, _, matmul_mx = self._element(m, word.format, "accept_matmul")

        def place(job, offset, count, size=0):
            """The word span and first lane of ``count`` columns of ``2 ** size`` bytes
            from byte ``offset``."""
            offset = offset[:offset_bits]
            return [
                job.first_word.eq(offset >> lane_bits),
                job.last_word.eq((offset + (count << size) - 1) >> lane_bits),
                job.lane.eq(offset[:lane_bits]),
                job.count.eq(count),
                job.sequence.eq(sequence),
                *([job.size.eq(size)] if "size" in job.shape().members else []),
            ]

        if blocks:
            # The path's reader and its scale reader both need space for an MX instruction.
            load_space = loads.space & (~load_mx | scale_of[loads].space)
            matmul_space = matmuls.space & (~matmul_mx | scale_of[matmuls].space)
            m.d.comb += [
                *place(scale_of[loads].push_job, load.scale_offset, load.cols),
                *place(scale_of[matmuls].push_job, word.scale_offset, word.n),
                *([scale_of[loads].push_job.group.eq(load.scale_partition >> block_bits),
                   scale_of[matmuls].push_job.group.eq(word.scale_partition >> block_bits)]
                  if numerics.mx_scale_groups(cfg) > 1 else []),
                scale_of[loads].push.eq(accept & is_load & load_mx),
                scale_of[matmuls].push.eq(accept & ~is_load & matmul_mx),
                loads.push_job.mx.eq(load_mx),
                matmuls.push_job.mx.eq(matmul_mx),
            ]
        else:
            load_space, matmul_space = loads.space, matmuls.space
        m.d.comb += self.instruction.ready.eq(order.w_rdy & Mux(is_load, load_space,
                                                                matmul_space))
        m.d.comb += [
            *place(loads.push_job, load.sbuf_offset, load.cols, load_size),
            loads.push_job.rows.eq(load.rows),
            *place(matmuls.push_job, word.sbuf_offset, word.n, matmul_size),
            matmuls.push_job.format.eq(word.format),
            matmuls.push_job.bank.eq(word.psum_bank),
            matmuls.push_job.entry.eq(word.psum_entry),
            matmuls.push_job.accumulate.eq(word.accumulate),
            matmuls.push_job.swap.eq(load_pending),
            matmuls.push_job.macs.eq(tile_macs),
            matmuls.push_job.rows.eq(tile_rows),
            matmuls.push_job.cols.eq(tile_cols),
            loads.push.eq(accept & is_load),
            matmuls.push.eq(accept & ~is_load),
            order.w_en.eq(accept),
            order.w_data.eq(is_load),
        ]
        with m.If(accept):
            m.d.sync += sequence.eq(sequence + 1)
            with m.If(is_load):
                # rows <= K and cols <= M (checked): the product of the narrow fields, times
                # the format's elements per row.
                rows = load.rows[:ceil_log2(k_rows + 1)]
                cols = load.cols[:ceil_log2(m_cols + 1)]
                m.d.sync += [loaded.eq(1), load_pending.eq(1),
                             tile_macs.eq((rows * cols) << load_rate),
                             tile_rows.eq(rows), tile_cols.eq(cols),
                             tile_format.eq(load.format)]
            with m.Else():
                m.d.sync += load_pending.eq(0)

        # -- the shared SBUF read port -------------------------------------------------------
        # The older instruction first (the array consumes in program order, so its data is
        # due first); a younger one gets the port whenever the older one cannot use it
        # (no buffer space, no words left to request). A path's two readers (an MX job's
        # elements and scales) have the same age: the one with fewer words reserved goes
        # first, so both have a word early. A request not granted keeps its owner (and so
        # its payload: a reader's word changes only when it is granted) until it is.
        readers = [loads, matmuls, *scale_of.values()]
        request = self.sbuf_read.request
        owner = Signal(range(len(readers)))
        locked = Signal()
        locked_owner = Signal.like(owner)

        def first(i, j):
            """Reader ``i`` goes before reader ``j`` (both wanting)."""
            a, b = readers[i], readers[j]
            # Sequence numbers wrap: the older has the negative difference (modulo their
            # width: its top bit).
            age = a.gen_job.sequence - b.gen_job.sequence
            older = age[len(a.gen_job.sequence) - 1]
            same = a.gen_job.sequence == b.gen_job.sequence
            if i < j:
                return Mux(same, a.reserved <= b.reserved, older)
            return Mux(same, a.reserved < b.reserved, older)

        with m.If(locked):
            m.d.comb += owner.eq(locked_owner)
        with m.Else():
            for i, reader in enumerate(readers):
                beats_all = Cat(~other.want | first(i, j)
                                for j, other in enumerate(readers) if j != i).all()
                with m.If(reader.want & beats_all):
                    m.d.comb += owner.eq(i)
        granted = request.valid & request.ready
        m.d.comb += [
            request.valid.eq(Cat(reader.want for reader in readers).any()),
            request.payload.word.eq(Cat(reader.word for reader in readers)
                                    .word_select(owner, len(loads.word))),
            *(reader.grant.eq(granted & (owner == i)) for i, reader in enumerate(readers)),
        ]
        m.d.sync += [locked.eq(request.valid & ~request.ready), locked_owner.eq(owner)]
        # The owner of the response due this cycle (only read with a response).
        responding = delayed(m, owner, sbuf.read_latency(cfg), name="responding")
        response = self.sbuf_read.response
        m.d.comb += [
            *(reader.response.eq(response.valid & (responding == i))
              for i, reader in enumerate(readers)),
            *(reader.response_data.eq(response.payload.data) for reader in readers),
        ]

        def scales(path, payload):
            """An MX job's scales: ``(ready, [statements])``. ``ready``: its scale word is
            held too (1 for other jobs); the statements drive ``payload.scale`` (block b's
            byte, 127 = 2**0 for blocks past the tile's rows and for other jobs) and keep
            the scale reader in step with the path (it holds the path's MX jobs only)."""
            if not blocks:
                return 1, []
            reader = scale_of[path]
            statements = [reader.take.eq(path.take & path.job.mx),
                          reader.finish.eq(path.finish & path.job.mx)]
            beat = [(path.in_data, reader.column)]
            if path.columns == 2:
                beat.append((path.in_data_next, reader.column_next))
            for j, (in_data, column) in enumerate(beat):
                for block in range(blocks):
                    used = path.job.mx & in_data & (block * block_rows < path.job.rows)
                    statements.append(payload.scale[j * blocks + block].eq(
                        Mux(used, column[block], numerics.E8M0_BIAS)))
            return ~path.job.mx | reader.word_ready, statements

        # -- load path: pe_cols / load_columns stationary beats per load ------------------
        stationary = engine.stationary
        load_scales_ready, load_scale_statements = scales(loads, stationary.payload)
        m.d.comb += [
            stationary.valid.eq(loads.has_job
                                & (~loads.in_data | (loads.word_ready & load_scales_ready))),
            *load_scale_statements,
        ]
        beat = [(loads.in_data, loads.column)]
        if per_beat == 2:
            beat.append((loads.in_data_next, loads.column_next))
        for j, (in_data, column) in enumerate(beat):
            with m.If(in_data):
                for row in range(k_rows):
                    with m.If(row < loads.job.rows):
                        m.d.comb += stationary.payload.data[j * k_rows + row].eq(column[row])
        load_done = Signal()
        m.d.comb += [
            loads.take.eq(stationary.valid & stationary.ready),
            load_done.eq(loads.take & (loads.col == m_cols - per_beat)),
            loads.finish.eq(load_done),
        ]

        # -- matmul path: n moving vectors per matmul --------------------------------------
        result_layout = data.StructLayout({"bank": range(cfg.psum_banks),
                                           "entry": range(cfg.psum_bank_entries),
                                           "accumulate": 1, "float": 1,
                                           "cols": range(m_cols + 1)})
        # Results leave the array's latency after their vector entered: one more one-vector
        # matmul than that can be in flight.
        m.submodules.results = results = SyncFIFO(width=result_layout.size,
                                                  depth=latency(cfg) + 1)
        moving = engine.moving
        first = matmuls.col == 0
        last = matmuls.col == matmuls.job.count - 1
        matmul_scales_ready, matmul_scale_statements = scales(matmuls, moving.payload)
        # With psum_add_stages = N the PSUM writes a beat back N cycles later than it reads
        # the entry, and a sum in its adder cannot be forwarded: a vector that accumulates
        # waits while a vector into its PSUM entry entered in the last N cycles (the array's
        # latency is the same for every vector, so the beats keep these distances). While
        # it waits no vector enters, so the wait only ends: valid never falls untaken.
        hazard = Signal()
        if cfg.psum_add_stages:
            target = Signal(range(cfg.psum_bank_entries))
            m.d.comb += target.eq(matmuls.job.entry + matmuls.col)
            # The vectors of the last N cycles: entered, and into which entry.
            entered, entered_bank, entered_entry = matmuls.take, matmuls.job.bank, target
            matches = []
            for ago in range(1, cfg.psum_add_stages + 1):
                was = Signal(name=f"entered_{ago}_ago")
                was_bank = Signal.like(matmuls.job.bank, name=f"entered_{ago}_ago_bank")
                was_entry = Signal.like(target, name=f"entered_{ago}_ago_entry")
                m.d.sync += [was.eq(entered), was_bank.eq(entered_bank),
                             was_entry.eq(entered_entry)]
                matches.append(was & (was_bank == matmuls.job.bank) & (was_entry == target))
                entered, entered_bank, entered_entry = was, was_bank, was_entry
            m.d.comb += hazard.eq(matmuls.job.accumulate & Cat(*matches).any())
        m.d.comb += [
            # A matmul enters only with a slot for its results' destination.
            moving.valid.eq(matmuls.has_job & matmuls.word_ready & matmul_scales_ready
                            & (~first | results.w_rdy) & ~hazard),
            *matmul_scale_statements,
            moving.payload.format.eq(matmuls.job.format),
            moving.payload.swap.eq(first & matmuls.job.swap),
            moving.payload.last.eq(last),
            matmuls.take.eq(moving.valid & moving.ready),
            matmuls.finish.eq(matmuls.take & last),
            results.w_en.eq(matmuls.take & first),
            self.busy.eq(matmuls.take),
            self.macs.eq(Mux(matmuls.take, matmuls.job.macs, 0)),
        ]
        # Partitions past the tile's rows enter as 0 and PSUM partitions past its columns get
        # 0: outside the tile nothing contributes, whatever the SBUF holds there (a float
        # 0 * inf would be NaN).
        for row in range(k_rows):
            with m.If(row < matmuls.job.rows):
                m.d.comb += moving.payload.data[row].eq(matmuls.column[row])
        destination = data.View(result_layout, results.w_data)
        m.d.comb += [
            destination.bank.eq(matmuls.job.bank),
            destination.entry.eq(matmuls.job.entry),
            destination.accumulate.eq(matmuls.job.accumulate),
            destination.float.eq(matmuls.job.format != numerics.data_format("int8").code),
            destination.cols.eq(matmuls.job.cols),
        ]

        # -- results -> PSUM -------------------------------------------------------------
        head = data.View(result_layout, results.r_data)
        result_index = Signal(range(cfg.psum_bank_entries))
        write = self.psum_write
        m.d.comb += [
            write.valid.eq(engine.result.valid),
            write.payload.bank.eq(head.bank),
            write.payload.entry.eq(head.entry + result_index),
            write.payload.accumulate.eq(head.accumulate),
            write.payload.float.eq(head.float),
            engine.result.ready.eq(write.ready),
        ]
        with m.If(write.valid):         # one process per column: fast on Icarus
            for col in range(m_cols):
                with m.If(col < head.cols):
                    m.d.comb += write.payload.data[col].eq(engine.result.payload.data[col])
        written = write.valid & write.ready
        # The last beat was accepted 1 + psum_add_stages cycles ago: written back last cycle.
        matmul_done = delayed(m, written & engine.result.payload.last,
                              1 + cfg.psum_add_stages, name="matmul_done", reset_less=False)
        with m.If(written):
            with m.If(engine.result.payload.last):
                m.d.sync += result_index.eq(0)
                m.d.comb += results.r_en.eq(1)
            with m.Else():
                m.d.sync += result_index.eq(result_index + 1)

        # -- retire in program order -------------------------------------------------------
        # Completions counted per kind (each kind completes in its own order), retired
        # when the instruction at the head of the program order has completed. A matmul
        # completion is counted 1 + psum_add_stages cycles after its last beat was
        # accepted, so it retires 2 + psum_add_stages cycles after, when the PSUM returns it.
        loads_done = Signal(range(order_depth + 1))
        matmuls_done = Signal(range(order_depth + 1))
        head_is_load = order.r_data[0]
        m.d.comb += [
            self.retire.eq(order.r_rdy & Mux(head_is_load, loads_done != 0,
                                             matmuls_done != 0)),
            order.r_en.eq(self.retire),
            self.active.eq(order.r_rdy),
        ]
        m.d.sync += [
            loads_done.eq(loads_done + load_done - (self.retire & head_is_load)),
            matmuls_done.eq(matmuls_done + matmul_done - (self.retire & ~head_is_load)),
        ]
        return m
