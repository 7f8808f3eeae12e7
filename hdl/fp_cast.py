"""FP32 to storage-format cast: a lane vector of FP32 codes rounded to FP32, BF16, FP8 E4M3
or FP8 E5M2 (the activation engine's write path to the SBUF)."""

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .params import refusing

__all__ = ["FORMATS", "TEST_LANES", "FPCast", "unit_test_top"]

#: The output formats the cast supports.
FORMATS = ("fp32", "bf16", "fp8e4m3", "fp8e5m2")
#: Lanes of :func:`unit_test_top` (16: Verilator builds 64 lanes ten times slower).
TEST_LANES = 16

_FP32 = numerics.FP32


class FPCast(wiring.Component):
    """Combinational cast of FP32 codes to the format ``format`` selects, lane by lane.

    The rules are those of ``ml_dtypes``' ``float32_array.astype(...)``, bit for bit, on
    every FP32 code (:mod:`opentrn.golden.fp_cast` states them and the datapath):

    * ``fp32``: the identity, every bit kept (NaN payloads too);
    * a NaN input gives the format's canonical NaN (bf16 ``0x7FC0``, fp8e5m2 ``0x7E``,
      fp8e4m3 ``0x7F``) with the input's sign, the payload dropped;
    * otherwise round to nearest, ties to even, subnormal results kept (no flush to
      zero); a result that rounds above the largest finite value is infinity (bf16,
      fp8e5m2) or NaN (fp8e4m3, which has no infinities: above 464 is NaN); infinities stay
      infinities (NaN for fp8e4m3); the sign is always kept.

    No clock, no registers. Hardware is generated only for the formats in ``formats``: the
    narrow ones share one rounding datapath per lane, whose constants ``format`` selects.
    For any other ``format`` code the result is unspecified.

    Members
    -------
    format : ``In(numerics.FORMAT_CODE_BITS)``
        The output format: a ``numerics.DATA_FORMATS[name].code`` of a built format, shared
        by all lanes.
    a : ``In(data.ArrayLayout(unsigned(32), lanes))``
        FP32 codes, one per lane.
    result : ``Out(data.ArrayLayout(unsigned(32), lanes))``
        The code of ``a`` in the output format, in the low bits of each lane (16 for bf16,
        8 for the FP8 formats), the upper bits zero.
    """

    def __init__(self, *, formats, lanes=1):
        with refusing(self):
            _check(formats, lanes)
        self._formats = formats
        self._lanes = lanes
        super().__init__({
            "format": In(numerics.FORMAT_CODE_BITS),
            "a": In(data.ArrayLayout(unsigned(32), lanes)),
            "result": Out(data.ArrayLayout(unsigned(32), lanes)),
        })

    @property
    def formats(self):
        return self._formats

    @property
    def lanes(self):
        return self._lanes

    def elaborate(self, platform):
        m = Module()
        fmts = [numerics.float_format(name) for name in self._formats]
        # The format decoded once for all lanes (an expression used in every lane would be
        # built in every lane): by name, and by code width (the result's layout).
        selected = {}
        for fmt in fmts:
            selected[fmt.name] = Signal(name=f"is_{fmt.name}")
            m.d.comb += selected[fmt.name].eq(self.format == numerics.data_format(
                fmt.name).code)
        widths = {}
        for fmt in fmts:
            widths.setdefault(fmt.bits, []).append(selected[fmt.name])
        width_selected = {}
        for bits, conditions in widths.items():
            width_selected[bits] = Signal(name=f"is_{bits}_bits")
            m.d.comb += width_selected[bits].eq(Cat(*conditions).any())

        narrow = [fmt for fmt in fmts if fmt.bits < _FP32.bits]
        datapath = _Narrow(m, selected, narrow) if narrow else None
        results = []
        for lane in range(self._lanes):
            a = self.a[lane]
            codes = {}
            if datapath is not None:
                magnitude = datapath.lane(m, a, f"l{lane}")
                codes = {fmt.bits: Cat(magnitude[:fmt.bits - 1], a[31]) for fmt in narrow}
            if "fp32" in self._formats:
                codes[_FP32.bits] = a
            result = Signal(32, name=f"l{lane}_result")
            m.d.comb += result.eq(_select(width_selected, codes))
            results.append(result)
        # One assignment of the whole vector: the lanes are separate processes, so a
        # simulator re-evaluates only the lanes whose inputs changed (assigning the lane
        # slices of `result` in one process made Icarus redo every lane for each change).
        m.d.comb += self.result.eq(Cat(*results))
        return m


def _check(formats, lanes):
    if not isinstance(formats, tuple) or not formats:
        raise ValueError(f"formats must be a non-empty tuple of format names, not "
                         f"{formats!r}")
    for name in formats:
        if name not in FORMATS:
            raise ValueError(f"formats: {name!r} is not a format of the cast; must be one "
                             f"of {', '.join(FORMATS)}")
    if len(set(formats)) != len(formats):
        raise ValueError(f"formats must not repeat a format: {formats!r}")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise ValueError(f"lanes must be at least 1, not {lanes!r}")


def _select(selected, values):
    """The one of ``values`` whose key is ``selected`` (a dict of the same keys to 1-bit
    signals, at most one of them high); the last one if none is."""
    keys = list(values)
    result = values[keys[-1]]
    for key in reversed(keys[:-1]):
        result = Mux(selected[key], values[key], result)
    return result


def _offset(fmt):
    """The FP32 biased exponent less the format's: ``te = eff_e - _offset(fmt)``."""
    return _FP32.bias - fmt.bias


def _needs_shift(fmt):
    """Whether some FP32 value has a subnormal result in ``fmt`` (not in bf16, whose
    exponent range reaches down as far as FP32's)."""
    return fmt.min_normal_exp > _FP32.min_normal_exp


class _Narrow:
    """The rounding datapath of the formats narrower than FP32, shared by them: the steps
    of :mod:`opentrn.golden.fp_cast` with the format's numbers as constants that ``format``
    selects (decoded once for all lanes; plain constants when one format is built).

    It works in the frame of the widest built format (``man`` fraction bits): a lane takes
    the top ``man + 2`` bits of the significand (implicit bit, fraction, guard) and, below
    them, the OR of the rest (sticky); it shifts those right by ``t``: the difference of the
    output's fraction width from ``man`` (``base``: its guard bit is further up), plus
    ``1 - te`` for a subnormal result. Two simplifications against the golden model, neither
    changing a result:

    * ``t`` is not clamped: from ``base + man_bits + 2`` on, the guard bit is 0 and the
      result 0 whatever the (then inexact) sticky bit;
    * overflow is only a rounded code above the largest finite one: ``width`` leaves room
      for the largest code any FP32 exponent gives, so no overflow can wrap around.
    """

    def __init__(self, m, selected, formats):
        self.formats = formats
        self.selected = selected
        self.man = max(fmt.man_bits for fmt in formats)
        self.shifts = any(_needs_shift(fmt) for fmt in formats)
        # The largest truncated code (e = 255, every significand bit set) plus the carry.
        self.width = max(
            (((_FP32.exp_max_field - _offset(fmt) - 1) << fmt.man_bits)
             + (2 << fmt.man_bits)).bit_length() for fmt in formats)

        def param(name, value_of, shape):
            values = {fmt.name: value_of(fmt) for fmt in formats}
            if len(set(values.values())) == 1:
                return Const(values[formats[0].name], shape)
            signal = Signal(shape, name=name)
            m.d.comb += signal.eq(_select(selected, values))
            return signal

        # The exponent field before the carry, te - 1, when not negative (else the result is
        # subnormal): e - exp_from.
        self.exp_from = param("exp_from", lambda fmt: _offset(fmt) + 1, range(256))
        self.base = param("base", lambda fmt: self.man - fmt.man_bits, range(self.man + 1))
        code = range(1 << self.width)
        self.max_finite = param("max_finite", lambda fmt: fmt.max_finite_bits, code)
        self.overflow_code = param(
            "overflow_code", lambda fmt: (fmt.exp_max_field << fmt.man_bits) if fmt.has_inf
            else fmt.canonical_nan, code)
        self.nan_code = param("nan_code", lambda fmt: fmt.canonical_nan, code)

    def lane(self, m, a, prefix):
        """The magnitude (all but the sign bit) of the code of the FP32 code ``a`` in the
        format ``format`` selects, ``width - 1`` bits, the bits above the format's zero."""
        man, width = self.man, self.width
        low = _FP32.man_bits - man                               # FP32 bits below the lsb
        e, f = a[23:31], a[0:23]
        implicit = Signal(name=f"{prefix}_implicit")
        exp_raw = Signal(signed(10), name=f"{prefix}_exp_raw")   # te - 1
        exp_field = Signal(8, name=f"{prefix}_exp_field")
        subnormal = exp_raw[-1]                                  # te < 1
        eff_e = Cat(e[0] | ~implicit, e[1:])                     # max(e, 1)
        m.d.comb += [
            implicit.eq(e != 0),
            exp_raw.eq(eff_e - self.exp_from),
            exp_field.eq(Mux(subnormal, 0, exp_raw[:8])),
        ]
        # sticky, guard, fraction, implicit bit: the significand in the frame of `man`.
        top = Cat(f[:low - 1] != 0, f[low - 1:], implicit)
        if self.shifts:
            # 1 - te = -exp_raw more for a subnormal result. The bits shifted out of `top`
            # land in the pad zero bits below it, as far as the guard bit can be nonzero.
            pad = man + 1
            aligned = Signal(man + 3 + pad, name=f"{prefix}_aligned")
            # At most base + 120 (eff_e = 1 in fp8e4m3): 7 bits.
            t = Mux(subnormal, self.base - exp_raw, self.base)[:7]
            m.d.comb += aligned.eq(Cat(Const(0, pad), top) >> t)
            sticky, guard = aligned[:pad + 1] != 0, aligned[pad + 1]
            significand = aligned[pad + 2:]                      # implicit bit included
        else:
            # bf16 only: te >= 1 for every FP32 value.
            sticky, guard, significand = top[0], top[1], top[2:]

        truncated = Signal(width, name=f"{prefix}_truncated")
        rounded = Signal(width, name=f"{prefix}_rounded")
        magnitude = Signal(width - 1, name=f"{prefix}_magnitude")
        m.d.comb += [
            # The implicit bit adds into the exponent field, and so does the rounding carry:
            # the largest subnormal becomes the smallest normal, the top of a binade the
            # bottom of the next one.
            truncated.eq(_select(self.selected, {fmt.name: exp_field << fmt.man_bits
                                                 for fmt in self.formats}) + significand),
            rounded.eq(truncated + (guard & (sticky | truncated[0]))),
            magnitude.eq(Mux(a[:31] > (_FP32.exp_max_field << _FP32.man_bits),
                             self.nan_code,
                             Mux(rounded > self.max_finite, self.overflow_code, rounded))),
        ]
        return magnitude


def unit_test_top(*, config):
    """The build the unit testbenches run: :data:`TEST_LANES` lanes, every format
    (``config`` is not used: the cast has no configuration)."""
    return FPCast(formats=FORMATS, lanes=TEST_LANES)
