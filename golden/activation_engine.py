"""Golden model of :mod:`opentrn.hdl.activation_engine` (int8 path), in exact integer
arithmetic: per partition ``p`` and element ``x``,

1. ``pre = x * multiplier + bias[p]``, exact (up to ``acc_bits + 33`` bits: Python ints);
2. ``r = pre / 2**shift`` rounded half to even (:func:`round_shift`);
3. ``a = r`` (``IDENTITY``) or ``max(r, 0)`` (``RELU``);
4. ``a`` saturated to int8 (``in_bits``, ``out_int32 = 0``) or int32 (``out_int32 = 1``).

The hardware is pipelined; :func:`latency` is the documented cycle count.
"""

import numpy as np

__all__ = ["IDENTITY", "RELU", "FUNCTIONS", "PARAM_BITS", "SHIFT_MAX", "OUT_BITS",
           "activate", "pre_activation", "round_shift", "apply_function", "output_range",
           "saturate", "PIPELINE_STAGES", "latency"]

#: Codes of the ``function`` parameter.
IDENTITY, RELU = 0, 1
FUNCTIONS = {IDENTITY: "identity", RELU: "relu"}
#: Width of ``multiplier`` and ``bias`` (signed); ``shift`` is ``0 .. SHIFT_MAX``.
PARAM_BITS = 32
SHIFT_MAX = 63
#: Width of the wide output format.
OUT_BITS = 32


def _signed_range(bits):
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _is_int(value):
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def round_shift(pre, shift):
    """``pre / 2**shift`` rounded half to even, for a Python int ``pre``: ``q = pre >>
    shift`` (floor) and the remainder ``pre - (q << shift)``; round up when the remainder
    is above half, or exactly half and ``q`` odd. ``shift = 0`` is exact."""
    if shift == 0:
        return pre
    q = pre >> shift
    remainder = pre - (q << shift)
    half = 1 << (shift - 1)
    return q + (remainder > half or (remainder == half and q & 1 == 1))


def pre_activation(x, multiplier, bias):
    """``x * multiplier + bias[p]`` per element, exact: an object array of Python ints, with
    the shape of ``x`` (partitions on axis 0)."""
    x = np.asarray(x).astype(object)
    bias = np.asarray(bias).astype(object).reshape((-1,) + (1,) * (x.ndim - 1))
    return x * int(multiplier) + bias


def apply_function(r, function):
    """The activation function of the code ``function`` on Python ints."""
    return max(r, 0) if function == RELU else r


def output_range(config, out_int32):
    """``(lo, hi)`` of the output format: int8 (``in_bits``) or int32."""
    return _signed_range(OUT_BITS if out_int32 else config.in_bits)


def saturate(config, a, out_int32):
    lo, hi = output_range(config, out_int32)
    return min(max(a, lo), hi)


def _check(config, x, function, multiplier, shift, bias, out_int32):
    if "int8" not in config.dtypes:
        raise ValueError(f"dtypes={','.join(config.dtypes)}: the activation engine model "
                         "covers the int8 path (dtypes must include int8)")
    if not _is_int(function) or int(function) not in FUNCTIONS:
        raise ValueError(f"function={function!r}: must be one of "
                         + ", ".join(f"{code} ({name})" for code, name in FUNCTIONS.items()))
    if not (_is_int(out_int32) or isinstance(out_int32, bool)) or int(out_int32) not in (0, 1):
        raise ValueError(f"out_int32={out_int32!r}: must be 0 (int8) or 1 (int32)")
    if not _is_int(shift) or not 0 <= shift <= SHIFT_MAX:
        raise ValueError(f"shift={shift!r}: must be an integer in 0..{SHIFT_MAX}")
    lo, hi = _signed_range(PARAM_BITS)
    if not _is_int(multiplier) or not lo <= multiplier <= hi:
        raise ValueError(f"multiplier={multiplier!r}: must be a signed {PARAM_BITS}-bit "
                         f"integer in [{lo}, {hi}]")
    bias = np.asarray(bias)
    if bias.shape != (config.pe_cols,):
        raise ValueError(f"bias has shape {bias.shape}: must be ({config.pe_cols},), one "
                         "value per PSUM partition")
    if bias.dtype.kind not in "iu" or bias.min() < lo or bias.max() > hi:
        raise ValueError(f"bias has values outside signed {PARAM_BITS}-bit range "
                         f"[{lo}, {hi}]")
    x = np.asarray(x)
    if x.ndim not in (1, 2) or x.shape[0] != config.pe_cols:
        raise ValueError(f"x has shape {x.shape}: must be ({config.pe_cols},) or "
                         f"({config.pe_cols}, N), partitions on axis 0")
    lo, hi = _signed_range(config.acc_bits)
    if x.dtype.kind not in "iu" or (x.size and (x.min() < lo or x.max() > hi)):
        raise ValueError(f"x has values outside acc_bits={config.acc_bits} range "
                         f"[{lo}, {hi}]")
    return x, bias


def activate(config, x, *, function, multiplier, shift, bias, out_int32):
    """The activation engine's output for accumulators ``x`` (shape ``(pe_cols,)`` or
    ``(pe_cols, N)``: partitions on axis 0, column ``n`` = input beat ``n``): an int64
    array of the shape of ``x``, each value in the output format's range."""
    x, bias = _check(config, x, function, multiplier, shift, bias, out_int32)
    pre = pre_activation(x, multiplier, bias)
    out = np.empty(x.shape, dtype=np.int64)
    for index, value in np.ndenumerate(pre):
        r = round_shift(value, int(shift))
        out[index] = saturate(config, apply_function(r, function), out_int32)
    return out


#: The hardware's pipeline registers, in order: one cycle each.
PIPELINE_STAGES = ("multiply", "add bias", "shift (guard and sticky bits)",
                   "round, function and saturate")


def latency(config):
    """Cycles from an input beat's transfer to its output beat, the output always ready:
    one per pipeline stage (4), for every configuration."""
    return len(PIPELINE_STAGES)
