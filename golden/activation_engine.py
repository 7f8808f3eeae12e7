"""Golden model of :mod:`opentrn.hdl.activation_engine`. Per partition ``p`` and element
``x``, by ``out_format``:

Integer path (``int8``, ``int32``), in exact integer arithmetic:

1. ``pre = x * multiplier + bias[p]``, exact (up to ``acc_bits + 33`` bits: Python ints);
2. ``r = pre / 2**shift`` rounded half to even (:func:`round_shift`);
3. ``a = r`` (``IDENTITY``) or ``max(r, 0)`` (``RELU``);
4. ``a`` saturated to int8 ``[-128, 127]`` or int32.

Float path (``fp32``, ``bf16``, ``fp8e4m3``, ``fp8e5m2``), on FP32 codes with the bit-level
models of the FP units (docs/numerics.md, "Activation"):

1. ``y = fp_mul32(x, scale)`` (:func:`opentrn.golden.fp_multiplier.multiply`, fp32);
2. ``y = fp_add32(y, bias[p])`` (:func:`opentrn.golden.fp_adder.add`; the bias is ``+0``,
   code 0, without one, so a ``-0`` product becomes ``+0``);
3. relu: ``+0`` when ``y``'s sign bit is set and ``y`` is not a NaN, else ``y``;
4. ``y`` cast to ``out_format`` (:func:`opentrn.golden.fp_cast.cast`).

The hardware is pipelined; :func:`latency` is the documented cycle count.
"""

import numpy as np

from opentrn import numerics

from . import fp_adder, fp_cast, fp_multiplier

__all__ = ["IDENTITY", "RELU", "FUNCTIONS", "PARAM_BITS", "SHIFT_MAX", "OUT_BITS",
           "INT_FORMATS", "FLOAT_FORMATS", "OUT_FORMATS", "out_formats", "activate",
           "activate_float", "pre_activation", "round_shift", "apply_function",
           "apply_function_float", "output_range", "saturate", "PIPELINE_STAGES", "latency"]

#: Codes of the ``function`` parameter.
IDENTITY, RELU = 0, 1
FUNCTIONS = {IDENTITY: "identity", RELU: "relu"}
#: Width of ``multiplier`` and ``bias`` (signed); ``shift`` is ``0 .. SHIFT_MAX``.
PARAM_BITS = 32
SHIFT_MAX = 63
#: Width of the wide output format.
OUT_BITS = 32
#: The output formats of each path, by name.
INT_FORMATS = ("int8", "int32")
FLOAT_FORMATS = ("fp32", "bf16", "fp8e4m3", "fp8e5m2")
OUT_FORMATS = INT_FORMATS + FLOAT_FORMATS
#: Output ranges of the integer formats. int8 is the SBUF's one-byte format, whatever
#: ``in_bits`` (16 in a build with bf16).
_INT_RANGES = {"int8": (-128, 127), "int32": (-(1 << 31), (1 << 31) - 1)}
_WORD = (1 << 32) - 1


def _signed_range(bits):
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _is_int(value):
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def out_formats(config):
    """The output format names of ``config`` (``numerics.activation_formats``): int8 and
    int32 when the build has int8, and the float outputs when it has float formats."""
    return tuple(fmt.name for fmt in numerics.activation_formats(config))


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


def apply_function_float(codes, function):
    """The activation function on FP32 codes (int64 array): relu makes every code with the
    sign bit set, other than a NaN, ``+0`` (``-0`` and ``-inf`` too)."""
    codes = np.asarray(codes, dtype=np.int64)
    if function != RELU:
        return codes
    nan = ((codes >> 23) & 0xFF == 0xFF) & (codes & 0x7FFFFF != 0)
    return np.where((codes >> 31 & 1 == 1) & ~nan, 0, codes)


def output_range(config, out_format):
    """``(lo, hi)`` of the integer output format ``out_format`` (``"int8"`` or
    ``"int32"``)."""
    if out_format not in _INT_RANGES:
        raise ValueError(f"out_format={out_format!r}: output_range is for the integer "
                         f"formats {', '.join(INT_FORMATS)}")
    return _INT_RANGES[out_format]


def saturate(config, a, out_format):
    lo, hi = output_range(config, out_format)
    return min(max(a, lo), hi)


def _codes32(name, values):
    """FP32 codes given as signed 32-bit values (an instruction's s32 field, a PSUM
    accumulator) or as uint32 codes: int64 codes in ``[0, 2**32)``."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu" or (values.size and (
            values.min() < -(1 << 31) or values.max() > _WORD)):
        raise ValueError(f"{name} has values outside [-2**31, 2**32): must be FP32 codes, "
                         "as signed or unsigned 32-bit integers")
    return values.astype(np.int64) & _WORD


def _check(config, x, function, multiplier, shift, bias, out_format):
    if not _is_int(function) or int(function) not in FUNCTIONS:
        raise ValueError(f"function={function!r}: must be one of "
                         + ", ".join(f"{code} ({name})" for code, name in FUNCTIONS.items()))
    names = out_formats(config)
    if out_format not in names:
        raise ValueError(f"out_format={out_format!r}: must be one of {', '.join(names)} "
                         f"(the output formats of dtypes={','.join(config.dtypes)})")
    float_path = out_format in FLOAT_FORMATS
    if not _is_int(shift) or not 0 <= shift <= SHIFT_MAX:
        raise ValueError(f"shift={shift!r}: must be an integer in 0..{SHIFT_MAX}")
    if float_path and shift != 0:
        raise ValueError(f"shift={shift}: must be 0 for the float out_format {out_format}")
    lo, hi = _signed_range(PARAM_BITS)
    if float_path:
        if not _is_int(multiplier) or not lo <= multiplier <= _WORD:
            raise ValueError(f"multiplier={multiplier!r}: must be an FP32 code, as a signed "
                             "or unsigned 32-bit integer")
    elif not _is_int(multiplier) or not lo <= multiplier <= hi:
        raise ValueError(f"multiplier={multiplier!r}: must be a signed {PARAM_BITS}-bit "
                         f"integer in [{lo}, {hi}]")
    bias = np.asarray(bias)
    if bias.shape != (config.pe_cols,):
        raise ValueError(f"bias has shape {bias.shape}: must be ({config.pe_cols},), one "
                         "value per PSUM partition")
    if float_path:
        bias = _codes32("bias", bias)
    elif bias.dtype.kind not in "iu" or bias.min() < lo or bias.max() > hi:
        raise ValueError(f"bias has values outside signed {PARAM_BITS}-bit range "
                         f"[{lo}, {hi}]")
    x = np.asarray(x)
    if x.ndim not in (1, 2) or x.shape[0] != config.pe_cols:
        raise ValueError(f"x has shape {x.shape}: must be ({config.pe_cols},) or "
                         f"({config.pe_cols}, N), partitions on axis 0")
    if float_path:
        return _codes32("x", x), bias
    lo, hi = _signed_range(config.acc_bits)
    if x.dtype.kind not in "iu" or (x.size and (x.min() < lo or x.max() > hi)):
        raise ValueError(f"x has values outside acc_bits={config.acc_bits} range "
                         f"[{lo}, {hi}]")
    return x, bias


def activate_float(x, *, function, scale, bias, out_format):
    """The float path on checked arguments: FP32 codes ``x`` (int64, partitions on axis 0),
    ``scale`` (one FP32 code), ``bias`` (one FP32 code per partition); the output codes
    (int64, zero-extended)."""
    bias = np.asarray(bias, dtype=np.int64).reshape((-1,) + (1,) * (np.ndim(x) - 1))
    y = fp_multiplier.multiply(x, np.int64(scale) & _WORD, "fp32")
    y = fp_adder.add(y, bias).astype(np.int64)
    y = apply_function_float(y, function)
    return fp_cast.cast(y, out_format).astype(np.int64)


def activate(config, x, *, function, multiplier, shift, bias, out_format):
    """The activation engine's output for accumulators ``x`` (shape ``(pe_cols,)`` or
    ``(pe_cols, N)``: partitions on axis 0, column ``n`` = input beat ``n``), as an int64
    array of the shape of ``x``.

    ``out_format`` is a name of :func:`out_formats`. Integer path (``int8``, ``int32``):
    ``x`` signed ``acc_bits`` values, ``multiplier`` and ``bias`` signed 32-bit; results in
    the format's range. Float path: ``x``, ``multiplier`` (the scale) and ``bias`` are FP32
    codes, each as a signed 32-bit value (an s32 instruction field, a PSUM accumulator) or
    an unsigned code; ``shift`` must be 0; results are the codes of ``out_format``
    (non-negative: bf16 in 16 bits, fp8 in 8)."""
    x, bias = _check(config, x, function, multiplier, shift, bias, out_format)
    if out_format in FLOAT_FORMATS:
        return activate_float(x, function=function, scale=multiplier, bias=bias,
                              out_format=out_format)
    pre = pre_activation(x, multiplier, bias)
    out = np.empty(x.shape, dtype=np.int64)
    for index, value in np.ndenumerate(pre):
        r = round_shift(value, int(shift))
        out[index] = saturate(config, apply_function(r, function), out_format)
    return out


#: The hardware's pipeline registers, in order: one cycle each (the float path's in
#: parentheses).
PIPELINE_STAGES = ("multiply", "add bias", "shift (guard and sticky bits) (float: function)",
                   "round, function and saturate (float: cast)")


def latency(config):
    """Cycles from an input beat's transfer to its output beat, the output always ready:
    one per pipeline stage (4), after ``config.activation_input_stages`` registers of the
    input (0 to 2), with ``config.activation_multiply_stages`` in the multiply (0 to 2) and
    ``config.activation_add_stages`` in the bias add (0 to 4), on every path."""
    return (len(PIPELINE_STAGES) + config.activation_input_stages
            + config.activation_multiply_stages + config.activation_add_stages)
