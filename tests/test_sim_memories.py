"""The SBUF and PSUM RTL under cocotb on both simulators: every response bit-exact against
the golden models, the read latency (1 cycle, more with the SBUF's input stages), every
grant against the round-robin arbiter, the whole memory read back at the end, the PSUM
read-modify-write hazards, and on tiny (a build with float formats) the PSUM's FP32
accumulation."""

import pytest

from opentrn import config, numerics
from opentrn.sim import runner

from .conftest import require_simulator, sim_runs

OPS = 3000
BUILDS = {
    "sbuf-tiny": ("sbuf", config.preset("tiny")),
    "sbuf-small": ("sbuf", config.preset("small")),
    "psum-tiny": ("psum", config.preset("tiny")),
    "psum-small": ("psum", config.preset("small")),
    # 16-bit accumulators (an int8-only build): accumulation wraps.
    "psum-tiny-acc16": ("psum", config.preset("tiny").replace(dtypes=("int8",), acc_bits=16)),
    # trn3's 64-byte bus: the engines' vector words are half a DMA word
    # (Config.vector_word_bytes), so vector and word ports address different units.
    "sbuf-tiny-bus64": ("sbuf", config.preset("tiny").replace(dma_bus_bytes=64)),
    "psum-tiny-bus64": ("psum", config.preset("tiny").replace(dma_bus_bytes=64)),
    # Registers in the accumulate (an FPGA build's): write-backs 1 + N cycles after the
    # read, accumulates N + 1 cycles apart at the closest.
    "psum-tiny-stages1": ("psum", config.preset("tiny").replace(psum_add_stages=1)),
    "psum-tiny-stages4": ("psum", config.preset("tiny").replace(psum_add_stages=4)),
    # Registers at each SBUF partition (the fpga preset has one): reads answered 3 cycles
    # after their grant, reads and writes still meeting the memory in grant order.
    "sbuf-tiny-stages2": ("sbuf", config.preset("tiny").replace(sbuf_input_stages=2)),
}


def _run(sim, build):
    require_simulator(sim)
    top, cfg = BUILDS[build]
    result = runner.run(cfg, f"opentrn.sim.tb_{top}", top, sim,
                        env={"OPENTRN_OPS": OPS, "OPENTRN_SEED": 7})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {record["test"]: record for record in result.reports}
    for name, record in records.items():
        for key in ("mismatches", "late", "arbitration_mismatches", "double_grants"):
            assert record[key] == 0, (name, key, record[key])
    return cfg, records


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(b for b in BUILDS if b.startswith("sbuf")))
def test_sbuf(sim, build):
    _, records = _run(sim, build)
    assert set(records) == {"random_mix", "saturated"}
    mix = records["random_mix"]
    assert mix["image_equal"]
    assert mix["reads"] + mix["writes"] >= OPS
    # Reads and writes of one word met in one cycle: the reads returned the old data.
    assert mix["read_during_write"] > 0 and records["saturated"]["read_during_write"] > 0
    # Three readers, two writers: the documented bound, reached under full load.
    assert mix["max_read_wait"] <= 2 and mix["max_write_wait"] <= 1
    assert records["saturated"]["max_read_wait"] == 2
    assert records["saturated"]["max_write_wait"] == 1


@pytest.mark.sim
@pytest.mark.parametrize("build, sim", sim_runs(b for b in BUILDS if b.startswith("psum")))
def test_psum(sim, build):
    cfg, records = _run(sim, build)
    floats = bool(numerics.float_formats(cfg))
    assert set(records) == {"random_mix", "back_to_back_accumulate",
                            "accumulate_meets_dma_write", "write_latency",
                            *(["float_accumulate"] if floats else [])}
    mix = records["random_mix"]
    assert mix["image_equal"]
    assert mix["reads"] + mix["writes"] >= OPS
    assert mix["max_read_wait"] <= 1
    # The hazards happened, in the random mix and on purpose (with add stages the mix keeps
    # the DMA's words apart: a dma_write between a read and its write-back would be lost).
    stages = cfg.psum_add_stages
    assert mix["forwarded_te"] > 0 and (mix["forwarded_dma"] > 0) == (stages == 0)
    assert mix["back_to_back_same_entry"] > 0
    for record in records.values():
        assert record["unforwarded"] == 0, record["test"]
    back_to_back = records["back_to_back_accumulate"]
    assert back_to_back["te_idle_cycles"] == 0
    assert back_to_back["entries"] == 1 + stages
    assert back_to_back["back_to_back_same_entry"] == back_to_back["beats"] - 1 - stages
    meets = records["accumulate_meets_dma_write"]
    assert meets["forwarded_dma"] == meets["beats"]
    assert records["write_latency"]["read_offsets"] == [1 + stages, 2 + stages]
    if cfg.acc_bits == 16:
        assert mix["wrapped"] > 0 and back_to_back["wrapped"] > 0
    if floats:
        # Float beats in the random mix, and every FP32 corner in the directed test.
        assert mix["float_accumulates"] > 0
        accumulate = records["float_accumulate"]
        assert accumulate["pairs"] > 1500 and accumulate["reads"] >= accumulate["pairs"] // 4
        for key in ("nan", "inf", "cancelled", "subnormal"):
            assert accumulate[key] > 0, key
