"""Golden model of :mod:`opentrn.hdl.tensor_engine`: the results, bit for bit (:func:`run`,
MX scales included), and the cycle of every result beat, from the formulas of
docs/performance.md.

Notation: ``K = pe_rows``, ``M = pe_cols``, ``N`` the moving vectors of one matmul (for
the timing; a matmul of a format with ``r`` MACs per PE per cycle contracts ``r x K``
elements, :func:`contraction`).
"""

from dataclasses import dataclass

import numpy as np

from opentrn import numerics
from opentrn.numerics import mx_blocks  # as the hardware's (hdl.tensor_engine.mx_blocks)

from . import fp_adder, fp_multiplier
from .processing_element import wrap

__all__ = ["Matmul", "Schedule", "contraction", "matmul", "matmul_float", "matmul_bits",
           "element_bits", "pack", "unpack", "mx_blocks", "run", "latency", "load_cycles",
           "reload_guard", "issue_interval", "schedule"]

_INT8_LO, _INT8_HI = -128, 127


def _shape(name, array, rows, cols_max):
    array = np.asarray(array)
    if array.ndim != 2 or array.shape[0] != rows or not 1 <= array.shape[1] <= cols_max:
        raise ValueError(f"{name} has shape {array.shape}: must be ({rows}, 1..{cols_max})")
    return array.astype(np.int64)


def _check(config, name, array, rows, cols_max):
    array = _shape(name, array, rows, cols_max)
    if array.size and (array.min() < _INT8_LO or array.max() > _INT8_HI):
        raise ValueError(f"{name} has values outside int8 range [{_INT8_LO}, {_INT8_HI}]")
    return array


def contraction(config, format_name):
    """``K`` of one matmul in ``format_name``: ``macs_per_pe_cycle(format) x pe_rows``
    elements of the contraction dimension, ``macs_per_pe_cycle`` of them in each row (SBUF
    partition), consecutive: element ``k`` is field ``k % r`` of row ``k // r``
    (:func:`pack`)."""
    return config.macs_per_pe_cycle(format_name) * config.pe_rows


def matmul(config, stationary, moving):
    """``out[M, N] = stationary[K, M].T @ moving[K, N]`` of int8 values with ``acc_bits``
    wrap-around, ``K`` = :func:`contraction` of int8.

    The hardware wraps after every addition; two's-complement addition is exact modulo
    ``2**acc_bits``, so wrapping the exact sum once gives the same bits.
    """
    k = contraction(config, "int8") if "int8" in config.dtypes else config.pe_rows
    stationary = _check(config, "stationary", stationary, k, config.pe_cols)
    moving = _check(config, "moving", moving, k, config.moving_max)
    return wrap(stationary.T @ moving, config.acc_bits)


def _block_scales(name, scales, k, cols):
    scales = np.asarray(scales)
    blocks = -(-k // numerics.MX_BLOCK)
    if scales.shape != (blocks, cols):
        raise ValueError(f"{name} has shape {scales.shape}: must be ({blocks}, {cols}), one "
                         f"E8M0 scale per {numerics.MX_BLOCK} rows of K and column")
    # Row k of the operand takes the scale of its block.
    return np.repeat(scales, numerics.MX_BLOCK, axis=0)[:k]


def matmul_float(stationary, moving, format_name, *, scale_stationary=None,
                 scale_moving=None, psum=None):
    """The FP32 codes of ``out[M, N] = stationary[K, M].T @ moving[K, N]`` for codes of the
    float format ``format_name`` (docs/numerics.md), in the order of the hardware: for each
    output, ``acc = +0``, then ``acc = acc + stationary[k, m] * moving[k, n]`` for
    ``k = 0 .. K-1`` (down the array column; every product and every sum rounded to FP32,
    to nearest even), then, when ``psum`` (FP32 codes, [M, N]) is given, ``psum + acc``
    (the accumulate into the PSUM). For the MX formats, ``scale_stationary`` ([ceil(K/32),
    M]) and ``scale_moving`` ([ceil(K/32), N]) are the E8M0 scales of each block of 32 rows
    of K: every product is scaled by ``2**(sa + sb - 254)`` before it is rounded.
    """
    fmt = numerics.data_format(format_name)
    if fmt.element is None or format_name == "fp32":
        raise ValueError(f"format={format_name!r}: must be a float tensor format "
                         f"({', '.join(n for n in numerics.TENSOR_FORMATS if n != 'int8')})")
    stationary, moving = np.asarray(stationary), np.asarray(moving)
    if stationary.ndim != 2 or moving.ndim != 2 or stationary.shape[0] != moving.shape[0]:
        raise ValueError(f"stationary {stationary.shape} and moving {moving.shape}: must be "
                         "[K, M] and [K, N]")
    k, m = stationary.shape
    n = moving.shape[1]
    scales = {}
    if fmt.mx:
        if scale_stationary is None or scale_moving is None:
            raise ValueError(f"format={format_name!r}: scale_stationary and scale_moving "
                             "are required")
        scales = {"s": _block_scales("scale_stationary", scale_stationary, k, m),
                  "x": _block_scales("scale_moving", scale_moving, k, n)}
    elif scale_stationary is not None or scale_moving is not None:
        raise ValueError(f"format={format_name!r}: takes no scales")
    acc = np.zeros((m, n), np.uint32)
    for row in range(k):
        extra = {}
        if fmt.mx:
            extra = {"scale_a": scales["s"][row][:, None], "scale_b": scales["x"][row][None, :]}
        product = fp_multiplier.multiply(stationary[row][:, None], moving[row][None, :],
                                         format_name, **extra)
        acc = fp_adder.add(acc, product)
    if psum is not None:
        psum = np.asarray(psum)
        if psum.shape != (m, n):
            raise ValueError(f"psum has shape {psum.shape}: must be ({m}, {n})")
        acc = fp_adder.add(psum, acc)
    return acc


def element_bits(values, format_name):
    """The raw element bits (``in_bits`` registers, zero-extended) of ``values`` of
    ``format_name``: int8 values (-128..127) as their byte, float codes as they are."""
    fmt = numerics.data_format(format_name)
    values = np.asarray(values, dtype=np.int64)
    if fmt.element is None:
        if values.size and (values.min() < _INT8_LO or values.max() > _INT8_HI):
            raise ValueError(f"values outside int8 range [{_INT8_LO}, {_INT8_HI}]")
        return values & 0xFF
    if values.size and (values.min() < 0 or values.max() >= 1 << fmt.element.bits):
        raise ValueError(f"{format_name} codes must lie in [0, {(1 << fmt.element.bits) - 1}]")
    return values


def _field_bits(format_name):
    fmt = numerics.data_format(format_name)
    return 8 if fmt.element is None else fmt.element.bits


def pack(config, values, format_name):
    """The raw register bits (``in_bits`` wide) of the array's rows for ``values`` [K, C] of
    ``format_name``, ``K`` = :func:`contraction`: row ``p`` holds elements
    ``p * r .. p * r + r - 1`` (``r`` = ``macs_per_pe_cycle``) as fields of ``bits(format)``,
    the first lowest; ``[pe_rows, C]``. int8 values (-128..127) go in as their byte, float
    codes as they are (:func:`element_bits`)."""
    rate = config.macs_per_pe_cycle(format_name)
    values = np.asarray(values)
    k = contraction(config, format_name)
    if values.ndim != 2 or values.shape[0] != k:
        raise ValueError(f"values of {format_name} have shape {values.shape}: must be "
                         f"({k}, columns), K = {rate} x pe_rows")
    bits = element_bits(values, format_name).reshape(config.pe_rows, rate, values.shape[1])
    width = _field_bits(format_name)
    return sum(bits[:, lane] << (lane * width) for lane in range(rate))


def unpack(config, raw, format_name):
    """The codes of ``format_name`` (int8: the bytes, 0..255) that the raw register bits
    ``raw`` [pe_rows, C] hold, [K, C] (the inverse of :func:`pack`, of the fields the
    format uses; bits above them are ignored)."""
    rate = config.macs_per_pe_cycle(format_name)
    width = _field_bits(format_name)
    raw = np.asarray(raw, dtype=np.int64)
    fields = np.stack([(raw >> (lane * width)) & ((1 << width) - 1) for lane in range(rate)],
                      axis=1)
    return fields.reshape(rate * raw.shape[0], raw.shape[1])


def matmul_bits(config, stationary, moving, format_name, *, scale_stationary=None,
                scale_moving=None):
    """What the array computes from raw register bits (``in_bits`` wide: ``stationary``
    [pe_rows, M'] as the weight registers hold them, ``moving`` [pe_rows, N]) for vectors of
    format ``format_name``, whatever format the tile was loaded as: the fields of the format
    (:func:`unpack`) as int8 (:func:`matmul`: ``acc_bits`` two's-complement sums, int64), or
    as codes of a float format (:func:`matmul_float`: FP32 codes, as int64 in
    ``[0, 2**32)``), over ``K`` = :func:`contraction` elements. ``[M', N]``. For an MX
    format, ``scale_stationary`` ([mx_blocks, M'], the scale registers) and
    ``scale_moving`` ([mx_blocks, N]) are the E8M0 codes of each block of 32 elements of K
    (required; refused for the other formats)."""
    fmt = numerics.data_format(format_name)
    if format_name not in numerics.TENSOR_FORMATS:
        raise ValueError(f"format={format_name!r}: must be one of "
                         f"{', '.join(numerics.TENSOR_FORMATS)}")
    if format_name not in config.dtypes:
        raise ValueError(f"format={format_name!r}: not among the build's formats, dtypes="
                         f"{','.join(config.dtypes)}")
    for name, array in (("stationary", stationary), ("moving", moving)):
        if np.asarray(array).dtype.kind not in "iu":
            raise TypeError(f"{name}: must hold integers, not {np.asarray(array).dtype}")
    stationary = _shape("stationary", stationary, config.pe_rows, config.pe_cols)
    moving = _shape("moving", moving, config.pe_rows, config.moving_max)
    for name, array in (("stationary", stationary), ("moving", moving)):
        if array.size and (array.min() < 0 or array.max() >= 1 << config.in_bits):
            raise ValueError(f"{name}: raw bits must lie in [0, {(1 << config.in_bits) - 1}] "
                             f"(in_bits={config.in_bits})")
    stationary = unpack(config, stationary, format_name)
    moving = unpack(config, moving, format_name)
    if fmt.element is None:
        if scale_stationary is not None or scale_moving is not None:
            raise ValueError(f"format={format_name!r}: takes no scales")
        as_int8 = lambda bits: (bits ^ 0x80) - 0x80  # noqa: E731
        return matmul(config, as_int8(stationary), as_int8(moving))
    return matmul_float(stationary, moving, format_name,
                        scale_stationary=scale_stationary, scale_moving=scale_moving
                        ).astype(np.int64)


def _scales(config, name, scales, cols):
    """``scales`` as E8M0 codes [mx_blocks, cols], or ``None`` on a build without MX."""
    blocks = mx_blocks(config)
    if not blocks:
        if scales is not None:
            raise ValueError(f"{name}: the build has no MX format (no scales)")
        return None
    if scales is None:
        raise ValueError(f"{name}: required on a build with an MX format (one E8M0 code per "
                         f"block of {numerics.MX_BLOCK} rows and column)")
    scales = np.asarray(scales)
    if scales.shape != (blocks, cols):
        raise ValueError(f"{name} has shape {scales.shape}: must be ({blocks}, {cols})")
    if scales.dtype.kind not in "iu" or (scales.size and (scales.min() < 0
                                                          or scales.max() > 255)):
        raise ValueError(f"{name}: must hold E8M0 codes (integers 0..255)")
    return scales.astype(np.int64)


def run(config, program):
    """The golden engine: the result of every :class:`Matmul` of ``program`` ([M', N] per
    matmul, as :func:`matmul_bits` gives it), as the array computes it. A fresh tile
    replaces the raw bits of the weight registers (:func:`pack` of its values) and, on a
    build with an MX format, the scale registers; a reused tile keeps both, whatever format
    they were loaded as. Vectors of an MX format meet the stored scales and their own; the
    other vectors ignore both."""
    if not program or program[0].stationary is None:
        raise ValueError("the first matmul of a program must load a stationary tile")
    results = []
    for op in program:
        if op.stationary is not None:
            tile = pack(config, op.stationary, op.format)
            tile_scales = _scales(config, "scale_stationary", op.scale_stationary,
                                  tile.shape[1])
        elif op.scale_stationary is not None:
            raise ValueError("scale_stationary: a reused tile keeps its scales (give them "
                             "with a fresh tile)")
        moving = pack(config, op.moving, op.format)
        moving_scales = _scales(config, "scale_moving", op.scale_moving, moving.shape[1])
        scales = {}
        if numerics.data_format(op.format).mx:
            scales = {"scale_stationary": tile_scales, "scale_moving": moving_scales}
        results.append(matmul_bits(config, tile, moving, op.format, **scales))
    return results


def latency(config):
    """Cycles from a moving vector's acceptance to its result beat: ``K (1 + A) + M - 1 +
    S + I``, with ``S = config.pe_multiply_stages`` registers between the PEs' multipliers
    and adders, ``A = config.pe_add_stages`` in their adders (the rows' skew is ``1 + A``)
    and ``I = config.pe_input_stages`` in front of the array."""
    return (config.pe_rows * (1 + config.pe_add_stages) + config.pe_cols - 1
            + config.pe_multiply_stages + config.pe_input_stages)


def load_cycles(config):
    """Cycles of one stationary load: ``M / c`` (``c = config.load_columns`` tile columns
    per cycle)."""
    return config.pe_cols // config.load_columns


def reload_guard(config):
    """Cycles from a swap to the first beat of the next load into the bank it retired:
    ``K + (K - 1) A`` (``A = config.pe_add_stages``: the retired tile's last vector reaches
    row ``K - 1`` ``(K - 1)(1 + A)`` cycles after row 0); 1 with ``config.fast_weight_load
    = 1`` (the load's rows are written skewed, behind the retired tile's last vector);
    ``max(1, M / 2 - 1)`` with 2 (two columns a cycle overtake that vector by a column a
    cycle, so the load starts late enough to write column ``M - 1`` behind it)."""
    if config.fast_weight_load == 2:
        return max(1, config.pe_cols // 2 - 1)
    if config.fast_weight_load:
        return 1
    return config.pe_rows + (config.pe_rows - 1) * config.pe_add_stages


def issue_interval(config, n, *, fresh):
    """Steady-state cycles between the starts of back-to-back matmuls of ``n`` vectors:
    ``N`` when each reuses the tile in use; with a fresh stationary tile each,
    ``max(N, G + M)`` (``G`` = :func:`reload_guard`: ``K``, or 1 with
    ``fast_weight_load = 1``) with two weight banks, and ``max(N, M / 2)`` with the third
    bank of ``fast_weight_load = 2`` (a load of ``L = M / 2`` cycles then waits for the swap
    two tiles back, ``(G + L) / 2 < L`` cycles a matmul)."""
    if not fresh:
        return n
    guard, load = reload_guard(config), load_cycles(config)
    return max(n, load, -(-(guard + load) // (config.weight_banks - 1)))


@dataclass(frozen=True)
class Matmul:
    """One matmul of a program: a fresh ``stationary`` tile ([K, M']; M' <= M columns, the
    rest zero; ``K`` = :func:`contraction` of its format) loaded and swapped in, or ``None``
    to reuse the tile in use; ``moving`` [K, N]; the vectors' ``format`` (int8 values, or
    codes of a float format; a reused tile's raw bits meet them whatever format it was
    loaded as, see :func:`matmul_bits`).

    On a build with an MX format (:func:`mx_blocks` ``> 0``), the E8M0 scale codes the array
    is given: ``scale_moving`` [blocks, N] with every matmul (each vector's scale per block
    of 32 elements of K) and ``scale_stationary`` [blocks, M'] with a fresh tile (stored with it; a
    reused tile keeps its scales). Both are required there, whatever the format (vectors of
    the other formats ignore them, and a tile of another format stores them all the same),
    and refused on a build without MX (:func:`run`)."""

    moving: np.ndarray
    stationary: np.ndarray | None = None
    format: str = "int8"
    scale_moving: np.ndarray | None = None
    scale_stationary: np.ndarray | None = None


@dataclass(frozen=True)
class Schedule:
    """Predicted cycles, counted from the cycle the drivers first present their beats."""

    load_starts: list      # first beat of each stationary load
    starts: list           # first moving vector of each matmul
    result_cycles: list    # one list per matmul: the cycle of each result beat
    total_cycles: int      # up to and including the last result beat


def schedule(config, program):
    """Predict the cycle of every beat when the stationary and moving streams present their
    beats as early as possible and the result stream is always ready."""
    if not program or program[0].stationary is None:
        raise ValueError("the first matmul of a program must load a stationary tile")
    guard, lat, load = reload_guard(config), latency(config), load_cycles(config)
    banks = config.weight_banks
    load_starts, starts, results = [], [], []
    swaps = []                             # the start of each matmul with a fresh tile
    next_free = 0                          # first cycle the moving stream is free
    for op in program:
        n = np.asarray(op.moving).shape[1]
        start = next_free
        if op.stationary is not None:
            # After the previous load, into a bank once the swap that retired it (banks - 1
            # tiles back; the first loads fill the banks never used) is ``guard`` behind.
            load_start = load_starts[-1] + load if load_starts else 0
            if len(swaps) >= banks - 1:
                load_start = max(load_start, swaps[-(banks - 1)] + guard)
            load_starts.append(load_start)
            start = max(start, load_start + load)
            swaps.append(start)
        starts.append(start)
        results.append([start + i + lat for i in range(n)])
        next_free = start + n
    return Schedule(load_starts, starts, results, results[-1][-1] + 1)
