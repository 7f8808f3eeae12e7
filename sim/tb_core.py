"""cocotb testbench of the whole core (:mod:`opentrn.hdl.core`): it plays the host.

For each job (an HBM image and three program pointers, in the files that
:func:`opentrn.sim.core.run_images` writes), in one simulation: soft reset through the host
registers, load the image into the HBM, write the program pointers over AXI4-Lite
(cocotbext-axi's ``AxiLiteMaster``), enable the interrupt, start, and wait for the
interrupt. A watchdog turns a hang into a failure that prints the engines' states. Then the
status, the fault fields and the counters are read over AXI4-Lite, the bench waits for
``STATUS.idle``, and the HBM image is saved for the Python side to compare with the golden
machine and numpy.

Two HBMs (``OPENTRN_HBM``):

* ``fast``: the top level is :class:`~opentrn.hdl.core_with_memory.CoreWithMemory`, the
  HBM hardware beside the core, loaded and read back through the simulator
  (:class:`~opentrn.sim.hbm.HbmBackdoor`); no Python runs on the clock during a run.
* ``axi``: the top level is the core, its AXI4 port answered by cocotbext-axi's RAM with
  random latency and back-pressure (:class:`~opentrn.sim.hbm.HbmModel`).

Environment: ``OPENTRN_CONFIG``, ``OPENTRN_REPORT``, ``OPENTRN_JOBS`` (a JSON list of
``{"image": npz, "result": npz, "watchdog": cycles}``), ``OPENTRN_HBM``,
``OPENTRN_LATENCY`` (``lo,hi`` cycles per HBM burst; ``fast`` takes one value),
``OPENTRN_BACKPRESSURE``, ``OPENTRN_SEED``.
"""
import json
import logging
import os
import time
import warnings

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, First, RisingEdge, Timer
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from opentrn.hdl.axi4_memory import ERRORS as HBM_ERRORS
from opentrn.hdl.core import COUNTERS
from opentrn.hdl.host_registers import REGISTERS, unpack
from opentrn.isa import Engine, Opcode, layout
from opentrn.timeline import ENGINES, Recorder

from . import harness
from .hbm import HbmBackdoor, HbmModel

# cocotbext-axi 0.1.28 still calls cocotb 1 APIs that cocotb 2 deprecates.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.axi")

def _bits(register, *names):
    """The value with the 1-bit fields ``names`` of ``register`` set."""
    fields = {f.name: f for f in REGISTERS[register].fields}
    return sum(1 << fields[name].lsb for name in names)


CONTROL_START, CONTROL_SOFT_RESET = _bits("CONTROL", "start"), _bits("CONTROL", "soft_reset")
IRQ_BOTH = _bits("IRQ_STATUS", "done", "error")


def offset(name):
    return REGISTERS[name].offset


class Host:
    """The host's side of the register protocol (docs/registers.md)."""

    def __init__(self, dut):
        self.master = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "host_"), dut.clk, dut.rst)

    async def read(self, name):
        return await self.master.read_dword(offset(name))

    async def write(self, name, value):
        await self.master.write_dword(offset(name), value)

    async def read64(self, name):
        low = await self.master.read_dword(offset(f"{name}_LO"))
        return low | (await self.master.read_dword(offset(f"{name}_HI"))) << 32

    async def write64(self, name, value):
        await self.write(f"{name}_LO", value & 0xFFFF_FFFF)
        await self.write(f"{name}_HI", value >> 32)


async def _engine_states(core):
    """What a hung run looks like from inside: each sequencer's pc and flags."""
    lines = []
    for engine in Engine:
        prefix = f"{engine.name.lower()}_sequencer"
        block = getattr(core, prefix, None)
        if block is None:
            continue
        values = {}
        for name in ("pc", "waiting", "pending", "finished", "error", "error_code"):
            handle = getattr(block, name, None)
            if handle is not None:
                values[name] = int(handle.value) if handle.value.is_resolvable else "x"
        lines.append(f"{engine.name}: {values}")
    return "\n".join(lines)


class _AxiHbm:
    """The HBM as cocotbext-axi's RAM, answering the core's port from Python."""

    def __init__(self, dut, config, latency, backpressure):
        self.model = HbmModel(dut, "axi_", dut.clk, size=config.hbm_bytes,
                              period_ns=harness.CLOCK_PERIOD_NS, latency=latency,
                              backpressure=backpressure, seed=harness.setting("seed", 1))
        self.loaded = 0

    async def load(self, image):
        # Each job sees a fresh HBM, its image and zeros beyond: clear what the last job's
        # image and writes covered, not the whole HBM (whose untouched pages take no memory).
        used = max(self.loaded, self.model.written[1])
        if used:
            self.model.write(0, bytes(used))
        self.model.write(0, image.tobytes())
        self.loaded = len(image)
        self.model.written[:] = [self.model.size, 0]

    def read_back(self, length):
        return np.frombuffer(self.model.read(0, length), dtype=np.uint8)

    def check(self, index):
        pass


class _FastHbm:
    """The HBM in hardware beside the core, reached through the simulator."""

    def __init__(self, dut, config, latency):
        low, high = latency
        if low != high:
            raise ValueError(f"OPENTRN_LATENCY={low},{high}: the fast HBM has one latency")
        self.dut = dut
        self.backdoor = HbmBackdoor(dut, bus_bytes=config.dma_bus_bytes)
        dut.hbm_latency.value = low
        dut.hbm_clear_written.value = 0

    async def load(self, image):
        self.backdoor.load(image)
        self.dut.hbm_clear_written.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.hbm_clear_written.value = 0

    def read_back(self, length):
        return self.backdoor.read_back(length)

    def check(self, index):
        code = int(self.dut.hbm_error.value)
        if code:
            raise AssertionError(f"job {index}: the fast HBM was sent a burst it does not "
                                 f"serve: {HBM_ERRORS[code]} (error {code})")


class _TimelineProbe:
    """Samples the core's signals once per cycle for :class:`opentrn.timeline.Recorder`:
    each sequencer's hand-over (its retire queue's write), completion (the queue's read),
    semaphore wait and the instruction word it holds, the busy counters' increments, and
    the HBM port's burst handshakes. Cycle 0 is the core's start pulse, as in the cycle
    model."""

    def __init__(self, dut, core):
        self.clk = dut.clk
        self.core = core
        self.sequencers = [getattr(core, f"{name}_sequencer") for name in ENGINES]
        # The counters add each cycle's increments a cycle later (hdl/core.py), as
        # registers: those are the busy cycles the counters count.
        self.counted = [getattr(core, f"counted_{name}_busy") for name in ENGINES]
        # The HBM port's handshakes where they are driven (the read arbiter's port, the DMA's
        # writes): Icarus can show a module's output port apart from the net a child drives
        # (the core's axi__arvalid read 0 while the arbiter's port__arvalid was 1).
        self.reads, self.writes = core.read_arbiter, core.memory.dma
        header = dict(layout(Opcode.NOP))
        self.fields = {name: (header[name].offset, header[name].width)
                       for name in ("opcode", "wait_sem", "wait_value")}
        self.stop = False

    def _field(self, word, name):
        offset, width = self.fields[name]
        return (word >> offset) & ((1 << width) - 1)

    async def record(self):
        """Wait for the start pulse, then record until :attr:`stop`; the recorder."""
        # Sampled at the falling edge: nothing changes there (every register takes the
        # rising one), so a cycle's values have settled; one trigger per cycle, not a rising
        # edge and a read-only phase.
        core, recorder = self.core, Recorder()
        falling = FallingEdge(self.clk)
        while True:
            await falling
            if core.start.value:
                break
        cycle, previous = 0, None
        while not self.stop:
            await falling
            cycle += 1
            busy = [name for name, counted in zip(ENGINES, self.counted, strict=True)
                    if counted.value]
            if previous is not None:
                recorder.cycle(cycle - 1, busy=busy, **previous)
            previous = self._sample()
        return recorder

    def _sample(self):
        issued, retired, waiting = [], [], []
        for engine, sequencer in enumerate(self.sequencers):
            queue = sequencer.retiring
            if queue.w_en.value or sequencer.waiting.value:
                word = int(sequencer.check.value)
                if queue.w_en.value:
                    opcode = Opcode(self._field(word, "opcode")).name
                    issued.append((engine, opcode, int(sequencer.pc.value)))
                else:
                    waiting.append((engine, self._field(word, "wait_sem"),
                                    self._field(word, "wait_value")))
            if queue.r_en.value:
                retired.append(engine)
        sample = {"issued": issued, "retired": retired, "waiting": waiting}
        reads, writes = self.reads, self.writes
        if reads.port__arvalid.value and reads.port__arready.value:
            sample["read"] = (int(reads.port__arid.value), int(reads.port__arlen.value) + 1)
        if reads.port__rvalid.value and reads.port__rready.value and reads.port__rlast.value:
            sample["read_last"] = int(reads.port__rid.value)
        if writes.axi__awvalid.value and writes.axi__awready.value:
            sample["write"] = int(writes.axi__awlen.value) + 1
        sample["write_response"] = bool(writes.axi__bvalid.value and writes.axi__bready.value)
        return sample


#: Seconds between progress lines of a long run (OPENTRN_PROGRESS; the environment's
#: OPENTRN_PROGRESS_SECONDS overrides it).
PROGRESS_SECONDS = 5.0


async def _wait_for_interrupt(dut, watchdog, label):
    """Wait for ``irq`` for at most ``watchdog`` cycles; True if it came. With
    ``OPENTRN_PROGRESS`` set (a file the runner relays), wake every so many cycles to add
    a line of how far the run is, about every :data:`PROGRESS_SECONDS`: a wake-up costs
    microseconds, so a fast run is not slowed and a slow one is not silent."""
    path = os.environ.get("OPENTRN_PROGRESS")
    every = float(os.environ.get("OPENTRN_PROGRESS_SECONDS", PROGRESS_SECONDS))
    if dut.irq.value:
        return True
    if not path:
        await First(RisingEdge(dut.irq), Timer(watchdog * harness.CLOCK_PERIOD_NS, unit="ns"))
        return bool(dut.irq.value)
    waited, chunk, started, told = 0, 1000, time.monotonic(), time.monotonic()
    while waited < watchdog:
        step = min(chunk, watchdog - waited)
        await First(RisingEdge(dut.irq), Timer(step * harness.CLOCK_PERIOD_NS, unit="ns"))
        if dut.irq.value:
            return True
        waited += step
        now = time.monotonic()
        rate = waited / max(now - started, 1e-6)
        # The next wake about ``every`` seconds on, at the speed seen so far.
        chunk = max(1000, int(rate * every))
        if now - told >= every / 2:
            told = now
            with open(path, "a") as f:
                f.write(f"{label}: {waited:,} cycles simulated ({rate:,.0f} cycles/s)\n")
    return False


@cocotb.test()
async def run_jobs(dut):
    config = harness.config()
    jobs = json.loads(os.environ["OPENTRN_JOBS"])
    latency_text = os.environ.get("OPENTRN_LATENCY", "0,0")
    latency = tuple(int(x) for x in latency_text.split(","))
    backpressure = harness.setting("backpressure", 0.0, float)
    # The clock alone (no per-cycle agents): with the fast HBM nothing else is clocked, and
    # the simulator's own clock ("gpi") keeps Python off every edge (about 3x cocotb's Python
    # clock on Verilator, docs/performance.md). Low first: a rising edge at
    # time 0 would sample the host port's signals before they leave X.
    Clock(dut.clk, harness.CLOCK_PERIOD_NS, unit="ns", impl="gpi").start(start_high=False)
    fast = os.environ.get("OPENTRN_HBM", "axi") == "fast"
    if fast:
        hbm, core = _FastHbm(dut, config, latency), dut.core
    else:
        hbm, core = _AxiHbm(dut, config, latency, backpressure), dut
    host = Host(dut)
    # cocotbext-axi logs every register access at INFO: thousands of lines per run.
    logging.getLogger(f"cocotb.{dut._name}.host_").setLevel(logging.WARNING)
    await harness.reset(dut)
    for index, job in enumerate(jobs):
        image = np.load(job["image"])
        hbm_image, programs = image["hbm"], [int(p) for p in image["programs"]]
        if job.get("soft_reset", True):
            await host.write("CONTROL", CONTROL_SOFT_RESET)
        loading = time.monotonic()
        await hbm.load(hbm_image)
        load_seconds = time.monotonic() - loading
        for engine, pointer in zip(Engine, programs, strict=True):
            await host.write64(f"{engine.name}_PROGRAM", pointer)
        await host.write("IRQ_STATUS", IRQ_BOTH)
        await host.write("IRQ_ENABLE", IRQ_BOTH)
        probe = None
        if job.get("timeline"):
            probe = _TimelineProbe(dut, core)
            recording = cocotb.start_soon(probe.record())
        wall = time.monotonic()
        started = get_sim_time("step")
        await host.write("CONTROL", CONTROL_START)
        watchdog = int(job["watchdog"])
        if not await _wait_for_interrupt(dut, watchdog, f"job {index + 1} of {len(jobs)}"):
            status = unpack("STATUS", await host.read("STATUS"))
            counters = {name: await host.read64(name.upper()) for name in COUNTERS}
            raise AssertionError(
                f"job {index}: no interrupt within {watchdog} cycles; "
                f"status {status}; counters {counters}\n{await _engine_states(core)}")
        wall = time.monotonic() - wall
        status = unpack("STATUS", await host.read("STATUS"))
        error_pc = await host.read64("ERROR_PC")
        counters = {name: await host.read64(name.upper()) for name in COUNTERS}
        irq_status = await host.read("IRQ_STATUS")
        for _ in range(watchdog // 16 + 1):
            if unpack("STATUS", await host.read("STATUS"))["idle"]:
                break
            await ClockCycles(dut.clk, 16)
        else:
            raise AssertionError(f"job {index}: not idle after the run\n"
                                 f"{await _engine_states(core)}")
        hbm.check(index)
        if probe is not None:
            probe.stop = True
            recorder = await recording
            with open(job["timeline"], "w") as f:
                json.dump(recorder.finish(counters["cycles"]).to_dict(), f)
        reading = time.monotonic()
        final = hbm.read_back(len(hbm_image))
        read_seconds = time.monotonic() - reading
        steps = get_sim_time("step") - started
        np.savez(job["result"], hbm=final, counters=np.array(
            [counters[name] for name in COUNTERS], dtype=np.uint64))
        record = {"test": "job", "job": index, **status, "error_pc": error_pc,
                  "irq_status": irq_status, "counters": counters,
                  "wall_seconds": wall, "load_seconds": load_seconds,
                  "read_seconds": read_seconds, "sim_steps": steps,
                  "hbm": "fast" if fast else "axi"}
        harness.report(record)
