"""cocotb testbench of the tensor engine (:mod:`opentrn.hdl.tensor_engine`).

Drivers feed stationary tiles and moving vectors (raw element bits and each vector's format
code), a monitor collects result beats, and a scoreboard compares every beat with the golden
model (:mod:`opentrn.golden.tensor_engine`, :func:`~opentrn.golden.tensor_engine.run`)
bit for bit, and, where the result stream is always ready and the inputs have no gaps, the
cycle of every beat with the documented formulas. On a build with float formats two more
tests run: random BF16/FP8/MXFP8 matmuls with the formats' edge values, and vectors of every
format (int8 among them) interleaved on one tile.

On a build with an MX format every stationary column and every moving vector carries E8M0
scales, one per block of 32 rows (random ones, weighted to 255, 0, 254, 127 and moderate
codes, whatever the format: vectors of the other formats must ignore them, and a tile of
another format stores them all the same); on a build of two blocks or more,
``test_mx_blocks`` runs a short program whose results depend on each block's own scales.

Run it through :mod:`opentrn.sim.runner`, which passes (as environment variables):

``OPENTRN_CONFIG``  the :class:`~opentrn.config.Config` as JSON;
``OPENTRN_CASES``   random matmuls of each random test (default 100);
``OPENTRN_SEED``    seed of the workload generator;
``OPENTRN_REPORT``  a JSON file the tests append their statistics to;
``OPENTRN_N``, ``OPENTRN_FRESH``, ``OPENTRN_MATMULS``  the stream of ``test_back_to_back``
(default: 24 matmuls of N = ``golden.issue_interval``, K + M without add stages, each with
a fresh tile).

A format with ``r`` multiply-accumulates per PE per cycle (``Config.pe_macs_per_cycle``)
contracts ``r x pe_rows`` elements per matmul: the programs give every matmul ``K``
(:func:`~opentrn.golden.tensor_engine.contraction`) rows of its format, and the bench packs
them into the array's rows (:func:`~opentrn.golden.tensor_engine.pack`).
"""

import dataclasses
import random
import zlib
from itertools import pairwise

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from opentrn import numerics
from opentrn.golden import tensor_engine as golden
from opentrn.hdl.tensor_engine import moving_layout, result_layout, stationary_layout

from . import harness
from .streams import StreamSink, StreamSource
from .tb_fp_multiplier import special_codes


def _settings():
    return harness.config(), harness.setting("cases", 100), harness.setting("seed", 1)


# -- workloads --------------------------------------------------------------------------------

def _int_range(config):
    """The int8 range (whatever ``in_bits``: the integer path reads its bytes)."""
    return -128, 127


def base_format(config):
    """The format of the workloads that are about timing (random, back to back): int8 when
    the build has it, else its first format."""
    return "int8" if "int8" in config.dtypes else config.dtypes[0]


def _values(config, rng, fmt, shape):
    """Random elements of ``fmt``: int8 values, or float codes (:func:`float_codes`)."""
    if fmt == "int8":
        lo, hi = _int_range(config)
        return rng.integers(lo, hi + 1, shape)
    return float_codes(rng, fmt, shape)


def directed_program(config, rng):
    """int8 extremes (a build with int8 only): zeros, all -128, all 127, mixed-sign maxima
    (K*127*127 and K*-128*-128 sums, which wrap when acc_bits is small), identity, N = 1 and
    N = moving_max, a reused tile and a tile with zero columns."""
    k_rows, m_cols, n_max = golden.contraction(config, "int8"), config.pe_cols, \
        config.moving_max
    lo, hi = _int_range(config)
    full = lambda value, n: np.full((k_rows, n), value, dtype=np.int64)  # noqa: E731
    tile = lambda value: np.full((k_rows, m_cols), value, dtype=np.int64)  # noqa: E731
    random_moving = lambda n: rng.integers(lo, hi + 1, (k_rows, n))  # noqa: E731
    partial = rng.integers(lo, hi + 1, (k_rows, m_cols))
    partial[:, m_cols // 2:] = 0
    return [
        golden.Matmul(full(0, 1), tile(0)),
        golden.Matmul(full(lo, n_max), tile(lo)),
        golden.Matmul(full(hi, n_max), tile(hi)),
        golden.Matmul(full(hi, 1), tile(lo)),
        golden.Matmul(full(lo, n_max), tile(hi)),
        golden.Matmul(random_moving(n_max), np.eye(k_rows, m_cols, dtype=np.int64)),
        golden.Matmul(full(lo, 1)),                           # reuse the identity
        golden.Matmul(random_moving(n_max), partial),
        golden.Matmul(random_moving(1), tile(hi)),
        golden.Matmul(random_moving(1), tile(lo)),            # N = 1 with a fresh tile each
        golden.Matmul(random_moving(n_max)),
    ]


def random_program(config, rng, count):
    """``count`` matmuls in :func:`base_format`: N uniform in 1..moving_max with extra
    weight on 1 and moving_max, a fresh tile 60% of the time, values uniform or, one case in
    ten, all at one extreme (int8; float: :func:`float_codes`)."""
    fmt = base_format(config)
    k_rows, m_cols, n_max = golden.contraction(config, fmt), config.pe_cols, \
        config.moving_max
    lo, hi = _int_range(config)

    def values(shape):
        if fmt == "int8" and rng.random() < 0.1:
            return np.full(shape, rng.choice([lo, hi]), dtype=np.int64)
        return _values(config, rng, fmt, shape)

    program = []
    for i in range(count):
        roll = rng.random()
        n = 1 if roll < 0.15 else n_max if roll < 0.3 else int(rng.integers(1, n_max + 1))
        fresh = i == 0 or rng.random() < 0.6
        program.append(golden.Matmul(values((k_rows, n)),
                                     values((k_rows, m_cols)) if fresh else None, fmt))
    return program


def uniform_program(config, rng, count, n, fresh, fmt=None):
    """``count`` matmuls of ``n`` vectors each in ``fmt`` (default :func:`base_format`),
    every one with a fresh tile or all reusing the first."""
    fmt = fmt or base_format(config)
    k_rows, m_cols = golden.contraction(config, fmt), config.pe_cols
    return [golden.Matmul(_values(config, rng, fmt, (k_rows, n)),
                          _values(config, rng, fmt, (k_rows, m_cols)) if fresh or i == 0
                          else None, fmt)
            for i in range(count)]


def full_program(config, rng):
    """Per format of the build, a full-size matmul with a fresh tile (``K`` =
    :func:`~opentrn.golden.tensor_engine.contraction`, ``M = pe_cols``,
    ``N = moving_max``), then one reusing it: what a kernel at full scale does. Float
    elements are finite values of moderate size and MX scales moderate (117..137), so that
    with ``K`` in the hundreds the sums are numbers that round, not NaN or infinities."""
    m_cols, n = config.pe_cols, config.moving_max
    blocks = golden.mx_blocks(config)
    program = []
    for fmt in config.dtypes:
        k_rows = golden.contraction(config, fmt)

        def values(shape, fmt=fmt):
            if fmt == "int8":
                return _values(config, rng, fmt, shape)
            element = numerics.data_format(fmt).element
            finite = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
            return numerics.to_bits(finite.astype(np.float32), element).astype(np.int64)

        scales = {}
        if blocks:
            scales = {"scale_moving": rng.integers(117, 138, (blocks, n)),
                      "scale_stationary": rng.integers(117, 138, (blocks, m_cols))}
        program.append(golden.Matmul(values((k_rows, n)), values((k_rows, m_cols)), fmt,
                                     **scales))
        if blocks:
            scales = {"scale_moving": rng.integers(117, 138, (blocks, n))}
        program.append(golden.Matmul(values((k_rows, n)), None, fmt, **scales))
    return program


def float_codes(rng, fmt, shape):
    """Codes of the float format ``fmt``: 15% the format's edge values (zeros of both signs,
    smallest and largest subnormal, smallest normal, one, max finite, infinities, NaNs),
    10% uniformly random codes, the rest values of moderate size (so that sums cancel and
    round)."""
    element = numerics.data_format(fmt).element
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
    codes = numerics.to_bits(values.astype(np.float32), element).astype(np.int64)
    roll = rng.random(shape)
    return np.select([roll < 0.15, roll < 0.25],
                     [rng.choice(special_codes(element), shape),
                      rng.integers(0, 1 << element.bits, shape)], codes)


def tie_program(config, fmt):
    """FP32 sums that are exact ties, in the array's order: ``2**16 + 2**-7`` (odd last
    bit) plus ``2**-8`` rounds up to ``2**16 + 2**-6``; ``2**16 + 2**-8`` rounds down to
    ``2**16`` (the products ``2**8 * 2**8``, ``2**-3 * 2**-4``, ``2**-4 * 2**-4`` are exact
    in every float format here). Column 2 subtracts to exactly zero (vector 1), column 3
    is +0 (vector 0) and max finite squared (vector 1: infinity in BF16; FP8 products stay
    finite). An MX format has stationary scales 130 and moving scales 124 (unscaled
    products)."""
    element = numerics.data_format(fmt).element
    k_rows, m_cols = golden.contraction(config, fmt), config.pe_cols
    code = lambda value: int(numerics.to_bits(np.float32(value), element))  # noqa: E731
    tile = np.zeros((k_rows, m_cols), dtype=np.int64)
    moving = np.zeros((k_rows, 2), dtype=np.int64)
    columns = [[2.0**8, 2.0**-3, 2.0**-4], [2.0**8, 0.0, 2.0**-4], [2.0**8, -(2.0**8), 1.0]]
    for col, weights in enumerate(columns[:m_cols]):
        tile[:3, col] = [code(w) for w in weights]
    moving[:3, 0] = [code(2.0**8), code(2.0**-4), code(2.0**-4)]
    moving[:3, 1] = [code(2.0**8), code(2.0**8), 0]
    if k_rows > 3 and m_cols > 3:
        # Row 3 meets zeros in the other columns (and column 3 meets zeros elsewhere).
        tile[3, 3] = element.max_finite_bits
        moving[3, 1] = element.max_finite_bits
    scales = {}
    if numerics.data_format(fmt).mx:
        # 2**3 * 2**-3: the products are unscaled, so the ties stay ties.
        blocks = golden.mx_blocks(config)
        scales = {"scale_stationary": np.full((blocks, m_cols), 130),
                  "scale_moving": np.full((blocks, 2), 124)}
    return [golden.Matmul(moving, tile, fmt, **scales)]


def float_program(config, rng, count):
    """The ties of :func:`tie_program` for every float format of ``config`` (the MX ones
    included), then ``count`` random matmuls: a float format at random, N as in
    :func:`random_program`, a fresh tile 60% of the time (a reused one keeps its format),
    codes of :func:`float_codes`, one tile in ten all of one edge value (scales: see
    :func:`with_scales`)."""
    floats = numerics.float_formats(config)
    m_cols, n_max = config.pe_cols, config.moving_max
    program = [op for fmt in floats for op in tie_program(config, fmt)]
    fmt = None
    for i in range(count):
        roll = rng.random()
        n = 1 if roll < 0.15 else n_max if roll < 0.3 else int(rng.integers(1, n_max + 1))
        fresh = i == 0 or rng.random() < 0.6
        tile = None
        if fresh:
            fmt = str(rng.choice(floats))
            k_rows = golden.contraction(config, fmt)
            tile = float_codes(rng, fmt, (k_rows, m_cols))
            if rng.random() < 0.1:
                edge = special_codes(numerics.data_format(fmt).element)
                tile[:] = rng.choice(edge)
        program.append(golden.Matmul(float_codes(rng, fmt, (k_rows, n)), tile, fmt))
    return program


def mixed_program(config, rng, count):
    """``count`` matmuls of one to three vectors in formats of ``config.dtypes`` chosen
    per matmul, int8 among them (one float operand in ten all +0): a fresh tile (of a
    random format) one time in five, else the tile in use, whatever format it was loaded
    as (its raw bits meet the vectors' format: legal in the array, refused by the tensor
    unit)."""
    m_cols = config.pe_cols

    def values(fmt, shape):
        if fmt != "int8" and rng.random() < 0.1:
            return np.zeros(shape, dtype=np.int64)    # +0 codes: a zero result
        return _values(config, rng, fmt, shape)

    program = []
    for i in range(count):
        fmt = str(rng.choice(config.dtypes))
        k_rows = golden.contraction(config, fmt)
        tile = values(fmt, (k_rows, m_cols)) if i == 0 or rng.random() < 0.2 else None
        program.append(golden.Matmul(values(fmt, (k_rows, int(rng.integers(1, 4)))), tile,
                                     fmt))
    return program


#: E8M0 codes at the edges: the NaN, the smallest, the largest, 2**0 (and 1, the smallest
#: above 0). Every MX workload is weighted to them.
EDGE_SCALES = (255, 0, 254, 127, 1)


def scale_codes(rng, shape):
    """Random E8M0 scale codes: 6% 255 (NaN), 10% 0, 10% 254, 15% 127 (``2**0``), 4% 1,
    5% uniform, the other 50% moderate (117..137: products of ordinary size)."""
    roll = rng.random(shape)
    return np.select([roll < 0.06, roll < 0.16, roll < 0.26, roll < 0.41, roll < 0.45,
                      roll < 0.5],
                     [255, 0, 254, 127, 1, rng.integers(0, 256, shape)],
                     rng.integers(117, 138, shape)).astype(np.int64)


def with_scales(config, rng, program):
    """``program`` with the scales the array is given on a build with an MX format
    (:class:`~opentrn.golden.tensor_engine.Matmul`): :func:`scale_codes` for every matmul
    and fresh tile that has none, whatever its format. Unchanged on other builds."""
    blocks = golden.mx_blocks(config)
    if not blocks:
        return program
    scaled = []
    for op in program:
        changes = {}
        if op.scale_moving is None:
            changes["scale_moving"] = scale_codes(rng, (blocks, op.moving.shape[1]))
        if op.stationary is not None and op.scale_stationary is None:
            changes["scale_stationary"] = scale_codes(rng, (blocks, op.stationary.shape[1]))
        scaled.append(dataclasses.replace(op, **changes))
    return scaled


def block_program(config, rng):
    """On a build of two MX blocks or more, in the build's first MX format: matmuls whose
    results depend on the scales of every block (distinct per block), and on the scales of
    the vector that is in each row at the time (distinct per vector):

    * a tile of ones with scales distinct per block and column; vectors of ones in one
      block's rows only, ones everywhere, zeros with the E8M0 NaN in the last block only,
      ones in block 0 with 0 and 254 elsewhere;
    * that tile reused by vectors of random finite values with moderate scales;
    * an int8 tile and int8 vectors (their scales, edge codes, ignored), then MX vectors
      meeting the int8 tile's raw bits (no NaN code among them) and stored scales;
    * a fresh tile of random finite values, eight vectors, moderate scales and edge ones
    (a short program: a 64-row build is slow to simulate)."""
    fmt = next(f.name for f in numerics.matmul_formats(config) if f.mx)
    k_rows, m_cols, n = golden.contraction(config, fmt), config.pe_cols, \
        min(config.moving_max, 8)
    blocks = golden.mx_blocks(config)
    element = numerics.data_format(fmt).element
    one = int(numerics.to_bits(np.float32(1.0), element))
    block_of = np.arange(k_rows) // numerics.MX_BLOCK

    def moderate(cols):
        """Moderate scales (117..137), distinct in every column."""
        first = rng.integers(117, 138, cols)
        steps = np.stack([rng.permutation(np.arange(1, 21))[:blocks - 1] for _ in range(cols)],
                         axis=1)
        return np.concatenate([first[None, :], (first - 117 + steps) % 21 + 117])

    def finite(shape):
        """Codes of values of moderate size (no zero, infinity or NaN)."""
        values = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
        return numerics.to_bits(values.astype(np.float32), element).astype(np.int64)

    tile = np.full((k_rows, m_cols), one, dtype=np.int64)
    tile_scales = 120 + 5 * np.arange(blocks)[:, None] + np.arange(m_cols)[None, :]
    vectors = [np.where(block_of == block, one, 0) for block in range(blocks)]
    scales = [moderate(1)[:, 0] for _ in range(blocks)]
    vectors += [np.full(k_rows, one), np.zeros(k_rows, dtype=np.int64),
                np.where(block_of == 0, one, 0)]
    scales += [moderate(1)[:, 0], np.array([127] * (blocks - 1) + [255]),
               np.array([0] + [254] * (blocks - 1))]
    # int8 where the build has it, else the other FP8 format: raw bits the MX vectors meet.
    other = "int8" if "int8" in config.dtypes else \
        {"mxfp8e4m3": "fp8e5m2", "mxfp8e5m2": "fp8e4m3"}[fmt]
    k_other = golden.contraction(config, other)
    other_tile = rng.integers(-128, 127, (k_other, m_cols))    # not 0x7F ...
    other_tile[other_tile == -1] = 1                            # ... nor 0xFF: NaN in E4M3
    other_vectors = rng.integers(-128, 128, (k_other, 3))
    if other != "int8":
        other_tile &= 0x7E                          # positive finite codes, no 0x7F NaN
        other_vectors &= 0xFF
    return [
        golden.Matmul(np.stack(vectors, axis=1), tile, fmt,
                      scale_moving=np.stack(scales, axis=1), scale_stationary=tile_scales),
        golden.Matmul(finite((k_rows, 6)), None, fmt, scale_moving=moderate(6)),
        golden.Matmul(other_vectors, other_tile, other,
                      scale_moving=rng.choice(EDGE_SCALES, (blocks, 3)),
                      scale_stationary=moderate(m_cols)),
        golden.Matmul(finite((k_rows, 3)), None, fmt, scale_moving=moderate(3)),
        golden.Matmul(finite((k_rows, n)), finite((k_rows, m_cols)), fmt,
                      scale_moving=np.where(rng.random((blocks, n)) < 0.2,
                                            scale_codes(rng, (blocks, n)), moderate(n)),
                      scale_stationary=moderate(m_cols)),
    ]


def block_sensitivity(config, program):
    """How many result beats of ``program`` would differ if the array got the MX blocks
    wrong: ``stationary`` (every row takes block 0's stationary scales), ``moving`` (every
    row takes block 0's moving scales) and ``skew`` (the rows past block 0 take the scales
    of the previous vector)."""
    def variant(change):
        return [dataclasses.replace(op, **change(op)) for op in program]

    def block0(scales):
        return None if scales is None else np.repeat(scales[:1], len(scales), axis=0)

    def late(scales):
        shifted = scales.copy()
        shifted[1:, 1:] = scales[1:, :-1]
        return shifted

    reference = golden.run(config, program)
    counts = {}
    for name, change in (
            ("stationary", lambda op: {"scale_stationary": block0(op.scale_stationary)}),
            ("moving", lambda op: {"scale_moving": block0(op.scale_moving)}),
            ("skew", lambda op: {"scale_moving": late(op.scale_moving)})):
        results = golden.run(config, variant(change))
        counts[name] = sum(int(np.sum(np.any(a != b, axis=0)))
                           for a, b in zip(results, reference, strict=True))
    return counts


def result_classes(codes):
    """How many FP32 result codes are NaN, infinite, zero, subnormal."""
    codes = np.asarray(codes, dtype=np.int64) & 0xFFFF_FFFF
    exponent, fraction = (codes >> 23) & 0xFF, codes & 0x7F_FFFF
    return {"nan": int(np.sum((exponent == 0xFF) & (fraction != 0))),
            "inf": int(np.sum((exponent == 0xFF) & (fraction == 0))),
            "zero": int(np.sum((codes & 0x7FFF_FFFF) == 0)),
            "subnormal": int(np.sum((exponent == 0) & (fraction != 0)))}


# -- the bench --------------------------------------------------------------------------------

class TensorEngineBench:
    """Clock, reset, the three stream agents and the scoreboard."""

    def __init__(self, dut, config, *, gaps=0.0, backpressure=0.0, seed=0):
        self.dut = dut
        self.config = config
        self.domain = harness.start_clock(dut)
        rng = random.Random(seed)
        self.stationary = StreamSource(self.domain, dut, "stationary", stationary_layout(config),
                                       gaps=gaps, rng=rng)
        self.moving = StreamSource(self.domain, dut, "moving", moving_layout(config),
                                   gaps=gaps, rng=rng)
        self.result = StreamSink(self.domain, dut, "result", result_layout(config),
                                 backpressure=backpressure, rng=rng)

    async def reset(self):
        await harness.reset(self.dut)

    async def run(self, program, *, check_cycles):
        """Run ``program`` and return its statistics; raises on any mismatch or a hang."""
        config = self.config
        timing = golden.schedule(config, program)
        outs = golden.run(config, program)      # also checks the programs' scales
        mx = golden.mx_blocks(config) > 0
        expected = []
        self.float_results, self.mx_results = [], []
        self.mx_scales = dict.fromkeys(EDGE_SCALES, 0)
        for op, out in zip(program, outs, strict=True):
            if op.stationary is not None:
                # Raw bits in the weight registers, whatever format the vectors have.
                tile = golden.pack(config, op.stationary, op.format)
                per_beat = config.load_columns
                for first in range(0, config.pe_cols, per_beat):
                    columns = range(first, first + per_beat)
                    beat = {"data": [int(v) for m in columns for v in tile[:, m]]}
                    if mx:
                        beat["scale"] = [int(v) for m in columns
                                         for v in op.scale_stationary[:, m]]
                    self.stationary.send(beat)
                tile_scales = op.scale_stationary
            moving = golden.pack(config, op.moving, op.format)
            fmt = numerics.data_format(op.format)
            if op.format != "int8":
                self.float_results.append(out.ravel())
            if fmt.mx:
                self.mx_results.append(out.ravel())
                for scale in EDGE_SCALES:
                    self.mx_scales[scale] += int(np.sum(op.scale_moving == scale)
                                                 + np.sum(tile_scales == scale))
            n = op.moving.shape[1]
            for i in range(n):
                beat = {"data": [int(v) for v in moving[:, i]], "format": fmt.code,
                        "swap": int(op.stationary is not None and i == 0),
                        "last": int(i == n - 1)}
                if mx:
                    beat["scale"] = [int(v) for v in op.scale_moving[:, i]]
                self.moving.send(beat)
                expected.append((out[:, i], int(i == n - 1)))

        # Watchdog: a hang becomes a failure with the stream states printed.
        budget = 8 * timing.total_cycles + 200
        if not await self.result.wait_for(len(expected), budget * harness.CLOCK_PERIOD_NS):
            raise AssertionError(
                f"watchdog: not done after {budget} cycles; "
                f"{len(self.result.received)}/{len(expected)} results, "
                f"stationary queue {len(self.stationary.queue)}, "
                f"moving queue {len(self.moving.queue)}")
        await ClockCycles(self.dut.clk, 2 * golden.latency(config))
        return self._score(program, expected, timing, check_cycles)

    def _score(self, program, expected, timing, check_cycles):
        log = self.dut._log
        received = self.result.received
        mismatches = 0
        # The result lanes are signed acc_bits fields; FP32 codes compare as their bits.
        mask = (1 << self.config.acc_bits) - 1
        if len(received) != len(expected):
            raise AssertionError(f"{len(received)} result beats, expected {len(expected)}")
        for index, ((_, got), (want, want_last)) in enumerate(zip(received, expected,
                                                                  strict=True)):
            if [v & mask for v in got["data"]] != [int(v) & mask for v in want] \
                    or got["last"] != want_last:
                mismatches += 1
                if mismatches <= 5:
                    log.error("beat %d: got %s last=%d, expected %s last=%d", index,
                              got["data"], got["last"], list(map(int, want)), want_last)

        origin = self.stationary.accepted[0][0]
        first, last = origin, received[-1][0]
        cycle_mismatches = 0
        if check_cycles:
            predicted = [c for beats in timing.result_cycles for c in beats]
            measured = [cycle - origin for cycle, _ in received]
            for index, (got, want) in enumerate(zip(measured, predicted, strict=True)):
                if got != want:
                    cycle_mismatches += 1
                    if cycle_mismatches <= 5:
                        log.error("beat %d: at cycle %d, formula says %d", index, got, want)
        cycles = last - first + 1
        # The moving stream's occupancy from its first to its last vector: the array's
        # steady-state utilization, without the first load and the final drain.
        accepted = [cycle for cycle, _ in self.moving.accepted]
        idle = sum(b - a - 1 for a, b in pairwise(accepted))
        macs = sum(op.moving.shape[0] * self.config.pe_cols * op.moving.shape[1]
                   for op in program)
        stats = {
            "cases": len(program), "beats": len(expected), "mismatches": mismatches,
            "cycle_mismatches": cycle_mismatches, "cycles_checked": check_cycles,
            "cycles": cycles, "macs": macs,
            "utilization": macs / (cycles * self.config.peak_macs_per_cycle),
            "moving_idle_cycles": idle,
            "steady_utilization": len(accepted) / (accepted[-1] - accepted[0] + 1),
            "formats": sorted({op.format for op in program}),
        }
        if self.float_results:
            stats["float_results"] = result_classes(np.concatenate(self.float_results))
        if self.mx_results:
            # The MX matmuls alone: their results and how often each edge scale met them
            # (moving scales and the tile's stored scales).
            stats["mx_results"] = result_classes(np.concatenate(self.mx_results))
            stats["mx_scales"] = {str(code): count for code, count in self.mx_scales.items()}
        log.info("scoreboard: %s", stats)
        return stats


async def _run_test(dut, name, program_of, *, gaps=0.0, backpressure=0.0, check_cycles,
                    extra=None):
    config, cases, seed = _settings()
    bench = TensorEngineBench(dut, config, gaps=gaps, backpressure=backpressure, seed=seed)
    await bench.reset()
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    program = with_scales(config, rng, program_of(config, rng, cases))
    if callable(extra):
        extra = extra(config, program)
    stats = await bench.run(program, check_cycles=check_cycles)
    harness.report({"test": name, "seed": seed, **(extra or {}), **stats})
    assert stats["mismatches"] == 0, \
        f"{stats['mismatches']} result beats differ from the golden model"
    assert stats["cycle_mismatches"] == 0, \
        f"{stats['cycle_mismatches']} result beats off the documented cycle formulas"


@cocotb.test()
async def test_extremes(dut):
    """Directed int8 extremes, always ready: bit-exact and cycle-exact. Only on a build with
    int8 (the float tests have the float formats' edge values)."""
    config, _, _ = _settings()
    if "int8" not in config.dtypes:
        return
    await _run_test(dut, "extremes", lambda config, rng, cases: directed_program(config, rng),
                    check_cycles=True)


@cocotb.test()
async def test_full_matmuls(dut):
    """Full-size matmuls in every format of the build (:func:`full_program`: a fresh tile,
    then the tile reused), always ready: bit-exact and cycle-exact."""
    await _run_test(dut, "full_matmuls", lambda config, rng, cases: full_program(config, rng),
                    check_cycles=True)


@cocotb.test()
async def test_random_workload(dut):
    """Back-to-back random matmuls with background weight loads, always ready: bit-exact
    and cycle-exact. This is the workload of ``opentrn demo``."""
    await _run_test(dut, "random_workload",
                    lambda config, rng, cases: random_program(config, rng, cases),
                    check_cycles=True)


@cocotb.test()
async def test_random_backpressure(dut):
    """Random matmuls with random result back-pressure and input gaps: bit-exact, in order,
    nothing dropped or duplicated."""
    await _run_test(dut, "random_backpressure",
                    lambda config, rng, cases: random_program(config, rng, cases),
                    gaps=0.2, backpressure=0.3, check_cycles=False)


@cocotb.test()
async def test_back_to_back(dut):
    """Back-to-back matmuls of one N, cycle-exact. With a fresh tile every matmul and
    N >= ``golden.issue_interval`` (K + (K - 1) A + M; M + 1 with ``fast_weight_load = 1``;
    M / 2 with 2; the default N), or with a reused tile, the background weight load keeps
    the moving stream busy: not one idle cycle between matmuls."""
    config, _, _ = _settings()
    n = harness.setting("n", golden.issue_interval(config, 1, fresh=True))
    await _back_to_back(dut, "back_to_back", config, min(n, config.moving_max),
                        fresh=harness.setting("fresh", 1) != 0,
                        count=harness.setting("matmuls", 24))


@cocotb.test()
async def test_back_to_back_reused(dut):
    """Back-to-back single-vector matmuls against one tile: one vector every cycle."""
    config, _, _ = _settings()
    await _back_to_back(dut, "back_to_back_reused", config, 1, fresh=False, count=40)


@cocotb.test()
async def test_float_random(dut):
    """BF16, FP8 E4M3, FP8 E5M2 and MXFP8 matmuls (exact ties first, then random ones with
    the formats' edge values and, for MX, random scales), always ready: bit-exact and
    cycle-exact. Only on a build with float formats."""
    config, _, _ = _settings()
    if not numerics.float_formats(config):
        return
    await _run_test(dut, "float_random",
                    lambda config, rng, cases: float_program(config, rng, cases),
                    check_cycles=True)


@cocotb.test()
async def test_mixed_formats(dut):
    """Vectors of every format of the build, int8 among them, interleaved on shared tiles,
    with random back-pressure and input gaps: bit-exact (the format travels with every
    vector through the array). Only on a build with float formats."""
    config, _, _ = _settings()
    if not numerics.float_formats(config):
        return
    await _run_test(dut, "mixed_formats",
                    lambda config, rng, cases: mixed_program(config, rng, cases),
                    gaps=0.2, backpressure=0.3, check_cycles=False)


@cocotb.test()
async def test_mx_blocks(dut):
    """On a build of two MX blocks or more (only there): :func:`block_program`, always
    ready, bit-exact and cycle-exact; the record says how many beats would differ if the
    array took block 0's stationary or moving scales for every row, or a row past block 0
    the scales of the previous vector (:func:`block_sensitivity`)."""
    config, _, _ = _settings()
    if golden.mx_blocks(config) < 2:
        return
    await _run_test(dut, "mx_blocks", lambda config, rng, cases: block_program(config, rng),
                    check_cycles=True,
                    extra=lambda config, program: {
                        "block_sensitivity": block_sensitivity(config, program)})


async def _back_to_back(dut, name, config, n, *, fresh, count):
    await _run_test(dut, name,
                    lambda config, rng, cases: uniform_program(config, rng, count, n, fresh),
                    check_cycles=True, extra={"n": n, "fresh": fresh})
    stats = harness.last_report()
    if not fresh or n >= golden.issue_interval(config, 1, fresh=True):
        assert stats["moving_idle_cycles"] == 0, \
            f"{stats['moving_idle_cycles']} idle cycles between back-to-back matmuls"
