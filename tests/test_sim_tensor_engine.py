"""The tensor engine RTL under cocotb on both simulators: every result beat bit-exact
against the golden model, and cycle-exact against the documented formulas; on tiny (the
build with BF16, FP8 and MXFP8) also float matmuls with edge values and random MX scales,
and every format interleaved on shared tiles; on a 64-row build (two MX blocks), a short
program whose results depend on each block's own scales."""

import os

import numpy as np
import pytest
from vcdvcd import VCDVCD

from opentrn import config, numerics
from opentrn.golden import tensor_engine as golden
from opentrn.hdl.tensor_engine import mx_blocks
from opentrn.sim import runner, wave
from opentrn.sim.tb_tensor_engine import EDGE_SCALES, directed_program

from .conftest import MX_BUILDS, SIM_BUILDS, require_simulator, sim_runs

CASES_PER_RANDOM_TEST = 100

#: The simulation builds, and tiny with each fast weight load (every format, the
#: stationary elements skewed with the moving ones), on Icarus (the suite's time): 1, and 2,
#: the trn2/trn3 presets' (two columns a beat into three banks), which Verilator runs in
#: :func:`test_trn3_formats_16x16_on_verilator`.
BUILDS = {**SIM_BUILDS, "tiny-fast1": SIM_BUILDS["tiny"].replace(fast_weight_load=1),
          "tiny-fast2": SIM_BUILDS["tiny"].replace(fast_weight_load=2)}


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(BUILDS))
def test_tensor_engine(sim, build, tmp_path):
    require_simulator(sim)
    cfg = BUILDS[build]
    vcd = tmp_path / "waves.vcd" if build == "tiny" else None
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                        env={"OPENTRN_CASES": CASES_PER_RANDOM_TEST, "OPENTRN_SEED": 11},
                        vcd=vcd)
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    floats = numerics.float_formats(cfg)
    if build == "tiny":
        # tiny builds every format: MX, with one block of scales, included.
        assert floats and mx_blocks(cfg) == 1
    assert set(records) == {"full_matmuls", "random_workload", "random_backpressure",
                            "back_to_back", "back_to_back_reused",
                            *(["extremes"] if "int8" in cfg.dtypes else []),
                            *(["float_random", "mixed_formats"] if floats else [])}
    assert sum(record["cases"] for record in records.values()) >= 200
    for record in records.values():
        assert record["mismatches"] == 0 and record["cycle_mismatches"] == 0
    assert records["random_workload"]["cycles_checked"]
    if "int8" in cfg.dtypes:
        assert records["extremes"]["cycles_checked"]
    # A full-size matmul per format (K = the format's contraction, M = pe_cols,
    # N = moving_max), fresh tile then reused: every format of the build, cycle-exact.
    full = records["full_matmuls"]
    assert full["formats"] == sorted(cfg.dtypes) and full["cycles_checked"]
    assert full["cases"] == 2 * len(cfg.dtypes)
    # Background weight loads: N = K + (K - 1) A + M with a fresh tile each (A add stages;
    # M + 1 with the fast weight load, M / 2 with two columns a beat), and N = 1 against one
    # tile, both keep the array fed every cycle. Where that N is more than a matmul can
    # have (tiny-staged: 4 + 3 x 4 + 4 = 20 > 16), matmuls of moving_max vectors wait for
    # the reload guard, cycle-exact as the golden timing has it.
    guard = cfg.pe_rows + (cfg.pe_rows - 1) * cfg.pe_add_stages
    interval = {0: guard + cfg.pe_cols, 1: cfg.pe_cols + 1,
                2: cfg.pe_cols // 2}[cfg.fast_weight_load]
    assert records["back_to_back"]["n"] == min(interval, cfg.moving_max)
    assert (records["back_to_back"]["moving_idle_cycles"] == 0) == (interval <= cfg.moving_max)
    assert records["back_to_back_reused"]["moving_idle_cycles"] == 0
    if floats:
        float_random, mixed = records["float_random"], records["mixed_formats"]
        assert float_random["cycles_checked"]
        assert float_random["formats"] == sorted(floats)
        assert mixed["formats"] == sorted(cfg.dtypes)
        # The specials came out of the array: NaN, infinities, zeros, FP32 subnormals.
        for classes in float_random["float_results"], mixed["float_results"]:
            assert all(count > 0 for count in classes.values()), classes
    if mx_blocks(cfg):
        for record in records["float_random"], records["mixed_formats"]:
            # MX matmuls met every edge scale (255, 0, 254, 127, 1) and gave every class of
            # result (NaN, infinities, zeros, FP32 subnormals) on their own.
            assert {numerics.data_format(name).mx for name in record["formats"]} == \
                {False, True}
            assert set(record["mx_scales"]) == {str(code) for code in EDGE_SCALES}
            assert all(count > 0 for count in record["mx_scales"].values()), record
            assert all(count > 0 for count in record["mx_results"].values()), record

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


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(MX_BUILDS))
def test_tensor_engine_mx_blocks(sim, build):
    """Two MX blocks: the short program of ``test_mx_blocks`` (every block's scales
    distinct, MX vectors around int8 ones), bit-exact and cycle-exact; and it is a test of
    the blocks: more than half of its result beats would differ if every row took block 0's
    stationary scales, or block 0's moving scales, or (past block 0) the previous vector's
    scales."""
    require_simulator(sim)
    cfg = MX_BUILDS[build]
    assert mx_blocks(cfg) == 2
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                        testcase="test_mx_blocks", env={"OPENTRN_SEED": 11})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    assert [record["test"] for record in result.reports] == ["mx_blocks"]
    record = result.reports[0]
    assert record["mismatches"] == 0 and record["cycle_mismatches"] == 0
    assert record["cycles_checked"]
    assert record["formats"] == ["int8", "mxfp8e4m3"]
    assert set(record["block_sensitivity"]) == {"stationary", "moving", "skew"}
    for count in record["block_sensitivity"].values():
        assert count > record["beats"] // 2, record


def _trainium_run(cfg):
    """``test_full_matmuls`` of ``cfg`` on Verilator (hierarchically built): bit-exact,
    cycle-exact, every format of the build; and ``test_back_to_back``: fresh tiles at the
    fast weight load's interval (``M / 2``), cycle-exact with no idle cycle."""
    assert runner.build_info(runner.build(cfg, "tensor_engine", "verilator"))["hierarchical"]
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", "verilator",
                        testcase=["test_full_matmuls", "test_back_to_back"],
                        env={"OPENTRN_SEED": 1})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    record = records["full_matmuls"]
    assert record["mismatches"] == 0 and record["cycle_mismatches"] == 0
    assert record["cycles_checked"] and record["formats"] == sorted(cfg.dtypes)
    assert record["cases"] == 2 * len(cfg.dtypes)
    streak = records["back_to_back"]
    assert streak["fresh"] and streak["n"] == golden.issue_interval(cfg, 1, fresh=True)
    assert streak["mismatches"] == 0 and streak["cycle_mismatches"] == 0
    assert streak["cycles_checked"] and streak["moving_idle_cycles"] == 0
    return record


@pytest.mark.sim
def test_trn3_formats_16x16_on_verilator(monkeypatch):
    """A 16x16 array with every trn3 format (BF16, FP8 E4M3/E5M2, MXFP8 at 4 MACs per PE per
    cycle: two MX blocks of 8 rows): a matmul per format with K = 16 rows x the format's MACs
    per cycle, M = 16 and N = moving_max (64 here, to keep the suite's time), fresh tile then
    reused, bit-exact and cycle-exact; 24 fresh tiles back to back every 8 cycles (M / 2:
    trn3's two-column fast weight load). 256 PEs: built hierarchically, per processing
    element, the quickest build (the full-size run uses blocks of 64; the logic is the
    same; a 32x32 array took the suite 70 s where this takes 25)."""
    require_simulator("verilator")
    monkeypatch.setenv("OPENTRN_HIER_BLOCK_PES", "1")
    cfg = config.resolve("trn3", overrides=["pe_rows=16", "pe_cols=16", "sbuf_partitions=16",
                                            "moving_max=64"])
    _trainium_run(cfg)


@pytest.mark.sim
@pytest.mark.skipif(os.environ.get("OPENTRN_FULL_SCALE") != "1",
                    reason="the 128x128 build takes long: OPENTRN_FULL_SCALE=1 runs it")
def test_trn3_full_size_on_verilator():
    """The trn3 preset's 128x128 tensor engine, as :func:`test_trn3_formats_16x16_on_verilator`
    (docs/performance.md has its build time, memory and speed)."""
    require_simulator("verilator")
    _trainium_run(config.preset("trn3"))
