"""Sequencer on Amaranth's simulator, against a Python AXI4 read subordinate (random latency
and R gaps, SLVERR on chosen beats, every AR checked against the AXI4 rules and the HBM
size) and a unit model (random ready, in-order retires after random delays, a fault verdict
from the instruction's bits).

Every cycle is checked exactly against a Python model of the documented behaviour: which
instruction is offered to the unit, ``waiting``, the retire queue's completions and
``signal`` pulses, ``pending``, ``retire_pc``, ``quiet``, ``finished``, ``error``; each run
ends against an instruction-level reference of the stream (what reaches the unit, in order,
and the fault code and address)."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator
from amaranth.utils import exact_log2

from opentrn import config, isa
from opentrn.hdl.axi4 import BOUNDARY_BYTES, BURST_INCR, RESP_OKAY, RESP_SLVERR
from opentrn.hdl.semaphores import VALUE_BITS
from opentrn.hdl.sequencer import RETIRE_DEPTH, Sequencer

Engine, Opcode, Fault = isa.Engine, isa.Opcode, isa.Fault
WORD = isa.WORD_BYTES
TINY = config.preset("tiny")
#: A small HBM (not a power of two) so that streams reach its end and cross 4 KiB cheaply.
HBM12K = TINY.replace(hbm_bytes=3 * BOUNDARY_BYTES)
#: The unit model's fault verdict is in reserved header bits 12:10 (the sequencer ignores
#: reserved bits, so the test can mark any instruction, NOP and END too).
VERDICT_LSB = 10
VALUE_MASK = (1 << VALUE_BITS) - 1
#: A unit instruction of each engine.
UNIT_OPCODES = {engine: [op for op in isa.ENGINE_OPCODES[engine]
                         if op not in (Opcode.END, Opcode.NOP)] for engine in Engine}


def _verdict(bits):
    return (bits >> VERDICT_LSB) & 7


def _size(engine, opcode):
    return 2 * WORD if engine == Engine.DMA and opcode == Opcode.DMA else WORD


def _header(bits):
    f = {field.name: (bits >> field.lsb) & ((1 << field.width) - 1)
         for field in isa.fields(Opcode.NOP)}
    return f


def _check(cfg, engine, bits):
    """The fault code of a fully fetched instruction (docs/isa.md, "Errors"), with the
    unit model's verdict for unit instructions."""
    opcode = bits & 0xFF
    if opcode not in isa.ENGINE_OPCODES[engine]:
        return Fault.ILLEGAL_OPCODE
    h = _header(bits)
    if (h["wait"] and h["wait_sem"] >= cfg.semaphores) or \
            (h["signal"] and h["signal_sem"] >= cfg.semaphores):
        return Fault.BAD_FIELD
    if opcode not in (Opcode.END, Opcode.NOP):
        return _verdict(bits)
    return Fault.NONE


def _touches(bad, pc, size, bus):
    """Bytes ``pc .. pc + size - 1`` are in a beat (``bus`` bytes, aligned) of ``bad``."""
    return any(beat in bad for beat in range(pc - pc % bus, pc + size, bus))


def _reference(cfg, engine, image, pointer, bad):
    """The stream at ``pointer`` as the sequencer must run it: ``([(pc, opcode, bits)]
    handed out in order, outcome)``, outcome ``None`` (finished at END) or ``(code, pc)``.
    ``bad``: byte addresses of the beats answered SLVERR."""
    bus = cfg.dma_bus_bytes
    pushed = []
    if pointer % WORD:
        return pushed, (Fault.FETCH_ERROR, pointer)
    pc = pointer
    while True:
        if pc + WORD > cfg.hbm_bytes or _touches(bad, pc, WORD, bus):
            return pushed, (Fault.FETCH_ERROR, pc)
        opcode = image[pc]
        size = _size(engine, opcode)
        if pc + size > cfg.hbm_bytes or _touches(bad, pc, size, bus):
            return pushed, (Fault.FETCH_ERROR, pc)
        bits = int.from_bytes(image[pc:pc + size], "little")
        code = _check(cfg, engine, bits)
        if code:
            return pushed, (code, pc)
        pushed.append((pc, opcode, bits))
        if opcode == Opcode.END:
            return pushed, None
        pc += size


def _random_fields(rng, opcode):
    values = {}
    for f in isa.FORMATS[opcode]:
        if f.signed:
            values[f.name] = rng.randrange(-(1 << (f.width - 1)), 1 << (f.width - 1))
        else:
            values[f.name] = rng.randrange(1 << f.width)
    return values


def _instruction(rng, cfg, engine, opcode, *, base, waits=True, reach=6, verdict=0,
                 **header):
    """The bytes of one instruction: random operands, a random signal and wait (a wait for
    a value less than ``reach`` above the semaphore's base), and disabled header fields
    with random junk that must be ignored."""
    values = _random_fields(rng, opcode)
    if rng.random() < 0.5:
        values["signal_sem"] = rng.randrange(cfg.semaphores)
    else:
        values.update(signal=0, signal_sem=rng.randrange(256))
    if waits and rng.random() < 0.4:
        sem = rng.randrange(cfg.semaphores)
        values.update(wait_sem=sem, wait_value=base[sem] + rng.randrange(reach))
    else:
        values.update(wait=0, wait_sem=rng.randrange(256), wait_value=rng.randrange(1 << 32))
    for name in ("wait", "signal"):
        if f"{name}_sem" in header:
            header.setdefault(name, 1)
    values.update(header)
    word = int.from_bytes(isa.encode(opcode, **values), "little")
    word |= verdict << VERDICT_LSB
    return word.to_bytes(isa.instruction_bytes(opcode), "little")


def _program(rng, cfg, engine, count, *, base, end=True, marked_nops=True, waits=True,
             reach=6):
    """``count`` random NOP / unit instructions, then END. NOPs (and END) may carry a unit
    fault verdict, which the sequencer must ignore for them."""
    out = bytearray()
    for _ in range(count):
        if rng.random() < 0.3:
            opcode = Opcode.NOP
        else:
            opcode = rng.choice(UNIT_OPCODES[engine])
        verdict = rng.randrange(1, 8) if opcode == Opcode.NOP and marked_nops \
            and rng.random() < 0.3 else 0
        out += _instruction(rng, cfg, engine, opcode, base=base, verdict=verdict, waits=waits,
                            reach=reach)
    if end:
        out += _instruction(rng, cfg, engine, Opcode.END, base=base, waits=waits, reach=reach,
                            verdict=rng.randrange(8) if marked_nops else 0)
    return out


def _image(rng, cfg, pieces):
    """A random HBM image (``hbm_bytes``) with ``pieces`` ``{address: bytes}`` in it."""
    image = bytearray(rng.randbytes(cfg.hbm_bytes))
    for address, blob in pieces.items():
        image[address:address + len(blob)] = blob
    return image


def _bases(rng, cfg):
    """Semaphore start values: some near the top of the unsigned 32-bit range, so that a
    signed comparison would fail."""
    return [rng.choice([0, rng.randrange(1000), (1 << 31) - 3, (1 << 32) - 2000])
            for _ in range(cfg.semaphores)]


class _Hbm:
    """An AXI4 read subordinate with one ID: bursts answered in order from ``image`` after
    a random latency, beats with random gaps, SLVERR (and garbage data) on the beats at the
    byte addresses in ``bad``. Checks every AR."""

    def __init__(self, cfg, image, rng, *, bad, arready, latency, gap):
        self.cfg, self.image, self.rng, self.bad = cfg, image, rng, bad
        self.p_arready, self.latency, self.gap = arready, latency, gap
        self.bus = cfg.dma_bus_bytes
        self.bursts = deque()          # [ready cycle, address, beats left]
        self.beat = None               # (data, resp, last) on R
        self.held_ar = None            # AR payload presented without a handshake
        self.outstanding = 0           # beats of accepted bursts not yet transferred
        self.next_addr = None          # the stream is fetched contiguously from its pointer
        self.ars = 0
        self.errors = 0                # SLVERR beats answered
        self.last_new_ar = None

    def drive(self, ctx, port, cycle):
        self.arready = self.rng.random() < self.p_arready
        ctx.set(port.arready, self.arready)
        if self.beat is None and self.bursts and self.bursts[0][0] <= cycle \
                and self.rng.random() >= self.gap:
            _, address, left = self.bursts[0]
            if address in self.bad:
                data, resp = self.rng.getrandbits(8 * self.bus), RESP_SLVERR
                self.errors += 1
            else:
                data = int.from_bytes(self.image[address:address + self.bus], "little")
                resp = RESP_OKAY
            self.beat = (data, resp, left == 1)
        ctx.set(port.rvalid, self.beat is not None)
        if self.beat is not None:
            data, resp, last = self.beat
            ctx.set(port.rdata, data)
            ctx.set(port.rresp, resp)
            ctx.set(port.rlast, last)
        ctx.set(port.rid, 0)

    def quiet(self, ctx, port):
        return not ctx.get(port.arvalid) and self.outstanding == 0

    def sample(self, ctx, port, cycle):
        cfg, bus = self.cfg, self.bus
        if ctx.get(port.arvalid):
            ar = tuple(ctx.get(getattr(port, name))
                       for name in ("araddr", "arlen", "arsize", "arburst", "arid"))
            if self.held_ar is not None:
                assert ar == self.held_ar, (cycle, "AR payload changed while waiting")
            else:
                self.last_new_ar = cycle
                address, length, size, burst, _ = ar
                beats = length + 1
                assert burst == BURST_INCR and size == exact_log2(bus), (cycle, ar)
                assert address % bus == 0, (cycle, ar)
                assert address // BOUNDARY_BYTES == \
                    (address + beats * bus - 1) // BOUNDARY_BYTES, (cycle, "crosses 4 KiB", ar)
                assert address + beats * bus <= cfg.hbm_bytes, (cycle, "past HBM", ar)
                assert address == self.next_addr, (cycle, ar, self.next_addr)
                self.next_addr = address + beats * bus
            if self.arready:
                address, length = ar[0], ar[1]
                lo, hi = self.latency
                self.bursts.append([cycle + self.rng.randint(lo, hi), address, length + 1])
                self.outstanding += length + 1
                self.held_ar = None
                self.ars += 1
            else:
                self.held_ar = ar
        else:
            assert self.held_ar is None, (cycle, "arvalid dropped before arready")
        assert ctx.get(port.rready), (cycle, "rready low: the fetch buffer overflowed")
        if self.beat is not None:
            self.beat = None
            self.outstanding -= 1
            burst = self.bursts[0]
            burst[1] += bus
            burst[2] -= 1
            if burst[2] == 0:
                self.bursts.popleft()


def _run(cfg, engine, image, runs, *, seed, bad=frozenset(), ready=0.7, delay=(1, 8),
         arready=0.6, latency=(1, 10), gap=0.3, halt=None, sem_rate=0.05, bases=None,
         cycles=20000):
    """Run the streams at the pointers ``runs`` one after the other (each ``start`` once the
    previous run is over and the sequencer idle), check every cycle and each run's result
    against :func:`_reference`. ``halt(cycle)``: the halt input; a run that stays halted
    ends once it has drained. Returns statistics."""
    rng = random.Random(seed)
    dut = Sequencer(config=cfg, engine=engine)
    sems = cfg.semaphores
    base = list(bases) if bases is not None else [0] * sems
    hbm = _Hbm(cfg, image, rng, bad=bad, arready=arready, latency=latency, gap=gap)
    stats = {"waiting": 0, "back_to_back": 0, "halted": 0, "pushes": 0, "results": [],
             "signals": 0, "cycles": 0, "max_queue": 0}

    async def bench(ctx):
        port = dut.fetch
        own = [0] * sems                   # increments signalled so far
        bump = None                        # another stream's increment in this cycle
        queue = deque()                    # retire queue: (pc, unit, signal, index, is_end)
        unit_done = 0                      # unit retires not yet matched
        retires = deque()                  # cycles of the unit's future retire pulses
        last_retire = -1
        state = "gap"
        gap_left = rng.randrange(4)
        run = 0
        expected, outcome = None, None
        pushes, completions = [], []
        next_pc = None                     # pc expected in the next cycle
        ready_code = None                  # the verdict kept for READY (None: not in READY)
        error_due = None                   # (code, pc) expected from the next cycle on
        stopped = None                     # cycle from which no new AR may appear
        end_pushed = end_done = error_seen = False
        quiet_since = None
        tail = 0
        for cycle in range(cycles):
            # -- drive --------------------------------------------------------------------
            start = state == "gap" and gap_left == 0 and run < len(runs)
            ctx.set(dut.start, start)
            if start:
                ctx.set(dut.program, runs[run])
            halted = bool(halt(cycle)) if halt is not None else False
            ctx.set(dut.halt, halted)
            # Another stream's increment, drawn a cycle ahead: the sequencer is told this
            # cycle's increments (its wait's verdict is made for the next cycle's values).
            if bump is not None:
                base[bump] += 1
            bump = rng.randrange(sems) if rng.random() < sem_rate else None
            values = [(base[i] + own[i]) & VALUE_MASK for i in range(sems)]
            ctx.set(dut.semaphores.as_value(),
                    sum(v << (VALUE_BITS * i) for i, v in enumerate(values)))
            # The check cycle (the instruction's last bytes are in) gives the verdict, which
            # the sequencer keeps for READY (ready_code: None outside READY).
            checking = ctx.get(dut.check_valid)
            bits = ctx.get(dut.check.as_value())
            # Outside a check, the verdict is junk the sequencer must not look at.
            ctx.set(dut.fault, _verdict(bits) if checking else rng.randrange(8))
            check_valid = ready_code is not None
            retire = bool(retires) and retires[0] <= cycle
            if retire:
                retires.popleft()
                stats["back_to_back"] += last_retire == cycle - 1
                last_retire = cycle
            ctx.set(dut.retire, retire)
            # Every stream's increments of this cycle: this one's, another's, and none.
            ctx.set(dut.signals[0].valid, ctx.get(dut.signal.valid))
            ctx.set(dut.signals[0].index, ctx.get(dut.signal.index))
            ctx.set(dut.signals[1].valid, bump is not None)
            ctx.set(dut.signals[1].index, bump or 0)
            hbm.drive(ctx, port, cycle)
            # valid must not depend on ready.
            ctx.set(dut.instruction.ready, 0)
            valid_unready = ctx.get(dut.instruction.valid)
            is_ready = rng.random() < ready
            ctx.set(dut.instruction.ready, is_ready)
            valid = ctx.get(dut.instruction.valid)
            assert valid == valid_unready, cycle

            # -- sample -------------------------------------------------------------------
            pc = ctx.get(dut.pc)
            if next_pc is not None:
                assert pc == next_pc, (cycle, hex(pc), hex(next_pc))
            error = ctx.get(dut.error)
            if error_due is not None:
                assert (error, ctx.get(dut.error_code), ctx.get(dut.error_pc)) == \
                    (1, *error_due), cycle
            if error and not error_seen:
                error_seen = True
                stopped = cycle
                if error_due is None:       # a fetch error: reported from the fetch side
                    assert outcome is not None and outcome[0] == Fault.FETCH_ERROR, cycle
                    assert (ctx.get(dut.error_code), ctx.get(dut.error_pc)) == outcome, cycle
                assert len(pushes) == len(expected), (cycle, "fault before the stream's end")
            if not error:
                assert ctx.get(dut.error_code) == 0, cycle
            assert not (error_seen and (check_valid or checking)), cycle
            assert not (end_pushed and (check_valid or checking)), cycle
            assert not (check_valid and checking), cycle

            # What the sequencer must offer this cycle.
            code = ready_code
            opcode = bits & 0xFF
            unit = opcode not in (Opcode.END, Opcode.NOP)
            h = _header(bits)
            wait_ok = code == Fault.NONE and (
                not h["wait"] or values[h["wait_sem"]] >= h["wait_value"])
            # waiting is not gated by halt (the core's deadlock fault names the waiting
            # engine in the cycle it halts everything).
            waiting = check_valid and code == Fault.NONE and not wait_ok
            go = check_valid and wait_ok and not halted and len(queue) < RETIRE_DEPTH
            assert valid == (go and unit), cycle
            assert ctx.get(dut.waiting) == waiting, cycle
            stats["waiting"] += waiting
            stats["halted"] += bool(check_valid and halted)
            if check_valid:
                # The checked word is the stream's next instruction, intact.
                exp_pc, exp_op, exp_bits = expected[len(pushes)] if len(pushes) < len(
                    expected) else (outcome[1], None, None)
                assert pc == exp_pc, (cycle, hex(pc), hex(exp_pc))
                size = _size(engine, opcode)
                word = bits & ((1 << (8 * size)) - 1)
                assert word == int.from_bytes(image[pc:pc + size], "little"), cycle
                if exp_bits is not None:
                    assert code == Fault.NONE, cycle
                else:
                    assert code != Fault.NONE and (code, pc) == outcome, cycle
            if valid:
                assert ctx.get(dut.instruction.payload.as_value()) == exp_bits, cycle
            error_due = (code, pc) if check_valid and code != Fault.NONE else None

            # The retire queue: entries pushed before this cycle; one completes per cycle.
            assert ctx.get(dut.pending) == bool(queue), cycle
            if queue:
                assert ctx.get(dut.retire_pc) == queue[0][0], cycle
            quiet = hbm.quiet(ctx, port)
            assert ctx.get(dut.quiet) == quiet, cycle
            assert ctx.get(dut.finished) == (end_done and not queue and quiet), cycle
            available = unit_done + retire
            signal_valid = ctx.get(dut.signal.valid)
            if queue and (not queue[0][1] or available > 0):
                head = queue.popleft()
                completions.append(head[0])
                unit_done = available - head[1]
                assert signal_valid == head[2], cycle
                if head[2]:
                    assert ctx.get(dut.signal.index) == head[3], cycle
                    own[head[3]] += 1
                    stats["signals"] += 1
                end_done = end_done or head[4]
            else:
                unit_done = available
                assert not signal_valid, cycle

            push = go and (not unit or is_ready)
            next_pc = pc
            if push:
                pushes.append(pc)
                stats["pushes"] += 1
                queue.append((pc, unit, h["signal"], h["signal_sem"], opcode == Opcode.END))
                stats["max_queue"] = max(stats["max_queue"], len(queue))
                next_pc = pc + _size(engine, opcode)
                if unit:
                    lo, hi = delay
                    last = retires[-1] if retires else cycle
                    retires.append(max(cycle + rng.randint(lo, hi), last + 1))
                if opcode == Opcode.END:
                    end_pushed = True
                    stopped = cycle + 1
            # READY is entered after a check cycle and left by an issue, a fault (raised the
            # next cycle) or a start (below).
            if push or (check_valid and code != Fault.NONE):
                ready_code = None
            if checking:
                ready_code = _check(cfg, engine, bits)
            hbm.sample(ctx, port, cycle)
            if stopped is not None and hbm.last_new_ar is not None:
                assert hbm.last_new_ar <= stopped, (cycle, "fetch after END or a fault")

            # -- run control --------------------------------------------------------------
            if start:
                ready_code = None
                state = "run"
                expected, outcome = _reference(cfg, engine, image, runs[run], bad)
                pushes, completions = [], []
                end_pushed = end_done = error_seen = False
                stopped = error_due = None
                next_pc = runs[run]
                # From the beat that holds the pointer (a 64-byte beat holds two words).
                hbm.next_addr = runs[run] - runs[run] % cfg.dma_bus_bytes
                hbm.last_new_ar = None
                quiet_since = None
                assert not queue and unit_done == 0 and quiet
            elif state == "gap":
                gap_left -= 1
            elif state == "run":
                drained = quiet and not queue and not retires
                quiet_since = (quiet_since if quiet_since is not None else cycle) \
                    if drained and halted else None
                over = (end_done or error_seen or (quiet_since is not None
                                                   and cycle - quiet_since > 40))
                if over and drained:
                    if end_done or error_seen:
                        assert pushes == [p for p, _, _ in expected], "pushes"
                        assert (outcome is None) == end_done and error_seen == (
                            outcome is not None)
                    else:
                        assert pushes == [p for p, _, _ in expected][:len(pushes)]
                        assert not error_seen
                    assert completions == pushes, "completions"
                    stats["results"].append((end_done, outcome, len(pushes)))
                    run += 1
                    state = "gap"
                    gap_left = rng.randrange(6)
            if run == len(runs):
                tail += 1
                if tail > 30:       # nothing more happens
                    stats["cycles"] = cycle
                    stats["slverr_beats"] = hbm.errors
                    return
            await ctx.tick()
        raise AssertionError(f"not finished after {cycles} cycles: run {run}, "
                             f"{len(pushes)} of {len(expected)} handed out")

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return stats


CONFIGS = {
    "bus8": HBM12K,
    "bus4": HBM12K.replace(dma_bus_bytes=4),
    "bus32": HBM12K.replace(dma_bus_bytes=32),
    # Wider than a fetch (32 bytes): the trn2/trn3 presets' bus; a beat carries two fetch
    # units, of which the sequencer takes the one its pointer is in.
    "bus64": HBM12K.replace(dma_bus_bytes=64),
}


@pytest.mark.parametrize("engine", list(Engine))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_stream_reaches_the_unit_in_order(name, engine):
    """Random streams from a pointer just below a 4 KiB boundary: every unit instruction
    reaches the unit intact and in order, NOP / END complete on their own, ``finished``
    only after END completed and the fetches are quiet."""
    cfg = CONFIGS[name]
    rng = random.Random(f"{name}-{engine}")
    bases = _bases(rng, cfg)
    pointer = BOUNDARY_BYTES - WORD * rng.randrange(1, 6)
    program = _program(rng, cfg, engine, 24, base=bases)
    image = _image(rng, cfg, {pointer: program})
    stats = _run(cfg, engine, image, [pointer], seed=rng.random(), bases=bases)
    assert stats["results"] == [(True, None, 25)]


@pytest.mark.parametrize("semaphores, engine", [
    (8, Engine.DMA), (8, Engine.TENSOR), (8, Engine.ACTIVATION), (5, Engine.TENSOR),
    (1, Engine.DMA)])
def test_waits(semaphores, engine):
    """Waits on semaphores the test raises slowly: ``waiting`` is high exactly while the
    checked instruction is blocked on its wait, nothing is handed out before its wait
    holds (values near 2**31 and 2**32 included)."""
    cfg = HBM12K.replace(semaphores=semaphores)
    rng = random.Random(f"{semaphores}-{engine}")
    bases = _bases(rng, cfg)
    # A single semaphore also counts the stream's own signals: wait further ahead.
    program = _program(rng, cfg, engine, 16, base=bases, reach=6 if semaphores > 1 else 12)
    image = _image(rng, cfg, {0: program})
    stats = _run(cfg, engine, image, [0], seed=rng.random(), bases=bases,
                 sem_rate=0.02 * min(semaphores, 4) / 8)
    assert stats["waiting"] > 50 and stats["results"] == [(True, None, 17)]


def test_waits_on_own_signals():
    """A stream that waits on its own signals: each NOP waits until the previous
    instructions' signals have all counted (completion in order, the signal of a
    completing instruction seen from the next cycle)."""
    cfg = HBM12K
    rng = random.Random(3)
    engine = Engine.DMA
    program = bytearray()
    count = 0
    for _ in range(10):
        for _ in range(rng.randrange(1, 4)):
            program += _instruction(rng, cfg, engine, Opcode.DMA, base=[0] * 8, waits=False,
                                    signal_sem=5)
            count += 1
        program += _instruction(rng, cfg, engine, Opcode.NOP, base=[0] * 8, waits=False,
                                signal=0, wait_sem=5, wait_value=count)
    program += isa.encode(Opcode.END, wait_sem=5, wait_value=count)
    image = _image(rng, cfg, {64: program})
    stats = _run(cfg, engine, image, [64], seed=4, sem_rate=0, delay=(3, 20))
    assert stats["waiting"] > 0 and stats["signals"] == count
    assert stats["results"] == [(True, None, len(program) // WORD - count)]


def test_signals_with_back_to_back_retires():
    """Signals of unit instructions retiring back to back (a slow unit that then catches
    up), interleaved with signalling NOPs: every completion signals in program order."""
    cfg = HBM12K.replace(dma_bus_bytes=32)
    rng = random.Random(5)
    for engine in (Engine.TENSOR, Engine.DMA):
        program = bytearray()
        for _ in range(40):
            opcode = Opcode.NOP if rng.random() < 0.25 else rng.choice(UNIT_OPCODES[engine])
            program += _instruction(rng, cfg, engine, opcode, base=[0] * 8, waits=False,
                                    signal_sem=rng.randrange(cfg.semaphores))
        program += isa.encode(Opcode.END, signal_sem=7)
        image = _image(rng, cfg, {WORD * 7: program})
        stats = _run(cfg, engine, image, [WORD * 7], seed=rng.random(), delay=(1, 40),
                     ready=0.9, arready=1.0, latency=(1, 2), gap=0.0)
        assert stats["back_to_back"] >= 10 and stats["signals"] == 41


def test_retire_queue_fills():
    """More unit instructions in flight than the retire queue holds: the sequencer stops at
    RETIRE_DEPTH and goes on as they retire."""
    cfg = HBM12K.replace(dma_bus_bytes=32)
    rng = random.Random(6)
    engine = Engine.ACTIVATION
    program = _program(rng, cfg, engine, 3 * RETIRE_DEPTH, base=[0] * 8, waits=False)
    image = _image(rng, cfg, {0: program})
    stats = _run(cfg, engine, image, [0], seed=7, delay=(60, 60), ready=1.0, arready=1.0,
                 latency=(1, 1), gap=0.0)
    assert stats["results"] == [(True, None, 3 * RETIRE_DEPTH + 1)]
    assert stats["max_queue"] == RETIRE_DEPTH


def test_halt_stalls_issue():
    """``halt`` in random bursts: nothing is handed out while it is high; the stream
    resumes intact after it."""
    cfg = HBM12K
    rng = random.Random(8)
    pattern = [rng.random() < 0.5 for _ in range(64)]
    for engine in Engine:
        bases = _bases(rng, cfg)
        program = _program(rng, cfg, engine, 16, base=bases)
        image = _image(rng, cfg, {256: program})
        stats = _run(cfg, engine, image, [256], seed=rng.random(), bases=bases,
                     halt=lambda cycle: pattern[(cycle // 7) % 64])
        assert stats["halted"] > 20 and stats["results"] == [(True, None, 17)]


def test_halt_stops_for_good():
    """``halt`` held from some cycle on (a fault elsewhere in the core): the instructions
    already handed out complete, no further one starts, no fault."""
    cfg = HBM12K
    rng = random.Random(9)
    for at in (3, 40, 90):
        bases = [0] * cfg.semaphores
        program = _program(rng, cfg, Engine.DMA, 30, base=bases, waits=False)
        image = _image(rng, cfg, {0: program})
        stats = _run(cfg, Engine.DMA, image, [0], seed=at, halt=lambda cycle, at=at: cycle >= at)
        [(ended, _, pushed)] = stats["results"]
        assert not ended and pushed < 31


def _fault_case(rng, cfg, engine, case):
    """``(image, pointer, bad beats, expected (code, pc))`` of one fault scenario, with a
    random prefix of good instructions."""
    bases = [0] * cfg.semaphores
    pointer = WORD * rng.randrange(40, 80)
    prefix = _program(rng, cfg, engine, rng.randrange(0, 6), base=bases, end=False,
                      waits=False)
    at = pointer + len(prefix)
    unit = UNIT_OPCODES[engine][0]
    bad = set()
    tail = _program(rng, cfg, engine, 3, base=bases, waits=False)
    if case == "misaligned":
        pointer += rng.randrange(1, WORD)
        return _image(rng, cfg, {}), pointer, bad, (Fault.FETCH_ERROR, pointer)
    if case == "pointer_past_hbm":
        return _image(rng, cfg, {}), cfg.hbm_bytes + WORD * 3, bad, \
            (Fault.FETCH_ERROR, cfg.hbm_bytes + WORD * 3)
    if case == "other_engine":
        other = {Engine.DMA: Opcode.MATMUL, Engine.TENSOR: Opcode.DMA,
                 Engine.ACTIVATION: Opcode.LOAD_STATIONARY}[engine]
        word = _instruction(rng, cfg, engine, other, base=bases, waits=False)
        if engine == Engine.TENSOR:
            # Refused on its first word: not a fetch error even though the second word
            # would be past HBM.
            pointer = cfg.hbm_bytes - WORD - len(prefix)
            at = cfg.hbm_bytes - WORD
            return _image(rng, cfg, {pointer: prefix + word}), pointer, bad, \
                (Fault.ILLEGAL_OPCODE, at)
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.ILLEGAL_OPCODE, at)
    if case == "unknown_opcode":
        word = bytearray(_instruction(rng, cfg, engine, Opcode.NOP, base=bases, waits=False))
        word[0] = rng.choice([c for c in range(256) if c not in set(Opcode)])
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.ILLEGAL_OPCODE, at)
    if case in ("wait_sem", "signal_sem"):
        # The same index with its enable bit clear first: no fault.
        field = case
        enable = field.split("_")[0]
        index = rng.randrange(cfg.semaphores, 256)
        harmless = _instruction(rng, cfg, engine, unit, base=bases, waits=False,
                                **{field: index, enable: 0})
        word = _instruction(rng, cfg, engine, rng.choice([Opcode.NOP, unit]), base=bases,
                            waits=False, **{field: index})
        return _image(rng, cfg, {pointer: prefix + harmless + word + tail}), pointer, bad, \
            (Fault.BAD_FIELD, at + len(harmless))
    if case == "unit_fault":
        code = rng.randrange(1, 8)
        word = _instruction(rng, cfg, engine, unit, base=bases, waits=False, verdict=code)
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, (code, at)
    if case in ("priority_opcode", "priority_sem"):
        # Illegal opcode, a bad semaphore index and a unit verdict: the opcode wins; then
        # the index wins over the verdict.
        word = bytearray(_instruction(rng, cfg, engine, unit, base=bases, waits=False,
                                      signal_sem=255, verdict=3))
        if case == "priority_opcode":
            word[0] = 0xEE
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.ILLEGAL_OPCODE if case == "priority_opcode" else Fault.BAD_FIELD, at)
    if case == "check_before_wait":
        # Both would wait for ever; the check faults first.
        word = _instruction(rng, cfg, engine, unit, base=bases, waits=False,
                            wait_sem=1, wait_value=(1 << 32) - 1, verdict=Fault.OUT_OF_RANGE)
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.OUT_OF_RANGE, at)
    if case == "check_before_wait_sem":
        word = _instruction(rng, cfg, engine, Opcode.NOP, base=bases, waits=False,
                            wait_sem=2, wait_value=(1 << 32) - 1, signal_sem=200)
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.BAD_FIELD, at)
    if case == "slverr":
        word = _instruction(rng, cfg, engine, unit, base=bases, waits=False)
        if at % cfg.dma_bus_bytes:
            # A beat wider than a word: start the instruction on a beat, so that the bad
            # beat holds no instruction before it.
            prefix += _instruction(rng, cfg, engine, Opcode.NOP, base=bases, waits=False)
            at += WORD
        beat = at + cfg.dma_bus_bytes * rng.randrange(max(1, len(word) // cfg.dma_bus_bytes))
        bad.add(beat)
        # An error on a prefetched beat past END is never used: no fault from it.
        end = pointer + len(prefix) + len(word) + len(tail)
        bad.add(end + cfg.dma_bus_bytes)
        return _image(rng, cfg, {pointer: prefix + word + tail}), pointer, bad, \
            (Fault.FETCH_ERROR, at)
    if case == "slverr_after_end":
        end = pointer + len(prefix) + len(tail)
        bad.update({end, end + 3 * cfg.dma_bus_bytes})
        return _image(rng, cfg, {pointer: prefix + tail}), pointer, bad, None
    if case == "past_hbm":
        # NOPs up to the end of HBM and no END.
        body = b"".join(_instruction(rng, cfg, engine, Opcode.NOP, base=bases, waits=False)
                        for _ in range(4))
        pointer = cfg.hbm_bytes - len(prefix) - len(body)
        return _image(rng, cfg, {pointer: prefix + body}), pointer, bad, \
            (Fault.FETCH_ERROR, cfg.hbm_bytes)
    if case == "end_at_hbm_end":
        body = prefix + isa.encode(Opcode.END)
        pointer = cfg.hbm_bytes - len(body)
        return _image(rng, cfg, {pointer: body}), pointer, bad, None
    if case == "long_past_hbm":
        # A DMA instruction in the last word of HBM: its second word is past the end.
        word = _instruction(rng, cfg, Engine.DMA, Opcode.DMA, base=bases, waits=False)
        pointer = cfg.hbm_bytes - WORD - len(prefix)
        return _image(rng, cfg, {pointer: prefix + word[:WORD]}), pointer, bad, \
            (Fault.FETCH_ERROR, cfg.hbm_bytes - WORD)
    raise AssertionError(case)


FAULT_CASES = ["misaligned", "pointer_past_hbm", "other_engine", "unknown_opcode", "wait_sem",
               "signal_sem", "unit_fault", "priority_opcode", "priority_sem", "check_before_wait",
               "check_before_wait_sem", "slverr", "slverr_after_end", "past_hbm",
               "end_at_hbm_end"]


@pytest.mark.parametrize("case", FAULT_CASES + ["long_past_hbm"])
def test_faults(case):
    """Each fault: its code and address, the instructions before it handed out and
    completed, none after it, no fetch after it; and a clean restart from a good stream
    with the next ``start``."""
    engines = [Engine.DMA] if case == "long_past_hbm" else list(Engine)
    for engine in engines:
        for name in ("bus8", "bus4", "bus32", "bus64") if case in ("slverr", "past_hbm") \
                else ("bus8",):
            cfg = CONFIGS[name]
            rng = random.Random(f"{case}-{engine}-{name}")
            image, pointer, bad, fault = _fault_case(rng, cfg, engine, case)
            _, outcome = _reference(cfg, engine, image, pointer, bad)
            assert outcome == fault, (outcome, fault)      # the reference agrees with isa.md
            good = _program(rng, cfg, engine, 5, base=[0] * 8, waits=False)
            image[0:len(good)] = good
            stats = _run(cfg, engine, image, [pointer, 0], seed=rng.random(),
                         bad=frozenset(bad - set(range(len(good)))))
            assert [r[0] for r in stats["results"]] == [fault is None, True]
            if case.startswith("slverr"):
                assert stats["slverr_beats"] > 0


def test_restart_after_end():
    """A second ``start`` after END (fetches of the first stream still in flight past its
    END by then or not) restarts cleanly from a new pointer, and a third from the first
    pointer again."""
    cfg = HBM12K
    rng = random.Random(10)
    for engine in Engine:
        first = _program(rng, cfg, engine, 6, base=[0] * 8, waits=False)
        second = _program(rng, cfg, engine, 9, base=[0] * 8, waits=False)
        image = _image(rng, cfg, {512: first, 4096 + 2048: second})
        stats = _run(cfg, engine, image, [512, 4096 + 2048, 512], seed=rng.random(),
                     latency=(1, 30))
        assert stats["results"] == [(True, None, 7), (True, None, 10), (True, None, 7)]


def test_full_hbm_preset():
    """The tiny preset itself (16 MiB of HBM): a stream that ends in HBM's last word."""
    cfg = TINY
    rng = random.Random(11)
    program = _program(rng, cfg, Engine.DMA, 8, base=[0] * 8, waits=False)
    pointer = cfg.hbm_bytes - len(program)
    image = bytearray(cfg.hbm_bytes)
    image[pointer:] = program
    stats = _run(cfg, Engine.DMA, image, [pointer], seed=12)
    assert stats["results"] == [(True, None, 9)]
