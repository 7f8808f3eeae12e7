"""One partition of a partitioned buffer: an SRAM of ``depth`` words with a registered read
port, a byte-enabled write port and, optionally, a second read port; engines access it in
vector words, which may be narrower than its words."""

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .delay_line import delayed
from .params import check_positive, check_power_of_two, refusing

__all__ = ["MemoryPartition"]


class MemoryPartition(wiring.Component):
    """An SRAM of ``depth`` words of ``word_bytes`` bytes (byte 0 lowest), each word
    ``word_bytes / vector_bytes`` vector words (lanes) of ``vector_bytes`` bytes: lane ``l``
    is bytes ``l * vector_bytes ..`` of the word.

    A read enabled in cycle ``t`` samples the word at ``read_addr`` at the end of cycle
    ``t + S``; ``read_data`` shows it from cycle ``t + 1 + S`` until the next enabled read,
    and ``read_vector`` its lane ``read_lane`` (as sampled with it). A write in cycle ``t``
    is in the memory from cycle ``t + 1 + S``: with ``write_word``, the bytes of
    ``write_data`` that ``write_en`` enables (bit ``b``: byte ``b``) and nothing unless
    ``write_hit``; else the bytes of ``write_vector`` that ``write_vector_en`` enables, into
    lane ``write_lane``. A read and a write of one word in one cycle return the old data.
    ``S = input_stages``: registers of the read's and the write's memory inputs (after the
    write's choice of data and enables) in this block, so next to its SRAM, whatever drives
    the inputs of all of a buffer's partitions; reads and writes pass the same number, so
    they reach the SRAM in the order they came. Not with ``second_read``.

    With ``second_read``, ``second_vector`` is lane ``second_lane`` of the word at the
    ``second_addr`` of the previous cycle (read every cycle), and with
    ``second_transparent`` it includes the write of that previous cycle (the bytes that
    write enabled are the new ones): the bypass a read-modify-write needs.

    The partitions of a buffer are all this one block (:mod:`opentrn.hdl.hierarchy`): the
    Verilog of a buffer of any number of partitions has one SRAM module, and the lane
    selection is in it, not repeated per partition in the buffer. It has no reset: the lane
    registers only select among data, and the input stages start clear and finish, after a
    reset too, the reads and writes granted before it.

    Members
    -------
    read_addr : ``In(range(depth))``; read_en : ``In(1)``; read_lane : ``In(lanes)``
    read_data : ``Out(8 * word_bytes)``; read_vector : ``Out(8 * vector_bytes)``
    write_addr : ``In(range(depth))``; write_word : ``In(1)``
    write_data : ``In(8 * word_bytes)``; write_en : ``In(word_bytes)``; write_hit : ``In(1)``
    write_lane : ``In(lanes)``; write_vector : ``In(8 * vector_bytes)``;
    write_vector_en : ``In(vector_bytes)``
    second_addr : ``In(range(depth))``; second_lane : ``In(lanes)``;
    second_vector : ``Out(8 * vector_bytes)``
        Only with ``second_read``.

    ``lanes`` is ``log2(word_bytes / vector_bytes)`` bits; with one lane (vector words are
    words) there are no ``*_lane`` members.
    """

    def __init__(self, *, word_bytes, depth, vector_bytes=None, second_read=False,
                 second_transparent=True, input_stages=0):
        vector_bytes = word_bytes if vector_bytes is None else vector_bytes
        with refusing(self):
            check_positive(depth=depth)
            check_power_of_two(word_bytes=word_bytes, vector_bytes=vector_bytes)
            if vector_bytes > word_bytes:
                raise ValueError(f"vector_bytes={vector_bytes}: must be at most "
                                 f"word_bytes={word_bytes}")
            if isinstance(input_stages, bool) or input_stages not in (0, 1, 2):
                raise ValueError(f"input_stages={input_stages!r}: must be 0, 1 or 2")
            if input_stages and second_read:
                # The second port's read-modify-write forwards the write of its own cycle.
                raise ValueError(f"input_stages={input_stages}: must be 0 with second_read")
        self._word_bytes, self._depth, self._vector_bytes = word_bytes, depth, vector_bytes
        self._second, self._transparent = bool(second_read), bool(second_transparent)
        self._input_stages = input_stages
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (word_bytes, depth, vector_bytes, self._second, self._transparent,
                           input_stages)
        lane_bits = exact_log2(word_bytes // vector_bytes)
        members = {
            "read_addr": In(range(depth)), "read_en": In(1),
            "read_data": Out(8 * word_bytes), "read_vector": Out(8 * vector_bytes),
            "write_addr": In(range(depth)), "write_word": In(1),
            "write_data": In(8 * word_bytes), "write_en": In(word_bytes), "write_hit": In(1),
            "write_vector": In(8 * vector_bytes), "write_vector_en": In(vector_bytes),
        }
        if self._second:
            members.update({"second_addr": In(range(depth)),
                            "second_vector": Out(8 * vector_bytes)})
        if lane_bits:
            # No port of 0 bits: Verilog has no such thing.
            members.update({"read_lane": In(lane_bits), "write_lane": In(lane_bits)})
            if self._second:
                members["second_lane"] = In(lane_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        width, vector_width = self._word_bytes, self._vector_bytes
        lanes = width // vector_width
        m.submodules.memory = memory = Memory(
            shape=data.ArrayLayout(8, width), depth=self._depth, init=[])
        write = memory.write_port(granularity=1)
        read = memory.read_port()
        stages = self._input_stages

        def staged(value, name):
            # No reset (a shared block's registers cannot have one): the stages start clear
            # and a reset does not stop a read or write the arbiter granted before it.
            return delayed(m, value, stages, name=name)

        read_en = staged(self.read_en, "read_en")
        m.d.comb += [
            read.addr.eq(staged(self.read_addr, "read_addr")), read.en.eq(read_en),
            self.read_data.eq(read.data),
        ]

        def lane_of(word, lane):
            word = Value.cast(word)
            return word if lanes == 1 else word.word_select(lane, 8 * vector_width)

        # Lane registers hold no state of their own (they select among read data).
        read_lane = None
        if lanes > 1:
            read_lane = Signal(len(self.read_lane), reset_less=True)
            # Outside the condition: the stages advance every cycle.
            lane_in = staged(self.read_lane, "read_lane")
            with m.If(read_en):
                m.d.sync += read_lane.eq(lane_in)
        m.d.comb += self.read_vector.eq(lane_of(read.data, read_lane))

        # A vector write is its bytes in every lane, enabled in its own lane only.
        vector_en = self.write_vector_en
        if lanes > 1:
            vector_en = (vector_en << (self.write_lane * vector_width))[:width]
        m.d.comb += [
            write.addr.eq(staged(self.write_addr, "write_addr")),
            write.data.eq(staged(Mux(self.write_word, self.write_data,
                                     self.write_vector.replicate(lanes)), "write_data")),
            write.en.eq(staged(Mux(self.write_word, Mux(self.write_hit, self.write_en, 0),
                                   vector_en), "write_en")),
        ]
        if self._second:
            second = memory.read_port(transparent_for=[write] if self._transparent else [])
            second_lane = None
            if lanes > 1:
                second_lane = Signal(len(self.second_lane), reset_less=True)
                m.d.sync += second_lane.eq(self.second_lane)
            m.d.comb += [second.addr.eq(self.second_addr),
                         self.second_vector.eq(lane_of(second.data, second_lane))]
        return m
