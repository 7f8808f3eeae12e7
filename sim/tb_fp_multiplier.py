"""cocotb testbench of the floating-point multiplier (:mod:`opentrn.hdl.fp_multiplier`).

The multiplier is combinational: every step drives all lanes at once (one packed integer per
port), waits 1 ns and reads the packed products; after the run every product is compared
with the golden model (:mod:`opentrn.golden.fp_multiplier`) as an integer code.

Workloads: every FP8 x FP8 pair of ``fp8e4m3`` and ``fp8e5m2``; every pair again for the MX
formats with scales from :func:`random_scales`; random BF16 and FP32 pairs from the
corner-weighted :func:`random_operands`. The report counts what the run met (subnormal
results, overflows, the three sources of NaN, ties each way, zeros of both signs).

Run it through :mod:`opentrn.sim.runner`, which passes (as environment variables):

``OPENTRN_BF16_VECTORS``  random BF16 products (default 1000000);
``OPENTRN_FP32_VECTORS``  random FP32 products (default 100000);
``OPENTRN_SEED``          seed of the workload generators;
``OPENTRN_REPORT``        a JSON file the tests append their statistics to.
"""

import time
import zlib

import cocotb
import numpy as np
from cocotb.triggers import Timer

from opentrn import numerics
from opentrn.golden import fp_multiplier as golden

from . import harness

__all__ = ["special_codes", "random_operands", "random_scales", "exhaustive_pairs",
           "coverage"]


# -- workloads --------------------------------------------------------------------------------

def special_codes(element):
    """Codes of the values at the edges of ``element``, both signs: zero, the smallest and
    largest subnormal, the smallest normal, one, the largest finite value, infinity and
    NaNs (the canonical one, the all-ones one and, for ``ieee`` formats, a signalling one)."""
    man, sign = element.man_bits, 1 << (element.bits - 1)
    codes = [0, 1, (1 << man) - 1, 1 << man, element.bias << man, element.max_finite_bits,
             element.canonical_nan, (1 << (element.bits - 1)) - 1]
    if element.has_inf:
        codes += [element.exp_max_field << man, (element.exp_max_field << man) | 1]
    return np.array(codes + [code | sign for code in codes], dtype=np.int64)


def exhaustive_pairs(bits=8):
    """Every pair of ``bits``-bit codes: ``(a, b)``, ``a`` the slower-changing."""
    codes = np.arange(1 << bits, dtype=np.int64)
    return np.repeat(codes, 1 << bits), np.tile(codes, 1 << bits)


def _pack(element, sign, field, sig):
    """Codes from sign, exponent field and significand (hidden bit dropped)."""
    fraction = sig & ((1 << element.man_bits) - 1)
    return (sign << (element.bits - 1)) | (field << element.man_bits) | fraction


def _sig_with_zeros(rng, element, zeros):
    """Normal significands (hidden bit set) with exactly ``zeros`` trailing zero bits."""
    man = element.man_bits
    odd_bits = man - zeros                     # bits of the odd part below its top bit
    middle = rng.integers(0, 1 << np.maximum(odd_bits - 1, 0)) << 1
    odd = np.where(odd_bits > 0, (1 << odd_bits) | middle | 1, 1)
    return odd << zeros


def _exponents_for(rng, element, total):
    """Unbiased normal exponents ``(e_a, e_b)`` with ``e_a + e_b = total`` where possible
    (clipped to the normal range elsewhere)."""
    lo, hi = element.min_normal_exp, element.max_normal_exp
    first_lo = np.clip(total - hi, lo, hi)
    first_hi = np.clip(total - lo, lo, hi)
    e_a = rng.integers(first_lo, np.maximum(first_hi, first_lo) + 1)
    return e_a, np.clip(total - e_a, lo, hi)


def random_operands(format_name, rng, n):
    """``n`` random operand pairs ``(a, b)`` of the non-MX format ``format_name`` (BF16 and
    FP32 in the tests), weighted toward the corners:

    * 10% uniformly random codes (NaN payloads, infinities, anything);
    * 10% a value at the edge of the format (:func:`special_codes`) times a random code or
      another edge value;
    * 10% a subnormal operand times a random code or another subnormal;
    * 40% normal operands whose product lands near overflow (``E`` 125..130), in the FP32
      subnormal range (-151..-125), below it (-175..-150) or anywhere;
    * 30% exact ties: products ``odd * 2**-150`` (half the smallest subnormal: ties of the
      subnormal range) and, for formats wider than 12 significand bits, normal products
      whose bits below the FP32 significand are exactly ``100...0``.
    """
    element = numerics.data_format(format_name).element
    man, bias = element.man_bits, element.bias
    size = (n,)
    sign_a, sign_b = rng.integers(0, 2, size), rng.integers(0, 2, size)
    codes = 1 << element.bits

    uniform = rng.integers(0, codes, size), rng.integers(0, codes, size)

    specials = special_codes(element)
    edge = (rng.choice(specials, size),
            np.where(rng.random(size) < 0.5, rng.choice(specials, size),
                     rng.integers(0, codes, size)))

    subnormal_a = _pack(element, sign_a, 0, rng.integers(1, 1 << man, size))
    subnormal_b = np.where(rng.random(size) < 0.3,
                           _pack(element, sign_b, 0, rng.integers(1, 1 << man, size)),
                           rng.integers(0, codes, size))

    roll = rng.random(size)
    target = np.select(
        [roll < 0.3, roll < 0.6, roll < 0.8],
        [rng.integers(125, 131, size), rng.integers(-151, -124, size),
         rng.integers(-175, -149, size)],
        rng.integers(element.min_normal_exp, element.max_normal_exp + 1, size))
    # The product of significands in [1, 2) lies in [1, 4): E is e_a + e_b or one more.
    e_a, e_b = _exponents_for(rng, element, target)
    targeted = (_pack(element, sign_a, e_a + bias, rng.integers(0, 1 << man, size)),
                _pack(element, sign_b, e_b + bias, rng.integers(0, 1 << man, size)))

    # Subnormal-range ties: the odd parts of the significands multiply to below 2**24 and
    # their lowest set bits to 2**-150.
    zeros_a = rng.integers(0, man + 1, size)
    zeros_b = rng.integers(np.clip(2 * man + 2 - 24 - zeros_a, 0, man), man + 1)
    sig_a, sig_b = _sig_with_zeros(rng, element, zeros_a), _sig_with_zeros(rng, element, zeros_b)
    e_a, e_b = _exponents_for(rng, element, -150 + 2 * man - zeros_a - zeros_b)
    ties = (_pack(element, sign_a, e_a + bias, sig_a), _pack(element, sign_b, e_b + bias, sig_b))
    if 2 * (man + 1) > 24:
        # Normal ties: a product of 2 * man + 2 bits (or one less) with as many trailing
        # zeros as bits below the guard bit (half of these have the other length).
        zeros = 2 * man + 2 - 25 - rng.integers(0, 2, size)
        zeros_a = rng.integers(0, zeros + 1)
        sig_a = _sig_with_zeros(rng, element, zeros_a)
        sig_b = _sig_with_zeros(rng, element, zeros - zeros_a)
        e_a, e_b = _exponents_for(rng, element, rng.integers(-120, 121, size))
        normal_ties = (_pack(element, sign_a, e_a + bias, sig_a),
                       _pack(element, sign_b, e_b + bias, sig_b))
        half = rng.random(size) < 0.5
        ties = tuple(np.where(half, normal, sub) for normal, sub in zip(normal_ties, ties,
                                                                         strict=True))

    roll = rng.random(size)
    choice = np.select([roll < 0.1, roll < 0.2, roll < 0.3, roll < 0.7], [0, 1, 2, 3], 4)
    a = np.choose(choice, [uniform[0], edge[0], subnormal_a, targeted[0], ties[0]])
    b = np.choose(choice, [uniform[1], edge[1], subnormal_b, targeted[1], ties[1]])
    # Either operand may come first.
    swap = rng.random(size) < 0.5
    return np.where(swap, b, a), np.where(swap, a, b)


def _product_exponents(a, b, element):
    """For the exact products of codes ``a`` and ``b``: the exponent of the leading bit and
    of the lowest set bit (meaningful where the product is finite and nonzero)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.abs(numerics.from_bits(a, element).astype(np.float64)
                   * numerics.from_bits(b, element).astype(np.float64))
    usable = np.isfinite(p) & (p != 0)
    mantissa, exponent = np.frexp(np.where(usable, p, 1.0))
    scaled = (mantissa * 2.0 ** 53).astype(np.int64)            # exact: p has <= 53 bits
    zeros = np.zeros(scaled.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        low = (scaled & ((1 << step) - 1)) == 0
        zeros += np.where(low, step, 0)
        scaled = np.where(low, scaled >> step, scaled)
    return usable, exponent - 1, exponent - 53 + zeros


def random_scales(format_name, rng, a, b):
    """E8M0 scale codes ``(scale_a, scale_b)`` for the pairs ``a``, ``b`` of the MX format
    ``format_name``, chosen per pair to hit the corners: 30% an exact tie in the subnormal
    range (the product's lowest set bit scaled to ``2**-150``), 25% the result exponent in
    -160..-120 (subnormal results, underflow to zero), 20% in 125..130 (overflow), 15%
    uniformly random scales, 5% a scale of 255 (NaN) and 5% both 127 (no scaling)."""
    element = numerics.data_format(format_name).element
    size = a.shape
    usable, top, lowest = _product_exponents(a, b, element)
    roll = rng.random(size)
    shift = np.select(
        [roll < 0.3, roll < 0.55, roll < 0.75],
        [-150 - lowest, rng.integers(-160, -119, size) - top,
         rng.integers(125, 131, size) - top],
        0)
    shift = np.where(usable, shift, rng.integers(-254, 255, size))
    shift = np.clip(shift, -254, 254)
    total = shift + 2 * numerics.E8M0_BIAS
    scale_a = rng.integers(np.maximum(total - 254, 0), np.minimum(total, 254) + 1)
    scale_b = total - scale_a
    uniform = (roll >= 0.75) & (roll < 0.9)
    scale_a = np.where(uniform, rng.integers(0, 255, size), scale_a)
    scale_b = np.where(uniform, rng.integers(0, 255, size), scale_b)
    nan = (roll >= 0.9) & (roll < 0.95)
    nan_a = rng.random(size) < 0.5
    scale_a = np.where(nan & nan_a, numerics.E8M0_NAN, scale_a)
    scale_b = np.where(nan & ~nan_a, numerics.E8M0_NAN, scale_b)
    unscaled = roll >= 0.95
    scale_a = np.where(unscaled, numerics.E8M0_BIAS, scale_a)
    scale_b = np.where(unscaled, numerics.E8M0_BIAS, scale_b)
    return scale_a, scale_b


def coverage(details):
    """Counts of what the products of a :class:`~opentrn.golden.fp_multiplier.Product`
    met."""
    code = details.code
    return {
        "subnormal_results": int(details.subnormal.sum()),
        "overflow_to_inf": int(details.overflow.sum()),
        "underflow_to_zero": int(details.underflow.sum()),
        "inf_from_inf_operand": int(details.inf_operand.sum()),
        "nan_from_nan_operand": int(details.nan_operand.sum()),
        "nan_from_inf_times_zero": int(details.nan_inf_zero.sum()),
        "nan_from_scale_255": int(details.nan_scale.sum()),
        "inexact": int(details.inexact.sum()),
        "ties_to_even_down": int((details.tie & ~details.round_up).sum()),
        "ties_to_even_up": int((details.tie & details.round_up).sum()),
        "ties_normal_range": int((details.tie & (code & 0x7F800000 != 0)).sum()),
        "zero_positive": int((code == 0).sum()),
        "zero_negative": int((code == 0x80000000).sum()),
    }


# -- the bench --------------------------------------------------------------------------------

def _packed(values, bits, lanes):
    """One integer per step from lane values (lane 0 in the low bits)."""
    dtype = {8: "<u1", 16: "<u2", 32: "<u4"}[bits]
    rows = np.asarray(values).astype(dtype).reshape(-1, lanes)
    return [int.from_bytes(row.tobytes(), "little") for row in rows]


async def _drive(dut, format_name, a, b, scale_a=None, scale_b=None):
    """Drive every pair through the lanes (padded with zeros to whole steps); return the
    product codes."""
    lanes = len(dut.product.value) // 32
    width = len(dut.a.value) // lanes
    n = len(a)
    pad = -n % lanes
    columns = [np.concatenate([np.asarray(v, np.int64), np.zeros(pad, np.int64)])
               for v in (a, b) + ((scale_a, scale_b) if scale_a is not None else ())]
    ports = [(dut.a, _packed(columns[0], width, lanes)),
             (dut.b, _packed(columns[1], width, lanes))]
    if scale_a is not None:
        ports += [(dut.scale_a, _packed(columns[2], 8, lanes)),
                  (dut.scale_b, _packed(columns[3], 8, lanes))]
    dut.format.value = numerics.data_format(format_name).code
    out = bytearray()
    for step in range(len(ports[0][1])):
        for port, values in ports:
            port.value = values[step]
        await Timer(1, "ns")
        out += dut.product.value.to_unsigned().to_bytes(4 * lanes, "little")
    return np.frombuffer(bytes(out), "<u4")[:n]


async def _check(dut, name, format_name, a, b, scale_a=None, scale_b=None):
    """Run the pairs, compare with the golden model, report and assert."""
    started = time.monotonic()
    got = await _drive(dut, format_name, a, b, scale_a, scale_b)
    details = golden.multiply_details(a, b, format_name, scale_a, scale_b)
    wrong = np.flatnonzero(got != details.code)
    for index in wrong[:5]:
        scales = "" if scale_a is None else f" scales {scale_a[index]} {scale_b[index]}"
        dut._log.error("%s %s: %#x * %#x%s = %#010x, expected %#010x", name, format_name,
                       a[index], b[index], scales, got[index], details.code[index])
    record = {"test": name, "format": format_name, "vectors": len(a),
              "mismatches": int(wrong.size), **coverage(details),
              "seconds": round(time.monotonic() - started, 2)}
    dut._log.info("%s", record)
    harness.report(record)
    assert wrong.size == 0, f"{name} {format_name}: {wrong.size} products differ from golden"


def _rng(name):
    return np.random.default_rng([harness.setting("seed", 1), zlib.crc32(name.encode())])


@cocotb.test()
async def test_fp8_exhaustive(dut):
    """Every FP8 x FP8 product of both FP8 formats."""
    a, b = exhaustive_pairs()
    for format_name in ("fp8e4m3", "fp8e5m2"):
        await _check(dut, "fp8_exhaustive", format_name, a, b)


@cocotb.test()
async def test_mx(dut):
    """Every FP8 x FP8 pair of both MX formats, with corner-seeking scales."""
    a, b = exhaustive_pairs()
    for format_name in ("mxfp8e4m3", "mxfp8e5m2"):
        scale_a, scale_b = random_scales(format_name, _rng(format_name), a, b)
        await _check(dut, "mx", format_name, a, b, scale_a, scale_b)


@cocotb.test()
async def test_bf16_random(dut):
    """Corner-weighted random BF16 products."""
    a, b = random_operands("bf16", _rng("bf16"), harness.setting("bf16_vectors", 1_000_000))
    await _check(dut, "bf16_random", "bf16", a, b)


@cocotb.test()
async def test_fp32_random(dut):
    """Corner-weighted random FP32 products."""
    a, b = random_operands("fp32", _rng("fp32"), harness.setting("fp32_vectors", 100_000))
    await _check(dut, "fp32_random", "fp32", a, b)
