"""cocotb testbench of the activation engine (:mod:`opentrn.hdl.activation_engine`).

A driver feeds accumulator vectors, a monitor collects output beats, and a scoreboard
compares every beat with the golden model (:mod:`opentrn.golden.activation_engine`) bit for
bit, in order, none dropped or duplicated, and, where the output is always ready, its cycle
with the documented latency. The parameters change only between operations: the bench
waits until every result of the previous operation has been taken (the pipeline is empty).

The random operations are weighted toward the corners: ties (remainder exactly half),
saturation of both formats at both ends, extreme multipliers (+-2**31), shifts 0, 1, 31, 62
and 63, negative values and relu. In a build with float formats the float path runs too
(``test_float_operations``, ``test_float_backpressure``): every float output format and
function, FP32 inputs, scales and biases weighted to the edges (zeros of both signs,
subnormals, infinities, NaNs, the largest finite values, cast ties and overflow
thresholds), with integer operations interleaved so that the path changes between
operations. The report counts what the run met.

Run it through :mod:`opentrn.sim.runner`, which passes (as environment variables):

``OPENTRN_CONFIG``    the :class:`~opentrn.config.Config` as JSON;
``OPENTRN_VECTORS``   random vectors of ``test_random_operations`` (default 2000);
``OPENTRN_BP_VECTORS``  random vectors of ``test_random_backpressure`` (default 600);
``OPENTRN_BURST``     vectors of the one operation of ``test_throughput`` (default 200);
``OPENTRN_FLOAT_VECTORS``  random vectors of ``test_float_operations`` (default 1000);
``OPENTRN_FLOAT_BP_VECTORS``  random vectors of ``test_float_backpressure`` (default 300);
``OPENTRN_SEED``      seed of the workload generator;
``OPENTRN_REPORT``    a JSON file the tests append their statistics to.
"""

import random
import zlib
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge

from opentrn import numerics
from opentrn.golden import activation_engine as golden
from opentrn.golden import fp_adder, fp_cast, fp_multiplier
from opentrn.hdl.activation_engine import (
    float_outputs,
    input_layout,
    output_layout,
    params_layout,
)

from . import harness
from .streams import PayloadCodec, StreamSink, StreamSource

#: The shifts every random run is weighted toward.
SPECIAL_SHIFTS = (0, 1, 31, 62, 63)
INT32_MIN, INT32_MAX = -(1 << (golden.PARAM_BITS - 1)), (1 << (golden.PARAM_BITS - 1)) - 1
#: The 32 bits of an output lane.
LANE_MASK = (1 << golden.OUT_BITS) - 1
#: FP32 codes the float workloads are weighted toward: zeros of both signs, infinities,
#: NaNs (quiet, signalling, negative, with payloads), the largest finite values,
#: subnormals (smallest, largest), the smallest normal, +-1, a bf16 tie (1 + 2**-8) and its
#: odd neighbour (rounds up), fp8e4m3's overflow midpoint 464 and its neighbours, fp8e5m2's
#: largest finite 57344 and its midpoint 61440, fp8 subnormal ties (2**-10, 2**-17).
FP32_EDGES = (0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
              0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001,
              0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000,
              0x43E80000, 0x43E7FFFF, 0x43E80001, 0x47600000, 0x47700000, 0xC7700000,
              0x3A800000, 0x37000000)
#: Scales of the directed float operations: 1, -1, 1.5, +-0, +-inf, NaN, the largest
#: finite value, the smallest subnormal, 2**-100 and 2**100.
FP32_SCALES = (0x3F800000, 0xBF800000, 0x3FC00000, 0x00000000, 0x80000000, 0x7F800000,
               0xFF800000, 0x7FC00000, 0x7F7FFFFF, 0x00000001, 0x0D800000, 0x71800000)


def s32(code):
    """An FP32 code as the signed 32-bit value of an s32 field or a PSUM accumulator."""
    code = int(code) & LANE_MASK
    return code - (1 << 32) if code >> 31 else code


@dataclass(frozen=True)
class Operation:
    """One operation: its parameters (``function``, ``multiplier``, ``shift``,
    ``out_format``: a name, ``bias``: one per partition) and its input, ``x[pe_cols, N]``
    (column ``n`` is beat ``n``). On the float path the multiplier, the biases and ``x``
    are FP32 codes held as signed 32-bit values, as the ports carry them."""

    params: dict
    x: np.ndarray

    def expected(self, config):
        return golden.activate(config, self.x, **self.params)

    @property
    def is_float(self):
        return self.params["out_format"] in golden.FLOAT_FORMATS

    def port_params(self):
        """The parameters as ``params_layout`` takes them: the format's code."""
        return {**self.params,
                "out_format": numerics.data_format(self.params["out_format"]).code}


def _params(function, multiplier, shift, out_int32, bias):
    return {"function": int(function), "multiplier": int(multiplier), "shift": int(shift),
            "out_format": "int32" if out_int32 else "int8", "bias": [int(b) for b in bias]}


def _float_params(function, scale, out_format, bias):
    return {"function": int(function), "multiplier": s32(scale), "shift": 0,
            "out_format": out_format, "bias": [s32(b) for b in bias]}


def _acc_range(config):
    return -(1 << (config.acc_bits - 1)), (1 << (config.acc_bits - 1)) - 1


def _columns(config, values):
    """A flat list of values as ``x[pe_cols, N]``, lane by lane, padded with zeros."""
    lanes = config.pe_cols
    values = list(values) + [0] * (-len(values) % lanes)
    return np.array(values, dtype=np.int64).reshape(-1, lanes).T


# -- workloads --------------------------------------------------------------------------------

def directed_operations(config):
    """Hand-picked corners: ties at shift 1, shift 0 with extreme biases, the extreme
    multipliers at shifts 0, 31, 62 and 63, saturation of both formats, relu."""
    lanes = config.pe_cols
    lo, hi = _acc_range(config)
    zeros = [0] * lanes
    extreme_bias = ([INT32_MAX, INT32_MIN] * lanes)[:lanes]
    mixed_bias = ([INT32_MAX, INT32_MIN, 1, -1] * lanes)[:lanes]
    edges = [lo, hi, lo + 1, hi - 1, 0, 1, -1, 2, -2, lo // 2, hi // 2]
    ops = [
        Operation(_params(golden.IDENTITY, 1, 1, 1, zeros),
                  _columns(config, [5, 7, -5, -7, 3, -3, 1, -1, 0, 2, -2, 9])),
        Operation(_params(golden.RELU, 1, 1, 0, zeros),
                  _columns(config, [5, 7, -5, -7, 3, -3, 1, -1, 255, 253, 257, -1000])),
        Operation(_params(golden.IDENTITY, 1, 0, 0, extreme_bias), _columns(config, edges)),
        Operation(_params(golden.IDENTITY, 1, 0, 1, extreme_bias), _columns(config, edges)),
    ]
    for multiplier in (INT32_MIN, INT32_MAX):
        for shift in (0, 31, 62, 63):
            for out_int32 in (0, 1):
                for function in (golden.IDENTITY, golden.RELU):
                    ops.append(Operation(
                        _params(function, multiplier, shift, out_int32,
                                mixed_bias if shift else zeros),
                        _columns(config, edges)))
    return ops


def _tie_x(config, multiplier, bias, shift, rng):
    """An accumulator ``x`` with ``x * multiplier + bias = 2**(shift-1) (mod 2**shift)``
    (a tie), or ``None`` when no ``x`` in the ``acc_bits`` range gives one."""
    lo, hi = _acc_range(config)
    modulus = 1 << shift
    target = ((1 << (shift - 1)) - bias) % modulus
    if multiplier == 0:
        return int(rng.integers(lo, hi + 1)) if target == 0 else None
    zeros = (multiplier & -multiplier).bit_length() - 1        # trailing zero bits
    if zeros >= shift:
        return int(rng.integers(lo, hi + 1)) if target == 0 else None
    if target % (1 << zeros):
        return None
    step = 1 << (shift - zeros)
    base = (target >> zeros) * pow(multiplier >> zeros, -1, step) % step
    k_lo, k_hi = -((base - lo) // step), (hi - base) // step
    if k_lo > k_hi:
        return None
    return base + int(rng.integers(k_lo, k_hi + 1)) * step


def _random_bits(rng, bits):
    """A signed value of a random magnitude: small and large ones alike."""
    width = int(rng.integers(1, bits + 1))
    value = int(rng.integers(0, 1 << (width - 1))) if width > 1 else int(rng.integers(0, 2))
    return -value if rng.random() < 0.5 else value


def random_operation(config, rng, n):
    """One operation of ``n`` vectors with random, corner-weighted parameters."""
    lanes = config.pe_cols
    lo, hi = _acc_range(config)
    roll = rng.random()
    if roll < 0.2:
        multiplier = int(rng.choice([INT32_MIN, INT32_MAX]))
    elif roll < 0.3:
        multiplier = int(rng.choice([0, 1, -1]))
    elif roll < 0.45:
        multiplier = (1 << int(rng.integers(0, 31))) * int(rng.choice([1, -1]))
    elif roll < 0.75:
        multiplier = _random_bits(rng, golden.PARAM_BITS)
    else:
        multiplier = int(rng.integers(INT32_MIN, INT32_MAX, endpoint=True))
    function, out_int32 = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    roll = rng.random()
    if roll < 0.35:
        shift = int(rng.choice(SPECIAL_SHIFTS))
    elif roll < 0.75:
        # Around the magnitude of x * multiplier less the output width: results on both
        # sides of the saturation bounds.
        out_bits = golden.OUT_BITS if out_int32 else 8
        magnitude = config.acc_bits - 1 + abs(multiplier).bit_length()
        shift = magnitude - out_bits + int(rng.integers(-4, 5))
    else:
        shift = int(rng.integers(0, golden.SHIFT_MAX + 1))
    shift = min(max(shift, 0), golden.SHIFT_MAX)

    ties = shift > 0 and rng.random() < 0.4
    # Trailing zero bits of the multiplier; 0 has them all (x * 0 = 0 modulo any 2**shift).
    zeros = (multiplier & -multiplier).bit_length() - 1 if multiplier else golden.SHIFT_MAX + 1
    bias = []
    for _ in range(lanes):
        roll = rng.random()
        if ties and zeros < shift:
            # Ties need x * m + b = half (mod 2**shift): b a multiple of 2**zeros.
            b = _random_bits(rng, golden.PARAM_BITS - zeros) << zeros
        elif ties and shift <= golden.PARAM_BITS:
            b = (1 << (shift - 1)) - int(rng.integers(0, 2)) * (1 << shift)  # half mod 2**s
        elif roll < 0.2:
            b = 0
        elif roll < 0.35:
            b = int(rng.choice([INT32_MIN, INT32_MAX]))
        else:
            b = _random_bits(rng, golden.PARAM_BITS)
        bias.append(min(max(b, INT32_MIN), INT32_MAX))

    x = np.zeros((lanes, n), dtype=np.int64)
    for p in range(lanes):
        for i in range(n):
            value = _tie_x(config, multiplier, bias[p], shift, rng) \
                if ties and rng.random() < 0.7 else None
            if value is None:
                roll = rng.random()
                if roll < 0.15:
                    value = int(rng.choice([lo, hi, 0, 1, -1]))
                elif roll < 0.5:
                    value = _random_bits(rng, config.acc_bits)
                else:
                    value = int(rng.integers(lo, hi + 1))
            x[p, i] = value
    return Operation(_params(function, multiplier, shift, out_int32, bias), x)


def burst_operation(config, rng, n):
    """One operation of ``n`` uniform random vectors whose results vary from beat to beat
    (an odd multiplier, the shift leaving about 16 bits, int32 output), so that a beat out
    of place cannot go unnoticed."""
    lo, hi = _acc_range(config)
    multiplier = int(rng.integers(INT32_MIN // 2, INT32_MAX // 2)) * 2 + 1
    shift = config.acc_bits - 1 + golden.PARAM_BITS - 1 - 16
    bias = [int(b) for b in rng.integers(INT32_MIN, INT32_MAX, config.pe_cols, endpoint=True)]
    return Operation(_params(golden.IDENTITY, multiplier, shift, 1, bias),
                     rng.integers(lo, hi + 1, (config.pe_cols, n)))


def random_operations(config, rng, vectors):
    """Random operations of 1..32 vectors (one in five of a single vector) adding up to
    ``vectors``."""
    ops, total = [], 0
    while total < vectors:
        n = 1 if rng.random() < 0.2 else int(rng.integers(1, 33))
        n = min(n, vectors - total)
        ops.append(random_operation(config, rng, n))
        total += n
    return ops


def coverage(config, operations):
    """What a workload's integer operations exercise, element by element: ties (remainder
    exactly half) that round down (``q`` even) and up (``q`` odd), saturation of each format
    at each end, relu clamping a negative value, negative inputs, the special shifts and
    extreme multipliers (by operation)."""
    counts = dict(elements=0, ties_even=0, ties_odd=0, negative_inputs=0, relu_clamped=0,
                  int8_sat_low=0, int8_sat_high=0, int32_sat_low=0, int32_sat_high=0)
    shifts, multipliers = set(), set()
    for op in operations:
        if op.is_float:
            continue
        params = op.params
        shift = params["shift"]
        shifts.add(shift)
        if params["multiplier"] in (INT32_MIN, INT32_MAX):
            multipliers.add(params["multiplier"])
        pre = golden.pre_activation(op.x, params["multiplier"], params["bias"])
        fmt = params["out_format"]
        lo, hi = golden.output_range(config, fmt)
        for (p, n), value in np.ndenumerate(pre):
            counts["elements"] += 1
            counts["negative_inputs"] += int(op.x[p, n] < 0)
            if shift and value % (1 << shift) == 1 << (shift - 1):
                counts["ties_odd" if (value >> shift) & 1 else "ties_even"] += 1
            r = golden.round_shift(value, shift)
            if params["function"] == golden.RELU and r < 0:
                counts["relu_clamped"] += 1
            a = golden.apply_function(r, params["function"])
            counts[f"{fmt}_sat_low"] += int(a < lo)
            counts[f"{fmt}_sat_high"] += int(a > hi)
    counts["special_shifts"] = sorted(shifts & set(SPECIAL_SHIFTS))
    counts["extreme_multipliers"] = sorted(multipliers)
    return counts


# -- float workloads -----------------------------------------------------------------------------

def _float_codes(rng, shape):
    """FP32 codes weighted to the corners: edge codes; moderate values (results in every
    format's normal range); magnitudes about 2**-27 .. 2**17, where the narrow formats'
    subnormal, rounding and overflow cases lie; and any code."""
    roll = rng.random(shape)
    moderate = (rng.standard_normal(shape) * 2.0 ** rng.integers(-16, 16, shape))
    moderate = moderate.astype(np.float32).view(np.uint32).astype(np.int64)
    exponent = rng.integers(100, 145, shape)
    near = (rng.integers(0, 2, shape) << 31) | (exponent << 23) | rng.integers(0, 1 << 23,
                                                                               shape)
    any_code = rng.integers(0, 1 << 32, shape)
    return np.select([roll < 0.2, roll < 0.5, roll < 0.85],
                     [rng.choice(np.array(FP32_EDGES, np.int64), shape), moderate, near],
                     any_code)


def _signed(codes):
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes >= 1 << 31, codes - (1 << 32), codes)


def directed_float_operations(config):
    """Every float output format and function with the edge codes as inputs (every lane
    meets each of them), under every directed scale; biases +0, -0 and edge values; and
    the ones that cancel ``x * 1`` to an exact zero."""
    lanes = config.pe_cols
    edges = np.array(FP32_EDGES, np.int64)
    # Each edge code in each lane: lane p takes the edges rotated by p.
    x = _signed(np.stack([np.roll(edges, p) for p in range(lanes)]))
    ops = []
    for out_format in float_outputs(config):
        for function in (golden.IDENTITY, golden.RELU):
            for index, scale in enumerate(FP32_SCALES):
                bias = ([0] * lanes, [1 << 31] * lanes,
                        [FP32_EDGES[(index + p) % len(FP32_EDGES)] for p in range(lanes)])[
                    index % 3]
                ops.append(Operation(_float_params(function, scale, out_format, bias), x))
            # x * 1 + (-x) = +0 exactly: one edge code per lane, its negation the bias.
            for start in range(0, len(FP32_EDGES), lanes):
                chunk = [FP32_EDGES[(start + p) % len(FP32_EDGES)] for p in range(lanes)]
                ops.append(Operation(
                    _float_params(function, 0x3F800000, out_format,
                                  [code ^ (1 << 31) for code in chunk]),
                    _signed(np.array(chunk, np.int64))[:, None]))
    return ops


def random_float_operation(config, rng, n):
    """One float operation of ``n`` vectors: a random float output format and function, a
    corner-weighted scale and per-lane biases (zero, edge or moderate)."""
    lanes = config.pe_cols
    out_format = str(rng.choice(float_outputs(config)))
    roll = rng.random()
    if roll < 0.3:
        scale = int(rng.choice(FP32_SCALES + FP32_EDGES))
    elif roll < 0.8:
        # A power of two near 1 with a random fraction: products on both sides of the
        # narrow formats' ranges.
        value = np.float32((1 + rng.random()) * 2.0 ** int(rng.integers(-8, 9))
                           * rng.choice([1, -1]))
        scale = int(value.view(np.uint32))
    else:
        scale = int(rng.integers(0, 1 << 32))
    bias = []
    for code in _float_codes(rng, lanes):
        roll = rng.random()
        bias.append(0 if roll < 0.3 else int(code))
    return Operation(_float_params(int(rng.integers(0, 2)), scale, out_format, bias),
                     _signed(_float_codes(rng, (lanes, n))))


def float_operations(config, rng, vectors, *, directed=True):
    """The directed float operations (when ``directed``), then random float operations of
    1..32 vectors adding up to ``vectors``, with one integer operation in four interleaved
    (the path changes between operations)."""
    ops = directed_float_operations(config) if directed else []
    total = 0
    while total < vectors:
        n = 1 if rng.random() < 0.2 else int(rng.integers(1, 33))
        n = min(n, vectors - total)
        if rng.random() < 0.25:
            ops.append(random_operation(config, rng, n))
        else:
            ops.append(random_float_operation(config, rng, n))
        total += n
    return ops


def float_coverage(config, operations):
    """What a workload's float operations exercise, element by element, from the golden
    model's steps: per output format and function; NaN, infinite, subnormal and ``-0``
    inputs; products that overflow, underflow to zero or are subnormal; sums that cancel
    to an exact zero; relu clamping; casts that tie, overflow (to infinity, or NaN in
    fp8e4m3) or give subnormals; NaN results; and integer operations interleaved."""
    counts = dict(float_elements=0, int_operations=0, nan_inputs=0, inf_inputs=0,
                  subnormal_inputs=0, negative_zero_inputs=0, product_overflow=0,
                  product_underflow=0, product_subnormal=0, exact_cancellation=0,
                  relu_clamped=0, cast_ties=0, cast_overflow=0, cast_subnormal=0,
                  nan_results=0)
    kinds = set()
    for op in operations:
        if not op.is_float:
            counts["int_operations"] += 1
            continue
        params = op.params
        fmt = params["out_format"]
        kinds.add(f"{fmt}/{golden.FUNCTIONS[params['function']]}")
        x = op.x.astype(np.int64) & LANE_MASK
        scale = params["multiplier"] & LANE_MASK
        bias = np.array(params["bias"], np.int64)[:, None] & LANE_MASK
        exp_x, frac_x = (x >> 23) & 0xFF, x & 0x7FFFFF
        product = fp_multiplier.multiply(x, scale, "fp32").astype(np.int64)
        total = fp_adder.add(product, bias).astype(np.int64)
        activated = golden.apply_function_float(total, params["function"])
        out = fp_cast.cast(activated, fmt)
        element = numerics.float_format(fmt)
        magnitude = out.astype(np.int64) & ((1 << (element.bits - 1)) - 1)
        finite_in = (exp_x != 0xFF) & ((scale >> 23) & 0xFF != 0xFF)
        finite_product = (product >> 23) & 0xFF != 0xFF
        finite_total = (total >> 23) & 0xFF != 0xFF
        nonzero_in = ((x & 0x7FFFFFFF) != 0) & ((scale & 0x7FFFFFFF) != 0)
        counts["float_elements"] += x.size
        counts["nan_inputs"] += int(np.sum((exp_x == 0xFF) & (frac_x != 0)))
        counts["inf_inputs"] += int(np.sum((exp_x == 0xFF) & (frac_x == 0)))
        counts["subnormal_inputs"] += int(np.sum((exp_x == 0) & (frac_x != 0)))
        counts["negative_zero_inputs"] += int(np.sum(x == 1 << 31))
        counts["product_overflow"] += int(np.sum(finite_in & ~finite_product))
        counts["product_underflow"] += int(np.sum(
            finite_in & nonzero_in & ((product & 0x7FFFFFFF) == 0)))
        counts["product_subnormal"] += int(np.sum(
            finite_in & ((product >> 23) & 0xFF == 0) & ((product & 0x7FFFFF) != 0)))
        counts["exact_cancellation"] += int(np.sum(
            ((product & 0x7FFFFFFF) != 0) & ((total & 0x7FFFFFFF) == 0)))
        if params["function"] == golden.RELU:
            # The sign bit set (the adder's NaN is canonical, sign 0): -0, -inf, negative.
            counts["relu_clamped"] += int(np.sum(total >> 31 == 1))
        if fmt != "fp32":
            top = element.exp_max_field << element.man_bits
            overflowed = magnitude >= top if element.has_inf else magnitude == 0x7F
            counts["cast_overflow"] += int(np.sum(finite_total & overflowed))
            # Exactly half way between two codes of the format: rounded to even.
            _, guard, sticky, _ = fp_cast.round_fields(activated, element)
            counts["cast_ties"] += int(np.sum(finite_total & (guard == 1) & (sticky == 0)))
            counts["cast_subnormal"] += int(np.sum(
                (magnitude != 0) & (magnitude < (1 << element.man_bits))))
        counts["nan_results"] += int(np.sum(magnitude == element.canonical_nan))
    counts["float_kinds"] = sorted(kinds)
    return counts


# -- the bench --------------------------------------------------------------------------------

class ActivationEngineBench:
    """Clock, reset, the input driver, the output monitor, the parameters and the
    scoreboard."""

    def __init__(self, dut, config, *, gaps=0.0, backpressure=0.0, seed=0):
        self.dut = dut
        self.config = config
        self.domain = harness.start_clock(dut)
        rng = random.Random(seed)
        self.input = StreamSource(self.domain, dut, "input", input_layout(config),
                                  gaps=gaps, rng=rng)
        self.output = StreamSink(self.domain, dut, "output", output_layout(config),
                                 backpressure=backpressure, rng=rng)
        self.params = PayloadCodec(params_layout(config))
        self.backpressure = backpressure
        self.gaps = gaps
        dut.params.value = 0

    async def reset(self):
        await harness.reset(self.dut)

    async def _drain(self, count, op_index, vectors):
        """Wait until ``count`` output beats have arrived. Watchdog: a hang becomes a
        failure with the state printed."""
        slowdown = 1 / ((1 - self.backpressure) * (1 - self.gaps))
        budget = int(8 * slowdown * vectors) + 20 * golden.latency(self.config) + 100
        if not await self.output.wait_for(count, budget * harness.CLOCK_PERIOD_NS):
            dut = self.dut
            raise AssertionError(
                f"watchdog: operation {op_index} not done after {budget} cycles; "
                f"{len(self.output.received)}/{count} output beats, "
                f"{len(self.input.queue)} input beats queued, "
                f"{len(self.input.accepted)} accepted; input valid/ready "
                f"{dut.input__valid.value}/{dut.input__ready.value}, output valid/ready "
                f"{dut.output__valid.value}/{dut.output__ready.value}, params "
                f"{self.params.decode(dut.params.value.to_unsigned())}")

    async def run(self, operations):
        """Run ``operations`` one after the other; return the expected beats."""
        expected = []
        for index, op in enumerate(operations):
            if index:
                await self._drain(len(expected), index - 1, operations[index - 1].x.shape[1])
            # The previous operation's last result has been taken: the pipeline is empty,
            # the parameters may change.
            await FallingEdge(self.dut.clk)
            assert not self.dut.output__valid.value, \
                f"operation {index}: an output beat is valid after the last expected one"
            self.dut.params.value = self.params.encode(op.port_params())
            out = op.expected(self.config)
            n = op.x.shape[1]
            for i in range(n):
                last = int(i == n - 1)
                self.input.send({"data": [int(v) for v in op.x[:, i]], "last": last})
                # The lane's 32 bits: a sign-extended integer or a zero-extended code.
                expected.append(([int(v) & LANE_MASK for v in out[:, i]], last))
        await self._drain(len(expected), len(operations) - 1, operations[-1].x.shape[1])
        # Anything extra (a duplicated beat) would arrive within the latency.
        await ClockCycles(self.dut.clk, 4 * golden.latency(self.config))
        return expected

    def score(self, expected, *, check_cycles):
        log = self.dut._log
        received = self.output.received
        if len(received) != len(expected):
            raise AssertionError(f"{len(received)} output beats, expected {len(expected)}")
        mismatches = 0
        for index, ((_, got), (want, want_last)) in enumerate(zip(received, expected,
                                                                  strict=True)):
            if [v & LANE_MASK for v in got["data"]] != want or got["last"] != want_last:
                mismatches += 1
                if mismatches <= 5:
                    log.error("beat %d: got %s last=%d, expected %s last=%d", index,
                              got["data"], got["last"], want, want_last)
        cycle_mismatches = 0
        latency = golden.latency(self.config)
        accepted = [cycle for cycle, _ in self.input.accepted]
        if check_cycles:
            for index, ((cycle_in, (cycle_out, _))) in enumerate(zip(accepted, received,
                                                                     strict=True)):
                if cycle_out - cycle_in != latency:
                    cycle_mismatches += 1
                    if cycle_mismatches <= 5:
                        log.error("beat %d: accepted in cycle %d, out in cycle %d, latency "
                                  "%d != %d", index, cycle_in, cycle_out,
                                  cycle_out - cycle_in, latency)
        stats = {"beats": len(expected), "mismatches": mismatches,
                 "cycle_mismatches": cycle_mismatches, "cycles_checked": check_cycles,
                 "latency": latency, "cycles": received[-1][0] - accepted[0] + 1}
        log.info("scoreboard: %s", stats)
        return stats


async def _run_test(dut, name, operations_of, *, gaps=0.0, backpressure=0.0, check_cycles,
                    extra=None, counted=coverage):
    config, seed = harness.config(), harness.setting("seed", 1)
    bench = ActivationEngineBench(dut, config, gaps=gaps, backpressure=backpressure,
                                  seed=seed)
    await bench.reset()
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    operations = operations_of(config, rng)
    expected = await bench.run(operations)
    stats = bench.score(expected, check_cycles=check_cycles)
    record = {"test": name, "seed": seed, "operations": len(operations),
              **counted(config, operations), **stats, **(extra(bench) if extra else {})}
    harness.report(record)
    assert stats["mismatches"] == 0, \
        f"{stats['mismatches']} output beats differ from the golden model"
    assert stats["cycle_mismatches"] == 0, \
        f"{stats['cycle_mismatches']} output beats off the documented latency"
    return record


@cocotb.test()
async def test_directed(dut):
    """Hand-picked corners, output always ready: bit-exact and cycle-exact."""
    await _run_test(dut, "directed", lambda config, rng: directed_operations(config),
                    check_cycles=True)


@cocotb.test()
async def test_random_operations(dut):
    """Random corner-weighted operations, output always ready: bit-exact, and every beat
    out exactly the latency after it went in."""
    vectors = harness.setting("vectors", 2000)
    await _run_test(dut, "random_operations",
                    lambda config, rng: random_operations(config, rng, vectors),
                    check_cycles=True)


def _stalls(bench):
    """Beats that came out later than the latency after their input: the pipeline really
    stalled under them."""
    latency = golden.latency(bench.config)
    return {"delayed_beats": sum(
        1 for (cycle_in, _), (cycle_out, _) in zip(bench.input.accepted,
                                                   bench.output.received, strict=True)
        if cycle_out - cycle_in > latency)}


@cocotb.test()
async def test_random_backpressure(dut):
    """Random operations with 30% random output back-pressure and 20% input gaps:
    bit-exact, in order, nothing dropped or duplicated."""
    vectors = harness.setting("bp_vectors", 600)
    await _run_test(dut, "random_backpressure",
                    lambda config, rng: random_operations(config, rng, vectors),
                    gaps=0.2, backpressure=0.3, check_cycles=False, extra=_stalls)


@cocotb.test()
async def test_throughput(dut):
    """One long operation, inputs back to back, output always ready: one vector accepted
    and one result out every cycle, each the latency after its input."""
    burst = harness.setting("burst", 200)

    def cadence(bench):
        accepted = [cycle for cycle, _ in bench.input.accepted]
        received = [cycle for cycle, _ in bench.output.received]
        return {"input_idle_cycles": accepted[-1] - accepted[0] + 1 - len(accepted),
                "output_idle_cycles": received[-1] - received[0] + 1 - len(received),
                "first_out_after": received[0] - accepted[0],
                "distinct_beats": len({tuple(beat["data"])
                                       for _, beat in bench.output.received})}

    record = await _run_test(
        dut, "throughput", lambda config, rng: [burst_operation(config, rng, burst)],
        check_cycles=True, extra=cadence)
    assert record["input_idle_cycles"] == 0 and record["output_idle_cycles"] == 0, record
    assert record["first_out_after"] == golden.latency(harness.config())


@cocotb.test()
async def test_float_operations(dut):
    """The float path (builds with float formats; otherwise nothing runs): the directed
    edge operations of every output format and function, then random float operations
    with integer ones interleaved, output always ready: bit-exact and cycle-exact."""
    if not float_outputs(harness.config()):
        return
    vectors = harness.setting("float_vectors", 1000)
    await _run_test(dut, "float_operations",
                    lambda config, rng: float_operations(config, rng, vectors),
                    check_cycles=True, counted=float_coverage)


@cocotb.test()
async def test_float_backpressure(dut):
    """Random float operations (integer ones interleaved) with 30% random output
    back-pressure and 20% input gaps: bit-exact, in order, nothing dropped or
    duplicated."""
    if not float_outputs(harness.config()):
        return
    vectors = harness.setting("float_bp_vectors", 300)
    await _run_test(dut, "float_backpressure",
                    lambda config, rng: float_operations(config, rng, vectors,
                                                         directed=False),
                    gaps=0.2, backpressure=0.3, check_cycles=False, extra=_stalls,
                    counted=float_coverage)
