"""Library kernels built with :mod:`opentrn.kernel`: tiled GEMM, GEMM + bias + relu with
int8 requantisation or a float cast, and a 2-layer MLP, in int8 or a float format (bf16,
fp8e4m3, fp8e5m2: the dtype of the input arrays). Each returns ``(program, expected)``: the
built :class:`~opentrn.kernel.Program` and ``{output name: array}`` computed independently
in numpy (int64, or float32 in the hardware's order of operations: docs/numerics.md), never
through the golden machine.

Layout convention (NKI's ``nc_matmul``): ``out[M, N] = stationary[K, M].T @ moving[K, N]``;
the SBUF partition axis is the contraction axis K (``pe_rows`` partitions per K tile) and
the PSUM partitions are M (``pe_cols`` per M tile). So ``gemm`` takes ``A`` transposed
(``a_t[K, M]``) and ``b[K, N]``.

The schedule (docs/kernels.md, "Library kernels"): the output columns are cut into
**blocks** of up to ``G * moving_max`` columns, ``G = psum_banks // 2`` PSUM banks per block
(one ``moving_max`` chunk per bank), so that two groups of banks alternate: the activation
engine drains one group while the tensor engine accumulates into the other. For each block,
for each M tile, for each K tile, one ``LOAD_STATIONARY`` serves the block's chunks (one
``MATMUL`` each, ``accumulate`` from the second K tile on). The moving block (``b[:, block]``,
every K tile) stays in the SBUF across all M tiles; the stationary tiles of up to
:data:`MAX_M_BLOCK` M tiles (every K tile) come in one 3-D DMA descriptor; both are
double-buffered and fetched one step (M tile) ahead, so the DMA overlaps the matmuls. When a
block's K tiles do not fit, K is cut into parts (the moving data is then fetched per M tile
and K part; the PSUM keeps accumulating). Results go PSUM -> ``ACTIVATE`` -> SBUF staging
(double-buffered) -> one DMA per M tile and block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opentrn import numerics
from opentrn.config import Config
from opentrn.kernel import (
    FORMAT_DTYPES,
    Kernel,
    KernelError,
    Pattern,
    Program,
    SbufTile,
    Tensor,
    format_of_dtype,
)

#: The most M tiles whose stationary data one DMA descriptor fetches.
MAX_M_BLOCK = 4

__all__ = ["gemm", "gemm_bias_relu", "mlp", "reference_matmul", "reference_activation",
           "reference_matmul_float", "reference_activation_float", "MATMUL_DTYPES"]

#: The input formats of the kernels.
MATMUL_DTYPES = ("int8", "bf16", "fp8e4m3", "fp8e5m2")


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


def reference_matmul_float(stationary, moving, *, kt_rows):
    """``stationary.T @ moving`` (float arrays of one format) in float32, in the order the
    hardware adds: per K tile of ``kt_rows`` rows ``acc = +0``, then ``acc + s[k] * m[k]``
    row by row, then the tiles' sums into the result in K order (the PSUM accumulate)."""
    s = np.asarray(stationary).astype(np.float32)
    m = np.asarray(moving).astype(np.float32)
    out = None
    with np.errstate(all="ignore"):
        for k0 in range(0, s.shape[0], kt_rows):
            acc = np.zeros((s.shape[1], m.shape[1]), np.float32)
            for k in range(k0, min(k0 + kt_rows, s.shape[0])):
                acc = acc + s[k][:, None] * m[k][None, :]
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
        return y.astype(FORMAT_DTYPES[out])


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
    """The format of an input matrix: its dtype must be one of :data:`MATMUL_DTYPES`'."""
    dtype = np.asarray(value).dtype
    allowed = [FORMAT_DTYPES[f].name for f in MATMUL_DTYPES]
    if dtype.name not in allowed:
        raise KernelError(f"{name}.dtype={dtype}: must be one of {', '.join(allowed)}")
    return format_of_dtype(dtype)


def _vector(name, value, length, dtype=np.int32):
    array = np.asarray(value)
    if array.shape != (length,) or array.dtype != dtype:
        raise KernelError(f"{name}: {array.dtype} {array.shape}: must be "
                          f"{np.dtype(dtype).name} of shape ({length},), one value per output "
                          "row")
    return array


def _out_format(name, out, fmt):
    """The output format of a kernel of input format ``fmt``: int8/int32 for int8, fp32 or
    ``fmt`` for a float format."""
    allowed = ("int8", "int32") if fmt == "int8" else ("fp32", fmt)
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


# -- the tiled schedule -------------------------------------------------------------------------


@dataclass
class _Layer:
    """One ``out[M, N] = a[K, M].T @ moving[K, N]`` with its epilogue."""
    a: Tensor                   # stationary, [K, M] in HBM
    K: int
    M: int
    kt_rows: int                # rows of a K tile
    moving: Tensor | None       # [K, N] in HBM, or None: ``resident`` holds it
    resident: list | None       # per block: the SBUF tile holding the moving block
    function: str
    scaling: dict               # multiplier and shift, or scale (Kernel.activation)
    out: str                    # the output format
    bias: SbufTile | None       # 4 bytes (int32, FP32) at 4 * mt of partition p: bias[mt*P+p]
    dest: Tensor | list         # [M, N] in HBM, or per block the SBUF tile of the results
    P: int                      # rows of an M tile (pe_cols)
    dtype: str = "int8"         # the input format

    @property
    def size(self):
        """Bytes of one input element."""
        return numerics.data_format(self.dtype).bytes

    @property
    def out_size(self):
        return numerics.data_format(self.out).bytes

    @property
    def k_tiles(self):
        return -(-self.K // self.kt_rows)

    @property
    def m_tiles(self):
        return -(-self.M // self.P)


@dataclass
class _Step:
    layer: _Layer
    block: int
    n0: int                     # first column of the block
    width: int                  # columns of the block
    mt: int
    kt0: int                    # K tiles kt0..kt1-1
    kt1: int
    first: bool                 # the first K part of (block, mt): overwrite the PSUM
    last: bool                  # the last K part: the epilogue follows
    a_slot: tuple | None = None     # (tile, byte offset of this M tile in K tile kt0)
    moving: tuple | None = None     # (tile, byte offset of K tile kt0, column 0)


class _Schedule:
    """Tiles, sizes and the emission of a list of layers over column blocks."""

    def __init__(self, kernel: Kernel, *, columns, k_tiles, m_tiles, moving_from_hbm,
                 staging_out, fixed_bytes, resident_tiles, element=1):
        """``columns``: N; ``k_tiles`` / ``m_tiles``: the most K / M tiles of a layer;
        ``staging_out``: result bytes (1, 2, 4) staged for HBM, 0 if none; ``fixed_bytes``:
        per-partition bytes of other tiles; ``resident_tiles``: K tiles of moving data kept
        per block (MLP hidden), x 2; ``element``: bytes of an input element."""
        self.k = kernel
        cfg = kernel.config
        self.cfg = cfg
        self.P = cfg.pe_cols
        self.chunk = cfg.moving_max
        self.groups = 2 if cfg.psum_banks >= 2 else 1
        self.banks_per_group = max(1, cfg.psum_banks // 2)
        align = max(4, cfg.dma_bus_bytes)

        def al(x):
            return -(-x // align) * align

        budget = cfg.sbuf_bytes_per_partition

        def need(kts, w, mb=1):
            e = element
            return (2 * al(kts * mb * self.P * e) + (2 * al(kts * w * e) if moving_from_hbm
                                                     else 0)
                    + (2 * al(w * staging_out) if staging_out else 0)
                    + (2 * al(resident_tiles * w * e) if resident_tiles else 0) + fixed_bytes)

        width = min(columns, self.banks_per_group * self.chunk)
        while True:
            kts = k_tiles
            while kts > 1 and need(kts, width) > budget:
                kts = max(1, min(kts - 1, kts * budget // max(1, need(kts, width))))
            if need(kts, width) <= budget:
                break
            if width == 1:
                raise KernelError(
                    f"sbuf_bytes_per_partition={budget}: too small for this kernel even with "
                    f"one column per block and one K tile per step (needs "
                    f"{need(1, 1)} bytes per partition)")
            width = max(1, width // 2)
        # Stationary tiles of up to MAX_M_BLOCK M tiles per descriptor (fewer, longer rows),
        # when K is not cut into parts (else each part's tiles are needed at another step).
        mb = 1
        if kts >= k_tiles:
            while mb < min(m_tiles, MAX_M_BLOCK) and need(kts, width, mb + 1) <= budget:
                mb += 1
        self.width, self.kts, self.m_block = width, kts, mb
        self.element = element
        self.a_stride = mb * self.P * element    # bytes of one K tile in a stationary slot
        self.b_stride = width * element          # bytes of one K tile in a moving slot
        self.blocks = [(n0, min(width, columns - n0)) for n0 in range(0, columns, width)]
        k = kernel
        self.a_slots = [k.sbuf(cfg.sbuf_partitions, kts * self.a_stride) for _ in range(2)]
        self.b_slots = ([k.sbuf(cfg.sbuf_partitions, kts * self.b_stride) for _ in range(2)]
                        if moving_from_hbm else [])
        self.staging = ([k.sbuf(self.P, width * staging_out) for _ in range(2)]
                        if staging_out else [])
        self.psum = [[k.psum(cfg.psum_bank_entries, bank=g * self.banks_per_group + c)
                      for c in range(self.banks_per_group)] for g in range(self.groups)]
        self.a_count = self.b_count = self.stage_count = self.group_count = 0
        self.a_key = self.b_key = None

    def steps(self, layer, block):
        n0, width = self.blocks[block]
        kt = layer.k_tiles
        parts = [(k0, min(kt, k0 + self.kts)) for k0 in range(0, kt, self.kts)]
        for mt in range(layer.m_tiles):
            for i, (k0, k1) in enumerate(parts):
                yield _Step(layer, block, n0, width, mt, k0, k1, i == 0, i == len(parts) - 1)

    # -- emission -------------------------------------------------------------------------------

    def run(self, steps):
        """Emit ``steps``, each step's loads one step ahead of its compute."""
        steps = list(steps)
        if steps:
            self._prefetch(steps[0])
        for i, step in enumerate(steps):
            if i + 1 < len(steps):
                self._prefetch(steps[i + 1])
            self._compute(step)
            if step.last:
                self._epilogue(step)

    def _rows_3d(self, tensor, r0, r1, c0, cols, tile, kt_bytes, R):
        """DMA ``tensor[r0:r1, c0:c0+cols]`` into ``tile``: row ``r`` to partition
        ``(r - r0) % R``, bytes ``((r - r0) // R) * kt_bytes`` on: one descriptor for the
        full K tiles, one for a partial last one."""
        full = (r1 - r0) // R
        rb, e = tensor.row_bytes, tensor.itemsize
        if full:
            self.k.dma_pattern(Pattern(tile, offset=0, stride2=kt_bytes, pstep1=1),
                               Pattern(tensor, offset=r0 * rb + c0 * e, stride1=rb,
                                       stride2=R * rb),
                               n0=cols, n1=R, n2=full, elem_bytes=e)
        rest = (r1 - r0) - full * R
        if rest:
            self.k.dma_pattern(Pattern(tile, offset=full * kt_bytes, pstep1=1),
                               Pattern(tensor, offset=(r0 + full * R) * rb + c0 * e,
                                       stride1=rb),
                               n0=cols, n1=rest, elem_bytes=e)

    def _prefetch(self, step):
        layer = step.layer
        R = layer.kt_rows
        r0, r1 = step.kt0 * R, min(layer.K, step.kt1 * R)
        if layer.moving is not None:
            key = (id(layer), step.block, step.kt0)
            if key != self.b_key:
                tile = self.b_slots[self.b_count % 2]
                self.b_count += 1
                self.b_key = key
                self._rows_3d(layer.moving, r0, r1, step.n0, step.width, tile, self.b_stride,
                              R)
                self.b_tile = tile
            step.moving = (self.b_tile, 0)
        else:
            step.moving = (layer.resident[step.block % len(layer.resident)],
                           step.kt0 * self.b_stride)
        mb = self.m_block
        key = (id(layer), step.block, step.mt // mb, step.kt0)
        if key != self.a_key:
            self.a_key = key
            self.a_tile = self.a_slots[self.a_count % 2]
            self.a_count += 1
            m0 = (step.mt // mb) * mb * self.P
            cols = min(mb * self.P, layer.M - m0)
            self._rows_3d(layer.a, r0, r1, m0, cols, self.a_tile, self.a_stride, R)
        step.a_slot = (self.a_tile, (step.mt % mb) * self.P * self.element)

    def _chunks(self, width):
        return [(c0, min(self.chunk, width - c0)) for c0 in range(0, width, self.chunk)]

    def _compute(self, step):
        k, layer = self.k, step.layer
        R = layer.kt_rows
        mrows = min(self.P, layer.M - step.mt * self.P)
        group = self.psum[self.group_count % self.groups]
        tile, base = step.moving
        a_tile, a_offset = step.a_slot
        e = layer.size
        for i, kt in enumerate(range(step.kt0, step.kt1)):
            rows = min(R, layer.K - kt * R)
            column = i * self.a_stride + a_offset
            k.load_stationary(a_tile[0:rows, column:column + mrows * e], dtype=layer.dtype)
            offset = base + i * self.b_stride
            for bank, (c0, n) in zip(group, self._chunks(step.width), strict=False):
                k.matmul(bank[:, 0:n], tile[0:rows, offset + c0 * e:offset + (c0 + n) * e],
                         accumulate=not (step.first and i == 0))

    def _epilogue(self, step):
        k, layer = self.k, step.layer
        group = self.psum[self.group_count % self.groups]
        self.group_count += 1
        size = layer.out_size
        m0 = step.mt * self.P
        mrows = min(self.P, layer.M - m0)
        bias = None if layer.bias is None else layer.bias[:, 4 * step.mt:4 * step.mt + 4]
        if isinstance(layer.dest, Tensor):
            stage = self.staging[self.stage_count % 2]
            self.stage_count += 1
            dst, offset = stage, 0
        else:
            dst = layer.dest[step.block % len(layer.dest)]
            offset = step.mt * self.b_stride       # hidden tile mt is K tile mt of layer 2
        for bank, (c0, n) in zip(group, self._chunks(step.width), strict=False):
            k.activation(dst[:, offset + c0 * size:offset + (c0 + n) * size], bank[:, 0:n],
                         function=layer.function, bias=bias, out=layer.out, **layer.scaling)
        if isinstance(layer.dest, Tensor):
            k.dma(layer.dest[m0:m0 + mrows, step.n0:step.n0 + step.width],
                  stage[0:mrows, 0:step.width * size])

    def load_bias(self, tensor):
        """A tile with ``tensor[mt * P + p, 0]`` (int32 or FP32) at byte ``4 * mt`` of partition
        ``p``: one descriptor for the full M tiles, one for a partial last one."""
        k, P = self.k, self.P
        M = tensor.shape[0]
        tiles = -(-M // P)
        tile = k.sbuf(self.cfg.sbuf_partitions, 4 * tiles)
        full = M // P
        if full:
            k.dma_pattern(Pattern(tile, stride2=4, pstep1=1),
                          Pattern(tensor, stride1=4, stride2=4 * P),
                          n0=1, n1=P, n2=full, elem_bytes=4)
        if M - full * P:
            k.dma_pattern(Pattern(tile, offset=4 * full, pstep1=1),
                          Pattern(tensor, offset=4 * full * P, stride1=4),
                          n0=1, n1=M - full * P, elem_bytes=4)
        return tile


def _bias_bytes(cfg, rows):
    align = max(4, cfg.dma_bus_bytes)
    return -(-(4 * -(-rows // cfg.pe_cols)) // align) * align


# -- the kernels ------------------------------------------------------------------------------


def _gemm(config, a_t, b, *, name, bias=None, scaling=None, relu=False, out=None):
    fmt = _input_format("a_t", a_t)
    a_t = _matrix("a_t", a_t, FORMAT_DTYPES[fmt])
    b = _matrix("b", b, FORMAT_DTYPES[fmt], rows=("K rows of a_t", a_t.shape[0]))
    floating = fmt != "int8"
    out = _out_format("out", out or ("fp32" if floating else "int32"), fmt)
    K, M = a_t.shape
    N = b.shape[1]
    k = Kernel(config, name=name)
    A, B = k.input("a_t", a_t), k.input("b", b)
    bias_tensor = None
    if bias is not None:
        bias = _vector("bias", bias, M, np.float32 if floating else np.int32)
        bias_tensor = k.input("bias", bias.reshape(M, 1))
    out_name = "c" if bias is None else "y"
    C = k.output(out_name, (M, N), FORMAT_DTYPES[out])
    size = numerics.data_format(out).bytes
    kt_rows = config.pe_rows
    sched = _Schedule(k, columns=N, k_tiles=-(-K // kt_rows), m_tiles=-(-M // config.pe_cols),
                      moving_from_hbm=True,
                      staging_out=size, resident_tiles=0,
                      fixed_bytes=_bias_bytes(config, M) if bias is not None else 0,
                      element=numerics.data_format(fmt).bytes)
    bias_tile = sched.load_bias(bias_tensor) if bias is not None else None
    if scaling is None:
        scaling = {"scale": 1.0} if floating else {"multiplier": 1, "shift": 0}
    layer = _Layer(a=A, K=K, M=M, kt_rows=kt_rows, moving=B, resident=None,
                   function="relu" if relu else "identity", scaling=scaling, out=out,
                   bias=bias_tile, dest=C, P=sched.P, dtype=fmt)
    sched.run(step for block in range(len(sched.blocks)) for step in sched.steps(layer, block))
    if floating:
        acc = reference_matmul_float(a_t, b, kt_rows=kt_rows)
        expected = reference_activation_float(acc, bias=bias, relu=relu, out=out, **scaling)
    else:
        acc = reference_matmul(config, a_t, b)
        expected = (acc.astype(np.int32) if bias is None else
                    reference_activation(acc, bias=bias, relu=relu, out=out,
                                         **scaling).astype(C.dtype))
    return k.build(), {out_name: expected}


def gemm(config: Config, a_t, b, *, name: str = "gemm") -> tuple[Program, dict]:
    """``C[M, N] = A @ B`` from ``a_t = A.T`` ``[K, M]`` and ``b`` ``[K, N]``, both of one
    format (int8, bf16, fp8e4m3 or fp8e5m2, the arrays' dtype); any ``M, K, N >= 1``.
    ``C`` is int32 (the PSUM accumulators, ``acc_bits`` wrap-around) or float32 (FP32
    accumulation, docs/numerics.md). Results leave the PSUM through an identity
    ``ACTIVATE`` (int32 out: multiplier 1, shift 0; float: ``x * 1.0 + 0.0``, exact except
    that it makes -0 +0) into an SBUF staging tile, then one DMA per M tile and column
    block. Returns ``(program, {"c": expected})``."""
    return _gemm(config, a_t, b, name=name)


def gemm_bias_relu(config: Config, a_t, b, bias, *, multiplier: int | None = None,
                   shift: int | None = None, scale: float | None = None, out: str | None = None,
                   name: str = "gemm_bias_relu") -> tuple[Program, dict]:
    """GEMM + bias + relu with exactly one ``ACTIVATE`` per PSUM bank, ``C = A @ B`` as
    :func:`gemm`:

    * int8 inputs: ``y[m, n] = sat8(relu(round_half_even((C[m, n] * multiplier + bias[m])
      / 2**shift)))``, ``bias`` int32 ``[M]``, ``multiplier`` and ``shift`` required;
    * float inputs: ``y[m, n] = cast(relu(C[m, n] * scale + bias[m]))`` in FP32, ``bias``
      float32 ``[M]``, ``scale`` (default 1.0), ``out`` the input format (default) or
      ``"fp32"``.

    Returns ``(program, {"y": expected})``."""
    fmt = _input_format("a_t", a_t)
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
        out = _out_format("out", out or fmt, fmt)
    return _gemm(config, a_t, b, name=name, bias=bias, scaling=scaling, relu=True, out=out)


def mlp(config: Config, x_t, w1, b1, w2, b2, *, requant=None, scales=None,
        out: str | None = None, name: str = "mlp") -> tuple[Program, dict]:
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
    ``(program, {"out_t": expected})``."""
    fmt = _input_format("x_t", x_t)
    dtype = FORMAT_DTYPES[fmt]
    floating = fmt != "int8"
    x_t = _matrix("x_t", x_t, dtype)
    w1 = _matrix("w1", w1, dtype, rows=("d_in rows of x_t", x_t.shape[0]))
    w2 = _matrix("w2", w2, dtype, rows=("hidden columns of w1", w1.shape[1]))
    d_in, batch = x_t.shape
    hidden, d_out = w1.shape[1], w2.shape[1]
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
        out = _out_format("out", out or fmt, fmt)
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
    if P > cfg.pe_rows:
        raise KernelError(f"pe_cols={P}: must be at most pe_rows={cfg.pe_rows} (a hidden tile "
                          "of pe_cols rows is one K tile of layer 2)")
    k = Kernel(cfg, name=name)
    X, W1, W2 = k.input("x_t", x_t), k.input("w1", w1), k.input("w2", w2)
    B1, B2 = k.input("b1", b1.reshape(hidden, 1)), k.input("b2", b2.reshape(d_out, 1))
    size = numerics.data_format(out).bytes
    OUT = k.output("out_t", (d_out, batch), FORMAT_DTYPES[out])
    hidden_tiles = -(-hidden // P)
    element = numerics.data_format(fmt).bytes
    sched = _Schedule(k, columns=batch,
                      k_tiles=max(-(-d_in // cfg.pe_rows), hidden_tiles),
                      m_tiles=max(hidden_tiles, -(-d_out // P)),
                      moving_from_hbm=True, staging_out=size, resident_tiles=hidden_tiles,
                      fixed_bytes=_bias_bytes(cfg, hidden) + _bias_bytes(cfg, d_out),
                      element=element)
    bias1, bias2 = sched.load_bias(B1), sched.load_bias(B2)
    h_tiles = [k.sbuf(cfg.sbuf_partitions, hidden_tiles * sched.b_stride) for _ in range(2)]
    hidden_format = fmt if floating else "int8"
    layer1 = _Layer(a=W1, K=d_in, M=hidden, kt_rows=cfg.pe_rows, moving=X, resident=None,
                    function="relu", scaling=scaling1, out=hidden_format, bias=bias1,
                    dest=h_tiles, P=P, dtype=fmt)
    layer2 = _Layer(a=W2, K=hidden, M=d_out, kt_rows=P, moving=None, resident=h_tiles,
                    function="identity", scaling=scaling2, out=out, bias=bias2,
                    dest=OUT, P=P, dtype=fmt)
    sched.run(step for block in range(len(sched.blocks))
              for layer in (layer1, layer2) for step in sched.steps(layer, block))
    if floating:
        h = reference_activation_float(reference_matmul_float(w1, x_t, kt_rows=cfg.pe_rows),
                                       bias=b1, relu=True, out=fmt, **scaling1)
        y = reference_activation_float(reference_matmul_float(w2, h, kt_rows=P), bias=b2,
                                       out=out, **scaling2)
    else:
        h = reference_activation(reference_matmul(cfg, w1, x_t), bias=b1, relu=True,
                                 out="int8", **scaling1)
        y = reference_activation(reference_matmul(cfg, w2, h), bias=b2, relu=False, out=out,
                                 **scaling2).astype(OUT.dtype)
    return k.build(), {"out_t": y}
