"""The activation engine's golden model. Integer path: against hand-computed cases,
Python's own half-to-even rounding of exact fractions, and numpy's float64 ``rint``. Float
path: against numpy float32 arithmetic and ml_dtypes casts, code for code (NaN results
canonical), on edge values and weighted random codes, for every output format and
function."""

import random
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from opentrn import config
from opentrn.golden import activation_engine as golden

TINY = config.preset("tiny")
TINY16 = TINY.replace(dtypes=("int8",), acc_bits=16)
SMALL = config.preset("small")
P = TINY.pe_cols
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _int_format(out_int32):
    return "int32" if out_int32 else "int8"


def act(cfg, x, *, function=golden.IDENTITY, multiplier=1, shift=0, bias=0, out_int32=1):
    """(``out_int32`` picks ``out_format`` int32 or int8.)"""
    """``activate`` on a list of values, lane by lane (padded to whole vectors of
    ``pe_cols`` with zeros), with one bias for every partition."""
    values = list(x)
    lanes = cfg.pe_cols
    padded = values + [0] * (-len(values) % lanes)
    matrix = np.array(padded, dtype=np.int64).reshape(-1, lanes).T
    out = golden.activate(cfg, matrix, function=function, multiplier=multiplier, shift=shift,
                          bias=np.full(lanes, bias, dtype=np.int64),
                          out_format=_int_format(out_int32))
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
                                  shift=shift, bias=bias, out_format=_int_format(out_int32))
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
                lo, hi = golden.output_range(TINY16, _int_format(out_int32))
                want = np.clip(r, lo, hi).astype(np.int64)
                got = golden.activate(TINY16, x, function=function, multiplier=multiplier,
                                      shift=shift, bias=bias,
                                      out_format=_int_format(out_int32))
                np.testing.assert_array_equal(got, want)
    assert ties > 0 or not 0 < shift <= 31


def test_shapes_and_range():
    x = np.arange(P * 5).reshape(P, 5) - 10
    out = golden.activate(TINY, x, function=0, multiplier=1, shift=0, bias=np.zeros(P, int),
                          out_format="int8")
    assert out.shape == (P, 5) and out.dtype == np.int64
    np.testing.assert_array_equal(out, x)
    one = golden.activate(TINY, x[:, 0], function=0, multiplier=1, shift=0,
                          bias=np.zeros(P, int), out_format="int8")
    assert one.shape == (P,)
    # Per-partition bias: partition p gets bias[p].
    out = golden.activate(TINY, np.zeros((P, 2), int), function=0, multiplier=1, shift=0,
                          bias=np.arange(P), out_format="int8")
    np.testing.assert_array_equal(out, np.repeat(np.arange(P)[:, None], 2, axis=1))


def test_latency():
    assert golden.latency(TINY) == golden.latency(SMALL) == golden.latency(TINY16) == 4


def _call(cfg=TINY, **changes):
    args = dict(x=np.zeros((P, 1), int), function=0, multiplier=1, shift=0,
                bias=np.zeros(P, int), out_format="int8")
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
    (dict(out_format="int16"), r"out_format='int16': must be one of int8, bf16, fp8e4m3, "
                               r"fp8e5m2, fp32, int32 \(the output formats of "
                               r"dtypes=int8,bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,mxfp8e5m2\)"),
    (dict(out_format="mxfp8e4m3"), r"out_format='mxfp8e4m3': must be one of"),
    (dict(out_format="bf16", shift=1), r"shift=1: must be 0 for the float out_format bf16"),
    (dict(out_format="fp32", multiplier=1 << 32),
     r"multiplier=4294967296: must be an FP32 code, as a signed or unsigned 32-bit integer"),
    (dict(out_format="fp32", bias=np.full(P, 1 << 32)),
     r"bias has values outside \[-2\*\*31, 2\*\*32\): must be FP32 codes"),
    (dict(out_format="fp8e5m2", x=np.full((P, 1), -(1 << 31) - 1)),
     r"x has values outside \[-2\*\*31, 2\*\*32\)"),
    (dict(out_format=1), r"out_format=1: must be one of"),
])
def test_bad_arguments_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _call(**changes)


def test_int8_only_build_has_no_float_outputs():
    with pytest.raises(ValueError, match=r"out_format='bf16': must be one of int8, int32 "
                                         r"\(the output formats of dtypes=int8\)"):
        _call(SMALL.replace(pe_cols=P), out_format="bf16")
    # Without int8 there is no integer path: its output formats are refused by name.
    with pytest.raises(ValueError, match=r"out_format='int8': must be one of bf16, fp32 "
                                         r"\(the output formats of dtypes=bf16\)"):
        _call(TINY.replace(dtypes=("bf16",)), out_format="int8")


def test_acc_bits_range_is_the_configs():
    with pytest.raises(ValueError, match=r"x has values outside acc_bits=16 range "
                                         r"\[-32768, 32767\]"):
        _call(TINY16, x=np.full((P, 1), 32768))


# -- the float path ------------------------------------------------------------------------------

#: numpy types of the float output formats, and their unsigned views.
NUMPY_TYPES = {"fp32": (np.float32, np.uint32), "bf16": (ml_dtypes.bfloat16, np.uint16),
               "fp8e4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
               "fp8e5m2": (ml_dtypes.float8_e5m2, np.uint8)}
CANONICAL_NAN = np.uint32(0x7FC00000).view(np.float32)
#: FP32 edge codes: zeros of both signs, infinities, NaNs (quiet, signalling, negative,
#: with payloads), the largest finite values, subnormals (smallest, largest), the smallest
#: normal, 1, a bf16 tie (1 + 2**-8) and its odd neighbour, the fp8e4m3 overflow
#: midpoint 464 and its neighbours, fp8e5m2's largest finite 57344 and its midpoint 61440.
EDGES = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                  0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001,
                  0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000,
                  0x43E80000, 0x43E7FFFF, 0x43E80001, 0x47600000, 0x47700000, 0xC7700000,
                  0x3B000000, 0x3A800000], dtype=np.int64)


def as_float(codes):
    return np.asarray(codes, np.int64).astype(np.uint32).view(np.float32)


def s32(codes):
    """Codes as signed 32-bit values (the instruction's s32 field, a PSUM entry)."""
    return np.where(codes >= 1 << 31, codes - (1 << 32), codes)


def reference(x, scale, bias, function, out_format):
    """The float path in numpy float32 arithmetic and an ml_dtypes cast: ``x`` FP32 codes
    ``[P, N]``, ``scale`` a code, ``bias`` codes ``[P]``; NaN results canonical after each
    arithmetic step (the FP units' rule), relu on the sign bit."""
    with np.errstate(all="ignore"):
        y = as_float(x) * as_float(scale)
        y = np.where(np.isnan(y), CANONICAL_NAN, y)
        y = y + as_float(bias)[:, None]
        y = np.where(np.isnan(y), CANONICAL_NAN, y).astype(np.float32)
        if function == golden.RELU:
            y = np.where(np.signbit(y) & ~np.isnan(y), np.float32(0), y).astype(np.float32)
        numpy_type, view = NUMPY_TYPES[out_format]
        return y.astype(numpy_type).view(view).astype(np.int64)


def _random_codes(rng, shape):
    """FP32 codes weighted to the corners: edge codes, moderate values (results in every
    format's normal range), values near the narrow formats' ranges (subnormal and overflow
    results), and any code."""
    roll = rng.random(shape)
    moderate = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape))
    moderate = moderate.astype(np.float32).view(np.uint32).astype(np.int64)
    exponent = rng.integers(100, 145, shape)          # about 2**-27 .. 2**17
    near = (rng.integers(0, 2, shape) << 31) | (exponent << 23) | rng.integers(0, 1 << 23, shape)
    any_code = rng.integers(0, 1 << 32, shape)
    return np.select([roll < 0.2, roll < 0.55, roll < 0.85],
                     [rng.choice(EDGES, shape), moderate, near], any_code)


@pytest.mark.parametrize("out_format", golden.FLOAT_FORMATS)
@pytest.mark.parametrize("function", [golden.IDENTITY, golden.RELU])
def test_float_path_against_numpy(out_format, function):
    """Random and edge codes of x, the scale and the bias, bit for bit; the test asserts
    that NaN, zero and subnormal results, -0 inputs and (narrow formats) cast overflow
    were met."""
    rng = np.random.default_rng([function, len(out_format)])
    met = dict(nan=0, zero=0, subnormal=0, overflow=0, negative_zero_in=0)
    element = NUMPY_TYPES[out_format]
    scales = list(EDGES) + [int(c) for c in _random_codes(rng, 60)]
    for index, scale in enumerate(scales):
        x = _random_codes(rng, (P, 64))
        x[:, 0] = 0x80000000                            # -0 * scale: the bias decides
        bias = _random_codes(rng, P) if index % 3 else np.zeros(P, np.int64)
        multiplier = int(s32(np.int64(scale))) if index % 2 else int(scale)
        got = golden.activate(TINY, s32(x) if index % 2 else x, function=function,
                              multiplier=multiplier, shift=0, bias=bias,
                              out_format=out_format)
        want = reference(x, scale, bias, function, out_format)
        mismatch = np.argwhere(got != want)
        assert not mismatch.size, (hex(scale), [hex(int(x[tuple(i)])) for i in mismatch[:4]],
                                   got[tuple(mismatch[0])], want[tuple(mismatch[0])])
        assert got.dtype == np.int64 and got.min() >= 0
        values = want.astype(element[1]).view(element[0]).astype(np.float64)
        met["nan"] += int(np.isnan(values).sum())
        met["zero"] += int((values == 0).sum())
        tiny = float(ml_dtypes.finfo(element[0]).smallest_normal)
        met["subnormal"] += int(((values != 0) & (np.abs(values) < tiny)).sum())
        # Overflow in the cast: a finite FP32 result, an infinite or NaN code.
        finite32 = np.isfinite(as_float(reference(x, scale, bias, function, "fp32")))
        met["overflow"] += int(np.sum(finite32 & ~np.isfinite(values)))
        met["negative_zero_in"] += int(np.sum(x == 0x80000000))
    if out_format == "fp32":
        del met["overflow"]                             # the identity cast cannot overflow
    assert min(met.values()) > 0, met


def test_float_path_rules():
    """The documented rules on hand-picked cases (docs/numerics.md, "Activation")."""
    one, half, two = 0x3F800000, 0x3F000000, 0x40000000
    zero, negative_zero, inf, negative_inf = 0, 0x80000000, 0x7F800000, 0xFF800000

    def run(x, *, scale=one, bias=0, function=golden.IDENTITY, out_format="fp32"):
        x = np.full((P, 1), x, np.int64)
        out = golden.activate(TINY, x, function=function, multiplier=scale, shift=0,
                              bias=np.full(P, bias, np.int64), out_format=out_format)
        return int(out[0, 0])

    # Without a bias, -0 becomes +0 (the bias is +0); with a -0 bias it stays -0.
    assert run(negative_zero) == zero
    assert run(negative_zero, bias=negative_zero) == negative_zero
    # relu: -0, -inf and negative values to +0; NaN stays the canonical NaN.
    assert run(negative_zero, bias=negative_zero, function=golden.RELU) == zero
    assert run(negative_inf, function=golden.RELU) == zero
    assert run(0xBF800000, function=golden.RELU) == zero
    assert run(0xFFC12345, function=golden.RELU) == 0x7FC00000
    assert run(inf, scale=zero) == 0x7FC00000                     # inf * 0
    assert run(inf, bias=negative_inf) == 0x7FC00000              # inf + -inf
    # scale then bias, each rounded: (1 + 2**-23) * 0.5 + 0.5 = 1 + 2**-24 -> 1 (tie, even).
    assert run(0x3F800001, scale=half, bias=half) == one
    assert run(one, scale=two, bias=one) == 0x40400000            # 3
    # Casts: bf16 tie to even, fp8e4m3 overflow to NaN above 464, fp8e5m2 to infinity.
    assert run(0x3F808000, out_format="bf16") == 0x3F80
    assert run(0x3F818000, out_format="bf16") == 0x3F82
    assert run(0x43E80000, out_format="fp8e4m3") == 0x7E         # 464 -> 448
    assert run(0x43E80001, out_format="fp8e4m3") == 0x7F         # NaN
    assert run(0xC7700000, out_format="fp8e5m2") == 0xFC         # -61440 -> -inf
    assert run(0xFFC00000, out_format="bf16") == 0x7FC0          # canonical NaN, sign 0
    # The multiplier as the s32 field value and as the unsigned code agree.
    assert run(one, scale=-(1 << 31) + 0x3F800000) == run(one, scale=0xBF800000) == 0xBF800000
