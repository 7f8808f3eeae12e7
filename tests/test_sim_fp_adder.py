"""The FP32 adder RTL under cocotb on both simulators: every sum bit-exact against the golden
model, on the directed cases and on a million corner-weighted random pairs (tests/conftest.py:
FP_VECTORS) whose corners
(subnormal, infinite and NaN results, exact and massive cancellation, ties rounding up,
overflow) were actually met."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import config
from opentrn.golden.fp_adder import add
from opentrn.hdl.fp_adder import MAX_STAGES, TEST_LANES, FPAdder
from opentrn.sim import runner
from opentrn.sim.tb_fp_adder import COVERAGE_CLASSES, coverage, directed_pairs, random_pairs

from .conftest import FP_VECTORS, require_simulator

#: Random pairs per simulator run.
VECTORS = FP_VECTORS
SEED = 3
#: The corners each run must reach (the other classes are reported too).
CORNERS = ("subnormal_results", "infinite_results", "nan_results", "exact_cancellations",
           "massive_cancellations", "ties_up", "overflows")


@pytest.mark.sim
@pytest.mark.parametrize("sim", runner.SIMULATORS)
def test_fp_adder(sim):
    require_simulator(sim)
    vectors = VECTORS[sim]
    result = runner.run(config.preset("tiny"), "opentrn.sim.tb_fp_adder", "fp_adder", sim,
                        env={"OPENTRN_VECTORS": vectors, "OPENTRN_SEED": SEED})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    assert set(records) == {"directed", "random"}
    for record in records.values():
        assert record["mismatches"] == 0 and record["reference_mismatches"] == 0, record
        for corner in CORNERS:
            assert record[corner] > 0, (corner, record)
    assert records["random"]["vectors"] == vectors


def test_random_workload_reaches_the_corners():
    """The generator's weighting, without a simulator: every coverage class, and ties and
    massive cancellations in sizeable numbers."""
    n = 100_000
    a, b = random_pairs(np.random.default_rng(0), n)
    counts = coverage(a, b, add(a, b))
    for name in COVERAGE_CLASSES:
        assert counts[name] > 0, (name, counts)
    assert counts["ties_up"] + counts["ties_down"] >= n // 50, counts
    assert counts["massive_cancellations"] >= n // 100, counts


@pytest.mark.parametrize("stages", range(1, MAX_STAGES + 1))
def test_stages(stages):
    """A build cut by ``stages`` registers on Amaranth's simulator: the directed pairs and
    2,000 random ones, a pair clocked in each cycle, each sum ``stages`` cycles later equal
    to the golden model's; ``enable`` low every fifth cycle holds every register (the sums
    of the next cycles are still the right ones, and ``sum`` does not change)."""
    lanes = 4
    a, b = directed_pairs()
    ra, rb = random_pairs(np.random.default_rng(5), 2000)
    a, b = np.concatenate([a, ra]), np.concatenate([b, rb])
    a, b = a[:a.size - a.size % lanes], b[:b.size - b.size % lanes]
    expected = add(a, b)
    dut = FPAdder(lanes=lanes, stages=stages)
    steps = a.size // lanes
    counts = {"checked": 0, "mismatches": 0, "stalls": 0, "held": 0}

    def packed(values, step):
        return sum(int(v) << (32 * lane)
                   for lane, v in enumerate(values[step * lanes:(step + 1) * lanes]))

    async def bench(ctx):
        step = 0
        for cycle in range(steps + stages + steps // 4 + 4):
            stall = cycle % 5 == 4
            ctx.set(dut.enable, not stall)
            ctx.set(dut.a.as_value(), packed(a, step % steps))
            ctx.set(dut.b.as_value(), packed(b, step % steps))
            before = ctx.get(dut.sum.as_value())
            await ctx.tick()
            if stall:
                counts["stalls"] += 1
                counts["held"] += ctx.get(dut.sum.as_value()) == before
                continue
            step += 1
            # The next pair already on the inputs: the sum must come from the registers.
            ctx.set(dut.a.as_value(), packed(a, step % steps))
            ctx.set(dut.b.as_value(), packed(b, step % steps))
            done = step - stages     # the pair whose sum shows now
            if 0 <= done < steps:
                got = ctx.get(dut.sum.as_value())
                for lane in range(lanes):
                    counts["checked"] += 1
                    counts["mismatches"] += (got >> (32 * lane)) & 0xFFFFFFFF != \
                        expected[done * lanes + lane]

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert counts["checked"] == a.size and counts["mismatches"] == 0, counts
    assert counts["held"] == counts["stalls"] > 0, counts


def test_verilog_ports():
    text = runner.verilog_source(config.preset("tiny"), "fp_adder")
    width = 32 * TEST_LANES
    for line in (f"input [{width - 1}:0] a;", f"input [{width - 1}:0] b;",
                 f"output [{width - 1}:0] sum;"):
        assert line in text


def test_bad_lanes_are_refused():
    with pytest.raises(ValueError, match="lanes must be at least 1, not 0"):
        FPAdder(lanes=0)
    with pytest.raises(TypeError, match="lanes must be an integer, not 2.0"):
        FPAdder(lanes=2.0)
    with pytest.raises(ValueError, match="stages must be an integer from 0 to 4, not 5"):
        FPAdder(lanes=1, stages=5)
