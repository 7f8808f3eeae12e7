"""The tensor engine: a weight-stationary systolic array computing
``out[M, N] = stationary[K, M].T @ moving[K, N]`` (Trainium's ``nc_matmul`` semantics)."""

from amaranth import Cat, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from opentrn import numerics
from opentrn.numerics import mx_block_rows, mx_blocks  # scale fields when mx_blocks > 0

from .delay_line import DelayLine
from .hierarchy import shared
from .params import refusing
from .processing_element_array import ProcessingElementArray

__all__ = ["TensorEngine", "formats", "latency", "mx_blocks", "mx_block_rows",
           "stationary_layout", "moving_layout", "result_layout"]



def latency(config):
    """Cycles from a moving vector's acceptance to its result beat: ``K (1 + A) + M - 1 +
    S + I`` (``A = pe_add_stages``, the rows' skew less one; ``S = pe_multiply_stages``;
    ``I = pe_input_stages``)."""
    return (config.pe_rows * (1 + config.pe_add_stages) + config.pe_cols - 1
            + config.pe_multiply_stages + config.pe_input_stages)


def formats(config):
    """The tensor format names the array of ``config`` is built for, in code order; raises
    for a configuration the hardware cannot build (no int8)."""
    numerics.check_buildable(config, "the tensor engine hardware")
    return tuple(fmt.name for fmt in numerics.matmul_formats(config))


def _scale_fields(config):
    blocks = mx_blocks(config)
    return {"scale": data.ArrayLayout(unsigned(numerics.E8M0_BITS), blocks)} if blocks else {}


def _element_shape(config):
    formats(config)
    # Raw element bits: an int8 or FP8 code zero-extended, or a BF16 code.
    return unsigned(config.in_bits)


def stationary_layout(config):
    """One stationary beat: ``c = config.load_columns`` columns of the stationary tile (1,
    or 2 with ``fast_weight_load = 2``), one element per array row each, as the SBUF
    delivers them (one element per partition): raw bits, ``in_bits`` wide, whatever the
    format (the format comes with each moving vector).
    ``data[j * K + k]`` is row ``k`` of the beat's column ``j`` (``stationary[k, c * b + j]``
    for beat ``b``).

    In a build with an MX format (:func:`mx_blocks` ``> 0``) also ``scale``: each column's
    E8M0 scale code of each block of ``numerics.MX_BLOCK`` rows (``scale[j * blocks + i]``:
    column ``j``, block ``i``); row ``k``'s weight is stored with its block's. Vectors of an
    MX format use the stored scales, the others ignore them (so a tile of another format
    may carry anything there)."""
    columns = config.load_columns
    blocks = mx_blocks(config)
    scale = {"scale": data.ArrayLayout(unsigned(numerics.E8M0_BITS), columns * blocks)} \
        if blocks else {}
    return data.StructLayout({
        "data": data.ArrayLayout(_element_shape(config), columns * config.pe_rows),
        **scale,
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
    skewed by ``k (1 + A)`` cycles (``A = config.pe_add_stages``, the registers in each PE's
    adder, which hold a partial sum ``A`` cycles more on its way down) and flows right;
    partial sums flow down; column ``m`` produces ``out[m, n]``, which is de-skewed so that
    one result beat carries all ``pe_cols`` values of one column ``n`` of ``out``. Each
    vector's format code travels with it (down the skew lines and along the rows, as its
    bank does): the stationary tile holds raw bits, so vectors of different formats may use
    one tile (the tensor unit allows only the format of the load; the array does not care).

    MX formats (a build with one has :func:`mx_blocks` blocks of ``numerics.MX_BLOCK``
    rows): every stationary beat carries column ``m``'s E8M0 scale per block, stored in each
    PE of the column next to its weight (row ``k`` takes block ``k // MX_BLOCK``'s, in the
    same bank). Every moving vector carries its scale per block; it is skewed with the
    elements, by one register chain per block (as long as the block's last row's delay,
    each row of the block tapping it at its own delay), and flows right along the row with
    the element. Each PE multiplies an MX element by its weight scaled by
    ``2**(sw + sx - 254)`` (docs/numerics.md); vectors of other formats ignore the scales.

    Timing (``K = pe_rows``, ``M = pe_cols``; see docs/performance.md):

    * a stationary load takes ``M / c`` beats (``c = config.load_columns`` columns each: 1,
      or 2 with ``fast_weight_load = 2``), one per cycle, into a bank no tile in use holds;
    * a moving vector accepted in cycle ``c`` produces its result beat in cycle
      ``c + K (1 + A) + M - 1 + S + I`` (``S = config.pe_multiply_stages``, registers
      between the PEs' multipliers and adders; ``I = config.pe_input_stages``, registers in
      front of the array that every row's vectors pass, and with the fast weight load its
      skewed weight writes, so the first row's multipliers start from flip-flops), one
      vector per cycle;
    * the banks (2, or 3 with ``fast_weight_load = 2``) are used in turn. A load into the
      bank a ``swap`` retired starts ``G`` cycles after that swap, and a swap waits for its
      whole load, so a stream of matmuls that each take a fresh tile issues one every
      ``max(N, G + M)`` cycles with two banks; matmuls that reuse a tile issue back to
      back. Without ``config.fast_weight_load``, ``G = K + (K - 1) A``: a beat writes its
      column into every row at once, so the old tile's last vectors must have passed every
      row first. With 1, ``G = 1``: a beat's element of row ``k`` travels down row ``k``'s
      skew line with the moving elements and is written ``k (1 + A)`` cycles after the
      beat, so the load follows the old tile's last vector through the array one column
      behind it (``max(N, M + 1)``: 129 cycles at 128x128 instead of 256). With 2, the beats are
      skewed as with 1 and carry two columns, which gain a column a cycle on that vector,
      so ``G = M / 2 - 1`` (at least 1) keeps column ``M - 1`` behind it; the third bank
      lets the next tile load while the one before it waits for its swap (a load waits for
      the swap two tiles back): ``max(N, M / 2)``, 64 cycles at 128x128
      (``golden.tensor_engine.issue_interval``).

    Back-pressure: when ``result.valid`` is high and ``result.ready`` low, the whole array
    stalls (its registers hold), so nothing is dropped or duplicated.

    Members
    -------
    stationary : ``In(stream.Signature(stationary_layout(config)))``
        Stationary tile columns (and, with an MX format, their scales), ``pe_cols /
        config.load_columns`` beats per load.
    moving : ``In(stream.Signature(moving_layout(config)))``
        Moving vectors (and, with an MX format, their scales).
    result : ``Out(stream.Signature(result_layout(config)))``
        Columns of ``out``, in the order the moving vectors were accepted.
    """

    def __init__(self, *, config):
        with refusing(self):
            self._formats = formats(config)
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

        # -- weight banks: the active one feeds matmuls, the others take loads ---------------
        # Banks are used in turn: a load writes the bank after the active one and the tiles
        # waiting for their swap (``pending``), a swap makes the next bank active.
        fast = cfg.fast_weight_load
        banks, per_beat = cfg.weight_banks, cfg.load_columns
        beats = cols // per_beat
        active = Signal(range(banks), init=banks - 1)   # bank of the tile in use
        active_valid = Signal()                 # a tile has been swapped in at least once
        pending = Signal(range(banks))          # complete tiles waiting for their swap
        load_bank = Signal(range(banks))        # the bank loads write
        # Per bank, advances to wait after the swap that retired it before a load may
        # write it, less one (the cycle the swap registers; golden
        # tensor_engine.reload_guard is this plus one). Why these: below, at the swap.
        # Rows are skew_step cycles apart (the PEs' add stages, below).
        skew_step = 1 + cfg.pe_add_stages
        guard_value = ((rows - 1) * skew_step if not fast else 0 if fast == 1
                       else max(cols // 2 - 2, 0))
        guards = [Signal(range(max(guard_value, 1) + 1), name=f"guard_{bank}")
                  for bank in range(banks)]
        load_guard = Signal.like(guards[0])
        load_beat = Signal(range(beats))

        def bank_after(bank, steps):
            """The bank ``steps`` turns after ``bank`` (``steps < banks``)."""
            return Mux(bank >= banks - steps, bank - (banks - steps), bank + steps)

        # pending < banks - 1: bank_after(active, 1 + pending) is not the active bank.
        m.d.comb += load_bank.eq(bank_after(active, 1) if banks == 2 else
                                 Mux(pending == 0, bank_after(active, 1),
                                     bank_after(active, 2)))
        with m.Switch(load_bank):
            for bank, guard in enumerate(guards):
                with m.Case(bank):
                    m.d.comb += load_guard.eq(guard)
        load = self.stationary.valid & self.stationary.ready
        m.d.comb += self.stationary.ready.eq(advance & (pending != banks - 1)
                                             & (load_guard == 0))
        load_complete = Signal()
        with m.If(load):
            m.d.sync += load_beat.eq(load_beat + 1)
            with m.If(load_beat == beats - 1):
                m.d.sync += load_beat.eq(0)
                m.d.comb += load_complete.eq(1)

        swap = self.moving.payload.swap
        m.d.comb += self.moving.ready.eq(advance & ((swap & (pending != 0))
                                                    | (~swap & active_valid)))
        take = self.moving.valid & self.moving.ready
        swapping = take & swap
        vector_bank = Signal(range(banks))
        m.d.comb += vector_bank.eq(Mux(swap, bank_after(active, 1), active))
        m.d.sync += pending.eq(pending + load_complete - swapping)
        with m.If(swapping):
            m.d.sync += [active.eq(bank_after(active, 1)), active_valid.eq(1)]
        # The old active bank is retired. Its last vector entered row 0 in the previous cycle
        # at the latest and uses column c of row k k*skew_step+c cycles later. Without the
        # fast load, every row is written at once, so the next load into it waits until that
        # vector has passed row K-1 ((K-1)*skew_step + 1 cycles). With it, a load's rows are
        # written skewed like the vectors, row k k*skew_step cycles after its beat: one
        # column a cycle stays behind that vector from the next cycle on; two columns a
        # cycle gain a column a cycle on it, so they start late enough (M / 2 - 1 cycles)
        # for column M - 1.
        for bank, guard in enumerate(guards):
            if guard_value == 0:
                continue            # the pending count alone keeps the load a cycle behind
            with m.If(swapping & (active == bank)):
                m.d.sync += guard.eq(guard_value)
            with m.Elif(advance & (guard != 0)):
                m.d.sync += guard.eq(guard - 1)

        # -- the array: one block of pe_rows x pe_cols PEs ------------------------------------
        array = ProcessingElementArray(
            rows=rows, cols=cols, in_bits=cfg.in_bits, acc_bits=cfg.acc_bits,
            formats=self._formats, macs={name: cfg.macs_per_pe_cycle(name)
                                         for name in self._formats},
            multiply_stages=cfg.pe_multiply_stages, add_stages=cfg.pe_add_stages, banks=banks,
            write_columns=per_beat)
        m.submodules.array = shared(array)

        # Skew: row k sees a vector k*skew_step advances after row 0, in step with the
        # partial sums coming down from the rows above (each PE holds one skew_step
        # advances); row 0 sees it pe_input_stages advances after it is taken (the input
        # registers). De-skew: column m leaves the array m advances after column 0 and is
        # delayed M-1-m more. Delay lines of one block each (DelayLine: a circular buffer,
        # the same module whatever the delay), all written at one index, the advances so far.
        entry = cfg.pe_input_stages
        skew_depth = 1 << ceil_log2((rows - 1) * skew_step + entry + 1)
        skew_index = Signal(range(skew_depth), name="skew_index")
        deskew_index = Signal(range(cols), name="deskew_index")
        with m.If(advance):
            m.d.sync += [skew_index.eq(skew_index + 1), deskew_index.eq(deskew_index + 1)]

        def delay_line(name, value, delay, index, depth):
            value = Value.cast(value)
            line = DelayLine(width=len(value), depth=depth)
            m.submodules[name] = shared(line)
            m.d.comb += [line.enable.eq(advance), line.index.eq(index), line.delay.eq(delay),
                         line.i.eq(value)]
            return line.o

        # A vector's element of row k travels with its bank, format and (MX) the scale of
        # row k's block: one line per row. With fast_weight_load the stationary beat's
        # elements of row k (their bank, column and scales) travel in the same line.
        blocks = mx_blocks(cfg)
        block_rows = mx_block_rows(cfg) if blocks else 0
        m.d.comb += [array.enable.eq(advance), array.psum_in.eq(0)]
        # Which rows' skewed beats are writes: a register chain with a reset, so that words
        # left in the lines from before a reset never write a bank.
        load_in_flight = Signal(max((rows - 1) * skew_step + entry, 1))
        if fast:
            with m.If(advance):
                m.d.sync += load_in_flight.eq(Cat(load, load_in_flight))

        def row_field(bus, row):
            """Row ``row``'s field of one of the array's flat per-row buses."""
            width = len(bus) // rows
            return bus[row * width:(row + 1) * width]

        for row in range(rows):
            entering = [self.moving.payload.data[row], vector_bank, self.moving.payload.format]
            if blocks:
                entering.append(self.moving.payload.scale[row // block_rows])
            writing = [Cat(self.stationary.payload.data[j * rows + row]
                           for j in range(per_beat)), load_bank]
            if beats > 1:
                writing.append(load_beat)
            if blocks:
                writing.append(Cat(self.stationary.payload.scale[j * blocks + row // block_rows]
                                   for j in range(per_beat)))
            lined = entering + writing if fast else entering
            delay = entry + row * skew_step
            skewed = delay_line(f"skew_{row}", Cat(*lined), delay, skew_index, skew_depth)
            fields = [len(Value.cast(value)) for value in lined]
            starts = [sum(fields[:i]) for i in range(len(fields))]
            fields_out = [skewed[start:start + width]
                          for start, width in zip(starts, fields, strict=True)]
            x, bank, fmt, *scale = fields_out[:len(entering)]
            # Without the fast load a beat writes every row at once, as it is taken, not
            # behind the input registers: with up to two stages the reload guard still has
            # each column written no earlier than the cycle the retired tile's last vector
            # last reads it (which reads the old weight); with three it would be written
            # before (tried: the testbench fails), so Config allows two.
            if fast:
                write = fields_out[len(entering):]
                write_enable = load_in_flight[delay - 1] & advance if delay else load
            else:
                write, write_enable = [Value.cast(value) for value in writing], load
            weight_data, weight_bank, *column = write[:3 if beats > 1 else 2]
            m.d.comb += [
                row_field(array.x_in, row).eq(x),
                row_field(array.bank_in, row).eq(bank),
                row_field(array.format_in, row).eq(fmt),
                # Writes only as the array advances: a load may write a column in the
                # cycle the retired tile's last vector uses it (two columns a beat), which
                # is right only if both happen in the same advance.
                row_field(array.weight_we, row).eq(write_enable),
                row_field(array.weight_bank, row).eq(weight_bank),
                row_field(array.weight_data, row).eq(weight_data),
            ]
            if beats > 1:
                m.d.comb += row_field(array.weight_column, row).eq(column[0])
            if blocks:
                m.d.comb += [
                    row_field(array.x_scale_in, row).eq(scale[0]),
                    row_field(array.weight_scale, row).eq(write[-1]),
                ]

        # -- de-skew and result ------------------------------------------------------------
        for col in range(cols):
            column = array.psum_out[col * cfg.acc_bits:(col + 1) * cfg.acc_bits]
            m.d.comb += self.result.payload.data[col].eq(delay_line(
                f"deskew_{col}", column, cols - 1 - col, deskew_index, cols))

        # valid and last travel with the vector to its result.
        depth = latency(cfg)
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
