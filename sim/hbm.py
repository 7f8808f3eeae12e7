"""The testbench's HBMs.

:class:`HbmModel`: cocotbext-axi's AXI4 RAM with a pipelined read latency, random
back-pressure and injected error responses, answering the core's AXI4 port from Python every
cycle (``hbm="axi"``). :class:`HbmBackdoor`: the contents of the HBM in hardware beside the
core (``hbm="fast"``, :mod:`opentrn.hdl.axi4_memory`), reached through the simulator before
and after a run.

cocotbext-axi's ``AxiRam`` answers one read burst after another with no latency, and only
ever answers SLVERR. A memory with latency must overlap the latencies of outstanding bursts
(otherwise no DMA could hide them), and both error responses must be testable, so the read
and write processes are replaced here; the channels, the byte storage and the protocol
checks (4 KiB boundaries, burst lengths) remain cocotbext-axi's.

* ``latency``: a read burst's first beat leaves no earlier than ``latency`` cycles after its
  address was accepted, whatever is in flight before it; a write burst's response likewise
  after its last data beat. A ``(low, high)`` pair draws each burst's latency uniformly from
  that range (responses stay in order, so a burst never overtakes the one before it).
* ``backpressure``: probability that a channel's ready (or, on R and B, valid) is held low
  in a cycle.
* ``read_errors`` / ``write_errors``: bus word index -> ``"SLVERR"`` or ``"DECERR"``. A read
  of such a word answers that error (and zero data); a write to one is dropped and its
  burst answers the error (of its first erroring beat).
"""

import random
from collections import deque

import numpy as np
from cocotb import start_soon
from cocotb.triggers import Event, RisingEdge, Timer
from cocotb.utils import get_sim_steps, get_sim_time
from cocotbext.axi import AxiBus, AxiResp
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.memory import Memory

__all__ = ["HbmModel", "HbmBackdoor"]

_RESP = {"SLVERR": AxiResp.SLVERR, "DECERR": AxiResp.DECERR}


def _pauses(rng, probability):
    while True:
        yield rng.random() < probability


class _Timing:
    """Times in simulator steps (integers: a float of nanoseconds would not round-trip)."""

    def __init__(self, clock, period_ns, latency, rng):
        self.clock, self.rng = clock, rng
        self.period = get_sim_steps(period_ns, "ns")
        self.latency = latency if isinstance(latency, tuple) else (latency, latency)

    def ready_at(self):
        """The time a burst that arrives now may be answered."""
        low, high = self.latency
        cycles = low if low == high else self.rng.randint(low, high)
        return get_sim_time("step") + cycles * self.period

    async def wait_until(self, time):
        now = get_sim_time("step")
        if time > now:
            await Timer(time - now, "step")
            await RisingEdge(self.clock)


class _Read(AxiRamRead):
    def __init__(self, bus, clock, *, mem, timing, errors):
        self._timing, self._errors = timing, errors
        super().__init__(bus, clock, mem=mem)

    async def _process_read(self):
        pending, arrived = deque(), Event()
        start_soon(self._answer(pending, arrived))
        while True:
            ar = await self.ar_channel.recv()
            pending.append((self._timing.ready_at(), ar))
            arrived.set()

    async def _answer(self, pending, arrived):
        lanes = self.byte_lanes
        while True:
            while not pending:
                arrived.clear()
                await arrived.wait()
            ready_at, ar = pending.popleft()
            await self._timing.wait_until(ready_at)
            address = (int(ar.araddr) // lanes) * lanes
            beats = int(ar.arlen) + 1
            assert int(ar.arsize) == lanes.bit_length() - 1, "narrow bursts are not modelled"
            assert 0x1000 - (address & 0xFFF) >= beats * lanes, "burst crosses 4 KiB"
            for beat in range(beats):
                word_address = address + beat * lanes
                r = self.r_channel._transaction_obj()
                r.rid = int(ar.arid)
                r.rlast = beat == beats - 1
                error = self._errors.get(word_address // lanes)
                if error is None:
                    r.rresp = AxiResp.OKAY
                    r.rdata = int.from_bytes(self.read(word_address % self.size, lanes),
                                             "little")
                else:
                    r.rresp, r.rdata = _RESP[error], 0
                await self.r_channel.send(r)


class _Write(AxiRamWrite):
    def __init__(self, bus, clock, *, mem, timing, errors, written):
        self._timing, self._errors, self._written = timing, errors, written
        super().__init__(bus, clock, mem=mem)

    async def _process_write(self):
        lanes = self.byte_lanes
        responses, arrived = deque(), Event()
        start_soon(self._respond(responses, arrived))
        while True:
            aw = await self.aw_channel.recv()
            address = (int(aw.awaddr) // lanes) * lanes
            beats = int(aw.awlen) + 1
            assert int(aw.awsize) == lanes.bit_length() - 1, "narrow bursts are not modelled"
            assert 0x1000 - (address & 0xFFF) >= beats * lanes, "burst crosses 4 KiB"
            resp = AxiResp.OKAY
            # Once a burst, not per beat: a burst's bytes (whatever its strobes) bound it.
            first = address % self.size
            self._written[:] = (min(self._written[0], first),
                                max(self._written[1], first + beats * lanes))
            for beat in range(beats):
                w = await self.w_channel.recv()
                word_address = address + beat * lanes
                assert int(w.wlast) == (beat == beats - 1), "wlast on the wrong beat"
                error = self._errors.get(word_address // lanes)
                if error is not None:
                    if resp == AxiResp.OKAY:
                        resp = _RESP[error]
                    continue
                data = int(w.wdata).to_bytes(lanes, "little")
                strobe = int(w.wstrb)
                for lane in range(lanes):
                    if strobe >> lane & 1:
                        self.write((word_address + lane) % self.size, data[lane:lane + 1])
            responses.append((self._timing.ready_at(), int(aw.awid), resp))
            arrived.set()

    async def _respond(self, responses, arrived):
        while True:
            while not responses:
                arrived.clear()
                await arrived.wait()
            ready_at, bid, resp = responses.popleft()
            await self._timing.wait_until(ready_at)
            b = self.b_channel._transaction_obj()
            b.bid, b.bresp = bid, resp
            await self.b_channel.send(b)


class HbmModel(Memory):
    """An AXI4 memory of ``size`` bytes on the manager port ``prefix`` of ``dut``.
    ``written`` is ``[begin, end)`` of the bursts the port has written (``[size, 0]``: none),
    so that a new image clears only what was used (the memory is an mmap: pages the
    simulation never touches take no memory)."""

    def __init__(self, dut, prefix, clock, *, size, period_ns, latency=0, backpressure=0.0,
                 seed=0):
        super().__init__(size)
        self.read_errors, self.write_errors = {}, {}
        self.written = [size, 0]
        bus = AxiBus.from_prefix(dut, prefix)
        rng = random.Random(seed)
        timing = _Timing(clock, period_ns, latency, rng)
        self.write_if = _Write(bus.write, clock, mem=self.mem, timing=timing,
                               errors=self.write_errors, written=self.written)
        self.read_if = _Read(bus.read, clock, mem=self.mem, timing=timing,
                             errors=self.read_errors)
        if backpressure:
            for channel in (self.write_if.aw_channel, self.write_if.w_channel,
                            self.write_if.b_channel, self.read_if.ar_channel,
                            self.read_if.r_channel):
                channel.set_pause_generator(_pauses(rng, backpressure))


class HbmBackdoor:
    """The contents of the simulated HBM in hardware (:class:`opentrn.hdl.axi4_memory.
    AXI4Memory`, the ``hbm`` of :class:`~opentrn.hdl.core_with_memory.CoreWithMemory`),
    reached through the simulator while the core is idle: no Python runs on the clock.

    It remembers what it wrote and read, so that loading an image writes only the bus
    words that differ from the memory's contents (zero at time 0), and reading back after
    a run reads only the bytes the run wrote (the memory's ``written_begin``/``written_end``).
    """

    #: GPI's immediate write (vpiNoDelay): the memory is not clocked between runs.
    _NOW = 3

    def __init__(self, dut, *, bus_bytes):
        self.dut, self.bus_bytes = dut, bus_bytes
        # The raw simulator handle: one VPI call per word (cocotb's typed handles convert
        # each value through a LogicArray: 31 us a word against 10 here, on Verilator).
        self._storage = dut.hbm.storage._handle
        self._bits = 8 * bus_bytes
        self._known = np.zeros((0, bus_bytes), dtype=np.uint8)   # words [0, len) as stored

    def _word(self, index):
        return self._storage.get_handle_by_index(index)

    def _read_words(self, first, last):
        rows = np.zeros((last - first, self.bus_bytes), dtype=np.uint8)
        for row, index in enumerate(range(first, last)):
            text = self._word(index).get_signal_val_binstr()
            rows[row] = np.frombuffer(int(text, 2).to_bytes(self.bus_bytes, "little"),
                                      dtype=np.uint8)
        return rows

    def _grow(self, words):
        if words > len(self._known):
            self._known = np.concatenate(
                [self._known, np.zeros((words - len(self._known), self.bus_bytes),
                                       dtype=np.uint8)])

    def load(self, image):
        """Make the memory hold ``image`` (bytes from address 0) and zeros beyond it."""
        image = np.asarray(image, dtype=np.uint8)
        words = -(-len(image) // self.bus_bytes)
        padded = np.zeros((words, self.bus_bytes), dtype=np.uint8)
        padded.reshape(-1)[:len(image)] = image
        self._grow(words)
        wanted = np.zeros_like(self._known)
        wanted[:words] = padded
        for index in np.flatnonzero(np.any(wanted != self._known, axis=1)):
            value = int.from_bytes(wanted[index].tobytes(), "little")
            self._word(int(index)).set_signal_val_binstr(self._NOW,
                                                         format(value, f"0{self._bits}b"))
        self._known = wanted

    def read_back(self, length):
        """The first ``length`` bytes after a run: what was loaded, with the words the run
        wrote (``hbm_written_begin``/``hbm_written_end``) read from the memory."""
        begin = int(self.dut.hbm_written_begin.value) // self.bus_bytes
        end = -(-int(self.dut.hbm_written_end.value) // self.bus_bytes)
        if end > begin:
            self._grow(end)
            self._known[begin:end] = self._read_words(begin, end)
        self._grow(-(-length // self.bus_bytes))
        return self._known.reshape(-1)[:length].copy()
