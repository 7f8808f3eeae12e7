"""A block of the systolic array: ``rows x cols`` processing elements, built as two blocks of
half the size, down to single processing elements."""

from amaranth import Module, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from opentrn import numerics

from .hierarchy import shared
from .processing_element import ProcessingElement

__all__ = ["ProcessingElementArray"]



def _is_pow2(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 \
        and value & (value - 1) == 0


class ProcessingElementArray(wiring.Component):
    """``rows x cols`` :class:`~opentrn.hdl.processing_element.ProcessingElement` s: moving
    elements enter the left column (one per row, with its bank, format and, in an MX build,
    scale) and move one PE to the right per advance; partial sums enter the top row and each
    PE sends its multiply-accumulate down.

    A block of more than one row is two blocks of half the rows, ``upper`` above ``lower``;
    a block of one row and more columns is two blocks of half the columns, ``left`` and
    ``right``; a block of one PE is that PE. So the PE of row ``k`` and column ``m`` is
    reached by ``upper``/``lower`` for the bits of ``k`` (most significant first), then
    ``left``/``right`` for the bits of ``m``. Both halves are one block and every block is
    shared (:mod:`opentrn.hdl.hierarchy`): the Verilog of a ``K x M`` array is
    ``log2(K) + log2(M)`` small array modules and one PE module, whatever ``K`` and ``M``,
    and it is generated in about the same time at every size. Like the PE it holds no reset.

    The members are flat buses, one field per row (or column): field ``i`` of a member of
    ``w`` bits per row is bits ``[i * w, (i + 1) * w)`` (flat, so that a block's Verilog has
    one wire per member, not one per row).

    Constructor arguments as the PE's (``banks`` weight banks), plus ``rows`` and ``cols``
    (powers of two) and ``write_columns``, the columns one weight write fills (1 or 2, at
    most ``cols``).

    Members
    -------
    enable : ``In(1)``
        Advance every PE's registers this cycle.
    x_in : ``In(unsigned(rows * in_bits))``
        The moving element entering each row (raw bits).
    bank_in : ``In(unsigned(rows * log2(banks)))``; format_in : ``In(unsigned(rows *
    numerics.FORMAT_CODE_BITS))``
        Each entering element's weight bank and format code.
    x_out, bank_out, format_out : ``Out(...)``
        The same, leaving the right column.
    psum_in : ``In(unsigned(cols * acc_bits))``
        The partial sums entering the top row, one per column (``acc_bits`` two's
        complement, or FP32 codes).
    psum_out : ``Out(unsigned(cols * acc_bits))``
        The bottom row's multiply-accumulates, registered.
    weight_we : ``In(rows)``
        Bit ``k``: write row ``k``'s field of ``weight_data`` (and ``weight_scale``) into
        bank ``weight_bank[k]`` of row ``k``'s PEs in the ``write_columns`` columns from
        ``weight_column[k] * write_columns`` this cycle. Each row has its own write, so a
        load can be skewed row by row (the tensor engine with ``fast_weight_load``) or
        written to every row at once.
    weight_bank : ``In(unsigned(rows * log2(banks)))``
    weight_column : ``In(unsigned(rows * log2(cols / write_columns)))`` (only with
    ``cols > write_columns``)
        Each row's group of columns to write (its most significant bit picks ``right``).
    weight_data : ``In(unsigned(rows * write_columns * in_bits))``
        Each row's elements of the ``write_columns`` stationary columns being loaded, the
        first column lowest.

    With an MX format (only then):

    x_scale_in, x_scale_out : ``In/Out(unsigned(rows * 8))``
        E8M0 scale of each row's element, travelling with it.
    weight_scale : ``In(unsigned(rows * write_columns * 8))``
        E8M0 scale of each row's ``weight_data`` elements.
    """

    def __init__(self, *, rows, cols, in_bits, acc_bits, formats, macs=None,
                 multiply_stages=0, add_stages=0, banks=2, write_columns=1):
        for name, value in (("rows", rows), ("cols", cols)):
            if not _is_pow2(value):
                self._MustUse__silence = True  # refused, so it is not an unused elaboratable
                raise ValueError(f"{name}={value!r}: must be a power of two")
        if write_columns not in (1, 2) or write_columns > cols:
            self._MustUse__silence = True
            raise ValueError(f"write_columns={write_columns!r}: must be 1 or 2, at most "
                             f"cols={cols}")
        self._rows, self._cols, self._write_columns = rows, cols, write_columns
        self._pe_args = dict(in_bits=in_bits, acc_bits=acc_bits, formats=formats, macs=macs,
                             multiply_stages=multiply_stages, add_stages=add_stages,
                             banks=banks)
        try:
            # Checks the PE's arguments (a refused PE raises here).
            probe = ProcessingElement(**self._pe_args)
        except (TypeError, ValueError):
            self._MustUse__silence = True
            raise
        probe._MustUse__silence = True
        self._mx = "x_scale_in" in probe.signature.members
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (rows, cols, write_columns, *probe.shared_key)
        self._bank_bits = ceil_log2(banks)
        #: Bits per row of each member that has one field per row.
        self._row_bits = {"x": in_bits, "bank": self._bank_bits,
                          "format": numerics.FORMAT_CODE_BITS}
        if self._mx:
            self._row_bits["x_scale"] = numerics.E8M0_BITS
        members = {"enable": In(1)}
        for name, bits in self._row_bits.items():
            members[f"{name}_in"] = In(unsigned(rows * bits))
            members[f"{name}_out"] = Out(unsigned(rows * bits))
        members.update({
            "psum_in": In(unsigned(cols * acc_bits)),
            "psum_out": Out(unsigned(cols * acc_bits)),
            "weight_we": In(rows),
            "weight_bank": In(unsigned(rows * self._bank_bits)),
            "weight_data": In(unsigned(rows * write_columns * in_bits)),
        })
        if cols > write_columns:    # no port of 0 bits: Verilog has no such thing
            members["weight_column"] = In(unsigned(rows * exact_log2(cols // write_columns)))
        if self._mx:
            members["weight_scale"] = In(unsigned(rows * write_columns * numerics.E8M0_BITS))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        rows, cols, writes = self._rows, self._cols, self._write_columns
        split_rows = rows > 1
        half = dict(rows=rows // 2 if split_rows else 1, cols=cols if split_rows else cols // 2)
        # A row of exactly one write's columns splits the write between its halves.
        split_write = not split_rows and cols == writes
        part_writes = writes // 2 if split_write else writes
        parts = []
        for name in ("upper", "lower") if split_rows else ("left", "right"):
            if half["rows"] == half["cols"] == 1:
                part = ProcessingElement(**self._pe_args)
            else:
                part = ProcessingElementArray(**half, **self._pe_args,
                                              write_columns=part_writes)
            m.submodules[name] = shared(part)
            parts.append(part)
        first, second = parts

        def field(value, index, bits):
            """Half ``index`` (0 or 1) of a bus of two halves of ``bits`` bits."""
            return value[index * bits:(index + 1) * bits]

        acc_bits = self._pe_args["acc_bits"]
        psum_bits = half["cols"] * acc_bits
        in_bits = self._pe_args["in_bits"]
        scale_bits = numerics.E8M0_BITS
        m.d.comb += [part.enable.eq(self.enable) for part in parts]
        column_bits = exact_log2(cols // writes)
        part_column_bits = exact_log2(half["cols"] // part_writes)
        if split_rows:
            # Each half has its own rows: per-row members split; the partial sums go
            # through the upper half into the lower one.
            for index, part in enumerate(parts):
                for name, bits in self._row_bits.items():
                    size = half["rows"] * bits
                    m.d.comb += [
                        getattr(part, f"{name}_in").eq(field(getattr(self, f"{name}_in"),
                                                             index, size)),
                        field(getattr(self, f"{name}_out"), index, size).eq(
                            getattr(part, f"{name}_out")),
                    ]
                m.d.comb += [
                    part.weight_data.eq(field(self.weight_data, index,
                                              half["rows"] * writes * in_bits)),
                    part.weight_we.eq(field(self.weight_we, index, half["rows"])),
                    part.weight_bank.eq(field(self.weight_bank, index,
                                              half["rows"] * self._bank_bits)),
                ]
                if column_bits:
                    m.d.comb += part.weight_column.eq(
                        field(self.weight_column, index, half["rows"] * column_bits))
                if self._mx:
                    m.d.comb += part.weight_scale.eq(
                        field(self.weight_scale, index, half["rows"] * writes * scale_bits))
            m.d.comb += [first.psum_in.eq(self.psum_in), second.psum_in.eq(first.psum_out),
                         self.psum_out.eq(second.psum_out)]
        else:
            # Each half has its own columns: the row's elements go through the left half
            # into the right one.
            for name in self._row_bits:
                m.d.comb += [
                    getattr(first, f"{name}_in").eq(getattr(self, f"{name}_in")),
                    getattr(second, f"{name}_in").eq(getattr(first, f"{name}_out")),
                    getattr(self, f"{name}_out").eq(getattr(second, f"{name}_out")),
                ]
            for index, part in enumerate(parts):
                m.d.comb += [
                    part.psum_in.eq(field(self.psum_in, index, psum_bits)),
                    field(self.psum_out, index, psum_bits).eq(part.psum_out),
                    part.weight_bank.eq(self.weight_bank),
                ]
                if split_write:
                    # Both halves write: each takes its own column of the write.
                    m.d.comb += [
                        part.weight_we.eq(self.weight_we),
                        part.weight_data.eq(field(self.weight_data, index,
                                                  part_writes * in_bits)),
                    ]
                    if self._mx:
                        m.d.comb += part.weight_scale.eq(
                            field(self.weight_scale, index, part_writes * scale_bits))
                    continue
                # The column group's most significant bit picks the half that writes.
                right = self.weight_column[column_bits - 1]
                m.d.comb += [
                    part.weight_we.eq(self.weight_we & (right if index else ~right)),
                    part.weight_data.eq(self.weight_data),
                ]
                if part_column_bits:
                    m.d.comb += part.weight_column.eq(self.weight_column[:part_column_bits])
                if self._mx:
                    m.d.comb += part.weight_scale.eq(self.weight_scale)
        return m
