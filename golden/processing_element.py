"""Golden model of :mod:`opentrn.hdl.processing_element`: one wrapping multiply-accumulate."""

import numpy as np

__all__ = ["wrap", "mac"]


def wrap(values, bits):
    """Reduce integers to ``bits``-bit two's complement, as a register of that width does."""
    values = np.asarray(values, dtype=np.int64)
    half = np.int64(1) << (bits - 1)
    return ((values + half) & ((half << 1) - 1)) - half


def mac(psum, x, weight, acc_bits):
    """``psum + x * weight`` wrapped to ``acc_bits``: what one PE sends down its column."""
    return wrap(np.int64(psum) + np.int64(x) * np.int64(weight), acc_bits)
