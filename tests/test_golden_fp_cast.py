"""The FP32 cast's golden model against ``ml_dtypes`` (``numerics.to_bits``), code for code:
exhaustive round trips of the narrow formats, corner-weighted random FP32 codes, and a
strided sweep of the whole FP32 code space."""

import numpy as np
import pytest

from opentrn import numerics
from opentrn.golden import fp_cast as golden
from opentrn.sim.tb_fp_cast import (
    CORNERS,
    NARROW,
    coverage,
    round_trip_batches,
    weighted_codes,
    widen,
)

RANDOM = 1_000_000
#: A prime stride: the sweep meets every low-bit pattern of the fraction.
STRIDE = 4093


def reference(codes, fmt):
    """``ml_dtypes``' cast of the FP32 ``codes`` to ``fmt`` (the identity for ``fp32``)."""
    codes = np.asarray(codes).astype(np.uint32)
    if fmt == "fp32":
        return codes
    return numerics.to_bits(codes.view(np.float32), fmt)


def assert_same(codes, fmt):
    got, want = golden.cast(codes, fmt), reference(codes, fmt)
    assert got.dtype == numerics.float_format(fmt).uint_type
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, (
        f"{fmt}: {wrong.size} of {got.size} differ, e.g. "
        + ", ".join(f"0x{codes[i]:08x} -> 0x{got[i]:x} (ml_dtypes 0x{want[i]:x})"
                    for i in wrong[:5]))


def _codes(values):
    return np.array(values, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("fmt", NARROW)
def test_round_trip_is_the_identity_but_for_nans(fmt):
    """Every code of the format, widened to FP32 and cast back: the same code, except that a
    NaN becomes the canonical NaN with its sign."""
    f = numerics.float_format(fmt)
    codes = np.arange(1 << f.bits, dtype=np.int64)
    back = golden.cast(widen(codes, fmt), fmt).astype(np.int64)
    sign = codes >> (f.bits - 1)
    magnitude = codes & ((1 << (f.bits - 1)) - 1)
    top = magnitude >> f.man_bits == f.exp_max_field
    fraction = magnitude & ((1 << f.man_bits) - 1)
    nan = top & (fraction == (1 << f.man_bits) - 1 if not f.has_inf else fraction != 0)
    want = np.where(nan, (sign << (f.bits - 1)) | f.canonical_nan, codes)
    assert np.count_nonzero(nan) == (2 if not f.has_inf else 2 * ((1 << f.man_bits) - 1))
    np.testing.assert_array_equal(back, want)
    assert_same(widen(codes, fmt), fmt)


def test_round_trips_and_cross_formats_match_ml_dtypes():
    batches = round_trip_batches()
    assert [name for name, _ in batches] == ["bf16", "fp8e4m3", "fp8e5m2", "fp8e4m3",
                                             "fp8e5m2"]
    for name, codes in batches:
        assert_same(codes, name)


@pytest.mark.parametrize("fmt", NARROW)
def test_weighted_random_codes_match_ml_dtypes(fmt):
    codes = weighted_codes(np.random.default_rng([7, len(fmt)]), RANDOM, fmt)
    assert codes.size == RANDOM
    assert_same(codes, fmt)
    counts = coverage(codes, fmt)
    for key in CORNERS:
        assert counts[key] > 0, (key, counts)
    # A tenth of the codes are ties (the testbench relies on the weighting).
    assert counts["ties_even"] + counts["ties_up"] >= RANDOM // 10, counts
    if numerics.float_format(fmt).has_inf:
        assert counts["overflow_inf"] > 0 and counts["overflow_nan"] == 0, counts
    else:
        assert counts["overflow_nan"] > 0 and counts["overflow_inf"] == 0, counts


def test_fp32_is_the_identity():
    codes = weighted_codes(np.random.default_rng(3), 100_000, "fp32")
    nan = (codes & 0x7FFFFFFF) > 0x7F800000
    assert np.count_nonzero(nan & (codes >> 31 == 1)) > 0
    assert np.count_nonzero(nan & (codes & 0x400000 == 0)) > 0   # signalling NaNs too
    np.testing.assert_array_equal(golden.cast(codes, "fp32"), codes)
    assert golden.cast(codes, "fp32").dtype == np.uint32


@pytest.mark.parametrize("fmt", NARROW)
def test_strided_sweep_of_all_fp32_codes(fmt):
    """Every STRIDE-th FP32 code and its two neighbours, over the whole code space."""
    base = np.arange(0, 1 << 32, STRIDE, dtype=np.int64)
    codes = (base[:, None] + np.array([-1, 0, 1])).reshape(-1) % (1 << 32)
    assert_same(codes.astype(np.uint32), fmt)


def test_documented_rules_hold_in_ml_dtypes_and_the_model():
    """The rules the module docstring states, on the values that show them, checked on both
    the reference and the model."""
    cases = {
        "fp8e4m3": [(448.0, 0x7E), (464.0, 0x7E), (465.0, 0x7F), (-465.0, 0xFF),
                    (480.0, 0x7F), (np.inf, 0x7F), (-np.inf, 0xFF), (2.0 ** -10, 0x00),
                    (3 * 2.0 ** -10, 0x02), (-(2.0 ** -9), 0x81), (0.0, 0x00),
                    (-0.0, 0x80), (1e-30, 0x00), (2 * 0.9375 * 2.0 ** -7, 0x08)],
        "fp8e5m2": [(57344.0, 0x7B), (61439.0, 0x7B), (61440.0, 0x7C), (-61440.0, 0xFC),
                    (np.inf, 0x7C), (-np.inf, 0xFC), (2.0 ** -17, 0x00),
                    (3 * 2.0 ** -17, 0x02), (1.125, 0x3C), (1.375, 0x3E)],
        "bf16": [(np.float32(1 + 2.0 ** -8), 0x3F80), (np.float32(1 + 3 * 2.0 ** -8), 0x3F82),
                 (np.inf, 0x7F80), (-np.inf, 0xFF80)],
    }
    for fmt, pairs in cases.items():
        codes = _codes([value for value, _ in pairs])
        want = [code for _, code in pairs]
        assert list(reference(codes, fmt)) == want, fmt
        assert list(golden.cast(codes, fmt)) == want, fmt
    # bf16 overflow by rounding and FP32 subnormals (ties to even at 2**-134).
    raw = np.array([0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000, 0x00008000, 0x00018000, 0x00008001,
                    0x807FFFFF], dtype=np.uint32)
    want = [0x7F80, 0x7F7F, 0xFF80, 0x0000, 0x0002, 0x0001, 0x8080]
    assert list(reference(raw, "bf16")) == want
    assert list(golden.cast(raw, "bf16")) == want
    # NaNs: the payload dropped, the sign kept, quiet or signalling.
    nans = np.array([0x7FC00001, 0x7F800001, 0xFF800001, 0xFFFFFFFF, 0x7FBFFFFF],
                    dtype=np.uint32)
    for fmt in NARROW:
        nan = numerics.float_format(fmt).canonical_nan
        sign = 1 << (numerics.float_format(fmt).bits - 1)
        want = [nan, nan, sign | nan, sign | nan, nan]
        assert list(reference(nans, fmt)) == want, fmt
        assert list(golden.cast(nans, fmt)) == want, fmt
    assert [numerics.float_format(f).canonical_nan for f in NARROW] == [0x7FC0, 0x7F, 0x7E]


def test_bad_format_is_refused():
    with pytest.raises(ValueError, match="format='int8': must be one of fp32, bf16"):
        golden.cast(np.zeros(1, np.uint32), "int8")
