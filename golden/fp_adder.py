"""Golden model of :mod:`opentrn.hdl.fp_adder`: IEEE-754 binary32 addition in vectorized
integer arithmetic on the codes, step for step as the hardware computes it.

Rules (those of :class:`opentrn.hdl.fp_adder.FPAdder`): round to nearest, ties to even;
subnormal inputs and results honoured (no flush to zero); overflow to an infinity of the
sign of the larger operand; an exact zero result is ``+0`` except ``(-0) + (-0) = -0``;
``inf + inf`` (same sign) and ``inf + finite`` are that infinity; ``inf + (-inf)`` and any
NaN operand give the canonical NaN ``0x7FC00000``. This equals numpy ``float32`` addition
with NaN results made canonical (tests/test_golden_fp_adder.py checks it).
"""

import numpy as np

from opentrn import numerics
from opentrn.numerics import CANONICAL_NAN32, FP32

__all__ = ["add"]

_MAN = FP32.man_bits
_EXP_ALL_ONES = FP32.exp_max_field
_INF_MAGNITUDE = _EXP_ALL_ONES << _MAN
_MAN_MASK = (1 << _MAN) - 1
_SIGN = 1 << (FP32.bits - 1)
_GRS = 3                        # guard, round and sticky bits
_WIDE = _MAN + 1 + _GRS         # aligned significands (27 bits); the sum has one more


def add(a_codes, b_codes):
    """The FP32 codes of ``a + b`` for arrays (or scalars) of FP32 codes; the result has
    the broadcast shape of the operands, dtype ``uint32``."""
    a, b = np.broadcast_arrays(np.asarray(a_codes, dtype=np.uint32).astype(np.int64),
                               np.asarray(b_codes, dtype=np.uint32).astype(np.int64))
    # Order by magnitude (the code without its sign): |x| >= |y|.
    swap = (b & ~_SIGN) > (a & ~_SIGN)
    x, y = np.where(swap, b, a), np.where(swap, a, b)
    sx, ex, fx = x >> 31, (x >> _MAN) & _EXP_ALL_ONES, x & _MAN_MASK
    sy, ey, fy = y >> 31, (y >> _MAN) & _EXP_ALL_ONES, y & _MAN_MASK
    subtract = sx != sy

    # Subnormals: no hidden bit, the exponent of the smallest normal.
    mx = np.where(ex != 0, fx | (1 << _MAN), fx)
    my = np.where(ey != 0, fy | (1 << _MAN), fy)
    ex_eff, ey_eff = np.maximum(ex, 1), np.maximum(ey, 1)

    # Align y with guard, round and sticky bits; everything shifted out is sticky.
    shift = np.minimum(ex_eff - ey_eff, _WIDE)
    y_wide = my << _GRS
    aligned = (y_wide >> shift) | ((y_wide & ((1 << shift) - 1)) != 0)
    x_wide = mx << _GRS
    raw = np.where(subtract, x_wide - aligned, x_wide + aligned)
    carry = raw >> _WIDE

    # Normalize: right by one on a carry, else left by the leading zeros, but not below the
    # smallest exponent (subnormal result).
    zeros = _WIDE - numerics.bit_length(raw & ((1 << _WIDE) - 1))
    lshift = np.minimum(zeros, ex_eff - 1)
    norm = np.where(carry != 0, (raw >> 1) | (raw & 1),
                    (raw << lshift) & ((1 << _WIDE) - 1))
    exp_less_one = np.where(carry != 0, ex_eff, ex_eff - 1 - lshift)

    # Round to nearest even; the hidden bit and the rounding carry go into the exponent.
    guard, lsb = (norm >> (_GRS - 1)) & 1, (norm >> _GRS) & 1
    rest = (norm & ((1 << (_GRS - 1)) - 1)) != 0
    round_up = guard & (rest | lsb)
    magnitude = (exp_less_one << _MAN) + (norm >> _GRS) + round_up

    x_nan = (ex == _EXP_ALL_ONES) & (fx != 0)
    x_inf = (ex == _EXP_ALL_ONES) & (fx == 0)
    y_inf = (ey == _EXP_ALL_ONES) & (fy == 0)
    result = np.where(raw == 0, (sx & sy) << 31, (sx << 31) | magnitude)
    result = np.where(x_inf | (magnitude >= _INF_MAGNITUDE), (sx << 31) | _INF_MAGNITUDE,
                      result)
    result = np.where(x_nan | (x_inf & y_inf & subtract), CANONICAL_NAN32, result)
    return result.astype(np.uint32)
