"""cocotb testbench of the activation engine (:mod:`opentrn.hdl.activation_engine`).

A driver feeds accumulator vectors, a monitor collects output beats, and a scoreboard
compares every beat with the golden model (:mod:`opentrn.golden.activation_engine`) bit for
bit, in order, none dropped or duplicated, and, where the output is always ready, its cycle
with the documented latency. The parameters change only between operations: the bench
waits until every result of the previous operation has been taken (the pipeline is empty).

The random operations are weighted toward the corners: ties (remainder exactly half),
saturation of both formats at both ends, extreme multipliers (+-2**31), shifts 0, 1, 31, 62
and 63, negative values and relu. The report counts what the run met.

Run it through :mod:`opentrn.sim.runner`, which passes (as environment variables):

``OPENTRN_CONFIG``    the :class:`~opentrn.config.Config` as JSON;
``OPENTRN_VECTORS``   random vectors of ``test_random_operations`` (default 2000);
``OPENTRN_BP_VECTORS``  random vectors of ``test_random_backpressure`` (default 600);
``OPENTRN_BURST``     vectors of the one operation of ``test_throughput`` (default 200);
``OPENTRN_SEED``      seed of the workload generator;
``OPENTRN_REPORT``    a JSON file the tests append their statistics to.
"""

import random
import zlib
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge

from opentrn.golden import activation_engine as golden
from opentrn.hdl.activation_engine import input_layout, output_layout, params_layout

from . import harness
from .streams import PayloadCodec, StreamSink, StreamSource

#: The shifts every random run is weighted toward.
SPECIAL_SHIFTS = (0, 1, 31, 62, 63)
INT32_MIN, INT32_MAX = -(1 << (golden.PARAM_BITS - 1)), (1 << (golden.PARAM_BITS - 1)) - 1


@dataclass(frozen=True)
class Operation:
    """One operation: its parameters (``function``, ``multiplier``, ``shift``,
    ``out_int32``, ``bias``: one per partition) and its input, ``x[pe_cols, N]`` (column
    ``n`` is beat ``n``)."""

    params: dict
    x: np.ndarray

    def expected(self, config):
        return golden.activate(config, self.x, **self.params)


def _params(function, multiplier, shift, out_int32, bias):
    return {"function": int(function), "multiplier": int(multiplier), "shift": int(shift),
            "out_int32": int(out_int32), "bias": [int(b) for b in bias]}


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
        out_bits = golden.OUT_BITS if out_int32 else config.in_bits
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
    """What a workload exercises, element by element: ties (remainder exactly half) that
    round down (``q`` even) and up (``q`` odd), saturation of each format at each end, relu
    clamping a negative value, negative inputs, the special shifts and extreme multipliers
    (by operation)."""
    counts = dict(elements=0, ties_even=0, ties_odd=0, negative_inputs=0, relu_clamped=0,
                  int8_sat_low=0, int8_sat_high=0, int32_sat_low=0, int32_sat_high=0)
    shifts, multipliers = set(), set()
    for op in operations:
        params = op.params
        shift = params["shift"]
        shifts.add(shift)
        if params["multiplier"] in (INT32_MIN, INT32_MAX):
            multipliers.add(params["multiplier"])
        pre = golden.pre_activation(op.x, params["multiplier"], params["bias"])
        lo, hi = golden.output_range(config, params["out_int32"])
        fmt = "int32" if params["out_int32"] else "int8"
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
            self.dut.params.value = self.params.encode(op.params)
            out = op.expected(self.config)
            n = op.x.shape[1]
            for i in range(n):
                last = int(i == n - 1)
                self.input.send({"data": [int(v) for v in op.x[:, i]], "last": last})
                expected.append(([int(v) for v in out[:, i]], last))
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
            if got["data"] != want or got["last"] != want_last:
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
                    extra=None):
    config, seed = harness.config(), harness.setting("seed", 1)
    bench = ActivationEngineBench(dut, config, gaps=gaps, backpressure=backpressure,
                                  seed=seed)
    await bench.reset()
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    operations = operations_of(config, rng)
    expected = await bench.run(operations)
    stats = bench.score(expected, check_cycles=check_cycles)
    record = {"test": name, "seed": seed, "operations": len(operations),
              **coverage(config, operations), **stats, **(extra(bench) if extra else {})}
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


@cocotb.test()
async def test_random_backpressure(dut):
    """Random operations with 30% random output back-pressure and 20% input gaps:
    bit-exact, in order, nothing dropped or duplicated."""
    vectors = harness.setting("bp_vectors", 600)

    def stalls(bench):
        # Beats that came out later than the latency after their input: the pipeline
        # really stalled under them.
        latency = golden.latency(bench.config)
        return {"delayed_beats": sum(
            1 for (cycle_in, _), (cycle_out, _) in zip(bench.input.accepted,
                                                       bench.output.received, strict=True)
            if cycle_out - cycle_in > latency)}

    await _run_test(dut, "random_backpressure",
                    lambda config, rng: random_operations(config, rng, vectors),
                    gaps=0.2, backpressure=0.3, check_cycles=False, extra=stalls)


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
