"""One processing element (PE) of the weight-stationary systolic array."""

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics

from .delay_line import delayed
from .fp_adder import MAX_STAGES as FP_ADDER_MAX_STAGES
from .fp_adder import FPAdder
from .fp_multiplier import MAX_STAGES as FP_MULTIPLIER_MAX_STAGES
from .fp_multiplier import FPMultiplier
from .params import refusing

__all__ = ["ProcessingElement", "MAX_MACS", "MAX_MULTIPLY_STAGES", "MAX_BANKS"]

#: Bits of an int8 element: the integer path reads the low byte of the element registers.
_INT8_BITS = 8
#: The most multiply-accumulates per cycle a PE can be built for, in one format.
MAX_MACS = 16
#: The most registers between a PE's multipliers and its adders.
MAX_MULTIPLY_STAGES = 4
#: The most weight banks a PE is built with (the tensor engine uses 2 or 3).
MAX_BANKS = 4


def _check(in_bits, acc_bits, formats, macs):
    """``(float format names, {format: MACs per cycle})`` of the arguments; raises on an
    invalid one."""
    if not isinstance(formats, tuple) or not formats:
        raise TypeError(f"formats={formats!r}: must be a non-empty tuple of format names")
    for name in formats:
        if name not in numerics.TENSOR_FORMATS:
            raise ValueError(f"formats: {name!r} is not a format the PE implements (one of "
                             f"{', '.join(numerics.TENSOR_FORMATS)})")
    if len(set(formats)) != len(formats):
        raise ValueError(f"formats={formats!r}: names a format more than once")
    if not isinstance(macs, dict):
        raise TypeError(f"macs={macs!r}: must be a dict of format name: MACs per cycle")
    for name, count in macs.items():
        if name not in formats:
            raise ValueError(f"macs: {name!r} is not among formats={formats!r}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1 \
                or count & (count - 1) or count > MAX_MACS:
            raise ValueError(f"macs[{name!r}]={count!r}: must be a power of two from 1 to "
                             f"{MAX_MACS}")
    rates = {name: macs.get(name, 1) for name in formats}
    floats = tuple(name for name in formats if name != "int8")
    widest = max(rates[name] * numerics.data_format(name).bytes * 8 for name in formats)
    if in_bits < widest:
        raise ValueError(f"in_bits={in_bits}: must be at least {widest}, the width of the "
                         "widest column of formats (MACs per cycle x element bits)")
    if acc_bits < 2 * _INT8_BITS:
        raise ValueError(f"acc_bits={acc_bits}: must be at least {2 * _INT8_BITS} (an int8 "
                         "product)")
    if floats and acc_bits != 32:
        raise ValueError(f"acc_bits={acc_bits}: must be 32 (FP32 sums) with the float "
                         f"format {floats[0]}")
    return floats, rates


class ProcessingElement(wiring.Component):
    """A multiply-accumulate cell with ``banks`` weight registers (default 2), doing
    ``macs[F]`` (default 1) multiply-accumulates per cycle in format ``F``.

    The PE holds one weight column element in each of its banks (3 with the tensor engine's
    two-column fast weight load, so that a tile can load while another waits for its swap).
    A moving element arrives from the left with the number of the bank it is to be
    multiplied by and its format code; the PE passes them to the right and sends down, by
    the format (docs/numerics.md):

    * ``int8`` (code 0): ``psum_in + sum_j sext(x_j) * sext(w_j)``, wrapping to ``acc_bits``
      (two's complement);
    * a float format ``F``: ``acc = psum_in``, then ``acc = fp_add32(acc, fp_mul_F(w_j,
      x_j))`` for ``j = 0, 1, ..``: each product rounded to FP32, each sum rounded, in lane
      order (:class:`~opentrn.hdl.fp_multiplier.FPMultiplier`,
      :class:`~opentrn.hdl.fp_adder.FPAdder`);
    * an MX format (``mxfp8e4m3``, ``mxfp8e5m2``): as its FP8 format, each product scaled
      by ``2**(sw + sx - 254)`` before it is rounded, with ``sw`` the E8M0 scale stored with
      the weight (in the same bank) and ``sx`` the scale that comes with the element
      (``x_scale_in``); a scale of 255 (E8M0 NaN) makes the product NaN. All lanes of a PE
      share one scale of each operand (they are consecutive elements of one block of K).

    ``x_j`` and ``w_j``, ``j < macs[F]``, are the ``bits(F)``-bit fields ``j`` of the raw
    element registers (``in_bits`` wide, zero-extended codes, field 0 lowest): with
    ``macs[F] = r``, one PE takes ``r`` consecutive elements of the contraction dimension K
    per cycle, as Trainium's FP8 "double row" (2) and MXFP8 (4) matmuls pack them. With
    ``r = 1`` this is one multiply-accumulate of the low bits.

    The integer path is built only with ``int8`` in ``formats``, the float units only with
    a float format: lane ``j`` has a multiplier sized for the float formats with more than
    ``j`` MACs per cycle and an adder; the scale registers and ports only with an MX format.
    Of the two paths the unused one gets zero operands (scales included), and so do the
    lanes the format does not use, so they do not toggle (and simulate fast). For a format
    code not in ``formats`` the result is unspecified. Elements of the other formats ignore
    the scales.

    Because every moving element carries its own bank number, a new stationary tile can be
    written into one bank while another bank's tile is still in use by elements in flight
    (background weight load); no array-wide swap is needed. The format travels with the
    element too, so consecutive elements may be of different formats.

    With ``multiply_stages = s > 0`` the products (the integer path's and each float
    lane's, with the format they are for) pass ``s`` registers before the adders: the
    multiply of an element happens when it arrives and its accumulate ``s`` cycles later,
    with the partial sum that arrives then. ``psum_out`` is the sum ``s + 1`` cycles after
    ``x_in``, ``x_out`` still one cycle after, so an array keeps its skew of one cycle per
    row and gains ``s`` cycles of latency (docs/architecture.md, "Timing"). With ``s >= 2``
    a float lane's first register is inside its multiplier, after the significand product
    (:class:`~opentrn.hdl.fp_multiplier.FPMultiplier` ``stages``), so that the
    normalization and rounding have a cycle of their own, with ``s >= 3`` the second
    too, after the normalization (the subnormal shift and rounding then have their own
    cycle), and with ``s = 4`` the third, after the subnormal shift; one register stays
    after the whole product, which balances the multiply against the add.

    With ``add_stages = a > 0`` (every format one MAC a cycle) the float adder is cut by
    ``a`` registers (:class:`~opentrn.hdl.fp_adder.FPAdder` ``stages``) and the integer sum
    delayed as much: ``psum_out`` is the sum ``s + a + 1`` cycles after ``x_in``, so an array
    skews its rows by ``1 + a`` cycles each, for the partial sum from above to meet each
    element (:class:`~opentrn.hdl.tensor_engine.TensorEngine`).

    All registers advance only while ``enable`` is high (the array stalls as one). They
    carry data only and have no reset (``reset_less``): what is valid is tracked by the
    tensor engine, and the PE is a shared block (:mod:`opentrn.hdl.hierarchy`), one Verilog
    module however large the array.

    Members
    -------
    enable : ``In(1)``
        Advance the pipeline registers (``x_out``, ``bank_out``, ``format_out``,
        ``x_scale_out``, ``psum_out``) this cycle.
    x_in : ``In(unsigned(in_bits))``
        Moving element (raw bits) from the left neighbour (or the row's skew line).
    bank_in : ``In(range(banks))``
        Weight bank that ``x_in`` is to be multiplied by (below ``banks``).
    format_in : ``In(numerics.FORMAT_CODE_BITS)``
        Format code of ``x_in`` (and of the weight it meets).
    psum_in : ``In(signed(acc_bits))``
        Partial sum from the PE above (zero for the top row; an FP32 code for a float).
    x_out, bank_out, format_out : ``Out(...)``
        ``x_in``, ``bank_in`` and ``format_in`` registered, to the right neighbour.
    psum_out : ``Out(signed(acc_bits))``
        The multiply-accumulates above, registered, to the PE below.
    weight_we : ``In(1)``
        Write ``weight_data`` (and ``weight_scale``) into bank ``weight_bank`` this cycle
        (independent of ``enable``).
    weight_bank : ``In(range(banks))``
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

    def __init__(self, *, in_bits, acc_bits, formats=("int8",), macs=None,
                 multiply_stages=0, add_stages=0, banks=2):
        with refusing(self):
            self._floats, self._rates = _check(in_bits, acc_bits, formats,
                                               {} if macs is None else macs)
            if not isinstance(multiply_stages, int) or isinstance(multiply_stages, bool) \
                    or not 0 <= multiply_stages <= MAX_MULTIPLY_STAGES:
                raise ValueError(f"multiply_stages={multiply_stages!r}: must be an integer "
                                 f"from 0 to {MAX_MULTIPLY_STAGES}")
            if not isinstance(add_stages, int) or isinstance(add_stages, bool) \
                    or not 0 <= add_stages <= FP_ADDER_MAX_STAGES:
                raise ValueError(f"add_stages={add_stages!r}: must be an integer "
                                 f"from 0 to {FP_ADDER_MAX_STAGES}")
            packed = sorted(name for name, rate in self._rates.items() if rate > 1)
            if add_stages and packed:
                raise ValueError(f"add_stages={add_stages}: needs one MAC per cycle in every "
                                 f"format, not {self._rates[packed[0]]} in {packed[0]}")
            if not isinstance(banks, int) or isinstance(banks, bool) \
                    or not 2 <= banks <= MAX_BANKS:
                raise ValueError(f"banks={banks!r}: must be an integer from 2 to {MAX_BANKS}")
        self._stages = multiply_stages
        self._add_stages = add_stages
        self._banks = banks
        self._in_bits = in_bits
        self._acc_bits = acc_bits
        self._formats = formats
        self._mx = any(numerics.data_format(name).mx for name in formats)
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (in_bits, acc_bits, formats, tuple(sorted(self._rates.items())),
                           multiply_stages, add_stages, banks)
        members = {
            "enable": In(1),
            "x_in": In(unsigned(in_bits)),
            "bank_in": In(range(banks)),
            "format_in": In(numerics.FORMAT_CODE_BITS),
            "psum_in": In(signed(acc_bits)),
            "x_out": Out(unsigned(in_bits)),
            "bank_out": Out(range(banks)),
            "format_out": Out(numerics.FORMAT_CODE_BITS),
            "psum_out": Out(signed(acc_bits)),
            "weight_we": In(1),
            "weight_bank": In(range(banks)),
            "weight_data": In(unsigned(in_bits)),
        }
        if self._mx:
            members.update({
                "x_scale_in": In(numerics.E8M0_BITS),
                "x_scale_out": Out(numerics.E8M0_BITS),
                "weight_scale": In(numerics.E8M0_BITS),
            })
        super().__init__(members)

    @property
    def formats(self):
        return self._formats

    @property
    def macs(self):
        """Multiply-accumulates per cycle of each format, ``{name: count}``."""
        return dict(self._rates)

    def _lane_formats(self, lane):
        """The float formats whose elements use float lane ``lane``."""
        return tuple(name for name in self._floats if self._rates[name] > lane)

    def elaborate(self, platform):
        m = Module()
        banks = range(self._banks)
        weights = [Signal(unsigned(self._in_bits), name=f"weight{bank}", reset_less=True)
                   for bank in banks]
        # The E8M0 scale of each bank's weight (MX formats only).
        scales = [Signal(numerics.E8M0_BITS, name=f"weight_scale{bank}", reset_less=True)
                  for bank in banks] if self._mx else []

        with m.If(self.weight_we):
            for bank in banks:
                with m.If(self.weight_bank == bank):
                    m.d.sync += weights[bank].eq(self.weight_data)
                    if self._mx:
                        m.d.sync += scales[bank].eq(self.weight_scale)

        weight = Signal(unsigned(self._in_bits))
        weight_scale = Signal(numerics.E8M0_BITS)
        # A bank number past the last bank (never sent) reads the last bank.
        with m.Switch(self.bank_in):
            for bank in banks:
                with m.Case(bank) if bank < self._banks - 1 else m.Default():
                    m.d.comb += weight.eq(weights[bank])
                    if self._mx:
                        m.d.comb += weight_scale.eq(scales[bank])

        result = Signal(signed(self._acc_bits))
        is_float = Signal()
        if self._floats:
            m.d.comb += is_float.eq(self.format_in != numerics.data_format("int8").code)
        # The format as the adders see it, multiply_stages cycles after the multipliers.
        format_at_add = self._delayed(m, self.format_in, "format_at_add")

        # The integer path: its operands are zero while a float element passes.
        # Assignment truncates to acc_bits: two's-complement wrap-around.
        int_result = self.psum_in
        if "int8" in self._formats:
            for lane in range(self._rates["int8"]):
                int_x = Signal(signed(_INT8_BITS), name=f"int_x{lane}")
                int_w = Signal(signed(_INT8_BITS), name=f"int_w{lane}")
                field = slice(lane * _INT8_BITS, (lane + 1) * _INT8_BITS)
                with m.If(~is_float):
                    m.d.comb += [int_x.eq(self.x_in[field]), int_w.eq(weight[field])]
                int_result = int_result + self._delayed(m, int_x * int_w, f"int_product{lane}")

        # With add_stages the float adder's registers hold a sum for that many cycles more:
        # the integer sum (wrapped first) and the choice between them wait as long.
        if self._add_stages and "int8" in self._formats:
            wrapped = Signal(signed(self._acc_bits), name="int_sum")
            m.d.comb += wrapped.eq(int_result)
            int_result = self._delayed(m, wrapped, "int_sum", self._add_stages)
        if self._floats:
            float_result = self._float_lanes(m, weight, weight_scale)
            format_at_sum = self._delayed(m, format_at_add, "format_at_sum", self._add_stages)
            is_float = format_at_sum != numerics.data_format("int8").code
            if "int8" in self._formats:
                m.d.comb += result.eq(Mux(is_float, float_result, int_result))
            else:
                m.d.comb += result.eq(float_result)
        else:
            m.d.comb += result.eq(int_result)

        # Registers with no reset (see the docstring), driving the outputs.
        registers = [(self.x_out, self.x_in), (self.bank_out, self.bank_in),
                     (self.format_out, self.format_in), (self.psum_out, result)]
        if self._mx:
            registers.append((self.x_scale_out, self.x_scale_in))
        for port, value in registers:
            register = Signal.like(port, name=f"{port.name}_reg", reset_less=True)
            with m.If(self.enable):
                m.d.sync += register.eq(value)
            m.d.comb += port.eq(register)
        return m

    def _delayed(self, m, value, name, stages=None):
        """``value`` through ``stages`` (default ``multiply_stages``) registers that advance
        with ``enable`` (``value`` itself with none)."""
        return delayed(m, value, self._stages if stages is None else stages, name=name,
                       enable=self.enable)

    def _float_lanes(self, m, weight, weight_scale):
        """The float path: a multiplier and an adder per lane, the adders chained in lane
        order, ``multiply_stages`` registers between them, with two or more the first inside
        the multiplier (after its significand product, so that the normalization and
        rounding are in the next cycle), with three or more the second too (after the
        normalization), with four the third (after the subnormal shift). Returns the FP32
        code of the last active lane's sum."""
        codes = {name: numerics.data_format(name).code for name in self._floats}
        acc = self.psum_in
        for lane in range(max(self._rates[name] for name in self._floats)):
            lane_formats = self._lane_formats(lane)
            suffix = f"_{lane}" if lane else ""
            # Up to three registers inside the multiplier, one always after it.
            multiplier = FPMultiplier(formats=lane_formats, lanes=1,
                                      stages=min(max(self._stages - 1, 0),
                                                 FP_MULTIPLIER_MAX_STAGES))
            adder = FPAdder(lanes=1, stages=self._add_stages)
            m.submodules[f"multiplier{suffix}"] = multiplier
            m.submodules[f"adder{suffix}"] = adder
            # The lane is in use for the formats with more than ``lane`` MACs per cycle.
            lane_codes = [codes[name] for name in lane_formats]
            # As the adder sees it (multiply_stages after the multiplier). It gates every
            # operand bit in front of the adder's alignment: with a stage, a register of its
            # own rather than a compare of the delayed format there.
            if self._stages:
                before = self._delayed(m, self.format_in, f"lane{lane}_format",
                                       self._stages - 1)
                active = self._delayed(m, before.matches(*lane_codes), f"lane{lane}_active", 1)
            else:
                active = Signal(name=f"lane{lane}_active")
                m.d.comb += active.eq(self.format_in.matches(*lane_codes))
            # Element ``lane`` of a format of b bits is field ``lane`` of b bits: formats of
            # one width share a case. A lane's operands are zero while it is unused; inside
            # one condition they are one Verilog process, evaluated once per input change.
            widths = {}
            for name in lane_formats:
                widths.setdefault(numerics.data_format(name).element.bits, []).append(name)
            with m.Switch(self.format_in):
                for bits, names in sorted(widths.items()):
                    field = slice(lane * bits, (lane + 1) * bits)
                    with m.Case(*(codes[name] for name in names)):
                        m.d.comb += [
                            multiplier.format.eq(self.format_in),
                            multiplier.a[0].eq(weight[field]),
                            multiplier.b[0].eq(self.x_in[field]),
                        ]
                        if self._mx:
                            m.d.comb += [
                                multiplier.scale_a[0].eq(weight_scale),
                                multiplier.scale_b[0].eq(self.x_scale_in),
                            ]
            if multiplier.stages:
                m.d.comb += multiplier.enable.eq(self.enable)
            if self._add_stages:
                m.d.comb += adder.enable.eq(self.enable)
            product = self._delayed(m, multiplier.product[0], f"lane{lane}_product",
                                    self._stages - multiplier.stages)
            with m.If(active):
                m.d.comb += [adder.a[0].eq(acc), adder.b[0].eq(product)]
            if self._add_stages:
                # One lane (every rate is 1): its sum is the float result, for a float format.
                return adder.sum[0]
            lane_sum = Signal(32, name=f"lane{lane}_sum")
            m.d.comb += lane_sum.eq(Mux(active, adder.sum[0], acc))
            acc = lane_sum
        return acc
