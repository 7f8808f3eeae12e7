"""The cycle model: the core's timing, predicted from a :class:`~opentrn.config.Config` and a
program, without the RTL.

:func:`predict` runs a program's three instruction streams through a model of the core's
control: the sequencers (instruction fetch over the shared AXI4 read channel, assembly,
checks, semaphore waits, retire queues), the DMA engine (descriptor queue, access-pattern
walks, bursts, the realignment buffer), the tensor unit (the load and matmul paths with their
SBUF column readers, the array's weight banks and its ``K + M - 1`` fill), the activation
unit (PSUM reads, the engine's pipeline, SBUF writes), the arbitration of the SBUF and PSUM
ports, and the HBM of the testbench (``sim/hbm.py``: a read burst's first beat two cycles
after its address, a write response two cycles after the burst's last beat, one beat per
cycle). It moves no data: each block is the RTL's handshakes and counters, cycle by cycle,
so its performance counters equal the RTL's (the tests compare them on every kernel the
suite runs on the RTL and on random GEMM and MLP shapes). Every rule is the documented
behaviour of a block (docs/architecture.md, docs/performance.md "The cycle model"), sized by
``Config``; nothing is fitted.

The HBM may have a fixed latency (``latency=``): random latencies and back-pressure are not
modelled (the zero-latency prediction is then a lower bound).

:func:`gemm` is the fast path for workloads too large to build as a program: the library
GEMM kernel's steps (:func:`opentrn.kernels.schedule_shape`), each as long as the larger of
the tensor engine's and the DMA's work in it; its difference from :func:`predict` is bounded
by the tests (docs/performance.md).

The model times programs that run to their end without a fault, as every program the
kernel API builds does (the API checks every rule when it emits an instruction). It refuses
an illegal opcode and a deadlock with :class:`ModelError`; the other faults (a field out of
range, a DMA error) it does not look for: the golden machine (:mod:`opentrn.golden.core`)
finds them.
"""

from collections import deque
from dataclasses import dataclass

from amaranth.utils import exact_log2

from opentrn import isa, numerics
from opentrn.hdl.activation_engine import stages as activation_stages
from opentrn.hdl.activation_unit import INPUT_SLOTS as ACT_INPUT_SLOTS
from opentrn.hdl.axi4 import BOUNDARY_BYTES
from opentrn.hdl.core import COUNTERS as CORE_COUNTERS
from opentrn.hdl.dma import GEARBOX_WORDS, MAX_BURST, MAX_OUTSTANDING
from opentrn.hdl.dma import QUEUE_DEPTH as DMA_QUEUE_DEPTH
from opentrn.hdl.dma_unit import IN_FLIGHT as DMA_SIZES_DEPTH
from opentrn.hdl.sequencer import FETCH_BUFFER_BYTES, RETIRE_DEPTH, fetch_unit
from opentrn.hdl.tensor_unit import LOAD_JOBS, LOAD_WORDS, MATMUL_JOBS, MATMUL_WORDS
from opentrn.isa import Engine, Opcode

__all__ = ["COUNTERS", "ModelError", "predict", "simulate", "gemm", "Estimate",
           "dma_bytes_per_cycle", "upper_bound"]

#: The counters the model predicts: all of the core's (docs/registers.md), in their order.
COUNTERS = CORE_COUNTERS

# The RTL's structure constants come from its blocks (above); these are the timing of the
# testbench's memory and of one FIFO, which have no named constant there.
HBM_READ_CYCLES = 2             # sim/hbm.py: address accepted in t, first beat taken in t + 2
HBM_WRITE_RESPONSE_CYCLES = 2   # sim/hbm.py: last beat in t, response taken in t + 2
DMA_FIFO_LATENCY = 2            # hdl/dma.py's SyncFIFOBuffered: written in t, read in t + 2

_IDLE, _FETCH, _READY = 0, 1, 2
_HBM, _SBUF, _PSUM = 0, 1, 2


class ModelError(RuntimeError):
    """The program does something the model does not cover (a fault, a hang)."""


class _RoundRobin:
    """hdl/partitioned_memory.py's arbiter: after requester ``i`` wins, ``i+1, i+2, ...``
    come first (before any grant: ``0, 1, ...``)."""

    def __init__(self, count):
        self.count = count
        self.last = count - 1

    def grant(self, valids):
        if not any(valids):
            return -1
        count = self.count
        for step in range(1, count + 1):
            index = (self.last + step) % count
            if valids[index]:
                self.last = index
                return index
        return -1


class _Hbm:
    """The testbench's HBM (sim/hbm.py) with a fixed ``latency``: read bursts answered in
    address order, one beat per cycle, the first no earlier than ``HBM_READ_CYCLES +
    latency`` after the address; a write burst answered ``HBM_WRITE_RESPONSE_CYCLES +
    latency`` after its last beat."""

    def __init__(self, latency=0):
        self.read_cycles = HBM_READ_CYCLES + latency
        self.write_cycles = HBM_WRITE_RESPONSE_CYCLES + latency
        self.beats = deque()          # [available_cycle, manager, last]
        # Write addresses: cocotbext-axi's AW sink queues at most 2 not yet taken by the
        # memory's write process, which takes one when it has finished the previous burst.
        self.aw_queued = 0
        self.aw_ready = True
        self.aw_asleep = False        # ready low until the write process takes one
        self.aw_wake = None           # cycle whose edge recomputes ready after a take
        self.writing = False          # the write process holds a burst

    def write_edge(self, cycle, aw_sent, w_last):
        """The AW sink and the write process at the clock edge that ends ``cycle``."""
        if aw_sent:
            self.aw_queued += 1
        if self.aw_wake == cycle or not self.aw_asleep:
            self.aw_wake = None
            self.aw_ready = self.aw_queued < 2
            self.aw_asleep = not self.aw_ready
        if w_last:
            self.writing = False
        if not self.writing and self.aw_queued:
            self.aw_queued -= 1
            self.writing = True
            if self.aw_asleep and self.aw_wake is None:
                self.aw_wake = cycle + 1

    def read_burst(self, cycle, manager, beats):
        at = cycle + self.read_cycles
        for beat in range(beats):
            self.beats.append((at, manager, beat == beats - 1))

    def presented(self, cycle):
        if self.beats and self.beats[0][0] <= cycle:
            return self.beats[0]
        return None


class _Walker:
    """hdl/access_pattern.py: the rows of one side of a descriptor, word by word (the
    partitions do not change the timing: only the byte addresses are kept)."""

    __slots__ = ("width", "shift", "n1", "n2", "row_bytes", "stride1", "stride2", "active",
                 "cur", "row_end", "i1", "i2", "plane_addr")

    def __init__(self, width):
        self.width = width
        self.shift = width.bit_length() - 1
        self.active = False

    def load(self, addr, stride1, stride2, n1, n2, row_bytes):
        self.n1, self.n2, self.row_bytes = n1, n2, row_bytes
        self.stride1, self.stride2 = stride1, stride2
        self.active = True
        self.plane_addr = addr
        self.i1 = self.i2 = 0
        self.cur, self.row_end = addr, addr + row_bytes

    def words_left(self):
        return ((self.row_end - 1) >> self.shift) - (self.cur >> self.shift) + 1

    def lanes(self):
        """Bytes of the current word that belong to the row."""
        first = self.cur & (self.width - 1)
        last = ((self.row_end - 1) & (self.width - 1)) if self.words_left() == 1 \
            else self.width - 1
        return last - first + 1

    def burst_words(self):
        boundary_words = BOUNDARY_BYTES >> self.shift
        to_boundary = boundary_words - ((self.cur >> self.shift) & (boundary_words - 1))
        return min(MAX_BURST, self.words_left(), to_boundary)

    def step(self, words):
        if not self.active:
            return
        if words < self.words_left():
            self.cur = ((self.cur >> self.shift) + words) << self.shift
        elif self.i1 + 1 < self.n1:
            self.i1 += 1
            start = self.row_end - self.row_bytes + self.stride1
            self.cur, self.row_end = start, start + self.row_bytes
        elif self.i2 + 1 < self.n2:
            self.i1 = 0
            self.i2 += 1
            self.plane_addr += self.stride2
            self.cur, self.row_end = self.plane_addr, self.plane_addr + self.row_bytes
        else:
            self.active = False


@dataclass
class _Instruction:
    opcode: Opcode
    fields: dict
    size: int


def _stream(hbm, pc, engine):
    """The instructions of one engine's stream, up to its ``END``."""
    result = []
    while True:
        opcode, fields = isa.decode(hbm, pc)
        if not isinstance(opcode, Opcode) or opcode not in isa.ENGINE_OPCODES[engine]:
            raise ModelError(f"engine {engine.name}: illegal opcode at pc={pc} (the model "
                             "covers programs that do not fault)")
        size = isa.instruction_bytes(opcode)
        result.append(_Instruction(opcode, fields, size))
        if opcode == Opcode.END:
            return result
        pc += size


class _Sequencer:
    """hdl/sequencer.py: fetch, assemble (one bus beat per cycle), check and wait (the READY
    state), hand over, retire in order."""

    def __init__(self, config, engine, program, instructions):
        self.engine = engine
        bus = config.dma_bus_bytes
        self.bus = bus
        self.buffer_beats = FETCH_BUFFER_BYTES // bus
        self.burst_beats = self.buffer_beats // 2
        unit = fetch_unit(config)
        self.units_per_word = isa.WORD_BYTES // unit
        self.units_per_beat = bus // unit
        self.slot = program % bus // unit     # the unit of the head beat assembled next
        self.hbm_bytes = config.hbm_bytes
        self.instructions = instructions
        self.index = 0                  # the instruction being fetched / waiting
        self.state = _FETCH             # begin() at start: FETCH from the next cycle
        self.fetching = True
        self.fetch_addr = program - program % bus       # bursts fetch whole beats
        self.in_flight = 0
        self.ar_valid = False
        self.ar_len = 0
        self.level = 0                  # beats in the fetch buffer
        self.have = 0
        self.ended = False
        self.retiring = deque()         # (self_retiring, signal index or None)
        self.unit_done = 0
        self.waiting = False
        # This cycle's decisions, applied at the clock edge.
        self.pop = False
        self.push = None
        self.next_unit_done = 0

    def quiet(self):
        return self.in_flight == 0 and not self.ar_valid

    def finished(self):
        return self.ended and not self.retiring and self.quiet()

    def current(self):
        return self.instructions[self.index]


class _DmaEngine:
    """hdl/dma_unit.py and hdl/dma.py: the descriptor queue, and one descriptor at a time
    walked on both sides through the realignment buffer."""

    def __init__(self, config):
        self.width = config.dma_bus_bytes
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
        self.response_due = False       # a buffer read granted last cycle
        self.bursts_sent = 0
        self.bursts_unwritten = 0
        self.in_burst = False
        self.beats_left = 0
        self.write_lasts = deque()      # cycles of last W beats, awaiting their response


class _Reader:
    """One column reader of the tensor unit (hdl/tensor_unit.py ``_ColumnReader``)."""

    __slots__ = ("jobs", "words", "width", "queue", "gen_pos", "gen_index", "reserved",
                 "stored", "col")

    def __init__(self, jobs, words, width):
        self.jobs, self.words, self.width = jobs, words, width
        self.queue = []        # jobs: dicts with first_word, last_word, lane, count, size, seq
        self.gen_pos = 0       # jobs of the queue whose words have all been requested
        self.gen_index = 0
        self.reserved = 0
        self.stored = 0
        self.col = 0

    def want(self):
        return self.gen_pos < len(self.queue) and self.reserved != self.words

    def gen_sequence(self):
        return self.queue[self.gen_pos]["seq"]

    def grant(self):
        job = self.queue[self.gen_pos]
        if job["first_word"] + self.gen_index == job["last_word"]:
            self.gen_index = 0
            self.gen_pos += 1
        else:
            self.gen_index += 1

    def space(self):
        return len(self.queue) != self.jobs


def _place(offset, count, size, width, seq, **extra):
    """A reader's job: ``count`` columns of ``2 ** size`` bytes from byte ``offset``."""
    shift = width.bit_length() - 1
    return {"first_word": offset >> shift,
            "last_word": (offset + (count << size) - 1) >> shift,
            "lane": offset & (width - 1), "count": count, "size": size, "seq": seq, **extra}


class _Core:
    """The whole model: one :meth:`step` per clock cycle."""

    def __init__(self, config, hbm, programs, latency=0):
        self.config = config
        self.cycle = 0
        self.trace = None
        self.counters = {name: 0 for name in COUNTERS}
        self.semaphores = [0] * config.semaphores
        self.hbm = _Hbm(latency)
        self.sequencers = [
            _Sequencer(config, engine, int(programs[engine]),
                       _stream(hbm, int(programs[engine]), engine))
            for engine in Engine]
        self.ar = _RoundRobin(1 + len(Engine))      # DMA, then the fetchers 0, 1, 2
        self.sbuf_reads = _RoundRobin(3)            # te_read, act_read, dma_read
        self.sbuf_writes = _RoundRobin(2)           # act_write, dma_write
        self.psum_reads = _RoundRobin(2)            # act_read, dma_read
        self.dma = _DmaEngine(config)
        self._init_tensor(config)
        self._init_activation(config)

    # -- tensor unit --------------------------------------------------------------------------

    def _init_tensor(self, config):
        width = config.vector_word_bytes          # the SBUF's vector word
        self.K, self.M = config.pe_rows, config.pe_cols
        self.stages = config.pe_multiply_stages
        self.loads = _Reader(LOAD_JOBS, LOAD_WORDS, width)
        self.matmuls = _Reader(MATMUL_JOBS, MATMUL_WORDS, width)
        self.mx = bool(numerics.mx_blocks(config))
        self.scales = {}
        if self.mx:
            self.scales = {"load": _Reader(LOAD_JOBS, LOAD_WORDS, width),
                           "matmul": _Reader(MATMUL_JOBS, MATMUL_WORDS, width)}
        self.readers = [self.loads, self.matmuls, *self.scales.values()]
        self.te_locked = False
        self.te_owner = 0
        self.te_responding = -1
        self.sequence = 0
        self.load_pending = False
        self.tile_macs = 0
        # The array: weight banks, the guard, results in flight.
        self.pending = False
        self.active_valid = False
        self.guard = 0
        self.load_column = 0
        self.results = deque()          # (cycle the result is written, last)
        self.results_fifo = 0           # matmuls with results in flight (FIFO K + M + S)
        self.order = deque()            # True: a load
        self.order_depth = 2 * (self.K + self.M) + LOAD_JOBS + MATMUL_JOBS
        self.loads_done = 0
        self.matmuls_done = 0
        self.matmul_done = False
        self.te_wrote = False           # a result was written last cycle (PSUM stage 1)

    def _tensor_ready(self, ins):
        if len(self.order) >= self.order_depth:
            return False
        if ins.opcode == Opcode.LOAD_STATIONARY:
            fmt = numerics.format_of_code(ins.fields["format"])
            return self.loads.space() and (not fmt.mx or self.scales["load"].space())
        fmt = numerics.format_of_code(ins.fields["format"])
        return self.matmuls.space() and (not fmt.mx or self.scales["matmul"].space())

    def _tensor_accept(self, ins):
        f, width, seq = ins.fields, self.config.vector_word_bytes, self.sequence
        fmt = numerics.format_of_code(f["format"])
        size = exact_log2(numerics.column_bytes(self.config, fmt.name))
        if ins.opcode == Opcode.LOAD_STATIONARY:
            self.loads.queue.append(_place(f["sbuf_offset"], f["cols"], size, width, seq,
                                           mx=fmt.mx))
            if fmt.mx:
                self.scales["load"].queue.append(_place(f["scale_offset"], f["cols"], 0,
                                                        width, seq))
            self.load_pending = True
            self.tile_macs = f["rows"] * self.config.macs_per_pe_cycle(fmt.name) * f["cols"]
            self.order.append(True)
        else:
            self.matmuls.queue.append(_place(f["sbuf_offset"], f["n"], size, width, seq,
                                             mx=fmt.mx, swap=self.load_pending,
                                             macs=self.tile_macs))
            if fmt.mx:
                self.scales["matmul"].queue.append(_place(f["scale_offset"], f["n"], 0,
                                                          width, seq))
            self.load_pending = False
            self.order.append(False)
        self.sequence += 1

    def _te_owner(self):
        """The reader that has the SBUF port (hdl/tensor_unit.py: oldest first; a path's two
        readers by fewer words reserved); -1 when none wants it."""
        if self.te_locked:
            return self.te_owner
        readers = self.readers
        wanting = [i for i, r in enumerate(readers) if r.want()]
        if len(wanting) < 2:
            return wanting[0] if wanting else -1
        owner = -1
        for i in wanting:
            a = readers[i]
            wins = True
            for j in wanting:
                if j == i:
                    continue
                b = readers[j]
                sa, sb = a.gen_sequence(), b.gen_sequence()
                if sa == sb:
                    first = a.reserved <= b.reserved if i < j else a.reserved < b.reserved
                else:
                    first = sa < sb
                if not first:
                    wins = False
                    break
            if wins:
                owner = i
        return owner

    # -- activation unit ----------------------------------------------------------------------

    def _init_activation(self, config):
        self.act_state = "IDLE"
        self.act_ins = None
        self.act_reads_left = 0
        self.act_in_flight = False
        self.act_level = 0
        self.act_in_index = 0
        self.act_in_byte = 0
        # The last flag of the vector in each stage.
        self.act_pipe = [None] * activation_stages(config)
        self.act_out_index = 0
        self.act_out_address = 0
        self.act_write_valid = False
        self.act_write_last = False

    # -- the cycle ----------------------------------------------------------------------------

    def step(self):
        cfg = self.config
        cycle = self.cycle
        seqs = self.sequencers
        dma = self.dma
        width = cfg.dma_bus_bytes

        # ---- requests (from registered state) -------------------------------------------
        # Tensor unit: its SBUF reader.
        te_owner = self._te_owner()
        te_valid = te_owner >= 0
        # Activation unit.
        ins = self.act_ins
        act_streaming = self.act_state == "STREAM"
        act_request = (act_streaming and self.act_reads_left != 0
                       and self.act_level + self.act_in_flight < ACT_INPUT_SLOTS)
        act_src_sbuf = bool(ins and ins.fields["src"])
        act_sbuf_read = (self.act_state == "BIAS") or (act_request and act_src_sbuf)
        act_psum_read = act_request and not act_src_sbuf
        # DMA engine.
        desc = dma.desc
        running = dma.running
        src_space = desc["src_space"] if desc else None
        dst_space = desc["dst_space"] if desc else None
        dma_buffer_request = (running and src_space != _HBM and dma.src_issue.active
                              and dma.level + (dma.words_in_flight + 1) * width
                              <= dma.capacity)
        need = dma.dst_put.lanes() if (running and dma.dst_put.active) else 0
        dma_have = running and dma.dst_put.active and dma.level >= need
        dma_arvalid = (running and src_space == _HBM and dma.src_issue.active
                       and dma.reads_in_flight < MAX_OUTSTANDING)

        # ---- arbitration -----------------------------------------------------------------
        sbuf_read = self.sbuf_reads.grant(
            [te_valid, act_sbuf_read, dma_buffer_request and src_space == _SBUF])
        psum_read = self.psum_reads.grant(
            [act_psum_read, dma_buffer_request and src_space == _PSUM])
        sbuf_write = self.sbuf_writes.grant(
            [self.act_write_valid, dma_have and dst_space == _SBUF])
        psum_dma_write = dma_have and dst_space == _PSUM and not self.te_wrote
        ar_valids = [dma_arvalid] + [s.ar_valid for s in seqs]
        ar = self.ar.grant(ar_valids)

        # ---- HBM channels ----------------------------------------------------------------
        beat = self.hbm.presented(cycle)
        r_manager, r_last = (beat[1], beat[2]) if beat else (-1, False)
        if r_manager == 0:
            r_taken = (running and src_space == _HBM and dma.src_take.active
                       and dma.level <= dma.capacity - width)
        else:
            r_taken = r_manager > 0
        if r_taken:
            self.hbm.beats.popleft()
        b_taken = bool(dma.write_lasts) and dma.write_lasts[0] + self.hbm.write_cycles \
            <= cycle and running
        if ar >= 0:
            if ar == 0:
                self.hbm.read_burst(cycle, 0, dma.src_issue.burst_words())
            else:
                self.hbm.read_burst(cycle, ar, seqs[ar - 1].ar_len)

        # ---- units' retire signals and hand-over ready ------------------------------------
        dma_retire = dma.done
        head_is_load = self.order[0] if self.order else None
        te_retire = head_is_load is not None and (
            self.loads_done != 0 if head_is_load else self.matmuls_done != 0)
        act_write = self.act_write_valid and sbuf_write == 0
        act_retire = act_write and self.act_write_last
        retire = (dma_retire, te_retire, act_retire)

        # ---- sequencers --------------------------------------------------------------------
        handed = [None, None, None]
        signals = []
        for engine, s in enumerate(seqs):
            # retire queue
            available = s.unit_done + retire[engine]
            if s.retiring:
                self_retiring, signal = s.retiring[0]
                pop = self_retiring or available != 0
            else:
                self_retiring, signal, pop = True, None, False
            s.next_unit_done = available - (1 if pop and not self_retiring else 0)
            s.pop = pop
            if pop and signal is not None:
                signals.append(signal)
            s.waiting = False
            s.push = None
            if s.state == _READY:
                current = s.current()
                f = current.fields
                if f["wait"] and self.semaphores[f["wait_sem"]] < f["wait_value"]:
                    s.waiting = True
                elif len(s.retiring) < RETIRE_DEPTH:
                    if current.opcode in (Opcode.END, Opcode.NOP):
                        s.push = current
                    else:
                        if engine == Engine.DMA:
                            ready = (len(dma.queue) < DMA_QUEUE_DEPTH
                                     and len(dma.sizes) < DMA_SIZES_DEPTH)
                        elif engine == Engine.TENSOR:
                            ready = self._tensor_ready(current)
                        else:
                            ready = self.act_state == "IDLE"
                        if ready:
                            s.push = current
                            handed[engine] = current

        # ---- tensor unit datapath ----------------------------------------------------------
        loads, matmuls = self.loads, self.matmuls
        K, M = self.K, self.M
        # stationary
        load_take = False
        if loads.queue:
            job = loads.queue[0]
            in_data = loads.col < job["count"]
            scale_ready = (not job["mx"]) or self.scales["load"].stored != 0
            valid = (not in_data) or (loads.stored != 0 and scale_ready)
            if valid and not self.pending and self.guard == 0:
                load_take = True
        # moving
        mm_take = False
        if matmuls.queue:
            job = matmuls.queue[0]
            first = matmuls.col == 0
            scale_ready = (not job["mx"]) or self.scales["matmul"].stored != 0
            valid = (matmuls.stored != 0 and scale_ready
                     and (not first or self.results_fifo < K + M + self.stages))
            swap = first and job["swap"]
            ready = (swap and self.pending) or (not swap and self.active_valid)
            if valid and ready:
                mm_take = True
        te_write = bool(self.results) and self.results[0][0] == cycle
        te_write_last = te_write and self.results[0][1]

        # ---- activation datapath -----------------------------------------------------------
        pipe = self.act_pipe
        out_valid = pipe[-1] is not None
        act_take = False
        act_result_take = False
        if ins is not None:
            f = ins.fields
            out_bytes = _OUT_BYTES[f["out_format"]]
            last_index = f["n"] - 1
            vector = cfg.vector_word_bytes
            position = self.act_out_address & (vector - 1)
            complete = (position + out_bytes == vector) or self.act_out_index == last_index
            write_free = (not self.act_write_valid) or act_write
            result_ready = (not complete) or write_free
            advance = (not out_valid) or result_ready
            act_result_take = out_valid and result_ready
            act_take = advance and self.act_level != 0 and act_streaming
        else:
            advance = True

        # ---- DMA datapath ------------------------------------------------------------------
        dma_written = False
        dma_w_sent = False
        dma_w_last = False
        if dma_have:
            if dst_space == _HBM:
                dma_w_sent = dma.bursts_unwritten != 0
                dma_written = dma_w_sent
            elif dst_space == _SBUF:
                dma_written = sbuf_write == 1
            else:
                dma_written = psum_dma_write
        dst_burst_words = dma.dst_put.burst_words() if dma_w_sent else 0
        if dma_w_sent:
            dma_w_last = (dma.beats_left == 1) if dma.in_burst else dst_burst_words == 1
        dma_aw_sent = (running and dst_space == _HBM and dma.dst_issue.active
                       and dma.bursts_sent < MAX_OUTSTANDING and self.hbm.aw_ready)

        # ---- counters ----------------------------------------------------------------------
        counters = self.counters
        counters["cycles"] += 1
        counters["dma_busy"] += dma.busy
        counters["tensor_busy"] += mm_take
        counters["activation_busy"] += act_take
        counters["dma_wait"] += seqs[0].waiting
        counters["tensor_wait"] += seqs[1].waiting
        counters["activation_wait"] += seqs[2].waiting
        if mm_take:
            counters["macs"] += matmuls.queue[0]["macs"]

        if self.trace is not None:
            events = []
            for engine, name in enumerate("dta"):
                if handed[engine] is not None:
                    events.append(f"{name}:hand")
                if retire[engine]:
                    events.append(f"{name}:ret")
                if seqs[engine].waiting:
                    events.append(f"{name}:wait")
            if dma.done:
                events.append("dma:done")
            if ar >= 0:
                length = dma.src_issue.burst_words() if ar == 0 else seqs[ar - 1].ar_len
                events.append(f"AR id{ar} len{length}")
            if r_taken:
                events.append(f"R id{r_manager}{' L' if r_last else ''}")
            if dma_aw_sent:
                events.append("AW")
            if dma_w_sent:
                events.append("W")
            if b_taken:
                events.append("B")
            if mm_take:
                events.append("TB")
            if act_take:
                events.append("AB")
            self.trace.append(f"{cycle} " + " ".join(events))

        # ==== commit (the clock edge) =======================================================
        # semaphores
        for index in signals:
            self.semaphores[index] += 1

        # sequencers
        for engine, s in enumerate(seqs):
            beat_in = r_taken and r_manager == engine + 1
            # fetch issue
            issued = 0
            # The RTL tests the registered ar_valid: no new burst in the cycle one is taken.
            can_issue = not s.ar_valid
            if ar == engine + 1:
                s.ar_valid = False
            if (can_issue and s.fetching
                    and s.level + s.in_flight + s.burst_beats <= s.buffer_beats
                    and s.fetch_addr < s.hbm_bytes):
                beat_in_block = (s.fetch_addr // s.bus) % s.burst_beats
                length = s.burst_beats - beat_in_block
                s.ar_valid = True
                s.ar_len = length
                s.fetch_addr += length * s.bus
                issued = length
            s.in_flight += issued - beat_in
            # assembly: a unit per cycle; the beat leaves the buffer with its last unit
            read = False
            if s.state == _FETCH:
                words = 2 if s.current().size == 2 * isa.WORD_BYTES else 1
                if s.have == words * s.units_per_word:
                    s.state = _READY
                elif s.level != 0:
                    read = s.slot == s.units_per_beat - 1
                    s.slot = (s.slot + 1) % s.units_per_beat
                    s.have += 1
            elif s.state == _READY and s.push is not None:
                s.have = 0
                if s.push.opcode == Opcode.END:
                    s.ended = True
                    s.fetching = False
                    s.state = _IDLE
                else:
                    s.state = _FETCH
                s.index += 1
            s.level += beat_in - read
            if s.pop:
                s.retiring.popleft()
            s.unit_done = s.next_unit_done
            if s.push is not None:
                f = s.push.fields
                s.retiring.append((s.push.opcode in (Opcode.END, Opcode.NOP),
                                   f["signal_sem"] if f["signal"] else None))

        # DMA unit and engine
        if dma_retire:
            counters["dma_bytes"] += dma.sizes.popleft()
        if handed[Engine.DMA] is not None:
            f = handed[Engine.DMA].fields
            dma.queue.append((cycle + DMA_FIFO_LATENCY, f))
            dma.sizes.append((f["n0"] << f["elem_log2"]) * f["n1"] * f["n2"])
        self._dma_commit(cycle, ar == 0, r_taken and r_manager == 0,
                         r_taken and r_manager == 0 and r_last,
                         sbuf_read == 2 or psum_read == 1, dma_written, need, dma_w_sent,
                         dma_w_last, dst_burst_words, dma_aw_sent, b_taken)

        self.hbm.write_edge(cycle, dma_aw_sent, dma_w_last)

        # tensor unit
        if handed[Engine.TENSOR] is not None:
            self._tensor_accept(handed[Engine.TENSOR])
        self._tensor_commit(cycle, te_owner, te_valid, sbuf_read == 0, load_take, mm_take,
                            te_write, te_write_last, te_retire, head_is_load)

        # activation unit
        self._act_commit(cycle, handed[Engine.ACTIVATION], sbuf_read == 1, psum_read == 0,
                         act_take, act_result_take, advance, act_write)

        self.cycle += 1

    # -- commits ------------------------------------------------------------------------------

    def _dma_commit(self, cycle, ar_sent, r_taken, last_taken, buffer_granted, written, need,
                    w_sent, w_last, dst_burst_words, aw_sent, b_taken):
        dma = self.dma
        # The FSM sees this cycle's (registered) state.
        finished = (not dma.src_take.active and not dma.dst_put.active
                    and dma.bursts_sent == 0 and dma.reads_in_flight == 0
                    and dma.words_in_flight == 0)
        # reads from HBM
        if ar_sent:
            dma.src_issue.step(dma.src_issue.burst_words())
        dma.reads_in_flight += ar_sent - last_taken
        # reads from a buffer: the response comes the next cycle
        responded = dma.response_due
        if buffer_granted:
            dma.src_issue.step(1)
        dma.words_in_flight += buffer_granted - responded
        dma.response_due = buffer_granted
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


    def _reader_commit(self, reader, granted, response, take, finish):
        """One column reader's clock edge: ``granted`` its request, ``response`` its word
        arrived, ``take`` its column consumed, ``finish`` its job done."""
        pop = False
        if take and reader.queue:
            job = reader.queue[0]
            if reader.col < job["count"]:
                lane = (job["lane"] + (reader.col << job["size"])) & (reader.width - 1)
                pop = (lane == reader.width - (1 << job["size"])
                       or reader.col == job["count"] - 1)
        if granted:
            reader.grant()
        reader.stored += response - pop
        reader.reserved += granted - pop
        if finish:
            reader.col = 0
            reader.queue.pop(0)
            reader.gen_pos -= 1
        elif take:
            reader.col += 1

    def _tensor_commit(self, cycle, owner, request_valid, port_granted, load_take, mm_take,
                       te_write, te_write_last, retire, head_is_load):
        K, M = self.K, self.M
        loads, matmuls = self.loads, self.matmuls
        responding = self.te_responding
        # which readers take and finish
        load_finish = load_take and loads.col == M - 1
        mm_job = matmuls.queue[0] if matmuls.queue else None
        mm_first = mm_take and matmuls.col == 0
        mm_last = mm_take and matmuls.col == mm_job["count"] - 1
        load_mx = bool(loads.queue) and loads.queue[0]["mx"]
        mm_mx = mm_job is not None and mm_job["mx"]
        # (take, finish) of each reader, in the order of self.readers: a path's scale
        # reader follows its path for the MX jobs.
        takes = [(load_take, load_finish), (mm_take, mm_last)]
        if self.mx:
            takes += [(load_take and load_mx, load_finish and load_mx),
                      (mm_take and mm_mx, mm_last and mm_mx)]
        swap = mm_first and mm_job["swap"]
        for index, (reader, (take, finish)) in enumerate(zip(self.readers, takes,
                                                             strict=True)):
            self._reader_commit(reader, port_granted and owner == index, responding == index,
                                take, finish)
        self.te_locked = request_valid and not port_granted
        self.te_owner = owner
        self.te_responding = owner if port_granted else -1
        # the array
        if load_take:
            if self.load_column == M - 1:
                self.load_column = 0
                self.pending = True
            else:
                self.load_column += 1
        if mm_take and swap:
            self.pending = False
            self.active_valid = True
            self.guard = K - 1
        elif self.guard != 0:
            self.guard -= 1
        if mm_take:
            self.results.append((cycle + K + M - 1 + self.stages, mm_last))
            if mm_first:
                self.results_fifo += 1
        if te_write:
            self.results.popleft()
            if te_write_last:
                self.results_fifo -= 1
        # retire in program order
        if retire:
            self.order.popleft()
        self.loads_done += load_finish - (retire and head_is_load)
        self.matmuls_done += self.matmul_done - (retire and not head_is_load)
        self.matmul_done = te_write_last
        self.te_wrote = te_write

    def _act_commit(self, cycle, handed, sbuf_granted, psum_granted, take, result_take,
                    advance, write_done):
        width = self.config.vector_word_bytes     # the SBUF's vector word
        ins = self.act_ins
        state = self.act_state
        streaming = state == "STREAM"
        response = self.act_in_flight           # a read granted last cycle returns now
        if state == "IDLE":
            if handed is not None:
                f = handed.fields
                self.act_ins = handed
                shift = width.bit_length() - 1
                first_word = f["src_offset"] >> shift
                end_word = (f["src_offset"] + f["n"] - 1) >> shift
                self.act_reads_left = end_word - first_word + 1 if f["src"] else f["n"]
                self.act_in_index = 0
                self.act_in_byte = f["src_offset"] & (width - 1)
                self.act_out_index = 0
                self.act_out_address = f["dst_offset"]
                self.act_state = "BIAS" if f["bias"] else "STREAM"
            return
        if state == "BIAS":
            if sbuf_granted:
                self.act_state = "BIAS_RESPONSE"
            return
        if state == "BIAS_RESPONSE":
            self.act_state = "STREAM"           # the response comes the cycle after
            return
        f = ins.fields
        last_index = f["n"] - 1
        granted = sbuf_granted if f["src"] else psum_granted
        self.act_in_flight = granted
        if granted:
            self.act_reads_left -= 1
        pop = take and (not f["src"] or self.act_in_byte == width - 1
                        or self.act_in_index == last_index)
        vector_last = take and self.act_in_index == last_index
        if take:
            self.act_in_index += 1
            self.act_in_byte = (self.act_in_byte + 1) & (width - 1)
        self.act_level += (response and streaming) - pop
        # engine pipeline -> assembly -> write register
        out_bytes = _OUT_BYTES[f["out_format"]]
        write_valid = self.act_write_valid and not write_done
        retire = write_done and self.act_write_last
        if result_take:
            position = self.act_out_address & (width - 1)
            complete = (position + out_bytes == width) or self.act_out_index == last_index
            if complete:
                write_valid = True
                self.act_write_last = self.act_out_index == last_index
            self.act_out_index += 1
            self.act_out_address += out_bytes
        self.act_write_valid = write_valid
        if advance:
            self.act_pipe = [vector_last if take else None] + self.act_pipe[:-1]
        if retire:
            self.act_state = "IDLE"



def simulate(config, hbm, programs, *, latency=0, max_cycles=None, trace=None):
    """The performance counters of a run of the streams at byte addresses ``programs``
    (DMA, tensor, activation) in the HBM image ``hbm``, as the RTL's counters would read
    after it (docs/registers.md): ``{name: int}`` for :data:`COUNTERS`. ``latency``: the
    HBM's fixed latency in cycles (``opentrn.sim.core.run_programs(latency=(L, L))``).
    ``trace``: a list that receives one line of events per cycle (for debugging the model
    against a waveform)."""
    if not isinstance(latency, int) or latency < 0:
        raise ValueError(f"latency={latency!r}: must be a non-negative integer (cycles)")
    core = _Core(config, hbm, programs, latency)
    core.trace = trace
    limit = max_cycles or 1_000_000 + 200 * len(hbm)
    seqs = core.sequencers
    core.cycle = 1              # cycle 0 is the start pulse; the counters count from cycle 1
    stuck = 0
    while True:
        done = all(s.finished() for s in seqs)
        core.step()
        if done:
            return dict(core.counters)
        # The RTL's deadlock rule (hdl/core.py): every unfinished engine waits on a
        # semaphore and none has an instruction in flight.
        if (any(s.waiting for s in seqs)
                and all(s.waiting or s.finished() for s in seqs)
                and not any(s.retiring for s in seqs)):
            stuck += 1
            if stuck == 2:
                raise ModelError(f"deadlock at cycle {core.cycle}: every engine waits on a "
                                 "semaphore (the RTL faults with DEADLOCK)")
        else:
            stuck = 0
        if core.cycle > limit:
            raise ModelError(f"no end after {limit} cycles: the program waits forever "
                             "(a deadlock the RTL would report as a fault)")


def predict(program, *, latency=0):
    """The performance counters of :class:`~opentrn.kernel.Program` ``program`` on the core
    RTL of its configuration, with the testbench's HBM: a fixed ``latency`` (cycles, default
    0), no back-pressure. Random latencies and back-pressure only add cycles: the
    prediction with the smallest latency is then a lower bound (tests/test_sim_core.py)."""
    return simulate(program.config, program.hbm, program.programs, latency=latency)


_OUT_BYTES = {code: numerics.format_of_code(code).bytes for code in range(8)}


def upper_bound(config, hbm, programs, *, latency=0):
    """More cycles than a run of the streams at ``programs`` in ``hbm`` can take unless it
    hangs, from the instructions alone (decoded until each stream's ``END``, an unknown
    opcode or the image's end): every instruction of every stream in turn, as if no two
    overlapped, each at more than its cost on its own, after the start-up (fetch and
    issue; a DMA's bus words on both sides, a word more per row, a latency per burst; a
    matmul's or a load's columns plus the array's depth; an activation's vectors). The
    suite checks it against the RTL's cycles on every random kernel of
    tests/test_cycle_model.py. :func:`simulate` would give the
    exact count, at about the speed of the RTL itself (~10,000 cycles/s); this takes
    microseconds per instruction, so every RTL run's watchdog can use it
    (:func:`opentrn.sim.core.watchdog_cycles`)."""
    if not isinstance(latency, int) or latency < 0:
        raise ValueError(f"latency={latency!r}: must be a non-negative integer (cycles)")
    bus = config.dma_bus_bytes
    array = config.pe_rows + config.pe_cols + config.pe_multiply_stages
    # Fetch (a word in beats, the HBM's answer) and issue (assemble, check, hand over).
    issue = 2 * (isa.WORD_BYTES // min(bus, isa.WORD_BYTES)) + HBM_READ_CYCLES + latency + 8
    hbm = bytes(hbm)
    # Start-up: the sequencers fill their fetch buffers (two bursts) before the first
    # instruction; the interrupt follows the last retire.
    total = FETCH_BUFFER_BYTES // bus + 2 * (HBM_READ_CYCLES + latency) + 16
    for start in programs:
        offset = int(start)
        while True:
            try:
                opcode, f = isa.decode(hbm, offset)
            except isa.IsaError:
                break                   # off the image: the sequencer faults
            if not isinstance(opcode, isa.Opcode):
                break                   # an unknown opcode faults
            total += issue
            if opcode == isa.Opcode.END:
                break
            if opcode == isa.Opcode.DMA:
                rows = max(f["n1"], 1) * max(f["n2"], 1)
                row_words = -(-(f["n0"] << f["elem_log2"]) // bus) + 1
                bursts = rows * (row_words // (BOUNDARY_BYTES // bus) + 2)
                total += (2 * rows * row_words + bursts * (latency + HBM_READ_CYCLES
                                                            + HBM_WRITE_RESPONSE_CYCLES)
                          + DMA_READ_OVERHEAD + DMA_WRITE_OVERHEAD)
            elif opcode == isa.Opcode.LOAD_STATIONARY:
                total += f["cols"] + array
            elif opcode == isa.Opcode.MATMUL:
                total += f["n"] + array
            elif opcode == isa.Opcode.ACTIVATE:
                total += f["n"] + activate_overhead(config) + activation_stages(config)
            offset += isa.instruction_bytes(opcode)
    return total


# -- the fast path: the library GEMM's schedule, step by step --------------------------------

#: Cycles a descriptor costs beyond its bus words: queue to engine (1), check (1), the first
#: read answered (HBM_READ_CYCLES, or 1 from a buffer), into the realignment buffer and
#: written (1), the finish seen (1), FINISH (1), ``done`` (1); a write to HBM also waits for
#: its last response (HBM_WRITE_RESPONSE_CYCLES).
DMA_READ_OVERHEAD = 5 + HBM_READ_CYCLES
DMA_WRITE_OVERHEAD = 6 + HBM_WRITE_RESPONSE_CYCLES


def activate_overhead(config):
    """Cycles of an ACTIVATE beyond its vectors: hand-over to retire (docs/architecture.md:
    ``n + 7 + activation_input_stages``), and the cycle the next one is handed over in."""
    return 7 + config.activation_input_stages + 1


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


def dma_bytes_per_cycle(config):
    """The core's DMA bandwidth in bytes per cycle: ``dma_engines`` buses of
    ``dma_bus_bytes``, at most the core's share of the chip's HBM bandwidth."""
    return min(config.dma_engines * config.dma_bus_bytes,
               config.hbm_bytes_per_s / config.cores_per_chip / config.clock_hz)


def _words(start, length, width):
    """Bus words a run of ``length`` bytes from byte ``start`` touches."""
    return (start + length - 1) // width - start // width + 1


#: The most steps :func:`gemm` models (each a few numbers: about a second per 10**6).
MAX_GEMM_STEPS = 2_000_000


def gemm(config, m, k, n, *, dtype="int8"):
    """The cycles of ``opentrn.kernels.gemm`` (``C[m, n] = A[m, k] @ B[k, n]``, results in
    int32 or FP32, HBM to HBM) on one core, without building the program: the kernel's
    steps (docs/kernels.md, "The schedule") each cost the larger of the tensor engine's time
    and the DMA's time for the descriptors that overlap it (the next step's prefetch and
    the previous step's store), plus the first prefetch and the last step's drain,
    activation and store. For workloads too large for :func:`predict`; the tests bound its
    difference from :func:`predict` (docs/performance.md)."""
    from opentrn import kernels
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
    W = config.dma_bus_bytes
    word_cycles = W / dma_bytes_per_cycle(config)        # cycles per bus word moved
    out = 4                                              # int32 or FP32 results
    k_tiles, m_tiles = -(-k_rows // K), -(-m // P)
    width, kts, mb = kernels.schedule_shape(
        config, columns=n, k_tiles=k_tiles, m_tiles=m_tiles, moving_from_hbm=True,
        staging_out=out, fixed_bytes=0, resident_tiles=0, element=e, mx=mx)
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
    issue = beats_per_word + 2          # sequencer cycles per instruction (assemble, READY)

    def rows_in(k0, k1):
        """Rows of K tiles k0 .. k1 - 1 (the last tile may be partial)."""
        return min(k_rows, k1 * K) - k0 * K

    def dma(words, read=True):
        return (DMA_READ_OVERHEAD if read else DMA_WRITE_OVERHEAD) + words * word_cycles

    def tile_fetch(rows, k_count, cols):
        """Cycles of fetching ``cols`` columns of ``rows`` rows (``k_count`` K tiles), and
        of an MX format's scales (a row per block and K tile); counts the bytes."""
        nonlocal dma_bytes
        cost = dma(rows * _words(0, cols * e, W))
        dma_bytes += rows * cols * e
        if mx:
            blocks = numerics.mx_blocks(config)
            cost += dma(blocks * k_count * _words(0, cols, W))
            dma_bytes += blocks * k_count * cols
        return cost

    steps = []
    for n0 in range(0, n, width):
        w = min(width, n - n0)
        chunks = [min(chunk, w - c0) for c0 in range(0, w, chunk)]
        for mt in range(m_tiles):
            mrows = min(P, m - mt * P)
            for index, (k0, k1) in enumerate(parts):
                steps.append((n0, w, chunks, mt, mrows, k0, k1, index == len(parts) - 1))

    dma_bytes = 0
    dma_busy = 0.0
    tensor = []                 # tensor cycles of each step
    fetches = []                # DMA cycles of each step's prefetch
    stores = []                 # DMA cycles of each step's store (0 if none)
    acts = []                   # activation cycles of each step's epilogue
    fetch_beats = []            # cycles of the read channel the step's instructions take
    b_key = a_key = None
    for (n0, w, chunks, mt, mrows, k0, k1, last) in steps:
        full_rows = rows_in(k0, k1)
        cost = 0.0
        key = (n0, k0)
        if key != b_key:                 # the moving block of these K tiles
            b_key = key
            cost += tile_fetch(full_rows, k1 - k0, w)
        key = (n0, mt // mb, k0)
        if key != a_key:                 # the stationary tiles of mb M tiles
            a_key = key
            cost += tile_fetch(full_rows, k1 - k0, min(mb * P, m - (mt // mb) * mb * P))
        dma_busy += cost
        fetches.append(cost)
        # The streams' instruction fetches share the AXI read channel with the DMA's reads:
        # this step's loads, matmuls and activations, and its DMA instructions (two words).
        instructions = (k1 - k0) * (1 + len(chunks)) + (len(chunks) + 2 if last else 0)
        fetch_beats.append(instructions * beats_per_word * word_cycles)
        per_tile = max(sum(chunks), K + P, (1 + len(chunks)) * issue)
        tensor.append((k1 - k0) * per_tile)
        if last:
            store = dma(mrows * _words(0, w * out, W), read=False)
            stores.append(store)
            dma_busy += store
            dma_bytes += mrows * w * out
            acts.append(sum(c + activate_overhead(config) for c in chunks))
        else:
            stores.append(0)
            acts.append(0)

    # Overlap: step i computes while the DMA fetches step i + 1 and stores step i - 1, and the
    # activation engine drains step i - 1.
    count = len(steps)
    # At start each sequencer fetches two bursts ahead; the first data follows them.
    burst_beats = FETCH_BUFFER_BYTES // W // 2
    total = fetches[0] + 2 * len(Engine) * burst_beats * word_cycles + HBM_READ_CYCLES + issue
    for i in range(count):
        dma_side = ((fetches[i + 1] if i + 1 < count else 0) + (stores[i - 1] if i else 0)
                    + fetch_beats[i])
        act_side = acts[i - 1] if i else 0
        total += max(tensor[i], dma_side, act_side)
    drain = K + P - 1 + config.pe_multiply_stages + 2   # the last results into the PSUM
    total += drain + acts[-1] + stores[-1]
    vectors = sum(sum(s[2]) * (s[6] - s[5]) for s in steps)
    # The hardware counts rows x r x cols per vector: K rounded up to whole rows.
    return Estimate(m=m, k=k, n=n, dtype=dtype, cycles=round(total), tensor_busy=vectors,
                    dma_busy=round(dma_busy), activation_busy=sum(
                        sum(s[2]) for s in steps if s[7]),
                    macs=m * k_rows * rate * n, dma_bytes=dma_bytes, steps=count)
