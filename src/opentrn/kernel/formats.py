"""The formats of HBM tensors: each format's numpy dtype, and bit-exact comparison."""

import functools

import numpy as np

from opentrn import numerics

from .errors import _fail


@functools.cache
def _format_dtypes():
    """:data:`FORMAT_DTYPES`, made on first use: ``ml_dtypes`` takes most of a second to
    import, which a command that only checks its arguments should not pay."""
    return {
        "int8": np.dtype(np.int8), "int32": np.dtype(np.int32),
        **{name: np.dtype(numerics.float_format(name).numpy_type)
           for name in ("bf16", "fp8e4m3", "fp8e5m2", "fp32")},
        "e8m0": np.dtype(np.uint8),     # the MX formats' block scales (docs/numerics.md)
    }


@functools.cache
def _dtype_formats():
    return {dtype: name for name, dtype in _format_dtypes().items()}


def _dtype_rule():
    return "must be one of " + ", ".join(d.name for d in _format_dtypes().values())


def format_dtype(name):
    """The numpy dtype of format ``name``'s elements in HBM tensors."""
    return _format_dtypes()[name]


def format_of_dtype(dtype):
    """The format name (docs/numerics.md) of a numpy dtype of :data:`FORMAT_DTYPES`."""
    return _dtype_formats()[np.dtype(dtype)]


def same_bits(a, b):
    """``a`` and ``b`` have the same shape, dtype and bytes: the equality bit-exact results
    are held to (float ``==`` would fail on NaN and pass ``-0 == +0``)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def mismatches(a, b):
    """Elements of ``a`` and ``b`` (same shape and dtype) whose bytes differ."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size)
    size = a.dtype.itemsize
    return int(np.count_nonzero(np.any(a.view(np.uint8).reshape(-1, size)
                                       != b.view(np.uint8).reshape(-1, size), axis=1)))


def tensor_format(config, dtype):
    """The :class:`~opentrn.numerics.DataFormat` of a matmul ``dtype`` name, which the build
    of ``config`` must implement (else :class:`KernelError`)."""
    names = [f.name for f in numerics.matmul_formats(config)]
    if dtype not in names:
        _fail("dtype", dtype, f"must be one of this build's matmul formats: "
              f"{', '.join(names) or 'none'} (Config.dtypes={','.join(config.dtypes)})")
    return numerics.data_format(dtype)
