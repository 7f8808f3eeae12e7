"""Library kernels built with :mod:`opentrn.kernel`: tiled GEMM, GEMM + bias + relu with
int8 requantisation or a float cast, and a 2-layer MLP, in int8 or a float format (bf16,
fp8e4m3, fp8e5m2: the dtype of the input arrays), or an MX format (mxfp8e4m3, mxfp8e5m2: FP8
arrays with ``block_scales=``, E8M0 codes per block of 32 rows along K and per column).
Each returns ``(program, expected)``: the built :class:`~opentrn.kernel.Program` and
``{output name: array}`` computed independently in numpy (int64, or float32 in the
hardware's order of operations: docs/numerics.md), never through the golden machine.

Layout convention (NKI's ``nc_matmul``): ``out[M, N] = stationary[K, M].T @ moving[K, N]``;
the SBUF partition axis is the contraction axis K (``pe_rows`` partitions per K tile) and
the PSUM partitions are M (``pe_cols`` per M tile). So ``gemm`` takes ``A`` transposed
(``a_t[K, M]``) and ``b[K, N]``.

The schedule (:mod:`opentrn.schedule`; docs/kernels.md, "The schedule"): the output
columns are cut into **blocks** of up to ``G * moving_max`` columns, ``G = psum_banks // 2``
PSUM banks per block (one ``moving_max`` chunk per bank), so that two groups of banks
alternate: the activation engine drains one group while the tensor engine accumulates into
the other. For each block, for each M tile, for each K tile, one ``LOAD_STATIONARY`` serves
the block's chunks (one ``MATMUL`` each, ``accumulate`` from the second K tile on). The
moving block (``b[:, block]``, every K tile) stays in the SBUF across all M tiles; the
stationary tiles of one M tile, or of up to :data:`~opentrn.schedule.MAX_M_BLOCK` (every K
tile), come in one 3-D DMA descriptor; both are double-buffered and fetched one step (M
tile) ahead, so the DMA overlaps the matmuls. When a block's K tiles do not fit, K is cut
into parts (the moving data is then fetched per M tile and K part; the PSUM keeps
accumulating), or the block narrows, or it keeps one moving slot refilled a K tile at a
time: :func:`~opentrn.schedule.schedule_shape` takes the tiling its cost estimate
(:func:`~opentrn.schedule.tiling_cost`) finds cheapest; the plain GEMM's,
:func:`~opentrn.schedule.gemm_tiling`, times the estimate's first tilings with the cycle
model's fast path and takes one that is clearly faster. Results go PSUM -> ``ACTIVATE`` ->
SBUF staging (double-buffered) -> one DMA per M tile and block.

MX formats: the host re-lays each operand's scales per K tile (``_tile_scales``: row
``kt * Bt + b`` holds block ``(kt * R) // 32 + b``, ``Bt = ceil(R / 32)`` blocks per K tile of
``R`` elements of K), so one DMA fetches a step's scales into a slot alongside its element
data, double-buffered the same way. A K tile's scales take ``Bt`` partitions of a byte
range, so ``G = partitions / Bt`` K tiles share one (:func:`~opentrn.schedule.scale_groups`):
K tile ``i`` of a slot in partitions ``(i % G) * Bt ..`` at byte column ``i // G`` (the
instructions' ``scale_partition``); a slot is ``ceil(K tiles / G)`` bytes a column, not one
per K tile. (The 2-layer MLP keeps one K tile a byte column: its second layer's K tiles
have fewer blocks.)

A format with ``r`` multiply-accumulates per PE per cycle (``Config.pe_macs_per_cycle``:
Trainium's FP8 "double row" and MXFP8 matmuls) contracts ``r`` consecutive elements of K
per SBUF partition (docs/isa.md): a K tile is ``r x pe_rows`` elements, and the host lays
each operand out packed (``_pack``: ``[ceil(K / r), C * r]``, row ``q`` holding rows
``q * r .. q * r + r - 1`` of K side by side per column), so that the same DMA descriptors
fetch whole packed columns. The 2-layer MLP needs one element of K per partition for its
second layer (the activation engine writes a hidden feature per partition) and refuses such
a format.
"""

from __future__ import annotations

import numpy as np

from opentrn import isa, numerics, schedule
from opentrn.config import Config
from opentrn.kernel import (
    Kernel,
    KernelError,
    Program,
    format_dtype,
    format_of_dtype,
    tensor_format,
)
from opentrn.schedule import Layer, Schedule

__all__ = ["gemm", "gemm_bias_relu", "mlp", "reference_matmul", "reference_activation",
           "reference_matmul_float", "reference_activation_float", "MATMUL_DTYPES",
           "check_fits", "least_matmuls"]

#: The input formats of the kernels (the MX formats: FP8 arrays with ``block_scales=``).
MATMUL_DTYPES = ("int8", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")

#: The MX format of each FP8 format (its elements with E8M0 block scales).
_MX_OF = {"fp8e4m3": "mxfp8e4m3", "fp8e5m2": "mxfp8e5m2"}


def _element(fmt):
    """The format of ``fmt``'s elements: an MX format's FP8 format, else ``fmt``."""
    data = numerics.data_format(fmt)
    return data.element.name if data.mx else fmt


def _dtype(fmt):
    """The numpy dtype of ``fmt``'s elements."""
    return format_dtype(_element(fmt))


# -- numpy references (int64, independent of the golden machine) -----------------------------


def reference_matmul(config: Config, stationary, moving):
    """``stationary.T @ moving`` wrapped to ``acc_bits`` two's complement, int64."""
    out = np.asarray(stationary, np.int64).T @ np.asarray(moving, np.int64)
    bits = config.acc_bits
    return ((out + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))


def reference_activation(x, *, multiplier=1, shift=0, bias=None, relu=False, out="int8"):
    """``saturate(f(round_half_even((x * multiplier + bias[row]) / 2**shift)))``, int64:
    ``bias`` one value per row of ``x``."""
    pre = np.asarray(x, np.int64) * np.int64(multiplier)
    if bias is not None:
        pre = pre + np.asarray(bias, np.int64).reshape(-1, 1)
    if shift:
        q = pre >> np.int64(shift)
        remainder = pre - (q << np.int64(shift))
        half = np.int64(1) << np.int64(shift - 1)
        pre = q + ((remainder > half) | ((remainder == half) & (q % 2 == 1)))
    if relu:
        pre = np.maximum(pre, 0)
    info = np.iinfo(np.int8 if out == "int8" else np.int32)
    return np.clip(pre, info.min, info.max)


# -- argument checks ----------------------------------------------------------------------------


def reference_matmul_float(stationary, moving, *, kt_rows, block_scales=None):
    """``stationary.T @ moving`` (float arrays of one format) in float32, in the order the
    hardware adds: per K tile of ``kt_rows`` rows ``acc = +0``, then ``acc + s[k] * m[k]``
    row by row, then the tiles' sums into the result in K order (the PSUM accumulate).

    MX formats: ``block_scales = (ss, sm)``, uint8 E8M0 codes ``[ceil(K / 32), M]`` of the
    stationary and ``[ceil(K / 32), N]`` of the moving operand; row ``k`` adds
    ``round32(s[k, m] * m[k, n] * 2**(ss[k // 32, m] + sm[k // 32, n] - 254))``, NaN when
    either code is 255. The scaled product is exact in float64 (FP8 x FP8 has at most 8
    significant bits, and ``2**-286 .. 2**286`` is far inside float64's normal range), so
    its cast to float32 is the hardware's single rounding (subnormals and overflow
    included)."""
    if block_scales is None:
        s = np.asarray(stationary).astype(np.float32)
        m = np.asarray(moving).astype(np.float32)
    else:
        s = np.asarray(stationary).astype(np.float64)
        m = np.asarray(moving).astype(np.float64)
        ss, sm = (np.asarray(x).astype(np.int64) for x in block_scales)
    out = None
    with np.errstate(all="ignore"):
        for k0 in range(0, s.shape[0], kt_rows):
            acc = np.zeros((s.shape[1], m.shape[1]), np.float32)
            for k in range(k0, min(k0 + kt_rows, s.shape[0])):
                if block_scales is None:
                    product = s[k][:, None] * m[k][None, :]
                else:
                    a, b = ss[k // numerics.MX_BLOCK], sm[k // numerics.MX_BLOCK]
                    scale = np.ldexp(1.0, a[:, None] + b[None, :] - 2 * numerics.E8M0_BIAS)
                    nan = (a == numerics.E8M0_NAN)[:, None] | (b == numerics.E8M0_NAN)[None, :]
                    scale = np.where(nan, np.nan, scale)
                    product = (s[k][:, None] * m[k][None, :] * scale).astype(np.float32)
                acc = acc + product
            out = acc if out is None else out + acc
    return out


def reference_activation_float(x, *, scale=1.0, bias=None, relu=False, out="fp32"):
    """``cast(f(x * scale + bias[row]))`` in float32 with the hardware's rules
    (docs/numerics.md): relu makes every negative value and -0 +0; NaN results are the
    canonical NaN; the cast rounds as ``ml_dtypes``. An array of ``out``'s dtype."""
    x = np.asarray(x, np.float32)
    bias = np.zeros(x.shape[0], np.float32) if bias is None else np.asarray(bias, np.float32)
    with np.errstate(all="ignore"):
        y = x * np.float32(scale) + bias.reshape(-1, 1)
    if relu:
        y = np.where(np.signbit(y) & ~np.isnan(y), np.float32(0), y)
    nan = np.uint32(numerics.CANONICAL_NAN32).view(np.float32)
    y = np.where(np.isnan(y), nan, y).astype(np.float32)
    with np.errstate(all="ignore"):
        return y.astype(format_dtype(out))


def _matrix(name, value, dtype, rows=None):
    array = np.asarray(value)
    if array.ndim != 2 or 0 in array.shape:
        raise KernelError(f"{name}.shape={array.shape}: must be 2-D and non-empty")
    if array.dtype != dtype:
        raise KernelError(f"{name}.dtype={array.dtype}: must be {np.dtype(dtype).name}")
    if rows is not None and array.shape[0] != rows[1]:
        raise KernelError(f"{name}.shape={array.shape}: must have {rows[1]} rows, the "
                          f"{rows[0]}")
    return array


def _input_format(name, value):
    """The format of an input matrix: its dtype must be one of :data:`MATMUL_DTYPES`'
    (an MX format's elements are FP8: its dtype is that of the FP8 format)."""
    dtype = np.asarray(value).dtype
    allowed = list(dict.fromkeys(_dtype(f).name for f in MATMUL_DTYPES))
    if dtype.name not in allowed:
        raise KernelError(f"{name}.dtype={dtype}: must be one of {', '.join(allowed)}")
    return format_of_dtype(dtype)


def _brief(value):
    """``value`` for a message: an array as its dtype and shape."""
    if isinstance(value, np.ndarray):
        return f"<array {value.dtype} {value.shape}>"
    if isinstance(value, tuple | list):
        inner = ", ".join(_brief(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def _mx_format(name, fmt, block_scales, parts):
    """The kernel's format: ``fmt``, or with ``block_scales`` (a tuple of one array per name
    of ``parts``) the MX format of the FP8 format ``fmt``. ``name`` names the input whose
    dtype gave ``fmt``. Returns ``(format, block_scales as a tuple, or None)``."""
    if block_scales is None:
        return fmt, None
    if fmt not in _MX_OF:
        raise KernelError(
            f"block_scales: given with {name}.dtype={format_dtype(fmt).name} ({fmt}): block "
            "scales make an MX format, whose elements are FP8: float8_e4m3fn (mxfp8e4m3) or "
            "float8_e5m2 (mxfp8e5m2)")
    if not isinstance(block_scales, tuple | list) or len(block_scales) != len(parts):
        raise KernelError(f"block_scales={_brief(block_scales)}: must be a tuple "
                          f"({', '.join(parts)}) of {len(parts)} uint8 arrays of E8M0 codes")
    return _MX_OF[fmt], tuple(block_scales)


def _block_scales(name, value, rows, cols, what):
    """The E8M0 scales of an operand of ``rows`` x ``cols`` (``what`` names it): uint8
    ``[ceil(rows / 32), cols]``, any code (255 is NaN)."""
    array = np.asarray(value)
    blocks = -(-rows // numerics.MX_BLOCK)
    if array.dtype != np.uint8:
        raise KernelError(f"{name}.dtype={array.dtype}: must be uint8 (E8M0 scale codes, "
                          f"2**(code - {numerics.E8M0_BIAS}), {numerics.E8M0_NAN} = NaN)")
    if array.shape != (blocks, cols):
        raise KernelError(f"{name}.shape={array.shape}: must be ({blocks}, {cols}): one scale "
                          f"per block of {numerics.MX_BLOCK} of the {rows} rows of {what} and "
                          "per column")
    return array


def _pack(array, rate):
    """``array`` ``[K, C]`` as the SBUF takes it for a format of ``rate`` MACs per PE per
    cycle: ``[ceil(K / rate), C * rate]``, row ``q`` holding K rows ``q * rate ..
    q * rate + rate - 1`` side by side for each column (rows past K zero: their products
    add +0, which changes no sum, docs/numerics.md). ``array`` itself for rate 1."""
    if rate == 1:
        return array
    k, cols = array.shape
    padded = np.zeros((-(-k // rate) * rate, cols), array.dtype)
    padded[:k] = array
    return padded.reshape(-1, rate, cols).transpose(0, 2, 1).reshape(-1, cols * rate)


def _tile_scales(scales, K, R):
    """``scales`` (``[ceil(K / 32), cols]``) re-laid per K tile of ``R`` elements of K (a
    power of two): ``Bt = ceil(R / 32)`` rows per K tile, row ``kt * Bt + b`` holding block
    ``(kt * R) // 32 + b`` (for ``R < 32`` the block is shared by ``32 / R`` K tiles), rows
    past the last block 127 (``2**0``, never read: a K tile's matmuls read the blocks of its
    rows). One DMA then fetches a step's K tiles, block ``b`` of each into partition
    ``b``."""
    k_tiles, per_tile = -(-K // R), -(-R // numerics.MX_BLOCK)
    index = ((np.arange(k_tiles)[:, None] * R) // numerics.MX_BLOCK
             + np.arange(per_tile)[None, :]).ravel()
    out = np.full((k_tiles * per_tile, scales.shape[1]), numerics.E8M0_BIAS, np.uint8)
    valid = index < scales.shape[0]
    out[valid] = scales[index[valid]]
    return out


def _vector(name, value, length, dtype=np.int32):
    array = np.asarray(value)
    if array.shape != (length,) or array.dtype != dtype:
        raise KernelError(f"{name}: {array.dtype} {array.shape}: must be "
                          f"{np.dtype(dtype).name} of shape ({length},), one value per output "
                          "row")
    return array


def _out_format(name, out, fmt):
    """The output format of a kernel of input format ``fmt``: int8/int32 for int8, fp32 or
    ``fmt``'s element format for a float format."""
    allowed = ("int8", "int32") if fmt == "int8" else ("fp32", _element(fmt))
    if out not in allowed:
        raise KernelError(f"{name}={out!r}: must be one of {', '.join(allowed)} for {fmt} "
                          "inputs")
    return out


def _scale(name, value):
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating) \
            or not np.isfinite(value):
        raise KernelError(f"{name}={value!r}: must be a finite number")
    return float(value)


def _requant(name, value):
    try:
        multiplier, shift = value
    except (TypeError, ValueError):
        raise KernelError(f"{name}={value!r}: must be a pair (multiplier, shift)") from None
    for part, v, lo, hi in (("multiplier", multiplier, -(1 << 31), (1 << 31) - 1),
                            ("shift", shift, 0, 63)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not lo <= v <= hi:
            prefix = f"{name} " if name else ""
            raise KernelError(f"{prefix}{part}={v!r}: must be an integer in [{lo}, {hi}]")
    return int(multiplier), int(shift)


def _rate(config, fmt):
    """The MACs per PE per cycle of ``fmt`` on ``config``; a format the build lacks is a
    :class:`KernelError`."""
    tensor_format(config, fmt)
    return config.macs_per_pe_cycle(fmt)


def _bias_bytes(cfg, rows):
    align = max(4, cfg.dma_bus_bytes)
    return -(-(4 * -(-rows // cfg.pe_cols)) // align) * align


# -- the kernels ------------------------------------------------------------------------------


def _check_config(config):
    if not isinstance(config, Config):
        raise KernelError(f"config={config!r}: must be an opentrn.config.Config "
                          "(config.preset(name) or config.resolve(...))")


def least_matmuls(config, dtype, K, M, N):
    """The fewest ``MATMUL`` instructions of a ``(K, M, N)`` product in ``dtype``: each
    takes one stationary tile (``pe_rows`` rows of K, ``rate`` elements a row, by
    ``pe_cols`` columns) and at most ``moving_max`` moving columns, whichever operand is
    the stationary one."""
    def up(a, b):
        return -(-a // b)

    P, chunk = config.pe_cols, config.moving_max
    k_tiles = up(up(K, config.macs_per_pe_cycle(dtype)), config.pe_rows)
    return k_tiles * min(up(M, P) * up(N, chunk), up(N, P) * up(M, chunk))


def check_fits(config, dtype, matrices, *, products=()):
    """Refuse, before any array is drawn or instruction generated, a kernel whose operands,
    results and least program do not fit the configuration's HBM: ``matrices`` is ``{name:
    (rows, columns, element bytes)}`` (element bytes ``None``: ``dtype``'s); ``products``
    the kernel's matrix products ``(K, M, N)``, each at least :func:`least_matmuls`
    instructions of ``isa.WORD_BYTES``: a lower bound of the image; :meth:`Kernel.build`
    checks the exact size."""
    _check_config(config)
    element = numerics.data_format(dtype).bytes
    data = sum(rows * columns * (element if size is None else size)
               for rows, columns, size in matrices.values())
    # A format the build lacks is refused later, by name, where the format is checked.
    matmuls = (sum(least_matmuls(config, dtype, *product) for product in products)
               if dtype in config.dtypes else 0)
    program = matmuls * isa.WORD_BYTES
    if data + program > config.hbm_bytes:
        shapes = ", ".join(f"{name} {rows} x {columns}"
                           for name, (rows, columns, _) in matrices.items())
        what = (f"the operands and results need at least {data:,} bytes of HBM,"
                if data > config.hbm_bytes else
                f"the operands and results ({data:,} bytes) and the program (at least "
                f"{matmuls:,} MATMUL instructions: {program:,} bytes) need")
        raise KernelError(f"{shapes}: {what} more than hbm_bytes={config.hbm_bytes:,}")


def _gemm(config, a_t, b, *, name, bias=None, scaling=None, relu=False, out=None,
          block_scales=None, reference=True):
    _check_config(config)
    fmt, block_scales = _mx_format("a_t", _input_format("a_t", a_t), block_scales,
                                   ("sa", "sb"))
    a_t = _matrix("a_t", a_t, _dtype(fmt))
    b = _matrix("b", b, _dtype(fmt), rows=("K rows of a_t", a_t.shape[0]))
    floating = fmt != "int8"
    out = _out_format("out", out or ("fp32" if floating else "int32"), fmt)
    K, M = a_t.shape
    N = b.shape[1]
    # Before any instruction is generated (a GEMM far beyond the HBM would take minutes).
    check_fits(config, fmt, {"a_t": (K, M, None), "b": (K, N, None),
                             "c" if bias is None else "y":
                             (M, N, numerics.data_format(out).bytes)}, products=[(K, M, N)])
    rate = _rate(config, fmt)
    kt_rows = config.pe_rows                 # rows (partitions) of a K tile
    mx = block_scales is not None
    if mx:
        sa = _block_scales("block_scales[0] (sa)", block_scales[0], K, M, "a_t")
        sb = _block_scales("block_scales[1] (sb)", block_scales[1], K, N, "b")
    k = Kernel(config, name=name)
    A, B = k.input("a_t", _pack(a_t, rate)), k.input("b", _pack(b, rate))
    SA = SB = None
    if mx:
        SA = k.input("a_t_scales", _tile_scales(sa, K, kt_rows * rate))
        SB = k.input("b_scales", _tile_scales(sb, K, kt_rows * rate))
    bias_tensor = None
    if bias is not None:
        bias = _vector("bias", bias, M, np.float32 if floating else np.int32)
        bias_tensor = k.input("bias", bias.reshape(M, 1))
    out_name = "c" if bias is None else "y"
    C = k.output(out_name, (M, N), format_dtype(out))
    size = numerics.data_format(out).bytes
    rows = -(-K // rate)                     # K in rows of packed columns
    # The plain GEMM's tiling is timed by the cycle model's fast path, which models it.
    plain = bias is None and size == 4 and not relu
    sched = Schedule(k, columns=N, k_tiles=-(-rows // kt_rows),
                      m_tiles=-(-M // config.pe_cols), moving_from_hbm=True,
                      staging_out=size, resident_tiles=0,
                      fixed_bytes=_bias_bytes(config, M) if bias is not None else 0,
                      element=numerics.column_bytes(config, fmt), mx=mx,
                      tiling=schedule.gemm_tiling(config, M, K, N, fmt) if plain else None)
    bias_tile = sched.load_bias(bias_tensor) if bias is not None else None
    if scaling is None:
        scaling = {"scale": 1.0} if floating else {"multiplier": 1, "shift": 0}
    layer = Layer(a=A, K=rows, M=M, kt_rows=kt_rows, moving=B, resident=None,
                   function="relu" if relu else "identity", scaling=scaling, out=out,
                   bias=bias_tile, dest=C, P=sched.P, dtype=fmt, a_scales=SA, moving_scales=SB,
                   rate=rate)
    sched.run(step for block in range(len(sched.blocks)) for step in sched.steps(layer, block))
    if not reference:
        return k.build(), None
    if floating:
        acc = reference_matmul_float(a_t, b, kt_rows=kt_rows * rate,
                                     block_scales=(sa, sb) if mx else None)
        expected = reference_activation_float(acc, bias=bias, relu=relu, out=out, **scaling)
    else:
        acc = reference_matmul(config, a_t, b)
        expected = (acc.astype(np.int32) if bias is None else
                    reference_activation(acc, bias=bias, relu=relu, out=out,
                                         **scaling).astype(C.dtype))
    return k.build(), {out_name: expected}


def gemm(config: Config, a_t, b, *, block_scales=None,
         name: str = "gemm") -> tuple[Program, dict]:
    """``C[M, N] = A @ B`` from ``a_t = A.T`` ``[K, M]`` and ``b`` ``[K, N]``, both of one
    format (int8, bf16, fp8e4m3 or fp8e5m2, the arrays' dtype); any ``M, K, N >= 1``.
    ``C`` is int32 (the PSUM accumulators, ``acc_bits`` wrap-around) or float32 (FP32
    accumulation, docs/numerics.md). Results leave the PSUM through an identity
    ``ACTIVATE`` (int32 out: multiplier 1, shift 0; float: ``x * 1.0 + 0.0``, exact except
    that it makes -0 +0) into an SBUF staging tile, then one DMA per M tile and column
    block. Returns ``(program, {"c": expected})``.

    MX formats: FP8 arrays with ``block_scales = (sa, sb)``, uint8 E8M0 codes ``sa``
    ``[ceil(K / 32), M]`` (A's) and ``sb`` ``[ceil(K / 32), N]`` (B's), make the format
    mxfp8e4m3 (float8_e4m3fn) or mxfp8e5m2 (float8_e5m2), which the config's ``dtypes``
    must name: every product is ``a_t[k, m] * b[k, n] * 2**(sa[k // 32, m] +
    sb[k // 32, n] - 254)`` (NaN for a code of 255), rounded once to FP32. The program's
    inputs then include the scales re-laid per K tile, ``"a_t_scales"`` and
    ``"b_scales"``."""
    return _gemm(config, a_t, b, name=name, block_scales=block_scales)


def gemm_bias_relu(config: Config, a_t, b, bias, *, multiplier: int | None = None,
                   shift: int | None = None, scale: float | None = None, out: str | None = None,
                   block_scales=None, name: str = "gemm_bias_relu") -> tuple[Program, dict]:
    """GEMM + bias + relu with exactly one ``ACTIVATE`` per PSUM bank, ``C = A @ B`` as
    :func:`gemm`:

    * int8 inputs: ``y[m, n] = sat8(relu(round_half_even((C[m, n] * multiplier + bias[m])
      / 2**shift)))``, ``bias`` int32 ``[M]``, ``multiplier`` and ``shift`` required;
    * float inputs: ``y[m, n] = cast(relu(C[m, n] * scale + bias[m]))`` in FP32, ``bias``
      float32 ``[M]``, ``scale`` (default 1.0), ``out`` the input format (default) or
      ``"fp32"``;
    * MX inputs (FP8 arrays with ``block_scales = (sa, sb)``, as :func:`gemm`): as float
      inputs, ``out`` the FP8 element format (default) or ``"fp32"``.

    Returns ``(program, {"y": expected})``."""
    _check_config(config)
    fmt, _ = _mx_format("a_t", _input_format("a_t", a_t), block_scales, ("sa", "sb"))
    if fmt == "int8":
        if scale is not None:
            raise KernelError(f"scale={scale!r}: is for float inputs; int8 takes multiplier "
                              "and shift")
        if multiplier is None or shift is None:
            raise KernelError(f"multiplier={multiplier!r}, shift={shift!r}: both are "
                              "required for int8 inputs")
        multiplier, shift = _requant(None, (multiplier, shift))
        scaling = {"multiplier": multiplier, "shift": shift}
        out = _out_format("out", out or "int8", fmt)
    else:
        if multiplier is not None or shift is not None:
            raise KernelError(f"multiplier={multiplier!r}, shift={shift!r}: are for int8 "
                              f"inputs; {fmt} takes scale")
        scaling = {"scale": _scale("scale", 1.0 if scale is None else scale)}
        out = _out_format("out", out or _element(fmt), fmt)
    return _gemm(config, a_t, b, name=name, bias=bias, scaling=scaling, relu=True, out=out,
                 block_scales=block_scales)


def mlp(config: Config, x_t, w1, b1, w2, b2, *, requant=None, scales=None,
        out: str | None = None, block_scales=None,
        name: str = "mlp") -> tuple[Program, dict]:
    """A 2-layer MLP in feature-major layout (features on the partitions):

    * ``h_t[hidden, batch] = act1(relu(w1.T @ x_t, b1))``, kept in the SBUF in the input
      format as the moving data of layer 2 (one K tile per PSUM M tile: ``pe_cols`` rows);
    * ``out_t[d_out, batch] = act2(w2.T @ h_t, b2)``, written to HBM.

    ``x_t`` ``[d_in, batch]``, ``w1`` ``[d_in, hidden]``, ``w2`` ``[hidden, d_out]`` of one
    format. int8: ``act(x, b) = sat(rhe((x * m + b) / 2**s))`` with
    ``requant = ((m1, s1), (m2, s2))``, ``b1``/``b2`` int32, ``out`` int8 (default) or int32.
    Float formats: ``act(x, b) = cast(x * scale + b)`` in FP32 with ``scales = (scale1,
    scale2)`` (default (1.0, 1.0)), ``b1``/``b2`` float32, ``out`` the input format
    (default) or fp32. The batch is processed in column blocks; each block's hidden
    activations stay in the SBUF (double-buffered across blocks). Returns
    ``(program, {"out_t": expected})``.

    MX formats: FP8 arrays with ``block_scales = (s_x, s_w1, s_w2)``, uint8 E8M0 codes per
    block of 32 rows along K and per column: ``s_x`` ``[ceil(d_in / 32), batch]``, ``s_w1``
    ``[ceil(d_in / 32), hidden]``, ``s_w2`` ``[ceil(hidden / 32), d_out]`` (as
    :func:`gemm`); as the float formats otherwise, ``out`` the FP8 element format (default)
    or fp32. The activation engine has no MX quantiser: the hidden activations are cast to
    the FP8 element format and enter layer 2 with unit scales (code 127, ``2**0``), which
    the kernel supplies itself (input ``"h_scales"``); the other scales are inputs
    re-laid per K tile (``"x_t_scales"``, ``"w1_scales"``, ``"w2_scales"``)."""
    _check_config(config)
    fmt, block_scales = _mx_format("x_t", _input_format("x_t", x_t), block_scales,
                                   ("s_x", "s_w1", "s_w2"))
    dtype = _dtype(fmt)
    floating = fmt != "int8"
    mx = block_scales is not None
    x_t = _matrix("x_t", x_t, dtype)
    w1 = _matrix("w1", w1, dtype, rows=("d_in rows of x_t", x_t.shape[0]))
    w2 = _matrix("w2", w2, dtype, rows=("hidden columns of w1", w1.shape[1]))
    d_in, batch = x_t.shape
    hidden, d_out = w1.shape[1], w2.shape[1]
    check_fits(config, fmt, {"x_t": (d_in, batch, None), "w1": (d_in, hidden, None),
                             "w2": (hidden, d_out, None), "out": (d_out, batch, None)},
               products=[(d_in, hidden, batch), (hidden, d_out, batch)])
    if mx:
        s_x = _block_scales("block_scales[0] (s_x)", block_scales[0], d_in, batch, "x_t")
        s_w1 = _block_scales("block_scales[1] (s_w1)", block_scales[1], d_in, hidden, "w1")
        s_w2 = _block_scales("block_scales[2] (s_w2)", block_scales[2], hidden, d_out, "w2")
    bias_dtype = np.float32 if floating else np.int32
    b1 = _vector("b1", b1, hidden, bias_dtype)
    b2 = _vector("b2", b2, d_out, bias_dtype)
    if floating:
        if requant is not None:
            raise KernelError(f"requant={requant!r}: is for int8 inputs; {fmt} takes scales")
        try:
            scale1, scale2 = (1.0, 1.0) if scales is None else scales
        except (TypeError, ValueError):
            raise KernelError(f"scales={scales!r}: must be (scale1, scale2), one per "
                              "layer") from None
        scaling1 = {"scale": _scale("scales[0]", scale1)}
        scaling2 = {"scale": _scale("scales[1]", scale2)}
        out = _out_format("out", out or _element(fmt), fmt)
    else:
        if scales is not None:
            raise KernelError(f"scales={scales!r}: are for float inputs; int8 takes requant")
        try:
            (m1, s1), (m2, s2) = requant
        except (TypeError, ValueError):
            raise KernelError(f"requant={requant!r}: must be ((multiplier, shift), "
                              "(multiplier, shift)), one pair per layer") from None
        m1, s1 = _requant("requant[0]", (m1, s1))
        m2, s2 = _requant("requant[1]", (m2, s2))
        scaling1 = {"multiplier": m1, "shift": s1}
        scaling2 = {"multiplier": m2, "shift": s2}
        out = _out_format("out", out or "int8", fmt)
    cfg = config
    P = cfg.pe_cols
    if _rate(cfg, fmt) > 1:
        raise KernelError(
            f"dtype={fmt!r}: {cfg.macs_per_pe_cycle(fmt)} MACs per PE per cycle on this build "
            "(pe_macs_per_cycle): its matmuls take that many elements of K per partition, "
            "and the activation engine writes one hidden feature per partition, so the "
            "hidden layer cannot feed layer 2; run the layers as two GEMMs")
    if P > cfg.pe_rows:
        raise KernelError(f"pe_cols={P}: must be at most pe_rows={cfg.pe_rows} (a hidden tile "
                          "of pe_cols rows is one K tile of layer 2)")
    k = Kernel(cfg, name=name)
    X, W1, W2 = k.input("x_t", x_t), k.input("w1", w1), k.input("w2", w2)
    B1, B2 = k.input("b1", b1.reshape(hidden, 1)), k.input("b2", b2.reshape(d_out, 1))
    fixed = _bias_bytes(cfg, hidden) + _bias_bytes(cfg, d_out)
    if mx:
        SX = k.input("x_t_scales", _tile_scales(s_x, d_in, cfg.pe_rows))
        SW1 = k.input("w1_scales", _tile_scales(s_w1, d_in, cfg.pe_rows))
        SW2 = k.input("w2_scales", _tile_scales(s_w2, hidden, P))
        # Unit scales of the hidden activations: one K tile of layer 2 (ceil(P / 32)
        # blocks) x the widest matmul, all 127.
        unit_cols = min(cfg.moving_max, batch)
        unit = np.full((-(-P // numerics.MX_BLOCK), unit_cols), numerics.E8M0_BIAS, np.uint8)
        H_SCALES = k.input("h_scales", unit)
        align = max(4, cfg.dma_bus_bytes)
        fixed += -(-unit_cols // align) * align
    size = numerics.data_format(out).bytes
    OUT = k.output("out_t", (d_out, batch), format_dtype(out))
    hidden_tiles = -(-hidden // P)
    element = numerics.data_format(fmt).bytes
    # groups=1: a K tile of layer 2 (pe_cols rows) may have fewer scale blocks than the
    # hardware's mx_blocks, so its scales cannot share byte ranges in groups of them.
    sched = Schedule(k, columns=batch,
                      k_tiles=max(-(-d_in // cfg.pe_rows), hidden_tiles),
                      m_tiles=max(hidden_tiles, -(-d_out // P)),
                      moving_from_hbm=True, staging_out=size, resident_tiles=hidden_tiles,
                      fixed_bytes=fixed, element=element, mx=mx, groups=1)
    bias1, bias2 = sched.load_bias(B1), sched.load_bias(B2)
    unit_tile = None
    if mx:
        unit_tile = k.sbuf(unit.shape[0], unit_cols)
        k.dma(unit_tile, H_SCALES)
    h_tiles = [k.sbuf(cfg.sbuf_partitions, hidden_tiles * sched.b_stride) for _ in range(2)]
    hidden_format = _element(fmt) if floating else "int8"
    layer1 = Layer(a=W1, K=d_in, M=hidden, kt_rows=cfg.pe_rows, moving=X, resident=None,
                    function="relu", scaling=scaling1, out=hidden_format, bias=bias1,
                    dest=h_tiles, P=P, dtype=fmt, a_scales=SW1 if mx else None,
                    moving_scales=SX if mx else None)
    layer2 = Layer(a=W2, K=hidden, M=d_out, kt_rows=P, moving=None, resident=h_tiles,
                    function="identity", scaling=scaling2, out=out, bias=bias2,
                    dest=OUT, P=P, dtype=fmt, a_scales=SW2 if mx else None,
                    resident_scales=unit_tile)
    sched.run(step for block in range(len(sched.blocks))
              for layer in (layer1, layer2) for step in sched.steps(layer, block))
    if floating:
        h = reference_activation_float(
            reference_matmul_float(w1, x_t, kt_rows=cfg.pe_rows,
                                   block_scales=(s_w1, s_x) if mx else None),
            bias=b1, relu=True, out=hidden_format, **scaling1)
        h_scales = (np.full((-(-hidden // numerics.MX_BLOCK), batch), numerics.E8M0_BIAS,
                            np.uint8) if mx else None)
        y = reference_activation_float(
            reference_matmul_float(w2, h, kt_rows=P,
                                   block_scales=(s_w2, h_scales) if mx else None),
            bias=b2, out=out, **scaling2)
    else:
        h = reference_activation(reference_matmul(cfg, w1, x_t), bias=b1, relu=True,
                                 out="int8", **scaling1)
        y = reference_activation(reference_matmul(cfg, w2, h), bias=b2, relu=False, out=out,
                                 **scaling2).astype(OUT.dtype)
    return k.build(), {"out_t": y}


# -- random inputs and kernels (the CLI's ``run``, tests, benchmarks) -------------------------

#: Random E8M0 scale codes of the MX formats, from ``low`` to ``high - 1``: ``2**-3`` to
#: ``2**3`` per operand, so that the scaled sums stay mostly within FP8 range.
MX_SCALE_CODES = (124, 131)


def random_inputs(rng, shape, dtype):
    """Random int8 values, or normal values rounded to the float format ``dtype`` (an MX
    format: its FP8 element format)."""
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    element = numerics.data_format(dtype).element.name
    return rng.standard_normal(shape).astype(np.float32).astype(format_dtype(element))


def random_scales(rng, rows, cols):
    """Random E8M0 scale codes (uint8) of an MX operand of ``rows`` x ``cols``: one per
    block of 32 rows and per column (:data:`MX_SCALE_CODES`)."""
    return rng.integers(*MX_SCALE_CODES, (-(-rows // numerics.MX_BLOCK), cols)).astype(
        np.uint8)


def random_gemm(config: Config, rng, m, k, n, dtype) -> Program:
    """The program of :func:`gemm` of ``C[m, n] = A[m, k] @ B[k, n]`` on random inputs
    (and, for an MX format, random block scales) from ``rng``, without the expected result
    (the reference computes every product: minutes at 4096^3). For timing models, which
    move no data."""
    a, b = random_inputs(rng, (m, k), dtype), random_inputs(rng, (k, n), dtype)
    extra = ({"block_scales": (random_scales(rng, k, m), random_scales(rng, k, n))}
             if numerics.data_format(dtype).mx else {})
    return _gemm(config, a.T.copy(), b, name="gemm", reference=False, **extra)[0]


def random_bias(rng, size, dtype, span):
    """A random bias: int32 in ``[-span, span)`` for int8, else standard normal FP32."""
    if dtype == "int8":
        return rng.integers(-span, span, size).astype(np.int32)
    return rng.standard_normal(size).astype(np.float32)


def random_kernel(config: Config, rng, *, largest: int) -> tuple[str, Program]:
    """A library kernel of random kind (GEMM, GEMM + bias + ReLU, MLP), format (one of
    ``config.dtypes``) and shape (each dimension 1 to ``largest``, half that for the MLP's),
    with random inputs: ``(label, program)``. For comparing timing models with the RTL."""
    dtype = str(rng.choice(config.dtypes))
    kind = str(rng.choice(["gemm", "gemm-relu", "mlp"], p=[0.5, 0.25, 0.25]))
    if kind == "mlp" and config.macs_per_pe_cycle(dtype) > 1:
        kind = "gemm"                   # the MLP needs one element of K per partition
    mx = numerics.data_format(dtype).mx
    scaling = {} if dtype == "int8" else {"scales": (0.25, 0.25)}
    if kind == "mlp":
        batch, d_in, hidden, d_out = (int(x) for x in rng.integers(1, largest // 2 + 2, 4))
        x_t, w1 = random_inputs(rng, (d_in, batch), dtype), random_inputs(rng, (d_in, hidden),
                                                                          dtype)
        w2 = random_inputs(rng, (hidden, d_out), dtype)
        b1, b2 = random_bias(rng, hidden, dtype, 2000), random_bias(rng, d_out, dtype, 2000)
        if mx:
            scaling["block_scales"] = (random_scales(rng, d_in, batch),
                                       random_scales(rng, d_in, hidden),
                                       random_scales(rng, hidden, d_out))
        requant = ((1, 7), (1, 7)) if dtype == "int8" else None
        program, _ = mlp(config, x_t, w1, b1, w2, b2, requant=requant, **scaling)
        return f"{dtype} mlp {batch}x{d_in}x{hidden}x{d_out}", program
    m, k, n = (int(x) for x in rng.integers(1, largest + 1, 3))
    a, b = random_inputs(rng, (m, k), dtype), random_inputs(rng, (k, n), dtype)
    extra = ({"block_scales": (random_scales(rng, k, m), random_scales(rng, k, n))}
             if mx else {})
    if kind == "gemm-relu":
        bias = random_bias(rng, m, dtype, 4000)
        requant = {"multiplier": 1, "shift": 8} if dtype == "int8" else {"scale": 0.125}
        program, _ = gemm_bias_relu(config, a.T.copy(), b, bias, **requant, **extra)
    else:
        program, _ = gemm(config, a.T.copy(), b, **extra)
    return f"{dtype} {kind} {m}x{k}x{n}", program
