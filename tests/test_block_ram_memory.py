"""BlockRAMMemory (block RAM standing in for HBM on a board) on Amaranth's simulator: in
lockstep with AXI4Memory at its latency (LATENCY) under random legal traffic, every
handshake in the same cycle (so the cycle model predicts a board's counters); the contents
through AXI and the host port; the host taking the ports in the middle of AXI traffic; an
error response, never a hang or a write, for every burst it refuses; the refusals of bad
parameters."""

import random
import re
from collections import deque

import pytest
from amaranth import Module
from amaranth.sim import Simulator

from opentrn.hdl.axi4 import BURST_INCR, RESP_DECERR, RESP_OKAY, RESP_SLVERR
from opentrn.hdl.axi4_memory import AXI4Memory
from opentrn.hdl.block_ram_memory import LATENCY, BlockRAMMemory

BUS_BYTES = 8
SIZE = 2 * 4096
WORD_MASK = (1 << 8 * BUS_BYTES) - 1

#: The signals a manager drives, and their idle values.
MANAGER_SIGNALS = ("arvalid", "araddr", "arlen", "arsize", "arburst", "arid", "rready",
                   "awvalid", "awaddr", "awlen", "awsize", "awburst", "awid", "wvalid",
                   "wdata", "wstrb", "wlast", "bready")


def _memory(cls=BlockRAMMemory, **kwargs):
    settings = {"size_bytes": SIZE, "addr_width": 16, "data_width": 8 * BUS_BYTES,
                "id_width": 2, **kwargs}
    return cls(**settings)


def _simulate(top, bench):
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


class _Manager:
    """A random AXI4 manager, as the core's are: INCR bursts of the bus width that never
    cross 4 KiB, W beats only after their burst's address has transferred, valid signals
    independent of the ready signals. ``reads``: ``(addr, beats, id)``; ``writes``:
    ``(addr, [(data, strobe)], id)``. ``p`` gives each channel's probability of presenting
    (or, for R and B, accepting) in a cycle."""

    def __init__(self, rng, reads, writes, p):
        self.rng, self.p = rng, p
        self.reads, self.writes = deque(reads), deque(writes)
        self.ar = self.aw = None
        self.w_bursts = deque()      # the beats of bursts whose address has transferred
        self.w_beat = None
        self.r_beats, self.b = [], []
        self.ar_sent = self.aw_sent = 0

    def done(self):
        return not (self.reads or self.writes or self.ar or self.aw or self.w_bursts
                    or self.w_beat) and len(self.b) == self.aw_sent \
            and sum(1 for beat in self.r_beats if beat[3]) == self.ar_sent

    def drive(self):
        rng, p = self.rng, self.p
        values = dict.fromkeys(MANAGER_SIGNALS, 0)
        if self.ar is None and self.reads and rng.random() < p["ar"]:
            self.ar = self.reads.popleft()
        if self.ar is not None:
            addr, beats, ident = self.ar[:3]
            size, burst = self.ar[3:] if len(self.ar) > 3 else (3, BURST_INCR)
            values.update(arvalid=1, araddr=addr, arlen=beats - 1, arsize=size,
                          arburst=burst, arid=ident)
        if self.aw is None and self.writes and rng.random() < p["aw"]:
            self.aw = self.writes.popleft()
        if self.aw is not None:
            addr, beats, ident = self.aw[:3]
            size, burst = self.aw[3:] if len(self.aw) > 3 else (3, BURST_INCR)
            values.update(awvalid=1, awaddr=addr, awlen=len(beats) - 1, awsize=size,
                          awburst=burst, awid=ident)
        if self.w_beat is None and self.w_bursts and rng.random() < p["w"]:
            beats = self.w_bursts[0]
            data, strobe = beats.popleft()
            self.w_beat = (data, strobe, not beats)
            if not beats:
                self.w_bursts.popleft()
        if self.w_beat is not None:
            data, strobe, last = self.w_beat
            values.update(wvalid=1, wdata=data, wstrb=strobe, wlast=last)
        values["rready"] = int(rng.random() < p["r"])
        values["bready"] = int(rng.random() < p["b"])
        return values

    def observe(self, values, out):
        """The handshakes of this cycle, from the subordinate's outputs ``out``."""
        if values["arvalid"] and out["arready"]:
            self.ar, self.ar_sent = None, self.ar_sent + 1
        if values["awvalid"] and out["awready"]:
            self.w_bursts.append(deque(self.aw[1]))
            self.aw, self.aw_sent = None, self.aw_sent + 1
        if values["wvalid"] and out["wready"]:
            self.w_beat = None
        if values["rready"] and out["rvalid"]:
            self.r_beats.append((out["rid"], out["rdata"], out["rresp"], out["rlast"]))
        if values["bready"] and out["bvalid"]:
            self.b.append((out["bid"], out["bresp"]))


def _outputs(ctx, axi):
    names = ("arready", "awready", "wready", "rvalid", "rdata", "rid", "rresp", "rlast",
             "bvalid", "bid", "bresp")
    return {name: ctx.get(getattr(axi, name)) for name in names}


def _visible(values, out):
    """What a manager can see of a subordinate's outputs: payloads only while valid, W's
    ready only with a beat (AXI4Memory's W is always ready; a W beat never comes before
    its address)."""
    seen = {name: out[name] for name in ("arready", "awready", "rvalid", "bvalid")}
    if out["rvalid"]:
        seen.update({name: out[name] for name in ("rdata", "rid", "rresp", "rlast")})
    if out["bvalid"]:
        seen.update(bid=out["bid"], bresp=out["bresp"])
    seen["w_taken"] = values["wvalid"] and out["wready"]
    return seen


async def _lockstep(ctx, pairs, manager, limit):
    """Drive ``manager``'s traffic into every memory of ``pairs`` at once, asserting each
    cycle that all present the same handshakes; returns the cycles it took."""
    for cycle in range(limit):
        values = manager.drive()
        for memory in pairs:
            for name, value in values.items():
                ctx.set(getattr(memory.axi, name), value)
        outs = [_outputs(ctx, memory.axi) for memory in pairs]
        seen = [_visible(values, out) for out in outs]
        assert all(other == seen[0] for other in seen[1:]), (cycle, values, seen)
        manager.observe(values, outs[0])
        await ctx.tick()
        if manager.done():
            return cycle
    raise AssertionError(f"the traffic did not finish in {limit} cycles")


def _random_bursts(rng, count, base, span, max_beats=16):
    """``count`` bursts ``(addr, beats)`` inside ``[base, base + span)``, none across 4 KiB."""
    bursts = []
    for _ in range(count):
        beats = rng.randint(1, max_beats)
        while True:
            addr = base + BUS_BYTES * rng.randrange((span - beats * BUS_BYTES) // BUS_BYTES)
            if addr // 4096 == (addr + beats * BUS_BYTES - 1) // 4096:
                break
        bursts.append((addr, beats))
    return bursts


def _apply(model, addr, beats):
    for index, (data, strobe) in enumerate(beats):
        for lane in range(BUS_BYTES):
            if strobe >> lane & 1:
                model[addr + index * BUS_BYTES + lane] = (data >> 8 * lane) & 0xFF


def _words(model, addr, beats):
    return [int.from_bytes(bytes(model[addr + i * BUS_BYTES:addr + (i + 1) * BUS_BYTES]),
                           "little") for i in range(beats)]


@pytest.mark.parametrize("seed, p", [
    (1, {"ar": 1.0, "aw": 1.0, "w": 1.0, "r": 1.0, "b": 1.0}),     # the core's way: no stalls
    (2, {"ar": 0.5, "aw": 0.6, "w": 0.7, "r": 0.6, "b": 0.5}),
    (3, {"ar": 0.9, "aw": 0.3, "w": 0.9, "r": 0.3, "b": 0.2}),
])
def test_every_handshake_in_the_cycle_of_axi4memory_at_its_latency(seed, p):
    """Random reads of one half and writes to the other, at once, then every word read back:
    each cycle both memories present the same ready and valid signals and the same beats."""
    rng = random.Random(seed)
    ref, dut = _memory(AXI4Memory), _memory()
    top = Module()
    top.submodules.ref, top.submodules.dut = ref, dut
    model = bytearray(SIZE)
    preload = []
    for addr in range(0, SIZE // 2, 16 * BUS_BYTES):
        beats = [(rng.getrandbits(64), 0xFF) for _ in range(16)]
        preload.append((addr, beats, rng.randrange(4)))
        _apply(model, addr, beats)
    writes = []
    for addr, count in _random_bursts(rng, 24, SIZE // 2, SIZE // 2):
        beats = [(rng.getrandbits(64), rng.choice([0xFF, 0xFF, rng.getrandbits(8)]))
                 for _ in range(count)]
        writes.append((addr, beats, rng.randrange(4)))
    reads = [(addr, count, rng.randrange(4))
             for addr, count in _random_bursts(rng, 24, 0, SIZE // 2)]
    seen = {}

    async def bench(ctx):
        ctx.set(ref.latency, LATENCY)
        await _lockstep(ctx, (ref, dut), _Manager(rng, [], preload, p), 5000)
        traffic = _Manager(rng, reads, writes, p)
        seen["cycles"] = await _lockstep(ctx, (ref, dut), traffic, 20000)
        for addr, beats, _ in writes:
            _apply(model, addr, beats)
        for (addr, count, ident), beat_index in zip(reads, _burst_starts(traffic.r_beats),
                                                    strict=True):
            got = traffic.r_beats[beat_index:beat_index + count]
            assert [beat[0] for beat in got] == [ident] * count
            assert [beat[1] for beat in got] == _words(model, addr, count), hex(addr)
            assert [beat[3] for beat in got] == [0] * (count - 1) + [1]
        assert {resp for _, _, resp, _ in traffic.r_beats} == {RESP_OKAY}
        assert [bid for bid, _ in traffic.b] == [ident for _, _, ident in writes]
        # Every word, back through AXI in lockstep (at full speed), and through the host port.
        check = _Manager(rng, [(addr, 16, 0) for addr in range(0, SIZE, 16 * BUS_BYTES)],
                         [], dict.fromkeys(p, 1.0))
        await _lockstep(ctx, (ref, dut), check, 20000)
        assert [beat[1] for beat in check.r_beats] == _words(model, 0, SIZE // BUS_BYTES)
        seen["host"] = [await _host_access(ctx, dut, index)
                        for index in range(0, SIZE // BUS_BYTES, 97)]
        seen["errors"] = (ctx.get(ref.error),)

    _simulate(top, bench)
    assert seen["errors"] == (0,)
    assert seen["host"] == [(word, 0) for word in _words(model, 0, SIZE // BUS_BYTES)[::97]]
    # Traffic that stalls takes longer; the core's (no stalls) keeps the bus busy.
    assert seen["cycles"] > 200


def _burst_starts(beats):
    starts, start = [], 0
    for index, beat in enumerate(beats):
        if beat[3]:
            starts.append(start)
            start = index + 1
    return starts


async def _host_access(ctx, dut, addr, write=None):
    """One host port request; returns ``(data, error)`` and checks the response timing: a
    read answers three cycles after its request is taken, a write one cycle after."""
    request, response = dut.host.request, dut.host.response
    ctx.set(request.payload.addr, addr)
    ctx.set(request.payload.write, write is not None)
    ctx.set(request.payload.data, write or 0)
    ctx.set(request.valid, 1)
    ctx.set(response.ready, 1)
    while not ctx.get(request.ready):
        await ctx.tick()
    await ctx.tick()
    ctx.set(request.valid, 0)
    waited = 1
    while not ctx.get(response.valid):
        await ctx.tick()
        waited += 1
    assert waited == (1 if write is not None else 3)
    result = (ctx.get(response.payload.data), ctx.get(response.payload.error))
    await ctx.tick()
    ctx.set(response.ready, 0)
    return result


def test_the_host_takes_the_ports_in_the_middle_of_axi_traffic_and_nothing_is_lost():
    """Host reads and writes at random while random AXI reads and writes run: every AXI
    beat arrives, in order, with the right data; the host's reads see the memory and its
    writes land."""
    rng = random.Random(5)
    dut = _memory()
    model = bytearray(rng.randbytes(SIZE))
    p = {"ar": 0.8, "aw": 0.8, "w": 0.8, "r": 0.8, "b": 0.8}
    reads = [(addr, count, rng.randrange(4))
             for addr, count in _random_bursts(rng, 30, 0, SIZE // 4)]
    writes = []
    for addr, count in _random_bursts(rng, 30, SIZE // 4, SIZE // 4):
        writes.append((addr, [(rng.getrandbits(64), 0xFF) for _ in range(count)],
                       rng.randrange(4)))
    host_words = {SIZE // 2 // BUS_BYTES + index: rng.getrandbits(64) for index in range(40)}
    seen = {}

    async def bench(ctx):
        # The initial contents, through the host port.
        for index, word in enumerate(_words(model, 0, SIZE // BUS_BYTES)):
            await _host_access(ctx, dut, index, write=word)
        manager = _Manager(rng, reads, writes, p)
        pending = deque(sorted(host_words.items()))
        host_reads = []
        request, response = dut.host.request, dut.host.response
        state = None
        for _ in range(20000):
            values = manager.drive()
            for name, value in values.items():
                ctx.set(getattr(dut.axi, name), value)
            # The host's requests, at random, one at a time, while AXI runs.
            if state is None and rng.random() < 0.3:
                if pending and rng.random() < 0.5:
                    state = ("write", *pending.popleft())
                else:
                    state = ("read", rng.randrange(SIZE // 4 // BUS_BYTES), None)
                kind, addr, word = state
                ctx.set(request.payload.write, kind == "write")
                ctx.set(request.payload.addr, addr)
                ctx.set(request.payload.data, word or 0)
                ctx.set(request.valid, 1)
            ctx.set(response.ready, 1)
            taken = ctx.get(request.valid) and ctx.get(request.ready)
            answered = ctx.get(response.valid)
            if answered and state is not None and state[0] == "read":
                host_reads.append((state[1], ctx.get(response.payload.data)))
            manager.observe(values, _outputs(ctx, dut.axi))
            await ctx.tick()
            if taken:
                ctx.set(request.valid, 0)
            if answered:
                state = None
            if manager.done() and not pending and state is None:
                break
        seen.update(manager=manager, host_reads=host_reads)
        seen["final"] = [(await _host_access(ctx, dut, index))[0]
                         for index in range(SIZE // BUS_BYTES)]

    _simulate(dut, bench)
    manager = seen["manager"]
    original = bytes(model)
    for (addr, count, ident), start in zip(reads, _burst_starts(manager.r_beats), strict=True):
        got = manager.r_beats[start:start + count]
        assert [beat[1] for beat in got] == _words(original, addr, count)
        assert [beat[0] for beat in got] == [ident] * count
    assert len(seen["host_reads"]) > 20
    for addr, word in seen["host_reads"]:
        assert word == _words(original, addr * BUS_BYTES, 1)[0]
    for addr, beats, _ in writes:
        _apply(model, addr, beats)
    for index, word in host_words.items():
        model[index * BUS_BYTES:(index + 1) * BUS_BYTES] = word.to_bytes(BUS_BYTES, "little")
    assert seen["final"] == _words(model, 0, SIZE // BUS_BYTES)
    assert len(manager.b) == len(writes)


# A memory of 8 KiB less 64 bytes behind 16 address bits: room for bursts past its end
# that stay within a 4 KiB page.
SMALL = SIZE - 64
REFUSED = [
    ("past the end", (SMALL - 16, 4, 1), RESP_DECERR),
    ("wholly outside", (0x8000, 4, 2), RESP_DECERR),
    ("narrow", (0x100, 2, 3, 2, BURST_INCR), RESP_SLVERR),
    ("FIXED", (0x100, 3, 0, 3, 0), RESP_SLVERR),
    ("WRAP", (0x100, 4, 1, 3, 2), RESP_SLVERR),
    ("across 4 KiB", (4096 - 16, 4, 2), RESP_SLVERR),
]


@pytest.mark.parametrize("label, burst, resp", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_burst_answers_its_error_and_writes_nothing(label, burst, resp):
    rng = random.Random(9)
    dut = _memory(size_bytes=SMALL)
    addr, beats, ident, *rest = burst
    p = dict.fromkeys(("ar", "aw", "w", "r", "b"), 1.0)
    words = [rng.getrandbits(64) for _ in range(beats)]
    seen = {}

    async def bench(ctx):
        write = _Manager(rng, [], [(addr, [(w, 0xFF) for w in words], ident, *rest)], p)
        await _lockstep(ctx, (dut,), write, 200)
        read = _Manager(rng, [(addr, beats, ident, *rest)], [], p)
        await _lockstep(ctx, (dut,), read, 200)
        seen.update(b=write.b, r=read.r_beats)
        # The words the burst named that lie in the memory, and their neighbours.
        first = min(max(0, addr // BUS_BYTES - 2), SMALL // BUS_BYTES - 8)
        seen["contents"] = {(await _host_access(ctx, dut, index))[0]
                            for index in range(first, min(first + beats + 4,
                                                          SMALL // BUS_BYTES))}
        # And it still serves a good burst afterwards.
        good = _Manager(rng, [(0x200, 2, 1)], [(0x200, [(5, 0xFF), (6, 0xFF)], 0)], p)
        await _lockstep(ctx, (dut,), good, 200)
        seen["good"] = good.r_beats

    _simulate(dut, bench)
    assert seen["b"] == [(ident, resp)]
    assert seen["r"] == [(ident, 0, resp, int(index == beats - 1)) for index in range(beats)]
    assert seen["contents"] == {0}
    assert seen["good"] in ([(1, 0, RESP_OKAY, 0), (1, 0, RESP_OKAY, 1)],
                            [(1, 5, RESP_OKAY, 0), (1, 6, RESP_OKAY, 1)])


def test_a_host_request_outside_the_memory_answers_error_and_touches_nothing():
    dut = _memory(size_bytes=3 * 4096)     # 1536 words: addresses 1536..2047 are outside
    seen = {}

    async def bench(ctx):
        seen["write"] = await _host_access(ctx, dut, 1600, write=0x1234)
        seen["read"] = await _host_access(ctx, dut, 1600)
        seen["wrapped"] = await _host_access(ctx, dut, 1600 - 1024)   # where it would wrap
        seen["inside"] = await _host_access(ctx, dut, 1535, write=77)
        seen["back"] = await _host_access(ctx, dut, 1535)

    _simulate(dut, bench)
    assert seen["write"] == (0, 1) and seen["read"] == (0, 1)
    assert seen["wrapped"] == (0, 0)
    assert seen["inside"] == (0, 0) and seen["back"] == (77, 0)


@pytest.mark.parametrize("arguments, message", [
    ({"size_bytes": 100}, "size_bytes=100: must be a multiple of the bus word (8 bytes)"),
    ({"size_bytes": 1 << 20}, "size_bytes=1,048,576 does not fit 16 address bits"),
    ({"outstanding": 0}, "outstanding=0: must be a positive integer"),
    ({"data_width": 48}, "data_width must be a power of two from 8 to 1024, not 48"),
    ({"id_width": "2"}, "id_width='2': must be a positive integer"),
])
def test_bad_parameters_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _memory(**arguments)
