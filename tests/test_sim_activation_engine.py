"""The activation engine RTL under cocotb on both simulators: every output beat bit-exact
against the golden model, in order, none dropped or duplicated under back-pressure, and
cycle-exact against the documented latency and one-vector-per-cycle throughput; in the
build with float formats (tiny), the float path too, every output format and function, on
edge and random FP32 codes, with integer operations interleaved."""

import numpy as np
import pytest

from opentrn import config
from opentrn.golden import activation_engine as golden
from opentrn.hdl import ActivationEngine
from opentrn.hdl.activation_engine import float_outputs
from opentrn.sim import runner
from opentrn.sim.tb_activation_engine import (
    INT32_MAX,
    INT32_MIN,
    SPECIAL_SHIFTS,
    coverage,
    float_coverage,
    float_operations,
    random_operations,
)

from .conftest import SIM_BUILDS, require_simulator, sim_runs

VECTORS = 2000
BP_VECTORS = 600
BURST = 200
FLOAT_VECTORS = 1000
FLOAT_BP_VECTORS = 300
SEED = 5
#: Coverage classes every float run must meet (float_coverage).
FLOAT_CLASSES = ("nan_inputs", "inf_inputs", "subnormal_inputs", "negative_zero_inputs",
                 "product_overflow", "product_underflow", "product_subnormal",
                 "exact_cancellation", "relu_clamped", "cast_ties", "cast_overflow",
                 "cast_subnormal", "nan_results", "int_operations")


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(SIM_BUILDS))
def test_activation_engine(sim, build):
    require_simulator(sim)
    cfg = SIM_BUILDS[build]
    result = runner.run(cfg, "opentrn.sim.tb_activation_engine", "activation_engine", sim,
                        env={"OPENTRN_VECTORS": VECTORS, "OPENTRN_BP_VECTORS": BP_VECTORS,
                             "OPENTRN_BURST": BURST, "OPENTRN_FLOAT_VECTORS": FLOAT_VECTORS,
                             "OPENTRN_FLOAT_BP_VECTORS": FLOAT_BP_VECTORS,
                             "OPENTRN_SEED": SEED})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    floats = float_outputs(cfg)
    assert set(records) == {"directed", "random_operations", "random_backpressure",
                            "throughput"} | ({"float_operations", "float_backpressure"}
                                             if floats else set())
    for record in records.values():
        assert record["mismatches"] == 0 and record["cycle_mismatches"] == 0, record
        assert record["latency"] == golden.latency(cfg)

    random = records["random_operations"]
    assert random["cycles_checked"] and random["beats"] >= VECTORS
    assert random["operations"] >= 100                   # many parameter sets
    # The corners were met, not just possible: ties both ways, every saturation bound,
    # relu, negative inputs, the special shifts and both extreme multipliers.
    assert random["ties_even"] + random["ties_odd"] >= random["elements"] // 20
    assert random["ties_even"] > 0 and random["ties_odd"] > 0
    for key in ("int8_sat_low", "int8_sat_high", "int32_sat_low", "int32_sat_high",
                "relu_clamped", "negative_inputs"):
        assert random[key] > 0, key
    assert random["special_shifts"] == list(SPECIAL_SHIFTS)
    assert random["extreme_multipliers"] == [INT32_MIN, INT32_MAX]

    assert records["directed"]["cycles_checked"]
    assert records["directed"]["ties_even"] > 0 and records["directed"]["ties_odd"] > 0

    pressure = records["random_backpressure"]
    assert pressure["beats"] >= BP_VECTORS and not pressure["cycles_checked"]
    assert pressure["delayed_beats"] > 0                 # the pipeline really stalled

    burst = records["throughput"]
    assert burst["beats"] == BURST
    assert burst["input_idle_cycles"] == 0 and burst["output_idle_cycles"] == 0
    assert burst["first_out_after"] == golden.latency(cfg)
    assert burst["distinct_beats"] > BURST // 2
    # Back to back: BURST vectors in BURST + latency cycles.
    assert burst["cycles"] == BURST + golden.latency(cfg)

    if floats:
        kinds = sorted(f"{fmt}/{function}" for fmt in floats
                       for function in golden.FUNCTIONS.values())
        run = records["float_operations"]
        assert run["cycles_checked"] and run["float_elements"] >= FLOAT_VECTORS * cfg.pe_cols
        assert run["float_kinds"] == kinds
        for key in FLOAT_CLASSES:
            assert run[key] > 0, key
        pressure = records["float_backpressure"]
        assert pressure["beats"] >= FLOAT_BP_VECTORS and not pressure["cycles_checked"]
        assert pressure["delayed_beats"] > 0 and pressure["int_operations"] > 0


@pytest.mark.parametrize("build", list(SIM_BUILDS))
def test_random_workload_reaches_the_corners(build):
    """The generator's weighting, without a simulator: at least one element in twenty a
    tie, and the other corners, in every build."""
    cfg = SIM_BUILDS[build]
    counts = coverage(cfg, random_operations(cfg, np.random.default_rng(0), VECTORS))
    assert counts["ties_even"] + counts["ties_odd"] >= counts["elements"] // 20
    assert min(counts["int8_sat_low"], counts["int8_sat_high"], counts["int32_sat_low"],
               counts["int32_sat_high"], counts["relu_clamped"]) > 0
    assert counts["special_shifts"] == list(SPECIAL_SHIFTS)


def test_float_workload_reaches_the_corners():
    """The float generator's weighting, without a simulator: every class the simulator
    test asserts, in the float build."""
    cfg = SIM_BUILDS["tiny"]
    counts = float_coverage(cfg, float_operations(cfg, np.random.default_rng(0),
                                                  FLOAT_VECTORS))
    assert min(counts[key] for key in FLOAT_CLASSES) > 0, counts
    assert len(counts["float_kinds"]) == 2 * len(float_outputs(cfg))


def test_verilog_ports_follow_the_config():
    cfg = config.preset("small").replace(acc_bits=24)
    text = runner.verilog_source(cfg, "activation_engine")
    lanes = cfg.pe_cols
    assert f"input [{lanes * 24}:0] input__payload;" in text           # data + last
    assert f"output [{lanes * 32}:0] output__payload;" in text
    # function 1 + multiplier 32 + shift 6 + out_format 3 + bias 32 per partition.
    assert f"input [{1 + 32 + 6 + 3 + 32 * lanes - 1}:0] params;" in text
    # The float path is built only with float formats.
    assert "fp_multiplier" not in text and "fp_cast" not in text
    assert "fp_cast" in runner.verilog_source(config.preset("tiny"), "activation_engine")


def test_bad_configs_are_refused():
    with pytest.raises(TypeError, match=r"config=\{\}: must be an opentrn.config.Config"):
        ActivationEngine(config={})
