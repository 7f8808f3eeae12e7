"""SemaphoreFile on Amaranth's simulator: random simultaneous increments from three ports,
often on the same index, against a Python model every cycle."""

import random

import pytest
from amaranth.sim import Simulator

from opentrn import config
from opentrn.hdl.semaphores import SemaphoreFile

PORTS = 3


@pytest.mark.parametrize("semaphores", [8, 5, 1])
def test_random_increments(semaphores):
    cfg = config.preset("tiny").replace(semaphores=semaphores)
    rng = random.Random(semaphores)
    dut = SemaphoreFile(config=cfg, ports=PORTS)
    stats = {"collisions": 0}

    async def bench(ctx):
        model = [0] * semaphores
        for cycle in range(600):
            # The new values show from the cycle after the increments.
            assert [ctx.get(dut.values[i]) for i in range(semaphores)] == model, cycle
            # Bursts of one index on every port, then spread-out traffic.
            hot = rng.randrange(semaphores) if (cycle // 50) % 2 else None
            requests = []
            for port in dut.signal:
                valid = rng.random() < 0.7
                index = hot if hot is not None and rng.random() < 0.8 \
                    else rng.randrange(semaphores)
                ctx.set(port.valid, valid)
                ctx.set(port.index, index)
                if valid:
                    requests.append(index)
            for index in requests:
                model[index] += 1
            stats["collisions"] += len(requests) - len(set(requests))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert stats["collisions"] > 100
