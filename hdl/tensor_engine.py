"""The tensor engine: a weight-stationary systolic array computing
``out[M, N] = stationary[K, M].T @ moving[K, N]`` (Trainium's ``nc_matmul`` semantics)."""

from amaranth import Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics
from opentrn.numerics import mx_blocks  # the layouts have a scale field when it is > 0

from .processing_element import ProcessingElement

__all__ = ["TensorEngine", "formats", "mx_blocks", "stationary_layout", "moving_layout",
           "result_layout"]

#: Bits of an E8M0 scale code (the MX formats).
_SCALE_BITS = 8


def formats(config):
    """The tensor format names the array of ``config`` is built for, in code order; raises
    for a configuration the hardware cannot build (no int8)."""
    numerics.check_buildable(config, "the tensor engine hardware")
    return tuple(fmt.name for fmt in numerics.matmul_formats(config))


def _scale_fields(config):
    blocks = mx_blocks(config)
    return {"scale": data.ArrayLayout(unsigned(_SCALE_BITS), blocks)} if blocks else {}


def _element_shape(config):
    formats(config)
    # Raw element bits: an int8 or FP8 code zero-extended, or a BF16 code.
    return unsigned(config.in_bits)


def stationary_layout(config):
    """One stationary beat: column ``m`` of the stationary tile, one element per array row
    (``stationary[:, m]``), as the SBUF delivers it (one element per partition): raw bits,
    ``in_bits`` wide, whatever the format (the format comes with each moving vector).

    In a build with an MX format (:func:`mx_blocks` ``> 0``) also ``scale``: column ``m``'s
    E8M0 scale code of each block of ``numerics.MX_BLOCK`` rows; row ``k``'s weight is
    stored with ``scale[k // MX_BLOCK]``. Vectors of an MX format use the stored scales,
    the others ignore them (so a tile of another format may carry anything there)."""
    return data.StructLayout({
        "data": data.ArrayLayout(_element_shape(config), config.pe_rows),
        **_scale_fields(config),
    })


def moving_layout(config):
    """One moving beat: column ``n`` of the moving tile, one element per array row (raw
    bits, ``in_bits`` wide), and the vector's ``format`` code (``numerics.DataFormat.code``),
    which decides how every PE multiplies and adds it (docs/numerics.md).

    In a build with an MX format (:func:`mx_blocks` ``> 0``) also ``scale``: the vector's
    E8M0 scale code of each block of ``numerics.MX_BLOCK`` rows; row ``k``'s element is
    multiplied with ``scale[k // MX_BLOCK]`` (skewed with it: row ``k`` sees it ``k`` cycles
    after the vector was accepted). A vector of another format ignores it.

    ``swap`` marks the first vector of a matmul that uses the most recently loaded stationary
    tile (the engine holds it until that load has completed); without it the vector uses the
    tile already in use. ``last`` marks the final vector of a matmul and is passed through to
    the result beat.
    """
    return data.StructLayout({
        "data": data.ArrayLayout(_element_shape(config), config.pe_rows),
        "format": numerics.FORMAT_CODE_BITS,
        **_scale_fields(config),
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

    MX formats (a build with one has :func:`mx_blocks` blocks of ``numerics.MX_BLOCK``
    rows): every stationary beat carries column ``m``'s E8M0 scale per block, stored in each
    PE of the column next to its weight (row ``k`` takes block ``k // MX_BLOCK``'s, in the
    same bank). Every moving vector carries its scale per block; it is skewed with the
    elements, by one register chain per block (as long as the block's last row's delay,
    each row of the block tapping it at its own delay), and flows right along the row with
    the element. Each PE multiplies an MX element by its weight scaled by
    ``2**(sw + sx - 254)`` (docs/numerics.md); vectors of other formats ignore the scales.

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
        Stationary tile columns (and, with an MX format, their scales), ``pe_cols`` beats
        per load.
    moving : ``In(stream.Signature(moving_layout(config)))``
        Moving vectors (and, with an MX format, their scales).
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

        # Skew: row k sees a vector k cycles after row 0, in step with the partial sums coming
        # down from the rows above. Registers that advance with the array: delay lines whose
        # taps are the value 0, 1, 2, ... advances ago.
        skew = []

        def delay_line(value, length, name):
            taps = [value]
            for stage in range(length):
                reg = Signal.like(taps[-1], name=f"{name}_{stage}")
                skew.append(reg.eq(taps[-1]))
                taps.append(reg)
            return taps

        # The bank and format of a vector are the same in every row: one line for all rows,
        # row k taps it after k registers.
        bank_taps = delay_line(vector_bank, rows - 1, "skew_bank")
        format_taps = delay_line(self.moving.payload.format, rows - 1, "skew_format")
        # The moving scales: one line per block, as long as the delay of the block's last
        # row; row k of block b taps it after k registers (the earlier taps are unused).
        blocks = mx_blocks(cfg)
        scale_taps = []
        for block in range(blocks):
            first = block * numerics.MX_BLOCK
            last_row = min(first + numerics.MX_BLOCK, rows) - 1
            taps = delay_line(self.moving.payload.scale[block], last_row, f"skew_scale_{block}")
            scale_taps += taps[first:last_row + 1]
        assert len(scale_taps) == (rows if blocks else 0)

        for row in range(rows):
            # The elements: one line per row.
            x = delay_line(self.moving.payload.data[row], row, f"skew_x_{row}")[row]
            bank, fmt = bank_taps[row], format_taps[row]
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
                if blocks:
                    m.d.comb += [
                        pe.x_scale_in.eq(left.x_scale_out if left else scale_taps[row]),
                        pe.weight_scale.eq(
                            self.stationary.payload.scale[row // numerics.MX_BLOCK]),
                    ]

        with m.If(advance):
            m.d.sync += skew

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
