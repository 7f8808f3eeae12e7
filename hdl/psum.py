"""The partial-sum buffer (PSUM): where the tensor engine writes and accumulates its
results, one partition per array column."""

from amaranth import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from opentrn import numerics

from .delay_line import delayed
from .fp_adder import FPAdder
from .partitioned_memory import (
    PartitionedMemory,
    read_signature,
    word_request_layout,
    word_response_layout,
    word_write_layout,
)

__all__ = ["PSUM", "ENTRY_BYTES", "geometry", "te_write_layout", "act_request_layout",
           "act_response_layout"]

#: Bytes of one stored entry: an ``acc_bits`` value sign-extended to 32 bits, or an FP32
#: code, little-endian.
ENTRY_BYTES = 4


def geometry(config):
    """``(partitions, word_bytes, depth)``: ``pe_cols`` partitions of
    ``psum_banks * psum_bank_entries * 4`` bytes, in words of ``dma_bus_bytes``."""
    word_bytes = config.dma_bus_bytes
    size = config.psum_banks * config.psum_bank_entries * ENTRY_BYTES
    return config.pe_cols, word_bytes, size // word_bytes


def _values_shape(config):
    return data.ArrayLayout(signed(config.acc_bits), config.pe_cols)


def te_write_layout(config):
    """One result beat of the tensor engine: entry ``(bank, entry)`` of every partition;
    ``accumulate`` adds to the stored value instead of overwriting it; ``float``: the data
    and the stored values are FP32 codes, added in FP32 (ignored, integer, in a build
    without float formats; ignored, FP32, in a build without int8)."""
    return data.StructLayout({
        "bank": range(config.psum_banks), "entry": range(config.psum_bank_entries),
        "data": _values_shape(config), "accumulate": 1, "float": 1,
    })


def act_request_layout(config):
    return data.StructLayout({"bank": range(config.psum_banks),
                              "entry": range(config.psum_bank_entries)})


def act_response_layout(config):
    return data.StructLayout({"data": _values_shape(config)})


class PSUM(wiring.Component):
    """``pe_cols`` partitions x ``psum_banks`` banks x ``psum_bank_entries`` entries. An entry
    is stored as 4 bytes, little-endian: the ``acc_bits`` two's-complement value,
    sign-extended to 32 bits. Partition ``p``'s byte offset of ``(bank, entry)`` is
    ``(bank * psum_bank_entries + entry) * 4``; the DMA engine sees these bytes in words of
    ``dma_bus_bytes`` (W), so one word holds ``W / 4`` entries.

    Tensor-engine writes (``te_write``) go through a read-modify-write pipeline of ``2 + N``
    stages (``N = config.psum_add_stages``) that has its own memory read port and write
    priority; ``te_write.ready`` is always high, one beat per cycle is sustained:

    * cycle ``t``: the beat is accepted and its word read (all partitions);
    * cycle ``t + 1 + N``: the stored entry (``accumulate``) plus the beat, wrapped to
      ``acc_bits`` (or, with ``float``, ``fp_add32(stored, beat)`` of the FP32 codes: an
      :class:`~opentrn.hdl.fp_adder.FPAdder` of ``pe_cols`` lanes with ``N`` stages, built
      only when the configuration has a float format; a build without int8 has no integer
      adder and adds every beat in FP32), or the beat alone (overwrite: its 32 bits), is
      written with the entry's 4 byte enables in every partition; a read granted from
      cycle ``t + 2 + N`` on returns it. The integer sum is made in cycle ``t + 1`` and
      waits ``N`` cycles with it.

    The hazard: a plain read in cycle ``t`` would return the word as it was before the write
    the memories take at the end of cycle ``t`` (the write-back of the beat of ``t - 1 -
    N``, or a granted ``dma_write``). The pipeline's read port is transparent to the write
    port (:class:`~opentrn.hdl.memory_partition.MemoryPartition`, ``second_transparent``):
    the bytes that write enables are read as written, so with ``N = 0`` the result equals
    applying every write in commit order: back-to-back accumulates to one entry lose
    nothing, and neither does a ``dma_write`` committed in the cycle of the read. With
    ``N > 0`` a sum still in the adder cannot be forwarded: a beat that accumulates must
    come at least ``N + 1`` cycles after the previous beat into its entry (the tensor unit
    holds its moving vectors so, docs/architecture.md), and no ``dma_write`` may write the
    entry in between (the program's semaphores order them). No other write can intervene
    in cycle ``t + 1 + N``: the write port belongs to the pipeline. The pipeline reads and
    writes vector words of ``Config.vector_word_bytes`` (V) bytes, ``V / 4`` entries each.

    The other ports share one arbitrated read port (round-robin between ``act_read`` and
    ``dma_read``: a waiting reader is granted within 1 cycle) and the write port
    (``dma_write``, granted in every cycle in which no ``te_write`` writes back, i.e.
    ``N + 1`` cycles after a cycle without an accepted ``te_write``). Responses come in the
    cycle after the request transferred; a read and a write of one word in one cycle returns
    the old data.

    Members
    -------
    te_write : ``In(stream.Signature(te_write_layout(config)))``
        ``bank``, ``entry``, ``data``: ``ArrayLayout(signed(acc_bits), pe_cols)``,
        ``accumulate``, ``float``.
    act_read : ``In(read_signature(act_request_layout, act_response_layout))``
        ``request.payload.{bank, entry}`` → ``response.payload.data``: the entry of every
        partition, ``ArrayLayout(signed(acc_bits), pe_cols)`` (the low ``acc_bits`` bits of
        the stored 32).
    dma_read : ``In(read_signature(word_request_layout, word_response_layout))``
        ``request.payload.{partition, word}`` → ``response.payload.data``:
        ``ArrayLayout(8, W)``.
    dma_write : ``In(stream.Signature(word_write_layout))``
        ``partition``, ``word``, ``data``: ``ArrayLayout(8, W)``, ``strobe``: W bits.
    """

    #: Read the write committed in the cycle of the read-modify-write's read (a transparent
    #: read port). Only a test turns it off, to show the hazard is real.
    _forward = True

    def __init__(self, *, config):
        self._config = config
        partitions, word_bytes, depth = geometry(config)
        # Config.validate makes the partition size a whole number of words (W >= 4).
        self._geometry = partitions, word_bytes, depth
        super().__init__({
            "te_write": In(stream.Signature(te_write_layout(config))),
            "act_read": In(read_signature(act_request_layout(config),
                                          act_response_layout(config))),
            "dma_read": In(read_signature(word_request_layout(partitions, depth),
                                          word_response_layout(word_bytes))),
            "dma_write": In(stream.Signature(word_write_layout(partitions, depth,
                                                               word_bytes))),
        })

    def elaborate(self, platform):
        cfg = self._config
        partitions, word_bytes, depth = self._geometry
        vector_bytes = cfg.vector_word_bytes
        acc_bits, entry_bits = cfg.acc_bits, 8 * ENTRY_BYTES
        slot_bits = exact_log2(vector_bytes // ENTRY_BYTES)
        m = Module()
        m.submodules.memory = memory = PartitionedMemory(
            partitions=partitions, word_bytes=word_bytes, depth=depth,
            vector_bytes=vector_bytes, vector_readers=1, vector_writers=0, rmw_port=True,
            rmw_forward=self._forward)
        wiring.connect(m, wiring.flipped(self.dma_read), memory.word_read)
        wiring.connect(m, wiring.flipped(self.dma_write), memory.word_write)

        def locate(request):
            """(vector word, slot) of an entry: the index is bank * entries + entry, both
            powers of two, so the concatenation is the index."""
            index = Cat(request.entry, request.bank)
            return index[slot_bits:], index[:slot_bits]

        def entry_bits_of(word, slot):
            return Value.cast(word).word_select(slot, entry_bits)

        # -- act_read: a vector read of the entry's vector word, then its slot -------------
        act, vector = self.act_read, memory.vector_read[0]
        act_word, act_slot = locate(act.request.payload)
        m.d.comb += [
            vector.request.valid.eq(act.request.valid),
            vector.request.payload.word.eq(act_word),
            act.request.ready.eq(vector.request.ready),
            act.response.valid.eq(vector.response.valid),
        ]
        response_slot = Signal(slot_bits)
        with m.If(act.request.valid & act.request.ready):
            m.d.sync += response_slot.eq(act_slot)
        # The response split into partitions once (a Cat on the left): a slice of a field of
        # a wide signal per partition would rebuild the field's bits every time.
        act_words = [Signal(8 * vector_bytes, name=f"act_word_{p}") for p in range(partitions)]
        m.d.comb += Cat(*act_words).eq(vector.response.payload.data)
        with m.If(act.response.valid):        # one Verilog process, as in stage 1 below
            m.d.comb += act.response.payload.data.eq(Cat(
                entry_bits_of(word, response_slot)[:acc_bits] for word in act_words))

        # -- te_write stage 0: accept, read the entry's vector word ------------------------
        # The memory's direct read includes the write it takes in this cycle (rmw_forward).
        te = self.te_write
        te_word, te_slot = locate(te.payload)
        m.d.comb += [te.ready.eq(1), memory.direct_read.word.eq(te_word)]

        s1_valid = Signal()
        s1_word = Signal.like(te_word)
        s1_slot = Signal(slot_bits)
        s1_data = Signal(_values_shape(cfg))
        s1_accumulate = Signal()
        # A beat accumulated by the FP32 adder (float; every accumulate in a build without
        # int8), as a register: it gates the adder's operands, in front of its alignment.
        s1_use_sum = Signal()
        m.d.sync += [
            s1_valid.eq(te.valid),
            s1_word.eq(te_word),
            s1_slot.eq(te_slot),
            s1_data.eq(te.payload.data),
            s1_accumulate.eq(te.payload.accumulate),
            s1_use_sum.eq(te.valid & te.payload.accumulate
                          & (te.payload.float if "int8" in cfg.dtypes else 1)),
        ]

        # -- te_write stage 1: merge, add; stage 1 + N: write back --------------------------
        # N = psum_add_stages registers inside the FP adder; everything else that the write
        # needs waits as long (reset-less: only the valid bit must start clear).
        stages = cfg.psum_add_stages

        merged = [entry_bits_of(memory.direct_read.data[p], s1_slot)
                  for p in range(partitions)]
        fp_sum = None
        floats = bool(numerics.float_formats(cfg))
        if floats:
            # acc_bits is 32 with a float format (Config), so an entry is one FP32 code.
            m.submodules.adder = adder = FPAdder(lanes=partitions, stages=stages)
            fp_sum = adder.sum
            if stages:
                m.d.comb += adder.enable.eq(1)
            # Zero operands unless a float accumulate is in stage 1, so the adder does not
            # toggle on integer beats; whole vectors, one assignment each (Icarus speed).
            with m.If(s1_use_sum):
                m.d.comb += [
                    adder.a.eq(Cat(*merged)),
                    adder.b.eq(s1_data),
                ]
        # The entry's 4 bytes in every partition (every slot carries the value).
        strobe = Signal(vector_bytes)
        m.d.comb += strobe.eq(Cat(*[(s1_slot == slot).replicate(ENTRY_BYTES)
                                    for slot in range(vector_bytes // ENTRY_BYTES)]))
        # Stage 1's value of each partition when it is not the FP32 sum: the integer sum or
        # the beat itself (overwrite); one vector, so that the stages copy it in one piece.
        plain = Signal(_values_shape(cfg))
        plain_values = []
        for p in range(partitions):
            old = Signal(signed(acc_bits), name=f"old_{p}")
            new = Signal(signed(acc_bits), name=f"plain_{p}")
            # Inside a condition (the payload is ignored without valid anyway) this becomes
            # one Verilog process that Icarus evaluates once per input change, instead of
            # a net of concatenations that it re-propagates per bit: 10x faster simulation.
            with m.If(s1_valid):
                if "int8" in cfg.dtypes:
                    m.d.comb += [
                        old.eq(merged[p][:acc_bits]),
                        # Assignment to acc_bits bits wraps the sum (two's complement).
                        new.eq(Mux(s1_accumulate, old + s1_data[p], s1_data[p])),
                    ]
                else:
                    # No integer format: every accumulate is FP32 (no integer adder).
                    m.d.comb += new.eq(s1_data[p])
            plain_values.append(new)
        m.d.comb += plain.eq(Cat(*plain_values))

        write_valid = delayed(m, s1_valid, stages, name="valid", reset_less=False)
        write_word = delayed(m, s1_word, stages, name="word")
        write_strobe = delayed(m, strobe, stages, name="strobe")
        write_plain = data.View(_values_shape(cfg), delayed(m, plain, stages, name="plain"))
        write_use_sum = delayed(m, s1_use_sum, stages, name="use_sum") if floats else None
        write = memory.priority_write
        m.d.comb += [write.valid.eq(write_valid), write.payload.word.eq(write_word)]
        written = []
        for p in range(partitions):
            new = Signal(signed(acc_bits), name=f"new_{p}")
            stored = Signal(signed(entry_bits), name=f"stored_{p}")
            with m.If(write_valid):
                if floats:
                    m.d.comb += new.eq(Mux(write_use_sum, fp_sum[p], write_plain[p]))
                else:
                    m.d.comb += new.eq(write_plain[p])
                m.d.comb += stored.eq(new)      # sign-extends to 32 bits
            written.append(stored.replicate(vector_bytes // ENTRY_BYTES))
        # Whole vectors, one assignment each: an assignment to a slice of a signal costs
        # Amaranth a pass over all the signal's bits, so one per partition is quadratic.
        with m.If(write_valid):
            m.d.comb += [write.payload.data.eq(Cat(*written)),
                         write.payload.strobe.eq(write_strobe.replicate(partitions))]
        return m
