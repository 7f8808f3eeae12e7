"""One processing element (PE) of the weight-stationary systolic array."""

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .fp_adder import FPAdder
from .fp_multiplier import FPMultiplier

__all__ = ["ProcessingElement"]

#: Bits of an int8 element: the integer path reads the low byte of the element registers.
_INT8_BITS = 8
#: Bits of an E8M0 scale code (the MX formats).
_SCALE_BITS = 8


def _check(in_bits, acc_bits, formats):
    """The float format names of ``formats``; raises on an invalid argument."""
    if not isinstance(formats, tuple) or not formats:
        raise TypeError(f"formats={formats!r}: must be a non-empty tuple of format names")
    for name in formats:
        if name not in numerics.TENSOR_FORMATS:
            raise ValueError(f"formats: {name!r} is not a format the PE implements (one of "
                             f"{', '.join(numerics.TENSOR_FORMATS)})")
    if len(set(formats)) != len(formats):
        raise ValueError(f"formats={formats!r}: names a format more than once")
    if "int8" not in formats:
        raise ValueError(f"formats={formats!r}: must include int8 (the integer path is "
                         "always built)")
    floats = tuple(name for name in formats if name != "int8")
    widest = max(numerics.data_format(name).bytes * 8 for name in formats)
    if in_bits < widest:
        raise ValueError(f"in_bits={in_bits}: must be at least {widest}, the width of the "
                         "widest of formats")
    if acc_bits < 2 * _INT8_BITS:
        raise ValueError(f"acc_bits={acc_bits}: must be at least {2 * _INT8_BITS} (an int8 "
                         "product)")
    if floats and acc_bits != 32:
        raise ValueError(f"acc_bits={acc_bits}: must be 32 (FP32 sums) with the float "
                         f"format {floats[0]}")
    return floats


class ProcessingElement(wiring.Component):
    """A multiply-accumulate cell with two weight registers.

    The PE holds one weight in each of two banks. A moving element arrives from the left
    with the number of the bank it is to be multiplied by and its format code; the PE passes
    them to the right and sends down, by the format (docs/numerics.md):

    * ``int8`` (code 0): ``psum_in + sext(x[7:0]) * sext(weight[7:0])``, wrapping to
      ``acc_bits`` (two's complement);
    * a float format ``F``: ``fp_add32(psum_in, fp_mul_F(weight, x))``, with ``psum_in`` and
      the result FP32 codes: the exact product rounded to FP32, then the FP32 sum, both to
      nearest even (:class:`~opentrn.hdl.fp_multiplier.FPMultiplier`,
      :class:`~opentrn.hdl.fp_adder.FPAdder`). The operands are the low bits of the element
      registers (8 for FP8 and MXFP8, 16 for BF16);
    * an MX format (``mxfp8e4m3``, ``mxfp8e5m2``): as its FP8 format, the product scaled by
      ``2**(sw + sx - 254)`` before it is rounded, with ``sw`` the E8M0 scale stored with
      the weight (in the same bank) and ``sx`` the scale that comes with the element
      (``x_scale_in``); a scale of 255 (E8M0 NaN) makes the product NaN.

    Element registers hold raw bits (``in_bits`` wide, zero-extended codes). The float
    units are built only when ``formats`` has a float format, the scale registers and ports
    only when it has an MX format; of the two paths the unused one gets zero operands
    (scales included), so it does not toggle (and simulates fast). For a format code not in
    ``formats`` the result is unspecified. Elements of the other formats ignore the scales.

    Because every moving element carries its own bank number, a new stationary tile can be
    written into one bank while the other bank's tile is still in use by elements in flight
    (background weight load); no array-wide swap is needed. The format travels with the
    element too, so consecutive elements may be of different formats.

    All registers advance only while ``enable`` is high (the array stalls as one).

    Members
    -------
    enable : ``In(1)``
        Advance the pipeline registers (``x_out``, ``bank_out``, ``format_out``,
        ``x_scale_out``, ``psum_out``) this cycle.
    x_in : ``In(unsigned(in_bits))``
        Moving element (raw bits) from the left neighbour (or the row's skew line).
    bank_in : ``In(1)``
        Weight bank that ``x_in`` is to be multiplied by.
    format_in : ``In(numerics.FORMAT_CODE_BITS)``
        Format code of ``x_in`` (and of the weight it meets).
    psum_in : ``In(signed(acc_bits))``
        Partial sum from the PE above (zero for the top row; an FP32 code for a float).
    x_out, bank_out, format_out : ``Out(...)``
        ``x_in``, ``bank_in`` and ``format_in`` registered, to the right neighbour.
    psum_out : ``Out(signed(acc_bits))``
        The multiply-accumulate above, registered, to the PE below.
    weight_we : ``In(1)``
        Write ``weight_data`` (and ``weight_scale``) into bank ``weight_bank`` this cycle
        (independent of ``enable``).
    weight_bank : ``In(1)``
    weight_data : ``In(unsigned(in_bits))``

    With an MX format in ``formats`` (only then):

    x_scale_in : ``In(8)``
        E8M0 scale code of ``x_in`` (it travels with the element).
    x_scale_out : ``Out(8)``
        ``x_scale_in`` registered, to the right neighbour.
    weight_scale : ``In(8)``
        E8M0 scale code of ``weight_data``, written with it into bank ``weight_bank``'s
        scale register.
    """

    def __init__(self, *, in_bits, acc_bits, formats=("int8",)):
        try:
            self._floats = _check(in_bits, acc_bits, formats)
        except (TypeError, ValueError):
            self._MustUse__silence = True     # refused, so it is not an unused elaboratable
            raise
        self._in_bits = in_bits
        self._acc_bits = acc_bits
        self._formats = formats
        self._mx = any(numerics.data_format(name).mx for name in formats)
        members = {
            "enable": In(1),
            "x_in": In(unsigned(in_bits)),
            "bank_in": In(1),
            "format_in": In(numerics.FORMAT_CODE_BITS),
            "psum_in": In(signed(acc_bits)),
            "x_out": Out(unsigned(in_bits)),
            "bank_out": Out(1),
            "format_out": Out(numerics.FORMAT_CODE_BITS),
            "psum_out": Out(signed(acc_bits)),
            "weight_we": In(1),
            "weight_bank": In(1),
            "weight_data": In(unsigned(in_bits)),
        }
        if self._mx:
            members.update({
                "x_scale_in": In(_SCALE_BITS),
                "x_scale_out": Out(_SCALE_BITS),
                "weight_scale": In(_SCALE_BITS),
            })
        super().__init__(members)

    @property
    def formats(self):
        return self._formats

    def elaborate(self, platform):
        m = Module()
        weights = [Signal(unsigned(self._in_bits), name=f"weight{bank}") for bank in range(2)]
        # The E8M0 scale of each bank's weight (MX formats only).
        scales = [Signal(_SCALE_BITS, name=f"weight_scale{bank}") for bank in range(2)
                  ] if self._mx else []

        with m.If(self.weight_we):
            for bank in range(2):
                with m.If(self.weight_bank == bank):
                    m.d.sync += weights[bank].eq(self.weight_data)
                    if self._mx:
                        m.d.sync += scales[bank].eq(self.weight_scale)

        weight = Signal(unsigned(self._in_bits))
        m.d.comb += weight.eq(Mux(self.bank_in, weights[1], weights[0]))
        weight_scale = Signal(_SCALE_BITS)
        if self._mx:
            m.d.comb += weight_scale.eq(Mux(self.bank_in, scales[1], scales[0]))

        # The integer path: its operands are zero while a float element passes.
        int_x = Signal(signed(_INT8_BITS))
        int_w = Signal(signed(_INT8_BITS))
        result = Signal(signed(self._acc_bits))
        is_float = Signal()
        if self._floats:
            m.d.comb += is_float.eq(self.format_in != numerics.data_format("int8").code)
        with m.If(~is_float):
            m.d.comb += [int_x.eq(self.x_in[:_INT8_BITS]), int_w.eq(weight[:_INT8_BITS])]
        # Assignment truncates to acc_bits: two's-complement wrap-around.
        int_result = self.psum_in + int_x * int_w

        if self._floats:
            m.submodules.multiplier = multiplier = FPMultiplier(formats=self._floats, lanes=1)
            m.submodules.adder = adder = FPAdder(lanes=1)
            width = multiplier.a.shape().elem_shape.width
            # The float units' operands are zero while an int8 element passes; inside one
            # condition they are one Verilog process, evaluated once per input change.
            with m.If(is_float):
                m.d.comb += [
                    multiplier.format.eq(self.format_in),
                    multiplier.a[0].eq(weight[:width]),
                    multiplier.b[0].eq(self.x_in[:width]),
                    adder.a[0].eq(self.psum_in),
                    adder.b[0].eq(multiplier.product[0]),
                ]
                if self._mx:
                    m.d.comb += [
                        multiplier.scale_a[0].eq(weight_scale),
                        multiplier.scale_b[0].eq(self.x_scale_in),
                    ]
            m.d.comb += result.eq(Mux(is_float, adder.sum[0], int_result))
        else:
            m.d.comb += result.eq(int_result)

        with m.If(self.enable):
            m.d.sync += [
                self.x_out.eq(self.x_in),
                self.bank_out.eq(self.bank_in),
                self.format_out.eq(self.format_in),
                self.psum_out.eq(result),
            ]
            if self._mx:
                m.d.sync += self.x_scale_out.eq(self.x_scale_in)
        return m
