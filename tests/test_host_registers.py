"""The host registers on Amaranth's own simulator, through a randomised AXI4-Lite manager:
the map of docs/registers.md, byte strobes, pulses, sticky status, the interrupt, counter
latching and error responses."""

import random
import re
from pathlib import Path

import pytest
from amaranth.sim import Simulator

from opentrn import config
from opentrn.hdl.axi4_lite import RESP_OKAY, RESP_SLVERR, AXI4LiteSignature
from opentrn.hdl.host_registers import (
    ADDR_WIDTH,
    COUNTERS,
    REGISTERS,
    HostRegisters,
    markdown,
    unpack,
)
from opentrn.isa import Engine, Fault

CFG = config.preset("tiny")
DOC = Path(__file__).resolve().parent.parent / "docs" / "registers.md"


def addr(name):
    return REGISTERS[name].offset


class Manager:
    """An AXI4-Lite manager for pysim testbenches: random valid delays, AW before W, W
    before AW or both together, random ready delays on B and R, and a check that the
    subordinate holds each response until it is taken. Every clock tick goes through
    :meth:`tick`, which records ``start``, ``soft_reset`` and ``irq`` in ``trace``."""

    def __init__(self, ctx, dut, rng):
        self.ctx, self.dut, self.bus, self.rng = ctx, dut, dut.bus, rng
        self.trace = []
        self.orders = set()       # "aw" / "w" / "same": which handshake came first

    async def tick(self, cycles=1):
        for _ in range(cycles):
            self.trace.append({name: self.ctx.get(getattr(self.dut, name))
                               for name in ("start", "soft_reset", "irq")})
            await self.ctx.tick()

    def pulses(self, name, since=0):
        return sum(sample[name] for sample in self.trace[since:])

    async def _response(self, valid, ready, payload):
        """Wait for ``valid``, hold ``ready`` low a random time while checking that the
        response stays, then take it."""
        ctx = self.ctx
        while not ctx.get(valid):
            await self.tick()
        seen = [ctx.get(p) for p in payload]
        for _ in range(self.rng.choice([0, 0, 1, 2, 4])):
            await self.tick()
            assert ctx.get(valid) == 1, "valid dropped before ready"
            assert [ctx.get(p) for p in payload] == seen, "payload changed before ready"
        ctx.set(ready, 1)
        await self.tick()
        ctx.set(ready, 0)
        return seen

    async def write(self, address, value, strb=0xF):
        ctx, bus, rng = self.ctx, self.bus, self.rng
        order = rng.choice(["aw", "w", "same"])
        first, second = rng.randint(0, 2), rng.randint(1, 4)
        aw_at, w_at = {"aw": (first, first + second), "w": (first + second, first),
                       "same": (first, first)}[order]
        ctx.set(bus.awaddr, address)
        ctx.set(bus.awprot, 0)
        ctx.set(bus.wdata, value)
        ctx.set(bus.wstrb, strb)
        aw_done = w_done = None
        cycle = 0
        while aw_done is None or w_done is None:
            ctx.set(bus.awvalid, aw_done is None and cycle >= aw_at)
            ctx.set(bus.wvalid, w_done is None and cycle >= w_at)
            aw_fire = ctx.get(bus.awvalid) and ctx.get(bus.awready)
            w_fire = ctx.get(bus.wvalid) and ctx.get(bus.wready)
            await self.tick()
            if aw_fire:
                aw_done = cycle
            if w_fire:
                w_done = cycle
            cycle += 1
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        self.orders.add("same" if aw_done == w_done else "aw" if aw_done < w_done else "w")
        (resp,) = await self._response(bus.bvalid, bus.bready, [bus.bresp])
        return resp

    async def read(self, address):
        ctx, bus = self.ctx, self.bus
        await self.tick(self.rng.choice([0, 0, 1, 3]))
        ctx.set(bus.araddr, address)
        ctx.set(bus.arprot, 0)
        ctx.set(bus.arvalid, 1)
        while True:
            fire = ctx.get(bus.arready)
            await self.tick()
            if fire:
                break
        ctx.set(bus.arvalid, 0)
        value, resp = await self._response(bus.rvalid, bus.rready, [bus.rdata, bus.rresp])
        return value, resp

    async def read_ok(self, name):
        value, resp = await self.read(addr(name))
        assert resp == RESP_OKAY, name
        return value


def run(bench, *, seed=1, cfg=CFG):
    dut = HostRegisters(config=cfg)
    finished = []

    async def testbench(ctx):
        ctx.set(dut.idle, 1)          # a core at rest: nothing in flight
        host = Manager(ctx, dut, random.Random(seed))
        await bench(ctx, dut, host)
        finished.append(host)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert len(finished) == 1
    return finished[0]


def test_signature():
    sig = AXI4LiteSignature(addr_width=12)
    assert sig == AXI4LiteSignature(addr_width=12, data_width=32)
    assert sig != AXI4LiteSignature(addr_width=13)
    assert repr(sig) == "AXI4LiteSignature(addr_width=12, data_width=32)"
    assert set(sig.members) == {
        "awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
        "bresp", "bvalid", "bready", "araddr", "arprot", "arvalid", "arready", "rdata",
        "rresp", "rvalid", "rready"}
    assert sig.members["wstrb"].shape == 4 and sig.members["awaddr"].shape == 12
    with pytest.raises(ValueError):
        AXI4LiteSignature(addr_width=12, data_width=16)


def test_map_matches_spec():
    """The offsets of the register map as specified (a change to the table is a change to
    the host interface)."""
    fixed = {"ID": 0x000, "VERSION": 0x004, "GEOMETRY": 0x008, "CAPS": 0x00C,
             "CONTROL": 0x010, "STATUS": 0x014, "ERROR_PC_LO": 0x018, "ERROR_PC_HI": 0x01C,
             "IRQ_ENABLE": 0x020, "IRQ_STATUS": 0x024,
             "DMA_PROGRAM_LO": 0x030, "DMA_PROGRAM_HI": 0x034,
             "TENSOR_PROGRAM_LO": 0x038, "TENSOR_PROGRAM_HI": 0x03C,
             "ACTIVATION_PROGRAM_LO": 0x040, "ACTIVATION_PROGRAM_HI": 0x044,
             "CYCLES_LO": 0x080, "MACS_HI": 0x0C4}
    for name, offset in fixed.items():
        assert addr(name) == offset, name
    assert list(COUNTERS) == ["cycles", "dma_busy", "tensor_busy", "activation_busy",
                              "dma_wait", "tensor_wait", "activation_wait", "dma_bytes",
                              "macs"]
    assert len(REGISTERS) == 16 + 2 * len(COUNTERS)


@pytest.mark.parametrize("preset", ["tiny", "small", "trn2"])
def test_identity(preset):
    cfg = config.preset(preset)

    async def bench(ctx, dut, host):
        assert await host.read_ok("ID") == 0x4F54524E
        assert (await host.read_ok("ID")).to_bytes(4, "big") == b"OTRN"
        assert await host.read_ok("VERSION") == 1
        assert await host.read_ok("GEOMETRY") == cfg.pe_rows | cfg.pe_cols << 16
        assert await host.read_ok("CAPS") == cfg.semaphores | cfg.dma_bus_bytes << 16
        assert await host.read_ok("CONTROL") == 0        # WO: reads 0, OKAY

    run(bench, cfg=cfg)


def test_reset_values():
    async def bench(ctx, dut, host):
        assert dut.signature.members["bus"].signature == AXI4LiteSignature(
            addr_width=ADDR_WIDTH).flip()
        for name, reg in REGISTERS.items():
            if reg.reset == "0":
                assert await host.read_ok(name) == 0, name
        assert ctx.get(dut.irq) == 0 and ctx.get(dut.start) == 0

    run(bench)


def test_program_pointers_with_strobes():
    async def bench(ctx, dut, host):
        rng = random.Random(5)
        names = [f"{e.name}_PROGRAM_{half}" for e in Engine for half in ("LO", "HI")]
        model = dict.fromkeys(names, 0)
        for _ in range(60):
            name = rng.choice(names)
            value, strb = rng.getrandbits(32), rng.getrandbits(4)
            assert await host.write(addr(name), value, strb) == RESP_OKAY
            mask = sum(0xFF << (8 * lane) for lane in range(4) if strb >> lane & 1)
            model[name] = (model[name] & ~mask) | (value & mask)
            for engine in Engine:
                lo, hi = (model[f"{engine.name}_PROGRAM_{h}"] for h in ("LO", "HI"))
                assert ctx.get(dut.program[engine]) == lo | hi << 32, engine
            check = rng.choice(names)
            assert await host.read_ok(check) == model[check]
        # A soft reset leaves the pointers.
        await host.write(addr("CONTROL"), 2)
        for name in names:
            assert await host.read_ok(name) == model[name]
        assert any(model.values())

    host = run(bench)
    assert host.orders == {"aw", "w", "same"}      # every handshake order was exercised


def test_control_pulses():
    async def bench(ctx, dut, host):
        control = addr("CONTROL")
        mark = len(host.trace)
        assert await host.write(control, 1) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("start", mark) == 1 and host.pulses("soft_reset", mark) == 0

        # Ignored while busy, still OKAY.
        ctx.set(dut.busy, 1)
        mark = len(host.trace)
        assert await host.write(control, 1) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("start", mark) == 0

        # Ignored while not idle (instructions of a faulted run still draining), still OKAY.
        ctx.set(dut.busy, 0)
        ctx.set(dut.idle, 0)
        mark = len(host.trace)
        assert await host.write(control, 1) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("start", mark) == 0
        ctx.set(dut.idle, 1)
        ctx.set(dut.busy, 1)

        # soft_reset pulses even while busy, and wins over a start in the same write.
        mark = len(host.trace)
        assert await host.write(control, 2) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("soft_reset", mark) == 1 and host.pulses("start", mark) == 0
        ctx.set(dut.busy, 0)
        mark = len(host.trace)
        assert await host.write(control, 3) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("soft_reset", mark) == 1 and host.pulses("start", mark) == 0

        # Byte 0 not strobed: no bits written.
        mark = len(host.trace)
        assert await host.write(control, 3, strb=0b1110) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("start", mark) == 0 and host.pulses("soft_reset", mark) == 0

        # Zero bits: nothing; three starts: three single-cycle pulses.
        assert await host.write(control, 0) == RESP_OKAY
        mark = len(host.trace)
        for _ in range(3):
            assert await host.write(control, 1) == RESP_OKAY
        await host.tick(2)
        assert host.pulses("start", mark) == 3

    host = run(bench)
    # Pulses are one cycle long.
    for name in ("start", "soft_reset"):
        levels = [sample[name] for sample in host.trace]
        assert not any(a and b for a, b in zip(levels, levels[1:], strict=False)), name


def test_status_fields():
    async def bench(ctx, dut, host):
        rng = random.Random(9)
        for _ in range(40):
            busy, idle = rng.getrandbits(1), rng.getrandbits(1)
            code, engine = rng.choice(list(Fault)), rng.choice(list(Engine))
            dma_code, pc = rng.randrange(16), rng.getrandbits(64)
            for port, value in ((dut.busy, busy), (dut.idle, idle), (dut.error_code, code),
                                (dut.error_engine, engine), (dut.dma_error_code, dma_code),
                                (dut.error_pc, pc)):
                ctx.set(port, value)
            status = await host.read_ok("STATUS")
            # The bit positions of the specification, not of the table.
            assert status == busy | idle << 1 | code << 4 | engine << 8 | dma_code << 12
            assert unpack("STATUS", status)["error_code"] == code
            assert await host.read_ok("ERROR_PC_LO") == pc & 0xFFFFFFFF
            assert await host.read_ok("ERROR_PC_HI") == pc >> 32

    run(bench)


async def _pulse(host, port):
    host.ctx.set(port, 1)
    await host.tick()
    host.ctx.set(port, 0)


def test_sticky_status_and_irq():
    async def bench(ctx, dut, host):
        def status_bits(word):
            return word >> 2 & 1, word >> 3 & 1      # done, error

        await host.write(addr("IRQ_ENABLE"), 0b01)       # done only
        assert await host.read_ok("IRQ_ENABLE") == 0b01
        await _pulse(host, dut.done)
        await host.tick()
        assert ctx.get(dut.irq) == 1
        assert status_bits(await host.read_ok("STATUS")) == (1, 0)
        assert await host.read_ok("IRQ_STATUS") == 0b01
        await _pulse(host, dut.error)
        await host.tick()
        assert status_bits(await host.read_ok("STATUS")) == (1, 1)
        assert await host.read_ok("IRQ_STATUS") == 0b11

        # W1C: clearing done leaves error, which is masked: no interrupt.
        assert await host.write(addr("IRQ_STATUS"), 0b01) == RESP_OKAY
        assert await host.read_ok("IRQ_STATUS") == 0b10
        assert ctx.get(dut.irq) == 0
        # Writing 0, or 1 without its strobe, clears nothing.
        assert await host.write(addr("IRQ_STATUS"), 0) == RESP_OKAY
        assert await host.write(addr("IRQ_STATUS"), 0b10, strb=0b0010) == RESP_OKAY
        assert await host.read_ok("IRQ_STATUS") == 0b10
        await host.write(addr("IRQ_ENABLE"), 0b10)
        assert ctx.get(dut.irq) == 1
        # Byte strobes on IRQ_ENABLE; bits beyond the fields read 0.
        await host.write(addr("IRQ_ENABLE"), 0xFFFFFFFE)
        assert await host.read_ok("IRQ_ENABLE") == 0b10
        await host.write(addr("IRQ_ENABLE"), 0xFFFFFFFF, strb=0b1110)
        assert await host.read_ok("IRQ_ENABLE") == 0b10
        await host.write(addr("IRQ_ENABLE"), 0xFFFFFFFF, strb=0b0001)
        assert await host.read_ok("IRQ_ENABLE") == 0b11
        assert await host.write(addr("IRQ_STATUS"), 0b10) == RESP_OKAY
        assert ctx.get(dut.irq) == 0 and await host.read_ok("IRQ_STATUS") == 0

        # STATUS.done / error stay until start clears them; IRQ_STATUS is not cleared by it.
        assert status_bits(await host.read_ok("STATUS")) == (1, 1)
        await _pulse(host, dut.done)
        await host.write(addr("CONTROL"), 1)
        assert status_bits(await host.read_ok("STATUS")) == (0, 0)
        assert await host.read_ok("IRQ_STATUS") == 0b01
        assert ctx.get(dut.irq) == 1

        # soft_reset clears the sticky bits and IRQ_STATUS, not IRQ_ENABLE.
        await _pulse(host, dut.error)
        assert status_bits(await host.read_ok("STATUS")) == (0, 1)
        await host.write(addr("CONTROL"), 2)
        assert status_bits(await host.read_ok("STATUS")) == (0, 0)
        assert await host.read_ok("IRQ_STATUS") == 0
        assert await host.read_ok("IRQ_ENABLE") == 0b11
        assert ctx.get(dut.irq) == 0

        # A pulse in the cycle of a W1C of its own bit wins.
        await _pulse(host, dut.done)
        bus = dut.bus
        ctx.set(bus.awaddr, addr("IRQ_STATUS"))
        ctx.set(bus.wdata, 0b01)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        await host.tick()                  # AW and W taken
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        ctx.set(dut.done, 1)               # the write takes effect at this edge
        await host.tick()
        ctx.set(dut.done, 0)
        assert ctx.get(bus.bvalid) == 1
        ctx.set(bus.bready, 1)
        await host.tick()
        ctx.set(bus.bready, 0)
        assert await host.read_ok("IRQ_STATUS") == 0b01

    run(bench)


def test_counter_latching():
    async def bench(ctx, dut, host):
        rng = random.Random(11)
        n = len(COUNTERS)
        values = [rng.getrandbits(64) for _ in range(n)]
        for i, v in enumerate(values):
            ctx.set(dut.counters[i], v)
        for i, name in enumerate(COUNTERS):
            lo = await host.read_ok(f"{name.upper()}_LO")
            assert lo == values[i] & 0xFFFFFFFF
            # The counter moves on before the HI read; HI is the half latched with LO.
            old = values[i]
            values[i] = (old + rng.randint(1, 2**33)) % 2**64
            ctx.set(dut.counters[i], values[i])
            assert await host.read_ok(f"{name.upper()}_HI") == old >> 32, name
        # The carry case: LO = 0xFFFFFFFF, then the counter crosses into the next HI.
        ctx.set(dut.counters[0], 0x1_FFFFFFFF)
        assert await host.read_ok("CYCLES_LO") == 0xFFFFFFFF
        ctx.set(dut.counters[0], 0x2_00000000)
        # Reading another counter's LO does not disturb this shadow.
        await host.read_ok("MACS_LO")
        assert await host.read_ok("CYCLES_HI") == 1
        assert await host.read_ok("CYCLES_LO") == 0
        assert await host.read_ok("CYCLES_HI") == 2
        # Every counter landed on its own register pair.
        for i, v in enumerate(values):
            ctx.set(dut.counters[i], v)
        for i, name in enumerate(COUNTERS):
            lo = await host.read_ok(f"{name.upper()}_LO")
            hi = await host.read_ok(f"{name.upper()}_HI")
            assert lo | hi << 32 == values[i], name

    run(bench)


def test_errors():
    async def bench(ctx, dut, host):
        mapped = {reg.offset for reg in REGISTERS.values()}
        unmapped = [a for a in range(0, 2**ADDR_WIDTH, 4) if a not in mapped]
        rng = random.Random(13)
        await host.write(addr("DMA_PROGRAM_LO"), 0x1234_5660)
        await host.write(addr("IRQ_ENABLE"), 0b11)
        snapshot = {name: await host.read_ok(name) for name in REGISTERS}
        for a in [0x028, 0x02C, 0x048, 0x07C, 0x0C8, 0xFFC] + rng.sample(unmapped, 20):
            assert a not in mapped
            value, resp = await host.read(a)
            assert (value, resp) == (0, RESP_SLVERR), hex(a)
            assert await host.write(a, rng.getrandbits(32)) == RESP_SLVERR, hex(a)
        mark = len(host.trace)
        for name, reg in REGISTERS.items():
            if reg.access == "RO":
                assert await host.write(reg.offset, 0xFFFFFFFF) == RESP_SLVERR, name
        await host.tick(2)
        assert host.pulses("start", mark) == 0 and host.pulses("soft_reset", mark) == 0
        # Nothing changed (the counter inputs are constant, so their halves too).
        for name in REGISTERS:
            assert await host.read_ok(name) == snapshot[name], name
        # The low two address bits are ignored.
        assert await host.read_ok("ID") == (await host.read(addr("ID") + 3))[0]

    run(bench)


def test_back_to_back_random():
    """Random reads and writes of the RW registers against a model, over many seeds of the
    handshake delays."""
    names = [n for n, r in REGISTERS.items() if r.access == "RW"]
    widths = {n: sum(((1 << f.width) - 1) << f.lsb for f in REGISTERS[n].fields)
              for n in names}

    async def bench(ctx, dut, host):
        rng = random.Random(17)
        model = dict.fromkeys(names, 0)
        reads = 0
        for _ in range(150):
            name = rng.choice(names)
            if rng.random() < 0.5:
                value, strb = rng.getrandbits(32), rng.getrandbits(4)
                assert await host.write(addr(name), value, strb) == RESP_OKAY
                mask = sum(0xFF << (8 * lane) for lane in range(4) if strb >> lane & 1)
                model[name] = (model[name] & ~mask | value & mask) & widths[name]
            else:
                assert await host.read_ok(name) == model[name], name
                reads += 1
        assert reads > 50

    for seed in range(3):
        run(bench, seed=seed)


def test_docs_table():
    text = DOC.read_text()
    assert markdown() in text, "docs/registers.md does not hold markdown() unchanged"
    rows = re.findall(r"^\| (0x[0-9A-F]{3}) \| `(\w+)` \|", text, flags=re.MULTILINE)
    assert len(rows) == len(REGISTERS)
    listed = {name: int(offset, 16) for offset, name in rows}
    assert listed == {name: reg.offset for name, reg in REGISTERS.items()}



def test_overlapping_requests():
    """A manager that issues the next request before taking the previous response: the
    pending response holds, and the next request is served after it."""
    async def bench(ctx, dut, host):
        bus = dut.bus
        # Reads: AR of ID, then AR of VERSION held while R of ID is not taken.
        ctx.set(bus.araddr, addr("ID"))
        ctx.set(bus.arvalid, 1)
        await host.tick()
        ctx.set(bus.araddr, addr("VERSION"))
        for _ in range(4):
            await host.tick()
            assert ctx.get(bus.rvalid) == 1
            assert (ctx.get(bus.rdata), ctx.get(bus.rresp)) == (0x4F54524E, RESP_OKAY)
        ctx.set(bus.rready, 1)
        await host.tick()                     # R of ID taken
        beats = []
        for _ in range(4):
            taken = ctx.get(bus.arvalid) and ctx.get(bus.arready)
            if ctx.get(bus.rvalid):
                beats.append((ctx.get(bus.rdata), ctx.get(bus.rresp)))
            await host.tick()
            if taken:
                ctx.set(bus.arvalid, 0)       # VERSION's AR was taken at this edge
        ctx.set(bus.rready, 0)
        assert ctx.get(bus.arvalid) == 0 and beats == [(1, RESP_OKAY)]

        # Writes: with IRQ_STATUS.error pending and masked, a RO write (SLVERR) whose B is
        # held while a write of IRQ_ENABLE.error arrives: irq shows when that write happens.
        await _pulse(host, dut.error)
        for channel, value in ((bus.awaddr, addr("ID")), (bus.wdata, 7), (bus.wstrb, 0xF)):
            ctx.set(channel, value)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        await host.tick()
        ctx.set(bus.awaddr, addr("IRQ_ENABLE"))
        ctx.set(bus.wdata, 0b10)
        for _ in range(4):
            await host.tick()
            assert (ctx.get(bus.bvalid), ctx.get(bus.bresp)) == (1, RESP_SLVERR)
            assert ctx.get(dut.irq) == 0      # the second write waits for the first's B
        assert ctx.get(bus.awready) == 0 and ctx.get(bus.wready) == 0   # both are held
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        ctx.set(bus.bready, 1)
        await host.tick()                     # B of the RO write taken
        responses = []
        for _ in range(4):
            if ctx.get(bus.bvalid):
                responses.append(ctx.get(bus.bresp))
            await host.tick()
        ctx.set(bus.bready, 0)
        assert responses == [RESP_OKAY]
        assert ctx.get(dut.irq) == 1
        assert await host.read_ok("IRQ_ENABLE") == 0b10

    run(bench)
