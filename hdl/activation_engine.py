"""The activation engine: ``out = f(x * scale + bias)`` per PSUM partition, from the tensor
engine's accumulators to an SBUF format (Trainium's ``activation(scale, bias)``). Two paths,
chosen per operation by ``out_format``: the integer path (int8 / int32 results, a
fixed-point scale like Gemmini's ``acc_scale``: ``saturate(f(round((x * multiplier + bias) /
2**shift)))``) and, in a build with float formats, the float path (FP32 scale and bias, the
result cast to fp32, bf16 or fp8; docs/numerics.md)."""

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics
from opentrn.config import Config

from .fp_adder import FPAdder
from .fp_cast import FPCast
from .fp_multiplier import FPMultiplier

__all__ = ["ActivationEngine", "IDENTITY", "RELU", "PARAM_BITS", "SHIFT_LIMIT", "OUT_BITS",
           "INT8_RANGE", "STAGES", "params_layout", "input_layout", "output_layout",
           "float_outputs"]

#: Codes of the ``function`` parameter.
IDENTITY, RELU = 0, 1
#: Width of ``multiplier`` and of each ``bias`` (signed).
PARAM_BITS = 32
#: ``shift`` takes the values ``0 .. SHIFT_LIMIT - 1``.
SHIFT_LIMIT = 64
#: Width of one output lane, and of the wide integer output format (``int32``).
OUT_BITS = 32
#: The int8 output range: the SBUF's int8 format, whatever ``in_bits`` (a build with bf16
#: has 16-bit element registers, but an int8 result is still one byte).
INT8_RANGE = (-128, 127)
#: Pipeline stages: multiply, add bias, shift (float: the function), round-activate-saturate
#: (float: the cast). A vector accepted in cycle ``c`` is on the output in cycle
#: ``c + STAGES``.
STAGES = 4

_INT8 = numerics.data_format("int8").code
_INT32 = numerics.data_format("int32").code


def float_outputs(config):
    """The names of the float path's output formats of ``config`` (fp32 and the non-MX float
    input formats, in code order); empty without float formats: then no float path is
    built."""
    return tuple(fmt.name for fmt in numerics.activation_formats(config)
                 if fmt.element is not None)


def _check_config(config):
    if not isinstance(config, Config):
        raise TypeError(f"config={config!r}: must be an opentrn.config.Config")
    numerics.check_buildable(config, "the activation engine hardware")


def params_layout(config):
    """The parameters of one operation; ``bias`` has one value per PSUM partition, in units
    of ``2**-shift`` (integer path) or the FP32 bits (float path); ``multiplier`` is the
    FP32 bits of the scale on the float path."""
    return data.StructLayout({
        "function": 1,
        "multiplier": signed(PARAM_BITS),
        "shift": range(SHIFT_LIMIT),
        "out_format": numerics.FORMAT_CODE_BITS,
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
    """One output beat: the result of every partition in ``OUT_BITS``: integer results
    sign-extended (int8 results lie in ``[-128, 127]``), float results the code of the
    output format zero-extended (so an fp32 code with its sign bit set reads negative)."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(OUT_BITS), config.pe_cols),
        "last": 1,
    })


class ActivationEngine(wiring.Component):
    """Per partition ``p`` (``P = pe_cols``) and element ``x``, by ``params.out_format``:

    Integer path (``out_format`` int8 or int32), in exact integer arithmetic:

    1. ``pre = x * multiplier + bias[p]`` (no wrap: up to ``acc_bits + 33`` bits);
    2. ``r = pre / 2**shift`` rounded half to even (``shift = 0``: exact);
    3. ``a = r`` (``function = IDENTITY``) or ``max(r, 0)`` (``RELU``);
    4. ``a`` saturated to int8 ``[-128, 127]`` (not ``in_bits``, which is 16 in a build
       with bf16) or int32, sign-extended to ``OUT_BITS``.

    Float path (``out_format`` fp32, bf16, fp8e4m3 or fp8e5m2; built only when the config
    has float formats, :func:`float_outputs`), on FP32 codes (docs/numerics.md): ``x`` is
    the accumulator's 32 bits, the scale the 32 bits of ``multiplier``, the bias the 32 bits
    of ``bias[p]``:

    1. ``y = fp_mul32(x, scale)`` (:class:`~opentrn.hdl.fp_multiplier.FPMultiplier`, fp32);
    2. ``y = fp_add32(y, bias[p])`` (:class:`~opentrn.hdl.fp_adder.FPAdder`);
    3. relu: ``+0`` if ``y``'s sign bit is set and ``y`` is not a NaN, else ``y``;
    4. ``y`` cast to ``out_format`` (:class:`~opentrn.hdl.fp_cast.FPCast`), the code
       zero-extended to ``OUT_BITS``. ``shift`` is not used.

    Pipeline (``STAGES`` = 4 registers): multiply; add the bias; arithmetic shift with the
    guard and sticky bits (float: the function); round, function and saturate (float: the
    cast) into the output register. A vector accepted in cycle ``c`` is on ``output`` in
    cycle ``c + STAGES``; one vector per cycle, on either path.

    The path not selected gets zero operands, so that its logic does not toggle (which
    costs simulation time, and power).

    Back-pressure: the pipeline advances as one when the output register is empty or being
    taken (``~output.valid | output.ready``), as the tensor engine does; ``input.ready`` is
    that condition, so nothing is dropped or duplicated.

    ``params`` are plain inputs read by every stage: the user holds them constant from the
    first vector of an operation until its last result has been taken (the pipeline is
    empty), and changes them only between operations. An ``out_format`` code that is
    neither an integer format nor a built float output gives unspecified results (the
    activation unit refuses it).

    Members
    -------
    params : ``In(params_layout(config))``
        ``function`` (1 bit: 0 identity, 1 relu), ``multiplier`` (``signed(32)``),
        ``shift`` (``range(64)``), ``out_format`` (``numerics.FORMAT_CODE_BITS``), ``bias``
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

        floats = float_outputs(cfg)
        # The path of the operation, decoded once for all lanes.
        is_float = Signal()
        is_int32 = Signal()
        if floats:
            m.d.comb += is_float.eq(Cat(params.out_format == numerics.data_format(name).code
                                        for name in floats).any())
        m.d.comb += is_int32.eq(params.out_format == _INT32)

        product_bits = cfg.acc_bits + PARAM_BITS          # signed a-bit x signed b-bit
        pre_bits = product_bits + 1                       # plus a 32-bit bias
        narrow_lo, narrow_hi = INT8_RANGE
        wide_lo, wide_hi = -(1 << (OUT_BITS - 1)), (1 << (OUT_BITS - 1)) - 1
        ones = Const((1 << pre_bits) - 1, pre_bits)
        lo = Mux(is_int32, wide_lo, narrow_lo)
        hi = Mux(is_int32, wide_hi, narrow_hi)

        results = []                                      # stage 4's integer result per lane
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
            saturated = Signal(signed(OUT_BITS), name=f"saturated_{p}")
            results.append(saturated)
            with m.If(advance):
                # Stage 1: the exact product; a zero operand on the float path, so that
                # the multiplier does not toggle.
                m.d.sync += product.eq(Mux(is_float, 0, self.input.payload.data[p])
                                       * params.multiplier)
                # Stage 2: plus the bias, exact (one bit wider).
                m.d.sync += pre.eq(product + Mux(is_float, 0, params.bias[p]))

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
                    saturated.eq(Mux(activated < lo, lo, Mux(activated > hi, hi, activated))),
                ]

        if floats:
            results = self._float_path(m, advance, is_float, results)
        with m.If(advance):
            m.d.sync += [self.output.payload.data[p].eq(result)
                         for p, result in enumerate(results)]

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

    def _float_path(self, m, advance, is_float, int_results):
        """The float path's stages 1 to 3 and its cast; returns, per lane, the stage 4
        result of the operation's path (the float code or ``int_results[p]``)."""
        cfg = self._config
        params = self.params
        lanes = cfg.pe_cols
        fp32 = numerics.data_format("fp32").code
        word = data.ArrayLayout(unsigned(32), lanes)

        m.submodules.fp_multiplier = multiplier = FPMultiplier(formats=("fp32",), lanes=lanes)
        m.submodules.fp_adder = adder = FPAdder(lanes=lanes)
        m.submodules.fp_cast = cast = FPCast(formats=float_outputs(cfg), lanes=lanes)
        product = Signal(word, name="fp_product")         # stage 1 register
        total = Signal(word, name="fp_sum")               # stage 2 register
        activated = Signal(word, name="fp_activated")     # stage 3 register

        # The units see zeros on the integer path: their wide combinational lanes then do
        # not toggle (Icarus re-evaluates every change, bit by bit).
        m.d.comb += [
            multiplier.format.eq(fp32),
            multiplier.a.eq(Mux(is_float, Cat(self.input.payload.data[p][:32]
                                              for p in range(lanes)), 0)),
            multiplier.b.eq(Mux(is_float, params.multiplier.as_unsigned().replicate(lanes),
                                0)),
            adder.a.eq(product),
            adder.b.eq(Mux(is_float, params.bias.as_value(), 0)),
            cast.format.eq(params.out_format),
            cast.a.eq(activated),
        ]
        relu = params.function == RELU
        results = []
        for p in range(lanes):
            y = total[p]
            # relu(-0) = +0 and relu(-inf) = +0; a NaN (the adder's is canonical, sign 0,
            # but the rule does not rely on it) passes unchanged.
            nan = (y[23:31] == 0xFF) & (y[:23] != 0)
            with m.If(advance):
                m.d.sync += activated[p].eq(Mux(relu & y[31] & ~nan, 0, y))
            results.append(Mux(is_float, cast.result[p], int_results[p]))
        with m.If(advance):
            m.d.sync += [product.eq(multiplier.product), total.eq(adder.sum)]
        return results
