"""The activation engine's golden model against hand-computed cases, Python's own
half-to-even rounding of exact fractions, and numpy's float64 ``rint``."""

import random
from fractions import Fraction

import numpy as np
import pytest

from opentrn import config
from opentrn.golden import activation_engine as golden

TINY = config.preset("tiny")
TINY16 = TINY.replace(acc_bits=16)
SMALL = config.preset("small")
P = TINY.pe_cols
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def act(cfg, x, *, function=golden.IDENTITY, multiplier=1, shift=0, bias=0, out_int32=1):
    """``activate`` on a list of values, lane by lane (padded to whole vectors of
    ``pe_cols`` with zeros), with one bias for every partition."""
    values = list(x)
    lanes = cfg.pe_cols
    padded = values + [0] * (-len(values) % lanes)
    matrix = np.array(padded, dtype=np.int64).reshape(-1, lanes).T
    out = golden.activate(cfg, matrix, function=function, multiplier=multiplier, shift=shift,
                          bias=np.full(lanes, bias, dtype=np.int64), out_int32=out_int32)
    return [int(v) for v in out.T.reshape(-1)[:len(values)]]


def test_round_half_to_even():
    # x / 2: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4, 1.5 -> 2, 0.5 -> 0, -0.5 -> 0,
    # -1.5 -> -2.
    assert act(TINY, [5, 7, -5, -7, 3, 1, -1, -3], shift=1) == [2, 4, -2, -4, 2, 0, 0, -2]
    # x / 4: 2.25 -> 2, 2.75 -> 3, -2.25 -> -2, -2.75 -> -3, 2.5 -> 2, -0.25 -> 0.
    assert act(TINY, [9, 11, -9, -11, 10, -1], shift=2) == [2, 3, -2, -3, 2, 0]
    # The bias is in units of 2**-shift: (0 * m + 5) / 2 = 2.5 -> 2, (1 * 2 + 5) / 2 = 3.5
    # -> 4, (-1 * 2 + 5) / 2 = 1.5 -> 2, (-3 * 2 + 5) / 2 = -0.5 -> 0.
    assert act(TINY, [0, 1, -1, -3], multiplier=2, shift=1, bias=5) == [2, 4, 2, 0]
    # One element per sub-case of round_shift: remainder below, at and above half.
    assert [golden.round_shift(v, 3) for v in (19, 20, 21, 12, 28, -12, -20, -19)] == \
        [2, 2, 3, 2, 4, -2, -2, -2]


def test_shift_zero_is_exact():
    assert act(TINY, [3, -7, 0, 1000], multiplier=-3, bias=11) == [2, 32, 11, -2989]
    assert golden.round_shift(-12345678901234567, 0) == -12345678901234567


def test_saturation_at_both_ends():
    # int8: 127 and -128 pass, one beyond saturates, far beyond too.
    assert act(TINY, [127, 128, -128, -129, 100000, -100000], out_int32=0) == \
        [127, 127, -128, -128, 127, -128]
    # After rounding: 255 / 2 = 127.5 -> 128 -> 127; 253 / 2 = 126.5 -> 126.
    assert act(TINY, [255, 253, -257, -255], shift=1, out_int32=0) == [127, 126, -128, -128]
    # int32: the largest products.
    assert act(TINY, [INT32_MAX, INT32_MIN, INT32_MIN, 1], multiplier=INT32_MAX) == \
        [INT32_MAX, INT32_MIN, INT32_MIN, INT32_MAX]
    assert act(TINY, [INT32_MIN], multiplier=INT32_MIN, bias=INT32_MAX) == [INT32_MAX]
    assert act(TINY, [INT32_MAX, -1], bias=1) == [INT32_MAX, 0]
    assert act(TINY, [INT32_MIN, 0], bias=-1) == [INT32_MIN, -1]


def test_relu():
    assert act(TINY, [-5, 0, 5, -1, -1000, 1000], function=golden.RELU, out_int32=0) == \
        [0, 0, 5, 0, 0, 127]
    # relu after rounding: -0.5 -> 0, -1.5 -> -2 -> 0, 1.5 -> 2.
    assert act(TINY, [-1, -3, 3], function=golden.RELU, shift=1) == [0, 0, 2]
    # identity keeps negative values.
    assert act(TINY, [-5], function=golden.IDENTITY) == [-5]


def test_shift_63():
    # x * m = (-2**31) * (-2**31) = 2**62: 2**62 / 2**63 = 0.5 -> 0 (tie, even);
    # plus 1 -> just above half -> 1. -2**62 / 2**63 = -0.5 -> 0; minus 1 -> -1.
    big = dict(multiplier=INT32_MIN, shift=63)
    assert act(TINY, [INT32_MIN], **big) == [0]
    assert act(TINY, [INT32_MIN], bias=1, **big) == [1]
    assert act(TINY, [-INT32_MIN // 2], **big) == [0]           # 2**30 * -2**31 = -2**61
    # shift 62: 2**30 * -2**31 / 2**62 = -0.5 -> 0 (tie, even); 3 * 2**29 * ... = -0.75 -> -1.
    assert act(TINY, [1 << 30, 3 << 29], multiplier=INT32_MIN, shift=62) == [0, -1]
    assert golden.round_shift(-(1 << 62), 63) == 0
    assert golden.round_shift(-(1 << 62) - 1, 63) == -1
    assert golden.round_shift(3 << 61, 62) == 2                  # 1.5 -> 2
    assert golden.round_shift(5 << 61, 62) == 2                  # 2.5 -> 2
    # Small values vanish at shift 63, whatever their sign.
    assert act(TINY16, [-32768, 32767, -1, 1], multiplier=INT32_MAX, shift=63) == [0, 0, 0, 0]


def test_acc16_inputs():
    # 16-bit accumulators: the products still do not wrap.
    assert act(TINY16, [-32768, 32767], multiplier=INT32_MIN, shift=31) == [32768, -32767]


def test_against_exact_fractions():
    """Python's ``round`` of a ``Fraction`` is half to even: an independent model of
    steps 2-5 for every shift, with products of every size."""
    rng = random.Random(3)
    for cfg in (TINY, TINY16, SMALL):
        lanes = cfg.pe_cols
        a_lo, a_hi = -(1 << (cfg.acc_bits - 1)), (1 << (cfg.acc_bits - 1)) - 1
        for _ in range(300):
            x = np.array([rng.randint(a_lo, a_hi) for _ in range(lanes * 3)]).reshape(lanes, 3)
            bias = np.array([rng.randint(INT32_MIN, INT32_MAX) for _ in range(lanes)])
            multiplier = rng.choice([INT32_MIN, INT32_MAX, rng.randint(INT32_MIN, INT32_MAX)])
            shift, function, out_int32 = rng.randint(0, 63), rng.randint(0, 1), rng.randint(0, 1)
            got = golden.activate(cfg, x, function=function, multiplier=multiplier,
                                  shift=shift, bias=bias, out_int32=out_int32)
            bits = 32 if out_int32 else 8
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            for (p, n), value in np.ndenumerate(got):
                r = round(Fraction(int(x[p, n]) * multiplier + int(bias[p]), 1 << shift))
                if function == golden.RELU:
                    r = max(r, 0)
                assert value == min(max(r, lo), hi)


@pytest.mark.parametrize("shift", [0, 1, 2, 5, 13, 20, 31, 40, 52])
def test_against_float64_rint(shift):
    """numpy's ``rint`` rounds half to even; float64 holds ``pre`` and ``pre / 2**shift``
    exactly while ``|pre| < 2**53``."""
    rng = np.random.default_rng(shift)
    lanes = TINY16.pe_cols
    n = 400
    ties = 0
    for multiplier in (1, -1, 3, 1 << (shift // 2), -(1 << 20) + 7, 65535):
        # |x * multiplier + bias| <= 2**15 * 2**26 + 2**31 < 2**53.
        x = rng.integers(-(1 << 15), 1 << 15, (lanes, n))
        bias = rng.integers(INT32_MIN, INT32_MAX, lanes, endpoint=True)
        if 0 < shift <= 31:
            # Ties on purpose: x * m + bias = half (mod 2**shift) in column 0 of the lanes
            # that take this bias (below 2**31, so a valid bias).
            tie_bias = ((1 << (shift - 1)) - x[:, 0] * multiplier) % (1 << shift)
            bias = np.where(rng.random(lanes) < 0.5, tie_bias, bias)
            exact = x * multiplier + bias[:, None]
            ties += int(np.sum(exact % (1 << shift) == 1 << (shift - 1)))
        for function in (golden.IDENTITY, golden.RELU):
            for out_int32 in (0, 1):
                pre = x.astype(np.float64) * multiplier + bias[:, None].astype(np.float64)
                assert np.all(np.abs(pre) < 2.0 ** 53)
                r = np.rint(pre / 2.0 ** shift)
                if function == golden.RELU:
                    r = np.maximum(r, 0)
                lo, hi = golden.output_range(TINY16, out_int32)
                want = np.clip(r, lo, hi).astype(np.int64)
                got = golden.activate(TINY16, x, function=function, multiplier=multiplier,
                                      shift=shift, bias=bias, out_int32=out_int32)
                np.testing.assert_array_equal(got, want)
    assert ties > 0 or not 0 < shift <= 31


def test_shapes_and_range():
    x = np.arange(P * 5).reshape(P, 5) - 10
    out = golden.activate(TINY, x, function=0, multiplier=1, shift=0, bias=np.zeros(P, int),
                          out_int32=0)
    assert out.shape == (P, 5) and out.dtype == np.int64
    np.testing.assert_array_equal(out, x)
    one = golden.activate(TINY, x[:, 0], function=0, multiplier=1, shift=0,
                          bias=np.zeros(P, int), out_int32=0)
    assert one.shape == (P,)
    # Per-partition bias: partition p gets bias[p].
    out = golden.activate(TINY, np.zeros((P, 2), int), function=0, multiplier=1, shift=0,
                          bias=np.arange(P), out_int32=0)
    np.testing.assert_array_equal(out, np.repeat(np.arange(P)[:, None], 2, axis=1))


def test_latency():
    assert golden.latency(TINY) == golden.latency(SMALL) == golden.latency(TINY16) == 4


def _call(cfg=TINY, **changes):
    args = dict(x=np.zeros((P, 1), int), function=0, multiplier=1, shift=0,
                bias=np.zeros(P, int), out_int32=0)
    args.update(changes)
    x = args.pop("x")
    return golden.activate(cfg, x, **args)


@pytest.mark.parametrize("changes, message", [
    (dict(shift=64), r"shift=64: must be an integer in 0\.\.63"),
    (dict(shift=-1), r"shift=-1"),
    (dict(shift=1.0), r"shift=1\.0"),
    (dict(multiplier=1 << 31), r"multiplier=2147483648: must be a signed 32-bit"),
    (dict(multiplier=-(1 << 31) - 1), r"multiplier=-2147483649"),
    (dict(bias=np.zeros(P + 1, int)), r"bias has shape \(5,\): must be \(4,\)"),
    (dict(bias=np.full(P, 1 << 31)), r"bias has values outside signed 32-bit range"),
    (dict(x=np.zeros((P + 1, 1), int)), r"x has shape \(5, 1\)"),
    (dict(x=np.full((P, 1), 1 << 31)), r"x has values outside acc_bits=32 range"),
    (dict(function=2), r"function=2: must be one of 0 \(identity\), 1 \(relu\)"),
    (dict(out_int32=2), r"out_int32=2: must be 0 \(int8\) or 1 \(int32\)"),
])
def test_bad_arguments_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _call(**changes)


def test_acc_bits_range_is_the_configs():
    with pytest.raises(ValueError, match=r"x has values outside acc_bits=16 range "
                                         r"\[-32768, 32767\]"):
        _call(TINY16, x=np.full((P, 1), 32768))
