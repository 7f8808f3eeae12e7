"""The tensor engine RTL under cocotb on both simulators: every result beat bit-exact
against the golden model, and cycle-exact against the documented formulas; on tiny (the
build with BF16 and FP8) also float matmuls with edge values and every format interleaved
on shared tiles."""

import numpy as np
import pytest
from vcdvcd import VCDVCD

from opentrn import numerics
from opentrn.golden import tensor_engine as golden
from opentrn.sim import runner, wave
from opentrn.sim.tb_tensor_engine import directed_program

from .conftest import SIM_BUILDS, require_simulator, sim_runs

CASES_PER_RANDOM_TEST = 100


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(SIM_BUILDS))
def test_tensor_engine(sim, build, tmp_path):
    require_simulator(sim)
    cfg = SIM_BUILDS[build]
    vcd = tmp_path / "waves.vcd" if build == "tiny" else None
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                        env={"OPENTRN_CASES": CASES_PER_RANDOM_TEST, "OPENTRN_SEED": 11},
                        vcd=vcd)
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    floats = numerics.float_formats(cfg)
    assert set(records) == {"extremes", "random_workload", "random_backpressure",
                            "back_to_back", "back_to_back_reused",
                            *(["float_random", "mixed_formats"] if floats else [])}
    assert sum(record["cases"] for record in records.values()) >= 200
    for record in records.values():
        assert record["mismatches"] == 0 and record["cycle_mismatches"] == 0
    assert records["extremes"]["cycles_checked"] and records["random_workload"]["cycles_checked"]
    # Background weight loads: N = K + M with a fresh tile each, and N = 1 against one tile,
    # both keep the array fed every cycle.
    assert records["back_to_back"]["n"] == cfg.pe_rows + cfg.pe_cols
    assert records["back_to_back"]["moving_idle_cycles"] == 0
    assert records["back_to_back_reused"]["moving_idle_cycles"] == 0
    if floats:
        float_random, mixed = records["float_random"], records["mixed_formats"]
        assert float_random["cycles_checked"]
        assert float_random["formats"] == sorted(floats)
        assert mixed["formats"] == sorted(cfg.dtypes)
        # The specials came out of the array: NaN, infinities, zeros, FP32 subnormals.
        for classes in float_random["float_results"], mixed["float_results"]:
            assert all(count > 0 for count in classes.values()), classes

    if vcd is not None:
        # The VCD is real: vcdvcd reads it, and the handshakes in it add up to the beats.
        assert result.vcd == vcd
        assert any(name.endswith("result__valid") for name in VCDVCD(str(vcd),
                                                                     only_sigs=True).signals)
        table = wave.cycle_table(vcd, [r"^[^.]+\.result__(valid|ready)$"])
        valid = next(s for s in table["signals"] if s.endswith("valid"))
        ready = next(s for s in table["signals"] if s.endswith("ready"))
        transfers = sum(1 for row in table["rows"]
                        if row["values"][valid] == 1 and row["values"][ready] == 1)
        assert transfers == sum(record["beats"] for record in records.values())


def test_acc16_build_really_wraps():
    cfg = SIM_BUILDS["tiny-acc16"]
    wrapped = 0
    for op in directed_program(cfg, np.random.default_rng(0)):
        if op.stationary is not None:
            tile = op.stationary
        exact = tile.T.astype(np.int64) @ op.moving
        wrapped += int(np.sum(golden.matmul(cfg, tile, op.moving) != exact))
    assert wrapped > 0
