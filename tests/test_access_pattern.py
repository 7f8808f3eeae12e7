"""The DMA's access-pattern walker on Amaranth's simulator, word by word against a reference
list of every row's words; and its ``lane_count_after_step``, what the DMA registers its
"enough bytes" decision from, against the lane count the next word shows."""

import random

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.access_pattern import AccessPatternWalker


def reference_words(pattern, word_bytes):
    """``(word index, first lane, lane count, partition)`` of every word, in walk order."""
    words = []
    for i2 in range(pattern["n2"]):
        for i1 in range(pattern["n1"]):
            start = pattern["addr"] + i1 * pattern["stride1"] + i2 * pattern["stride2"]
            partition = pattern["partition"] + i1 * pattern["pstep1"] + i2 * pattern["pstep2"]
            end = start + pattern["row_bytes"]
            byte = start
            while byte < end:
                word = byte // word_bytes
                lane = byte % word_bytes
                count = min(end, (word + 1) * word_bytes) - byte
                words.append((word, lane, count, partition))
                byte += count
    return words


def random_pattern(rng, word_bytes):
    row_bytes = rng.choice([1, 2, 3, word_bytes - 1, word_bytes, word_bytes + 1,
                            rng.randrange(1, 5 * word_bytes)])
    return {"addr": rng.randrange(0, 3 * word_bytes), "partition": rng.randrange(4),
            "stride1": rng.choice([row_bytes, row_bytes + rng.randrange(1, 9),
                                   rng.randrange(1, 40)]),
            "stride2": rng.randrange(1, 200), "pstep1": rng.randrange(3),
            "pstep2": rng.randrange(3), "n1": rng.randrange(1, 5), "n2": rng.randrange(1, 4),
            "row_bytes": max(1, row_bytes)}


@pytest.mark.parametrize("word_bytes", [4, 8])
def test_words_and_lane_count_after_step(word_bytes):
    dut = AccessPatternWalker(word_bytes=word_bytes, addr_bits=12, partition_bits=8,
                              size_bits=8, row_bytes_bits=8, max_burst=16)
    rng = random.Random(word_bytes)
    walked = []

    async def bench(ctx):
        for _ in range(60):
            pattern = random_pattern(rng, word_bytes)
            want = reference_words(pattern, word_bytes)
            for name, value in pattern.items():
                ctx.set(getattr(dut, name), value)
            ctx.set(dut.load, 1)
            await ctx.tick()
            ctx.set(dut.load, 0)
            seen, predicted = [], None
            while ctx.get(dut.active):
                current = (ctx.get(dut.word), ctx.get(dut.first_lane), ctx.get(dut.lane_count),
                           ctx.get(dut.row_partition))
                if predicted is not None:
                    assert current[2] == predicted, (pattern, len(seen))
                step = rng.random() < 0.7
                ctx.set(dut.step, step)
                if step:
                    seen.append(current)
                    predicted = ctx.get(dut.lane_count_after_step)
                await ctx.tick()
                assert len(seen) <= len(want), pattern
            ctx.set(dut.step, 0)
            assert seen == want, pattern
            walked.append(len(seen))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert sum(walked) > 300 and max(walked) > 10
