"""One partition's slice of a tensor-unit column reader: the SBUF vector words it holds and
the column it presents."""

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .params import check_positive, check_power_of_two, refusing

__all__ = ["ColumnBuffer"]


class ColumnBuffer(wiring.Component):
    """A buffer of ``words`` words of ``word_bytes`` bytes (one partition's part of the
    vector words a :class:`~opentrn.hdl.tensor_unit.TensorUnit` column reader holds) and
    the column it presents.

    A ``fill`` in cycle ``t`` writes ``fill_data`` into slot ``fill_at`` (readable from
    ``t + 1``). ``column`` is, combinationally, the ``2 ** size`` bytes of slot
    ``drain_at`` from byte ``lane`` on, little-endian, zero-extended to ``element_bits``.
    ``lane`` must be a multiple of ``2 ** size`` (the tensor unit refuses misaligned
    offsets), so a column never crosses a word. With ``columns = 2`` it also presents
    ``column_next``, the column after it: from byte ``lane + 2 ** size`` of the same slot,
    or from byte 0 of the next slot (``drain_at + 1``, wrapping) when the first column ends
    the word.

    Every partition of a reader is this one block (:mod:`opentrn.hdl.hierarchy`), so the
    Verilog and the elaboration of a reader do not grow with the partitions. It holds data
    only (no reset): the reader's counters say which slots are valid.

    Members
    -------
    fill : ``In(1)``; fill_at : ``In(range(words))``; fill_data : ``In(8 * word_bytes)``
    drain_at : ``In(range(words))``; lane : ``In(log2(word_bytes))``;
    size : ``In(range(sizes))``: log2 of the column's bytes, below ``sizes`` (only with
        ``sizes > 1``; else columns are one byte)
    column : ``Out(element_bits)``
    column_next : ``Out(element_bits)`` (only with ``columns = 2``)
    """

    def __init__(self, *, word_bytes, words, sizes, element_bits, columns=1):
        with refusing(self):
            check_positive(words=words, sizes=sizes, element_bits=element_bits)
            if columns not in (1, 2) or columns > words:
                raise ValueError(f"columns={columns!r}: must be 1 or 2, at most "
                                 f"words={words}")
            check_power_of_two(word_bytes=word_bytes)
            if (1 << (sizes - 1)) > word_bytes or 8 << (sizes - 1) > element_bits:
                raise ValueError(f"sizes={sizes}: a column of 2**{sizes - 1} bytes must fit "
                                 f"word_bytes={word_bytes} and element_bits={element_bits}")
        self._word_bytes, self._words = word_bytes, words
        self._sizes, self._element_bits, self._columns = sizes, element_bits, columns
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (word_bytes, words, sizes, element_bits, columns)
        members = {
            "fill": In(1), "fill_at": In(range(words)), "fill_data": In(8 * word_bytes),
            "drain_at": In(range(words)), "lane": In(exact_log2(word_bytes)),
            "column": Out(element_bits),
        }
        if sizes > 1:               # no port of 0 bits: Verilog has no such thing
            members["size"] = In(range(sizes))
        if columns == 2:
            members["column_next"] = Out(element_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        slots = [Signal(8 * self._word_bytes, name=f"slot_{i}", reset_less=True)
                 for i in range(self._words)]
        with m.If(self.fill):
            with m.Switch(self.fill_at):
                for index, slot in enumerate(slots):
                    with m.Case(index):
                        m.d.sync += slot.eq(self.fill_data)

        def slot_at(index, name):
            value = Signal(8 * self._word_bytes, name=name)
            with m.Switch(index):
                for position, slot in enumerate(slots):
                    with m.Case(position):
                        m.d.comb += value.eq(slot)
            return value

        def extract(word, lane):
            column = None
            for log2 in reversed(range(self._sizes)):
                bits = 8 << log2
                # The column index within the word: the lane's bits above the column's size.
                piece = word if bits == len(word) else word.word_select(lane[log2:], bits)
                column = piece if column is None else Mux(self.size == log2, piece, column)
            return column

        head = slot_at(self.drain_at, "head")
        m.d.comb += self.column.eq(extract(head, self.lane))
        if self._columns == 2:
            words = self._words
            after = Mux(self.drain_at == words - 1, 0, self.drain_at + 1)
            lane_next = Signal.like(self.lane)
            size = self.size if self._sizes > 1 else 0
            m.d.comb += lane_next.eq(self.lane + (Const(1) << size))   # wraps in the word
            # lane_next wraps to 0 exactly when the first column ends the word.
            word = Mux(lane_next == 0, slot_at(after, "head_next"), head)
            m.d.comb += self.column_next.eq(extract(word, lane_next))
        return m
