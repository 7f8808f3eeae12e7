"""One partition's slice of a tensor-unit column reader: the SBUF vector words it holds and
the column it presents."""

from amaranth import Module, Mux, Signal
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
    offsets), so a column never crosses a word.

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
    """

    def __init__(self, *, word_bytes, words, sizes, element_bits):
        with refusing(self):
            check_positive(words=words, sizes=sizes, element_bits=element_bits)
            check_power_of_two(word_bytes=word_bytes)
            if (1 << (sizes - 1)) > word_bytes or 8 << (sizes - 1) > element_bits:
                raise ValueError(f"sizes={sizes}: a column of 2**{sizes - 1} bytes must fit "
                                 f"word_bytes={word_bytes} and element_bits={element_bits}")
        self._word_bytes, self._words = word_bytes, words
        self._sizes, self._element_bits = sizes, element_bits
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (word_bytes, words, sizes, element_bits)
        members = {
            "fill": In(1), "fill_at": In(range(words)), "fill_data": In(8 * word_bytes),
            "drain_at": In(range(words)), "lane": In(exact_log2(word_bytes)),
            "column": Out(element_bits),
        }
        if sizes > 1:               # no port of 0 bits: Verilog has no such thing
            members["size"] = In(range(sizes))
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
        head = Signal(8 * self._word_bytes)
        with m.Switch(self.drain_at):
            for index, slot in enumerate(slots):
                with m.Case(index):
                    m.d.comb += head.eq(slot)
        column = None
        for log2 in reversed(range(self._sizes)):
            bits = 8 << log2
            # The column index within the word: the lane's bits above the column's size.
            piece = head if bits == len(head) else head.word_select(self.lane[log2:], bits)
            column = piece if column is None else Mux(self.size == log2, piece, column)
        m.d.comb += self.column.eq(column)
        return m
