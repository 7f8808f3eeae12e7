"""Walks a DMA access pattern word by word: up to three dimensions, the innermost one a
contiguous run of bytes (a row)."""

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi4 import BOUNDARY_BYTES

__all__ = ["AccessPatternWalker"]


class AccessPatternWalker(wiring.Component):
    """Iterates the rows of one side of a DMA descriptor, and the bus words of each row.

    Row ``(i1, i2)`` (``i1 < n1`` fastest) starts at byte ``addr + i1 * stride1 + i2 *
    stride2`` of partition ``partition + i1 * pstep1 + i2 * pstep2`` and is ``row_bytes``
    long. A row covers the ``word_bytes``-aligned words from its first byte to its last; the
    first and last may be partial (``first_lane``, ``last_lane``). ``step`` consumes
    ``step_words`` words of the current row (1 for a word at a time; ``burst_words`` for an
    AXI4 burst), moving to the next row at the end of one, and ends the walk after the last.

    Members
    -------
    load : ``In(1)``
        Start a walk with the pattern on the ``addr`` ... ``row_bytes`` inputs.
    addr, partition, stride1, stride2, pstep1, pstep2, n1, n2, row_bytes : ``In(...)``
        The pattern (held by the user while it walks).
    step : ``In(1)``
        Consume ``step_words`` words (ignored when not ``active``).
    step_words : ``In(range(max_burst + 1))``
    active : ``Out(1)``
        A word remains.
    address : ``Out(addr_bits)``
        Byte address of the current word (aligned to ``word_bytes``).
    word : ``Out(addr_bits - log2(word_bytes))``
        Index of the current word.
    row_partition : ``Out(partition_bits)``
    first_lane, last_lane : ``Out(range(word_bytes))``
        Bytes of the current word that belong to the row.
    words_left : ``Out(...)``
        Words of the row from the current one to its end.
    burst_words : ``Out(range(max_burst + 1))``
        ``min(max_burst, words_left, words to the next 4 KiB boundary)``.
    """

    def __init__(self, *, word_bytes, addr_bits, partition_bits, size_bits, row_bytes_bits,
                 max_burst):
        self._word_bytes = word_bytes
        self._log2_word = exact_log2(word_bytes)
        self._addr_bits = addr_bits
        self._max_burst = max_burst
        super().__init__({
            "load": In(1),
            "addr": In(addr_bits), "partition": In(partition_bits),
            "stride1": In(addr_bits), "stride2": In(addr_bits),
            "pstep1": In(partition_bits), "pstep2": In(partition_bits),
            "n1": In(size_bits), "n2": In(size_bits), "row_bytes": In(row_bytes_bits),
            "step": In(1), "step_words": In(range(max_burst + 1)),
            "active": Out(1),
            "address": Out(addr_bits),
            "word": Out(addr_bits - self._log2_word),
            "row_partition": Out(partition_bits),
            "first_lane": Out(range(word_bytes)), "last_lane": Out(range(word_bytes)),
            "words_left": Out(addr_bits + 1),
            "burst_words": Out(range(max_burst + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        shift, lanes = self._log2_word, self._word_bytes - 1
        bits = self._addr_bits + 2          # sums of an address and a row length

        cur = Signal(bits)                   # current byte (unaligned at a row's start only)
        row_end = Signal(bits)               # one past the row's last byte
        plane_addr = Signal(bits)
        plane_part = Signal.like(self.partition)
        i1 = Signal.like(self.n1)
        i2 = Signal.like(self.n2)

        cur_word = cur >> shift
        last_word = (row_end - 1) >> shift
        words_left = Signal(bits)
        m.d.comb += [
            words_left.eq(last_word - cur_word + 1),
            self.words_left.eq(words_left),
            self.address.eq(cur_word << shift),
            self.word.eq(cur_word),
            self.first_lane.eq(cur[:shift] if shift else 0),
            self.last_lane.eq(Mux(words_left == 1, (row_end - 1)[:shift] if shift else 0,
                                  lanes)),
        ]
        words_to_boundary = (BOUNDARY_BYTES >> shift) - cur[shift:12]
        to_boundary = Mux(words_to_boundary < self._max_burst, words_to_boundary,
                          self._max_burst)
        m.d.comb += self.burst_words.eq(Mux(words_left < to_boundary, words_left, to_boundary))

        def start_row(address, partition):
            return [cur.eq(address), row_end.eq(address + self.row_bytes),
                    self.row_partition.eq(partition)]

        with m.If(self.load):
            m.d.sync += [self.active.eq(1), plane_addr.eq(self.addr),
                         plane_part.eq(self.partition), i1.eq(0), i2.eq(0),
                         *start_row(self.addr, self.partition)]
        with m.Elif(self.step & self.active):
            with m.If(self.step_words < words_left):
                m.d.sync += cur.eq((cur_word + self.step_words) << shift)
            with m.Elif(i1 + 1 < self.n1):
                # The row started at row_end - row_bytes.
                m.d.sync += [i1.eq(i1 + 1),
                             *start_row(row_end - self.row_bytes + self.stride1,
                                        self.row_partition + self.pstep1)]
            with m.Elif(i2 + 1 < self.n2):
                next_plane, next_part = plane_addr + self.stride2, plane_part + self.pstep2
                m.d.sync += [i1.eq(0), i2.eq(i2 + 1), plane_addr.eq(next_plane),
                             plane_part.eq(next_part), *start_row(next_plane, next_part)]
            with m.Else():
                m.d.sync += self.active.eq(0)
        return m
