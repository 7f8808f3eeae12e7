"""DmaUnit on Amaranth's simulator: every field of a DMA instruction into its descriptor,
the OUT_OF_RANGE verdict exactly when an address or stride field is wider than the build's
descriptor, and retire / retire_bytes / active against the DMA engine's done pulses."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from opentrn import config, isa
from opentrn.hdl.dma import _addr_bits
from opentrn.hdl.dma_unit import IN_FLIGHT, DmaUnit

Opcode, Fault = isa.Opcode, isa.Fault
CONFIGS = {
    "tiny": config.preset("tiny"),
    # The largest buffer, not HBM, sets the width: 64 KiB of SBUF per partition, 16 KiB of HBM.
    "sbuf-wide": config.preset("tiny").replace(hbm_bytes=4 * 4096,
                                               sbuf_bytes_per_partition=64 * 1024),
}
WIDE = [f"{side}_{name}" for side in ("src", "dst") for name in ("addr", "stride1", "stride2")]
SIDE = ("addr", "partition", "stride1", "stride2", "pstep1", "pstep2")


def _fields(rng, addr_bits):
    """Random DMA fields, address and stride fields fitting ``addr_bits`` (edges often)."""
    values = {}
    for f in isa.FORMATS[Opcode.DMA]:
        width = addr_bits if f.name in WIDE else f.width
        values[f.name] = rng.choice([0, (1 << width) - 1, rng.randrange(1 << width),
                                     rng.getrandbits(rng.randrange(1, width + 1))])
    return values


def _bits(opcode, values):
    return int.from_bytes(isa.encode(opcode, **values), "little")


def _sim(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fault_exactly_when_too_wide(name):
    cfg = CONFIGS[name]
    addr_bits = _addr_bits(cfg)
    assert addr_bits == {"tiny": 24, "sbuf-wide": 16}[name]
    rng = random.Random(name)
    dut = DmaUnit(config=cfg)
    stats = {"faults": 0}

    async def bench(ctx):
        for _ in range(1500):
            values = _fields(rng, addr_bits)
            wide = set()
            for field in rng.sample(WIDE, rng.choice([0, 0, 1, 1, 2, 6])):
                # Just past the limit, the top bit, or anything wider.
                values[field] = rng.choice([1 << addr_bits, (1 << 48) - 1,
                                            rng.randrange(1 << addr_bits, 1 << 48)])
                wide.add(field)
            opcode = Opcode.DMA if rng.random() < 0.8 else rng.choice(
                [Opcode.NOP, Opcode.END, Opcode.MATMUL])
            bits = _bits(Opcode.DMA, values) & ~0xFF | opcode
            check_valid = rng.random() < 0.85
            ctx.set(dut.check.as_value(), bits)
            ctx.set(dut.check_valid, check_valid)
            expected = Fault.OUT_OF_RANGE if wide and check_valid and opcode == Opcode.DMA \
                else Fault.NONE
            assert ctx.get(dut.fault) == expected, (values, wide, opcode, check_valid)
            stats["faults"] += expected != Fault.NONE

    _sim(dut, bench)
    assert stats["faults"] > 300


@pytest.mark.parametrize("name", list(CONFIGS))
def test_descriptors_and_retires(name):
    """Random instructions offered with gaps, a DMA engine with random ``ready`` that
    finishes each descriptor in order at least two cycles after taking it (its own queue is
    buffered, so it cannot be quicker): every descriptor field equals the instruction's,
    ``retire`` is ``dma_done``, ``retire_bytes`` the finishing descriptor's bytes and
    ``active`` whether one is unfinished."""
    cfg = CONFIGS[name]
    addr_bits = _addr_bits(cfg)
    rng = random.Random(f"{name}-retire")
    dut = DmaUnit(config=cfg)
    program = [_fields(rng, addr_bits) for _ in range(150)]
    for values in program[:5]:      # the largest byte count
        values.update(n0=(1 << 16) - 1, n1=(1 << 16) - 1, n2=(1 << 16) - 1, elem_log2=3)
    stats = {"max_unfinished": 0, "back_to_back": 0}

    async def bench(ctx):
        source, sink = dut.instruction, dut.descriptor
        offered = None
        accepted = 0
        unfinished = deque()            # (earliest finish cycle, bytes)
        finished = 0
        last_done = -2
        checked = None                  # checked this cycle: offered from the next
        for cycle in range(20000):
            if checked is not None:
                offered, checked = checked, None
                ctx.set(source.payload.as_value(), _bits(Opcode.DMA, offered))
            elif offered is None and accepted < len(program) and rng.random() < 0.7:
                # As the sequencer does: the check cycle, then the offer.
                checked = program[accepted]
            ctx.set(dut.check.as_value(), _bits(Opcode.DMA, checked) if checked else
                    rng.getrandbits(len(dut.check.as_value())))
            ctx.set(dut.check_valid, checked is not None)
            ctx.set(source.valid, offered is not None)
            ready = rng.random() < 0.6
            ctx.set(sink.ready, ready)
            # Phases of slow finishes (the record fills) and of finishes as fast as allowed
            # (back to back; instructions come at most every other cycle, each after its
            # check cycle, so only a full record drains back to back).
            done = bool(unfinished) and unfinished[0][0] <= cycle and (
                (finished // 25) % 2 == 1 or rng.random() < 0.1)
            ctx.set(dut.dma_done, done)

            assert ctx.get(dut.active) == bool(unfinished), cycle
            # The unit takes a descriptor only while it can record its byte count: at most
            # IN_FLIGHT unfinished (a finish frees its entry from the next cycle).
            room = len(unfinished) < IN_FLIGHT
            assert ctx.get(dut.retire) == done, cycle
            if done:
                assert ctx.get(dut.retire_bytes) == unfinished[0][1], cycle
                unfinished.popleft()
                finished += 1
                stats["back_to_back"] += last_done == cycle - 1
                last_done = cycle
            valid = ctx.get(sink.valid)
            took = ctx.get(source.ready)
            assert valid == (offered is not None and room), cycle
            assert took == (room and ready), cycle
            if valid:
                got = {}
                for field in ("src_space", "dst_space", "elem_log2", "n0", "n1", "n2"):
                    got[field] = ctx.get(getattr(sink.payload, field))
                for side in ("src", "dst"):
                    for field in SIDE:
                        got[f"{side}_{field}"] = ctx.get(
                            getattr(getattr(sink.payload, side), field))
                assert got == offered, cycle
            if offered is not None and took:
                size = (offered["n0"] << offered["elem_log2"]) * offered["n1"] * offered["n2"]
                unfinished.append((cycle + 2, size))
                offered = None
                accepted += 1
            stats["max_unfinished"] = max(stats["max_unfinished"], len(unfinished))
            if finished == len(program):
                await ctx.tick()
                assert not ctx.get(dut.active)
                return
            await ctx.tick()
        raise AssertionError(f"{accepted} accepted, {finished} finished")

    _sim(dut, bench)
    # The unit holds the byte counts of the DMA's queue, the running descriptor and the
    # hand-over register, and no more.
    assert stats["max_unfinished"] == IN_FLIGHT and stats["back_to_back"] > 20
