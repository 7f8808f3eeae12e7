"""An engine's instruction sequencer: it fetches the engine's stream from HBM, checks each
instruction, waits on its semaphore, hands it to the engine's execution unit, and signals
semaphores as instructions complete (docs/isa.md)."""

from amaranth import Array, Cat, Module, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from opentrn.isa import ENGINE_OPCODES, WORD_BYTES, Engine, Fault, Opcode, layout

from .axi4 import BOUNDARY_BYTES, BURST_INCR, RESP_OKAY, AXI4ReadSignature
from .semaphores import INDEX_BITS, VALUE_BITS

__all__ = ["Sequencer", "unit_layout", "FETCH_BUFFER_BYTES", "RETIRE_DEPTH", "POINTER_BITS",
           "fetch_unit"]

#: The instruction prefetch buffer: 8 single-word instructions.
FETCH_BUFFER_BYTES = 8 * WORD_BYTES
#: Instructions handed to the unit (or NOP / END) and not yet complete.
RETIRE_DEPTH = 16
#: Width of a program pointer and of an instruction address.
POINTER_BITS = 64


def fetch_unit(config):
    """Bytes the instruction assembly takes per cycle: one bus beat, or one instruction
    word of a beat wider than a word."""
    return min(config.dma_bus_bytes, WORD_BYTES)


def unit_layout(engine):
    """The layout of the instructions an engine's unit receives: its longest format."""
    return {Engine.DMA: layout(Opcode.DMA), Engine.TENSOR: layout(Opcode.MATMUL),
            Engine.ACTIVATION: layout(Opcode.ACTIVATE)}[Engine(engine)]


class Sequencer(wiring.Component):
    """The sequencer of engine ``engine`` (:class:`~opentrn.isa.Engine`).

    Fetch: from ``start`` on, AXI4 INCR bursts read the stream ahead into a buffer of
    ``FETCH_BUFFER_BYTES`` (a burst is issued only when the buffer has room for all of it, so
    ``rready`` is always high; bursts stay inside 4 KiB blocks, which also keeps them inside
    HBM), from the program pointer rounded down to a beat. Fetching stops at ``END`` or a
    fault; ``quiet`` tells when no burst is in flight.

    Assembly takes :func:`fetch_unit` bytes per cycle from the buffer: a beat of a bus of up
    to 32 bytes (one instruction word), else one word of the beat, starting at the pointer's
    word within its first beat; a beat leaves the buffer with its last word.

    Each instruction, once all its bytes are in, is checked (opcode, semaphore indices, then
    the unit's ``fault``) in that cycle, the verdict registered for the next (a faulting
    instruction faults there), then waits until ``semaphores[wait_sem] >= wait_value``,
    then goes to the unit (``NOP`` and ``END`` need none). An entry per instruction in a
    retire queue keeps program order: ``retire`` pulses of the unit complete the oldest unit
    instruction, ``NOP``/``END`` complete when they reach the head; a completing instruction
    with ``signal`` increments its semaphore.

    A fault (``error``, with ``error_code`` and ``error_pc``) stops the sequencer until the
    next ``start``; ``halt`` (a fault elsewhere in the core) stops it from handing anything
    more to the unit.

    Members
    -------
    start : ``In(1)``
        Begin fetching at ``program`` (the core pulses it only while idle).
    program : ``In(POINTER_BITS)``
        The stream's byte address in HBM, sampled at ``start``.
    halt : ``In(1)``
        Stop issuing.
    fetch : ``Out(AXI4ReadSignature(addr_width=hbm_addr_bits, data_width=8 * dma_bus_bytes))``
        The instruction fetch port.
    semaphores : ``In(data.ArrayLayout(VALUE_BITS, config.semaphores))``
        The semaphore values.
    signals : ``In(data.StructLayout({"valid": 1, "index": INDEX_BITS})).array(3)``
        Every stream's semaphore increment in this cycle (this sequencer's ``signal``
        among them), which ``semaphores`` shows from the next: the wait's verdict is made
        a cycle ahead, from both.
    signal : ``Out(data.StructLayout({"valid": 1, "index": INDEX_BITS}))``
        A semaphore increment (one cycle).
    instruction : ``Out(stream.Signature(unit_layout(engine)))``
        Checked instructions for the unit.
    check : ``Out(unit_layout(engine))``, ``check_valid`` : ``Out(1)``
        The instruction being assembled, and high in the cycle it is complete (the check
        cycle); ``fault`` : ``In(3)`` the unit's verdict on it, combinational.
    retire : ``In(1)``
        The unit completed its oldest instruction.
    finished : ``Out(1)``
        ``END`` completed and no fetch is in flight.
    waiting : ``Out(1)``
        A checked instruction waits for its semaphore.
    pending : ``Out(1)``
        Instructions handed out have not completed.
    quiet : ``Out(1)``
        No fetch burst in flight.
    error : ``Out(1)``, ``error_code`` : ``Out(3)``, ``error_pc`` : ``Out(POINTER_BITS)``
        This sequencer faulted (held until ``start``).
    pc : ``Out(POINTER_BITS)``
        The address of the instruction being fetched, checked or waiting.
    retire_pc : ``Out(POINTER_BITS)``
        The address of the oldest incomplete instruction.
    """

    def __init__(self, *, config, engine):
        self._config = config
        self._engine = Engine(engine)
        self._layout = unit_layout(engine)
        super().__init__({
            "start": In(1), "program": In(POINTER_BITS), "halt": In(1),
            "fetch": Out(AXI4ReadSignature(addr_width=config.hbm_addr_bits,
                                           data_width=8 * config.dma_bus_bytes)),
            "semaphores": In(data.ArrayLayout(VALUE_BITS, config.semaphores)),
            "signals": In(data.StructLayout({"valid": 1, "index": INDEX_BITS}))
            .array(len(Engine)),
            "signal": Out(data.StructLayout({"valid": 1, "index": INDEX_BITS})),
            "instruction": Out(stream.Signature(self._layout)),
            "check": Out(self._layout), "check_valid": Out(1), "fault": In(3),
            "retire": In(1),
            "finished": Out(1), "waiting": Out(1), "pending": Out(1), "quiet": Out(1),
            "error": Out(1), "error_code": Out(3), "error_pc": Out(POINTER_BITS),
            "pc": Out(POINTER_BITS), "retire_pc": Out(POINTER_BITS),
        })

    def elaborate(self, platform):
        cfg = self._config
        engine = self._engine
        bus_bytes = cfg.dma_bus_bytes
        unit = fetch_unit(cfg)
        units_per_word = WORD_BYTES // unit
        units_per_beat = bus_bytes // unit
        buffer_beats = FETCH_BUFFER_BYTES // bus_bytes
        burst_beats = buffer_beats // 2
        assert burst_beats >= 1, "Config keeps dma_bus_bytes <= FETCH_BUFFER_BYTES / 2"
        max_words = self._layout.size // (8 * WORD_BYTES)
        m = Module()

        # -- fetch ------------------------------------------------------------------------
        fetching = Signal()                 # issue bursts
        fetch_addr = Signal(POINTER_BITS)
        in_flight = Signal(range(buffer_beats + 1))
        flush = Signal()
        m.submodules.buffer = buffer = ResetInserter(flush)(
            fifo.SyncFIFO(width=8 * bus_bytes + 1, depth=buffer_beats))
        port = self.fetch
        # First beat of the burst within its aligned block of burst_beats beats (blocks
        # divide 4 KiB, so no burst crosses a 4 KiB boundary).
        beat_in_block = fetch_addr[exact_log2(bus_bytes):
                                   exact_log2(bus_bytes * burst_beats)]
        length = Signal(range(burst_beats + 1))
        m.d.comb += length.eq(burst_beats - beat_in_block)
        room = Signal()
        m.d.comb += room.eq(buffer.level + in_flight + burst_beats <= buffer_beats)
        assert BOUNDARY_BYTES % (bus_bytes * burst_beats) == 0
        # AR: a registered request, held until taken.
        ar_valid = Signal()
        ar_addr = Signal(cfg.hbm_addr_bits)
        ar_len = Signal(8)
        take_ar = ar_valid & port.arready
        m.d.comb += [
            port.arvalid.eq(ar_valid), port.araddr.eq(ar_addr), port.arlen.eq(ar_len),
            port.arsize.eq(exact_log2(bus_bytes)), port.arburst.eq(BURST_INCR),
            port.arid.eq(0), port.rready.eq(1),
        ]
        beat = port.rvalid & port.rready
        issued = Signal(range(burst_beats + 1))
        with m.If(take_ar):
            m.d.sync += ar_valid.eq(0)
        # Halted (a fault elsewhere): no new burst, so the core can go idle and stay idle.
        with m.If(~ar_valid & fetching & ~self.halt & room & (fetch_addr < cfg.hbm_bytes)):
            m.d.sync += [
                ar_valid.eq(1), ar_addr.eq(fetch_addr), ar_len.eq(length - 1),
                fetch_addr.eq(fetch_addr + length * bus_bytes),
            ]
            m.d.comb += issued.eq(length)
        m.d.sync += in_flight.eq(in_flight + issued - beat)
        m.d.comb += [
            buffer.w_en.eq(beat),
            buffer.w_data.eq(Cat(port.rdata, port.rresp != RESP_OKAY)),
            self.quiet.eq((in_flight == 0) & ~ar_valid),
        ]

        # -- instruction assembly and checks -----------------------------------------------
        word = Signal(self._layout)
        word_bits = word.as_value()
        have = Signal(range(max_words * units_per_word + 1))     # units assembled
        # The unit of the buffer's head beat that assembly takes next.
        slot = Signal(range(max(units_per_beat, 2)))
        bad_beat = Signal()
        pc = Signal(POINTER_BITS)
        m.d.comb += [self.pc.eq(pc), self.check.eq(word)]

        opcode = word_bits[:8]
        header = data.View(layout(Opcode.NOP), word_bits[:8 * WORD_BYTES])
        is_long = Signal()
        if engine == Engine.DMA:
            m.d.comb += is_long.eq(opcode == Opcode.DMA)
        complete = Signal()
        m.d.comb += complete.eq(
            (have == 2 * units_per_word) | ((have == units_per_word) & ~is_long))
        legal = Signal()
        m.d.comb += legal.eq(sum(opcode == op for op in ENGINE_OPCODES[engine]) != 0)
        is_unit = Signal()
        m.d.comb += is_unit.eq((opcode != Opcode.END) & (opcode != Opcode.NOP))
        semaphores = cfg.semaphores
        bad_sem = Signal()
        m.d.comb += bad_sem.eq((header.wait & (header.wait_sem >= semaphores)) |
                               (header.signal & (header.signal_sem >= semaphores)))
        # The check is made in the cycle the instruction's last bytes are in (FETCH with
        # ``complete``) and registered for READY: its adders and compares (the unit's field
        # rules) then stay out of READY's issue, halt and start paths, which cross the core.
        # The verdict cannot go stale: a unit's rules read only the instruction, the
        # configuration and what the unit accepted, and it accepts only in READY.
        check_code = Signal(3)
        checked_code = Signal(3)
        with m.If(~legal):
            m.d.comb += check_code.eq(Fault.ILLEGAL_OPCODE)
        with m.Elif(bad_sem):
            m.d.comb += check_code.eq(Fault.BAD_FIELD)
        with m.Elif(is_unit):
            m.d.comb += check_code.eq(self.fault)
        # The wait's verdict is registered: READY's issue, which hands the instruction over
        # and enables the unit's registers, then starts from a flip-flop. It is made for the
        # semaphore's value in the next cycle, this one's plus this cycle's increments of it
        # (one per stream at most), so the timing is as if compared in that cycle: each
        # possible sum is compared from registers, and the increments' valids, which come
        # late (from the units' completions through the retire queues), only choose.
        value = Signal(VALUE_BITS)
        m.d.comb += value.eq(self.semaphores[header.wait_sem[:max(1, ceil_log2(semaphores))]])
        reached = []
        for gain in range(len(self.signals) + 1):
            verdict = Signal(name=f"reached_with_{gain}")
            with m.If(header.wait):     # a process on the simulators (the word changes often)
                m.d.comb += verdict.eq((value + gain)[:VALUE_BITS] >= header.wait_value)
            reached.append(verdict)
        hits = [signal.valid & (signal.index == header.wait_sem) for signal in self.signals]
        wait_ok = Signal()
        m.d.sync += wait_ok.eq(~header.wait | Array(reached)[sum(hits)])

        # -- retire queue --------------------------------------------------------------------
        entry = data.StructLayout({"self_retiring": 1, "signal": 1, "index": INDEX_BITS,
                                   "pc": POINTER_BITS})
        m.submodules.retiring = retiring = ResetInserter(flush)(
            fifo.SyncFIFO(width=entry.size, depth=RETIRE_DEPTH))
        head = data.View(entry, retiring.r_data)
        unit_done = Signal(range(RETIRE_DEPTH + 1))      # unit completions not yet matched
        available = Signal(range(RETIRE_DEPTH + 2))
        m.d.comb += available.eq(unit_done + self.retire)
        pop = Signal()
        m.d.comb += [
            pop.eq(retiring.r_rdy & (head.self_retiring | (available != 0))),
            retiring.r_en.eq(pop),
            self.signal.valid.eq(pop & head.signal),
            self.signal.index.eq(head.index),
            self.pending.eq(retiring.r_rdy),
            self.retire_pc.eq(head.pc),
        ]
        m.d.sync += unit_done.eq(available - (pop & ~head.self_retiring))
        push = Signal()
        new_entry = Signal(entry)
        m.d.comb += [
            new_entry.self_retiring.eq(~is_unit), new_entry.signal.eq(header.signal),
            new_entry.index.eq(header.signal_sem), new_entry.pc.eq(pc),
            retiring.w_en.eq(push), retiring.w_data.eq(new_entry),
        ]

        # -- control ---------------------------------------------------------------------
        ended = Signal()
        m.d.comb += self.finished.eq(ended & ~retiring.r_rdy & self.quiet)
        length_bytes = Signal(range(2 * WORD_BYTES + 1))
        m.d.comb += length_bytes.eq(WORD_BYTES << is_long)

        def fault(code):
            m.d.sync += [self.error.eq(1), self.error_code.eq(code),
                         self.error_pc.eq(pc), fetching.eq(0)]
            m.next = "FAULT"

        beat_bits = exact_log2(bus_bytes)

        def begin():
            # Bursts fetch whole beats: from the pointer's beat, assembly from its unit.
            m.d.sync += [pc.eq(self.program), have.eq(0), bad_beat.eq(0),
                         fetch_addr.eq(self.program >> beat_bits << beat_bits), ended.eq(0),
                         self.error.eq(0), self.error_code.eq(0)]
            if units_per_beat > 1:
                m.d.sync += slot.eq(self.program[exact_log2(unit):beat_bits])
            with m.If(self.program[:exact_log2(WORD_BYTES)] != 0):
                m.d.sync += [self.error.eq(1), self.error_code.eq(Fault.FETCH_ERROR),
                             self.error_pc.eq(self.program)]
                m.next = "FAULT"
            with m.Else():
                m.d.sync += fetching.eq(1)
                m.next = "FETCH"

        def restart_if_started():
            # A sequencer halted mid-stream by a fault elsewhere begins again at the next run
            # (the core starts one only when nothing is in flight). Last in the state, so
            # that its assignments win.
            with m.If(self.start):
                begin()

        m.d.comb += flush.eq(self.start)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    begin()
            with m.State("FETCH"):
                with m.If(complete):
                    with m.If(bad_beat):
                        fault(Fault.FETCH_ERROR)
                    with m.Else():
                        m.d.comb += self.check_valid.eq(1)
                        m.d.sync += checked_code.eq(check_code)
                        m.next = "READY"
                with m.Elif(pc + have * unit >= cfg.hbm_bytes):
                    fault(Fault.FETCH_ERROR)
                with m.Elif(buffer.r_rdy):
                    beat_data = buffer.r_data[:8 * bus_bytes]
                    m.d.sync += [
                        bad_beat.eq(bad_beat | buffer.r_data[-1]),
                        have.eq(have + 1),
                    ]
                    if units_per_beat == 1:
                        m.d.comb += buffer.r_en.eq(1)
                        m.d.sync += word_bits.word_select(have, 8 * unit).eq(beat_data)
                    else:
                        # The beat leaves the buffer with its last unit.
                        m.d.comb += buffer.r_en.eq(slot == units_per_beat - 1)
                        m.d.sync += [
                            word_bits.word_select(have, 8 * unit).eq(
                                beat_data.word_select(slot, 8 * unit)),
                            slot.eq(slot + 1),          # wraps with the beat
                        ]
                restart_if_started()
            with m.State("READY"):
                with m.If(checked_code != 0):
                    fault(checked_code)
                with m.Elif(~wait_ok):
                    # Not gated by halt: the deadlock fault names the waiting engine in the
                    # cycle it halts everything.
                    m.d.comb += self.waiting.eq(1)
                with m.Elif(~self.halt & retiring.w_rdy):
                    with m.If(is_unit):
                        m.d.comb += self.instruction.valid.eq(1)
                        with m.If(self.instruction.ready):
                            m.d.comb += push.eq(1)
                            m.d.sync += [pc.eq(pc + length_bytes), have.eq(0)]
                            m.next = "FETCH"
                    with m.Else():
                        m.d.comb += push.eq(1)
                        m.d.sync += [pc.eq(pc + length_bytes), have.eq(0)]
                        with m.If(opcode == Opcode.END):
                            m.d.sync += [ended.eq(1), fetching.eq(0)]
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "FETCH"
                restart_if_started()
            with m.State("FAULT"):
                with m.If(self.start):
                    begin()
        m.d.comb += self.instruction.payload.eq(word)
        return m
