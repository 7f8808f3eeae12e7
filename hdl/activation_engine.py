"""The activation engine: ``out = f(x * scale + bias)`` per PSUM partition, from the tensor
engine's accumulators to an SBUF format (Trainium's ``activation(scale, bias)``). Two paths,
chosen per operation by ``out_format``: the integer path (int8 / int32 results, a
fixed-point scale like Gemmini's ``acc_scale``: ``saturate(f(round((x * multiplier + bias) /
2**shift)))``) and, in a build with float formats, the float path (FP32 scale and bias, the
result cast to fp32, bf16 or fp8; docs/numerics.md)."""

from amaranth import Cat, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn import numerics
from opentrn.config import Config

from .activation_lane import ActivationLane
from .hierarchy import shared
from .params import refusing

__all__ = ["ActivationEngine", "IDENTITY", "RELU", "PARAM_BITS", "SHIFT_LIMIT", "OUT_BITS",
           "INT8_RANGE", "STAGES", "stages", "params_layout", "input_layout", "output_layout",
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
#: The datapath's pipeline stages: multiply, add bias, shift (float: the function),
#: round-activate-saturate (float: the cast). A vector accepted in cycle ``c`` is on the
#: output in cycle ``c +`` :func:`stages` (``STAGES``, and the input registers of a build).
STAGES = 4
_INT8 = numerics.data_format("int8").code
_INT32 = numerics.data_format("int32").code


def stages(config):
    """The engine's pipeline registers in a build: the datapath's :data:`STAGES`, after
    ``config.activation_input_stages`` registers of the lanes' input, with
    ``config.activation_multiply_stages`` more in the multiply and
    ``config.activation_add_stages`` in the bias add."""
    return (STAGES + config.activation_input_stages + config.activation_multiply_stages
            + config.activation_add_stages)


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
    cast) into the output register; before them ``config.activation_input_stages`` (0 to
    2) registers of the lanes' input (:class:`~opentrn.hdl.activation_lane.ActivationLane`),
    in the multiply ``config.activation_multiply_stages``
    (0 to 2) more (inside the FP32 multiplier; the integer product waits as long), and in
    the bias add ``config.activation_add_stages`` more (inside the FP32 adder; the integer
    sum waits as long). A vector accepted in cycle
    ``c`` is on ``output`` in cycle ``c +`` :func:`stages` ``(config)``; one vector per
    cycle, on either path.

    The path not selected gets zero operands, so that its logic does not toggle (which
    costs simulation time, and power). The integer path is built only when ``int8`` is an
    input format of the config (:func:`opentrn.numerics.activation_formats`).

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
        with refusing(self):
            _check_config(config)
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

        # One lane per PSUM partition: all the same block (hierarchy.shared).
        results = []
        for p in range(cfg.pe_cols):
            lane = ActivationLane(acc_bits=cfg.acc_bits, integer="int8" in cfg.dtypes,
                                  float_outputs=floats, shift_limit=SHIFT_LIMIT,
                                  out_bits=OUT_BITS, int8_range=INT8_RANGE,
                                  input_stages=cfg.activation_input_stages,
                                  multiply_stages=cfg.activation_multiply_stages,
                                  add_stages=cfg.activation_add_stages)
            m.submodules[f"lane_{p}"] = shared(lane)
            m.d.comb += [
                lane.advance.eq(advance), lane.x.eq(self.input.payload.data[p]),
                lane.is_float.eq(is_float), lane.is_int32.eq(is_int32),
                lane.function.eq(params.function), lane.multiplier.eq(params.multiplier),
                lane.shift.eq(params.shift), lane.out_format.eq(params.out_format),
                lane.bias.eq(params.bias[p]),
            ]
            results.append(lane.result)
        m.d.comb += self.output.payload.data.eq(Cat(results))

        # valid and last travel with the vector through the pipeline's registers.
        depth = stages(cfg)
        in_flight = Signal(depth)
        last = Signal(depth)
        with m.If(advance):
            m.d.sync += [
                in_flight.eq((in_flight << 1) | take),
                last.eq((last << 1) | (take & self.input.payload.last)),
            ]
        m.d.comb += [
            self.output.valid.eq(in_flight[depth - 1]),
            self.output.payload.last.eq(last[depth - 1]),
        ]
        return m
