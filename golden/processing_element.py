"""Golden model of :mod:`opentrn.hdl.processing_element`: one multiply-accumulate, wrapping
(int8) or in FP32 (the float formats, the MX ones with their E8M0 scales)."""

import numpy as np

from opentrn import numerics

from . import fp_adder, fp_multiplier

__all__ = ["wrap", "mac", "mac_float", "field", "mac_packed"]


def wrap(values, bits):
    """Reduce integers to ``bits``-bit two's complement, as a register of that width does."""
    values = np.asarray(values, dtype=np.int64)
    half = np.int64(1) << (bits - 1)
    return ((values + half) & ((half << 1) - 1)) - half


def mac(psum, x, weight, acc_bits):
    """``psum + x * weight`` wrapped to ``acc_bits``: what one PE sends down its column."""
    return wrap(np.int64(psum) + np.int64(x) * np.int64(weight), acc_bits)


def mac_float(psum, x, weight, format_name, *, scale_weight=None, scale_x=None):
    """``fp_add32(psum, fp_mul(weight, x))``: the FP32 code a PE sends down its column for
    codes ``x`` and ``weight`` of the float format ``format_name`` and the FP32 code
    ``psum`` (broadcast; ``uint32``). For the MX formats the product is scaled by
    ``2**(scale_weight + scale_x - 254)``: ``scale_weight`` the E8M0 code stored with the
    weight, ``scale_x`` the one that comes with ``x`` (required for the MX formats, refused
    for the others)."""
    fmt = numerics.data_format(format_name)
    if fmt.element is None or format_name == "fp32":
        raise ValueError(f"format={format_name!r}: must be a float tensor format the PE "
                         "implements (bf16, fp8e4m3, fp8e5m2, mxfp8e4m3, mxfp8e5m2)")
    if fmt.mx:
        if scale_weight is None or scale_x is None:
            raise ValueError(f"format={format_name!r}: scale_weight and scale_x are required")
        scales = {"scale_a": scale_weight, "scale_b": scale_x}
    elif scale_weight is not None or scale_x is not None:
        raise ValueError(f"format={format_name!r}: takes no scales")
    else:
        scales = {}
    return fp_adder.add(psum, fp_multiplier.multiply(weight, x, format_name, **scales))


def field(bits, lane, width):
    """Field ``lane`` of ``width`` bits of raw register bits (the first field lowest)."""
    return (np.asarray(bits, dtype=np.int64) >> (lane * width)) & ((1 << width) - 1)


def mac_packed(psum, x, weight, format_name, *, macs=1, acc_bits=32, scale_weight=None,
               scale_x=None):
    """What a PE doing ``macs`` multiply-accumulates per cycle in ``format_name`` sends down
    its column for the raw register bits ``x`` and ``weight`` (element ``j`` is field ``j``
    of the format's width): int8 ``psum + sum_j sext(x_j) * sext(w_j)`` wrapped to
    ``acc_bits``; a float format ``acc = psum``, then ``acc = mac_float(acc, x_j, w_j)`` for
    ``j = 0 .. macs - 1`` (FP32 codes, ``uint32``), the MX scales shared by the lanes."""
    fmt = numerics.data_format(format_name)
    if fmt.element is None:
        total = np.int64(psum)
        for lane in range(macs):
            xj, wj = (((field(v, lane, 8) ^ 0x80) - 0x80) for v in (x, weight))
            total = total + xj * wj
        return wrap(total, acc_bits)
    width = fmt.element.bits
    scales = {"scale_weight": scale_weight, "scale_x": scale_x} if fmt.mx else {}
    acc = np.asarray(psum, dtype=np.int64) & 0xFFFF_FFFF
    for lane in range(macs):
        acc = mac_float(acc, field(x, lane, width), field(weight, lane, width), format_name,
                        **scales)
    return acc
