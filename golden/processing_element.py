"""Golden model of :mod:`opentrn.hdl.processing_element`: one multiply-accumulate, wrapping
(int8) or in FP32 (the float formats, the MX ones with their E8M0 scales)."""

import numpy as np

from opentrn import numerics

from . import fp_adder, fp_multiplier

__all__ = ["wrap", "mac", "mac_float"]


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
