"""The host bridge on Amaranth's simulator, on the core's real register block and a block
RAM memory, bytes fed into its streams with random gaps and a random transmitter stall:
every command and its reply, every error code (and that the bridge answers the next command
after each), the wait for the interrupt, and the stream rules of its output."""

import random
import re
import struct

import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator

from opentrn import config
from opentrn.hdl.block_ram_memory import BlockRAMMemory
from opentrn.hdl.host_bridge import (
    FIELD_BYTES,
    INFO_BYTES,
    REPLY,
    SYNC,
    VERSION,
    Command,
    HostBridge,
    Status,
)
from opentrn.hdl.host_registers import ID_VALUE, REGISTERS, HostRegisters

WORD_BYTES = 8
WORDS = 128
TIMEOUT = 60
MAX_WORDS = 16
CLOCK_HZ = 50_000_000


def _top():
    m = Module()
    m.submodules.bridge = bridge = HostBridge(word_bytes=WORD_BYTES, memory_words=WORDS,
                                              timeout_cycles=TIMEOUT, clock_hz=CLOCK_HZ,
                                              max_words=MAX_WORDS)
    m.submodules.memory = memory = BlockRAMMemory(size_bytes=WORDS * WORD_BYTES,
                                                  addr_width=16, data_width=64, id_width=1)
    m.submodules.registers = registers = HostRegisters(config=config.preset("tiny"))
    wiring.connect(m, bridge.memory, memory.host)
    wiring.connect(m, bridge.host, registers.bus)
    irq = Signal()
    m.d.comb += [bridge.irq.eq(irq), registers.idle.eq(1)]
    return m, bridge, irq


def frame(command, *fields, payload=b""):
    """A command frame: ``fields`` as ``(format, value)`` pairs packed little-endian."""
    body = b"".join(struct.pack("<" + fmt, value) for fmt, value in fields)
    return bytes([SYNC, command]) + body + payload


class _Link:
    """Both byte streams of the bridge, driven one cycle at a time: bytes sent with random
    gaps, the transmitter stalled at random, and the stream rules checked (a byte offered
    stays, unchanged, until taken)."""

    def __init__(self, ctx, bridge, rng, gaps=(0, 0, 1, 3)):
        self.ctx, self.bridge, self.rng, self.gaps = ctx, bridge, rng, gaps
        self.outgoing, self.received = [], bytearray()
        self.offered = None
        self.cycle = 0
        self.pulses = {}          # outgoing byte index -> "framing" / "overrun"
        self.sent = 0
        self.gap = 0

    async def step(self):
        ctx, bridge, rng = self.ctx, self.bridge, self.rng
        rx, tx = bridge.rx, bridge.tx
        pulse = None
        if self.outgoing and self.gap == 0:
            ctx.set(rx.payload, self.outgoing[0])
            ctx.set(rx.valid, 1)
        else:
            ctx.set(rx.valid, 0)
        if self.sent in self.pulses and self.gap == 0:
            pulse = self.pulses.pop(self.sent)
        ctx.set(bridge.rx_framing_error, pulse == "framing")
        ctx.set(bridge.rx_overrun, pulse == "overrun")
        ready = rng.random() < 0.8
        ctx.set(tx.ready, ready)
        if ctx.get(tx.valid):
            byte = ctx.get(tx.payload)
            assert self.offered in (None, byte), "the offered byte changed before its transfer"
            self.offered = byte
            if ready:
                self.received.append(byte)
                self.offered = None
        else:
            assert self.offered is None, "valid dropped before the transfer"
        taken = ctx.get(rx.valid) and ctx.get(rx.ready)
        await ctx.tick()
        self.cycle += 1
        if taken:
            self.outgoing.pop(0)
            self.sent += 1
            self.gap = rng.choice(self.gaps)
        elif self.gap:
            self.gap -= 1

    async def exchange(self, data, reply_bytes, *, pulses=None, limit=5000):
        """Send ``data`` and return the next ``reply_bytes`` bytes received, with the cycles
        from the last byte sent to the reply's first."""
        self.outgoing, self.received, self.sent = list(data), bytearray(), 0
        self.pulses = dict(pulses or {})
        last_sent = first_reply = None
        for _ in range(limit):
            if len(self.received) >= reply_bytes and not self.outgoing:
                return bytes(self.received), first_reply - (last_sent or first_reply)
            await self.step()
            if not self.outgoing and last_sent is None:
                last_sent = self.cycle
            if self.received and first_reply is None:
                first_reply = self.cycle
        raise AssertionError(f"no reply of {reply_bytes} bytes in {limit} cycles "
                             f"(got {bytes(self.received).hex()})")

    async def collect(self, count, limit=5000):
        """Step until ``count`` bytes have been received since the last exchange."""
        for _ in range(limit):
            if len(self.received) >= count:
                return bytes(self.received)
            await self.step()
        raise AssertionError(f"{count} bytes expected, got {bytes(self.received).hex()}")

    async def command(self, command, *fields, payload=b"", reply=0):
        """One command; ``(status, payload)`` of its reply (which echoes the command)."""
        data, _ = await self.exchange(frame(command, *fields, payload=payload), 3)
        assert data[:2] == bytes([REPLY, command]), data.hex()
        status = Status(data[2])
        if status == Status.OK and reply:
            data = await self.collect(3 + reply)
        assert len(data) == 3 + (reply if status == Status.OK else 0), data.hex()
        return status, data[3:]

    async def idle(self, cycles):
        self.received = bytearray()
        for _ in range(cycles):
            await self.step()
        assert not self.received, f"unexpected bytes {bytes(self.received).hex()}"


def _run(bench, *, seed=0, gaps=(0, 0, 1, 3)):
    top, bridge, irq = _top()
    rng = random.Random(seed)

    async def testbench(ctx):
        await bench(ctx, _Link(ctx, bridge, rng, gaps), irq)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("gaps", [(0, 0, 1, 3), (0,)], ids=["random gaps", "back to back"])
def test_info_registers_and_memory(gaps):
    """Every command, its bytes with random gaps or every cycle (no cycle between a
    command's last field and its payload's first byte)."""
    seen = {}

    async def bench(ctx, link, irq):
        seen["info"] = await link.command(Command.INFO, reply=INFO_BYTES)
        seen["id"] = await link.command(Command.REG_READ, ("H", REGISTERS["ID"].offset),
                                        reply=4)
        enable = REGISTERS["IRQ_ENABLE"].offset
        seen["write"] = await link.command(Command.REG_WRITE, ("H", enable), ("I", 3))
        seen["enable"] = await link.command(Command.REG_READ, ("H", enable), reply=4)
        words = [random.Random(1).getrandbits(64) for _ in range(MAX_WORDS)]
        payload = b"".join(w.to_bytes(8, "little") for w in words)
        seen["mem_write"] = await link.command(Command.MEM_WRITE, ("I", WORDS - MAX_WORDS),
                                               ("H", MAX_WORDS), payload=payload)
        seen["mem_read"] = await link.command(Command.MEM_READ, ("I", WORDS - MAX_WORDS),
                                              ("H", MAX_WORDS), reply=8 * MAX_WORDS)
        seen["zero"] = await link.command(Command.MEM_ZERO, ("I", WORDS - MAX_WORDS + 2),
                                          ("I", 3))
        seen["after_zero"] = await link.command(Command.MEM_READ, ("I", WORDS - MAX_WORDS),
                                                ("H", 6), reply=48)
        seen["words"] = words

    _run(bench, gaps=gaps)
    status, info = seen["info"]
    assert status == Status.OK
    assert struct.unpack("<BBHIII", info) == (VERSION, WORD_BYTES, MAX_WORDS, WORDS, TIMEOUT,
                                              CLOCK_HZ)
    assert seen["id"] == (Status.OK, struct.pack("<I", ID_VALUE))
    assert seen["write"] == (Status.OK, b"")
    assert seen["enable"] == (Status.OK, struct.pack("<I", 3))
    assert seen["mem_write"] == (Status.OK, b"")
    words = seen["words"]
    assert seen["mem_read"] == (Status.OK, b"".join(w.to_bytes(8, "little") for w in words))
    assert seen["zero"] == (Status.OK, b"")
    expected = words[:2] + [0, 0, 0] + words[5:6]
    assert seen["after_zero"] == (Status.OK, b"".join(w.to_bytes(8, "little")
                                                       for w in expected))


def test_wait_for_the_interrupt():
    seen = {}

    async def bench(ctx, link, irq):
        # The interrupt rises 30 cycles into a long wait: the answer is 1.
        link.outgoing = list(frame(Command.WAIT_IRQ, ("I", 100_000)))
        while link.outgoing:
            await link.step()
        for _ in range(30):
            await link.step()
        assert not link.received
        ctx.set(irq, 1)
        seen["rose"], _ = await link.exchange(b"", 4)
        # Already high: at once.
        seen["high"] = await link.command(Command.WAIT_IRQ, ("I", 0), reply=1)
        ctx.set(irq, 0)
        # Never rises: 0 after the cycles asked.
        start = link.cycle
        seen["low"] = await link.command(Command.WAIT_IRQ, ("I", 200), reply=1)
        seen["low_cycles"] = link.cycle - start
        # A byte ends a wait at once (payload 0), and is the next command's first.
        link.outgoing = list(frame(Command.WAIT_IRQ, ("I", 100_000)))
        while link.outgoing:
            await link.step()
        for _ in range(10):
            await link.step()
        seen["cut"], _ = await link.exchange(frame(Command.INFO), 4 + 3 + INFO_BYTES)

    _run(bench)
    assert seen["rose"] == bytes([REPLY, Command.WAIT_IRQ, Status.OK, 1])
    assert seen["high"] == (Status.OK, b"\x01")
    assert seen["low"] == (Status.OK, b"\x00")
    assert 200 <= seen["low_cycles"] < 260
    cut = seen["cut"]
    assert cut[:4] == bytes([REPLY, Command.WAIT_IRQ, Status.OK, 0])
    assert cut[4:7] == bytes([REPLY, Command.INFO, Status.OK])


#: ``(label, frame, reply code, answered once the line is quiet (True), at once (False) or
#: after the timeout of a truncated frame (None), line error pulses by byte index)``
ERRORS = [
    ("unknown command", frame(0x42, payload=b"\x01\x02\x03"), Status.UNKNOWN_COMMAND,
     True, {}),
    ("command 0", frame(0x00), Status.UNKNOWN_COMMAND, True, {}),
    ("bad sync", b"\x77\x01", Status.BAD_SYNC, True, {}),
    ("read of 0 words", frame(Command.MEM_READ, ("I", 0), ("H", 0)), Status.BAD_LENGTH,
     False, {}),
    ("read of too many words", frame(Command.MEM_READ, ("I", 0), ("H", MAX_WORDS + 1)),
     Status.BAD_LENGTH, False, {}),
    ("write of too many words", frame(Command.MEM_WRITE, ("I", 0), ("H", MAX_WORDS + 1),
                                      payload=bytes(8 * (MAX_WORDS + 1))),
     Status.BAD_LENGTH, True, {}),
    ("zero of 0 words", frame(Command.MEM_ZERO, ("I", 0), ("I", 0)), Status.BAD_LENGTH,
     False, {}),
    ("read past the memory", frame(Command.MEM_READ, ("I", WORDS - 1), ("H", 2)),
     Status.OUT_OF_RANGE, False, {}),
    ("write past the memory", frame(Command.MEM_WRITE, ("I", WORDS), ("H", 1),
                                    payload=bytes(8)), Status.OUT_OF_RANGE, True, {}),
    ("zero past the memory", frame(Command.MEM_ZERO, ("I", 2**32 - 1), ("I", 2)),
     Status.OUT_OF_RANGE, False, {}),
    ("register past 4 KiB", frame(Command.REG_READ, ("H", 0x1000)), Status.OUT_OF_RANGE,
     False, {}),
    ("write to a read-only register", frame(Command.REG_WRITE, ("H", REGISTERS["ID"].offset),
                                            ("I", 1)), Status.BUS_ERROR, False, {}),
    ("read of an unmapped register", frame(Command.REG_READ, ("H", 0xFFC)),
     Status.BUS_ERROR, False, {}),
    ("framing error in the fields", frame(Command.REG_READ, ("H", 0)), Status.FRAMING,
     True, {3: "framing"}),
    ("overrun in a payload", frame(Command.MEM_WRITE, ("I", 0), ("H", 1), payload=bytes(8)),
     Status.OVERRUN, True, {10: "overrun"}),
    ("framing error between frames", b"", Status.FRAMING, True, {0: "framing"}),
    ("truncated fields", frame(Command.REG_WRITE, ("H", 0x20), ("I", 1))[:5],
     Status.TIMEOUT, None, {}),
    ("truncated payload", frame(Command.MEM_WRITE, ("I", 0), ("H", 2),
                                payload=bytes(13)), Status.TIMEOUT, None, {}),
    ("only the sync byte", bytes([SYNC]), Status.TIMEOUT, None, {}),
]


def test_every_error_is_answered_with_its_code_and_the_next_command_works():
    """Each case of :data:`ERRORS` in turn, in one simulation: its reply (the command echoed,
    the code), when it comes (at once, or once the line has been quiet for the timeout),
    nothing after it, and a register read answered right after."""
    seen = []

    async def bench(ctx, link, irq):
        for label, data, _, _, pulses in ERRORS:
            reply, waited = await link.exchange(data, 3, pulses=pulses)
            await link.idle(3 * TIMEOUT)        # nothing else comes
            after = await link.command(Command.REG_READ, ("H", REGISTERS["ID"].offset),
                                       reply=4)
            seen.append((label, reply, waited, after))

    _run(bench)
    assert len(seen) == len(ERRORS)
    for (label, data, code, drained, _), (_, reply, waited, after) in zip(ERRORS, seen,
                                                                         strict=True):
        echo = data[1] if len(data) > 1 and data[0] == SYNC else (data[0] if data else 0)
        if code == Status.TIMEOUT and len(data) == 1:
            echo = 0            # only the sync byte came: no command to echo
        assert reply == bytes([REPLY, echo, code]), label
        if drained is False:      # answered at once
            assert waited <= 20, (label, waited)
        else:                     # once the line was quiet (or the frame stopped) that long
            assert TIMEOUT <= waited <= TIMEOUT + 20, (label, waited)
        assert after == (Status.OK, struct.pack("<I", ID_VALUE)), label


def test_a_truncated_write_keeps_its_complete_words():
    seen = {}

    async def bench(ctx, link, irq):
        words = b"".join(bytes([i] * 8) for i in range(1, 4))
        reply, _ = await link.exchange(frame(Command.MEM_WRITE, ("I", 10), ("H", 3),
                                             payload=words[:20]), 3)
        seen["reply"] = reply
        seen["back"] = await link.command(Command.MEM_READ, ("I", 10), ("H", 3), reply=24)

    _run(bench)
    assert seen["reply"] == bytes([REPLY, Command.MEM_WRITE, Status.TIMEOUT])
    assert seen["back"] == (Status.OK, bytes([1] * 8 + [2] * 8 + [0] * 8))


def test_the_field_table_covers_every_command():
    assert set(FIELD_BYTES) == set(Command)


@pytest.mark.parametrize("arguments, message", [
    ({"word_bytes": 0}, "word_bytes=0: must be a positive integer"),
    ({"memory_words": 1 << 32}, "memory_words=4,294,967,296: must fit 32 bits"),
    ({"max_words": 1 << 16}, "max_words=65,536: must fit 16 bits"),
    ({"timeout_cycles": -1}, "timeout_cycles=-1: must be a positive integer"),
])
def test_bad_parameters_are_refused_by_name(arguments, message):
    settings = {"word_bytes": 8, "memory_words": 128, "timeout_cycles": 100,
                "clock_hz": 100, **arguments}
    with pytest.raises(ValueError, match=re.escape(message)):
        HostBridge(**settings)
