"""hdl/core.py: the whole core, one :meth:`_Core.step` per clock cycle, and the runs of
programs on it."""



from opentrn import isa, timeline
from opentrn.golden import psum, tensor_engine
from opentrn.hdl.activation_engine import stages as activation_stages
from opentrn.hdl.activation_unit import WRITE_SLOTS
from opentrn.hdl.axi4 import BOUNDARY_BYTES
from opentrn.hdl.core import COUNTERS as CORE_COUNTERS
from opentrn.hdl.dma import MAX_OUTSTANDING
from opentrn.hdl.dma import QUEUE_DEPTH as DMA_QUEUE_DEPTH
from opentrn.hdl.dma_unit import IN_FLIGHT as DMA_SIZES_DEPTH
from opentrn.hdl.sequencer import FETCH_BUFFER_BYTES, RETIRE_DEPTH
from opentrn.isa import Engine, Opcode

from .activation_unit import _OUT_BYTES, _ActivationUnitModel, activate_overhead
from .axi4_memory import HBM_READ_CYCLES, HBM_WRITE_RESPONSE_CYCLES, _Hbm
from .dma import (
    _HBM,
    _PSUM,
    _SBUF,
    DMA_FIFO_LATENCY,
    DMA_READ_OVERHEAD,
    DMA_WRITE_OVERHEAD,
    _DmaEngine,
    _DmaModel,
)
from .errors import ModelError
from .partitioned_memory import _RoundRobin
from .sequencer import _FETCH, _IDLE, _READY, _Sequencer, _stream
from .tensor_unit import _TensorUnitModel

#: The counters the model predicts: all of the core's (docs/registers.md), in their order.
COUNTERS = CORE_COUNTERS


class _Core(_TensorUnitModel, _ActivationUnitModel, _DmaModel):
    """The whole model: one :meth:`step` per clock cycle."""

    def __init__(self, config, hbm, programs, latency=0):
        self.config = config
        self.cycle = 0
        self.trace = None
        self.timeline = None            # a timeline.Recorder
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
                       and self.act_level + len(self.act_arrivals) < self.act_slots)
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
            [bool(self.act_writes), dma_have and dst_space == _SBUF])
        psum_dma_write = dma_have and dst_space == _PSUM and self._psum_write_free()
        ar = self.ar.grant([dma_arvalid, seqs[0].ar_valid, seqs[1].ar_valid, seqs[2].ar_valid])

        # ---- HBM channels ----------------------------------------------------------------
        beats = self.hbm.beats          # it presents its oldest beat once that beat's cycle comes
        beat = beats[0] if beats and beats[0][0] <= cycle else None
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
        ar_beats = 0
        if ar >= 0:
            ar_beats = dma.src_issue.burst_words() if ar == 0 else seqs[ar - 1].ar_len
            self.hbm.read_burst(cycle, ar, ar_beats)

        # ---- units' retire signals and hand-over ready ------------------------------------
        dma_retire = dma.done
        head_is_load = self.order[0] if self.order else None
        te_retire = head_is_load is not None and (
            self.loads_done != 0 if head_is_load else self.matmuls_done != 0)
        act_write = bool(self.act_writes) and sbuf_write == 0
        act_retire = act_write and self.act_writes[0]
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
                current = s.instructions[s.index]
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
        # stationary
        load_take = False
        if loads.queue:
            job = loads.queue[0]
            in_data = loads.col < job["count"]
            scale_ready = (not job["mx"]) or self.scales["load"].word_ready()
            valid = (not in_data) or (loads.word_ready() and scale_ready)
            if valid and self._load_ready(cycle):
                load_take = True
        # moving
        mm_take = False
        if matmuls.queue:
            job = matmuls.queue[0]
            first = matmuls.col == 0
            scale_ready = (not job["mx"]) or self.scales["matmul"].stored != 0
            valid = (matmuls.stored != 0 and scale_ready
                     and (not first or self.results_fifo < self.latency + 1)
                     and not self._psum_hazard(job, matmuls.col))
            swap = first and job["swap"]
            ready = (swap and self.pending != 0) or (not swap and self.active_valid)
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
            vector = self.act_vector_word
            position = self.act_out_address & (vector - 1)
            complete = (position + out_bytes == vector) or self.act_out_index == last_index
            result_ready = (not complete) or len(self.act_writes) < WRITE_SLOTS
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
                events.append(f"AR id{ar} len{ar_beats}")
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
        if self.timeline is not None:
            self.timeline.cycle(
                cycle,
                issued=[(engine, s.push.opcode.name, s.push.pc)
                        for engine, s in enumerate(seqs) if s.push is not None],
                retired=[engine for engine, s in enumerate(seqs) if s.pop],
                waiting=[(engine, s.current().fields["wait_sem"],
                          s.current().fields["wait_value"])
                         for engine, s in enumerate(seqs) if s.waiting],
                busy=[name for name, busy in zip(timeline.ENGINES,
                                                 (dma.busy, mm_take, act_take), strict=True)
                      if busy],
                read=(ar, ar_beats) if ar >= 0 else None,
                read_last=r_manager if r_taken and r_last else None,
                write=dma.dst_issue.burst_words() if dma_aw_sent else None,
                write_response=b_taken)

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


def simulate(config, hbm, programs, *, latency=0, max_cycles=None, trace=None,
             recorder=None):
    """The performance counters of a run of the streams at byte addresses ``programs``
    (DMA, tensor, activation) in the HBM image ``hbm``, as the RTL's counters would read
    after it (docs/registers.md): ``{name: int}`` for :data:`COUNTERS`. ``latency``: the
    HBM's fixed latency in cycles (``opentrn.sim.core.run_programs(latency=(L, L))``).
    ``trace``: a list that receives one line of events per cycle (for debugging the model
    against a waveform). ``recorder``: a :class:`opentrn.timeline.Recorder` fed every
    cycle (:func:`predict_timeline`)."""
    if not isinstance(latency, int) or latency < 0:
        raise ValueError(f"latency={latency!r}: must be a non-negative integer (cycles)")
    core = _Core(config, hbm, programs, latency)
    core.trace = trace
    core.timeline = recorder
    limit = max_cycles or 1_000_000 + 200 * len(hbm)
    seqs = core.sequencers
    core.cycle = 1              # cycle 0 is the start pulse; the counters count from cycle 1
    stuck = 0
    first, second, third = seqs
    step = core.step
    while True:
        done = (first.ended and second.ended and third.ended
                and first.finished() and second.finished() and third.finished())
        step()
        if done:
            return dict(core.counters)
        # The RTL's deadlock rule (hdl/core.py): every unfinished engine waits on a
        # semaphore and none has an instruction in flight.
        if ((first.waiting or second.waiting or third.waiting)
                and not (first.retiring or second.retiring or third.retiring)
                and (first.waiting or first.finished())
                and (second.waiting or second.finished())
                and (third.waiting or third.finished())):
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


def predict_timeline(program, *, latency=0):
    """:func:`predict`'s counters and the :class:`~opentrn.timeline.Timeline` of the run:
    the same events, cycle for cycle, as the RTL's (``run_programs(..., timeline=True)``)."""
    recorder = timeline.Recorder()
    counters = simulate(program.config, program.hbm, program.programs, latency=latency,
                        recorder=recorder)
    return counters, recorder.finish(counters["cycles"])


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
    array = tensor_engine.latency(config) + psum.write_cycles(config) - 1
    # Fetch (a word in beats, the HBM's answer) and issue (assemble, check, hand over).
    issue = 2 * (isa.WORD_BYTES // min(bus, isa.WORD_BYTES)) + HBM_READ_CYCLES + latency + 8
    hbm = bytes(hbm)
    # Start-up: the sequencers fill their fetch buffers (two bursts each, one after another
    # on the HBM's read channel) before the first instruction; the interrupt follows the
    # last retire.
    total = len(programs) * FETCH_BUFFER_BYTES // bus + 2 * (HBM_READ_CYCLES + latency) + 16
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
                # With psum_add_stages its first vectors may wait that long for the PSUM.
                total += f["n"] + array + config.psum_add_stages
            elif opcode == isa.Opcode.ACTIVATE:
                total += f["n"] + activate_overhead(config) + activation_stages(config)
            offset += isa.instruction_bytes(opcode)
    return total
