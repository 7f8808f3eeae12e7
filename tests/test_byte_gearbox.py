"""The DMA's realignment buffer against a byte queue: random pushes (from any lane) and pops of
up to a word per cycle, every cycle's head, poison and level compared."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.byte_gearbox import ByteGearbox


@pytest.mark.parametrize("word_bytes, capacity", [(1, 2), (4, 16), (8, 32), (16, 32)])
def test_byte_gearbox_is_a_byte_queue(word_bytes, capacity):
    rng = random.Random(f"gearbox-{word_bytes}-{capacity}")
    dut = ByteGearbox(word_bytes=word_bytes, capacity=capacity)
    queue = deque()                                  # (byte, poison), oldest first

    async def bench(ctx):
        for cycle in range(3000):
            level = len(queue)
            assert ctx.get(dut.level) == level, cycle
            head = ctx.get(dut.head.as_value())
            head_poison = ctx.get(dut.head_poison)
            for lane in range(word_bytes):
                byte, poison = queue[lane] if lane < level else (0, 0)
                assert (head >> (8 * lane)) & 0xFF == byte, (cycle, lane)
                assert (head_poison >> lane) & 1 == poison, (cycle, lane)
            # Bursts of pushes or of pops so the level sweeps the whole range.
            pop = rng.randint(0, min(level, word_bytes)) if rng.random() < 0.5 else 0
            push = rng.randint(0, min(capacity - level, word_bytes))
            lane = rng.randint(0, word_bytes - max(push, 1))     # where the pushed bytes start
            data = [rng.randrange(256) for _ in range(word_bytes)]
            bad = rng.random() < 0.2
            ctx.set(dut.pop_count, pop)
            ctx.set(dut.push_count, push)
            ctx.set(dut.push_lane, lane)
            ctx.set(dut.push_data.as_value(), sum(b << (8 * i) for i, b in enumerate(data)))
            ctx.set(dut.push_poison, (1 << word_bytes) - 1 if bad else 0)
            for _ in range(pop):
                queue.popleft()
            queue.extend((byte, int(bad)) for byte in data[lane:lane + push])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("word_bytes, capacity, message", [
    (3, 12, "word_bytes=3: must be a power of two"),
    (4, 24, "capacity=24: must be a power of two"),
    (4, 4, "capacity=4: must be at least 2 \\* word_bytes = 8"),
])
def test_byte_gearbox_refuses(word_bytes, capacity, message):
    with pytest.raises(ValueError, match=message):
        ByteGearbox(word_bytes=word_bytes, capacity=capacity)
