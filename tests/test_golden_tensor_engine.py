import numpy as np
import pytest

from opentrn import config, numerics
from opentrn.golden import tensor_engine as golden
from opentrn.golden.processing_element import mac, mac_float, wrap

TINY = config.preset("tiny")
TINY16 = TINY.replace(dtypes=("int8",), acc_bits=16)


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


def test_fast_weight_load_intervals():
    """The skewed load starts the cycle after a swap: a fresh tile every max(N, M + 1)."""
    cfg = config.preset("small").replace(fast_weight_load=1)
    assert golden.reload_guard(cfg) == 1
    assert golden.issue_interval(cfg, 2, fresh=True) == 9
    assert golden.issue_interval(cfg, 12, fresh=True) == 12
    fresh = golden.schedule(cfg, _program(cfg, [2] * 6, [True] * 6))
    assert fresh.load_starts[1:] == [start + 1 for start in fresh.starts[:-1]]
    assert np.diff(fresh.starts).tolist() == [9] * 5
    assert golden.issue_interval(config.preset("trn3").replace(fast_weight_load=1), 64,
                                 fresh=True) == 129


def test_two_column_fast_weight_load_intervals():
    """Two columns a beat into three banks: a load of M / 2 cycles waits for the swap two
    tiles back plus M / 2 - 1 cycles, so fresh tiles issue every max(N, M / 2); 64 at
    trn3's 128x128."""
    cfg = config.preset("small").replace(fast_weight_load=2)
    assert (golden.load_cycles(cfg), golden.reload_guard(cfg)) == (4, 3)
    assert golden.issue_interval(cfg, 1, fresh=True) == 4
    assert golden.issue_interval(cfg, 6, fresh=True) == 6
    fresh = golden.schedule(cfg, _program(cfg, [1] * 8, [True] * 8))
    assert np.diff(fresh.load_starts).tolist() == [4] * 7       # back to back
    assert np.diff(fresh.starts).tolist()[1:] == [4] * 6
    # Long matmuls: a load waits for the swap two tiles back (tile 3's bank held tile 0,
    # retired by tile 1's swap) plus the guard.
    long = golden.schedule(cfg, _program(cfg, [10] * 6, [True] * 6))
    assert long.load_starts[3:] == [start + 3 for start in long.starts[1:4]]
    assert np.diff(long.starts).tolist() == [10] * 5
    trn3 = config.preset("trn3")
    assert trn3.fast_weight_load == 2 and trn3.weight_banks == 3
    assert golden.issue_interval(trn3, 1, fresh=True) == 64
    assert golden.issue_interval(trn3, 100, fresh=True) == 100
    # The smallest array: M / 2 = 1 cycle a load, the guard at its least.
    tiny = config.preset("tiny").replace(pe_cols=2, fast_weight_load=2)
    assert (golden.load_cycles(tiny), golden.reload_guard(tiny)) == (1, 1)
    assert golden.issue_interval(tiny, 1, fresh=True) == 1


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


def _float32_mac(psum, x, weight, fmt, scale_weight=None, scale_x=None):
    """numpy: the product exact in float64 (times ``2**(scale_weight + scale_x - 254)``
    for MX, NaN for a scale of 255) rounded to float32, then the float32 sum; NaN results
    canonical."""
    element = numerics.data_format(fmt).element
    with np.errstate(all="ignore"):
        product = (numerics.from_bits(weight, element).astype(np.float64)
                   * numerics.from_bits(x, element).astype(np.float64))
        if scale_weight is not None:
            # Two factors, each exact in float64 (a single 2**(sw + sx - 254) may not be).
            sw, sx = np.asarray(scale_weight), np.asarray(scale_x)
            product = product * 2.0 ** (sw - 127.0) * 2.0 ** (sx - 127.0)
            product = np.where((sw == 255) | (sx == 255), np.nan, product)
        total = np.float32(numerics.from_bits(psum, numerics.FP32) + np.float32(product))
    codes = np.asarray(total).view(np.uint32).copy()
    codes[np.isnan(np.asarray(total))] = numerics.CANONICAL_NAN32
    return codes


def _edge_scales(rng, shape):
    """E8M0 codes: the edges (0, 1, 127, 254, 255) and codes near 127, half and half."""
    return np.where(rng.random(shape) < 0.5, rng.choice([0, 1, 127, 254, 255], shape),
                    rng.integers(110, 145, shape))


@pytest.mark.parametrize("fmt", ["bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"])
def test_mac_float_equals_float32_arithmetic(fmt):
    element = numerics.data_format(fmt).element
    rng = np.random.default_rng(5)
    x = _random_codes(rng, element, 20000, 0.3)
    weight = _random_codes(rng, element, 20000, 0.3)
    psum = np.where(rng.random(20000) < 0.5,
                    numerics.to_bits(rng.standard_normal(20000).astype(np.float32), "fp32"),
                    rng.integers(0, 1 << 32, 20000)).astype(np.int64)
    scales = {}
    if numerics.data_format(fmt).mx:
        scales = {"scale_weight": _edge_scales(rng, 20000), "scale_x": _edge_scales(rng, 20000)}
    got = mac_float(psum, x, weight, fmt, **scales)
    np.testing.assert_array_equal(got, _float32_mac(psum, x, weight, fmt, **scales))
    if scales:
        # The scales reached the results: overflow, FP32 subnormals, the E8M0 NaN.
        values = numerics.from_bits(got, numerics.FP32)
        assert np.isinf(values).any() and (np.abs(values) < 2.0 ** -126).any()
        nan_scale = (scales["scale_weight"] == 255) | (scales["scale_x"] == 255)
        assert (got[nan_scale] == numerics.CANONICAL_NAN32).all() and nan_scale.any()


def test_mac_float_refuses_bad_arguments():
    with pytest.raises(ValueError, match="format='int8': must be a float tensor format the PE "
                                         "implements"):
        mac_float(0, 0, 0, "int8")
    with pytest.raises(ValueError, match="format='fp32': must be a float tensor format"):
        mac_float(0, 0, 0, "fp32")
    for kwargs in ({}, {"scale_weight": 127}, {"scale_x": 127}):
        with pytest.raises(ValueError, match="format='mxfp8e4m3': scale_weight and scale_x "
                                             "are required"):
            mac_float(0, 0, 0, "mxfp8e4m3", **kwargs)
    for kwargs in ({"scale_weight": 127}, {"scale_x": 127}):
        with pytest.raises(ValueError, match="format='fp8e4m3': takes no scales"):
            mac_float(0, 0, 0, "fp8e4m3", **kwargs)


@pytest.mark.parametrize("fmt", ["bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"])
def test_matmul_float_is_the_systolic_chain_of_macs(fmt):
    """matmul_float is what the array computes: the partial sum enters the top row as +0
    and goes through ``mac_float`` once per row; for MX, row k with the scales of block
    k // 32 (here 70 rows: three blocks, the last one partial)."""
    element = numerics.data_format(fmt).element
    mx = numerics.data_format(fmt).mx
    rows = 70 if mx else 4
    rng = np.random.default_rng(9)
    for _ in range(20 if not mx else 6):
        stationary = _random_codes(rng, element, (rows, 4), 0.1 if not mx else 0.005)
        moving = _random_codes(rng, element, (rows, 3), 0.1 if not mx else 0.005)
        scales, out = {}, np.zeros((4, 3), np.uint32)
        if mx:
            scales = {"scale_stationary": rng.integers(117, 138, (3, 4)),
                      "scale_moving": rng.integers(117, 138, (3, 3))}
        for k in range(rows):
            row_scales = {}
            if mx:
                block = k // numerics.MX_BLOCK
                row_scales = {"scale_weight": scales["scale_stationary"][block][:, None],
                              "scale_x": scales["scale_moving"][block][None, :]}
            out = mac_float(out, moving[k][None, :], stationary[k][:, None], fmt, **row_scales)
        np.testing.assert_array_equal(golden.matmul_float(stationary, moving, fmt, **scales),
                                      out)


def test_matmul_bits_reads_the_low_bits_of_the_format():
    """Raw 16-bit registers: int8 vectors use the low byte (sign-extended), FP8 vectors the
    low byte as a code, BF16 all 16 bits; so a tile loaded as one format can serve another."""
    rng = np.random.default_rng(3)
    raw_s = rng.integers(0, 1 << 16, (4, 4))
    raw_x = rng.integers(0, 1 << 16, (4, 5))
    as_int8 = lambda bits: ((bits & 0xFF) ^ 0x80) - 0x80  # noqa: E731
    np.testing.assert_array_equal(golden.matmul_bits(TINY, raw_s, raw_x, "int8"),
                                  golden.matmul(TINY, as_int8(raw_s), as_int8(raw_x)))
    for fmt in ("fp8e4m3", "fp8e5m2"):
        np.testing.assert_array_equal(golden.matmul_bits(TINY, raw_s, raw_x, fmt),
                                      golden.matmul_float(raw_s & 0xFF, raw_x & 0xFF, fmt))
    np.testing.assert_array_equal(golden.matmul_bits(TINY, raw_s, raw_x, "bf16"),
                                  golden.matmul_float(raw_s, raw_x, "bf16"))
    assert golden.matmul_bits(TINY, raw_s, raw_x, "bf16").dtype == np.int64
    # element_bits: the registers' contents for values of a format.
    assert golden.element_bits([-1, -128, 127], "int8").tolist() == [0xFF, 0x80, 0x7F]
    assert golden.element_bits([0xFFFF], "bf16").tolist() == [0xFFFF]


@pytest.mark.parametrize("call, error, message", [
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4), int), np.zeros((4, 1), int), "fp32"),
     ValueError, "format='fp32': must be one of int8, bf16, fp8e4m3, fp8e5m2, mxfp8e4m3, "
                 "mxfp8e5m2$"),
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4), int), np.zeros((4, 1), int),
                                "mxfp8e4m3"),
     ValueError, "scale_stationary and scale_moving are required"),
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4), int), np.zeros((4, 1), int), "fp8e4m3",
                                scale_stationary=np.zeros((1, 4), int),
                                scale_moving=np.zeros((1, 1), int)),
     ValueError, "format='fp8e4m3': takes no scales"),
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4), int), np.zeros((4, 1), int), "int8",
                                scale_moving=np.zeros((1, 1), int)),
     ValueError, "format='int8': takes no scales"),
    (lambda: golden.matmul_bits(TINY, np.full((4, 4), 1 << 16), np.zeros((4, 1), int),
                                "bf16"), ValueError, r"stationary: raw bits must lie in"),
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4), int), np.full((4, 1), -1), "int8"),
     ValueError, r"moving: raw bits must lie in \[0, 65535\] \(in_bits=16\)"),
    (lambda: golden.matmul_bits(TINY, np.zeros((4, 4)), np.zeros((4, 1), int), "int8"),
     TypeError, "stationary: must hold integers"),
    (lambda: golden.element_bits([128], "int8"), ValueError, "outside int8 range"),
    (lambda: golden.element_bits([256], "fp8e4m3"), ValueError,
     r"fp8e4m3 codes must lie in \[0, 255\]"),
])
def test_matmul_bits_refuses_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- MX scales in the engine ------------------------------------------------------------------

TINY_MX = TINY.replace(dtypes=("int8", "bf16", "fp8e4m3", "mxfp8e4m3", "mxfp8e5m2"))
TINY_FLOAT = TINY.replace(dtypes=("int8", "bf16", "fp8e4m3", "fp8e5m2"))
MX64 = TINY.replace(pe_rows=64, pe_cols=2, sbuf_partitions=64, dtypes=("int8", "mxfp8e4m3"))


def test_mx_blocks():
    assert golden.mx_blocks(TINY_FLOAT) == 0 and golden.mx_blocks(TINY16) == 0
    assert golden.mx_blocks(TINY_MX) == 1
    assert golden.mx_blocks(MX64) == 2
    assert golden.mx_blocks(MX64.replace(pe_rows=128, sbuf_partitions=128)) == 4
    # Trainium3: 128 rows of 4 MXFP8 elements each, K = 512: 16 blocks of 8 partitions x 4
    # elements (nki.isa.nc_matmul_mx).
    trn3 = config.preset("trn3")
    assert golden.mx_blocks(trn3) == 16 and numerics.mx_block_rows(trn3) == 8
    assert golden.contraction(trn3, "mxfp8e4m3") == 512
    assert golden.contraction(trn3, "bf16") == 128


def test_matmul_bits_takes_mx_scales():
    """An MX format: the low byte of the raw bits as the element's codes, scaled per
    block."""
    rng = np.random.default_rng(4)
    raw_s, raw_x = rng.integers(0, 1 << 8, (64, 2)), rng.integers(0, 1 << 8, (64, 3))
    scales = {"scale_stationary": rng.integers(100, 150, (2, 2)),
              "scale_moving": rng.integers(100, 150, (2, 3))}
    got = golden.matmul_bits(MX64, raw_s, raw_x, "mxfp8e4m3", **scales)
    np.testing.assert_array_equal(got, golden.matmul_float(raw_s, raw_x, "mxfp8e4m3",
                                                           **scales))
    np.testing.assert_array_equal(got, float_reference(raw_s, raw_x, "mxfp8e4m3",
                                                       scales["scale_stationary"],
                                                       scales["scale_moving"]))


def _ones(cfg, fmt, cols):
    one = int(numerics.to_bits(np.float32(1.0), numerics.data_format(fmt).element))
    return np.full((cfg.pe_rows, cols), one, dtype=np.int64)


def test_run_keeps_a_reused_tiles_scales():
    """A reused tile keeps the scales it was loaded with, whatever format it was loaded
    as; every row takes its block's scales, and vectors of other formats ignore them."""
    cfg, fmt = MX64, "mxfp8e4m3"
    block = np.arange(64)[:, None] // 32
    tile_scales = np.array([[127, 120], [130, 140]])
    x_scales = np.array([[127, 125], [127, 126]])
    int8_tile = np.where(block == 0, 1, 2) * np.ones((64, 2), np.int64)
    program = [
        golden.Matmul(_ones(cfg, fmt, 2), _ones(cfg, fmt, 2), fmt, scale_moving=x_scales,
                      scale_stationary=tile_scales),
        golden.Matmul(_ones(cfg, fmt, 2), None, fmt, scale_moving=x_scales),
        golden.Matmul(np.ones((64, 1), np.int64), int8_tile, "int8",
                      scale_moving=np.array([[255], [255]]),
                      scale_stationary=np.array([[127, 127], [128, 126]])),
        # MX vectors meet the int8 tile's raw bits (1, 2: E4M3 subnormals 2**-9, 2**-8)
        # with the scales stored with it.
        golden.Matmul(_ones(cfg, fmt, 1), None, fmt, scale_moving=np.array([[127], [127]])),
    ]
    first, second, third, fourth = golden.run(cfg, program)
    value = lambda codes: numerics.from_bits(codes.astype(np.uint32), "fp32")  # noqa: E731
    # Column m, vector n: 32 * 2**(s[0, m] + x[0, n] - 254) + 32 * 2**(s[1, m] + x[1, n] - 254).
    want = np.array([[32 * 2.0 ** (ts[0] + xs[0] - 254) + 32 * 2.0 ** (ts[1] + xs[1] - 254)
                      for xs in x_scales.T] for ts in tile_scales.T])
    np.testing.assert_array_equal(value(first), want)
    np.testing.assert_array_equal(second, first)
    assert third.tolist() == [[32 * 1 + 32 * 2]] * 2          # int8: the scales ignored
    want = [32 * 2.0 ** -9 + 32 * 2.0 ** -8 * 2.0 ** (128 - 127),
            32 * 2.0 ** -9 + 32 * 2.0 ** -8 * 2.0 ** (126 - 127)]
    np.testing.assert_array_equal(value(fourth)[:, 0], want)


def test_run_checks_the_scales():
    fmt = "mxfp8e4m3"
    moving, tile = _ones(MX64, fmt, 1), _ones(MX64, fmt, 2)
    scales = {"scale_moving": np.full((2, 1), 127), "scale_stationary": np.full((2, 2), 127)}
    golden.run(MX64, [golden.Matmul(moving, tile, fmt, **scales)])
    cases = [
        (MX64, [golden.Matmul(moving, tile, fmt, scale_moving=scales["scale_moving"])],
         "scale_stationary: required on a build with an MX format"),
        (MX64, [golden.Matmul(np.zeros((64, 1), np.int64), np.zeros((64, 2), np.int64),
                              scale_stationary=scales["scale_stationary"])],
         "scale_moving: required on a build with an MX format"),
        (MX64, [golden.Matmul(moving, tile, fmt, scale_moving=np.full((1, 1), 127),
                              scale_stationary=scales["scale_stationary"])],
         r"scale_moving has shape \(1, 1\): must be \(2, 1\)"),
        (MX64, [golden.Matmul(moving, tile, fmt, scale_moving=np.full((2, 1), 256),
                              scale_stationary=scales["scale_stationary"])],
         r"scale_moving: must hold E8M0 codes \(integers 0..255\)"),
        (MX64, [golden.Matmul(moving, tile, fmt, **scales),
                golden.Matmul(moving, None, fmt, **scales)],
         "scale_stationary: a reused tile keeps its scales"),
        (TINY_FLOAT, [golden.Matmul(np.zeros((4, 1), np.int64), np.zeros((4, 4), np.int64),
                              scale_moving=np.full((1, 1), 127),
                              scale_stationary=np.full((1, 4), 127))],
         "scale_stationary: the build has no MX format"),
        (MX64, [golden.Matmul(moving, None, fmt, **scales)],
         "the first matmul of a program must load a stationary tile"),
    ]
    for cfg, program, message in cases:
        with pytest.raises(ValueError, match=message):
            golden.run(cfg, program)
