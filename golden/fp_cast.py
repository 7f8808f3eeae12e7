"""Golden model of :mod:`opentrn.hdl.fp_cast`: FP32 codes cast to a storage format, in
integer arithmetic on the codes, step by step as the hardware computes it.

The rules (those of ``ml_dtypes``' ``float32_array.astype(...)``, bit for bit, for every
float32 code):

* ``fp32``: the identity, every bit kept (NaN payloads too).
* A NaN input (any payload, quiet or signalling) gives the output format's canonical NaN
  (:attr:`~opentrn.numerics.FloatFormat.canonical_nan`: bf16 ``0x7FC0``, fp8e5m2 ``0x7E``,
  fp8e4m3 ``0x7F``) with the input's sign bit kept.
* Any other input is rounded to the nearest value of the format, ties to even, with
  subnormal results (no flush to zero; FP32 subnormals are inputs like any other).
* Overflow: a result that rounds above the largest finite value of the format is
  infinity for bf16 and fp8e5m2 (so bf16 ``0x7F7F8000`` ties up to ``0x7F80``, fp8e5m2
  61440 ties up to infinity, 61439.99 rounds to 57344) and NaN (``0x7F``/``0xFF``) for
  fp8e4m3 (no infinities: 464 ties down to 448, anything above 464 is NaN). Infinities stay
  infinities (NaN for fp8e4m3); the sign is always kept.

The datapath (:func:`cast`): an FP32 code is ``sign, e, f``; its significand
``sig = implicit:f`` (24 bits, ``implicit = e != 0``) is worth ``sig * 2**(max(e, 1) - 150)``.
The output's biased exponent would be ``te = max(e, 1) - 127 + bias``. Below 1 the result
is subnormal: ``sig`` is shifted right by ``1 - te`` (at most ``man_bits + 2``: from there
on every value rounds to zero) and the bits shifted out become sticky. The truncated code
is ``((max(te, 1) - 1) << man_bits) + (shifted sig >> (23 - man_bits))`` (the implicit bit
carries into the exponent field, so subnormal inputs and outputs need no case of their own);
round to nearest even adds 1 when the guard bit is set and the sticky bits or the
truncated code's lowest bit are. A carry out of the fraction moves the result into the next
binade (and from the largest subnormal to the smallest normal). Overflow is
``te > exp_max_field`` or a rounded code above ``max_finite_bits``. (The hardware runs these
steps on one datapath shared by the narrow formats, in the frame of the widest one; its
docstring says how that differs without changing a result.)
"""

import numpy as np

from opentrn import numerics

__all__ = ["FORMATS", "cast", "fields", "round_fields"]

#: The output formats, by name (the FP32 input is always FP32).
FORMATS = ("fp32", "bf16", "fp8e4m3", "fp8e5m2")
_FP32 = numerics.FP32


def _format(name):
    if name not in FORMATS:
        raise ValueError(f"format={name!r}: must be one of {', '.join(FORMATS)}")
    return numerics.float_format(name)


def fields(codes):
    """``sign, e, f`` of FP32 codes, as int64 arrays."""
    codes = np.asarray(codes).astype(np.uint32).astype(np.int64)
    return codes >> 31, (codes >> 23) & 0xFF, codes & 0x7FFFFF


def round_fields(codes, fmt):
    """The rounding step of :func:`cast` for the non-NaN codes, unsigned: ``(truncated,
    guard, sticky, te)`` as int64 arrays (``truncated`` the magnitude code before rounding,
    ``te`` the unclamped biased output exponent). The testbench uses it to classify its
    vectors (ties, subnormal results, carries into the next binade)."""
    fmt = numerics.float_format(fmt) if isinstance(fmt, str) else fmt
    _, e, f = fields(codes)
    m = fmt.man_bits
    sig = np.where(e != 0, 1 << _FP32.man_bits, 0) | f
    eff_e = np.maximum(e, 1)                              # FP32 subnormals share 2**-126
    te = eff_e - _FP32.bias + fmt.bias
    shift = np.clip(1 - te, 0, m + 2)
    sticky_out = (sig & ((1 << shift) - 1)) != 0
    shifted = sig >> shift
    low = _FP32.man_bits - m                              # bits below the output's lsb
    truncated = ((np.maximum(te, 1) - 1) << m) + (shifted >> low)
    guard = (shifted >> (low - 1)) & 1
    sticky = ((shifted & ((1 << (low - 1)) - 1)) != 0) | sticky_out
    return truncated, guard, sticky.astype(np.int64), te


def cast(codes, fmt):
    """FP32 codes (any integer array, or uint32 views of float32) cast to ``fmt`` (a name
    in :data:`FORMATS`), as an array of the format's unsigned integer type."""
    fmt = _format(fmt)
    codes = np.asarray(codes).astype(np.uint32)
    if fmt.name == "fp32":
        return codes.copy()
    sign, e, f = fields(codes)
    truncated, guard, sticky, te = round_fields(codes, fmt)
    rounded = truncated + (guard & (sticky | (truncated & 1)))
    overflow = (te > fmt.exp_max_field) | (rounded > fmt.max_finite_bits)
    overflow_code = (fmt.exp_max_field << fmt.man_bits) if fmt.has_inf else fmt.canonical_nan
    magnitude = np.where(overflow, overflow_code, rounded)
    is_nan = (e == _FP32.exp_max_field) & (f != 0)
    magnitude = np.where(is_nan, fmt.canonical_nan, magnitude)
    return ((sign << (fmt.bits - 1)) | magnitude).astype(fmt.uint_type)
