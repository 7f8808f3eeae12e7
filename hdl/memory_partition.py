"""One partition of a partitioned buffer: an SRAM of ``depth`` words with a registered read
port, a byte-enabled write port and, optionally, a second read port."""

from amaranth import Module
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["MemoryPartition"]


class MemoryPartition(wiring.Component):
    """An SRAM of ``depth`` words of ``word_bytes`` bytes (byte 0 lowest).

    A read enabled in cycle ``t`` samples the word at ``read_addr`` at the end of cycle
    ``t``; ``read_data`` shows it from cycle ``t + 1`` until the next enabled read. A write
    in cycle ``t`` (``write_en`` bit ``b`` enables byte ``b``) is in the memory from cycle
    ``t + 1``; a read and a write of one word in one cycle return the old data. With
    ``second_read``, ``second_data`` is the word at the ``second_addr`` of the previous
    cycle (read every cycle, old data on a same-cycle write).

    The partitions of a buffer are all this one block (:mod:`opentrn.hdl.hierarchy`): the
    Verilog of a buffer of any number of partitions has one SRAM module. It holds data
    only, no reset.

    Members
    -------
    read_addr : ``In(range(depth))``; read_en : ``In(1)``; read_data : ``Out(8 * word_bytes)``
    write_addr : ``In(range(depth))``; write_data : ``In(8 * word_bytes)``;
    write_en : ``In(word_bytes)``
    second_addr : ``In(range(depth))``; second_data : ``Out(8 * word_bytes)``
        Only with ``second_read``.
    """

    def __init__(self, *, word_bytes, depth, second_read=False):
        for name, value in (("word_bytes", word_bytes), ("depth", depth)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                self._MustUse__silence = True  # refused, so it is not an unused elaboratable
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        self._word_bytes, self._depth, self._second = word_bytes, depth, bool(second_read)
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (word_bytes, depth, self._second)
        members = {
            "read_addr": In(range(depth)), "read_en": In(1), "read_data": Out(8 * word_bytes),
            "write_addr": In(range(depth)), "write_data": In(8 * word_bytes),
            "write_en": In(word_bytes),
        }
        if self._second:
            members.update({"second_addr": In(range(depth)), "second_data": Out(8 * word_bytes)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = memory = Memory(
            shape=data.ArrayLayout(8, self._word_bytes), depth=self._depth, init=[])
        read = memory.read_port()
        write = memory.write_port(granularity=1)
        m.d.comb += [
            read.addr.eq(self.read_addr), read.en.eq(self.read_en),
            self.read_data.eq(read.data),
            write.addr.eq(self.write_addr), write.data.eq(self.write_data),
            write.en.eq(self.write_en),
        ]
        if self._second:
            second = memory.read_port()
            m.d.comb += [second.addr.eq(self.second_addr), self.second_data.eq(second.data)]
        return m
