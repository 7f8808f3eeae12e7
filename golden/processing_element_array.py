"""Golden model of :mod:`opentrn.hdl.processing_element_array`: the registers of a block of
processing elements, clocked one cycle at a time (each PE as
:func:`~opentrn.golden.processing_element.mac_packed`)."""

import numpy as np

from opentrn import numerics

from .processing_element import mac_packed

__all__ = ["ProcessingElementArray"]


class ProcessingElementArray:
    """``rows x cols`` PEs of ``banks`` weight banks built for ``formats`` (``macs``: MACs
    per cycle of a format, default 1), a weight write filling ``write_columns`` columns.
    :meth:`outputs` are the block's registered outputs; :meth:`clock` applies one
    clock edge for the inputs of that cycle, as the hardware does: each PE takes the element
    registered by its left neighbour (or the row's input) and the partial sum registered by
    the PE above (or the column's input); registers advance with ``enable``; weights are
    written whatever ``enable``."""

    def __init__(self, *, rows, cols, formats, macs=None, acc_bits=32, banks=2,
                 write_columns=1):
        self.rows, self.cols, self.acc_bits = rows, cols, acc_bits
        self.write_columns = write_columns
        self.rates = {name: (macs or {}).get(name, 1) for name in formats}
        self.formats = formats
        shape = (rows, cols)
        self.weights = np.zeros((banks, *shape), np.int64)
        self.weight_scales = np.zeros((banks, *shape), np.int64)
        self.x = np.zeros(shape, np.int64)
        self.bank = np.zeros(shape, np.int64)
        self.format = np.zeros(shape, np.int64)
        self.x_scale = np.zeros(shape, np.int64)
        self.psum = np.zeros(shape, np.int64)

    def _format(self, code):
        """The format a PE computes for the code ``code``: its own, if built; a code the
        block lacks (the ISA never sends one, the array's reset state has 0) is int8 in a
        block without float formats, and otherwise passes the partial sum on unchanged
        (``None``), as the hardware's float lanes do when none is active."""
        name = numerics.format_of_code(code).name if code < 8 else None
        if name in self.formats:
            return name
        if all(numerics.data_format(f).element is None for f in self.formats):
            return "int8"
        return None

    def outputs(self):
        """The right column's element, bank, format and scale per row, the bottom row's
        partial sums per column (as unsigned ``acc_bits`` codes)."""
        mask = (1 << self.acc_bits) - 1
        return {"x_out": self.x[:, -1].copy(), "bank_out": self.bank[:, -1].copy(),
                "format_out": self.format[:, -1].copy(),
                "x_scale_out": self.x_scale[:, -1].copy(),
                "psum_out": self.psum[-1, :] & mask}

    def clock(self, *, enable, x_in, bank_in, format_in, psum_in, weight_we, weight_bank,
              weight_data, weight_column=None, x_scale_in=None, weight_scale=None):
        """One edge. Per-row inputs are sequences of ``rows`` values, per-column ones of
        ``cols``; the weight write is per row: row ``k`` writes ``weight_data[k]`` (and
        ``weight_scale[k]``; with ``write_columns`` 2, pairs of values, the first column's
        first) into bank ``weight_bank[k]`` of the columns from ``weight_column[k] *
        write_columns`` (``weight_column`` 0 without it) when ``weight_we[k]``."""
        rows, cols = self.rows, self.cols
        weight_column = [0] * rows if weight_column is None else weight_column
        x_scale_in = [0] * rows if x_scale_in is None else x_scale_in
        weight_scale = [0] * rows if weight_scale is None else weight_scale
        # What each PE sees this cycle: its left neighbour's registers (or the row input).
        left = {name: np.concatenate([np.asarray(row_in, np.int64).reshape(rows, 1),
                                      register[:, :-1]], axis=1)
                for name, row_in, register in (("x", x_in, self.x), ("bank", bank_in, self.bank),
                                               ("format", format_in, self.format),
                                               ("x_scale", x_scale_in, self.x_scale))}
        up = np.concatenate([np.asarray(psum_in, np.int64).reshape(1, cols),
                             self.psum[:-1]], axis=0)
        if enable:
            psum = np.zeros_like(self.psum)
            for r in range(rows):
                for c in range(cols):
                    name = self._format(int(left["format"][r, c]))
                    if name is None:
                        psum[r, c] = up[r, c]
                        continue
                    # A bank number past the last (never sent) reads the last bank.
                    bank = min(int(left["bank"][r, c]), len(self.weights) - 1)
                    scales = {}
                    if numerics.data_format(name).mx:
                        scales = {"scale_weight": int(self.weight_scales[bank, r, c]),
                                  "scale_x": int(left["x_scale"][r, c])}
                    psum[r, c] = mac_packed(int(up[r, c]), int(left["x"][r, c]),
                                            int(self.weights[bank, r, c]), name,
                                            macs=self.rates[name], acc_bits=self.acc_bits,
                                            **scales)
            self.x, self.bank, self.format, self.x_scale = (
                left["x"], left["bank"], left["format"], left["x_scale"])
            self.psum = psum
        writes = self.write_columns
        for r in range(rows):
            if weight_we[r]:
                data = np.broadcast_to(weight_data[r], writes)
                scale = np.broadcast_to(weight_scale[r], writes)
                for j in range(writes):
                    column = weight_column[r] * writes + j
                    self.weights[weight_bank[r], r, column] = data[j]
                    self.weight_scales[weight_bank[r], r, column] = scale[j]
