"""A byte FIFO that takes and gives a variable number of bytes per cycle: the realignment
buffer between a DMA's reads and writes, whose byte lanes differ."""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .params import check_power_of_two, refusing

__all__ = ["ByteGearbox"]


class ByteGearbox(wiring.Component):
    """Holds up to ``capacity`` bytes, each with a poison bit (the byte came from a bus beat
    with an error response and must not be written).

    Each cycle it takes ``push_count`` bytes from lanes ``push_lane .. push_lane +
    push_count - 1`` of ``push_data`` and gives up the oldest ``pop_count`` bytes, which are
    on lanes ``0 .. pop_count - 1`` of ``head`` during that cycle. The user keeps
    ``push_lane + push_count <= word_bytes``, ``pop_count <= level`` and ``push_count <=
    capacity - level`` (bytes pushed in a cycle cannot be popped in it).
    ``word_bytes`` and ``capacity`` are powers of two. ``head`` depends on registers only.

    Members
    -------
    push_count : ``In(range(word_bytes + 1))``
    push_lane : ``In(range(word_bytes))``
        The lane of ``push_data`` the pushed bytes start at.
    push_data : ``In(data.ArrayLayout(8, word_bytes))``
    push_poison : ``In(word_bytes)``
    pop_count : ``In(range(word_bytes + 1))``
    head : ``Out(data.ArrayLayout(8, word_bytes))``
        The oldest ``word_bytes`` bytes; lanes at or past ``level`` are zero.
    head_poison : ``Out(word_bytes)``
        Their poison bits (zero past ``level``).
    level : ``Out(range(capacity + 1))``
        Bytes held.
    """

    def __init__(self, *, word_bytes, capacity):
        with refusing(self):
            check_power_of_two(word_bytes=word_bytes, capacity=capacity)
            if capacity < 2 * word_bytes:
                raise ValueError(f"capacity={capacity}: must be at least 2 * word_bytes = "
                                 f"{2 * word_bytes}")
        self._word_bytes, self._capacity = word_bytes, capacity
        super().__init__({
            "push_count": In(range(word_bytes + 1)),
            "push_lane": In(range(word_bytes)),
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
        words = capacity // width
        lane_bits = exact_log2(width)
        # A ring of ``capacity`` bytes between a write and a read pointer, both registers: a
        # byte pushed never moves, so neither the data nor the pointers pass through an
        # adder or shifter of the pop (whose count comes from the destination's handshake,
        # late in the cycle), and the push does not wait for the pop's shift.
        store = [Signal(8, name=f"byte_{slot}") for slot in range(capacity)]
        poison = Signal(capacity)
        write_at = Signal(range(capacity))
        read_at = Signal(range(capacity))

        # Push: pushed byte ``i`` (lane ``push_lane + i``) goes to slot ``write_at + i``, so
        # slot ``s`` takes lane ``(s - write_at + push_lane) mod width`` of the pushed word:
        # one rotation of the word, by an amount made of registers beside the data's arrival
        # (a DMA's pushed data comes from a memory's read port, late in the cycle), then a
        # per-slot enable.
        amount = Signal(range(width), name="push_rotation")
        m.d.comb += amount.eq(write_at[:lane_bits] - self.push_lane)
        rotated = Signal(8 * width)
        m.d.comb += rotated.eq(_rotate_left(self.push_data.as_value(), amount, 8, width))
        poison_rotated = Signal(width)
        m.d.comb += poison_rotated.eq(_rotate_left(self.push_poison, amount, 1, width))
        for slot in range(capacity):
            offset = Signal(range(capacity), name=f"offset_{slot}")
            m.d.comb += offset.eq(slot - write_at)          # modulo the power-of-two ring
            with m.If(offset < self.push_count):
                lane = slot % width
                m.d.sync += [store[slot].eq(rotated[8 * lane:8 * lane + 8]),
                             poison[slot].eq(poison_rotated[lane])]

        # Head: the ``width`` bytes from the read pointer span two adjacent words of the
        # ring; pick them, then shift by the pointer's lane. Bytes past ``level`` read as
        # zero (and unpoisoned), as a shifting FIFO would hold them.
        word_at = read_at[lane_bits:]           # capacity >= 2 words: never empty
        pair = Signal(16 * width)
        pair_poison = Signal(2 * width)
        with m.Switch(word_at):
            for index in range(words):
                with m.Case(index):
                    first, second = index, (index + 1) % words
                    m.d.comb += [
                        pair.eq(Cat(*(store[w * width + lane] for w in (first, second)
                                      for lane in range(width)))),
                        pair_poison.eq(Cat(poison[first * width:(first + 1) * width],
                                           poison[second * width:(second + 1) * width])),
                    ]
        shift = read_at[:lane_bits]
        shifted = Signal(8 * width)
        shifted_poison = Signal(width)
        m.d.comb += [shifted.eq((pair >> (shift << 3))[:8 * width]),
                     shifted_poison.eq((pair_poison >> shift)[:width])]
        for lane in range(width):
            held = self.level > lane
            m.d.comb += [
                self.head[lane].eq(Mux(held, shifted[8 * lane:8 * lane + 8], 0)),
                self.head_poison[lane].eq(held & shifted_poison[lane]),
            ]

        m.d.sync += [
            write_at.eq(write_at + self.push_count),
            read_at.eq(read_at + self.pop_count),
            self.level.eq(self.level + self.push_count - self.pop_count),
        ]
        return m


def _rotate_left(value, amount, element_bits, count):
    """``value``, ``count`` elements of ``element_bits``, rotated towards the high end by
    ``amount`` elements."""
    doubled = Cat(value, value)
    return (doubled << (amount * element_bits))[count * element_bits:2 * count * element_bits]
