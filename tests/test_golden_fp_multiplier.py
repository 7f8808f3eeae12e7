"""The multiplier's golden model against an independent reference: the inputs decoded by
``ml_dtypes`` (``numerics.from_bits``), multiplied in float64 (exact for these formats, the
MX scale a power of two) and converted to float32 by numpy (one rounding, to nearest even,
subnormals kept), any NaN replaced by the canonical NaN. Every FP8 pair of both FP8 formats,
the same pairs in the MX formats with scales aimed at each corner, 10**6 random BF16 and
2 * 10**5 random FP32 pairs, weighted toward the corners; code for code."""

import numpy as np
import pytest

from opentrn import numerics
from opentrn.golden import fp_multiplier as golden
from opentrn.sim.tb_fp_multiplier import (
    coverage,
    exhaustive_pairs,
    random_operands,
    random_scales,
    special_codes,
)

BF16_PAIRS = 1_000_000
FP32_PAIRS = 200_000


def reference(a, b, format_name, scale_a=None, scale_b=None):
    fmt = numerics.data_format(format_name)
    with np.errstate(invalid="ignore", over="ignore"):
        p = numerics.from_bits(a, fmt.element).astype(np.float64) \
            * numerics.from_bits(b, fmt.element).astype(np.float64)
        if fmt.mx:
            sa, sb = np.asarray(scale_a, np.int64), np.asarray(scale_b, np.int64)
            p = p * np.where((sa == numerics.E8M0_NAN) | (sb == numerics.E8M0_NAN), np.nan,
                             np.ldexp(1.0, sa + sb - 2 * numerics.E8M0_BIAS))
        codes = p.astype(np.float32).view(np.uint32)
    return np.where(np.isnan(p), np.uint32(numerics.CANONICAL_NAN32), codes)


def check(a, b, format_name, scale_a=None, scale_b=None):
    """Golden equals reference on every pair; return the coverage counts."""
    details = golden.multiply_details(a, b, format_name, scale_a, scale_b)
    want = reference(a, b, format_name, scale_a, scale_b)
    wrong = np.flatnonzero(details.code != want)
    assert wrong.size == 0, (
        f"{format_name}: {wrong.size} products differ, first: {a[wrong[0]]:#x} * "
        f"{b[wrong[0]]:#x} = {details.code[wrong[0]]:#x}, reference {want[wrong[0]]:#x}")
    return coverage(details)


def add(total, counts):
    for key, value in counts.items():
        total[key] = total.get(key, 0) + value
    return total


@pytest.mark.parametrize("format_name", ["fp8e4m3", "fp8e5m2"])
def test_fp8_exhaustive(format_name):
    a, b = exhaustive_pairs()
    counts = check(a, b, format_name)
    # Every FP8 product is an exact FP32 normal (or zero, infinity, NaN).
    assert counts["inexact"] == counts["subnormal_results"] == counts["overflow_to_inf"] == 0
    assert counts["zero_positive"] > 0 and counts["zero_negative"] > 0
    assert counts["nan_from_nan_operand"] > 0
    if format_name == "fp8e5m2":
        assert counts["nan_from_inf_times_zero"] > 0 and counts["inf_from_inf_operand"] > 0
    else:
        # e4m3fn has no infinities: 448 is finite and S.1111.111 the only NaN.
        assert counts["inf_from_inf_operand"] == counts["nan_from_inf_times_zero"] == 0
        assert counts["nan_from_nan_operand"] == 2 * 2 * 256 - 4


def _exponents(a, b, element):
    """For the exact products: usable (finite, nonzero), exponent of the top bit and of
    the lowest set bit."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.abs(numerics.from_bits(a, element).astype(np.float64)
                   * numerics.from_bits(b, element).astype(np.float64))
    usable = np.isfinite(p) & (p != 0)
    mantissa, exponent = np.frexp(np.where(usable, p, 1.0))
    scaled = (mantissa * 2.0 ** 53).astype(np.int64)
    lowest = exponent - 53 + np.array([(int(v) & -int(v)).bit_length() - 1 for v in scaled])
    return usable, exponent - 1, lowest


def _split(shift, rng):
    """E8M0 codes with ``scale_a + scale_b - 254 = shift`` (``shift`` clipped to
    [-254, 254])."""
    total = np.clip(shift, -254, 254) + 254
    scale_a = rng.integers(np.maximum(total - 254, 0), np.minimum(total, 254) + 1)
    return scale_a, total - scale_a


@pytest.mark.parametrize("format_name", ["mxfp8e4m3", "mxfp8e5m2"])
def test_mx_exhaustive_with_scales(format_name):
    """Every pair, with scales that put each product's lowest bit at ``2**-150`` (a tie of
    the subnormal range), its top bit at ``2**127``, ``2**128`` (overflow), ``2**-149``,
    ``2**-150``, ``2**-151`` (the smallest subnormal, a tie or not, underflow), random
    scales (with 255) and a scale of 255 on either side."""
    element = numerics.data_format(format_name).element
    rng = np.random.default_rng(11)
    a, b = exhaustive_pairs()
    usable, top, lowest = _exponents(a, b, element)
    shifts = {"tie": -150 - lowest, "top_127": 127 - top, "overflow": 128 - top,
              "top_-149": -149 - top, "top_-150": -150 - top, "top_-151": -151 - top}
    total = {}
    for name, shift in shifts.items():
        scale_a, scale_b = _split(np.where(usable, shift, 0), rng)
        counts = check(a, b, format_name, scale_a, scale_b)
        add(total, counts)
        if name == "tie":
            # Every finite nonzero product is an exact tie.
            assert counts["ties_to_even_down"] + counts["ties_to_even_up"] == usable.sum()
        if name == "overflow":
            assert counts["overflow_to_inf"] == usable.sum()
        if name == "top_-151":
            assert counts["underflow_to_zero"] == usable.sum()
    for seed in range(3):
        scale_a, scale_b = random_scales(format_name, np.random.default_rng(seed), a, b)
        add(total, check(a, b, format_name, scale_a, scale_b))
    nan = np.full(a.shape, numerics.E8M0_NAN)
    one = np.full(a.shape, numerics.E8M0_BIAS)
    for scale_a, scale_b in ((nan, one), (one, nan)):
        add(total, check(a, b, format_name, scale_a, scale_b))
        assert (golden.multiply(a, b, format_name, scale_a, scale_b)
                == numerics.CANONICAL_NAN32).all()
    for key in ("subnormal_results", "overflow_to_inf", "underflow_to_zero",
                "nan_from_scale_255", "nan_from_nan_operand", "ties_to_even_down",
                "ties_to_even_up", "zero_positive", "zero_negative", "inexact"):
        assert total[key] > 0, key


def _assert_corners(counts, *, normal_ties):
    for key in ("subnormal_results", "overflow_to_inf", "underflow_to_zero",
                "inf_from_inf_operand", "nan_from_nan_operand", "nan_from_inf_times_zero",
                "inexact", "ties_to_even_down", "ties_to_even_up", "zero_positive",
                "zero_negative"):
        assert counts[key] > 0, key
    assert (counts["ties_normal_range"] > 0) == normal_ties


def test_bf16_random():
    a, b = random_operands("bf16", np.random.default_rng(21), BF16_PAIRS)
    counts = check(a, b, "bf16")
    # A BF16 product (16 significand bits) is exact in the FP32 normal range.
    _assert_corners(counts, normal_ties=False)
    assert counts["ties_to_even_down"] + counts["ties_to_even_up"] > BF16_PAIRS // 20


def test_fp32_random():
    a, b = random_operands("fp32", np.random.default_rng(22), FP32_PAIRS)
    counts = check(a, b, "fp32")
    _assert_corners(counts, normal_ties=True)
    assert counts["ties_to_even_down"] + counts["ties_to_even_up"] > FP32_PAIRS // 20


@pytest.mark.parametrize("format_name", ["bf16", "fp32"])
def test_edge_values_pairwise(format_name):
    element = numerics.data_format(format_name).element
    specials = special_codes(element)
    check(np.repeat(specials, specials.size), np.tile(specials, specials.size), format_name)


def test_hand_computed_products():
    def one(a, b, fmt, *scales):
        return int(golden.multiply(np.array([a]), np.array([b]), fmt,
                                   *(np.array([s]) for s in scales))[0])

    assert one(0x3FC0, 0x3FC0, "bf16") == 0x40100000          # 1.5 * 1.5 = 2.25
    assert one(0x7F7FFFFF, 0x40000000, "fp32") == 0x7F800000  # max * 2: overflow
    assert one(0xFF7FFFFF, 0x3F800001, "fp32") == 0xFF800000  # rounds up to -inf
    assert one(0x00000001, 0x3F000000, "fp32") == 0           # 2**-150: tie to even 0
    assert one(0x00000001, 0x3FC00000, "fp32") == 2           # 1.5 ulp: tie to even 2
    assert one(0x00000001, 0x40200000, "fp32") == 2           # 2.5 ulp: tie to even 2
    assert one(0x00000003, 0x3F000000, "fp32") == 2           # 1.5 ulp again
    assert one(0x00800000, 0x3F7FFFFF, "fp32") == 0x00800000  # rounds up to normal
    assert one(0x7F800000, 0x00000000, "fp32") == numerics.CANONICAL_NAN32
    assert one(0xFF800000, 0xBF800000, "fp32") == 0x7F800000  # -inf * -1 = +inf
    assert one(0x8000, 0x40A0, "bf16") == 0x80000000          # -0 * 5 = -0
    assert one(0x7E, 0x7E, "fp8e4m3") == 0x48440000           # 448 * 448 = 200704
    assert one(0x7F, 0x38, "fp8e4m3") == numerics.CANONICAL_NAN32
    assert one(0x7C, 0x00, "fp8e5m2") == numerics.CANONICAL_NAN32  # inf * 0
    assert one(0x01, 0x01, "fp8e5m2") == 0x2F800000           # 2**-16 * 2**-16 = 2**-32
    assert one(0x38, 0x38, "mxfp8e4m3", 255, 127) == numerics.CANONICAL_NAN32
    assert one(0x80, 0x38, "mxfp8e4m3", 3, 200) == 0x80000000   # -0 * 1, scaled
    assert one(0x38, 0x38, "mxfp8e4m3", 254, 128) == 0x7F800000  # 1 * 2**128
    assert one(0x38, 0x38, "mxfp8e4m3", 1, 104) == 1            # 1 * 2**-149
    assert one(0x38, 0x38, "mxfp8e4m3", 0, 104) == 0            # 2**-150: tie to even 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="format='int8': must be one of"):
        golden.multiply([0], [0], "int8")
    with pytest.raises(ValueError, match="scale_a and scale_b are required"):
        golden.multiply([0], [0], "mxfp8e5m2")
    with pytest.raises(ValueError, match="takes no scales"):
        golden.multiply([0], [0], "bf16", [127], [127])
    with pytest.raises(ValueError, match=r"a_codes: codes must lie in \[0, 255\]"):
        golden.multiply([256], [0], "fp8e4m3")
    with pytest.raises(TypeError, match="must be integer codes"):
        golden.multiply([1.0], [0], "fp32")
