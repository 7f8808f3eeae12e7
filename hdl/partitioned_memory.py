"""A buffer of independent partitions (one SRAM each) with arbitrated stream ports: the
common structure of the SBUF and the PSUM."""

from amaranth import Cat, Format, Module, Shape, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .delay_line import delayed
from .hierarchy import shared
from .memory_partition import MemoryPartition
from .params import refusing

__all__ = ["PartitionedMemory", "word_shape", "vector_shape", "strobe_shape",
           "vector_request_layout", "vector_response_layout", "vector_write_layout",
           "word_request_layout", "word_response_layout", "word_write_layout",
           "read_signature"]


def word_shape(word_bytes):
    """One word of one partition: ``word_bytes`` bytes, byte 0 lowest."""
    return data.ArrayLayout(8, word_bytes)


class _WordArray(data.ArrayLayout):
    """An array of words whose named fields (in Verilog and waveforms) stop at the words:
    Amaranth names every element of a layout, down to each byte of each word, and a
    vector of 128 partitions x 64 bytes would take 8,192 wires and their elaboration time
    per signal."""

    def format(self, value, format_spec):
        if format_spec != "":
            raise ValueError(f"Format specifier {format_spec!r} is not supported for layouts")
        value = Value.cast(value)
        width = Shape.cast(self.elem_shape).width
        return Format.Array(value, [Format("{}", value[width * index:width * (index + 1)])
                                    for index in range(self.length)])


def vector_shape(partitions, word_bytes):
    """The word at one index in every partition."""
    return _WordArray(word_shape(word_bytes), partitions)


def strobe_shape(partitions, word_bytes):
    """Byte enables of a vector write: element ``p``, bit ``b`` enables byte ``b`` of
    partition ``p``."""
    return data.ArrayLayout(word_bytes, partitions)


def vector_request_layout(depth):
    """A vector read: one word index, the same in every partition."""
    return data.StructLayout({"word": range(depth)})


def vector_response_layout(partitions, word_bytes):
    return data.StructLayout({"data": vector_shape(partitions, word_bytes)})


def vector_write_layout(partitions, word_bytes, depth):
    return data.StructLayout({
        "word": range(depth),
        "data": vector_shape(partitions, word_bytes),
        "strobe": strobe_shape(partitions, word_bytes),
    })


def word_request_layout(partitions, depth):
    """A read of one word of one partition (the DMA engine's view)."""
    return data.StructLayout({"partition": range(partitions), "word": range(depth)})


def word_response_layout(word_bytes):
    return data.StructLayout({"data": word_shape(word_bytes)})


def word_write_layout(partitions, depth, word_bytes):
    """A write of one word of one partition, ``strobe`` bit ``b`` enabling byte ``b``. The
    field order matches :func:`opentrn.hdl.dma.word_write_layout`, so the bits agree."""
    return data.StructLayout({
        "partition": range(partitions), "word": range(depth),
        "data": word_shape(word_bytes), "strobe": word_bytes,
    })


def read_signature(request_layout, response_layout):
    """A read port seen from the requester: a ``request`` stream out, and a ``response``
    stream in that is always ready and valid exactly once per transferred request, a fixed
    number of cycles after it (the memory's read latency: 1, and one per input stage of
    :class:`PartitionedMemory`), in request order."""
    return wiring.Signature({
        "request": Out(stream.Signature(request_layout)),
        "response": In(stream.Signature(response_layout, always_ready=True)),
    })


def _is_pow2(value):
    return value > 0 and value & (value - 1) == 0


def _check_int(name, value, minimum):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")


class _RoundRobin:
    """One grant per cycle among ``len(valids)`` requesters. The requester after the last
    winner has the highest priority, then the next, cyclically (before any grant: 0 first).
    While ``enable`` is low nothing is granted and the priority order holds."""

    def __init__(self, m, name, valids, enable=1):
        count = len(valids)
        self.grant = Signal(count, name=f"{name}_grant")
        self.any = Signal(name=f"{name}_any")
        if count == 0:
            return
        m.d.comb += self.any.eq(self.grant.any())
        if count == 1:
            m.d.comb += self.grant.eq(valids[0] & enable)
            return
        last = Signal(range(count), init=count - 1, name=f"{name}_last")
        with m.If(enable):
            with m.Switch(last):
                for previous in range(count):
                    with m.Case(previous):
                        order = [(previous + step) % count for step in range(1, count + 1)]
                        with m.If(valids[order[0]]):
                            m.d.comb += self.grant[order[0]].eq(1)
                        for index in order[1:]:
                            with m.Elif(valids[index]):
                                m.d.comb += self.grant[index].eq(1)
        for index in range(count):
            with m.If(self.grant[index]):
                m.d.sync += last.eq(index)


class PartitionedMemory(wiring.Component):
    """``partitions`` independent SRAMs of ``depth`` words of ``word_bytes`` bytes, with
    stream request ports for whole vectors (the same vector word index in every partition,
    as Trainium's engines access SBUF and PSUM) and for single words (the DMA engine).

    Vector words. The vector ports see each word as ``word_bytes / vector_bytes`` vector
    words of ``vector_bytes`` bytes (default: the whole word): vector word ``v`` of a
    partition is bytes ``v * vector_bytes ..`` of it, in word ``v // (word_bytes /
    vector_bytes)``. A vector is then at most ``partitions x vector_bytes`` bytes however
    wide the DMA word is.

    Arbitration. Every memory has one arbitrated read port and one write port, addressed
    together, so one read and one write are granted per cycle, in parallel. Read requesters,
    in this order: ``vector_read[0..vector_readers-1]``, then ``word_read``. Write
    requesters: ``vector_write[0..vector_writers-1]``, then ``word_write``. Each group is
    round-robin: after requester ``i`` wins, the priority order is ``i+1, i+2, ...,`` ``i``
    (cyclically; before the first grant ``0, 1, ...``). A requester that holds ``valid``
    is therefore granted within ``n - 1`` cycles of raising it, ``n`` the requesters of its
    group; on the write side, cycles in which ``priority_write`` writes do not count (no
    arbitrated write is granted then and the order holds). A request's ``ready`` is high
    exactly in the cycle it is granted.

    Timing. A read granted in cycle ``t`` samples the memory at the end of cycle ``t + S``
    and its response is valid in cycle ``t + 1 + S`` only (the response streams are always
    ready). A write granted in cycle ``t`` is in the memory from cycle ``t + 1 + S``. A read
    and a write granted in the same cycle, of the same word: the read returns the old data;
    a read granted after a write sees it. Only enabled bytes are written. ``S =
    input_stages`` (0 to 2): registers of the granted read and write at each partition
    (:class:`~opentrn.hdl.memory_partition.MemoryPartition`), not with ``rmw_port``.

    Each partition is a :class:`~opentrn.hdl.memory_partition.MemoryPartition`, one
    Verilog module for all of them. ``depth`` and ``partitions`` need not be powers of two;
    requests must name a word below ``depth`` (a vector word below ``vector_depth``;
    undefined otherwise). A word request naming no partition writes nothing and reads zeros.

    With ``rmw_port`` (used by the PSUM's read-modify-write), two more members: a dedicated
    vector read port ``direct_read`` (not arbitrated; 1-cycle latency like the others) and
    a ``priority_write`` that is always accepted and pre-empts the arbitrated writers.
    ``direct_read`` returns the vector as it is after the write the memories take in the
    cycle of the read (with ``rmw_forward``, the default), so a read-modify-write of one
    word per cycle sees every earlier write; without it, the old data.

    Members
    -------
    vector_read : ``In(read_signature(vector_request_layout, ...)).array(vector_readers)``
        ``request.payload.word`` (a vector word); ``response.payload.data[p]`` = vector
        word of partition ``p``.
    vector_write : ``In(stream.Signature(vector_write_layout)).array(vector_writers)``
        ``word`` (a vector word), ``data[p]``, ``strobe[p]`` (byte enables of partition
        ``p``).
    word_read : ``In(read_signature(word_request_layout, word_response_layout))``
        ``request.payload.{partition, word}``; ``response.payload.data``: that word.
    word_write : ``In(stream.Signature(word_write_layout))``
        ``partition``, ``word``, ``data``, ``strobe`` (byte enables).
    direct_read : ``In(Signature({"word": Out(range(vector_depth)), "data": In(vector)}))``
        Only with ``rmw_port``. ``data`` is the vector at the ``word`` of the previous cycle.
    priority_write : ``In(stream.Signature(vector_write_layout, always_ready=True))``
        Only with ``rmw_port``.
    """

    def __init__(self, *, partitions, word_bytes, depth, vector_readers, vector_writers,
                 vector_bytes=None, rmw_port=False, rmw_forward=True, input_stages=0):
        vector_bytes = word_bytes if vector_bytes is None else vector_bytes
        with refusing(self):
            _check_int("partitions", partitions, 1)
            _check_int("word_bytes", word_bytes, 1)
            if not _is_pow2(word_bytes):
                # A byte offset splits into a word index and a byte lane only for a power
                # of two.
                raise ValueError(f"word_bytes={word_bytes!r}: must be a power of two")
            _check_int("vector_bytes", vector_bytes, 1)
            if not _is_pow2(vector_bytes) or vector_bytes > word_bytes:
                raise ValueError(f"vector_bytes={vector_bytes!r}: must be a power of two of "
                                 f"at most word_bytes={word_bytes}")
            _check_int("depth", depth, 1)
            _check_int("vector_readers", vector_readers, 0)
            _check_int("vector_writers", vector_writers, 0)
            if isinstance(input_stages, bool) or input_stages not in (0, 1, 2):
                raise ValueError(f"input_stages={input_stages!r}: must be 0, 1 or 2")
            if input_stages and rmw_port:
                # The read-modify-write forwards the write of its own cycle.
                raise ValueError(f"input_stages={input_stages}: must be 0 with rmw_port")
        self.input_stages = input_stages
        self.partitions, self.word_bytes, self.depth = partitions, word_bytes, depth
        self.vector_bytes = vector_bytes
        self.vector_depth = depth * (word_bytes // vector_bytes)
        self.vector_readers, self.vector_writers = vector_readers, vector_writers
        self.rmw_port, self.rmw_forward = bool(rmw_port), bool(rmw_forward)
        vector = vector_shape(partitions, vector_bytes)
        write = vector_write_layout(partitions, vector_bytes, self.vector_depth)
        members = {
            "vector_read": In(read_signature(vector_request_layout(self.vector_depth),
                                             vector_response_layout(partitions, vector_bytes))
                              ).array(vector_readers),
            "vector_write": In(stream.Signature(write)).array(vector_writers),
            "word_read": In(read_signature(word_request_layout(partitions, depth),
                                           word_response_layout(word_bytes))),
            "word_write": In(stream.Signature(word_write_layout(partitions, depth,
                                                                word_bytes))),
        }
        if self.rmw_port:
            members["direct_read"] = In(wiring.Signature({
                "word": Out(range(self.vector_depth)), "data": In(vector)}))
            members["priority_write"] = In(stream.Signature(write, always_ready=True))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        parts = self.partitions
        lane_bits = exact_log2(self.word_bytes // self.vector_bytes)
        # One SRAM block per partition, all the same module (hierarchy.shared).
        srams = []
        for p in range(parts):
            sram = MemoryPartition(word_bytes=self.word_bytes, depth=self.depth,
                                   vector_bytes=self.vector_bytes, second_read=self.rmw_port,
                                   second_transparent=self.rmw_forward,
                                   input_stages=self.input_stages)
            m.submodules[f"partition_{p}"] = shared(sram)
            srams.append(sram)

        # Vectors are assigned whole (a Cat of the partitions' words), never partition by
        # partition into one wide signal: many slice assignments to one signal cost
        # elaboration time in the square of its width.
        def vector(words):
            return Cat(*words)

        # -- reads ----------------------------------------------------------------------
        readers = [*self.vector_read, self.word_read]
        reads = _RoundRobin(m, "read", [r.request.valid for r in readers])
        address = Signal(range(self.depth))
        # The lane of a vector word within its word (none when vector words are words: no
        # 0-bit signals, which Verilog lacks).
        lane = [Signal(lane_bits, name="lane")] if lane_bits else []
        for index, reader in enumerate(self.vector_read):
            m.d.comb += reader.request.ready.eq(reads.grant[index])
            with m.If(reads.grant[index]):
                # A vector word index is its lane (low bits) and its word.
                m.d.comb += Cat(*lane, address).eq(reader.request.payload.word)
        m.d.comb += self.word_read.request.ready.eq(reads.grant[-1])
        with m.If(reads.grant[-1]):
            m.d.comb += address.eq(self.word_read.request.payload.word)
        for sram in srams:
            m.d.comb += [sram.read_addr.eq(address), sram.read_en.eq(reads.any)]
            if lane_bits:
                m.d.comb += sram.read_lane.eq(lane[0])

        # The response goes to the winner of 1 + S cycles ago; a word read picks its
        # partition.
        latency = 1 + self.input_stages
        responding = delayed(m, reads.grant, latency, name="responding", reset_less=False)
        partition = delayed(m, self.word_read.request.payload.partition, latency,
                            name="partition")
        for index, reader in enumerate(self.vector_read):
            m.d.comb += reader.response.valid.eq(responding[index])
            # Conditional assignments become one Verilog process per signal, which Icarus
            # evaluates once per input change; plain wide assignments it re-propagates
            # piece by piece (here and below: a 10x faster simulation).
            with m.If(responding[index]):
                m.d.comb += reader.response.payload.data.eq(
                    vector(sram.read_vector for sram in srams))
        m.d.comb += self.word_read.response.valid.eq(responding[-1])
        with m.Switch(partition):
            for p, sram in enumerate(srams):
                with m.Case(p):
                    m.d.comb += self.word_read.response.payload.data.eq(sram.read_data)

        # -- writes ---------------------------------------------------------------------
        writers = [*self.vector_write, self.word_write]
        writes = _RoundRobin(m, "write", [w.valid for w in writers],
                             enable=~self.priority_write.valid if self.rmw_port else 1)
        for index, writer in enumerate(writers):
            m.d.comb += writer.ready.eq(writes.grant[index])
        # The vector write the memories take this cycle (none: all strobes 0), or the word.
        committed = Signal(vector_write_layout(parts, self.vector_bytes, self.vector_depth))
        row = Signal(range(self.depth))
        write_lane = [Signal(lane_bits, name="write_lane")] if lane_bits else []
        word = self.word_write.payload
        if self.rmw_port:
            with m.If(self.priority_write.valid):
                m.d.comb += committed.eq(self.priority_write.payload)
        for index, writer in enumerate(self.vector_write):
            with m.If(writes.grant[index]):
                m.d.comb += committed.eq(writer.payload)
        vector_commit = Signal()
        m.d.comb += [Cat(*write_lane, row).eq(committed.word),
                     vector_commit.eq(~writes.grant[-1])]
        with m.If(writes.grant[-1]):
            m.d.comb += row.eq(word.word)
        for p, sram in enumerate(srams):
            if lane_bits:
                m.d.comb += sram.write_lane.eq(write_lane[0])
            m.d.comb += [
                sram.write_addr.eq(row),
                sram.write_word.eq(writes.grant[-1]),
                sram.write_data.eq(word.data), sram.write_en.eq(word.strobe),
                sram.write_hit.eq(word.partition == p),
            ]
        # Split once into the partitions' ports (a Cat on the left): a slice of a field of a
        # wide signal per partition would rebuild the field's bits every time.
        with m.If(vector_commit):                   # one process, as for the responses
            m.d.comb += [Cat(sram.write_vector for sram in srams).eq(committed.data),
                         Cat(sram.write_vector_en for sram in srams).eq(committed.strobe)]

        if self.rmw_port:
            direct = self.direct_read.word
            m.d.comb += [Cat(sram.second_lane if lane_bits else [], sram.second_addr).eq(direct)
                         for sram in srams]
            m.d.comb += self.direct_read.data.eq(vector(sram.second_vector for sram in srams))
        return m
