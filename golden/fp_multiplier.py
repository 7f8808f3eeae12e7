"""Golden model of :mod:`opentrn.hdl.fp_multiplier`: the FP32 product of two codes of one
format, bit level, in vectorized integer arithmetic on numpy arrays of codes, computed as
the hardware computes it:

1. decode each operand into sign, significand ``sig`` (hidden bit included; 0 for a zero)
   and unbiased exponent ``e`` (``1 - bias`` for subnormals), so that its value is
   ``sig * 2**(e - man_bits)``; and its class (NaN, infinity) by the format's ``nan_style``;
2. ``P = sig_a * sig_b`` exactly (``W = 2 * man_bits + 2`` bits), normalized by its
   leading zeros ``lz``: ``Q = P << lz``; the exact product is ``1.Q * 2**E`` with
   ``E = e_a + e_b + scale + 1 - lz`` (``scale = scale_a + scale_b - 254`` for the MX
   formats, else 0);
3. round once to FP32, to nearest, ties to even: below ``E = -126`` the significand is
   shifted right by ``d = min(-126 - E, 25)`` (subnormal result); the top 24 bits are kept,
   the next is the guard bit, any bit below (or shifted out) sets sticky; round up when
   guard and (sticky or the kept significand is odd). The code is
   ``((E + 126) << 23) + sig24 + round_up`` (``0 << 23`` for subnormals), so that a carry
   out of the significand steps the exponent (also to infinity, ``0x7F800000``);
   ``E > 127`` is infinity;
4. special cases, first match: a NaN operand, an MX scale of 255 (E8M0 NaN) or infinity
   times zero give ``CANONICAL_NAN32``; an infinite operand gives infinity, a zero operand
   zero, both with the sign ``sign_a ^ sign_b``.

:func:`multiply_details` also returns the classes of every product (ties, subnormal
results, overflows, the source of each NaN) for the testbenches' coverage.
"""

from dataclasses import dataclass

import numpy as np

from opentrn import numerics

__all__ = ["FORMATS", "multiply", "multiply_details", "Product"]

#: The formats the multiplier takes: both operands are in one of these.
FORMATS = ("fp32", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")

_FP32 = numerics.FP32
#: Width of the window that is shifted right for subnormal results: at least the 24 kept
#: bits, the guard bit and one more (sticky) bit.
_WINDOW_MIN = 26
#: A right shift of 25 or more leaves nothing above the guard bit: the result is zero.
_SHIFT_MAX = _FP32.man_bits + 2
_INF32 = _FP32.exp_max_field << _FP32.man_bits


@dataclass(frozen=True)
class Product:
    """The result codes (``code``, uint32) and boolean masks of what each product met."""

    code: np.ndarray
    nan_operand: np.ndarray      # a NaN operand
    nan_scale: np.ndarray        # an MX scale of 255 (and no NaN operand)
    nan_inf_zero: np.ndarray     # infinity times zero (and no NaN operand or scale)
    inf_operand: np.ndarray      # an infinite operand, the other finite nonzero or infinite
    zero_operand: np.ndarray     # a zero operand, the other finite
    overflow: np.ndarray         # finite nonzero operands, result infinite
    underflow: np.ndarray        # finite nonzero operands, result zero
    subnormal: np.ndarray        # a subnormal result
    inexact: np.ndarray          # finite nonzero operands, the product rounded
    tie: np.ndarray              # an exact tie (guard 1, sticky 0)
    round_up: np.ndarray         # the significand was incremented


def _decode(codes, element):
    """Sign, significand, unbiased exponent, NaN and infinity masks of ``codes``."""
    man = element.man_bits
    sign = (codes >> (element.bits - 1)) & 1
    field = (codes >> man) & element.exp_max_field
    fraction = codes & ((1 << man) - 1)
    top = field == element.exp_max_field
    if element.has_inf:
        nan, inf = top & (fraction != 0), top & (fraction == 0)
    else:
        nan, inf = top & (fraction == (1 << man) - 1), np.zeros(codes.shape, bool)
    sig = np.where(field != 0, fraction | (1 << man), fraction)
    exponent = np.maximum(field, 1) - element.bias
    return sign, sig, exponent, nan, inf


def _codes(values, bits, what):
    codes = np.asarray(values)
    if codes.dtype.kind not in "iu":
        raise TypeError(f"{what}: must be integer codes, not {codes.dtype}")
    codes = codes.astype(np.int64)
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise ValueError(f"{what}: codes must lie in [0, {(1 << bits) - 1}]")
    return codes


def multiply_details(a_codes, b_codes, format_name, scale_a=None, scale_b=None):
    """The :class:`Product` of the codes ``a_codes`` and ``b_codes`` of ``format_name``
    (broadcast together); ``scale_a`` and ``scale_b`` are the E8M0 scale codes of the MX
    formats (required for them, refused for the others)."""
    if format_name not in FORMATS:
        raise ValueError(f"format={format_name!r}: must be one of {', '.join(FORMATS)}")
    fmt = numerics.data_format(format_name)
    element = fmt.element
    a = _codes(a_codes, element.bits, "a_codes")
    b = _codes(b_codes, element.bits, "b_codes")
    if fmt.mx:
        if scale_a is None or scale_b is None:
            raise ValueError(f"format={format_name!r}: scale_a and scale_b are required")
        sa, sb = _codes(scale_a, 8, "scale_a"), _codes(scale_b, 8, "scale_b")
        a, b, sa, sb = np.broadcast_arrays(a, b, sa, sb)
        scale = sa + sb - 2 * numerics.E8M0_BIAS
        nan_scale = (sa == numerics.E8M0_NAN) | (sb == numerics.E8M0_NAN)
    else:
        if scale_a is not None or scale_b is not None:
            raise ValueError(f"format={format_name!r}: takes no scales")
        a, b = np.broadcast_arrays(a, b)
        scale, nan_scale = 0, np.zeros(a.shape, bool)

    sign_a, sig_a, e_a, nan_a, inf_a = _decode(a, element)
    sign_b, sig_b, e_b, nan_b, inf_b = _decode(b, element)
    sign = sign_a ^ sign_b

    # The exact product, normalized: 1.Q * 2**E.
    width = 2 * element.man_bits + 2
    p = sig_a * sig_b
    lz = width - numerics.bit_length(p)
    q = p << lz
    e = e_a + e_b + scale + 1 - lz

    # Round once to FP32: shift right into the subnormal range (sticky collects what falls
    # out), keep 24 bits, guard and sticky below.
    window = max(width, _WINDOW_MIN)
    x = q << (window - width)
    d = np.clip(-126 - e, 0, _SHIFT_MAX)
    y = x >> d
    shifted_out = (x & ((1 << d) - 1)) != 0
    sig24 = y >> (window - 24)
    guard = ((y >> (window - 25)) & 1) == 1
    sticky = shifted_out | ((y & ((1 << (window - 25)) - 1)) != 0)
    round_up = guard & (sticky | ((sig24 & 1) == 1))
    exponent = np.where(d > 0, 0, e + 126)
    magnitude = (exponent << _FP32.man_bits) + sig24 + round_up
    magnitude = np.where(e > 127, _INF32, magnitude)

    nan_operand = nan_a | nan_b
    zero_a, zero_b = sig_a == 0, sig_b == 0
    nan_scale = nan_scale & ~nan_operand
    nan_inf_zero = ((inf_a & zero_b) | (inf_b & zero_a)) & ~nan_operand & ~nan_scale
    nan = nan_operand | nan_scale | nan_inf_zero
    inf_operand = (inf_a | inf_b) & ~nan
    zero_operand = (zero_a | zero_b) & ~nan & ~inf_operand
    finite = ~(nan | inf_operand | zero_operand)

    magnitude = np.where(inf_operand, _INF32, np.where(zero_operand, 0, magnitude))
    code = np.where(nan, numerics.CANONICAL_NAN32, (sign << 31) | magnitude).astype(np.uint32)
    return Product(
        code=code,
        nan_operand=nan_operand, nan_scale=nan_scale, nan_inf_zero=nan_inf_zero,
        inf_operand=inf_operand, zero_operand=zero_operand,
        overflow=finite & (magnitude == _INF32),
        underflow=finite & (magnitude == 0),
        subnormal=finite & (magnitude != 0) & (magnitude < (1 << _FP32.man_bits)),
        inexact=finite & (guard | sticky),
        tie=finite & guard & ~sticky,
        round_up=finite & round_up,
    )


def multiply(a_codes, b_codes, format_name, scale_a=None, scale_b=None):
    """The FP32 codes (uint32) of ``a * b`` (times ``2**(scale_a + scale_b - 254)`` for the
    MX formats), rounded once: see the module docstring."""
    return multiply_details(a_codes, b_codes, format_name, scale_a, scale_b).code
