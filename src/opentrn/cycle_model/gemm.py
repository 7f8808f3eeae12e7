"""The fast path: the library GEMM's schedule, step by step (no program is built)."""

import functools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from opentrn import isa, numerics, schedule
from opentrn.golden import psum, sbuf, tensor_engine
from opentrn.hdl.dma import MAX_BURST as DMA_MAX_BURST
from opentrn.hdl.dma import MAX_OUTSTANDING as DMA_MAX_OUTSTANDING
from opentrn.hdl.dma import QUEUE_DEPTH as DMA_QUEUE_DEPTH
from opentrn.hdl.sequencer import FETCH_BUFFER_BYTES
from opentrn.isa import Engine

from .activation_unit import activate_overhead
from .axi4_memory import HBM_READ_CYCLES
from .dma import DMA_READ_OVERHEAD, DMA_WRITE_OVERHEAD, dma_bytes_per_cycle, shared_end


@dataclass(frozen=True)
class Estimate:
    """The fast path's figures for one GEMM on one core (:func:`gemm`)."""
    m: int
    k: int
    n: int
    dtype: str
    cycles: int             # start to done
    tensor_busy: int        # cycles a moving vector enters the array
    dma_busy: int           # cycles the DMA executes a descriptor
    activation_busy: int    # cycles a vector enters the activation engine
    macs: int               # useful multiply-accumulates, m * k * n
    dma_bytes: int          # bytes moved between HBM and the SBUF
    steps: int              # steps of the schedule (docs/kernels.md)
    model: str = "fast path"    # where the cycles come from ("exact": predict's)


def _words(start, length, width):
    """Bus words a run of ``length`` bytes from byte ``start`` touches."""
    return (start + length - 1) // width - start // width + 1


def _rows_words(start, pitch, rows, length, width):
    """Bus words ``rows`` runs of ``length`` bytes touch, run ``r`` from byte ``start + r *
    pitch`` (a DMA side walks each row on its own: hdl/access_pattern.py). Only the starts
    modulo the bus word matter; they repeat every ``width / gcd(pitch, width)`` rows."""
    return _cached_rows_words(start % width, pitch % width, rows, length, width)


@functools.lru_cache(maxsize=1 << 14)
def _cached_rows_words(start, pitch, rows, length, width):
    period = width // math.gcd(pitch, width)
    cycle = [_words(start + r * pitch, length, width) for r in range(min(rows, period))]
    whole, rest = divmod(rows, period)
    return whole * sum(cycle) + sum(cycle[:rest])


@functools.lru_cache(maxsize=1 << 14)
def _tiles_words(src, pitch, rows, length, sink, tile_bytes, per_tile, width):
    """Bus-word cycles of a descriptor of ``rows`` runs of ``length`` bytes, run ``r`` from
    source byte ``src + r * pitch`` to sink byte ``sink + (r // per_tile) * tile_bytes``
    (starts modulo the bus word): the DMA walks both sides row by row, so each row takes
    the words of its slower side. A run touches ``least`` words or one more; a tile whose
    sink runs touch one more sets its rows' pace, else the source's runs do."""
    least = (length - 1) // width + 1
    total = 0
    for tile in range(-(-rows // per_tile)):
        count = min(per_tile, rows - tile * per_tile)
        if _words(sink + tile * tile_bytes, length, width) > least:
            total += count * (least + 1)
        else:
            total += _rows_words(src + tile * per_tile * pitch, pitch, count, length, width)
    return total


@functools.lru_cache(maxsize=1 << 12)
def _dma_step(reads, fetches, writes, tensor_reads, floor=0.0, overhead=0.0):
    """Cycles of a step's DMA work: reads for ``reads`` cycles, sharing the AXI read channel
    with ``fetches`` cycles of instruction fetches (the HBM answers bursts in order), then
    writes for ``writes`` cycles, sharing the SBUF's read port with ``tensor_reads`` words
    of the tensor unit's column readers, and ``overhead`` cycles that use neither (the
    descriptors' start-up, where :func:`gemm` counts it apart). With the others' cycles
    spread over a step of ``T`` cycles, a phase of ``x`` cycles that shares with ``y`` takes
    ``x T / (T - y)``; ``T`` is the root of ``T = overhead + reads T / (T - fetches) +
    writes T / (T - tensor_reads)`` between ``overhead + reads + writes`` and that plus
    ``fetches + tensor_reads`` (bisection to a thousandth of a cycle; the upper end when it
    is at most ``floor``, the step's other work, which then sets its length). Steps repeat:
    the answers are kept."""
    if not fetches or not reads:
        fetches = 0
    if not tensor_reads or not writes:
        tensor_reads = 0
    low = max(overhead + reads + writes, fetches, tensor_reads)
    high = overhead + reads + writes + fetches + tensor_reads
    if not (fetches or tensor_reads) or high <= floor:
        return high
    while high - low > 1e-3:
        middle = (low + high) / 2
        taken = overhead + (reads * middle / (middle - fetches) if reads else 0) \
            + (writes * middle / (middle - tensor_reads) if writes else 0)
        low, high = (middle, high) if taken > middle else (low, middle)
    return high


def _activations(chunks, per_tile, free, drain, overhead):
    """The end of each chunk's activation after a step's matmuls end (at 0), one
    activation per chunk (PSUM bank), each from ``free`` (the activation engine's) or when
    its chunk's last matmul has drained: the last K tile's time is shared among its chunks
    in proportion to their columns, so the later chunks' matmuls run meanwhile."""
    ends, end = [], free
    for c, columns in enumerate(chunks):
        later = per_tile * sum(chunks[c + 1:]) / sum(chunks)
        end = max(end, drain - later) + columns + overhead
        ends.append(end)
    return ends


def _epilogue(chunks, per_tile, drain, overhead):
    """Cycles from a step's last matmul to its last activation's end."""
    return _activations(chunks, per_tile, float("-inf"), drain, overhead)[-1]


#: The most steps :func:`gemm` models (each a few numbers: 20 to 30 s per 10**6).
MAX_GEMM_STEPS = 2_000_000


def gemm(config, m, k, n, *, dtype="int8", tiling=None):
    """The cycles of ``opentrn.kernels.gemm`` (``C[m, n] = A[m, k] @ B[k, n]``, results in
    int32 or FP32, HBM to HBM) on one core, without building the program, from the kernel's
    steps (docs/kernels.md, "The schedule"): the largest of their throughput (each step the
    largest of the tensor engine's time, the DMA's for the descriptors that overlap it and
    the read channel's beats of its instructions, plus the first prefetch and the last
    step's drain, activations and store), their latency (the engines in program order with
    the kernel's waits, an idle tensor engine starting with its fill; followed a second time
    with each store slowed by the matmuls' SBUF reads beside it, ``dma.shared_end``) and the
    AXI read channel's time (every instruction fetch and HBM read, a beat a cycle). Each DMA
    descriptor costs, row by row, the words of the row's slower side, each row counted from
    its own addresses as the DMA walks it; the DMA's reads share the read channel with the
    instruction fetches, its stores the SBUF's read port with the tensor unit
    (:func:`_dma_step`). For workloads too large for :func:`predict`; the tests bound its
    difference from :func:`predict` (docs/performance.md). ``tiling``: the kernel's
    ``(width, kts, m_block, moving_buffers)``, one of ``schedule.gemm_tilings``, by default
    ``schedule.gemm_tiling``'s (which times the first of them with this)."""
    for name, value in (("m", m), ("k", k), ("n", n)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if dtype not in config.dtypes:
        raise ValueError(f"dtype={dtype!r}: not among this configuration's formats, "
                         f"dtypes={','.join(config.dtypes)}")
    mx = numerics.data_format(dtype).mx
    # Rows (partitions) of K: a format of r MACs per PE per cycle packs r elements of K per
    # row and column (column_bytes each, docs/isa.md).
    e = numerics.column_bytes(config, dtype)
    rate = config.macs_per_pe_cycle(dtype)
    k_rows = -(-k // rate)
    K, P, chunk = config.pe_rows, config.pe_cols, config.moving_max
    # Cycles between matmuls that each take a fresh stationary tile (with any N up to it).
    fresh_tile = tensor_engine.issue_interval(config, 1, fresh=True)
    W = config.dma_bus_bytes
    V = config.vector_word_bytes                         # an engine's SBUF word
    word_cycles = W / dma_bytes_per_cycle(config)        # cycles per bus word moved
    out = 4                                              # int32 or FP32 results
    k_tiles, m_tiles = -(-k_rows // K), -(-m // P)
    if tiling is None:
        tiling, estimate = schedule.timed_gemm_tiling(config, m, k, n, dtype)
        if estimate is not None:        # the chosen tiling's, modelled while choosing it
            return estimate
    elif tuple(tiling) not in (choices := schedule.gemm_tilings(config, m, k, n, dtype)):
        raise ValueError(f"tiling={tiling!r}: not one of the kernel's tilings of this GEMM, "
                         f"{', '.join(map(str, choices))}")
    width, kts, mb, buffers = tiling
    groups = schedule.scale_groups(config) if mx else 1  # the kernel's (Schedule)
    count = -(-n // width) * m_tiles * -(-k_tiles // kts)
    if count > MAX_GEMM_STEPS:
        # Refused before anything is allocated per step (a list of them would not fit).
        raise ValueError(
            f"m={m}, k={k}, n={n}: {count:,} schedule steps on this configuration "
            f"({config.pe_rows}x{config.pe_cols}), more than the {MAX_GEMM_STEPS:,} the "
            "fast path models one by one; project a GEMM of this size on a larger "
            "configuration, or a part of it")
    parts = [(k0, min(k_tiles, k0 + kts)) for k0 in range(0, k_tiles, kts)]
    beats_per_word = isa.WORD_BYTES // min(W, isa.WORD_BYTES)
    act_overhead = activate_overhead(config)    # an ACTIVATE's cycles beyond its vectors
    issue = beats_per_word + 2          # sequencer cycles per instruction (assemble, READY)

    def rows_in(k0, k1):
        """Rows of K tiles k0 .. k1 - 1 (the last tile may be partial)."""
        return min(k_rows, k1 * K) - k0 * K

    def dma(words, read=True):
        return (DMA_READ_OVERHEAD if read else DMA_WRITE_OVERHEAD) + words * word_cycles

    scale_rows = numerics.mx_blocks(config) if mx else 0

    def rows_3d(row0, rows, per_tile, pitch, col0, length, tile_bytes, at=0):
        """Cycles of the descriptors of ``schedule.Schedule._rows_3d``: ``rows`` rows of
        ``length`` bytes from row ``row0`` and byte ``col0`` of an HBM tensor of ``pitch``
        bytes a row, row ``r`` to partition ``r % per_tile`` at byte ``at + (r // per_tile)
        * tile_bytes``: one descriptor for the full K tiles, one for a partial last one.
        Each side walks its rows word by word; the slower side of each row sets its pace
        (:func:`_tiles_words`). Also the last descriptor's cycles and the rows it carries
        (the last ones)."""
        nonlocal descriptors, read_words, first_bursts
        cost = 0.0
        last = (0.0, 0)
        full, rest = divmod(rows, per_tile)
        for count, first, tiles in ((full * per_tile, 0, full), (rest, full, 1)):
            if not count:
                continue
            start = row0 * pitch + first * per_tile * pitch + col0
            source = _rows_words(start, pitch, count, length, W)
            # Each K tile's rows (one per partition) at the same bytes of the slot.
            words = _tiles_words(start % W, pitch % W, count, length,
                                 (at + first * tile_bytes) % W, tile_bytes % W,
                                 count // tiles, W)
            last = (dma(words), rows - first * per_tile)
            if not descriptors:         # the first one's HBM reads: a burst a row or more
                first_bursts = count * -(-_words(0, length, W) // DMA_MAX_BURST)
            read_words += source
            cost += last[0]
            descriptors += 1
        return cost, last

    def tile_fetch(row0, rows, k_count, col0, cols, pitch, tile_bytes, first=0):
        """Cycles of fetching ``cols`` columns from column ``col0`` of ``rows`` rows from row
        ``row0`` (``k_count`` K tiles) of an operand of ``pitch`` columns, into a slot of
        ``tile_bytes`` columns a K tile from its K tile ``first``, and of an MX format's
        scales (``scale_rows`` rows a K tile, one byte a column, ``groups`` K tiles a byte
        column: ``Schedule._scale_rows``); counts the bytes, and keeps the last
        descriptor's cycles and the K tiles it carries (a partial one: the last K tile's
        rows or scales alone) in ``tail``."""
        nonlocal dma_bytes, tail
        cost, (cycles, rows_carried) = rows_3d(row0, rows, K, pitch * e, col0 * e, cols * e,
                                               tile_bytes * e, first * tile_bytes * e)
        dma_bytes += rows * cols * e
        tail = (cycles, -(-rows_carried // K))
        if mx:
            scales, (cycles, rows_carried) = rows_3d(
                row0 // K * scale_rows, k_count * scale_rows, scale_rows * groups, pitch,
                col0, cols, tile_bytes, (first // groups) * tile_bytes)
            cost += scales
            dma_bytes += scale_rows * k_count * cols
            tail = (cycles, -(-rows_carried // scale_rows))
        return cost

    steps = []
    for block, n0 in enumerate(range(0, n, width)):
        w = min(width, n - n0)
        chunks = [min(chunk, w - c0) for c0 in range(0, w, chunk)]
        for mt in schedule.m_tile_order(m_tiles, block):
            mrows = min(P, m - mt * P)
            for index, (k0, k1) in enumerate(parts):
                steps.append((n0, w, chunks, mt, mrows, k0, k1, index == len(parts) - 1))

    dma_bytes = descriptors = read_words = first_bursts = 0
    tail = (0.0, 0)             # tile_fetch's last descriptor: (cycles, K tiles it carries)
    dma_busy = 0.0
    tensor = []                 # tensor cycles of each step
    fetches = []                # DMA cycles of each step's prefetch
    stores = []                 # DMA cycles of each step's store (0 if none)
    acts = []                   # activation cycles of each step's epilogue
    fetch_beats = []            # cycles of the read channel the step's instructions take
    first_refill_beats = 0.0    # of the first step's, those of the second's rolling refill
    tensor_reads = []           # SBUF words the tensor unit reads in each step
    prefetch_descriptors = []   # DMA descriptors of each step's prefetch
    reads_of = {}               # the tensor reads of a step, by what they depend on
    trail = []                  # a rolling refill's last K tile, fetched after the matmuls
    new_moving = []             # whether each step fetches a moving block
    new_stationary = []         # whether each step fetches stationary tiles
    # For a step that fetches stationary tiles, the last step before it that read their
    # slot; None when there is none or the step's tiles are in a slot already.
    a_waits = []
    a_keys, a_current, a_readers = [None, None], 1, [None, None]
    # The cycles of each step's last prefetch descriptor and the K tiles it alone carries:
    # the matmuls of the others need not wait for it (the kernel waits for the descriptor
    # that wrote what an instruction reads), so with a partial last K tile they start a
    # descriptor early.
    tails = []
    # The first step's prefetch in pieces of K tiles, if it is cut: (each piece's DMA
    # cycles, its K tiles).
    pieces = []
    b_key = None
    words = [0] * len(Engine)   # instruction words of each stream (END included)
    epilogue_count, group_fetched = 0, False
    nops = []                   # whether each step's epilogue starts with a NOP
    for i, (n0, w, chunks, mt, mrows, k0, k1, last) in enumerate(steps):
        descriptors_before = descriptors
        full_rows = rows_in(k0, k1)
        cost = 0.0
        # The stationary slots as Schedule._fetch_stationary keeps them.
        a_key = (mt // mb, k0)
        a_current = schedule.stationary_slot(a_keys, a_key, a_current)
        a_new, b_new = a_keys[a_current] != a_key, (n0, k0) != b_key
        a_waits.append(a_readers[a_current] if a_new else None)
        a_keys[a_current], a_readers[a_current] = a_key, i
        new_moving.append(b_new)
        new_stationary.append(a_new)
        trail.append(0.0)
        m0 = (mt // mb) * mb * P
        size = k1 - k0
        if i == 0:
            # The first step's tiles in pieces of K tiles (Schedule.run), each piece's
            # stationary tiles then its moving block.
            size = schedule.gemm_first_fetch_k_tiles(config, m, k, n, dtype, tiling)
        cut = size < k1 - k0
        if cut:
            for kt in range(k0, k1, size):
                end = min(k1, kt + size)
                piece = tile_fetch(kt * K, rows_in(kt, end), end - kt, m0, min(mb * P, m - m0),
                                   m, mb * P, first=kt - k0)
                piece += tile_fetch(kt * K, rows_in(kt, end), end - kt, n0, w, n, width,
                                    first=kt - k0)
                pieces.append((piece, end - kt))
                cost += piece
            b_key = (n0, k0)
        elif b_new:                      # the moving block of these K tiles
            if buffers == 1 and b_key is not None:
                # One moving slot: refilled a K tile at a time behind the matmuls of the
                # step before, which wait for none of it but the last K tile's.
                for kt in range(k0, k1):
                    trail[-1] = tile_fetch(kt * K, rows_in(kt, kt + 1), 1, n0, w, n, width,
                                           first=kt - k0)
                    cost += trail[-1]
            else:
                cost += tile_fetch(k0 * K, full_rows, k1 - k0, n0, w, n, width)
            b_key = (n0, k0)
        if a_new and not cut:            # the stationary tiles of mb M tiles
            cost += tile_fetch(k0 * K, full_rows, k1 - k0, m0, min(mb * P, m - m0), m, mb * P)
        dma_busy += cost
        group_fetched = group_fetched or cost > 0
        fetches.append(cost)
        tails.append(tail if cost and not trail[-1] and not cut else (0.0, 0))
        prefetch_descriptors.append(descriptors - descriptors_before)
        per_tile = max(sum(chunks), fresh_tile, (1 + len(chunks)) * issue)
        tensor.append((k1 - k0) * per_tile)
        # The SBUF words the tensor unit's column readers read: each K tile's stationary
        # columns and moving chunks (and an MX format's scales, a byte a column).
        # K tile i's stationary columns at (i * mb + mt % mb) * P, its chunk at i * width +
        # c0 (columns of its slots).
        key = (mt % mb, mrows, k1 - k0, w)
        if key not in reads_of:
            reads = 0
            for size in ((e, 1) if mx else (e,)):
                reads += _rows_words(mt % mb * P * size, mb * P * size, k1 - k0,
                                     mrows * size, V)
                reads += sum(_rows_words(c0 * size, width * size, k1 - k0, columns * size, V)
                             for c0, columns in zip(range(0, w, chunk), chunks, strict=True))
            reads_of[key] = reads
        tensor_reads.append(reads_of[key])
        if last:
            # From the staging tile (rows from byte 0) to rows of n results in HBM.
            row0 = (mt * P * n + n0) * out
            store = dma(max(mrows * _words(0, w * out, W),
                            _rows_words(row0, n * out, mrows, w * out, W)), read=False)
            descriptors += 1
            stores.append(store)
            dma_busy += store
            dma_bytes += mrows * w * out
            acts.append(sum(chunks) + len(chunks) * act_overhead)
            # The first activation waits for its chunk's matmul and for the store two
            # epilogues back (its staging tile): the kernel builder puts the second wait in
            # a NOP, unless a matmul of the step waited for a prefetch that the DMA stream
            # runs after that store, which implies it.
            nop = epilogue_count >= 2 and not group_fetched
            epilogue_count, group_fetched = epilogue_count + 1, False
        else:
            nop = False
            stores.append(0)
            acts.append(0)
        nops.append(nop)
        # The streams' instruction fetches share the AXI read channel with the DMA's reads:
        # this step's loads, matmuls and activations, and its DMA instructions (two words
        # a descriptor).
        step_words = (2 * (descriptors - descriptors_before), (k1 - k0) * (1 + len(chunks)),
                      (len(chunks) if last else 0) + nop)
        words = [a + b for a, b in zip(words, step_words, strict=True)]
        fetch_beats.append(sum(step_words) * beats_per_word * word_cycles)
        if trail[-1]:
            # A rolling refill runs behind the step before, and so do the fetches of its
            # descriptors: they share that step's read channel, not their own step's.
            moved = 2 * (descriptors - descriptors_before) * beats_per_word * word_cycles
            fetch_beats[-1] -= moved
            fetch_beats[-2] += moved
            if i == 1:
                first_refill_beats = moved

    count = len(steps)
    # At start each sequencer fetches two bursts ahead, and the HBM answers in order: the
    # first descriptor (its instruction in the first burst) has its reads answered after
    # those bursts, its queueing and the HBM's latency spent meanwhile (the address cycles
    # of DMA_READ_OVERHEAD).
    burst_beats = FETCH_BUFFER_BYTES // W // 2
    start = 2 * len(Engine) * burst_beats * word_cycles
    drain = tensor_engine.latency(config) + psum.write_cycles(config)   # into the PSUM
    # From the semaphore of its tiles' descriptor to an idle tensor engine's first vector:
    # with new stationary tiles the load's handover, then the matmul's (an instruction
    # later) and its first word from the SBUF, or the load's columns into the array; with
    # only a new moving block the matmul's handover and first word.
    reading = sbuf.read_latency(config)
    fills = (2 + reading,
             max(1 + issue + 2 + reading, 3 + reading + tensor_engine.load_cycles(config)))

    def fill(i, per_tile):
        """The part of the fill of step ``i`` (``per_tile`` cycles a K tile) that its
        per-tile time does not already hold."""
        return max(0.0, fills[new_stationary[i]] - (per_tile - sum(steps[i][2])))

    # Throughput: step i computes while the DMA fetches step i + 1 and stores step i - 1
    # (the DMA engine's time; its reads share the read channel with the instruction
    # fetches, its stores go out on the write channel), and the activation engine drains
    # step i - 1.
    # The first prefetch shares the read channel with the DMA stream's own fetches, a burst
    # each time the DMA sequencer has taken half a buffer of instructions. Before the first
    # data comes back it takes those of its first bursts: the first prefetch's descriptors
    # and the next one's, as many as the DMA engine runs and queues, and the one after them
    # (which then waits). Their refills go out behind the first descriptor's reads in
    # flight (DMA_MAX_OUTSTANDING bursts): within it if it has more, or if its reads (a
    # cycle apart, from four cycles after its hand-over) still go out when the first
    # refill's does (after the second descriptor's hand-over, its words one beat a cycle);
    # else between it and the second descriptor, whose overhead they hide. Later refills
    # (as the instructions they bring are taken) fall between later descriptors of it.
    half = FETCH_BUFFER_BYTES // 2
    queued = min(prefetch_descriptors[1] if count > 1 else 0, DMA_QUEUE_DEPTH)
    early = min(2 * (min(prefetch_descriptors[0] + queued, 1 + DMA_QUEUE_DEPTH) + 1)
                * isa.WORD_BYTES, FETCH_BUFFER_BYTES) // half
    later = min(2 * (prefetch_descriptors[0] + queued + 1) * isa.WORD_BYTES // half - early,
                max(0, prefetch_descriptors[0] - 2))
    burst = burst_beats * word_cycles
    within = (first_bursts > DMA_MAX_OUTSTANDING
              or 2 * beats_per_word * word_cycles <= first_bursts)
    if within or prefetch_descriptors[0] > 1:
        fetch_beats[0] = max(0.0, fetch_beats[0] - (early + later) * burst)
        first = early * burst + later * max(0.0, burst - DMA_READ_OVERHEAD)
        if not within:
            first = max(0.0, first - DMA_READ_OVERHEAD)
    else:
        first = 0.0         # after the first prefetch's reads: the step's to share
    # The DMA's cycles from its start to the end of the first prefetch, and (in pieces) the
    # first step's matmuls' start and end from there.
    lead_in = fetches[0] + first
    if pieces:
        per_tile = tensor[0] / (steps[0][6] - steps[0][5])
        # While they run, the tensor sequencer's instruction fetches share the read channel
        # with the later pieces' reads.
        fetching = (1 + len(steps[0][2])) * beats_per_word * word_cycles / per_tile
        lead_in, first_began, first_end, _ = schedule.first_step(
            pieces, first, fill(0, per_tile), per_tile, fetching)
        # Those of the matmuls after the prefetch's end are what share the next one's reads
        # (and a rolling refill's own, all after it).
        fetch_beats[0] = first_refill_beats + (fetch_beats[0] - first_refill_beats) * min(
            1.0, (first_end - lead_in) / tensor[0])
    throughput = start + lead_in
    behind = 0.0        # a rolling refill's DMA cycles past the step it starts in
    channel_pair = 0.0  # the read channel's cycles of a refill's step and the next
    idle = 0.0
    lengths = []        # each step's cycles
    for i in range(count):
        ahead = fetches[i + 1] if i + 1 < count else 0
        act_side = acts[i - 1] if i else 0
        own = tensor[i]
        k_count = steps[i][6] - steps[i][5]
        if i == 0 and pieces:
            own = first_end - lead_in       # past the prefetch's end
        elif (i == 0 or idle) and fetches[i] and not trail[i] and tails[i][1] < k_count:
            # The K tiles the prefetch's last descriptor does not carry go in while it runs:
            # the first step's from the start (the engine idle until the first of them is
            # in: it starts with the fill), a later step's as far as the tensor engine waits
            # for the step before's DMA.
            per_tile = tensor[i] / k_count
            overlap = tails[i][0] - fill(i, per_tile) if i == 0 else min(tails[i][0], idle)
            own = max(tensor[i] - overlap, tails[i][1] * per_tile)
        compute = max(own + (trail[i + 1] if i + 1 < count else 0), act_side)
        refill = i + 1 < count and trail[i + 1]
        store = stores[i - 1] if i else 0
        if refill or behind:
            # A refill's descriptors carry a K tile each: their start-up is a large part of
            # them and leaves the read channel to the instruction fetches. What it has not
            # done by the step's end shares the next step's channel in turn, as reads.
            overhead = DMA_READ_OVERHEAD * prefetch_descriptors[i + 1] if ahead else 0.0
            reads = ahead - overhead + behind
            dma_side = _dma_step(reads, fetch_beats[i], store, tensor_reads[i],
                                 floor=compute, overhead=overhead)
        else:
            dma_side = _dma_step(ahead, fetch_beats[i], store, tensor_reads[i],
                                 floor=compute)
        if refill:
            # Each K tile of the refill waits only for this step's matmuls that read it,
            # and the next step's matmuls only for theirs: the rest of it overlaps them.
            behind = (reads + overhead) * max(0.0, dma_side - compute) / dma_side
            lengths.append(compute)
        else:
            behind = 0.0
            # The read channel carries the step's instructions whether the DMA reads or
            # not (from the second step: the first step's come with the start-up fetches);
            # after a refill's step, what the two steps' fetches and the refill's reads
            # leave of the channel's time when the refill's step ends.
            lengths.append(max(compute, dma_side, fetch_beats[i] if i else 0.0,
                               channel_pair - lengths[-1] if channel_pair else 0.0))
        # A refill that fills the read channel slows the instruction fetches of its step
        # and the next one: together they take at least the channel's time.
        channel_pair = (fetch_beats[i] + fetch_beats[i + 1] + ahead - overhead
                        if refill else 0.0)
        idle = lengths[-1] - compute        # the tensor engine's wait at the step's end
        throughput += lengths[-1]
    # After the last matmul: its drain, the last activations and the last store.
    finish = _epilogue(steps[-1][2], tensor[-1] / (steps[-1][6] - steps[-1][5]), drain,
                       act_overhead) + stores[-1]
    throughput += finish

    # Latency: the engines in program order with the waits the kernel places (docs/kernels.md,
    # "The schedule"). The DMA stream prefetches step i + 1, then stores step i; a prefetch
    # waits for the matmuls of the step that last read its slot; a step's matmuls wait for
    # their tiles and, opening a PSUM group, each for the activation that last read its bank
    # (two epilogues back); an activation (one per chunk, that is per PSUM bank) waits for
    # its chunk's last matmul to drain and for the store two epilogues back (its staging
    # tile). Short steps with an epilogue each are bound by this chain, not by throughput.
    # The chain is followed twice: once with each prefetch's reads sharing the read channel
    # with its step's instruction fetches (spread over the step) and each store at its own
    # cycles; once with each store's SBUF reads losing the read port to the tensor engine's
    # while it runs, and each prefetch at its own cycles. Each leaves out a slowdown the
    # other counts, so the end is at least the later of the two.
    def latency(conflicts):
        tensor_end = [0.0] * count
        fetched = [0.0] * count
        started = [0.0] * count     # when each step's prefetch starts
        moving_users = []           # the steps that fetched a moving block, in order
        epilogues = []              # (each chunk's activation end, store end)
        reading = deque(maxlen=2)   # with conflicts, the last two steps' matmuls: (start,
                                    # end, SBUF reads a cycle)
        dma_free = start

        def prefetch(i, after=0.0, cycles=None):
            nonlocal dma_free
            ready = max(dma_free, after)
            if a_waits[i] is not None:
                ready = max(ready, tensor_end[a_waits[i]])
            if new_moving[i]:
                if len(moving_users) >= 2:
                    ready = max(ready, tensor_end[moving_users[-2]])
                moving_users.append(i)
            started[i] = ready
            dma_free = fetched[i] = ready + (fetches[i] if cycles is None else cycles)

        def store(j, begin, i):
            """Step ``j``'s store, from ``begin``, once step ``i`` (after it) has run: with
            ``conflicts``, slowed by the matmuls of step ``i`` and, past their end, of step
            ``i + 1`` if its tiles need no prefetch (the engine goes straight on; a prefetch
            would follow the store in the DMA stream)."""
            nonlocal dma_free
            if conflicts:
                runs = list(reading)
                if i + 1 < count and not fetches[i + 1]:
                    runs.append((reading[-1][1], reading[-1][1] + tensor[i + 1],
                                 tensor_reads[i + 1] / tensor[i + 1]))
                dma_free = shared_end(begin, stores[j], runs)
            else:
                dma_free = begin + stores[j]
            epilogues[-1] = (epilogues[-1][0], dma_free)

        prefetch(0, cycles=lead_in)     # sharing the channel with the stream's refills
        tensor_free = act_free = 0.0
        pending = None      # the last epilogue's store, timed once the next step has run
        for i in range(count):
            refill = i + 1 < count and trail[i + 1] > 0
            chunks, k0, k1, last = steps[i][2], steps[i][5], steps[i][6], steps[i][7]
            # A K tile's time shared among its chunks' matmuls in proportion to their columns.
            per_tile = tensor[i] / (k1 - k0)
            share = [per_tile * columns / sum(chunks) for columns in chunks]
            last_cycles, last_tiles = tails[i]
            # The `early` K tiles that the last descriptor does not carry start when their
            # own are done (a step with no descriptors waits for none); with a refill, K tile
            # j's matmuls wait for its j-th descriptor, the last K tile's for the last.
            if trail[i]:
                early, ready = k1 - k0 - 1, started[i] + trail[i]
            else:
                early = k1 - k0 - last_tiles if fetches[i] else 0
                ready = fetched[i] - (last_cycles if early > 0 else 0)
            # An engine waiting for its tiles starts with the fill.
            t = max(tensor_free, ready + fill(i, per_tile)) if fetches[i] else tensor_free
            if i == 0 and pieces:
                t = start + first_began     # when the prefetch's first piece is in
                early = 0
            began = t
            for c, columns in enumerate(share):
                if k0 == 0 and len(epilogues) >= 2 and c < len(epilogues[-2][0]):
                    t = max(t, epilogues[-2][0][c])
                t += columns
            if i == 0 and pieces:
                t = start + first_end
            elif early > 0:
                t = max(t + (early - 1) * per_tile, fetched[i]) + (k1 - k0 - early) * per_tile
            else:
                t += tensor[i] - per_tile
            tensor_free = tensor_end[i] = t
            if conflicts:
                reading.append((began, t, tensor_reads[i] / max(1.0, t - began)))
            # The last epilogue's store, then the next prefetch, in the DMA stream's order:
            # this step's matmuls wait for neither, so they are placed first and the store
            # is timed beside them.
            if pending:
                store(*pending, i)
                pending = None
            if i + 1 < count and not refill:
                # Its reads share the read channel with the step's instruction fetches, spread
                # over the step (as long as the one before it, or as throughput allows).
                window = max(lengths[i], tensor_end[i - 1] - tensor_end[i - 2] if i >= 2 else 0)
                shared = fetch_beats[i] if fetches[i + 1] and not conflicts else 0
                prefetch(i + 1, cycles=fetches[i + 1] * window / (window - shared))
            if refill:
                # K tile j's descriptor waits for the matmuls of this step that read K tile j
                # of the slot: it starts after the first K tile's, at the read channel's pace
                # (shared with the step's instruction fetches, its own among them), its last
                # after the last matmul.
                span = _dma_step(fetches[i + 1], fetch_beats[i], 0, 0)
                prefetch(i + 1, after=max(began + per_tile, tensor_end[i] + trail[i + 1] - span),
                         cycles=span)
            if last:
                if len(epilogues) >= 2:
                    # Through the NOP, if any: its wait, then the activation's issue.
                    act_free = max(act_free, epilogues[-2][1] + (1 + issue if nops[i] else 0))
                ends = _activations(chunks, per_tile, act_free - tensor_end[i], drain,
                                    act_overhead)
                ends = [tensor_end[i] + end for end in ends]
                act_free = ends[-1]
                epilogues.append((ends, None))
                pending = (i, max(dma_free, act_free))
        if pending:
            store(*pending, count - 1)    # after every matmul: none slows it
        return dma_free

    # The read channel, one beat a cycle: the streams' fetches (whole bursts, each stream's
    # END and the bursts its sequencer fetches ahead of it) and the DMA's reads; after the
    # last, the last step's drain, activations and store.
    channel = HBM_READ_CYCLES + issue + word_cycles * (read_words + sum(
        (-(-(n + 1) * beats_per_word // burst_beats) + 1) * burst_beats for n in words))
    channel += finish
    total = max(throughput, latency(False), latency(True), channel)
    vectors = sum(sum(s[2]) * (s[6] - s[5]) for s in steps)
    # The hardware counts rows x r x cols per vector: K rounded up to whole rows.
    return Estimate(m=m, k=k, n=n, dtype=dtype, cycles=round(total), tensor_busy=vectors,
                    dma_busy=round(dma_busy), activation_busy=sum(
                        sum(s[2]) for s in steps if s[7]),
                    macs=m * k_rows * rate * n, dma_bytes=dma_bytes, steps=count)


def random_gemm_shapes(config, dtype, count, rng):
    """``count`` GEMM shapes ``(m, k, n)`` drawn from ``rng`` (a numpy ``Generator``) that
    stress :func:`gemm`'s step model on ``config`` in ``dtype``, five kinds in turn: any
    size up to 32 tiles; K = 1; a long K (8 to 39 K tiles) with M, N of at most two tiles;
    M, K, N each a whole number of tiles give or take one; K just around what the SBUF's
    double-buffered slots hold, where the schedule narrows the blocks or cuts K into parts
    (benchmarks/cycle_model_accuracy.py draws its random set with it, the suite a sample)."""
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count={count!r}: must be a non-negative integer")
    P = config.pe_cols
    k_rows = config.pe_rows * config.macs_per_pe_cycle(dtype)  # K elements of one K tile
    chunk = config.moving_max
    # The K of the stationary and moving slots (double-buffered, blocks of a PSUM group's
    # columns) that fill the SBUF.
    group = max(1, config.psum_banks // 2) * chunk
    sbuf_k = config.sbuf_bytes_per_partition // (
        2 * numerics.column_bytes(config, dtype) * (P + group)) * k_rows

    def near(unit):
        return max(1, unit * int(rng.integers(1, 9)) + int(rng.integers(-1, 2)))

    def spread(low, high):
        return int(np.exp(rng.uniform(np.log(low), np.log(high))))

    shapes = []
    for index in range(count):
        kind = index % 5
        if kind == 0:
            m, k, n = spread(1, 32 * P), spread(1, 32 * k_rows), spread(1, 8 * chunk)
        elif kind == 1:
            m, k, n = spread(P, 32 * P), 1, spread(chunk, 8 * chunk)
        elif kind == 2:
            m, n, k = spread(1, 2 * P), spread(1, 2 * P), int(rng.integers(8, 40)) * k_rows
        elif kind == 3:
            m, k, n = near(P), near(k_rows), near(chunk)
        else:
            k = max(1, sbuf_k + int(rng.integers(-k_rows, k_rows + 1)))
            m, n = spread(P, 8 * P), spread(chunk, 4 * chunk)
        shapes.append((m, k, n))
    return shapes
