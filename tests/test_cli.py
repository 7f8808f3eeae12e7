import json
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from opentrn import cli, config
from opentrn.cli import main
from opentrn.kernel import same_bits
from opentrn.sim import runner

from .conftest import require_simulator


def test_config_prints_toml_and_json(capsys):
    assert main(["config", "--preset", "trn3"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["pe_rows"] == printed["pe_cols"] == 128
    assert config.Config.from_dict(printed) == config.preset("trn3")
    assert main(["config", "--set", "pe_rows=8", "--set", "sbuf_partitions=8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pe_rows"] == 8


def test_config_file_and_overrides(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text('preset = "small"\nacc_bits = 20\n')
    assert main(["config", "--file", str(path), "--set", "moving_max=7", "--json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert (values["pe_rows"], values["acc_bits"], values["moving_max"]) == (8, 20, 7)


@pytest.mark.parametrize("argv, message", [
    (["config", "--set", "pe_rows=6"],
     "opentrn config: error: pe_rows=6: must be a power of two between 2 and 256"),
    (["verilog", "--set", "wibble=1"], "opentrn verilog: error: wibble: unknown configuration"),
    (["demo", "--set", "acc_bits=8", "--sim", "icarus"], "opentrn demo: error: acc_bits=8"),
    (["demo", "--m", "0", "--sim", "icarus"], "opentrn demo: error: --m=0: must be at least 1"),
    (["run", "mlp", "--hidden", "-3", "--sim", "icarus"],
     "opentrn run: error: --hidden=-3: must be at least 1"),
    (["run", "gemm", "--set", "pe_rows=8", "--sim", "icarus"],
     "opentrn run: error: sbuf_partitions=4: must equal pe_rows=8"),
    (["demo", "--preset", "trn3", "--sim", "icarus"],
     "opentrn demo: error: dtypes=bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,mxfp8e5m2: must include int8 "
     "(the hardware's integer path is always built) (try --set "
     "dtypes=int8,bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,mxfp8e5m2)"),
    (["verilog", "--top", "core", "--set", "dma_bus_bytes=64"],
     "opentrn verilog: error: dma_bus_bytes=64: the core's instruction fetch needs a bus of "
     "at most 32 bytes"),
    (["verilog", "--top", "core", "--set", "pe_cols=8"],
     "opentrn verilog: error: pe_cols=8: the core needs pe_cols <= sbuf_partitions=4"),
    (["verilog", "--preset", "trn2", "--top", "dma"],
     "opentrn verilog: error: dtypes=bf16,fp8e4m3,fp8e5m2: must include int8 (the hardware's "
     "integer path is always built) (try --set dtypes=int8,bf16,fp8e4m3,fp8e5m2)"),
    (["run", "gemm", "--preset", "small", "--dtype", "bf16", "--sim", "icarus"],
     "opentrn run: error: --dtype=bf16: not among this build's formats, dtypes=int8 (add it "
     "with --set dtypes=...)"),
    (["run", "gemm", "--preset", "small", "--dtype", "mxfp8e4m3", "--sim", "icarus"],
     "opentrn run: error: --dtype=mxfp8e4m3: not among this build's formats, dtypes=int8 "
     "(add it with --set dtypes=...)"),
    (["run", "mlp", "--set", "dtypes=int8,bf16,fp8e4m3,fp8e5m2", "--dtype", "mxfp8e5m2",
      "--sim", "icarus"],
     "opentrn run: error: --dtype=mxfp8e5m2: not among this build's formats, "
     "dtypes=int8,bf16,fp8e4m3,fp8e5m2 (add it with --set dtypes=...)"),
])
def test_errors_exit_2_and_name_the_field(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["mxfp8e4m3", "mxfp8e5m2"])
@pytest.mark.parametrize("argv", [["run", "gemm", "--m", "5", "--k", "70", "--n", "9"],
                                  ["run", "gemm-relu", "--m", "6", "--k", "40", "--n", "7"],
                                  ["run", "mlp", "--batch", "6", "--d-in", "40", "--hidden", "9",
                                   "--d-out", "3"],
                                  ["demo", "--m", "5", "--k", "33", "--n", "6"]],
                         ids=["gemm", "gemm-relu", "mlp", "demo"])
def test_mx_kernels_of_the_cli_on_the_golden_machine(argv, dtype):
    """``--dtype mxfp8e4m3|mxfp8e5m2``: the kernels ``opentrn run`` / ``demo`` build (FP8
    elements, random E8M0 block scales) match their numpy references on the golden machine
    (the CLI itself runs the core RTL)."""
    args = cli._parser().parse_args([*argv, "--preset", "tiny", "--dtype", dtype,
                                     "--seed", "3"])
    if args.command == "demo":
        args.kernel = "gemm-relu"            # as ``opentrn demo`` does
    label, program, expected = cli._build_kernel(args, cli._config(args))
    assert label.startswith(f"{dtype} ")
    scales = {"x_t_scales", "w1_scales", "w2_scales", "h_scales"} if args.kernel == "mlp" \
        else {"a_t_scales", "b_scales"}
    assert scales <= set(program.inputs)
    codes = program.read_inputs()[min(scales)]
    assert codes.dtype == np.uint8 and codes.min() >= cli.MX_SCALE_CODES[0]
    outputs, outcome = program.run()
    for name, value in expected.items():
        assert same_bits(outputs[name], value), name
        finite = np.isfinite(value.astype(np.float32))
        assert finite.mean() > 0.9 and len(np.unique(value[finite])) > 5


def test_unknown_preset_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["config", "--preset", "huge"])
    assert info.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


@pytest.mark.sim
@pytest.mark.parametrize("sim, dtype", [("icarus", "int8"), ("verilator", "fp8e4m3")])
def test_demo_json_and_waves(sim, dtype, tmp_path):
    """The README's demo, as a user runs it: ``python -m opentrn demo --json``: a GEMM +
    bias + ReLU through the whole core, checked against numpy and the golden machine (int8,
    the default, and a float format)."""
    require_simulator(sim)
    vcd = tmp_path / "demo.vcd"
    dtype_args = [] if dtype == "int8" else ["--dtype", dtype]
    completed = subprocess.run(
        [sys.executable, "-m", "opentrn", "demo", "--sim", sim, "--m", "8", "--k", "12",
         "--n", "20", "--json", "--waves", str(vcd), *dtype_args], capture_output=True,
        text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["passed"] is True and report["mismatches"] == 0
    assert report["golden_mismatches"] == 0 and report["fault"] == "NONE"
    assert report["sim"] == sim and report["preset"] == "tiny"
    assert report["kernel"] == f"{dtype} gemm+bias+relu 8x12x20" and report["dtype"] == dtype
    assert report["macs"] == 8 * 12 * 20 and 0 < report["utilization"] <= 1
    assert set(report["engine_busy"]) == {"dma", "tensor", "activation"}
    assert all(0 < value <= report["cycles"] for value in report["engine_busy"].values())
    assert report["dma_bytes"] > 0
    assert report["vcd"] == str(vcd) and vcd.exists()
    # Progress went to stderr, the report alone to stdout.
    assert "simulating" in completed.stderr

    completed = subprocess.run(
        [sys.executable, "-m", "opentrn", "wave", str(vcd), "--signal",
         r"tensor_unit.*moving__valid$", "--json"], capture_output=True, text=True,
        check=False)
    assert completed.returncode == 0, completed.stderr
    table = json.loads(completed.stdout)
    valid = table["signals"][0]
    # The array took one moving vector per MAC-cycle of the counters.
    assert sum(row["values"][valid] == 1 for row in table["rows"]) >= \
        report["engine_busy"]["tensor"]


@pytest.mark.sim
@pytest.mark.parametrize("argv", [["gemm", "--m", "5", "--k", "9", "--n", "7"],
                                  ["gemm", "--m", "5", "--k", "9", "--n", "7", "--dtype", "bf16"],
                                  ["mlp", "--batch", "6", "--d-in", "5", "--hidden", "9",
                                   "--d-out", "3"],
                                  ["mlp", "--batch", "6", "--d-in", "5", "--hidden", "9",
                                   "--d-out", "3", "--dtype", "fp8e5m2"],
                                  ["gemm-relu", "--m", "5", "--k", "40", "--n", "7", "--dtype",
                                   "mxfp8e4m3"]],
                         ids=["gemm", "gemm-bf16", "mlp", "mlp-fp8e5m2", "gemm-relu-mxfp8e4m3"])
def test_run_text_report(argv, capsys):
    sim = runner.long_run_simulator()
    require_simulator(sim)
    assert main(["run", *argv, "--sim", sim, "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "PASS: bit-exact against numpy and the golden machine" in out
    assert "mismatches        0 (golden machine: 0 bytes)" in out
