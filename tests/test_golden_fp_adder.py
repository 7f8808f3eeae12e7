"""The FP32 adder's golden model (:mod:`opentrn.golden.fp_adder`) against the independent
reference, numpy ``float32`` addition with NaN results made canonical: equal codes on a
million corner-weighted random pairs, on every pair of exponents, on the directed cases, and
the rules of the module docstring on hand-derived values."""

import numpy as np
import pytest

from opentrn.golden.fp_adder import add
from opentrn.numerics import CANONICAL_NAN32
from opentrn.sim.tb_fp_adder import (
    COVERAGE_CLASSES,
    coverage,
    directed_pairs,
    random_pairs,
    reference,
)

RANDOM_PAIRS = 10**6


def _check(a, b):
    got, want = add(a, b), reference(a, b)
    wrong = np.nonzero(got != want)[0]
    examples = [f"{a[i]:08x} + {b[i]:08x} = {got[i]:08x}, reference {want[i]:08x}"
                for i in wrong[:5]]
    assert wrong.size == 0, f"{wrong.size} of {a.size} differ: {examples}"
    return got


def test_random_pairs_match_the_reference():
    a, b = random_pairs(np.random.default_rng(2024), RANDOM_PAIRS)
    result = _check(a, b)
    counts = coverage(a, b, result)
    for name in COVERAGE_CLASSES:
        assert counts[name] > 0, (name, counts)
    # The deliberate ties are a sizeable share, not a handful.
    assert counts["ties_up"] + counts["ties_down"] >= RANDOM_PAIRS // 50, counts
    assert counts["massive_cancellations"] >= RANDOM_PAIRS // 100, counts


def test_every_pair_of_exponents():
    """All 256 x 256 biased exponent pairs (subnormals, infinities and NaNs included), with
    random fractions and signs: every exponent difference, both operand orders."""
    rng = np.random.default_rng(7)
    exp_a, exp_b = (e.ravel() for e in np.meshgrid(np.arange(256), np.arange(256)))
    exp_a, exp_b = np.tile(exp_a, 8), np.tile(exp_b, 8)
    n = exp_a.size

    def codes(exponents):
        return ((rng.integers(0, 2, n) << 31) | (exponents << 23)
                | rng.integers(0, 1 << 23, n)).astype(np.uint32)

    _check(codes(exp_a), codes(exp_b))


def test_directed_pairs_match_the_reference():
    a, b = directed_pairs()
    result = _check(a, b)
    counts = coverage(a, b, result)
    for name in COVERAGE_CLASSES:
        assert counts[name] > 0, (name, counts)


POS_INF, NEG_INF = 0x7F800000, 0xFF800000
ONE, NEG_ONE = 0x3F800000, 0xBF800000
MAX, NEG_MAX = 0x7F7FFFFF, 0xFF7FFFFF


@pytest.mark.parametrize("a, b, expected", [
    (POS_INF, POS_INF, POS_INF),
    (NEG_INF, NEG_INF, NEG_INF),
    (POS_INF, NEG_INF, CANONICAL_NAN32),
    (NEG_INF, POS_INF, CANONICAL_NAN32),
    (POS_INF, NEG_MAX, POS_INF),
    (ONE, NEG_INF, NEG_INF),
    (0x7F800001, ONE, CANONICAL_NAN32),          # signalling NaN
    (ONE, 0xFFC12345, CANONICAL_NAN32),          # negative NaN with a payload
    (0xFFFFFFFF, NEG_INF, CANONICAL_NAN32),
    (0x00000000, 0x80000000, 0x00000000),        # (+0) + (-0) = +0
    (0x80000000, 0x00000000, 0x00000000),
    (0x80000000, 0x80000000, 0x80000000),        # (-0) + (-0) = -0
    (0x00000000, 0x00000000, 0x00000000),
    (ONE, NEG_ONE, 0x00000000),                  # x + (-x) = +0
    (NEG_ONE, ONE, 0x00000000),
    (0x80000001, 0x00000001, 0x00000000),
    (MAX, MAX, POS_INF),                         # overflow
    (NEG_MAX, NEG_MAX, NEG_INF),
    (ONE, 0x33800000, ONE),                      # 1 + 2**-24: tie, to even (down)
    (0x3F800001, 0x33800000, 0x3F800002),        # (1 + 2**-23) + 2**-24: tie, to even (up)
    (0x00000001, 0x00000001, 0x00000002),        # subnormal in and out
    (0x007FFFFF, 0x00000001, 0x00800000),        # subnormal + subnormal = smallest normal
    (0x00800000, 0x80000001, 0x007FFFFF),        # normal - subnormal = largest subnormal
    (0x80000000, 0x00000001, 0x00000001),        # (-0) + x = x
])
def test_rules(a, b, expected):
    assert int(add(a, b)) == expected
    assert int(add(b, a)) == expected


def test_arrays_broadcast():
    result = add(np.uint32(ONE), np.array([[ONE, NEG_ONE]], np.uint32))
    assert result.dtype == np.uint32 and result.shape == (1, 2)
    assert result.tolist() == [[0x40000000, 0x00000000]]
