"""Number formats of the tensor engine, the PSUM and the activation engine: one description
shared by the hardware (hdl/), the golden models (golden/) and the tests.

Every floating-point format here is a sign bit, ``exp_bits`` of biased exponent and
``man_bits`` of fraction, with IEEE-754 subnormals (exponent field 0). They differ in what
the all-ones exponent means:

* ``ieee`` (``fp32``, ``bf16``, ``fp8e5m2``): fraction 0 is an infinity, any other
  fraction a NaN;
* ``fn`` (``fp8e4m3``, OCP ``float8_e4m3fn``): no infinities; only the all-ones fraction is
  a NaN, the other codes of the top exponent are finite (so the largest value is 448).

The MX formats (OCP Microscaling) are an element format plus one E8M0 scale per
``MX_BLOCK`` elements along the contraction dimension K: ``2 ** (scale - 127)``, with the
code 255 a NaN. docs/numerics.md states the arithmetic.
"""

import importlib
from dataclasses import dataclass

import numpy as np

__all__ = ["FloatFormat", "DataFormat", "DATA_FORMATS", "TENSOR_FORMATS", "FORMAT_CODE_BITS",
           "data_format", "FLOAT_FORMATS", "FP32", "BF16", "FP8E4M3", "FP8E5M2",
           "MX_BLOCK", "E8M0_BITS", "E8M0_BIAS", "E8M0_NAN", "CANONICAL_NAN32", "float_format",
           "to_bits", "from_bits", "bit_length", "mx_blocks", "mx_scale_groups", "mx_block_rows",
           "mx_rate", "column_bytes"]


@dataclass(frozen=True)
class FloatFormat:
    """One binary floating-point format."""

    name: str
    exp_bits: int
    man_bits: int
    nan_style: str           # "ieee" or "fn" (see the module docstring)
    # "module.type" of its numpy scalar type: ml_dtypes is imported when first needed (it
    # takes most of a second, which every command would pay before its first word).
    numpy_type_path: str

    @property
    def numpy_type(self):
        module, _, name = self.numpy_type_path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    @property
    def bits(self):
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self):
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def has_inf(self):
        return self.nan_style == "ieee"

    @property
    def exp_max_field(self):
        return (1 << self.exp_bits) - 1

    @property
    def max_normal_exp(self):
        """Unbiased exponent of the largest finite value."""
        top = self.exp_max_field if self.nan_style == "fn" else self.exp_max_field - 1
        return top - self.bias

    @property
    def min_normal_exp(self):
        """Unbiased exponent of the smallest normal value (subnormals share it)."""
        return 1 - self.bias

    @property
    def max_finite_bits(self):
        """Code of the largest finite positive value."""
        if self.nan_style == "fn":
            return (self.exp_max_field << self.man_bits) | ((1 << self.man_bits) - 2)
        return ((self.exp_max_field - 1) << self.man_bits) | ((1 << self.man_bits) - 1)

    @property
    def canonical_nan(self):
        """The positive NaN the hardware writes (the quiet NaN of ``ieee`` formats, the
        single NaN of ``fn`` formats); a negative NaN has the sign bit set as well."""
        if self.nan_style == "fn":
            return (self.exp_max_field << self.man_bits) | ((1 << self.man_bits) - 1)
        return (self.exp_max_field << self.man_bits) | (1 << (self.man_bits - 1))

    @property
    def uint_type(self):
        return {8: np.uint8, 16: np.uint16, 32: np.uint32}[self.bits]


FP32 = FloatFormat("fp32", 8, 23, "ieee", "numpy.float32")
BF16 = FloatFormat("bf16", 8, 7, "ieee", "ml_dtypes.bfloat16")
FP8E4M3 = FloatFormat("fp8e4m3", 4, 3, "fn", "ml_dtypes.float8_e4m3fn")
FP8E5M2 = FloatFormat("fp8e5m2", 5, 2, "ieee", "ml_dtypes.float8_e5m2")

#: The floating-point formats, by name.
FLOAT_FORMATS = {f.name: f for f in (FP32, BF16, FP8E4M3, FP8E5M2)}

#: Elements along K that share one E8M0 scale in the MX formats.
MX_BLOCK = 32
#: Bits of an E8M0 scale code (the MX formats' shared scale).
E8M0_BITS = 8
E8M0_BIAS = 127
E8M0_NAN = 255

#: The NaN every floating-point operation of the hardware returns (FP32 quiet NaN, sign 0).
CANONICAL_NAN32 = FP32.canonical_nan
assert CANONICAL_NAN32 == 0x7FC00000


def float_format(name):
    """The :class:`FloatFormat` called ``name``."""
    if name not in FLOAT_FORMATS:
        raise ValueError(f"format={name!r}: must be one of {', '.join(FLOAT_FORMATS)}")
    return FLOAT_FORMATS[name]


def to_bits(values, fmt):
    """The codes of ``values`` (any float array) rounded to ``fmt`` as ``ml_dtypes``/numpy
    round them (round to nearest even)."""
    fmt = float_format(fmt) if isinstance(fmt, str) else fmt
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(values).astype(fmt.numpy_type).view(fmt.uint_type)


def from_bits(codes, fmt):
    """The values of the codes ``codes`` of ``fmt``, as float32 (exact for every format
    here)."""
    fmt = float_format(fmt) if isinstance(fmt, str) else fmt
    return np.asarray(codes).astype(fmt.uint_type).view(fmt.numpy_type).astype(np.float32)


@dataclass(frozen=True)
class DataFormat:
    """A format an instruction can name: the tensor engine's inputs (``int8``, the float
    formats, the MX formats) and the activation engine's outputs (adding ``fp32`` and
    ``int32``). ``code`` is its number in instruction fields and hardware ports."""

    name: str
    code: int
    element: FloatFormat | None      # None for the integer formats
    mx: bool = False                 # an E8M0 scale per MX_BLOCK elements along K

    @property
    def bytes(self):
        if self.element is not None:
            return self.element.bits // 8
        return {"int8": 1, "int32": 4}[self.name]


#: Every format, by name; the codes are fixed (they appear in instruction encodings).
DATA_FORMATS = {f.name: f for f in (
    DataFormat("int8", 0, None),
    DataFormat("bf16", 1, BF16),
    DataFormat("fp8e4m3", 2, FP8E4M3),
    DataFormat("fp8e5m2", 3, FP8E5M2),
    DataFormat("mxfp8e4m3", 4, FP8E4M3, mx=True),
    DataFormat("mxfp8e5m2", 5, FP8E5M2, mx=True),
    DataFormat("fp32", 6, FP32),
    DataFormat("int32", 7, None),
)}
FORMAT_CODE_BITS = 3
assert max(f.code for f in DATA_FORMATS.values()) < 1 << FORMAT_CODE_BITS
_FORMATS_BY_CODE = {f.code: f for f in DATA_FORMATS.values()}

#: Input formats of the tensor engine (``Config.dtypes`` is a set of these).
TENSOR_FORMATS = ("int8", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")


def column_bytes(config, name):
    """Bytes of one column of format ``name`` in one SBUF partition, as the tensor engine
    reads it: ``macs_per_pe_cycle(name)`` consecutive elements of K (one per
    multiply-accumulate a PE does per cycle; docs/isa.md), ``bytes(name)`` each."""
    return config.macs_per_pe_cycle(name) * data_format(name).bytes


def mx_rate(config):
    """Multiply-accumulates per PE per cycle of the MX formats of ``config`` (one rate for
    all of them, :func:`check_buildable`), or 0 when it has none."""
    rates = {config.macs_per_pe_cycle(fmt.name) for fmt in matmul_formats(config) if fmt.mx}
    return max(rates, default=0)


def check_buildable(config, what):
    """Raise ``ValueError`` unless the hardware can be built for ``config``'s formats and
    MAC rates. ``what`` names the refusing block in the message (``"the tensor engine
    hardware"``). Rules: every column of a format (``column_bytes``) fits one SBUF vector
    word (``Config.vector_word_bytes``), since the tensor engine reads a column from one; the MX
    formats have one MAC rate, since every row of the array takes the scales of one block
    whatever the format."""
    for name in config.dtypes:
        size = column_bytes(config, name)
        if size > config.vector_word_bytes:
            raise ValueError(
                f"pe_macs_per_cycle={','.join(config.pe_macs_per_cycle)}: a column of {name} "
                f"is {config.macs_per_pe_cycle(name)} x {data_format(name).bytes} = {size} "
                f"bytes, more than one SBUF vector word ({config.vector_word_bytes} bytes: "
                f"dma_bus_bytes={config.dma_bus_bytes}, at most 32): {what} reads a column "
                "from one")
    rates = {name: config.macs_per_pe_cycle(name) for name in config.dtypes
             if data_format(name).mx}
    if len(set(rates.values())) > 1:
        raise ValueError(
            f"pe_macs_per_cycle={','.join(config.pe_macs_per_cycle)}: the MX formats must have "
            f"one rate in {what} (not {', '.join(f'{k}:{v}' for k, v in rates.items())}): "
            "every row of the array takes the scales of one block of K")


def matmul_formats(config):
    """The :class:`DataFormat` s a ``MATMUL``/``LOAD_STATIONARY`` of a build for ``config`` may
    name: its ``dtypes``, in code order. Any other code is ``ILLEGAL_OPCODE``."""
    return tuple(sorted((DATA_FORMATS[name] for name in config.dtypes), key=lambda f: f.code))


def mx_blocks(config):
    """The MX scale blocks of one matmul on the tensor engine of ``config`` when one of its
    formats is an MX format, else 0: ``ceil(K / MX_BLOCK)`` for the ``K = r x pe_rows``
    elements of the contraction dimension a matmul takes, ``r`` its MAC rate
    (:func:`mx_rate`). Block ``b`` covers the array rows (SBUF partitions)
    ``b * mx_block_rows(config)`` and on, and its scales are in SBUF partition ``b``."""
    rate = mx_rate(config)
    if not rate:
        return 0
    return -(-(rate * config.pe_rows) // MX_BLOCK)


def mx_scale_groups(config):
    """Groups of :func:`mx_blocks` SBUF partitions an MX instruction's scales may start at
    (its ``scale_partition`` is a multiple of the blocks, docs/isa.md): the partitions over
    the blocks, for a build with an MX format."""
    return config.sbuf_partitions // mx_blocks(config)


def mx_block_rows(config):
    """Array rows (SBUF partitions) of one MX block: ``MX_BLOCK / r`` (the ``r`` elements of
    K in each partition are consecutive, so a block of 32 takes whole partitions)."""
    rate = mx_rate(config)
    if not rate:
        raise ValueError(f"dtypes={','.join(config.dtypes)}: no MX format")
    return MX_BLOCK // rate


def float_formats(config):
    """The floating-point input formats of ``config`` (names, in code order)."""
    return tuple(f.name for f in matmul_formats(config) if f.element is not None)


def activation_formats(config):
    """The output formats an ``ACTIVATE`` of a build for ``config`` may name, in code order:
    with int8 among the input formats, ``int8`` and ``int32`` (the integer path); with any
    float input format, ``fp32`` and the element format of each float input format (an MX
    format's is its FP8 format, so one layer's output can feed the next: the float path)."""
    names = ["int8", "int32"] if "int8" in config.dtypes else []
    floats = {DATA_FORMATS[name].element.name for name in float_formats(config)}
    if floats:
        names += ["fp32", *floats]
    return tuple(sorted((DATA_FORMATS[name] for name in names), key=lambda f: f.code))


def data_format(name):
    """The :class:`DataFormat` called ``name``."""
    if name not in DATA_FORMATS:
        raise ValueError(f"format={name!r}: must be one of {', '.join(DATA_FORMATS)}")
    return DATA_FORMATS[name]


def format_of_code(code):
    """The :class:`DataFormat` whose code is ``code``."""
    try:
        return _FORMATS_BY_CODE[code]
    except (KeyError, TypeError):
        raise ValueError(f"format code {code}: not a format code") from None


def bit_length(values):
    """``int.bit_length`` of every element of a non-negative int64 array (below ``2**63``):
    the leading-one position the golden models normalize by."""
    values = np.asarray(values, dtype=np.int64)
    length = np.zeros(values.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        big = (values >> step) != 0
        length += np.where(big, step, 0)
        values = np.where(big, values >> step, values)
    return length + (values != 0)
