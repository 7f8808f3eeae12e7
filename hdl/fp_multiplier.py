"""The floating-point multiplier: a lane vector of exact products rounded once to FP32, the
multiply of the tensor engine's processing elements (BF16, FP8, MXFP8) and of the
activation engine's FP32 scale."""

from dataclasses import dataclass, replace

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .params import refusing

__all__ = ["FPMultiplier", "FORMATS", "MAX_STAGES", "TEST_FORMATS", "TEST_LANES",
           "unit_test_top"]

#: The formats the multiplier can be built for (both operands are in one of them).
FORMATS = ("fp32", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")

_FP32 = numerics.FP32
_E_BITS = 12            # signed exponent of the product: -553 .. 509 for every format here
_WINDOW_MIN = 26        # 24 kept bits, the guard bit, one sticky bit
_SHIFT_MAX = 25         # a right shift of 25 or more leaves nothing above the guard bit
#: Registers the datapath can be cut by: after the significand product, after the
#: normalization, after the subnormal shift.
MAX_STAGES = 3


@dataclass(frozen=True)
class _Shared:
    """Signals every lane reads."""

    uses: list
    exp_top: Signal
    offset: Signal
    is_fn: Signal
    is_mx: Signal
    built: Signal


def _product_exponent_range(fmt):
    """Smallest and largest ``E`` (product ``1.x * 2**E``) of ``fmt``, scales included."""
    element = fmt.element
    scale = 2 * (numerics.E8M0_NAN - 1 - numerics.E8M0_BIAS) if fmt.mx else 0
    smallest = 2 * (element.min_normal_exp - element.man_bits) - scale
    largest = 2 * element.max_normal_exp + 1 + scale
    return smallest, largest


class FPMultiplier(wiring.Component):
    """``lanes`` independent multipliers: ``product[i] = a[i] * b[i]`` (times
    ``2**(scale_a[i] + scale_b[i] - 254)`` for the MX formats), combinational (no clock)
    unless ``stages`` is 1 to 3.

    Numerics (both operands in the format ``format`` selects; the result IEEE-754 binary32):

    * inputs are decoded per :mod:`opentrn.numerics`: ``bf16`` and ``fp8e5m2`` have
      infinities and NaNs in the top exponent (``ieee``); ``fp8e4m3`` is OCP ``e4m3fn`` (no
      infinities, NaN only ``S.1111.111``); subnormal inputs are honoured;
    * the product is computed exactly and rounded once to FP32, to nearest, ties to even;
      subnormal results are honoured (no flush to zero); a product of magnitude at least
      ``2**128 * (1 - 2**-25)`` overflows to infinity. An FP8 product (without scales)
      always fits FP32 normal range and is exact; a BF16 product is inexact only in the
      subnormal range;
    * special cases, first match: a NaN operand, an MX scale code of 255 (E8M0 NaN) or
      infinity times zero give the canonical NaN ``0x7FC00000``; infinity times anything
      else (nonzero finite or infinite) is infinity and zero times a finite value is zero,
      both with the sign ``sign(a) ^ sign(b)`` (also with scales);
    * the scales are E8M0 codes, value ``2**(code - 127)``, read only when ``format`` is an
      MX format.

    Datapath per lane: decode both operands to a significand left-aligned to the widest
    built format's (``M + 1`` bits, hidden bit included) and a biased exponent; one
    ``(M + 1) x (M + 1)`` multiply; normalize by the product's leading zeros; shift right
    into the subnormal range with a sticky bit; round on guard and sticky; add the rounding
    increment to the packed exponent and significand, so that a carry steps the exponent.
    The shift, rounding and overflow stages are generated only when a built format can need
    them: they are left out of an FP8-only build, whose products are always exact normals.

    For a ``format`` code not among ``formats`` the product is unspecified (it is 0).

    With ``stages = 1`` the datapath is cut after the multiply: a register (no reset; it
    advances while ``enable`` is high) holds each lane's significand product, exponent sum
    and special cases, so ``product`` is the product of the operands (and ``format``) of
    the last cycle ``enable`` was high. The decode and the multiply take one cycle and the
    normalization and rounding the next, where one register after the whole product would
    leave them all in one (a processing element's ``multiply_stages``, the activation
    lanes' input register: docs/fpga.md, "Timing"). ``stages = 2`` cuts it after the
    normalization too (the normalized product, its exponent and the special cases): the
    product is that of the operands of two advances ago, and the subnormal shift and the
    rounding take the third cycle (the activation lanes' FP32 multiply with
    ``Config.activation_multiply_stages``). ``stages = 3`` cuts it after the subnormal
    shift as well (the rounding's add and the overflow and special cases' selects then
    have a cycle of their own).

    Members
    -------
    format : ``In(numerics.FORMAT_CODE_BITS)``
        ``numerics.DataFormat.code`` of the operands' format, shared by the lanes.
    a, b : ``In(data.ArrayLayout(unsigned(W), lanes))``
        Operand codes; ``W`` is the width of the widest built format, narrower formats use
        the low bits (the bits above are ignored).
    scale_a, scale_b : ``In(data.ArrayLayout(unsigned(8), lanes))``
        E8M0 scale codes of ``a`` and ``b`` (only when an MX format is built).
    product : ``Out(data.ArrayLayout(unsigned(32), lanes))``
        FP32 codes of the products.
    enable : ``In(1)``
        Advance the registers (only with ``stages`` 1 to 3).
    """

    def __init__(self, *, formats, lanes=1, stages=0):
        with refusing(self):
            self._formats = self._check(formats, lanes)
            if stages not in range(MAX_STAGES + 1) or isinstance(stages, bool):
                raise ValueError(f"stages must be from 0 to {MAX_STAGES}, not {stages!r}")
        self._lanes, self._stages = lanes, stages
        fmts = [numerics.data_format(name) for name in self._formats]
        self._elements = list(dict.fromkeys(fmt.element for fmt in fmts))
        self._mx = any(fmt.mx for fmt in fmts)
        self._width = max(element.bits for element in self._elements)
        self._man = max(element.man_bits for element in self._elements)
        ranges = [_product_exponent_range(fmt) for fmt in fmts]
        # Subnormal results and overflow are possible only for some formats; rounding is
        # needed for those and for products wider than the FP32 significand (FP32 only).
        self._need_subnormal = min(low for low, _ in ranges) < _FP32.min_normal_exp
        self._need_overflow = max(high for _, high in ranges) > _FP32.max_normal_exp
        self._need_round = self._need_subnormal or any(
            2 * (element.man_bits + 1) > _FP32.man_bits + 1 for element in self._elements)
        members = {
            "format": In(numerics.FORMAT_CODE_BITS),
            "a": In(data.ArrayLayout(unsigned(self._width), lanes)),
            "b": In(data.ArrayLayout(unsigned(self._width), lanes)),
        }
        if self._mx:
            members["scale_a"] = In(data.ArrayLayout(unsigned(8), lanes))
            members["scale_b"] = In(data.ArrayLayout(unsigned(8), lanes))
        members["product"] = Out(data.ArrayLayout(unsigned(32), lanes))
        if stages:
            members["enable"] = In(1)
        super().__init__(members)

    @staticmethod
    def _check(formats, lanes):
        if not isinstance(formats, tuple | list) or \
                not all(isinstance(name, str) for name in formats):
            raise TypeError(f"formats={formats!r}: must be a tuple of format names")
        if not formats:
            raise ValueError(f"formats must name at least one of {', '.join(FORMATS)}")
        for name in formats:
            if name not in FORMATS:
                raise ValueError(f"formats: {name!r} is not one of {', '.join(FORMATS)}")
        if len(set(formats)) != len(formats):
            raise ValueError(f"formats={tuple(formats)!r}: names a format more than once")
        if not isinstance(lanes, int) or isinstance(lanes, bool):
            raise TypeError(f"lanes={lanes!r}: must be an integer")
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, not {lanes}")
        return tuple(formats)

    @property
    def formats(self):
        return self._formats

    @property
    def lanes(self):
        return self._lanes

    @property
    def stages(self):
        return self._stages

    def elaborate(self, platform):
        m = Module()
        fmts = [numerics.data_format(name) for name in self._formats]
        elements = self._elements

        # Shared by the lanes: the element format the code selects (one-hot), its constants,
        # whether the code is an MX format and whether it is built at all.
        uses = []
        for element in elements:
            codes = [fmt.code for fmt in fmts if fmt.element is element]
            use = Signal(name=f"use_{element.name}")
            m.d.comb += use.eq(Cat(self.format == code for code in codes).any())
            uses.append(use)
        shared = _Shared(uses=uses, exp_top=Signal(8), offset=Signal(signed(10)),
                         is_fn=Signal(), is_mx=Signal(), built=Signal())
        m.d.comb += [
            shared.exp_top.eq(self._select(uses, [e.exp_max_field for e in elements])),
            # 1 - 2 * bias: both biases, and the 1 of the product's second integer bit.
            shared.offset.eq(self._select(uses, [1 - 2 * e.bias for e in elements])),
            shared.is_fn.eq(self._select(uses, [int(not e.has_inf) for e in elements])),
            shared.built.eq(Cat(self.format == fmt.code for fmt in fmts).any()),
        ]
        mx_codes = [fmt.code for fmt in fmts if fmt.mx]
        if mx_codes:
            m.d.comb += shared.is_mx.eq(Cat(self.format == code for code in mx_codes).any())

        # After each cut only ``built`` is read, as of the operands' cycle.
        late = [shared]
        for stage in range(1, self._stages + 1):
            late.append(replace(shared, built=self._registered(m, late[-1].built,
                                                              f"built{stage}")))
        results = []
        for lane in range(self._lanes):
            scales = (self.scale_a[lane], self.scale_b[lane]) if self._mx else None
            results.append(self._lane(m, late, lane, self.a[lane], self.b[lane], scales))
        # One process writes the whole port once the lanes have settled (see _wire).
        with m.If(late[-1].built):
            m.d.comb += [self.product[lane].eq(result) for lane, result in enumerate(results)]
        return m

    @staticmethod
    def _wire(m, shared, name, shape, value):
        """A Signal named ``name`` driven by ``value``, at a joint of the datapath.

        It is assigned under a condition (a built format; for other codes the product is
        unspecified), so that Yosys writes it as an ``always @*`` process rather than a
        continuous assignment: Icarus re-evaluates a continuous assignment once per path
        from a changed input (the paths multiply through the normalizer and the rounding),
        but runs a process once per change of its inputs (about 10x faster here). Values
        used more than once need a Signal anyway: Amaranth emits an expression again at
        every use."""
        signal = Signal(shape, name=name)
        with m.If(shared.built):
            m.d.comb += signal.eq(value)
        return signal

    def _registered(self, m, value, name):
        """``value`` as of the last cycle ``enable`` was high (a cut)."""
        register = Signal(value.shape(), name=f"{name}_stage", reset_less=True)
        with m.If(self.enable):
            m.d.sync += register.eq(value)
        return register

    @staticmethod
    def _select(uses, values):
        """``values[i]`` where ``uses[i]`` (one-hot), as a Mux chain."""
        result = values[-1]
        for use, value in zip(uses[-2::-1], values[-2::-1], strict=True):
            result = Mux(use, value, result)
        return result

    def _decode(self, m, shared, code, name):
        """Sign, significand (``M + 1`` bits, hidden bit included, left-aligned: narrower
        formats need no exponent adjustment), biased exponent (1 for subnormals), zero, NaN
        and infinity flags of one operand. The fields are selected first and decoded once."""
        elements, man, uses = self._elements, self._man, shared.uses
        exp_bits = max(e.exp_bits for e in elements)
        fields = self._wire(m, shared, f"{name}_fields", 1 + man + exp_bits, Cat(
            self._select(uses, [code[e.bits - 1] for e in elements]),
            self._select(uses, [Cat(Const(0, man - e.man_bits), code[:e.man_bits])
                                for e in elements]),
            self._select(uses, [code[e.man_bits:e.bits - 1] for e in elements])))
        sign, fraction, field = fields[0], fields[1:1 + man], fields[1 + man:]
        normal, nonzero_fraction = field.any(), fraction.any()
        top = field == shared.exp_top
        fn_nans = [e for e in elements if not e.has_inf]
        # e4m3fn: only the all-ones fraction is a NaN (left-aligned: the top man_bits bits).
        fn_nan = fraction[man - fn_nans[0].man_bits:].all() if fn_nans else Const(0)
        if not fn_nans:
            nan, inf = top & nonzero_fraction, top & ~nonzero_fraction
        elif len(fn_nans) == len(elements):
            nan, inf = top & fn_nan, Const(0)
        else:
            nan = top & Mux(shared.is_fn, fn_nan, nonzero_fraction)
            inf = top & ~nonzero_fraction & ~shared.is_fn
        # The biased exponent is last: max(field, 1), the width of the widest field.
        decoded = self._wire(
            m, shared, f"{name}_decoded", 3 + 1 + (man + 1) + exp_bits,
            Cat(~(normal | nonzero_fraction), nan, inf, sign, fraction, normal, field | ~normal))
        zero, nan, inf, sign = decoded[0], decoded[1], decoded[2], decoded[3]
        sig, exponent = decoded[4:5 + man], decoded[5 + man:]
        return sign, sig, exponent, zero, nan, inf

    def _normalize(self, m, shared, p, name):
        """``p << lz`` and ``lz``, the leading zeros of ``p`` (``p != 0``), by binary
        search: 6 steps of a test and a shift for 64 bits, no priority chain."""
        width = 1 << (len(p) - 1).bit_length()
        x = Cat(Const(0, width - len(p)), p)     # zeros below: the same leading zeros
        lz = []
        step = width // 2
        while step:
            empty = ~x[width - step:].any()
            stage = self._wire(m, shared, f"{name}_norm{step}", width + 1,
                               Cat(Mux(empty, x << step, x)[:width], empty))
            x = stage[:width]
            lz.append(stage[width])
            step //= 2
        return x[width - len(p):], Cat(*reversed(lz))

    def _lane(self, m, late, lane, a, b, scales):
        """The FP32 code of one lane's product; ``late[i]`` is what the part after cut ``i``
        reads of the shared signals (``late[0]`` the shared signals themselves)."""
        man_bits = _FP32.man_bits
        shared = late[0]
        sign_a, sig_a, exp_a, zero_a, nan_a, inf_a = self._decode(m, shared, a, f"a{lane}")
        sign_b, sig_b, exp_b, zero_b, nan_b, inf_b = self._decode(m, shared, b, f"b{lane}")

        nan = nan_a | nan_b | (inf_a & zero_b) | (inf_b & zero_a)
        scale = 0
        if scales is not None:
            scale_a, scale_b = scales
            nan_scale = (scale_a == numerics.E8M0_NAN) | (scale_b == numerics.E8M0_NAN)
            nan = nan | (shared.is_mx & nan_scale)
            scale = Mux(shared.is_mx, scale_a + scale_b - 2 * numerics.E8M0_BIAS, 0)
        special = self._wire(m, shared, f"nan_inf_zero{lane}", 4,
                             Cat(nan, inf_a | inf_b, zero_a | zero_b, sign_a ^ sign_b))

        # The exact product and its exponent before normalization.
        width = 2 * (self._man + 1)
        p = self._wire(m, shared, f"p{lane}", width, sig_a * sig_b)
        exponent_sum = self._wire(m, shared, f"exponent_sum{lane}", signed(_E_BITS),
                                  exp_a + exp_b + shared.offset + scale)
        if self._stages >= 1:
            special = self._registered(m, special, f"nan_inf_zero{lane}")
            p = self._registered(m, p, f"p{lane}")
            exponent_sum = self._registered(m, exponent_sum, f"exponent_sum{lane}")
            shared = late[1]
        # Normalized: 1.q * 2**e.
        normalized, lz = self._normalize(m, shared, p, f"p{lane}")
        q = normalized
        e = self._wire(m, shared, f"e{lane}", signed(_E_BITS), exponent_sum - lz)
        if self._stages >= 2:
            special = self._registered(m, special, f"nan_inf_zero{lane}_2")
            q = self._registered(m, q, f"q{lane}")
            e = self._registered(m, e, f"e{lane}")
            shared = late[2]

        if not self._need_round:
            # Exact and normal: pack the fraction below the leading one and E.
            magnitude = Cat(Const(0, man_bits - (width - 1)), q[:width - 1],
                            (e + _FP32.bias)[:_FP32.exp_bits])
            if self._stages >= 3:
                special = self._registered(m, special, f"nan_inf_zero{lane}_3")
                magnitude = self._registered(m, magnitude, f"magnitude{lane}")
                shared = late[3]
        else:
            window = max(width, _WINDOW_MIN)
            x = Cat(Const(0, window - width), q)
            if self._need_subnormal:
                # Results below 2**-126: shift right by d, collect what falls out.
                below = _FP32.min_normal_exp - e
                d = self._wire(m, shared, f"d{lane}", range(_SHIFT_MAX + 1),
                               Mux(below >= _SHIFT_MAX, _SHIFT_MAX, Mux(below > 0, below, 0)))
                shifted_out = (x & ~(Const((1 << window) - 1, window) << d)[:window]).any()
                y = self._wire(m, shared, f"y{lane}", window + 1,
                               Cat(shifted_out, x >> d))
                shifted_out, y = y[0], y[1:]
                exponent = Mux(d.any(), 0, e + _FP32.bias - 1)
            else:
                y, shifted_out, exponent = x, Const(0), e + _FP32.bias - 1
            overflow = e > _FP32.max_normal_exp
            if self._stages >= 3:
                special = self._registered(m, special, f"nan_inf_zero{lane}_3")
                y = self._registered(m, y, f"y{lane}")
                shifted_out = self._registered(m, shifted_out, f"shifted_out{lane}")
                exponent = self._registered(m, exponent[:_FP32.exp_bits], f"exponent{lane}")
                if self._need_overflow:
                    overflow = self._registered(m, overflow, f"overflow{lane}")
                shared = late[3]
            sig24 = y[window - man_bits - 1:window]
            guard = y[window - man_bits - 2]
            sticky = y[:window - man_bits - 2].any() | shifted_out
            round_up = guard & (sticky | sig24[0])
            # The hidden bit of sig24 adds the 1 that the exponent field lacks; a carry out
            # of the significand steps the exponent (up to infinity, 0x7F800000).
            magnitude = ((exponent[:_FP32.exp_bits] << man_bits) + sig24 + round_up)[:31]
            if self._need_overflow:
                magnitude = Mux(overflow, _FP32.exp_max_field << man_bits, magnitude)
        magnitude = self._wire(m, shared, f"magnitude{lane}", 31, magnitude)

        inf_code = _FP32.exp_max_field << man_bits
        return Mux(special[0], numerics.CANONICAL_NAN32,
                   Cat(Mux(special[1], inf_code, Mux(special[2], 0, magnitude)), special[3]))


#: The build the unit testbenches run: every format, ``TEST_LANES`` lanes. 16 lanes make the
#: fastest whole run on both simulators: Verilator's build grows by about 1 s of CPU per lane,
#: and on Icarus a product costs more as lanes are added (the ports are wider).
TEST_FORMATS = FORMATS
TEST_LANES = 16


def unit_test_top(*, config):
    """The unit testbenches' build (``config`` is unused: the multiplier takes formats, not
    a configuration): ``TEST_LANES`` lanes, every format."""
    return FPMultiplier(formats=TEST_FORMATS, lanes=TEST_LANES)
