"""The delay line on Amaranth's simulator: ``o`` is ``i`` as it was ``delay`` advances ago,
for every delay, with the enable random, against a reference queue."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.delay_line import DelayLine


@pytest.mark.parametrize("depth", [2, 8])
def test_every_delay_with_random_enables(depth):
    for delay in range(depth):
        dut = DelayLine(width=12, depth=depth)
        rng = random.Random(delay)
        checked = []

        async def bench(ctx, dut=dut, delay=delay, rng=rng, checked=checked):
            history = deque([0] * depth, maxlen=depth)     # newest first; zeros at start
            index = 0
            ctx.set(dut.delay, delay)
            for _ in range(300):
                value, enable = rng.randrange(1 << 12), rng.random() < 0.7
                ctx.set(dut.i, value)
                ctx.set(dut.enable, enable)
                ctx.set(dut.index, index)
                # Combinational: this cycle's output before the edge.
                want = value if delay == 0 else history[delay - 1]
                assert ctx.get(dut.o) == want, (delay, index)
                checked.append(want)
                await ctx.tick()
                if enable:
                    history.appendleft(value)
                    index = (index + 1) % depth

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(bench)
        sim.run()
        assert len(checked) == 300 and len(set(checked)) > 100


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 0, "depth": 4}, r"width=0: must be a positive integer"),
    ({"width": 8, "depth": 6}, r"depth=6: must be a power of two, at least 2"),
    ({"width": 8, "depth": 1}, r"depth=1: must be a power of two, at least 2"),
])
def test_refuses_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DelayLine(**kwargs)
