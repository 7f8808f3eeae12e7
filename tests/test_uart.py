"""The UART receiver and transmitter on Amaranth's simulator: random bytes back to back at
several divisors and with the sender's clock 2% off either way, a missing stop bit (framing
error, the byte dropped, a break reported once), a glitch ignored, an overrun, the
transmitter's exact frame timing, and a loopback."""

import random
import re

import pytest
from amaranth import Module
from amaranth.sim import Simulator

from opentrn.hdl.uart_receiver import MIN_DIVISOR, UARTReceiver
from opentrn.hdl.uart_transmitter import UARTTransmitter


def _line(frames, bit_cycles, *, idle=7):
    """The rx level of each cycle: ``frames`` (``(byte, stop level)``, ``("low", cycles)``
    for the line held low or ``("high", cycles)``) sent back to back, each bit
    ``bit_cycles`` (a float: a sender whose clock is off) long, after ``idle`` cycles
    high."""
    time = float(idle)
    bits = []
    for frame in frames:
        if frame[0] in ("low", "high"):
            bits.append((int(frame[0] == "high"), frame[1]))
            continue
        byte, stop = frame
        bits += [(0, bit_cycles)] + [((byte >> k) & 1, bit_cycles) for k in range(8)] + \
            [(stop, bit_cycles)]
    levels = [1] * idle
    for level, length in bits:
        end = time + length
        levels += [level] * (round(end) - round(time))
        time = end
    return levels + [1] * int(4 * bit_cycles)


def _receive(divisor, levels, *, ready=lambda cycle: True):
    """Run the receiver over ``levels``; the bytes taken and the cycles of its pulses."""
    dut = UARTReceiver(divisor=divisor)
    got = {"bytes": [], "framing": [], "overrun": []}

    async def bench(ctx):
        for cycle, level in enumerate(levels):
            ctx.set(dut.rx, level)
            take = ready(cycle)
            ctx.set(dut.output.ready, take)
            if ctx.get(dut.output.valid) and take:
                got["bytes"].append(ctx.get(dut.output.payload))
            if ctx.get(dut.framing_error):
                got["framing"].append(cycle)
            if ctx.get(dut.overrun):
                got["overrun"].append(cycle)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


@pytest.mark.parametrize("divisor, skew", [(4, 0), (5, 0), (16, 0), (16, 0.02), (16, -0.02),
                                           (100, 0.02), (100, -0.02)])
def test_random_bytes_back_to_back(divisor, skew):
    rng = random.Random(divisor)
    data = [rng.randrange(256) for _ in range(40 if divisor < 100 else 6)] + [0x00, 0xFF]
    got = _receive(divisor, _line([(byte, 1) for byte in data], divisor * (1 + skew)))
    assert got == {"bytes": data, "framing": [], "overrun": []}


def test_a_missing_stop_bit_is_a_framing_error_and_a_break_one_error():
    divisor = 8
    # After a low stop bit the line must go high before a start bit can be told apart from
    # a data bit: a sender with a wrong rate or a noise burst leaves such a gap.
    frames = [(0x41, 1), (0x42, 0), ("high", 2 * divisor), (0x43, 1), ("low", 40 * divisor),
              ("high", 3 * divisor), (0x44, 1)]
    got = _receive(divisor, _line(frames, divisor))
    assert got["bytes"] == [0x41, 0x43, 0x44]
    assert len(got["framing"]) == 2      # the bad stop bit, and the break (once)
    assert got["overrun"] == []


def test_a_glitch_shorter_than_half_a_bit_is_not_a_start_bit():
    divisor = 16
    levels = [1] * 10 + [0] * 5 + [1] * 60 + _line([(0x5A, 1)], divisor)
    assert _receive(divisor, levels) == {"bytes": [0x5A], "framing": [], "overrun": []}


def test_a_byte_that_finds_the_last_one_untaken_is_dropped_as_an_overrun():
    divisor = 4
    levels = _line([(1, 1), (2, 1), (3, 1)], divisor)
    # Nothing is taken until well after the third byte: the first stays, the others drop.
    got = _receive(divisor, levels, ready=lambda cycle: cycle > len(levels) - 5)
    assert got["bytes"] == [1]
    assert len(got["overrun"]) == 2 and got["framing"] == []


def _transmit(divisor, data, *, gap=lambda index: 0):
    """Send ``data`` (byte ``i`` offered ``gap(i)`` cycles after the last was taken); the
    tx level of every cycle and the cycle each byte was taken."""
    dut = UARTTransmitter(divisor=divisor)
    seen = {"levels": [], "taken": []}

    async def bench(ctx):
        cycle = 0
        for index, byte in enumerate(data):
            for _ in range(gap(index)):
                seen["levels"].append(ctx.get(dut.tx))
                await ctx.tick()
                cycle += 1
            ctx.set(dut.input.payload, byte)
            ctx.set(dut.input.valid, 1)
            while True:
                seen["levels"].append(ctx.get(dut.tx))
                taken = ctx.get(dut.input.ready)
                await ctx.tick()
                cycle += 1
                if taken:
                    seen["taken"].append(cycle - 1)
                    break
            ctx.set(dut.input.valid, 0)
        for _ in range(12 * divisor):
            seen["levels"].append(ctx.get(dut.tx))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _decode(levels, divisor):
    """The frames on a line, by their exact bit times: ``[(start cycle, byte, stop)]``."""
    frames, cycle = [], 0
    while cycle < len(levels):
        if levels[cycle]:
            cycle += 1
            continue
        bits = [levels[cycle + k * divisor: cycle + (k + 1) * divisor] for k in range(10)]
        assert all(len(set(bit)) == 1 for bit in bits), "a bit changed within its time"
        byte = sum(bits[k + 1][0] << k for k in range(8))
        frames.append((cycle, byte, bits[9][0]))
        cycle += 10 * divisor
    return frames


@pytest.mark.parametrize("divisor", [4, 7, 100])
def test_the_transmitter_sends_exact_frames_back_to_back(divisor):
    rng = random.Random(divisor)
    data = [rng.randrange(256) for _ in range(20 if divisor < 100 else 3)] + [0, 255]
    seen = _transmit(divisor, data)
    frames = _decode(seen["levels"], divisor)
    assert [byte for _, byte, _ in frames] == data
    assert all(stop == 1 for _, _, stop in frames)
    starts = [start for start, _, _ in frames]
    # Each frame starts the cycle after its byte is taken; back to back: 10 bits apart.
    assert starts == [taken + 1 for taken in seen["taken"]]
    assert {b - a for a, b in zip(starts, starts[1:], strict=False)} == {10 * divisor}
    assert seen["levels"][0] == 1 and seen["levels"][-1] == 1


def test_the_transmitter_idles_high_between_bytes_offered_late():
    seen = _transmit(5, [0x12, 0x34, 0x56], gap=lambda index: 17 * index)
    frames = _decode(seen["levels"], 5)
    assert [byte for _, byte, _ in frames] == [0x12, 0x34, 0x56]
    assert [start for start, _, _ in frames] == [taken + 1 for taken in seen["taken"]]


def test_loopback_at_the_smallest_divisor():
    rng = random.Random(3)
    data = [rng.randrange(256) for _ in range(30)]
    m = Module()
    m.submodules.tx = tx = UARTTransmitter(divisor=MIN_DIVISOR)
    m.submodules.rx = rx = UARTReceiver(divisor=MIN_DIVISOR)
    m.d.comb += rx.rx.eq(tx.tx)
    got = []

    async def bench(ctx):
        pending = list(data)
        ctx.set(rx.output.ready, 1)
        for _ in range(len(data) * 10 * MIN_DIVISOR + 50):
            if pending:
                ctx.set(tx.input.payload, pending[0])
                ctx.set(tx.input.valid, 1)
            else:
                ctx.set(tx.input.valid, 0)
            if pending and ctx.get(tx.input.ready):
                pending.pop(0)
            if ctx.get(rx.output.valid):
                got.append(ctx.get(rx.output.payload))
            assert not ctx.get(rx.framing_error) and not ctx.get(rx.overrun)
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == data


@pytest.mark.parametrize("cls, divisor, message", [
    (UARTReceiver, 3, "divisor=3: must be at least 4 clocks per bit"),
    (UARTReceiver, 0, "divisor=0: must be a positive integer"),
    (UARTTransmitter, 2.5, "divisor=2.5: must be a positive integer"),
])
def test_bad_divisors_are_refused_by_name(cls, divisor, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(divisor=divisor)
