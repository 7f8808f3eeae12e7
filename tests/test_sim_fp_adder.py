"""The FP32 adder RTL under cocotb on both simulators: every sum bit-exact against the golden
model, on the directed cases and on a million corner-weighted random pairs (tests/conftest.py:
FP_VECTORS) whose corners
(subnormal, infinite and NaN results, exact and massive cancellation, ties rounding up,
overflow) were actually met."""

import numpy as np
import pytest

from opentrn import config
from opentrn.golden.fp_adder import add
from opentrn.hdl.fp_adder import TEST_LANES, FPAdder
from opentrn.sim import runner
from opentrn.sim.tb_fp_adder import COVERAGE_CLASSES, coverage, random_pairs

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
