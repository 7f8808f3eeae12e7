"""Generated Verilog of every top of ``tiny`` and ``fpga``, and of ``small``'s core, passes
``verilator --lint-only``."""

import re

import pytest

from opentrn import config
from opentrn.cli import main
from opentrn.config import ConfigError
from opentrn.hdl import MAX_HBM_BYTES, TOPS, TensorEngine, check
from opentrn.sim import runner

from .conftest import require_simulator

#: Tops that the config does not size (the FP units' test builds): linted once.
UNSIZED_TOPS = ("fp_adder", "fp_cast", "fp_multiplier")


@pytest.mark.sim
# tiny (every format), fpga (int8, 4x4 with the FPGA build's pipeline stages) and the core
# of small (int8, an 8x8 array).
@pytest.mark.parametrize("name, top", [
    (name, top) for top in TOPS for name in ("tiny", "fpga")
    if top not in UNSIZED_TOPS or name == "tiny"] + [("small", "core")])
def test_verilog_lints_clean(name, top, tmp_path):
    require_simulator("verilator")
    out = tmp_path / f"{top}.v"
    assert main(["verilog", "--preset", name, "--top", top, "-o", str(out)]) == 0
    text = out.read_text()
    assert f"module {top}(" in text
    ok, output = runner.lint(out, top)
    assert ok, output


def test_verilog_sizes_follow_the_config(tmp_path):
    cfg = config.preset("small").replace(acc_bits=24)
    text = runner.verilog_source(cfg)
    # One result beat: pe_cols accumulators and the last flag.
    assert f"output [{cfg.pe_cols * 24}:0] result__payload;" in text
    # One moving beat: pe_rows int8 elements, the format code, swap and last.
    assert f"input [{cfg.pe_rows * 8 + 4}:0] moving__payload;" in text
    # One module for every processing element, however many there are.
    assert len(re.findall(r"^module tensor_engine_processing_element_[0-9a-f]+\(", text,
                          re.M)) == 1
    # With bf16 among the formats, the elements are 16 raw bits; with an MX format, a scale
    # byte per block of 32 rows comes along (tiny: one block).
    tiny = config.preset("tiny")
    assert f"input [{tiny.pe_rows * 16 + 8 + 4}:0] moving__payload;" in \
        runner.verilog_source(tiny)


def test_sbuf_blocks_too_wide_for_a_verilog_vector_are_refused_with_the_reason():
    """The engines' SBUF vector is sbuf_partitions x Config.vector_word_bytes (at most 32)
    bytes: 128 partitions (trn2, trn3) build; at 256 its vector write is wider than any
    signal Amaranth writes, and the blocks that hold the SBUF say so instead of failing
    inside Amaranth."""
    wide = config.resolve("trn3", overrides=["pe_rows=256", "sbuf_partitions=256"])
    assert wide.vector_word_bytes == 32 and wide.dma_bus_bytes == 64
    for top in ("sbuf", "memory_system", "activation_engine", "core"):
        with pytest.raises(config.ConfigError, match=r"sbuf_partitions=256: the SBUF's vector "
                           r"write .* is 73,741 bits, wider than the 65,536 bits"):
            check(top, wide)
    check("tensor_engine", wide)


def test_every_preset_builds():
    """The presets build as hardware, every top level, in every format they list at the MAC
    rates they publish: a column of r elements of K per row (trn3: MXFP8 at 4, so 32-bit
    element registers and 16 MX blocks of K = 512), and the SBUF's engines' vectors in
    32-byte vector words of the 64-byte DMA words."""
    for name in config.PRESETS:
        cfg = config.preset(name)
        for top in TOPS:
            if top == "core_with_memory" and cfg.hbm_bytes > MAX_HBM_BYTES:
                # A simulation top: its HBM is an array in the simulator.
                with pytest.raises(ConfigError, match=f"hbm_bytes={cfg.hbm_bytes:,}: the "
                                   "simulated HBM"):
                    check(top, cfg)
                continue
            check(top, cfg)
    trn3 = config.preset("trn3")
    assert "int8" not in trn3.dtypes and trn3.in_bits == 32
    engine = TensorEngine(config=trn3)
    moving = engine.signature.members["moving"].signature.members["payload"].shape
    assert moving.size == 128 * 32 + 3 + 16 * 8 + 2
    engine._MustUse__silence = True          # its Verilog: tests/test_hierarchy.py
