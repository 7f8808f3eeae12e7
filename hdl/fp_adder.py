"""FP32 adder: IEEE-754 binary32 ``a + b``, round to nearest even, a lane vector,
combinational or cut into stages."""

from amaranth import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opentrn.numerics import CANONICAL_NAN32, FP32

from .hierarchy import shared
from .params import refusing

__all__ = ["FPAdder", "MAX_STAGES", "TEST_LANES", "unit_test_top"]

#: Lanes of the build the unit testbench runs (:func:`unit_test_top`).
TEST_LANES = 16

_MAN = FP32.man_bits                     # fraction bits (23)
_EXP = FP32.exp_bits                     # exponent bits (8)
_EXP_ALL_ONES = FP32.exp_max_field       # infinities and NaNs
_INF_MAGNITUDE = _EXP_ALL_ONES << _MAN   # the code of +inf
_SIG = _MAN + 1                          # significand with the hidden bit (24)
_GRS = 3                                 # guard, round and sticky bits below the significand
_WIDE = _SIG + _GRS                      # aligned significands (27); the sum has one more bit


#: The most registers :class:`FPAdder` can be cut by (after the alignment, after the add,
#: after the ordering of the operands, after the normalization: the order they are added in).
MAX_STAGES = 4


def _check(lanes, stages):
    if not isinstance(lanes, int) or isinstance(lanes, bool):
        raise TypeError(f"lanes must be an integer, not {lanes!r}")
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, not {lanes}")
    if not isinstance(stages, int) or isinstance(stages, bool) \
            or not 0 <= stages <= MAX_STAGES:
        raise ValueError(f"stages must be an integer from 0 to {MAX_STAGES}, not {stages!r}")


class FPAdder(wiring.Component):
    """``sum = a + b`` in IEEE-754 binary32, per lane, combinational (no clock) unless
    ``stages`` is 1 to 4.

    Numerics:

    * round to nearest, ties to even; subnormal inputs and results are honoured (no flush to
      zero); a finite result whose rounded magnitude reaches ``2**128`` is an infinity of the
      sign of the larger operand;
    * an exact zero result (``x + (-x)``, ``(+0) + (-0)``, ``(+0) + (+0)``) is ``+0``, except
      ``(-0) + (-0) = -0``;
    * ``inf + inf`` (same sign) and ``inf + finite`` are that infinity; ``inf + (-inf)`` and
      any NaN operand give the canonical NaN ``0x7FC00000`` (whatever the payloads and signs
      of the input NaNs).

    This is numpy ``float32`` addition bit for bit, with NaN results made canonical.

    Datapath of one lane (:func:`opentrn.golden.fp_adder.add` computes the same steps):
    unpack; swap so that ``|x| >= |y|`` (compare the codes without sign); align the
    significand of ``y`` to the exponent of ``x`` with guard, round and sticky bits; add, or
    subtract for operands of opposite signs; normalize: one bit right on a carry out, else
    left by the leading-zero count, but never below the smallest exponent (a subnormal
    result); round to nearest even, the carry of the rounding going into the exponent field
    (so a subnormal may round up to the smallest normal and the largest finite to infinity);
    pack, with the special cases (NaN, infinity, zero) selected last.

    ``stages`` registers (no reset; they advance while ``enable`` is high) cut the datapath:
    the first after the alignment, the second after the add, the third after the ordering
    (so that the 31-bit compare and the swap and the alignment's shift are in different
    cycles), the fourth after the normalization (so that the leading-zero count and shift
    and the rounding's carry are). ``sum`` is the sum of the operands of ``stages`` advances
    ago (a processing element's accumulate, ``Config.pe_add_stages``).

    Members
    -------
    a : ``In(data.ArrayLayout(unsigned(32), lanes))``
        FP32 codes of the first operand, one per lane.
    b : ``In(data.ArrayLayout(unsigned(32), lanes))``
        FP32 codes of the second operand.
    sum : ``Out(data.ArrayLayout(unsigned(32), lanes))``
        FP32 code of ``a + b``, lane by lane.
    enable : ``In(1)``
        Advance the registers (only with ``stages`` 1 to 4).
    """

    def __init__(self, *, lanes, stages=0):
        with refusing(self):
            _check(lanes, stages)
        self._lanes, self._stages = lanes, stages
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`): a lane is shared.
        self.shared_key = (lanes, stages)
        layout = data.ArrayLayout(unsigned(FP32.bits), lanes)
        members = {"a": In(layout), "b": In(layout), "sum": Out(layout)}
        if stages:
            members["enable"] = In(1)
        super().__init__(members)

    @property
    def lanes(self):
        return self._lanes

    @property
    def stages(self):
        return self._stages

    def elaborate(self, platform):
        m = Module()
        if self._lanes == 1:
            m.d.comb += self.sum[0].eq(_add(m, self.a[0], self.b[0], "lane0", self._stage))
            return m
        # One block per lane, all the same module (hierarchy.shared), so a 128-lane adder
        # elaborates one lane. One assignment of the whole vector, not one per lane: Icarus
        # merges the drivers of an output's slices again on every change of any of them
        # (quadratic in the lanes).
        lanes = []
        for index in range(self._lanes):
            lane = FPAdder(lanes=1, stages=self._stages)
            m.submodules[f"lane_{index}"] = shared(lane)
            m.d.comb += [lane.a[0].eq(self.a[index]), lane.b[0].eq(self.b[index])]
            if self._stages:
                m.d.comb += lane.enable.eq(self.enable)
            lanes.append(lane.sum[0])
        m.d.comb += self.sum.eq(Cat(*lanes))
        return m

    def _stage(self, m, number, values, prefix):
        """``values`` (a dict of name to Value) after cut ``number`` (1: the alignment, 2: the
        add, 3: the ordering, 4: the normalization): registered if the adder has that many
        stages, else themselves."""
        if number > self._stages:
            return values
        registered = {}
        for name, value in values.items():
            register = Signal(Value.cast(value).shape(), name=f"{prefix}_{name}_stage{number}",
                              reset_less=True)
            with m.If(self.enable):
                m.d.sync += register.eq(value)
            registered[name] = register
        return registered


def _add(m, a, b, prefix, stage):
    """The scalar datapath: the code of ``a + b`` (both FP32 codes); ``stage(m, number,
    values, prefix)`` passes the values that cross cut ``number`` (``FPAdder._stage``)."""
    def signal(shape, name):
        return Signal(shape, name=f"{prefix}_{name}")

    # Order by magnitude: the code without its sign orders finite values, infinities and NaNs.
    swap = signal(1, "swap")
    x, y = signal(32, "x"), signal(32, "y")
    m.d.comb += [
        swap.eq(b[:31] > a[:31]),
        x.eq(Mux(swap, b, a)),
        y.eq(Mux(swap, a, b)),
    ]
    cut = stage(m, 3, {"x": x, "y": y}, prefix)
    x, y = cut["x"], cut["y"]
    sx, ex, fx = x[31], x[_MAN:31], x[:_MAN]
    sy, ey, fy = y[31], y[_MAN:31], y[:_MAN]
    subtract = signal(1, "subtract")
    m.d.comb += subtract.eq(sx ^ sy)

    # Subnormals have no hidden bit and the exponent of the smallest normal.
    x_normal, y_normal = signal(1, "x_normal"), signal(1, "y_normal")
    ex_eff, ey_eff = signal(_EXP, "ex_eff"), signal(_EXP, "ey_eff")
    m.d.comb += [
        x_normal.eq(ex.any()),
        y_normal.eq(ey.any()),
        ex_eff.eq(Mux(x_normal, ex, 1)),
        ey_eff.eq(Mux(y_normal, ey, 1)),
    ]

    # Align: shift y right by the exponent difference; bits shifted past the sticky position
    # are ORed into it. At _WIDE or more every bit of y is sticky.
    diff = signal(_EXP, "exp_diff")
    shift = signal(range(_WIDE + 1), "align_shift")
    shifted = signal(2 * _WIDE, "shifted")
    aligned = signal(_WIDE, "aligned")
    m.d.comb += [
        diff.eq(ex_eff - ey_eff),
        shift.eq(Mux(diff > _WIDE, _WIDE, diff)),
        shifted.eq(Cat(Const(0, _WIDE + _GRS), fy, y_normal) >> shift),
        aligned.eq(shifted[_WIDE:] | shifted[:_WIDE].any()),
    ]

    x_wide = Cat(Const(0, _GRS), fx, x_normal)
    # |y| <= |x|: y is an infinity or a NaN only if x is one too.
    x_top, y_top = ex == _EXP_ALL_ONES, ey == _EXP_ALL_ONES
    nan = x_top & (fx.any() | (y_top & subtract))          # a NaN operand, or inf - inf
    # What the add and the stages after it read of the operands.
    kept = {"ex_eff": ex_eff, "sx": sx, "sy": sy, "x_top": x_top, "nan": nan}
    cut = stage(m, 1, {**kept, "subtract": subtract, "x_wide": x_wide, "aligned": aligned},
                prefix)
    raw = signal(_WIDE + 1, "raw")      # |x| >= |y|: the difference is never negative
    m.d.comb += raw.eq(Mux(cut["subtract"], cut["x_wide"] - cut["aligned"],
                           cut["x_wide"] + cut["aligned"]))
    cut = stage(m, 2, {**{name: cut[name] for name in kept}, "raw": raw}, prefix)
    raw, ex_eff, sx, sy = cut["raw"], cut["ex_eff"], cut["sx"], cut["sy"]
    carry = raw[_WIDE]

    # Leading zeros below the carry bit (a priority encoder); a cancellation of more than one
    # bit only happens for exponent differences 0 and 1, where the guard bits are exact.
    leading = Const(_WIDE, range(_WIDE + 1))
    for bit in range(_WIDE):
        leading = Mux(raw[bit], _WIDE - 1 - bit, leading)
    zeros = signal(range(_WIDE + 1), "leading_zeros")
    room = signal(_EXP, "room")         # left shifts before the exponent reaches its minimum
    lshift = signal(range(_WIDE + 1), "norm_shift")
    m.d.comb += [
        zeros.eq(leading),
        room.eq(ex_eff - 1),
        lshift.eq(Mux(zeros > room, room, zeros)),
    ]
    # The biased exponent less one: the hidden bit of ``norm`` adds the one back when packed,
    # and a subnormal result (no hidden bit) gets exponent field 0.
    norm = signal(_WIDE, "norm")
    exp_less_one = signal(_EXP + 1, "exp_less_one")
    m.d.comb += [
        norm.eq(Mux(carry, raw[1:] | raw[0], raw[:_WIDE] << lshift)),
        exp_less_one.eq(Mux(carry, ex_eff, room - lshift)),
    ]

    cut = stage(m, 4, {"x_top": cut["x_top"], "nan": cut["nan"], "sx": sx, "sy": sy,
                       "norm": norm, "exp_less_one": exp_less_one, "zero": raw == 0}, prefix)
    norm, exp_less_one, sx, sy = cut["norm"], cut["exp_less_one"], cut["sx"], cut["sy"]

    # Round to nearest even; a carry out of the fraction goes into the exponent field.
    round_up = norm[_GRS - 1] & (norm[:_GRS - 1].any() | norm[_GRS])
    magnitude = signal(32, "magnitude")
    m.d.comb += magnitude.eq((exp_less_one << _MAN) + norm[_GRS:] + round_up)

    infinite = cut["x_top"] | (magnitude >= _INF_MAGNITUDE)    # infinite operand, overflow
    return Mux(cut["nan"], CANONICAL_NAN32,
               Mux(infinite, Cat(Const(_INF_MAGNITUDE, 31), sx),
                   Mux(cut["zero"], Cat(Const(0, 31), sx & sy),
                       Cat(magnitude[:31], sx))))


def unit_test_top(*, config):
    """The build the unit testbenches run: ``TEST_LANES`` lanes (``config`` is not used;
    :data:`opentrn.hdl.TOPS` passes one to every top level)."""
    return FPAdder(lanes=TEST_LANES)
