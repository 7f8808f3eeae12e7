"""The skid buffer on Amaranth's simulator: every transfer in, out in order and in the same
cycle while it is empty; its ``i.ready`` and ``o.valid`` independent of ``o.ready``; an
offered output held until taken; one transfer per cycle."""

import random

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.skid_buffer import SkidBuffer


def _run(bench_body, layout=12):
    dut = SkidBuffer(layout=layout)

    async def bench(ctx):
        await bench_body(ctx, dut)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("offer_rate, take_rate", [(0.5, 0.5), (0.9, 0.3), (0.3, 0.9),
                                                   (1.0, 1.0)])
def test_random_handshakes(offer_rate, take_rate):
    rng = random.Random(int(offer_rate * 10 + take_rate * 100))
    sent, received = [], []

    async def body(ctx, dut):
        held = None                 # the output offered and not yet taken
        for cycle in range(1000):
            # The producer may change or withdraw an offer the buffer did not take.
            valid = rng.random() < offer_rate
            payload = rng.randrange(1 << 12)
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, payload)
            seen = {}
            for ready in (0, 1):
                ctx.set(dut.o.ready, ready)
                seen[ready] = (ctx.get(dut.o.valid), ctx.get(dut.o.payload),
                               ctx.get(dut.i.ready))
            assert seen[0] == seen[1], cycle      # nothing depends on o.ready
            o_valid, o_payload, i_ready = seen[0]
            if held is not None:
                assert (o_valid, o_payload) == (1, held), cycle
            if not i_ready:
                assert o_valid, cycle             # a kept payload is on the output
            elif valid:
                assert (o_valid, o_payload) == (1, payload), cycle    # no latency
            take = rng.random() < take_rate
            ctx.set(dut.o.ready, take)
            if valid and i_ready:
                sent.append(payload)
            if o_valid and take:
                received.append(o_payload)
                held = None
            elif o_valid:
                held = o_payload
            await ctx.tick()

    _run(body)
    assert len(received) > 250
    assert received == sent[:len(received)]
    assert len(sent) - len(received) <= 1


def test_one_transfer_per_cycle_after_a_stall():
    """A consumer that stalls for a cycle costs that cycle only: the kept payload, then the
    producer's next ones through the bypass, one a cycle."""
    async def body(ctx, dut):
        produced, received = 0, []
        for cycle in range(12):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, produced)
            take = cycle not in (3, 7)
            ctx.set(dut.o.ready, take)
            if ctx.get(dut.i.ready):
                produced += 1
            if ctx.get(dut.o.valid) and take:
                received.append(ctx.get(dut.o.payload))
            await ctx.tick()
        assert received == list(range(10))

    _run(body)
