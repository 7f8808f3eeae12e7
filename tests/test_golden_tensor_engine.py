import numpy as np
import pytest

from opentrn import config, numerics
from opentrn.golden import tensor_engine as golden
from opentrn.golden.processing_element import mac, wrap

TINY = config.preset("tiny")
TINY16 = TINY.replace(acc_bits=16)


def systolic_reference(cfg, stationary, moving):
    """The array, PE by PE: partial sums flow down each column through ``mac``, wrapping at
    every step as the hardware does."""
    k_rows, m_cols = stationary.shape
    out = np.zeros((m_cols, moving.shape[1]), dtype=np.int64)
    for n in range(moving.shape[1]):
        for m in range(m_cols):
            psum = 0
            for k in range(k_rows):
                psum = int(mac(psum, moving[k, n], stationary[k, m], cfg.acc_bits))
            out[m, n] = psum
    return out


@pytest.mark.parametrize("cfg", [TINY, TINY16, config.preset("small")])
def test_matmul_equals_the_systolic_order(cfg):
    rng = np.random.default_rng(7)
    for _ in range(50):
        stationary = rng.integers(-128, 128, (cfg.pe_rows, cfg.pe_cols))
        moving = rng.integers(-128, 128, (cfg.pe_rows, int(rng.integers(1, cfg.moving_max + 1))))
        assert np.array_equal(golden.matmul(cfg, stationary, moving),
                              systolic_reference(cfg, stationary, moving))


def test_wrap_around():
    k = TINY16.pe_rows
    full = np.full((k, 1), -128)
    # K * (-128 * -128) = 65536 wraps to 0 in 16 bits; K * 127 * 127 = 64516 wraps to -1020.
    assert golden.matmul(TINY16, np.full((k, 4), -128), full)[0, 0] == 0
    assert golden.matmul(TINY16, np.full((k, 4), 127), np.full((k, 1), 127))[0, 0] == -1020
    assert golden.matmul(TINY, np.full((k, 4), 127), np.full((k, 1), 127))[0, 0] == 64516
    assert list(wrap([2**31, -2**31 - 1, 5], 32)) == [-2**31, 2**31 - 1, 5]


def test_matmul_rejects_bad_operands():
    with pytest.raises(ValueError, match=r"moving has shape \(4, 17\): must be \(4, 1..16\)"):
        golden.matmul(TINY, np.zeros((4, 4)), np.zeros((4, 17)))
    with pytest.raises(ValueError, match=r"stationary has shape \(3, 4\)"):
        golden.matmul(TINY, np.zeros((3, 4)), np.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"outside int8 range \[-128, 127\]"):
        golden.matmul(TINY, np.full((4, 4), 128), np.zeros((4, 1)))


def test_formulas():
    small = config.preset("small")
    assert golden.latency(TINY) == 7 and golden.latency(small) == 15
    assert golden.load_cycles(small) == 8
    assert golden.issue_interval(small, 4, fresh=True) == 16
    assert golden.issue_interval(small, 32, fresh=True) == 32
    assert golden.issue_interval(small, 4, fresh=False) == 4


def _program(cfg, ns, fresh):
    k, m = cfg.pe_rows, cfg.pe_cols
    return [golden.Matmul(np.zeros((k, n), dtype=np.int64),
                          np.zeros((k, m), dtype=np.int64) if f else None)
            for n, f in zip(ns, fresh, strict=True)]


def test_schedule_single_matmul():
    # Load in cycles 0..M-1, vectors from cycle M, results K + M - 1 later.
    timing = golden.schedule(TINY, _program(TINY, [3], [True]))
    assert timing.load_starts == [0]
    assert timing.starts == [4]
    assert timing.result_cycles == [[11, 12, 13]]
    assert timing.total_cycles == 14


def test_schedule_steady_state_intervals():
    cfg = config.preset("small")
    fresh = golden.schedule(cfg, _program(cfg, [2] * 6, [True] * 6))
    assert np.diff(fresh.starts).tolist()[1:] == [16] * 4       # max(N, K + M)
    long = golden.schedule(cfg, _program(cfg, [20] * 6, [True] * 6))
    assert np.diff(long.starts).tolist() == [20] * 5            # N >= K + M: no idle cycle
    reuse = golden.schedule(cfg, _program(cfg, [3] * 6, [True] + [False] * 5))
    assert np.diff(reuse.starts).tolist() == [3] * 5


def test_schedule_needs_a_first_tile():
    with pytest.raises(ValueError, match="first matmul of a program must load"):
        golden.schedule(TINY, _program(TINY, [1], [False]))


# -- floating point ---------------------------------------------------------------------------

def float_reference(stationary, moving, fmt, scale_s=None, scale_x=None, psum=None):
    """numpy float arithmetic, element by element in the documented order: each product
    exact in float64 (times its MX scales), rounded to float32; each sum in float32; NaN
    results as the canonical NaN."""
    element = numerics.data_format(fmt).element
    s = numerics.from_bits(stationary, element).astype(np.float64)
    x = numerics.from_bits(moving, element).astype(np.float64)
    k, m = s.shape
    n = x.shape[1]
    out = np.zeros((m, n), np.float32)
    with np.errstate(all="ignore"):
        for i in range(m):
            for j in range(n):
                acc = np.float32(0.0)
                for row in range(k):
                    product = s[row, i] * x[row, j]
                    if scale_s is not None:
                        block = row // numerics.MX_BLOCK
                        sa, sb = int(scale_s[block, i]), int(scale_x[block, j])
                        if 255 in (sa, sb):
                            product = np.nan
                        else:
                            product = product * 2.0 ** (sa - 127) * 2.0 ** (sb - 127)
                    acc = np.float32(acc + np.float32(product))
                if psum is not None:
                    acc = np.float32(numerics.from_bits(psum[i, j], numerics.FP32) + acc)
                out[i, j] = acc
    codes = out.view(np.uint32).copy()
    codes[np.isnan(out)] = numerics.CANONICAL_NAN32
    return codes


def _random_codes(rng, element, shape, special_share):
    """Codes of ``element``, mostly finite values of moderate size (so that sums cancel and
    round), with a share of arbitrary codes (zeros, subnormals, infinities, NaN)."""
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
    codes = numerics.to_bits(values.astype(np.float32), element).astype(np.int64)
    sign = 1 << (element.bits - 1)
    specials = [0, sign, 1, sign | 1, element.max_finite_bits, sign | element.max_finite_bits,
                element.canonical_nan]
    if element.has_inf:
        infinity = element.exp_max_field << element.man_bits
        specials += [infinity, sign | infinity]
    arbitrary = np.where(rng.random(shape) < 0.5, rng.choice(specials, shape),
                         rng.integers(0, 1 << element.bits, shape))
    return np.where(rng.random(shape) < special_share, arbitrary, codes)


@pytest.mark.parametrize("fmt", ["bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"])
def test_float_matmul_equals_float32_arithmetic_in_the_documented_order(fmt):
    rng = np.random.default_rng(11)
    element = numerics.data_format(fmt).element
    mx = numerics.data_format(fmt).mx
    classes = {"nan": 0, "inf": 0, "finite": 0}
    for trial in range(40):
        k = int(rng.integers(1, 70 if mx else 9))
        m, n = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        special = 0.0 if trial % 2 else 0.05
        stationary = _random_codes(rng, element, (k, m), special)
        moving = _random_codes(rng, element, (k, n), special)
        scales = {}
        if mx:
            blocks = -(-k // numerics.MX_BLOCK)
            # Scales near 127 (products of ordinary size) and extreme ones (overflow, and
            # underflow into FP32 subnormals), now and then the E8M0 NaN.
            choice = rng.integers(0, 10, (2, blocks, max(m, n)))
            near = rng.integers(117, 138, (2, blocks, max(m, n)))
            extreme = rng.choice([1, 2, 20, 230, 250, 254, 255], (2, blocks, max(m, n)))
            both = np.where(choice < 8, near, extreme)
            scales = {"scale_stationary": both[0, :, :m], "scale_moving": both[1, :, :n]}
        psum = None
        if trial % 3 == 0:
            psum = numerics.to_bits(rng.standard_normal((m, n)).astype(np.float32), "fp32")
        got = golden.matmul_float(stationary, moving, fmt, psum=psum, **scales)
        expected = float_reference(stationary, moving, fmt, scales.get("scale_stationary"),
                                   scales.get("scale_moving"), psum)
        np.testing.assert_array_equal(got, expected)
        values = numerics.from_bits(got, numerics.FP32)
        classes["nan"] += int(np.isnan(values).sum())
        classes["inf"] += int(np.isinf(values).sum())
        classes["finite"] += int(np.isfinite(values).sum())
    if not (element.has_inf or mx):
        # E4M3 has no infinity and its products and their sums stay far below FP32's range.
        assert classes.pop("inf") == 0
    assert all(count > 0 for count in classes.values()), classes


def test_float_matmul_order_is_observable():
    """The order is part of the result: big + small - big is not small + big - big."""
    big, small = numerics.to_bits(np.float32(2.0**30), "bf16"), numerics.to_bits(1.0, "bf16")
    one = numerics.to_bits(1.0, "bf16")
    minus_big = numerics.to_bits(np.float32(-(2.0**30)), "bf16")
    stationary = np.array([[big], [small], [minus_big]])
    moving = np.array([[one], [one], [one]])
    assert golden.matmul_float(stationary, moving, "bf16")[0, 0] == 0          # 1 is absorbed
    reordered = stationary[[1, 0, 2]]
    assert golden.matmul_float(reordered, moving, "bf16")[0, 0] == 0
    stationary = np.array([[big], [minus_big], [small]])
    assert golden.matmul_float(stationary, moving, "bf16")[0, 0] == 0x3F800000   # exactly 1


def test_float_matmul_refuses_bad_arguments():
    codes = np.zeros((4, 2), np.int64)
    with pytest.raises(ValueError, match="format='int8': must be a float tensor format"):
        golden.matmul_float(codes, codes, "int8")
    with pytest.raises(ValueError, match="scale_stationary and scale_moving are required"):
        golden.matmul_float(codes, codes, "mxfp8e4m3")
    with pytest.raises(ValueError, match="takes no scales"):
        golden.matmul_float(codes, codes, "bf16", scale_stationary=np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"scale_moving has shape \(2, 2\): must be \(1, 2\)"):
        golden.matmul_float(codes, codes, "mxfp8e5m2", scale_stationary=np.zeros((1, 2), int),
                            scale_moving=np.zeros((2, 2), int))
