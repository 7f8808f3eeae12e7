"""A byte FIFO that takes and gives a variable number of bytes per cycle: the realignment
buffer between a DMA's reads and writes, whose byte lanes differ."""

from amaranth import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ByteGearbox"]


class ByteGearbox(wiring.Component):
    """Holds up to ``capacity`` bytes, each with a poison bit (the byte came from a bus beat
    with an error response and must not be written).

    Each cycle it takes ``push_count`` bytes from lanes ``0 .. push_count - 1`` of
    ``push_data`` and gives up the oldest ``pop_count`` bytes, which are on lanes ``0 ..
    pop_count - 1`` of ``head`` during that cycle. The user keeps ``pop_count <= level`` and
    ``push_count <= capacity - level`` (bytes pushed in a cycle cannot be popped in it).

    Members
    -------
    push_count : ``In(range(word_bytes + 1))``
    push_data : ``In(data.ArrayLayout(8, word_bytes))``
    push_poison : ``In(word_bytes)``
    pop_count : ``In(range(word_bytes + 1))``
    head : ``Out(data.ArrayLayout(8, word_bytes))``
        The oldest ``word_bytes`` bytes.
    head_poison : ``Out(word_bytes)``
    level : ``Out(range(capacity + 1))``
        Bytes held.
    """

    def __init__(self, *, word_bytes, capacity):
        if capacity < 2 * word_bytes:
            raise ValueError(f"capacity must be at least 2 * word_bytes = {2 * word_bytes}, "
                             f"not {capacity}")
        self._word_bytes, self._capacity = word_bytes, capacity
        super().__init__({
            "push_count": In(range(word_bytes + 1)),
            "push_data": In(data.ArrayLayout(8, word_bytes)),
            "push_poison": In(word_bytes),
            "pop_count": In(range(word_bytes + 1)),
            "head": Out(data.ArrayLayout(8, word_bytes)),
            "head_poison": Out(word_bytes),
            "level": Out(range(capacity + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        width, capacity = self._word_bytes, self._capacity
        store = Signal(8 * capacity)
        poison = Signal(capacity)

        # Bytes past push_count are not the user's; mask them before shifting them in.
        keep = Signal(width)
        m.d.comb += keep.eq((1 << self.push_count) - 1)
        byte_mask = Signal(8 * width)
        for lane in range(width):
            m.d.comb += byte_mask[8 * lane:8 * lane + 8].eq(keep[lane].replicate(8))
        incoming = self.push_data.as_value() & byte_mask
        remaining = Signal(range(capacity + 1))
        m.d.comb += remaining.eq(self.level - self.pop_count)
        m.d.sync += [
            store.eq((store >> (self.pop_count << 3)) | (incoming << (remaining << 3))),
            poison.eq((poison >> self.pop_count) | ((self.push_poison & keep) << remaining)),
            self.level.eq(remaining + self.push_count),
        ]
        m.d.comb += [
            self.head.eq(store[:8 * width]),
            self.head_poison.eq(poison[:width]),
        ]
        return m
