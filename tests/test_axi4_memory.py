"""AXI4Memory (the simulated HBM in hardware) on Amaranth's simulator: the timing the
cycle model and cocotbext-axi's RAM share (a read's first beat ``2 + latency`` cycles after
its address, a write response ``2 + latency`` after the last beat), byte strobes, the
written range, and an error code for each burst it does not serve."""

import re

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.axi4 import BURST_INCR
from opentrn.hdl.axi4_memory import ERRORS, AXI4Memory

BUS_BYTES = 8
SIZE = 4 * 4096


def _memory(**kwargs):
    return AXI4Memory(size_bytes=SIZE, addr_width=16, data_width=8 * BUS_BYTES, id_width=2,
                      **kwargs)


def _simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def _write_burst(ctx, axi, addr, words, *, strobe=(1 << BUS_BYTES) - 1, awid=0,
                       size=3, burst=BURST_INCR):
    """AW, then the W beats back to back; returns the cycle of the last beat."""
    ctx.set(axi.awaddr, addr)
    ctx.set(axi.awlen, len(words) - 1)
    ctx.set(axi.awsize, size)
    ctx.set(axi.awburst, burst)
    ctx.set(axi.awid, awid)
    ctx.set(axi.awvalid, 1)
    while not ctx.get(axi.awready):
        await ctx.tick()
    await ctx.tick()
    ctx.set(axi.awvalid, 0)
    for index, word in enumerate(words):
        ctx.set(axi.wdata, word)
        ctx.set(axi.wstrb, strobe)
        ctx.set(axi.wlast, index == len(words) - 1)
        ctx.set(axi.wvalid, 1)
        assert ctx.get(axi.wready)
        await ctx.tick()
    ctx.set(axi.wvalid, 0)


async def _read_burst(ctx, axi, addr, beats, *, arid=1):
    """The beats of one read burst and the cycles from the address to the first beat."""
    ctx.set(axi.araddr, addr)
    ctx.set(axi.arlen, beats - 1)
    ctx.set(axi.arsize, 3)
    ctx.set(axi.arburst, BURST_INCR)
    ctx.set(axi.arid, arid)
    ctx.set(axi.arvalid, 1)
    assert ctx.get(axi.arready)
    await ctx.tick()
    ctx.set(axi.arvalid, 0)
    ctx.set(axi.rready, 1)
    waited, data = 1, []
    while not ctx.get(axi.rvalid):
        waited += 1
        await ctx.tick()
    first = waited
    while True:
        assert ctx.get(axi.rvalid)
        assert ctx.get(axi.rid) == arid
        data.append(ctx.get(axi.rdata))
        last = ctx.get(axi.rlast)
        await ctx.tick()
        if last:
            break
    ctx.set(axi.rready, 0)
    return data, first


@pytest.mark.parametrize("latency", [0, 5])
def test_writes_then_reads_with_the_shared_timing(latency):
    dut = _memory()
    words = [0x1111_2222_3333_4444 * (i + 1) & (1 << 64) - 1 for i in range(4)]
    seen = {}

    async def bench(ctx):
        axi = dut.axi
        ctx.set(dut.latency, latency)
        ctx.set(axi.bready, 1)
        assert ctx.get(dut.written_end) == 0
        await _write_burst(ctx, axi, 0x100, words, awid=2)
        # The response: 2 + latency cycles after the last beat.
        waited = 1
        while not ctx.get(axi.bvalid):
            waited += 1
            await ctx.tick()
        seen["b"] = waited
        assert ctx.get(axi.bid) == 2
        await ctx.tick()
        # Strobes: only bytes 0 and 7 of the word at 0x108.
        await _write_burst(ctx, axi, 0x108, [0xAA00_0000_0000_00BB], strobe=0b1000_0001)
        while not ctx.get(axi.bvalid):
            await ctx.tick()
        await ctx.tick()
        seen["range"] = (ctx.get(dut.written_begin), ctx.get(dut.written_end))
        seen["data"], seen["r"] = await _read_burst(ctx, axi, 0x100, 4)
        ctx.set(dut.clear_written, 1)
        await ctx.tick()
        seen["cleared"] = (ctx.get(dut.written_begin), ctx.get(dut.written_end))
        seen["error"] = ctx.get(dut.error)

    _simulate(dut, bench)
    assert seen["b"] == 2 + latency
    assert seen["r"] == 2 + latency
    expected = list(words)
    expected[1] = (words[1] & 0x00FF_FFFF_FFFF_FF00) | 0xAA00_0000_0000_00BB
    assert seen["data"] == expected
    assert seen["range"] == (0x100, 0x120)
    assert seen["cleared"] == (0, 0)
    assert seen["error"] == 0


@pytest.mark.parametrize("code, burst", [
    (1, {"size": 2}),
    (2, {"burst": 0}),
    (3, {"addr": 4096 - 8}),
    (4, {"addr": SIZE - 8}),
])
def test_a_burst_it_does_not_serve_sets_its_error_code(code, burst):
    dut = _memory()
    seen = {}

    async def bench(ctx):
        ctx.set(dut.axi.bready, 1)
        addr = burst.get("addr", 0)
        options = {name: value for name, value in burst.items() if name != "addr"}
        await _write_burst(ctx, dut.axi, addr, [1, 2], **options)
        await ctx.tick()
        seen["error"] = ctx.get(dut.error)

    _simulate(dut, bench)
    assert seen["error"] == code, ERRORS[code]


def test_a_write_beat_before_its_address_is_an_error():
    dut = _memory()
    seen = {}

    async def bench(ctx):
        ctx.set(dut.axi.wvalid, 1)
        ctx.set(dut.axi.wlast, 1)
        await ctx.tick()
        ctx.set(dut.axi.wvalid, 0)
        await ctx.tick()
        seen["error"] = ctx.get(dut.error)
        seen["range"] = ctx.get(dut.written_end)

    _simulate(dut, bench)
    assert seen["error"] == 5
    assert seen["range"] == 0


@pytest.mark.parametrize("arguments, message", [
    ({"size_bytes": 100}, "size_bytes must be a multiple of the bus word (8 bytes), not 100"),
    ({"size_bytes": 1 << 31}, "a simulated memory holds at most"),
    ({"size_bytes": 1 << 20, "addr_width": 16}, "does not fit 16 address bits"),
    ({"outstanding": 0}, "outstanding must be a positive integer, not 0"),
])
def test_bad_parameters_are_refused_by_name(arguments, message):
    settings = {"size_bytes": SIZE, "addr_width": 32, "data_width": 64, "id_width": 2,
                **arguments}
    with pytest.raises(ValueError, match=re.escape(message)):
        AXI4Memory(**settings)
