"""cocotb testbench of the FP32 cast (:mod:`opentrn.hdl.fp_cast`, top ``fp_cast``): every
lane's result compared as an integer with the golden model (:mod:`opentrn.golden.fp_cast`).

The unit is combinational: each step drives ``format`` and all lanes of ``a`` as one packed
integer, waits 1 ns and reads the packed ``result``. Two tests:

* ``round_trips``: every bf16, fp8e4m3 and fp8e5m2 code, widened exactly to FP32, cast back
  to its own format; and every bf16 code widened to FP32 cast to each FP8 format;
* ``random``: FP32 codes weighted toward the corners of each narrow format
  (:func:`weighted_codes`: rounding boundaries and exact ties, subnormal results, the
  overflow thresholds, infinities, NaNs of any payload, both signs), spread over the three
  narrow formats, and some for the fp32 identity.

The report counts what each run met (:func:`coverage`). Environment (set by
:func:`opentrn.sim.runner.run`):

``OPENTRN_VECTORS``   random FP32 codes of ``random`` for the narrow formats, evenly
                      (default 1_008_000), and a sixteenth as many for the fp32 identity;
``OPENTRN_SEED``      seed of the generator;
``OPENTRN_REPORT``    a JSON file the tests append their statistics to.
"""

import time
import zlib

import cocotb
import numpy as np
from cocotb.triggers import Timer

from opentrn import numerics
from opentrn.golden import fp_cast as golden
from opentrn.hdl.fp_cast import TEST_LANES

from . import harness

#: The output formats narrower than FP32.
NARROW = ("bf16", "fp8e4m3", "fp8e5m2")
_FP32 = numerics.FP32


# -- workloads --------------------------------------------------------------------------------

def widen(codes, fmt):
    """The FP32 codes of the values of ``fmt`` codes (exact)."""
    return numerics.from_bits(codes, fmt).view(np.uint32)


def round_trip_batches():
    """``(format, fp32 codes)`` pairs: every code of each narrow format, widened, back to
    itself; every bf16 code widened, to each FP8 format."""
    bf16 = widen(np.arange(1 << 16), "bf16")
    batches = [("bf16", bf16)]
    for name in ("fp8e4m3", "fp8e5m2"):
        batches.append((name, widen(np.arange(1 << 8), name)))
    for name in ("fp8e4m3", "fp8e5m2"):
        batches.append((name, bf16))
    return batches


def _fp32_codes(sign, e, f):
    return ((np.asarray(sign, np.int64) << 31) | (np.asarray(e, np.int64) << 23)
            | np.asarray(f, np.int64)).astype(np.uint32)


def _specials(rng, n):
    """FP32 codes of the special classes: zeros, infinities, NaNs of random payloads (quiet
    and signalling), FP32 subnormals, the largest and the smallest normal."""
    sign = rng.integers(0, 2, n)
    kind = rng.integers(0, 6, n)
    payload = rng.integers(1, 1 << 23, n)
    # Signalling NaNs (quiet bit clear) and the one-bit payloads in half of the NaNs.
    payload = np.where(rng.random(n) < 0.5, payload & ((1 << 22) - 1), payload)
    payload = np.where(rng.random(n) < 0.2, 1 << rng.integers(0, 23, n), payload)
    payload = np.maximum(payload, 1)
    subnormal = rng.integers(1, 1 << 23, n)
    e = np.choose(kind, [0, 255, 255, 0, 254, 1])
    f = np.choose(kind, [0, 0, payload, subnormal, (1 << 23) - 1, rng.integers(0, 4, n)])
    return _fp32_codes(sign, e, f)


def _boundaries(rng, n, fmt):
    """FP32 codes at and next to the midpoints between neighbouring codes of ``fmt`` (ties
    and the values either side), from zero to the overflow threshold (the midpoint above
    the largest finite value), weighted to the largest finite value, zero and the largest
    subnormal (the tie to zero, the carry into the normals)."""
    man = fmt.man_bits
    c = rng.integers(0, fmt.max_finite_bits + 1, n)
    roll = rng.random(n)
    c = np.where(roll < 0.1, fmt.max_finite_bits, c)
    c = np.where((roll >= 0.1) & (roll < 0.15), 0, c)
    c = np.where((roll >= 0.15) & (roll < 0.2), (1 << man) - 1, c)
    value = numerics.from_bits(c, fmt).astype(np.float64)
    ulp = np.exp2(np.maximum(c >> man, 1) - fmt.bias - man)
    middle = ((value + value + ulp) / 2).astype(np.float32).view(np.uint32).astype(np.int64)
    # Exact ties, one or a few FP32 steps off, or anywhere within half an output step.
    half = 1 << (_FP32.man_bits - man - 1)
    roll = rng.random(n)
    offset = np.where(roll < 0.4, 0, rng.integers(1, 5, n))
    offset = np.where(roll > 0.85, rng.integers(0, half + 1, n), offset)
    offset *= rng.choice([-1, 1], n)
    sign = rng.integers(0, 2, n)
    return ((sign << 31) | (middle + offset)).astype(np.uint32)


def _in_range(rng, n, fmt):
    """FP32 codes of random magnitude from below the format's smallest subnormal to above
    its largest finite value; in half of them the low fraction bits are zero (values on or
    near the output's grid)."""
    lo = _FP32.bias + fmt.min_normal_exp - fmt.man_bits - 3
    hi = _FP32.bias + fmt.max_normal_exp + 2
    e = np.clip(rng.integers(lo, hi + 1, n), 0, 254)
    f = rng.integers(0, 1 << 23, n)
    cut = rng.integers(0, 24, n)
    f = np.where(rng.random(n) < 0.5, (f >> cut) << cut, f)
    return _fp32_codes(rng.integers(0, 2, n), e, f)


def weighted_codes(rng, n, fmt):
    """``n`` FP32 codes for a cast to ``fmt`` (a name): 45% at the rounding boundaries of
    the format (:func:`_boundaries`), 25% of random magnitude in its range, 15% uniform over
    all FP32 codes, 15% special (:func:`_specials`); for ``fp32`` half uniform, half
    special and in the FP8 ranges."""
    fmt = numerics.float_format(fmt)
    if fmt.name == "fp32":
        parts = [rng.integers(0, 1 << 32, n // 2, dtype=np.uint64).astype(np.uint32),
                 _specials(rng, n // 4), _in_range(rng, n - n // 2 - n // 4, numerics.FP8E4M3)]
    else:
        counts = rng.multinomial(n, [0.45, 0.25, 0.15, 0.15])
        parts = [_boundaries(rng, counts[0], fmt), _in_range(rng, counts[1], fmt),
                 rng.integers(0, 1 << 32, counts[2], dtype=np.uint64).astype(np.uint32),
                 _specials(rng, counts[3])]
    codes = np.concatenate(parts)
    rng.shuffle(codes)
    return codes


def random_batches(rng, vectors):
    """``(format, fp32 codes)`` pairs of :func:`weighted_codes`: ``vectors`` evenly over
    the narrow formats, and a sixteenth as many for the fp32 identity."""
    per_format = vectors // len(NARROW)
    counts = [per_format] * len(NARROW)
    counts[0] += vectors - per_format * len(NARROW)
    batches = [(name, weighted_codes(rng, count, name))
               for name, count in zip(NARROW, counts, strict=True)]
    batches.append(("fp32", weighted_codes(rng, vectors // 16, "fp32")))
    return batches


# -- coverage ---------------------------------------------------------------------------------

COVERAGE_KEYS = ("vectors", "ties_even", "ties_up", "subnormal_results", "underflow_to_zero",
                 "carry_next_binade", "carry_subnormal_to_normal", "overflow_inf",
                 "overflow_nan", "inf_inputs", "nan_inputs_positive", "nan_inputs_negative",
                 "fp32_subnormal_inputs")
#: The classes every narrow format's workload must reach (besides its overflow:
#: ``overflow_nan`` for fp8e4m3, ``overflow_inf`` for the others).
CORNERS = ("ties_even", "ties_up", "subnormal_results", "underflow_to_zero", "carry_next_binade",
           "carry_subnormal_to_normal", "inf_inputs", "nan_inputs_positive",
           "nan_inputs_negative", "fp32_subnormal_inputs")


def coverage(codes, fmt):
    """What casting the FP32 ``codes`` to ``fmt`` meets, by class: ties (guard bit set,
    no sticky bits) left on an even code or rounded up from an odd one, subnormal results,
    nonzero finite inputs that round to zero, round-ups that carry into the next binade
    (including into infinity; and those from the largest subnormal to the smallest normal
    on their own), finite
    inputs that overflow to infinity or to NaN, infinite and NaN inputs (by sign), FP32
    subnormal inputs."""
    fmt = numerics.float_format(fmt)
    codes = np.asarray(codes).astype(np.uint32)
    sign, e, f = golden.fields(codes)
    finite = e != _FP32.exp_max_field
    nan = ~finite & (f != 0)
    counts = {key: 0 for key in COVERAGE_KEYS}
    counts["vectors"] = int(codes.size)
    counts["inf_inputs"] = int(np.count_nonzero(~finite & (f == 0)))
    counts["nan_inputs_positive"] = int(np.count_nonzero(nan & (sign == 0)))
    counts["nan_inputs_negative"] = int(np.count_nonzero(nan & (sign == 1)))
    counts["fp32_subnormal_inputs"] = int(np.count_nonzero((e == 0) & (f != 0)))
    if fmt.name == "fp32":
        return counts
    out = golden.cast(codes, fmt.name).astype(np.int64)
    magnitude = out & ((1 << (fmt.bits - 1)) - 1)
    top = (magnitude >> fmt.man_bits) == fmt.exp_max_field
    fraction = magnitude & ((1 << fmt.man_bits) - 1)
    if fmt.has_inf:
        out_nan, out_inf = top & (fraction != 0), top & (fraction == 0)
    else:
        out_nan, out_inf = top & (fraction == (1 << fmt.man_bits) - 1), np.zeros_like(top)
    truncated, guard, sticky, te = golden.round_fields(codes, fmt)
    tie = finite & (guard == 1) & (sticky == 0) & (te <= fmt.exp_max_field)
    round_up = finite & (guard == 1) & ((sticky == 1) | (truncated & 1 == 1)) \
        & (te <= fmt.exp_max_field)
    counts["ties_even"] = int(np.count_nonzero(tie & (truncated & 1 == 0)))
    counts["ties_up"] = int(np.count_nonzero(tie & (truncated & 1 == 1)))
    counts["subnormal_results"] = int(np.count_nonzero(
        finite & (magnitude >> fmt.man_bits == 0) & (magnitude != 0)))
    counts["underflow_to_zero"] = int(np.count_nonzero(
        finite & ((e != 0) | (f != 0)) & (magnitude == 0)))
    counts["carry_next_binade"] = int(np.count_nonzero(
        round_up & ((truncated + 1) >> fmt.man_bits != truncated >> fmt.man_bits)))
    counts["carry_subnormal_to_normal"] = int(np.count_nonzero(
        round_up & (truncated == (1 << fmt.man_bits) - 1)))
    counts["overflow_inf"] = int(np.count_nonzero(finite & out_inf))
    counts["overflow_nan"] = int(np.count_nonzero(finite & out_nan))
    return counts


def total_coverage(batches):
    """:func:`coverage` of ``(format, codes)`` batches, summed per format."""
    totals = {}
    for name, codes in batches:
        counts = coverage(codes, name)
        into = totals.setdefault(name, {key: 0 for key in COVERAGE_KEYS})
        for key, value in counts.items():
            into[key] += value
    return totals


# -- the bench --------------------------------------------------------------------------------

def _pack(codes):
    return int.from_bytes(np.ascontiguousarray(codes, dtype="<u4").tobytes(), "little")


def _unpack(value, lanes):
    return np.frombuffer(value.to_bytes(4 * lanes, "little"), dtype="<u4")


async def _run(dut, batches):
    """Drive every batch through the unit, ``lanes`` codes a step (a last partial step
    padded with zeros, which are checked as well); return the statistics (``vectors``:
    compared, ``steps``, ``mismatches``) and log the first mismatches."""
    lanes = len(dut.a) // 32
    assert lanes == TEST_LANES, f"the top has {lanes} lanes, the bench expects {TEST_LANES}"
    format_port = dut["format"]
    vectors = steps = mismatches = 0
    for name, codes in batches:
        padded = np.concatenate([codes, np.zeros(-codes.size % lanes, np.uint32)])
        expected = golden.cast(padded, name).astype(np.uint32)
        got = np.empty_like(padded)
        format_port.value = numerics.data_format(name).code
        started = time.monotonic()
        for start in range(0, padded.size, lanes):
            dut.a.value = _pack(padded[start:start + lanes])
            await Timer(1, "ns")
            got[start:start + lanes] = _unpack(dut.result.value.to_unsigned(), lanes)
            steps += 1
        dut._log.info("%s: %d codes in %.1f s", name, padded.size, time.monotonic() - started)
        wrong = np.flatnonzero(got != expected)
        for index in wrong[:5]:
            dut._log.error("%s: a=0x%08x result 0x%x, expected 0x%x", name, padded[index],
                           got[index], expected[index])
        mismatches += int(wrong.size)
        vectors += int(padded.size)
    return {"vectors": vectors, "steps": steps, "mismatches": mismatches}


async def _test(dut, name, batches):
    stats = await _run(dut, batches)
    record = {"test": name, **stats, "coverage": total_coverage(batches)}
    harness.report(record)
    assert stats["mismatches"] == 0, \
        f"{stats['mismatches']} of {stats['vectors']} results differ from the golden model"


@cocotb.test()
async def test_round_trips(dut):
    """Every bf16 and FP8 code, widened to FP32, cast back; every bf16 code to each FP8
    format."""
    await _test(dut, "round_trips", round_trip_batches())


@cocotb.test()
async def test_random(dut):
    """Corner-weighted random FP32 codes over every format."""
    seed = harness.setting("seed", 1)
    rng = np.random.default_rng([seed, zlib.crc32(b"random")])
    await _test(dut, "random", random_batches(rng, harness.setting("vectors", 1_008_000)))
