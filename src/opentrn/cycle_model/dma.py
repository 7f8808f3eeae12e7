"""hdl/dma_unit.py and hdl/dma.py: the descriptor queue and the engine's walks."""

from collections import deque

from opentrn.golden import sbuf
from opentrn.hdl.dma import GEARBOX_WORDS

from .access_pattern import _Walker
from .axi4_memory import HBM_READ_CYCLES, HBM_WRITE_RESPONSE_CYCLES
from .sequencer import _IDLE

DMA_FIFO_LATENCY = 2            # hdl/dma.py's SyncFIFOBuffered: written in t, read in t + 2

#: Cycles a descriptor costs beyond its bus words: queue to engine (1), check (1), the first
#: read answered (HBM_READ_CYCLES; from a buffer 1, or sbuf.read_latency), into the
#: realignment buffer and written (1), the finish seen (1), FINISH (1), ``done`` (1); a write
#: to HBM also waits for its last response (HBM_WRITE_RESPONSE_CYCLES).
DMA_READ_OVERHEAD = 5 + HBM_READ_CYCLES
DMA_WRITE_OVERHEAD = 6 + HBM_WRITE_RESPONSE_CYCLES

_HBM, _SBUF, _PSUM = 0, 1, 2              # a descriptor side's space (hdl/dma.py, Space)


def dma_bytes_per_cycle(config):
    """The core's DMA bandwidth in bytes per cycle: ``dma_engines`` buses of
    ``dma_bus_bytes``, at most the core's share of the chip's HBM bandwidth."""
    return min(config.dma_engines * config.dma_bus_bytes,
               config.hbm_bytes_per_s / config.cores_per_chip / config.clock_hz)


def shared_end(start, words, reading, most=0.5):
    """The end of ``words`` cycles of DMA work from ``start`` that loses a port to the
    tensor engine's work beside it (``reading``: (start, end, the share of each cycle it
    takes), in order; at most ``most`` of each cycle): a store's SBUF reads lose the SBUF's
    read port to the tensor unit's column reads (the port's round-robin leaves the store
    every other cycle), a fetch's HBM reads the AXI read channel to the tensor sequencer's
    instruction fetches (the channel takes turns by burst, and a fetch's burst is longer
    than a row's)."""
    t, left = start, float(words)
    for begin, end, rate in reading:
        if end <= t:
            continue
        if t < begin:
            if left <= begin - t:
                return t + left
            left -= begin - t
            t = begin
        pace = 1.0 - min(rate, most)
        if left <= (end - t) * pace:
            return t + left / pace
        left -= (end - t) * pace
        t = end
    return t + left


class _DmaEngine:
    """hdl/dma_unit.py and hdl/dma.py: the descriptor queue, and one descriptor at a time
    walked on both sides through the realignment buffer."""

    def __init__(self, config):
        self.width = config.dma_bus_bytes
        self.sbuf_latency = sbuf.read_latency(config)
        self.capacity = GEARBOX_WORDS * self.width
        self.queue = deque()            # (readable cycle, fields)
        self.sizes = deque()            # bytes of each descriptor accepted, not done
        self.state = _IDLE              # IDLE, CHECK, RUN, FINISH
        self.busy = False
        self.done = False
        self.running = False
        self.desc = None
        self.src_issue, self.src_take = _Walker(self.width), _Walker(self.width)
        self.dst_issue, self.dst_put = _Walker(self.width), _Walker(self.width)
        self.level = 0
        self.reads_in_flight = 0
        self.words_in_flight = 0
        self.arrivals = deque()         # the cycles the buffer reads in flight are answered in
        self.bursts_sent = 0
        self.bursts_unwritten = 0
        self.in_burst = False
        self.beats_left = 0
        self.write_lasts = deque()      # cycles of last W beats, awaiting their response


class _DmaModel:
    """The DMA engine's part of :class:`~opentrn.cycle_model.core._Core`'s clock edge."""

    def _dma_commit(self, cycle, ar_sent, r_taken, last_taken, buffer_granted, written, need,
                    w_sent, w_last, dst_burst_words, aw_sent, b_taken):
        dma = self.dma
        if (dma.state == _IDLE and not dma.queue and not dma.arrivals and not dma.write_lasts
                and not (ar_sent or r_taken or buffer_granted or written or w_sent or aw_sent)):
            dma.done = False            # an idle engine with nothing coming: no change
            return
        # The FSM sees this cycle's (registered) state.
        finished = (not dma.src_take.active and not dma.dst_put.active
                    and dma.bursts_sent == 0 and dma.reads_in_flight == 0
                    and dma.words_in_flight == 0)
        # reads from HBM
        if ar_sent:
            dma.src_issue.step(dma.src_issue.burst_words())
        dma.reads_in_flight += ar_sent - last_taken
        # reads from a buffer: the response comes 1 cycle after the grant from the PSUM,
        # sbuf.read_latency from the SBUF
        responded = bool(dma.arrivals) and dma.arrivals[0] == cycle
        if responded:
            dma.arrivals.popleft()
        if buffer_granted:
            dma.src_issue.step(1)
            dma.arrivals.append(cycle + (dma.sbuf_latency if dma.desc["src_space"] == _SBUF
                                         else 1))
        dma.words_in_flight += buffer_granted - responded
        arrived = r_taken or responded
        push = 0
        if arrived:
            push = dma.src_take.lanes()
            dma.src_take.step(1)
        pop = 0
        if written:
            pop = need
            dma.dst_put.step(1)
        dma.level += push - pop
        # writes to HBM
        if aw_sent:
            dma.dst_issue.step(dma.dst_issue.burst_words())
        if w_sent:
            dma.beats_left = (dma.beats_left if dma.in_burst else dst_burst_words) - 1
            dma.in_burst = not w_last
            if w_last:
                dma.write_lasts.append(cycle)
        if b_taken:
            dma.write_lasts.popleft()
        dma.bursts_sent += aw_sent - b_taken
        dma.bursts_unwritten += aw_sent - w_last
        # the descriptor FSM
        dma.done = False
        if dma.state == _IDLE:
            if dma.queue and dma.queue[0][0] <= cycle:
                _, dma.desc = dma.queue.popleft()
                dma.busy = True
                dma.state = "CHECK"
        elif dma.state == "CHECK":
            d = dma.desc
            row_bytes = d["n0"] << d["elem_log2"]
            for walker, side in ((dma.src_issue, "src"), (dma.src_take, "src"),
                                 (dma.dst_issue, "dst"), (dma.dst_put, "dst")):
                walker.load(d[f"{side}_addr"], d[f"{side}_stride1"], d[f"{side}_stride2"],
                            d["n1"], d["n2"], row_bytes)
            dma.running = True
            dma.state = "RUN"
        elif dma.state == "RUN":
            if finished:
                dma.running = False
                dma.state = "FINISH"
        elif dma.state == "FINISH":
            dma.done = True
            dma.busy = False
            dma.state = _IDLE
