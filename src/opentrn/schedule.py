"""The library kernels' schedule (docs/kernels.md, "The schedule"): how a layer
``out[M, N] = a[K, M].T @ moving[K, N]`` is cut into blocks of columns, M tiles and K tiles,
which tiling (:func:`schedule_shape`, by the cost :func:`tiling_cost` estimates) and how
:class:`Schedule` emits its DMA, matmuls and epilogues through a :class:`~opentrn.kernel.Kernel`.
The kernels of :mod:`opentrn.kernels` build their programs with it, and the cycle model's
fast path (:func:`opentrn.cycle_model.gemm`) steps through the same tiling."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from opentrn import isa, numerics
from opentrn.golden import tensor_engine
from opentrn.kernel import Kernel, KernelError, Pattern, SbufTile, Tensor

__all__ = ["FETCH_SHARE", "MAX_M_BLOCK", "TIMED_GAIN", "TIMED_STEPS", "TIMED_TILINGS", "Layer",
           "Step", "Schedule", "first_fetch_k_tiles", "first_step", "gemm_first_fetch_k_tiles",
           "gemm_tiling", "gemm_tilings", "m_tile_order", "schedule_shape", "stationary_slot",
           "timed_gemm_tiling", "tiling_cost", "tilings"]

#: The most M tiles whose stationary data one DMA descriptor fetches.
MAX_M_BLOCK = 4


@dataclass
class Layer:
    """One ``out[M, N] = a[K, M].T @ moving[K, N]`` with its epilogue; ``K`` and the K tiles
    in rows (SBUF partitions), each of ``rate`` elements of K per column (``_pack``)."""
    a: Tensor                   # stationary, [K, M * rate] in HBM
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
    # MX formats: the E8M0 scales (_tile_scales) of ``a`` and ``moving`` in HBM, or for
    # resident moving data an SBUF tile of 127s (unit scales) in partitions 0..Bt-1.
    a_scales: Tensor | None = None
    moving_scales: Tensor | None = None
    resident_scales: SbufTile | None = None
    rate: int = 1               # elements of K per row and column (MACs per PE per cycle)

    @property
    def mx(self):
        return numerics.data_format(self.dtype).mx

    @property
    def scale_rows(self):
        """Rows of a K tile in the re-laid scale tensors: ``ceil(kt_rows * rate / 32)``."""
        return -(-(self.kt_rows * self.rate) // numerics.MX_BLOCK)

    @property
    def block_rows(self):
        """Rows (partitions) of one MX block: ``32 / rate``."""
        return numerics.MX_BLOCK // self.rate

    @property
    def size(self):
        """Bytes of one column of a row: ``rate`` input elements."""
        return self.rate * numerics.data_format(self.dtype).bytes

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
class Step:
    layer: Layer
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
    a_scales: tuple | None = None   # MX: (tile, byte offset of this M tile in K tile kt0)
    moving_scales: SbufTile | None = None   # MX: the slot of K tile kt0 on, or unit scales


def tiling_cost(cfg, *, columns, k_tiles, m_tiles, width, kts, element, mx,
                 moving_from_hbm, staging_out, moving_buffers=2):
    """``(cycles, bytes, dma_bound)``: a rough cost of blocks of ``width`` columns and steps
    of ``kts`` K tiles (for :func:`schedule_shape` to compare tilings): the larger of the
    tensor engine's cycles and the DMA's (HBM bytes, a start-up per descriptor and the
    instruction fetches, over the core's bandwidth; the tensor engine's including its wait
    for the first step's tiles), the HBM bytes, and whether the DMA's is the larger.

    One moving slot (``moving_buffers=1``) is refilled a K tile at a time behind the last
    M tile's matmuls: the first matmuls of the next block wait for its last K tile, or
    longer when a K tile takes the DMA longer than the matmuls that free the one after
    it."""
    # Here, not at the top: importing the cycle model package imports its fast path,
    # which imports this module.
    from opentrn.cycle_model.dma import DMA_READ_OVERHEAD, dma_bytes_per_cycle
    K, P, chunk = cfg.pe_rows, cfg.pe_cols, cfg.moving_max
    bandwidth = dma_bytes_per_cycle(cfg)
    blocks = -(-columns // width)
    block = min(width, columns)         # columns of a full block
    parts = -(-k_tiles // kts)
    refetch_moving = m_tiles if parts > 1 else 1
    # Per K tile: the stationary (and its scales) once per block, the moving block once, or
    # once per M tile when K is cut into parts. Not counted: a block's first two M tiles,
    # still in their slots from the block before when K is whole (m_tile_order); the
    # exact model and the fast path count them. Counting them here flips tilings whose
    # cost is close, onto ones the fast path estimates less well (docs/performance.md).
    scale_rows = numerics.mx_blocks(cfg) if mx else 0
    stationary = blocks * m_tiles * P * (K * element + scale_rows)
    moving = (columns * (K * element + scale_rows) * refetch_moving
              if moving_from_hbm else 0)
    hbm = k_tiles * (stationary + moving) + m_tiles * P * columns * staging_out
    with_scales = 2 if mx else 1
    moving_descriptors = (0 if not moving_from_hbm else
                          blocks * k_tiles if moving_buffers == 1 else
                          blocks * parts * refetch_moving)
    descriptors = (with_scales * (blocks * m_tiles * parts + moving_descriptors)
                   + blocks * m_tiles)
    loads = blocks * m_tiles * k_tiles
    matmuls = m_tiles * k_tiles * -(-columns // chunk) if width >= chunk else loads
    # Two instruction words per DMA descriptor, one per load and matmul.
    fetch = (loads + matmuls + 2 * descriptors) * isa.WORD_BYTES
    fresh_tile = tensor_engine.issue_interval(cfg, 1, fresh=True)
    per_k_tile = max(block, fresh_tile)
    tensor = m_tiles * k_tiles * (
        (columns // width) * max(width, fresh_tile)
        + (max(columns % width, fresh_tile) if columns % width else 0))
    # The first step waits for its tiles: all of its K tiles, stationary and moving (the
    # schedule may bring them in pieces, first_fetch_k_tiles; this rough count does not).
    tensor += kts * K * element * (P + (block if moving_from_hbm else 0)) / bandwidth
    if moving_buffers == 1 and blocks > 1:
        refill = (DMA_READ_OVERHEAD * with_scales + (
            K * block * element + scale_rows * block
            + 2 * with_scales * isa.WORD_BYTES) / bandwidth)
        tensor += (blocks - 1) * max(refill, k_tiles * (refill - per_k_tile))
    dma = (hbm + fetch) / bandwidth + descriptors * DMA_READ_OVERHEAD
    return max(tensor, dma), hbm, dma >= tensor


def first_fetch_k_tiles(cfg, *, kts, rows, columns, element, scale_rows=0, groups=1,
                        width, chunks, then=(0, ())):
    """K tiles per descriptor of the first step's prefetch (:meth:`Schedule.run`): the
    step's ``kts`` K tiles come in pieces, each piece's stationary tiles then its moving
    block, so that its matmuls start when the first piece is in rather than all of them.
    Each piece costs its descriptors' start-up and instruction fetches: the size whose
    first step is done soonest by a rough count, the largest such. A K tile: the DMA's
    words of ``rows`` rows of each fetched operand's ``columns``, ``element`` bytes a
    column, and ``scale_rows`` rows of their MX scales, a byte a column; the tensor
    engine's cycles of ``width`` columns in ``chunks`` matmuls. Done: its matmuls, and the
    DMA stream through the next step's prefetch (``then``: its K tiles and its operands'
    columns), which the stream runs next; each piece after the first counted again for the
    delay its start-up adds to the stream."""
    from opentrn.cycle_model.dma import DMA_READ_OVERHEAD, dma_bytes_per_cycle
    W = cfg.dma_bus_bytes
    word_cycles = W / dma_bytes_per_cycle(cfg)
    # A K tile: a load and its matmuls, each at least the sequencer's cycles to issue it.
    issue = isa.WORD_BYTES // min(W, isa.WORD_BYTES) + 2
    per_tile = max(width, tensor_engine.issue_interval(cfg, 1, fresh=True),
                   (1 + chunks) * issue)

    def fetch(k_tiles, columns):
        """DMA cycles of ``k_tiles`` K tiles of operands of ``columns``: each descriptor its
        start-up and its two instruction words over the read channel, and the words."""
        descriptors = len(columns) * (2 if scale_rows else 1)
        return word_cycles * (k_tiles * sum(rows * -(-(c * element) // W)
                                            + (scale_rows * -(-c // W) if scale_rows else 0)
                                            for c in columns)
                              + 2 * descriptors * isa.WORD_BYTES / W) \
            + descriptors * DMA_READ_OVERHEAD

    start_up = fetch(0, columns)
    tile_cycles = fetch(1, columns) - start_up
    following = fetch(*then) if then[1] else 0.0
    # While the matmuls run, their instruction fetches share the DMA's read channel.
    fetching = (1 + chunks) * (isa.WORD_BYTES // min(W, isa.WORD_BYTES)) * word_cycles / per_tile

    def finish(size):
        pieces = [(start_up + min(size, kts - kt) * tile_cycles, min(size, kts - kt))
                  for kt in range(0, kts, size)]
        _, _, end, dma = first_step(pieces, 0.0, 0.0, per_tile, fetching, following)
        return max(end, dma) + (len(pieces) - 1) * start_up

    # A piece's MX scales start a byte range of the scale slot (Schedule._scale_rows): one
    # K tile, or a whole number of groups.
    return min((size for size in range(kts, 0, -1)
                if size in (1, kts) or size % groups == 0), key=finish)


#: The most of the read channel the tensor sequencer's instruction fetches take from the
#: DMA's reads while the matmuls run (:func:`first_step`): the channel takes turns by burst
#: and a fetch's burst is longer than most rows'. Measured against ``cycle_model.predict``
#: (docs/performance.md, "The first step in pieces"): on 335 GEMMs of tiny and small 0.5,
#: 0.6 and 1.0 leave 7, 1 and 2 outside the fast path's bounds.
FETCH_SHARE = 0.6


def first_step(pieces, lead, fill, per_tile, fetching, following=0.0):
    """The first step when its prefetch comes in ``pieces`` (each piece's DMA cycles and K
    tiles), from the DMA's start, ``lead`` cycles of the streams' refills before the first:
    the prefetch's end, the matmuls' start and end, and the end of ``following`` cycles of
    DMA after the prefetch. Each piece's matmuls (``per_tile`` cycles a K tile) run as
    soon as it is in and the ones before are done, the first after the engine's ``fill``;
    while they run, the tensor sequencer's instruction fetches (``fetching`` of each cycle,
    at most :data:`FETCH_SHARE`) share the read channel with the DMA's reads after the
    first piece."""
    from opentrn.cycle_model.dma import shared_end
    arrived, running = lead, []
    began = end = 0.0
    for index, (cycles, tiles) in enumerate(pieces):
        arrived = shared_end(arrived, cycles, running, most=FETCH_SHARE)
        begin = arrived + fill if index == 0 else max(end, arrived)
        began = begin if index == 0 else began
        end = begin + tiles * per_tile
        running.append((begin, end, fetching))
    return arrived, began, end, shared_end(arrived, following, running, most=FETCH_SHARE)


def gemm_first_fetch_k_tiles(cfg, m, k, n, dtype, tiling):
    """:func:`first_fetch_k_tiles` of the first step of ``opentrn.kernels.gemm`` (``C[m, n] =
    A[m, k] @ B[k, n]`` in ``dtype``) with ``tiling``, one of :func:`gemm_tilings`."""
    width, kts, mb, _ = tiling
    P = cfg.pe_cols
    k_rows = -(-k // cfg.macs_per_pe_cycle(dtype))
    k_tiles = -(-k_rows // cfg.pe_rows)
    m_tiles = -(-m // P)
    mx = numerics.data_format(dtype).mx
    w = min(width, n)
    # The second step (Schedule.steps): the next part of K, else the next M tile, else
    # the next block (its M tiles backwards: with one M tile, M tile 0); what it fetches.
    then = (0, ())
    if kts < k_tiles:
        then = (min(kts, k_tiles - kts), (min(mb * P, m), w))
    elif m_tiles > 1:
        then = (k_tiles, (min(mb * P, m - mb * P),) if mb == 1 else ())
    elif n > width:
        then = (k_tiles, (min(width, n - width),))
    return first_fetch_k_tiles(
        cfg, kts=min(kts, k_tiles), rows=cfg.pe_rows, columns=[min(mb * P, m), w],
        element=numerics.column_bytes(cfg, dtype),
        scale_rows=numerics.mx_blocks(cfg) if mx else 0,
        groups=scale_groups(cfg) if mx else 1, width=w, chunks=-(-w // cfg.moving_max),
        then=then)


def m_tile_order(m_tiles, block):
    """The M tiles of column block ``block`` in the order the schedule visits them:
    forwards in even blocks, backwards in odd ones (a block's first two M tiles are the
    last two of the block before, whose stationary tiles are still in the two slots)."""
    order = range(m_tiles)
    return reversed(order) if block % 2 else order


def stationary_slot(keys, key, current):
    """The stationary slot (0 or 1) for the tiles ``key``: the one that holds them, else the
    one the step before does not read (``current``: its matmuls follow this fetch in the
    program, docs/kernels.md "The schedule"). ``keys``: what each slot holds."""
    return keys.index(key) if key in keys else 1 - current


def scale_groups(cfg):
    """K tiles whose MX scales share one byte range of a scale slot: one per group of
    ``mx_blocks`` partitions (``numerics.mx_scale_groups``), K tile ``i`` of a slot in group
    ``i % G`` at byte column ``i // G`` (``scale_partition``, docs/isa.md)."""
    return numerics.mx_scale_groups(cfg)


def _groups(cfg, mx, groups):
    """A tiling's scale groups: ``groups``, by default :func:`scale_groups` (1 without MX)."""
    if not mx:
        return 1
    return scale_groups(cfg) if groups is None else groups


def schedule_shape(cfg, *, columns, k_tiles, m_tiles, moving_from_hbm, staging_out,
                   fixed_bytes, resident_tiles, element=1, mx=False, groups=None):
    """The library kernels' tiling (docs/kernels.md, "The schedule"): ``(width, kts, m_block,
    moving_buffers)``, the columns of a block, the K tiles of a step, the M tiles per
    stationary descriptor and the moving slots (2, or 1 refilled a K tile at a time), the
    cheapest by :func:`tiling_cost` that fit the SBUF (the arguments are
    :class:`Schedule`'s): the first of :func:`tilings`. The library GEMM times the first
    few with the cycle model's fast path (:func:`gemm_tiling`)."""
    return tilings(cfg, columns=columns, k_tiles=k_tiles, m_tiles=m_tiles,
                   moving_from_hbm=moving_from_hbm, staging_out=staging_out,
                   fixed_bytes=fixed_bytes, resident_tiles=resident_tiles, element=element,
                   mx=mx, groups=groups)[0]


def tilings(cfg, *, columns, k_tiles, m_tiles, moving_from_hbm, staging_out, fixed_bytes,
            resident_tiles, element=1, mx=False, groups=None):
    """Every tiling :func:`schedule_shape` costs, each once, in the order of its choice:
    those within 2% of the fewest estimated cycles first (about the estimate's precision),
    by bytes, then the widest, with two slots rather than one; then the others, likewise."""
    P, chunk = cfg.pe_cols, cfg.moving_max
    banks_per_group = max(1, cfg.psum_banks // 2)
    align = max(4, cfg.dma_bus_bytes)
    groups = _groups(cfg, mx, groups)

    def al(x):
        return -(-x // align) * align

    budget = cfg.sbuf_bytes_per_partition

    def need(kts, w, mb=1, buffers=2):
        e = element
        columns_of = -(-kts // groups)           # byte columns of kts K tiles' scales
        scales = (2 * al(columns_of * mb * P)
                  + (buffers * al(columns_of * w) if moving_from_hbm else 0) if mx else 0)
        return (2 * al(kts * mb * P * e)
                + (buffers * al(kts * w * e) if moving_from_hbm else 0)
                + (2 * al(w * staging_out) if staging_out else 0)
                + (2 * al(resident_tiles * w * e) if resident_tiles else 0) + fixed_bytes
                + scales)

    def fitting_kts(w):
        """The most K tiles per step that fit with blocks of ``w`` columns (0: none)."""
        kts = k_tiles
        while kts > 1 and need(kts, w) > budget:
            kts = max(1, min(kts - 1, kts * budget // max(1, need(kts, w))))
        return kts if need(kts, w) <= budget else 0

    # Every block width from the PSUM group's columns down, halving, and the multiples of
    # a matmul's columns in between, with the most K tiles that fit, is costed
    # (tiling_cost). Narrower blocks refetch the stationary data once more per block;
    # cutting K into parts refetches the moving block once more per M tile, which costs
    # far more when there are many M tiles. A block whose K tiles fit once but not twice
    # may keep one moving slot, refilled a K tile at a time behind the last M tile's
    # matmuls.
    candidates = []             # (cycles, bytes, dma_bound, buffers, width, kts)
    w = min(columns, banks_per_group * chunk)

    def consider(w, kts, buffers):
        cost = tiling_cost(cfg, columns=columns, k_tiles=k_tiles, m_tiles=m_tiles,
                            width=w, kts=kts, element=element, mx=mx,
                            moving_from_hbm=moving_from_hbm, staging_out=staging_out,
                            moving_buffers=buffers)
        candidates.append((*cost, buffers, w, kts))

    widths = [w]
    while widths[-1] > 1:
        widths.append(max(1, widths[-1] // 2))
    # A group of 4 banks also takes blocks of 3 matmuls (BF16 8192^3 on trn3: 1536
    # columns of 64 K tiles fit where 2048 do not).
    widths += [c * chunk for c in range(3, banks_per_group) if c * chunk < w
               and c * chunk not in widths]

    def cost_widths(widths):
        for w in widths:
            kts = fitting_kts(w)
            if kts:
                consider(w, kts, 2)
            if moving_from_hbm and kts < k_tiles and need(k_tiles, w, buffers=1) <= budget:
                consider(w, k_tiles, 1)

    def ordered():
        """The candidates within 2% of the fewest cycles (about the estimate's precision)
        first; by bytes, then the widest, with two slots rather than one."""
        fastest = min(c[0] for c in candidates)
        return sorted(candidates, key=lambda c: (c[0] > 1.02 * fastest, c[1], -c[4], -c[3]))

    cost_widths(widths)
    if not candidates:
        raise KernelError(
            f"sbuf_bytes_per_partition={budget}: too small for this kernel even with "
            f"one column per block and one K tile per step (needs "
            f"{need(1, 1)} bytes per partition)")
    # Then, for fewer blocks than that choice, the narrowest width that makes each count
    # (a multiple of a stationary tile's columns and of a bus word), where fewer blocks
    # fetch the stationary data fewer times (more than two M tiles: a block keeps only
    # the two it starts with, m_tile_order) or the chosen blocks are uneven (a narrow last
    # block takes about as long as a full one: a stationary load per K tile, each at
    # least a fresh tile's interval). BF16 8192^3 on trn3: 1,536 columns make 6 blocks,
    # 1,664 (all 64 K tiles in one slot still fit) make 5; tiny int8 16x224x36: blocks of
    # 24 and 12 columns where the halvings give 16, 16 and 4.
    unit = math.lcm(P, align // math.gcd(align, element))
    chosen = ordered()[0][4]
    balanced = set()
    if m_tiles > 2 or columns % chosen:
        for count in range(-(-columns // w), -(-columns // chosen)):
            per_block = -(-columns // count)
            balanced.add(min(w, -(-per_block // unit) * unit))
    cost_widths(sorted(balanced - set(widths), reverse=True))

    def m_block(width, kts, buffers, dma_bound):
        """Stationary tiles of several M tiles per descriptor, when K is not cut into parts
        (else each part's tiles are needed at another step): as many as fill a bus word
        when one M tile's row is narrower (rows of whole words, none half empty); up to
        MAX_M_BLOCK when the DMA is the bottleneck (fewer descriptors, each with its
        start-up). No more where the tensor engine is: a larger fetch lands in one step's
        shadow and holds it up."""
        mb = 1
        fill = MAX_M_BLOCK if dma_bound else -(-cfg.dma_bus_bytes // (P * element))
        if kts >= k_tiles:
            while mb < min(m_tiles, MAX_M_BLOCK, fill) and need(kts, width, mb + 1,
                                                               buffers) <= budget:
                mb += 1
        return mb

    result = []
    for _, _, dma_bound, buffers, width, kts in ordered():
        tiling = (width, kts, m_block(width, kts, buffers, dma_bound), buffers)
        if tiling not in result:
            result.append(tiling)
    return result


#: The most schedule steps (blocks x M tiles x parts of K) of a tiling that
#: :func:`gemm_tiling` times with the fast path (10 to 20 us a step).
TIMED_STEPS = 10_000
#: How many of :func:`tilings` (the first, in the estimate's order) :func:`gemm_tiling` times:
#: on 2,760 random GEMMs of tiny, small and trn3 its choice was among the first 4.
TIMED_TILINGS = 4
#: How much faster by the fast path another tiling must be for :func:`gemm_tiling` to take
#: it over the estimate's choice: beyond the fast path's own error on the tilings it picks.
TIMED_GAIN = 0.05


def gemm_tiling(cfg, m, k, n, dtype):
    """:func:`timed_gemm_tiling`'s tiling."""
    return timed_gemm_tiling(cfg, m, k, n, dtype)[0]


def gemm_tilings(cfg, m, k, n, dtype):
    """:func:`tilings` of ``opentrn.kernels.gemm`` (``C[m, n] = A[m, k] @ B[k, n]`` in
    ``dtype``, results in int32 or FP32, HBM to HBM)."""
    k_rows = -(-k // cfg.macs_per_pe_cycle(dtype))
    return tilings(
        cfg, columns=n, k_tiles=-(-k_rows // cfg.pe_rows), m_tiles=-(-m // cfg.pe_cols),
        moving_from_hbm=True, staging_out=4, fixed_bytes=0, resident_tiles=0,
        element=numerics.column_bytes(cfg, dtype), mx=numerics.data_format(dtype).mx)


@functools.lru_cache(maxsize=1 << 12)
def timed_gemm_tiling(cfg, m, k, n, dtype):
    """The tiling of ``opentrn.kernels.gemm``: ``(width, kts, m_block, moving_buffers)``.
    The first of :func:`gemm_tilings` are timed by the cycle model's fast path
    (``cycle_model.gemm``, far closer to the hardware than :func:`tiling_cost`): within 2% of
    the fewest cycles (the fast path's bound), the fewest bytes, then the estimate's order,
    if that is at least :data:`TIMED_GAIN` faster than the estimate's choice (docs/kernels.md,
    "The choice"); else the estimate's choice. Timed: the first :data:`TIMED_TILINGS` of no
    more than :data:`TIMED_STEPS` steps each (when the estimate's choice has more, it is
    taken). Also the fast path's ``Estimate`` of it (``None`` when none was timed); the
    answers are kept."""
    # Here, not at the top: the cycle model's fast path imports this module.
    from opentrn.cycle_model import gemm as fast_path
    candidates = gemm_tilings(cfg, m, k, n, dtype)
    k_tiles = -(-k // cfg.macs_per_pe_cycle(dtype) // cfg.pe_rows)
    m_tiles = -(-m // cfg.pe_cols)

    def steps(tiling):
        width, kts, _, _ = tiling
        return -(-n // width) * m_tiles * -(-k_tiles // kts)

    if len(candidates) == 1 or steps(candidates[0]) > TIMED_STEPS:
        return candidates[0], None
    timed = [(fast_path(cfg, m, k, n, dtype=dtype, tiling=tiling), order, tiling)
             for order, tiling in enumerate(candidates[:TIMED_TILINGS])
             if steps(tiling) <= TIMED_STEPS]
    fewest = min(estimate.cycles for estimate, _, _ in timed)
    best = min(timed, key=lambda t: (t[0].cycles > 1.02 * fewest, t[0].dma_bytes, t[1]))
    if best[0].cycles > (1 - TIMED_GAIN) * timed[0][0].cycles:
        best = timed[0]                 # the estimate's choice, timed first
    return best[2], best[0]


class Schedule:
    """Tiles, sizes and the emission of a list of layers over column blocks."""

    def __init__(self, kernel: Kernel, *, columns, k_tiles, m_tiles, moving_from_hbm,
                 staging_out, fixed_bytes, resident_tiles, element=1, mx=False, groups=None,
                 tiling=None):
        """``columns``: N; ``k_tiles`` / ``m_tiles``: the most K / M tiles of a layer;
        ``staging_out``: result bytes (1, 2, 4) staged for HBM, 0 if none; ``fixed_bytes``:
        per-partition bytes of other tiles; ``resident_tiles``: K tiles of moving data kept
        per block (MLP hidden), x 2; ``element``: bytes of an input column (its format's
        ``column_bytes``); ``mx``: an MX format, whose scale slots (one byte per column and
        K tile, double-buffered like the element slots) count in the SBUF budget;
        ``groups``: K tiles whose scales share a byte range (default :func:`scale_groups`,
        right when every layer's K tile has the hardware's ``mx_blocks`` blocks; else 1);
        ``tiling``: one of :func:`tilings` of these arguments (the library GEMM's
        :func:`gemm_tiling`), by default the first, :func:`schedule_shape`'s."""
        self.k = kernel
        cfg = kernel.config
        self.cfg = cfg
        self.P = cfg.pe_cols
        self.chunk = cfg.moving_max
        self.groups = 2 if cfg.psum_banks >= 2 else 1
        self.banks_per_group = max(1, cfg.psum_banks // 2)
        shapes = tilings(
            cfg, columns=columns, k_tiles=k_tiles, m_tiles=m_tiles,
            moving_from_hbm=moving_from_hbm, staging_out=staging_out, fixed_bytes=fixed_bytes,
            resident_tiles=resident_tiles, element=element, mx=mx, groups=groups)
        if tiling is not None and tuple(tiling) not in shapes:
            raise KernelError(f"tiling={tiling!r}: not one of this schedule's tilings, "
                              f"{', '.join(map(str, shapes))}")
        width, kts, mb, buffers = shapes[0] if tiling is None else tiling
        self.width, self.kts, self.m_block = width, kts, mb
        self.scale_groups = groups = _groups(cfg, mx, groups)
        # One moving slot: a new block's moving data is fetched a K tile at a time, each
        # after the last M tile's matmuls of that K tile (emitted after them, run()).
        self.rolling = buffers == 1
        self.element = element
        self.a_stride = mb * self.P * element    # bytes of one K tile in a stationary slot
        self.b_stride = width * element          # bytes of one K tile in a moving slot
        self.blocks = [(n0, min(width, columns - n0)) for n0 in range(0, columns, width)]
        k = kernel
        self.a_slots = [k.sbuf(cfg.sbuf_partitions, kts * self.a_stride) for _ in range(2)]
        self.b_slots = ([k.sbuf(cfg.sbuf_partitions, kts * self.b_stride)
                         for _ in range(buffers)] if moving_from_hbm else [])
        self.staging = ([k.sbuf(self.P, width * staging_out) for _ in range(2)]
                        if staging_out else [])
        # MX: the scales of the slots above, block b of K tile i in partition
        # (i % groups) * mx_blocks + b at byte column i // groups.
        scale_parts = numerics.mx_blocks(cfg) * groups if mx else 0
        scale_columns = -(-kts // groups)       # byte columns: groups K tiles each
        self.a_scale_slots = ([k.sbuf(scale_parts, scale_columns * mb * self.P)
                               for _ in range(2)] if mx else [])
        self.b_scale_slots = ([k.sbuf(scale_parts, scale_columns * width)
                               for _ in range(buffers)] if mx and moving_from_hbm else [])
        self.psum = [[k.psum(cfg.psum_bank_entries, bank=g * self.banks_per_group + c)
                      for c in range(self.banks_per_group)] for g in range(self.groups)]
        self.b_count = self.stage_count = self.group_count = 0
        self.b_key = None
        self.a_keys = [None, None]      # what each stationary slot holds
        self.a_current = 1              # the slot of the last step given its tiles

    def steps(self, layer, block):
        """The steps of ``layer`` in column block ``block``: its M tiles forwards in even
        blocks and backwards in odd ones, so that a block starts with the stationary tiles
        the block before ended with, still in their slots (:func:`m_tile_order`)."""
        n0, width = self.blocks[block]
        kt = layer.k_tiles
        parts = [(k0, min(kt, k0 + self.kts)) for k0 in range(0, kt, self.kts)]
        for mt in m_tile_order(layer.m_tiles, block):
            for i, (k0, k1) in enumerate(parts):
                yield Step(layer, block, n0, width, mt, k0, k1, i == 0, i == len(parts) - 1)

    # -- emission -------------------------------------------------------------------------------

    def run(self, steps):
        """Emit ``steps``, each step's loads one step ahead of its compute (the first step's
        in pieces of K tiles, :func:`first_fetch_k_tiles`; with one moving slot, a new
        block's moving data right after the compute of the step before it)."""
        steps = list(steps)
        if steps:
            self._prefetch(steps[0], k_tiles=self._first_fetch_k_tiles(
                steps[0], steps[1] if len(steps) > 1 else None))
        for i, step in enumerate(steps):
            following = steps[i + 1] if i + 1 < len(steps) else None
            refill = (following is not None and self.rolling
                      and following.layer.moving is not None
                      and self._moving_key(following) != self.b_key)
            if refill:
                self._fetch_stationary(following)
            elif following is not None:
                self._prefetch(following)
            self._compute(step)
            if refill:
                self._fetch_moving(following, per_k_tile=True)
            if step.last:
                self._epilogue(step)

    def _rows_3d(self, tensor, r0, r1, c0, cols, tile, kt_bytes, R, at=0, partition=0):
        """DMA ``tensor[r0:r1, c0:c0+cols]`` into ``tile``: row ``r`` to partition
        ``partition + (r - r0) % R``, bytes ``at + ((r - r0) // R) * kt_bytes`` on: one
        descriptor for the full K tiles, one for a partial last one."""
        full = (r1 - r0) // R
        rb, e = tensor.row_bytes, tensor.itemsize
        if full:
            self.k.dma_pattern(Pattern(tile, offset=at, stride2=kt_bytes, pstep1=1,
                                       partition=partition),
                               Pattern(tensor, offset=r0 * rb + c0 * e, stride1=rb,
                                       stride2=R * rb),
                               n0=cols, n1=R, n2=full, elem_bytes=e)
        rest = (r1 - r0) - full * R
        if rest:
            self.k.dma_pattern(Pattern(tile, offset=at + full * kt_bytes, pstep1=1,
                                       partition=partition),
                               Pattern(tensor, offset=(r0 + full * R) * rb + c0 * e,
                                       stride1=rb),
                               n0=cols, n1=rest, elem_bytes=e)

    def _scale_rows(self, tensor, kt0, kt1, first, c0, cols, tile, column_bytes, Bt):
        """DMA the scales of K tiles ``kt0 .. kt1 - 1`` (rows ``kt * Bt ..`` of ``tensor``,
        columns ``c0 ..``), the first being K tile ``first`` of ``tile``: K tile ``i``'s
        block ``b`` to partition ``(i % groups) * Bt + b`` at byte column ``i // groups``
        (``column_bytes`` each). With one group, each K tile in its own byte column of
        partitions ``0 .. Bt - 1``."""
        G = self.scale_groups
        # One run of partitions from (first % G) * Bt: from a group's start, or one K tile.
        assert first % G == 0 or kt1 - kt0 == 1, (first, kt0, kt1)
        self._rows_3d(tensor, kt0 * Bt, kt1 * Bt, c0, cols, tile, column_bytes, Bt * G,
                      at=(first // G) * column_bytes, partition=(first % G) * Bt)

    def _first_fetch_k_tiles(self, step, following):
        """:func:`first_fetch_k_tiles` of the first step, ``following`` the one after it (or
        ``None``)."""
        layer = step.layer
        mb = self.m_block

        def stationary(step):
            m0 = (step.mt // mb) * mb * self.P
            return min(mb * self.P, step.layer.M - m0)

        columns = [stationary(step)] + ([step.width] if layer.moving is not None else [])
        then = (0, ())
        if following is not None:
            fetched = []
            if (id(following.layer), following.mt // mb, following.kt0) != (
                    id(layer), step.mt // mb, step.kt0):
                fetched.append(stationary(following))
            if (following.layer.moving is not None
                    and self._moving_key(following) != self._moving_key(step)):
                fetched.append(following.width)
            then = (following.kt1 - following.kt0, tuple(fetched))
        return first_fetch_k_tiles(
            self.cfg, kts=step.kt1 - step.kt0, rows=layer.kt_rows, columns=columns,
            element=self.element, scale_rows=layer.scale_rows if layer.mx else 0,
            groups=self.scale_groups, width=step.width, chunks=len(self._chunks(step.width)),
            then=then)

    def _prefetch(self, step, k_tiles=None):
        """The tiles of ``step``: its moving block, then its stationary tiles; or, in pieces
        of ``k_tiles`` K tiles, each piece's stationary tiles then its moving block (the first
        step's, :func:`first_fetch_k_tiles`), so that its matmuls start on the first piece."""
        moving, stationary = self._moving_slot(step), self._stationary_slot(step)
        kt = step.kt1 - step.kt0
        size = min(kt, k_tiles or kt)
        if size == kt and moving is not None:
            self._fetch_moving_tiles(step, moving, step.kt0, step.kt1)
        for kt0 in range(step.kt0, step.kt1, size):
            kt1 = min(step.kt1, kt0 + size)
            if stationary is not None:
                self._fetch_stationary_tiles(step, stationary, kt0, kt1)
            if moving is not None and size < kt:
                self._fetch_moving_tiles(step, moving, kt0, kt1)

    @staticmethod
    def _moving_key(step):
        return (id(step.layer), step.block, step.kt0)

    def _fetch_moving(self, step, per_k_tile=False):
        """The moving block of ``step`` into the next moving slot, unless it is there: one
        descriptor for its K tiles, or (``per_k_tile``) one per K tile, so that each waits
        only for the matmuls that read that K tile of the slot."""
        slot = self._moving_slot(step)
        if slot is not None:
            size = 1 if per_k_tile else step.kt1 - step.kt0
            for kt0 in range(step.kt0, step.kt1, size):
                self._fetch_moving_tiles(step, slot, kt0, min(step.kt1, kt0 + size))

    def _moving_slot(self, step):
        """Give ``step`` its moving block's slot: ``(tile, scale tile)`` to fetch it into, or
        ``None`` when the slot holds it already or it is resident."""
        layer = step.layer
        if layer.moving is None:
            step.moving = (layer.resident[step.block % len(layer.resident)],
                           step.kt0 * self.b_stride)
            step.moving_scales = layer.resident_scales
            return None
        key = self._moving_key(step)
        slot = None
        if key != self.b_key:
            index = self.b_count % len(self.b_slots)
            self.b_tile = self.b_slots[index]
            self.b_scale_tile = self.b_scale_slots[index] if layer.mx else None
            self.b_count += 1
            self.b_key = key
            slot = (self.b_tile, self.b_scale_tile)
        step.moving = (self.b_tile, 0)
        if layer.mx:
            step.moving_scales = self.b_scale_tile
        return slot

    def _fetch_moving_tiles(self, step, slot, kt0, kt1):
        """K tiles ``kt0 .. kt1 - 1`` of ``step``'s moving block (and MX scales) into
        ``slot``."""
        layer = step.layer
        R = layer.kt_rows
        tile, scale_tile = slot
        self._rows_3d(layer.moving, kt0 * R, min(layer.K, kt1 * R), step.n0 * layer.rate,
                      step.width * layer.rate, tile, self.b_stride, R,
                      at=(kt0 - step.kt0) * self.b_stride)
        if layer.mx:
            self._scale_rows(layer.moving_scales, kt0, kt1, kt0 - step.kt0, step.n0,
                             step.width, scale_tile, self.width, layer.scale_rows)

    def _fetch_stationary(self, step):
        slot = self._stationary_slot(step)
        if slot is not None:
            self._fetch_stationary_tiles(step, slot, step.kt0, step.kt1)

    def _stationary_slot(self, step):
        """Give ``step`` its stationary tiles' slot: its index to fetch them into, or
        ``None`` when a slot holds them already."""
        layer = step.layer
        mb = self.m_block
        # The same tiles of A serve every block: a slot that holds them is used again.
        key = (id(layer), step.mt // mb, step.kt0)
        slot = stationary_slot(self.a_keys, key, self.a_current)
        fetch = self.a_keys[slot] != key
        self.a_keys[slot] = key
        self.a_current = slot
        step.a_slot = (self.a_slots[slot], (step.mt % mb) * self.P * self.element)
        if layer.mx:
            step.a_scales = (self.a_scale_slots[slot], (step.mt % mb) * self.P)
        return slot if fetch else None

    def _fetch_stationary_tiles(self, step, slot, kt0, kt1):
        """K tiles ``kt0 .. kt1 - 1`` of the stationary tiles of ``step``'s ``m_block`` M
        tiles (and MX scales) into stationary slot ``slot``."""
        layer = step.layer
        R = layer.kt_rows
        mb = self.m_block
        m0 = (step.mt // mb) * mb * self.P
        cols = min(mb * self.P, layer.M - m0)
        self._rows_3d(layer.a, kt0 * R, min(layer.K, kt1 * R), m0 * layer.rate,
                      cols * layer.rate, self.a_slots[slot], self.a_stride, R,
                      at=(kt0 - step.kt0) * self.a_stride)
        if layer.mx:
            self._scale_rows(layer.a_scales, kt0, kt1, kt0 - step.kt0, m0, cols,
                             self.a_scale_slots[slot], mb * self.P, layer.scale_rows)

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
            scales = moving_scales = None
            if layer.mx:
                # Blocks 0..nb-1 of this K tile, one byte per column, in its group of
                # partitions and byte column of the slots (_scale_rows).
                nb = -(-rows // layer.block_rows)
                p0 = (i % self.scale_groups) * layer.scale_rows
                s_tile, s_offset = step.a_scales
                s_column = (i // self.scale_groups) * self.m_block * self.P + s_offset
                scales = s_tile[p0:p0 + nb, s_column:s_column + mrows]
            k.load_stationary(a_tile[0:rows, column:column + mrows * e], dtype=layer.dtype,
                              scales=scales)
            offset = base + i * self.b_stride
            for bank, (c0, n) in zip(group, self._chunks(step.width), strict=False):
                if layer.mx:
                    # A slot holds K tile i's scales in its group of partitions at byte
                    # column i // groups; unit scales (resident moving data) serve every K
                    # tile and chunk from partition 0 and byte 0.
                    if layer.moving is None:
                        moving_scales = step.moving_scales[0:nb, 0:n]
                    else:
                        c = (i // self.scale_groups) * self.width + c0
                        moving_scales = step.moving_scales[p0:p0 + nb, c:c + n]
                k.matmul(bank[:, 0:n], tile[0:rows, offset + c0 * e:offset + (c0 + n) * e],
                         accumulate=not (step.first and i == 0), scales=moving_scales)

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
