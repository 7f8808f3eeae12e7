"""Generated Verilog of every preset up to ``fpga`` passes ``verilator --lint-only``."""

import pytest

from opentrn import config
from opentrn.cli import main
from opentrn.config import ConfigError
from opentrn.hdl import TOPS, TensorEngine
from opentrn.sim import runner

from .conftest import require_simulator

#: Tops that the config does not size (the FP units' test builds): linted once.
UNSIZED_TOPS = ("fp_adder", "fp_cast", "fp_multiplier")


@pytest.mark.sim
# tiny (every format) and fpga (int8 only, 8x8); small is fpga with smaller memories.
@pytest.mark.parametrize("name, top", [
    (name, top) for top in TOPS for name in ("tiny", "fpga")
    if top not in UNSIZED_TOPS or name == "tiny"])
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
    assert text.count("module \\tensor_engine.pe_") == cfg.pe_rows * cfg.pe_cols
    # With bf16 among the formats, the elements are 16 raw bits; with an MX format, a scale
    # byte per block of 32 rows comes along (tiny: one block).
    tiny = config.preset("tiny")
    assert f"input [{tiny.pe_rows * 16 + 8 + 4}:0] moving__payload;" in \
        runner.verilog_source(tiny)


def test_a_build_without_int8_is_refused():
    trn3_formats = "dtypes=bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,mxfp8e5m2"
    with pytest.raises(ConfigError, match=f"{trn3_formats}: must include int8 \\(the "
                                          "hardware's integer path is always built\\) "
                                          f"\\(try --set dtypes=int8,{trn3_formats[7:]}\\)"):
        runner.verilog_source(config.preset("trn3"))
    # The blocks themselves refuse too, when built directly.
    with pytest.raises(ValueError, match=f"{trn3_formats}: must include int8 \\(the tensor "
                                         "engine hardware's integer path"):
        TensorEngine(config=config.preset("trn3"))
    with pytest.raises(ValueError, match="dtypes=bf16: must include int8"):
        TensorEngine(config=config.preset("trn2").replace(dtypes=("bf16",),
                                                          pe_macs_per_cycle=()))
