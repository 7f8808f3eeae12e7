"""One lane of the activation engine: the datapath of one PSUM partition, integer and float,
through the engine's pipeline stages."""

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .delay_line import delayed
from .fp_adder import MAX_STAGES as FP_ADDER_MAX_STAGES
from .fp_adder import FPAdder
from .fp_cast import FPCast
from .fp_multiplier import FPMultiplier

__all__ = ["ActivationLane"]

#: Codes of the ``function`` parameter (as the engine's).
_RELU = 1


class ActivationLane(wiring.Component):
    """The datapath of one lane of :class:`~opentrn.hdl.activation_engine.ActivationEngine`
    (whose docstring states the arithmetic): ``result`` is the lane's output register,
    ``STAGES + input_stages + multiply_stages + add_stages`` advances after ``x`` entered.
    The engine decodes the operation once for all lanes (``is_float``, ``is_int32``) and
    tracks which results are valid; the lane holds data only (no reset), so every lane of an
    engine is one shared block (:mod:`opentrn.hdl.hierarchy`).

    ``integer`` builds the integer path (a build with int8), ``float_outputs`` the float
    path's output formats (empty: no float path); ``input_stages`` (0 to 2) adds stages in
    front of both multiplies (``Config.activation_input_stages``). With 1 the integer path
    registers ``x``, so its multiply starts from flip-flops; the float path's multiplier is
    cut after its significand product instead
    (:class:`~opentrn.hdl.fp_multiplier.FPMultiplier` ``stages``), so that the
    operands' decode and multiply and the normalization and rounding take a cycle each.
    With 2 the float path registers ``x`` and the scale (``multiplier``) too (the choice of
    the input, outside the lane, and the operands' decode and multiply then take a cycle
    each), and the integer path delays its register of ``x`` a cycle to match.
    ``multiply_stages`` (0 to 2, ``Config.activation_multiply_stages``) cut the float
    path's multiplier that many times more (after its normalization, then after its
    subnormal shift; with no input stage after the significand product first) and delay
    the integer path's product as long.
    ``add_stages`` (0 to 4, ``Config.activation_add_stages``) cut the float path's FP32
    adder (:class:`~opentrn.hdl.fp_adder.FPAdder` ``stages``) and delay the integer path's
    sum with the bias as long.

    Members
    -------
    advance : ``In(1)``
        Move the pipeline one stage this cycle.
    x : ``In(signed(acc_bits))``
        The lane's input (an accumulator, or an FP32 code).
    is_float, is_int32 : ``In(1)``
        The operation's path, and on the integer path the int32 saturation.
    function : ``In(1)``; multiplier : ``In(signed(32))``; shift : ``In(range(64))``;
    out_format : ``In(numerics.FORMAT_CODE_BITS)``; bias : ``In(signed(32))``
        The operation's parameters, held for its whole run; ``bias`` this lane's.
    result : ``Out(signed(32))``
        Stage 4: the saturated integer, or the float code zero-extended.
    """

    def __init__(self, *, acc_bits, integer, float_outputs, shift_limit, out_bits,
                 int8_range, input_stages=0, multiply_stages=0, add_stages=0):
        if input_stages not in (0, 1, 2):
            raise ValueError(f"input_stages must be 0, 1 or 2, not {input_stages!r}")
        if multiply_stages not in (0, 1, 2):
            raise ValueError(f"multiply_stages must be 0, 1 or 2, not {multiply_stages!r}")
        if add_stages not in range(FP_ADDER_MAX_STAGES + 1):
            raise ValueError(f"add_stages must be from 0 to {FP_ADDER_MAX_STAGES}, "
                             f"not {add_stages!r}")
        self._input_stages, self._add_stages = input_stages, add_stages
        self._multiply_stages = multiply_stages
        self._acc_bits, self._integer = acc_bits, bool(integer)
        self._floats = tuple(float_outputs)
        self._shift_limit, self._out_bits, self._int8_range = shift_limit, out_bits, int8_range
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (acc_bits, self._integer, self._floats, shift_limit, out_bits,
                           int8_range, input_stages, multiply_stages, add_stages)
        super().__init__({
            "advance": In(1), "x": In(signed(acc_bits)),
            "is_float": In(1), "is_int32": In(1),
            "function": In(1), "multiplier": In(signed(32)), "shift": In(range(shift_limit)),
            "out_format": In(numerics.FORMAT_CODE_BITS), "bias": In(signed(32)),
            "result": Out(signed(out_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        int_result = Const(0, signed(self._out_bits))
        if self._integer:
            x = delayed(m, self.x, self._input_stages, name="x", enable=self.advance)
            int_result = self._integer_path(m, x)
        result = int_result
        if self._floats:
            result = self._float_path(m, self.x, int_result)
        output = Signal(signed(self._out_bits), reset_less=True)
        with m.If(self.advance):
            m.d.sync += output.eq(result)
        m.d.comb += self.result.eq(output)
        return m

    def _register(self, shape, name):
        return Signal(shape, name=name, reset_less=True)

    def _integer_path(self, m, x):
        """Stages 1 to 4 of the integer path from ``x``; returns the stage 4 value
        (saturated)."""
        product_bits = self._acc_bits + 32               # signed a-bit x signed b-bit
        pre_bits = product_bits + 1                       # plus a 32-bit bias
        narrow_lo, narrow_hi = self._int8_range
        wide_lo, wide_hi = -(1 << (self._out_bits - 1)), (1 << (self._out_bits - 1)) - 1
        ones = Const((1 << pre_bits) - 1, pre_bits)
        lo = Mux(self.is_int32, wide_lo, narrow_lo)
        hi = Mux(self.is_int32, wide_hi, narrow_hi)
        product = self._register(signed(product_bits), "product")
        pre = self._register(signed(pre_bits), "pre")
        quotient = self._register(signed(pre_bits), "quotient")
        round_up = self._register(1, "round_up")
        # The helpers of stages 3 and 4 are assigned under a condition, so that Yosys
        # writes them as processes rather than nets of continuous assignments, which Icarus
        # re-propagates bit by bit. The condition is the operation's path (held for the
        # whole operation; the float path does not read them), not ``advance``: under
        # ``advance`` the engine's back-pressure, which comes from the SBUF's write grant,
        # ran through the rounding's carry chain into the output register (an FPGA build's
        # critical path) instead of only enabling the registers.
        guard_shifted = Signal(signed(pre_bits + 1))
        below_guard = Signal(pre_bits)
        rounded = Signal(signed(pre_bits + 1))
        negative, under, over = Signal(), Signal(), Signal()
        saturated = Signal(signed(self._out_bits))
        with m.If(self.advance):
            # Stage 1: the exact product; a zero operand on the float path, so that the
            # multiplier does not toggle.
            m.d.sync += product.eq(Mux(self.is_float, 0, x) * self.multiplier)
        # multiply_stages more registers (the float path's multiplier is cut as often).
        product = delayed(m, product, self._multiply_stages, name="product",
                          enable=self.advance)
        with m.If(self.advance):
            # Stage 2: plus the bias, exact (one bit wider); add_stages more registers
            # follow (the float path's adder is cut as many times).
            m.d.sync += pre.eq(product + Mux(self.is_float, 0, self.bias))
        pre = delayed(m, pre, self._add_stages, name="pre", enable=self.advance)
        integer = ~self.is_float
        with m.If(integer):
            # Stage 3: q = floor(pre / 2**shift) by an arithmetic shift. Round half to even
            # from the bits shifted out: the guard bit (weight 2**(shift-1), the "half"), and
            # the sticky bit (any bit below it): round up when the remainder is above half
            # (guard and sticky) or exactly half and q odd. A shift past the top of pre needs
            # no sign extension for the sticky bit: then q is 0 (guard 0: no rounding) or -1
            # (odd: sticky does not matter).
            m.d.comb += [
                # Bit 0 of (pre * 2) >> shift is bit shift-1 of pre; 0 for shift 0.
                guard_shifted.eq(Cat(Const(0, 1), pre).as_signed() >> self.shift),
                # Bit i of (ones << shift) >> 1 is set when i >= shift - 1; the rest are the
                # bits below the guard (none for shift 0 or 1).
                below_guard.eq(~(ones << self.shift)[1:pre_bits + 1]),
            ]
        guard = guard_shifted[0]
        sticky = (pre.as_unsigned() & below_guard).any()
        q = pre >> self.shift
        with m.If(self.advance):
            m.d.sync += [quotient.eq(q), round_up.eq(guard & (sticky | q[0]))]
        with m.If(integer):
            # Stage 4: round, the function, saturate to the output format. The tests are
            # made on the quotient beside the rounding's add, so one carry chain, not three
            # in a row, lies between the registers and the output: ``quotient + round_up``
            # is above a bound when ``quotient`` is above the bound less ``round_up``; where
            # ``quotient`` is below a bound (or zero) and the sum is not, the sum is the
            # bound itself, which the choice of the bound gives too. ReLU's zero is in every
            # format's range.
            def above(bound):
                return Mux(round_up, quotient >= bound, quotient > bound)

            m.d.comb += [
                rounded.eq(quotient + round_up),
                negative.eq(quotient < 0),
                under.eq(Mux(self.is_int32, quotient < wide_lo, quotient < narrow_lo)),
                over.eq(Mux(self.is_int32, above(wide_hi), above(narrow_hi))),
                saturated.eq(Mux((self.function == _RELU) & negative, 0,
                                 Mux(under, lo, Mux(over, hi, rounded)))),
            ]
        return saturated

    def _float_path(self, m, x, int_result):
        """The float path's stages 1 to 3 from ``x`` (the input stage inside the multiplier)
        and its cast; returns the stage 4 value of the operation's path (the float code or
        ``int_result``)."""
        fp32 = numerics.data_format("fp32").code
        # The first input stage cuts the multiplier; the second is a register of its input.
        multiply_stages = min(self._input_stages, 1) + self._multiply_stages
        m.submodules.fp_multiplier = multiplier = FPMultiplier(
            formats=("fp32",), lanes=1, stages=multiply_stages)
        if multiply_stages:
            m.d.comb += multiplier.enable.eq(self.advance)
        m.submodules.fp_adder = adder = FPAdder(lanes=1, stages=self._add_stages)
        if self._add_stages:
            m.d.comb += adder.enable.eq(self.advance)
        m.submodules.fp_cast = cast = FPCast(formats=self._floats, lanes=1)
        product = self._register(unsigned(32), "fp_product")      # stage 1
        total = self._register(unsigned(32), "fp_sum")            # stage 2
        activated = self._register(unsigned(32), "fp_activated")  # stage 3

        # The multiplier sees zeros on the integer path: its combinational logic then does
        # not toggle (Icarus re-evaluates every change, bit by bit), nor does the adder's,
        # whose other operand, the bias, is held for the whole operation (not gated: the
        # decode of the operation's path in front of its alignment was an FPGA build's
        # critical path).
        operand = Mux(self.is_float, x[:32], 0)
        scale = Mux(self.is_float, self.multiplier.as_unsigned(), 0)
        if self._input_stages == 2:
            # Both operands, each vector's with it: the scale came from the activation
            # unit's instruction register across the core (an FPGA build's critical path).
            operand = delayed(m, operand, 1, name="fp_x", enable=self.advance)
            scale = delayed(m, scale, 1, name="fp_scale", enable=self.advance)
        m.d.comb += [
            multiplier.format.eq(fp32),
            multiplier.a[0].eq(operand),
            multiplier.b[0].eq(scale),
            adder.a[0].eq(product),
            adder.b[0].eq(self.bias.as_unsigned()),
            cast.format.eq(self.out_format),
            cast.a[0].eq(activated),
        ]
        relu = self.function == _RELU
        # relu(-0) = +0 and relu(-inf) = +0; a NaN (the adder's is canonical, sign 0, but
        # the rule does not rely on it) passes unchanged.
        nan = (total[23:31] == 0xFF) & (total[:23] != 0)
        with m.If(self.advance):
            m.d.sync += [product.eq(multiplier.product[0]), total.eq(adder.sum[0]),
                         activated.eq(Mux(relu & total[31] & ~nan, 0, total))]
        return Mux(self.is_float, cast.result[0], int_result)
