"""The FP32 cast RTL under cocotb on both simulators: every result code equal to the golden
model's, on the exhaustive round trips of the narrow formats and on over a million
corner-weighted random FP32 codes (tests/conftest.py: FP_VECTORS), with every corner class
met."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import config, numerics
from opentrn.golden import fp_cast as golden
from opentrn.hdl.fp_cast import FORMATS, TEST_LANES, FPCast
from opentrn.sim import runner
from opentrn.sim.tb_fp_cast import CORNERS, NARROW, round_trip_batches, weighted_codes

from .conftest import FP_VECTORS, require_simulator

#: Random codes for the narrow formats, split evenly among the three and whole lane steps of
#: each; and VECTORS // 16 more for fp32.
VECTORS = {sim: -(-count // (3 * TEST_LANES)) * 3 * TEST_LANES
           for sim, count in FP_VECTORS.items()}
SEED = 5
CONFIG = config.preset("tiny")          # the cast has no configuration; the runner needs one


@pytest.mark.sim
@pytest.mark.parametrize("sim", runner.SIMULATORS)
def test_fp_cast(sim):
    require_simulator(sim)
    vectors = VECTORS[sim]
    result = runner.run(CONFIG, "opentrn.sim.tb_fp_cast", "fp_cast", sim,
                        env={"OPENTRN_VECTORS": vectors, "OPENTRN_SEED": SEED})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    assert set(records) == {"round_trips", "random"}
    for record in records.values():
        assert record["mismatches"] == 0, record
        assert record["steps"] * TEST_LANES == record["vectors"], record

    trips = records["round_trips"]
    assert trips["vectors"] == sum(codes.size for _, codes in round_trip_batches())
    assert trips["coverage"]["bf16"]["vectors"] == 1 << 16
    assert trips["coverage"]["fp8e4m3"]["vectors"] == (1 << 8) + (1 << 16)

    random = records["random"]
    cover = random["coverage"]
    assert set(cover) == set(FORMATS)
    assert sum(cover[fmt]["vectors"] for fmt in NARROW) == vectors
    assert cover["fp32"]["vectors"] == vectors // 16
    assert random["vectors"] >= vectors + vectors // 16
    assert cover["fp32"]["nan_inputs_positive"] > 0 and cover["fp32"]["nan_inputs_negative"] > 0
    for fmt in NARROW:
        counts = cover[fmt]
        for key in CORNERS:
            assert counts[key] > 0, (fmt, key, counts)
        overflow = "overflow_nan" if fmt == "fp8e4m3" else "overflow_inf"
        assert counts[overflow] > 0, (fmt, overflow, counts)


@pytest.mark.parametrize("formats", [("bf16",), ("fp8e4m3",), ("fp8e5m2",), ("fp32",),
                                     ("fp8e5m2", "fp8e4m3"), ("bf16", "fp8e5m2"),
                                     ("fp8e4m3", "fp32", "bf16")])
def test_format_subsets_in_amaranth_simulation(formats):
    """Builds of some of the formats (constants instead of selected ones, a narrower frame,
    no subnormal shift for bf16 alone), in Amaranth's simulator: weighted random codes of
    every built format, bit-exact."""
    lanes, steps = 4, 250
    dut = FPCast(formats=formats, lanes=lanes)
    rng = np.random.default_rng(len(formats))
    mismatches = []

    async def bench(ctx):
        for name in formats:
            codes = weighted_codes(rng, lanes * steps, name)
            want = golden.cast(codes, name).astype(np.uint32)
            ctx.set(dut.format, numerics.data_format(name).code)
            for step in range(steps):
                for lane in range(lanes):
                    ctx.set(dut.a[lane], int(codes[step * lanes + lane]))
                for lane in range(lanes):
                    index = step * lanes + lane
                    got = ctx.get(dut.result[lane])
                    if got != want[index]:
                        mismatches.append((name, hex(codes[index]), hex(got),
                                           hex(want[index])))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert not mismatches, mismatches[:5]


def test_verilog_ports():
    text = runner.verilog_source(CONFIG, "fp_cast")
    assert "input [2:0] format;" in text
    assert f"input [{32 * TEST_LANES - 1}:0] a;" in text
    assert f"output [{32 * TEST_LANES - 1}:0] result;" in text


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="lanes must be at least 1, not 0"):
        FPCast(formats=("bf16",), lanes=0)
    with pytest.raises(ValueError, match="'int8' is not a format of the cast"):
        FPCast(formats=("bf16", "int8"))
    with pytest.raises(ValueError, match="must not repeat a format"):
        FPCast(formats=("bf16", "bf16"))
    with pytest.raises(ValueError, match="non-empty tuple"):
        FPCast(formats=())
    with pytest.raises(ValueError, match="non-empty tuple"):
        FPCast(formats="bf16")
