"""The activation engine, int8 path: ``out = saturate(f(round(x * multiplier + bias) /
2**shift))`` per PSUM partition, from the tensor engine's accumulators to the SBUF format
(Trainium's ``activation(scale, bias)``, with a fixed-point scale like Gemmini's
``acc_scale``)."""

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn.config import Config

__all__ = ["ActivationEngine", "IDENTITY", "RELU", "PARAM_BITS", "SHIFT_LIMIT", "OUT_BITS",
           "STAGES", "params_layout", "input_layout", "output_layout"]

#: Codes of the ``function`` parameter.
IDENTITY, RELU = 0, 1
#: Width of ``multiplier`` and of each ``bias`` (signed).
PARAM_BITS = 32
#: ``shift`` takes the values ``0 .. SHIFT_LIMIT - 1``.
SHIFT_LIMIT = 64
#: Width of one output lane, and of the wide output format (``out_int32 = 1``).
OUT_BITS = 32
#: Pipeline stages: multiply, add bias, shift, round-activate-saturate. A vector accepted in
#: cycle ``c`` is on the output in cycle ``c + STAGES``.
STAGES = 4


def _check_config(config):
    if not isinstance(config, Config):
        raise TypeError(f"config={config!r}: must be an opentrn.config.Config")
    if config.dtypes != ("int8",):
        raise ValueError(f"dtypes={','.join(config.dtypes)}: the activation engine hardware "
                         "implements the int8 path; the floating-point formats are not built yet")


def params_layout(config):
    """The parameters of one operation; ``bias`` has one value per PSUM partition, in units
    of ``2**-shift``."""
    return data.StructLayout({
        "function": 1,
        "multiplier": signed(PARAM_BITS),
        "shift": range(SHIFT_LIMIT),
        "out_int32": 1,
        "bias": data.ArrayLayout(signed(PARAM_BITS), config.pe_cols),
    })


def input_layout(config):
    """One input beat: an accumulator of every PSUM partition, as PSUM's ``act_read``
    returns it; ``last`` marks the final vector of an operation and is passed through."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(config.acc_bits), config.pe_cols),
        "last": 1,
    })


def output_layout(config):
    """One output beat: the saturated result of every partition, sign-extended to
    ``OUT_BITS`` (int8 results lie in ``[-128, 127]``)."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(OUT_BITS), config.pe_cols),
        "last": 1,
    })


class ActivationEngine(wiring.Component):
    """Per partition ``p`` (``P = pe_cols``) and element ``x``, in exact integer arithmetic:

    1. ``pre = x * multiplier + bias[p]`` (no wrap: up to ``acc_bits + 33`` bits);
    2. ``r = pre / 2**shift`` rounded half to even (``shift = 0``: exact);
    3. ``a = r`` (``function = IDENTITY``) or ``max(r, 0)`` (``RELU``);
    4. ``a`` saturated to ``in_bits`` (int8, ``out_int32 = 0``) or 32 bits (``out_int32 =
       1``), sign-extended to ``OUT_BITS``.

    Pipeline (``STAGES`` = 4 registers): multiply; add the bias; arithmetic shift with the
    guard and sticky bits; round, function and saturate into the output register. A vector
    accepted in cycle ``c`` is on ``output`` in cycle ``c + STAGES``; one vector per cycle.

    Back-pressure: the pipeline advances as one when the output register is empty or being
    taken (``~output.valid | output.ready``), as the tensor engine does; ``input.ready`` is
    that condition, so nothing is dropped or duplicated.

    ``params`` are plain inputs read by every stage: the user holds them constant from the
    first vector of an operation until its last result has been taken (the pipeline is
    empty), and changes them only between operations.

    Members
    -------
    params : ``In(params_layout(config))``
        ``function`` (1 bit: 0 identity, 1 relu), ``multiplier`` (``signed(32)``),
        ``shift`` (``range(64)``), ``out_int32`` (1 bit), ``bias``
        (``ArrayLayout(signed(32), pe_cols)``).
    input : ``In(stream.Signature(input_layout(config)))``
        ``data``: ``ArrayLayout(signed(acc_bits), pe_cols)``, ``last``.
    output : ``Out(stream.Signature(output_layout(config)))``
        ``data``: ``ArrayLayout(signed(32), pe_cols)``, ``last``; in input order.
    """

    def __init__(self, *, config):
        try:
            _check_config(config)
        except (TypeError, ValueError):
            self._MustUse__silence = True     # refused, so it is not an unused elaboratable
            raise
        self._config = config
        super().__init__({
            "params": In(params_layout(config)),
            "input": In(stream.Signature(input_layout(config))),
            "output": Out(stream.Signature(output_layout(config))),
        })

    def elaborate(self, platform):
        cfg = self._config
        params = self.params
        m = Module()

        # The pipeline advances as one; it stalls only while a result waits for the sink.
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.output.valid | self.output.ready),
            self.input.ready.eq(advance),
        ]
        take = self.input.valid & self.input.ready

        product_bits = cfg.acc_bits + PARAM_BITS          # signed a-bit x signed b-bit
        pre_bits = product_bits + 1                       # plus a 32-bit bias
        narrow_lo, narrow_hi = -(1 << (cfg.in_bits - 1)), (1 << (cfg.in_bits - 1)) - 1
        wide_lo, wide_hi = -(1 << (OUT_BITS - 1)), (1 << (OUT_BITS - 1)) - 1
        ones = Const((1 << pre_bits) - 1, pre_bits)

        for p in range(cfg.pe_cols):
            product = Signal(signed(product_bits), name=f"product_{p}")
            pre = Signal(signed(pre_bits), name=f"pre_{p}")
            quotient = Signal(signed(pre_bits), name=f"quotient_{p}")
            round_up = Signal(name=f"round_up_{p}")

            # The helpers of stages 3 and 4 are assigned inside ``If(advance)``, next to the
            # registers that read them (and nothing else does), so that, as in hdl/psum.py,
            # Yosys writes them as processes rather than nets of continuous assignments,
            # which Icarus re-propagates bit by bit.
            guard_shifted = Signal(signed(pre_bits + 1), name=f"guard_shifted_{p}")
            below_guard = Signal(pre_bits, name=f"below_guard_{p}")
            rounded = Signal(signed(pre_bits + 1), name=f"rounded_{p}")
            activated = Signal(signed(pre_bits + 1), name=f"activated_{p}")
            with m.If(advance):
                # Stage 1: the exact product.
                m.d.sync += product.eq(self.input.payload.data[p] * params.multiplier)
                # Stage 2: plus the bias, exact (one bit wider).
                m.d.sync += pre.eq(product + params.bias[p])

                # Stage 3: q = floor(pre / 2**shift) by an arithmetic shift. Round half to
                # even from the bits shifted out: the guard bit (weight 2**(shift-1), the
                # "half"), and the sticky bit (any bit below it): round up when the
                # remainder is above half (guard and sticky) or exactly half and q odd.
                # A shift past the top of pre needs no sign extension for the sticky bit:
                # then q is 0 (guard 0: no rounding) or -1 (odd: sticky does not matter).
                m.d.comb += [
                    # Bit 0 of (pre * 2) >> shift is bit shift-1 of pre; 0 for shift 0.
                    guard_shifted.eq(Cat(Const(0, 1), pre).as_signed() >> params.shift),
                    # Bit i of (ones << shift) >> 1 is set when i >= shift - 1; the rest
                    # are the bits below the guard (none for shift 0 or 1).
                    below_guard.eq(~(ones << params.shift)[1:pre_bits + 1]),
                ]
                guard = guard_shifted[0]
                sticky = (pre.as_unsigned() & below_guard).any()
                q = pre >> params.shift
                m.d.sync += [
                    quotient.eq(q),
                    round_up.eq(guard & (sticky | q[0])),
                ]

                # Stage 4: round, the function, saturate to the output format.
                m.d.comb += [
                    rounded.eq(quotient + round_up),
                    activated.eq(Mux((params.function == RELU) & rounded[-1], 0, rounded)),
                ]
                lo = Mux(params.out_int32, wide_lo, narrow_lo)
                hi = Mux(params.out_int32, wide_hi, narrow_hi)
                m.d.sync += self.output.payload.data[p].eq(
                    Mux(activated < lo, lo, Mux(activated > hi, hi, activated)))

        # valid and last travel with the vector through the STAGES registers.
        in_flight = Signal(STAGES)
        last = Signal(STAGES)
        with m.If(advance):
            m.d.sync += [
                in_flight.eq((in_flight << 1) | take),
                last.eq((last << 1) | (take & self.input.payload.last)),
            ]
        m.d.comb += [
            self.output.valid.eq(in_flight[STAGES - 1]),
            self.output.payload.last.eq(last[STAGES - 1]),
        ]
        return m
