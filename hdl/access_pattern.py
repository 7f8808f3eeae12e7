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
    first and last may be partial (``first_lane``, ``lane_count``). ``step`` consumes one
    word of the current row, or ``burst_words`` (an AXI4 burst) with ``step_burst``, moving
    to the next row at the end of one, and ends the walk after the last.

    Members
    -------
    load : ``In(1)``
        Start a walk with the pattern on the ``addr`` ... ``row_bytes`` inputs.
    addr, partition, stride1, stride2, pstep1, pstep2, n1, n2, row_bytes : ``In(...)``
        The pattern (held by the user while it walks).
    step : ``In(1)``
        Consume a word, or a burst (ignored when not ``active``).
    step_burst : ``In(1)``
        A step consumes ``burst_words`` words rather than one.
    active : ``Out(1)``
        A word remains.
    address : ``Out(addr_bits)``
        Byte address of the current word (aligned to ``word_bytes``).
    word : ``Out(addr_bits - log2(word_bytes))``
        Index of the current word.
    row_partition : ``Out(partition_bits)``
    first_lane : ``Out(range(word_bytes))``
        The first byte of the current word that belongs to the row.
    lane_count : ``Out(range(word_bytes + 1))``
        How many bytes of the current word, from ``first_lane``, belong to the row.
    lane_count_after_step : ``Out(range(word_bytes + 1))``
        What ``lane_count`` becomes if this cycle steps (and a word remains after it): made
        from registers, for a user that registers a decision about the next word.
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
            "step": In(1), "step_burst": In(1),
            "active": Out(1),
            "address": Out(addr_bits),
            "word": Out(addr_bits - self._log2_word),
            "row_partition": Out(partition_bits),
            "first_lane": Out(range(word_bytes)), "lane_count": Out(range(word_bytes + 1)),
            "lane_count_after_step": Out(range(word_bytes + 1)),
            "words_left": Out(addr_bits + 1),
            "burst_words": Out(range(max_burst + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        shift, lanes = self._log2_word, self._word_bytes - 1
        bits = self._addr_bits + 2          # sums of an address and a row length
        boundary_words = BOUNDARY_BYTES >> shift

        # Every output is a register or a bit of one: the DMA's issue logic, the AXI burst
        # length and the next step all start from flip-flops (docs/fpga.md, "Timing"). What
        # a new row needs is kept ready: the next row's and the next plane's first byte.
        cur = Signal(bits)                   # current byte (unaligned at a row's start only)
        left = Signal(bits)                  # words of the row from the current one
        tail_count = Signal(range(self._word_bytes + 1))  # bytes of the row's last word
        to_boundary = Signal(range(boundary_words + 1))  # words to the next 4 KiB boundary
        burst = Signal(range(self._max_burst + 1))
        next_row = Signal(bits)              # first byte of the next row of this plane
        next_plane = Signal(bits)            # first byte of the next plane's first row
        plane_part = Signal.like(self.partition)
        # Rows left after this one in its plane, planes left after this one: counted down,
        # so that "another row?" is a test for zero, not a sum and a comparison.
        rows_after = Signal.like(self.n1)
        planes_after = Signal.like(self.n2)

        m.d.comb += [
            self.words_left.eq(left),
            self.address.eq((cur >> shift) << shift),
            self.word.eq(cur >> shift),
            self.first_lane.eq(cur[:shift] if shift else 0),
            self.burst_words.eq(burst),
        ]

        def bursts(words_left, words_to_boundary):
            """min(max_burst, words_left, words_to_boundary): the three comparisons side by
            side, then a choice, rather than one minimum after the other."""
            boundary_first = words_to_boundary < self._max_burst
            return Mux(boundary_first,
                       Mux(words_left < words_to_boundary, words_left, words_to_boundary),
                       Mux(words_left < self._max_burst, words_left, self._max_burst))

        # A row's words depend on its first lane only through one carry: from lane ``l``,
        # ``row_bytes`` cover ``(row_bytes - 1) // word_bytes + 1`` words, one more when
        # ``l + (row_bytes - 1) % word_bytes`` passes the word. Both counts are kept from the
        # walk's start, so a new row chooses between registers (its burst compares their
        # values clipped to a 4 KiB boundary's words, narrow) instead of adding its length.
        sizes = {}
        for key, shape in (("base", bits), ("carried", bits),
                           ("base_clipped", range(boundary_words + 1)),
                           ("carried_clipped", range(boundary_words + 1)),
                           ("end_lane", range(self._word_bytes))):
            sizes[key] = Signal(shape, name=f"row_{key}")

        def row_sizes(row_bytes):
            """The values of ``sizes`` for rows of ``row_bytes`` bytes (registered at the
            walk's start, for the rows after the first)."""
            last = row_bytes - 1
            base = Signal(bits, name="row_base_words")
            m.d.comb += base.eq((last >> shift) + 1)
            carried = base + 1
            return {"base": base, "carried": carried,
                    "base_clipped": Mux(base < boundary_words, base, boundary_words),
                    "carried_clipped": Mux(carried < boundary_words, carried,
                                           boundary_words),
                    "end_lane": last[:shift] if shift else 0}

        def row(address, partition, words, narrow_words, last_lane, one_word):
            """Registers of a row starting at byte ``address`` of ``words`` words (and the
            same, clipped or not, for its burst: :func:`bursts` gives the same for both),
            whose last byte is on lane ``last_lane`` (``one_word``: its only word); the 4 KiB
            boundary is ``boundary_words - address[shift:12]`` words away."""
            lane = address[:shift] if shift else 0
            row_to_boundary = Signal.like(to_boundary, name="row_to_boundary")
            m.d.comb += row_to_boundary.eq(boundary_words - address[shift:12])
            # A row of one word has all its bytes there; else they run to the end.
            lane_count = Mux(one_word, self.row_bytes, lanes + 1 - lane)
            return [cur.eq(address), left.eq(words), tail_count.eq(last_lane + 1),
                    self.lane_count.eq(lane_count),
                    to_boundary.eq(row_to_boundary),
                    burst.eq(bursts(narrow_words, row_to_boundary)),
                    self.row_partition.eq(partition)], lane_count

        def start_first_row(address, partition):
            """The walk's first row, from the pattern's inputs: ``(lane + row_bytes - 1) //
            word_bytes + 1`` words (the DMA checks every row lies in its space before the
            walk, so the sums do not wrap)."""
            lane = address[:shift] if shift else 0
            words = Signal(bits, name="first_row_words")
            last = Signal(bits, name="first_row_last")
            m.d.comb += [last.eq(lane + self.row_bytes - 1), words.eq((last >> shift) + 1)]
            return row(address, partition, words, words, last[:shift] if shift else 0,
                       (last >> shift) == 0)[0]

        def start_row(address, partition, size):
            """A row after the first, its words chosen from ``size`` (:func:`row_sizes`)."""
            lane = address[:shift] if shift else 0
            span = Signal(shift + 1, name="row_span")      # lane of the last byte, + carry
            m.d.comb += span.eq(lane + size["end_lane"])
            carry = span[shift] if shift else 0
            return row(address, partition, Mux(carry, size["carried"], size["base"]),
                       Mux(carry, size["carried_clipped"], size["base_clipped"]),
                       span[:shift] if shift else 0, ~carry & (size["base"] == 1))

        # Within a row: a step's words <= burst <= to_boundary, so the boundary is reached
        # exactly (and the next one is a whole 4 KiB away) or not at all. The registers
        # after a step of one word and after a step of a burst are both made from registers,
        # and ``step_burst`` only chooses (a DMA's choice comes from its descriptor's space,
        # ``step`` from a bus handshake: neither runs through the arithmetic).
        def stepped(words, name):
            left_after = Signal(bits, name=f"left_after_{name}")
            to_boundary_after = Signal.like(to_boundary, name=f"to_boundary_after_{name}")
            m.d.comb += [
                left_after.eq(left - words),
                to_boundary_after.eq(Mux(to_boundary == words, boundary_words,
                                         to_boundary - words)),
            ]
            return {"within": words < left,
                    "cur": ((cur >> shift) + words) << shift,
                    "left": left_after, "to_boundary": to_boundary_after,
                    "burst": bursts(left_after, to_boundary_after),
                    "lane_count": Mux(left_after == 1, tail_count, lanes + 1)}

        one, whole = stepped(1, "word"), stepped(burst, "burst")
        after = {key: Mux(self.step_burst, whole[key], one[key]) for key in one}
        next_row_start, next_row_lanes = start_row(next_row, self.row_partition + self.pstep1,
                                                   sizes)
        next_part = plane_part + self.pstep2
        next_plane_start, next_plane_lanes = start_row(next_plane, next_part, sizes)
        with m.If(after["within"]):
            m.d.comb += self.lane_count_after_step.eq(after["lane_count"])
        with m.Elif(rows_after != 0):
            m.d.comb += self.lane_count_after_step.eq(next_row_lanes)
        with m.Else():
            m.d.comb += self.lane_count_after_step.eq(next_plane_lanes)
        with m.If(self.load):
            m.d.sync += [self.active.eq(1), plane_part.eq(self.partition),
                         rows_after.eq(self.n1 - 1), planes_after.eq(self.n2 - 1),
                         next_row.eq(self.addr + self.stride1),
                         next_plane.eq(self.addr + self.stride2),
                         *start_first_row(self.addr, self.partition),
                         *(sizes[key].eq(value)
                           for key, value in row_sizes(self.row_bytes).items())]
        with m.Elif(self.step & self.active):
            with m.If(after["within"]):
                m.d.sync += [cur.eq(after["cur"]), left.eq(after["left"]),
                             to_boundary.eq(after["to_boundary"]), burst.eq(after["burst"]),
                             self.lane_count.eq(after["lane_count"])]
            with m.Elif(rows_after != 0):
                m.d.sync += [rows_after.eq(rows_after - 1), next_row.eq(next_row + self.stride1),
                             *next_row_start]
            with m.Elif(planes_after != 0):
                m.d.sync += [rows_after.eq(self.n1 - 1), planes_after.eq(planes_after - 1),
                             plane_part.eq(next_part),
                             next_row.eq(next_plane + self.stride1),
                             next_plane.eq(next_plane + self.stride2),
                             *next_plane_start]
            with m.Else():
                m.d.sync += self.active.eq(0)
        return m
