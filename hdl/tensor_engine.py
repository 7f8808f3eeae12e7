"""The tensor engine: a weight-stationary systolic array computing
``out[M, N] = stationary[K, M].T @ moving[K, N]`` (Trainium's ``nc_matmul`` semantics)."""

from amaranth import Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .processing_element import ProcessingElement

__all__ = ["TensorEngine", "formats", "stationary_layout", "moving_layout", "result_layout"]


def formats(config):
    """The tensor format names the array of ``config`` is built for, in code order; raises
    for a configuration the hardware cannot build (an MX format, or no int8)."""
    numerics.check_buildable(config, "the tensor engine hardware")
    return tuple(fmt.name for fmt in numerics.matmul_formats(config))


def _element_shape(config):
    formats(config)
    # Raw element bits: an int8 or FP8 code zero-extended, or a BF16 code.
    return unsigned(config.in_bits)


def stationary_layout(config):
    """One stationary beat: column ``m`` of the stationary tile, one element per array row
    (``stationary[:, m]``), as the SBUF delivers it (one element per partition): raw bits,
    ``in_bits`` wide, whatever the format (the format comes with each moving vector)."""
    return data.StructLayout({
        "data": data.ArrayLayout(_element_shape(config), config.pe_rows),
    })


def moving_layout(config):
    """One moving beat: column ``n`` of the moving tile, one element per array row (raw
    bits, ``in_bits`` wide), and the vector's ``format`` code (``numerics.DataFormat.code``),
    which decides how every PE multiplies and adds it (docs/numerics.md).

    ``swap`` marks the first vector of a matmul that uses the most recently loaded stationary
    tile (the engine holds it until that load has completed); without it the vector uses the
    tile already in use. ``last`` marks the final vector of a matmul and is passed through to
    the result beat.
    """
    return data.StructLayout({
        "data": data.ArrayLayout(_element_shape(config), config.pe_rows),
        "format": numerics.FORMAT_CODE_BITS,
        "swap": 1,
        "last": 1,
    })


def result_layout(config):
    """One result beat: column ``n`` of ``out``, all ``pe_cols`` values, de-skewed:
    ``acc_bits`` two's-complement sums for int8, FP32 codes for a float format."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(config.acc_bits), config.pe_cols),
        "last": 1,
    })


class TensorEngine(wiring.Component):
    """A ``pe_rows x pe_cols`` weight-stationary systolic array of
    :class:`~opentrn.hdl.processing_element.ProcessingElement` s built for the formats of
    ``config.dtypes``.

    Row ``k`` holds ``stationary[k, :]``; moving element ``moving[k, n]`` enters row ``k``
    skewed by ``k`` cycles and flows right; partial sums flow down; column ``m`` produces
    ``out[m, n]``, which is de-skewed so that one result beat carries all ``pe_cols`` values
    of one column ``n`` of ``out``. Each vector's format code travels with it (down the skew
    lines and along the rows, as its bank does): the stationary tile holds raw bits, so
    vectors of different formats may use one tile (the tensor unit allows only the format of
    the load; the array does not care).

    Timing (``K = pe_rows``, ``M = pe_cols``; see docs/performance.md):

    * a stationary load takes ``M`` beats, one column per cycle, into the idle weight bank;
    * a moving vector accepted in cycle ``c`` produces its result beat in cycle
      ``c + K + M - 1``, one vector per cycle;
    * a load into the bank just retired by a ``swap`` starts ``K`` cycles after that swap
      (the old tile's last vectors must have passed every row), so a stream of matmuls that
      each take a fresh tile issues one every ``max(N, K + M)`` cycles; matmuls that reuse
      a tile issue back to back.

    Back-pressure: when ``result.valid`` is high and ``result.ready`` low, the whole array
    stalls (its registers hold), so nothing is dropped or duplicated.

    Members
    -------
    stationary : ``In(stream.Signature(stationary_layout(config)))``
        Stationary tile columns, ``pe_cols`` beats per load.
    moving : ``In(stream.Signature(moving_layout(config)))``
        Moving vectors.
    result : ``Out(stream.Signature(result_layout(config)))``
        Columns of ``out``, in the order the moving vectors were accepted.
    """

    def __init__(self, *, config):
        try:
            self._formats = formats(config)
        except ValueError:
            self._MustUse__silence = True     # refused, so it is not an unused elaboratable
            raise
        self._config = config
        super().__init__({
            "stationary": In(stream.Signature(stationary_layout(config))),
            "moving": In(stream.Signature(moving_layout(config))),
            "result": Out(stream.Signature(result_layout(config))),
        })

    def elaborate(self, platform):
        cfg = self._config
        rows, cols = cfg.pe_rows, cfg.pe_cols
        m = Module()

        # The array advances as one; it stalls only while a result waits for the sink.
        advance = Signal()
        m.d.comb += advance.eq(~self.result.valid | self.result.ready)

        # -- weight banks: the active one feeds matmuls, the other one takes loads ----------
        load_bank = Signal()            # bank that loads write; the active bank is ~load_bank
        active_valid = Signal()         # a tile has been swapped in at least once
        pending = Signal()              # a complete tile waits in load_bank for a swap
        guard = Signal(range(rows))     # advances to wait before load_bank may be written
        load_column = Signal(range(cols))

        load = self.stationary.valid & self.stationary.ready
        m.d.comb += self.stationary.ready.eq(advance & ~pending & (guard == 0))
        with m.If(load):
            m.d.sync += load_column.eq(load_column + 1)
            with m.If(load_column == cols - 1):
                m.d.sync += [load_column.eq(0), pending.eq(1)]

        swap = self.moving.payload.swap
        m.d.comb += self.moving.ready.eq(advance & ((swap & pending) | (~swap & active_valid)))
        take = self.moving.valid & self.moving.ready
        vector_bank = Signal()
        m.d.comb += vector_bank.eq(~load_bank ^ swap)
        with m.If(take & swap):
            # The old active bank becomes the load bank. Its last vector entered row 0 in
            # the previous cycle at the latest and uses column c of row K-1 K-1+c cycles
            # later; holding the next load back until K cycles after this one keeps every
            # column write behind that vector (guard counts K-1 advances, then ready).
            m.d.sync += [
                load_bank.eq(~load_bank),
                pending.eq(0),
                active_valid.eq(1),
                guard.eq(rows - 1),
            ]
        with m.Elif(advance & (guard != 0)):
            m.d.sync += guard.eq(guard - 1)

        # -- the array ---------------------------------------------------------------------
        pes = [[ProcessingElement(in_bits=cfg.in_bits, acc_bits=cfg.acc_bits,
                                  formats=self._formats)
                for _ in range(cols)] for _ in range(rows)]
        for row in range(rows):
            for col in range(cols):
                m.submodules[f"pe_{row}_{col}"] = pes[row][col]

        for row in range(rows):
            # Skew: row k sees a vector k cycles after row 0, in step with the partial sums
            # coming down from the rows above.
            x, bank, fmt = self.moving.payload.data[row], vector_bank, self.moving.payload.format
            for stage in range(row):
                x_reg = Signal(unsigned(cfg.in_bits), name=f"skew_x_{row}_{stage}")
                bank_reg = Signal(name=f"skew_bank_{row}_{stage}")
                fmt_reg = Signal(numerics.FORMAT_CODE_BITS, name=f"skew_format_{row}_{stage}")
                with m.If(advance):
                    m.d.sync += [x_reg.eq(x), bank_reg.eq(bank), fmt_reg.eq(fmt)]
                x, bank, fmt = x_reg, bank_reg, fmt_reg
            for col in range(cols):
                pe = pes[row][col]
                left = pes[row][col - 1] if col else None
                m.d.comb += [
                    pe.enable.eq(advance),
                    pe.x_in.eq(left.x_out if left else x),
                    pe.bank_in.eq(left.bank_out if left else bank),
                    pe.format_in.eq(left.format_out if left else fmt),
                    pe.psum_in.eq(pes[row - 1][col].psum_out if row else 0),
                    pe.weight_we.eq(load & (load_column == col)),
                    pe.weight_bank.eq(load_bank),
                    pe.weight_data.eq(self.stationary.payload.data[row]),
                ]

        # -- de-skew and result ------------------------------------------------------------
        # Column m leaves the array m cycles after column 0; delay it by M-1-m more.
        for col in range(cols):
            value = pes[rows - 1][col].psum_out
            for stage in range(cols - 1 - col):
                value_reg = Signal(signed(cfg.acc_bits), name=f"deskew_{col}_{stage}")
                with m.If(advance):
                    m.d.sync += value_reg.eq(value)
                value = value_reg
            m.d.comb += self.result.payload.data[col].eq(value)

        # valid and last travel with the vector: K + M - 1 stages to the result.
        depth = rows + cols - 1
        in_flight = Signal(depth)
        last = Signal(depth)
        with m.If(advance):
            m.d.sync += [
                in_flight.eq((in_flight << 1) | take),
                last.eq((last << 1) | (take & self.moving.payload.last)),
            ]
        m.d.comb += [
            self.result.valid.eq(in_flight[depth - 1]),
            self.result.payload.last.eq(last[depth - 1]),
        ]
        return m
