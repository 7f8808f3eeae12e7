import argparse
import json
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest

from opentrn import cli, config, kernels
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
    (["verilog", "--preset", "trn3", "--top", "sbuf", "--set", "pe_rows=256", "--set",
      "sbuf_partitions=256"],
     "opentrn verilog: error: sbuf_partitions=256: the SBUF's vector write (a 32-byte vector "
     "word, Config.vector_word_bytes, and its byte strobes in each of 256 partitions) is "
     "73,741 bits, wider than the 65,536 bits of a Verilog vector Amaranth can write (about "
     "9 x sbuf_partitions x vector_word_bytes bits must fit); the tensor engine builds at any "
     "size"),
    (["demo", "--preset", "trn3", "--set", "pe_rows=16", "--set", "pe_cols=16", "--set",
      "sbuf_partitions=16", "--sim", "icarus"],
     "opentrn demo: error: --dtype=int8: not among this build's formats, "
     "dtypes=bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,mxfp8e5m2 (add it with --set dtypes=...)"),
    (["verilog", "--top", "core", "--set", "pe_macs_per_cycle=bf16:8"],
     "opentrn verilog: error: pe_macs_per_cycle=bf16:8: a column of bf16 is 8 x 2 = 16 bytes, "
     "more than one SBUF vector word (8 bytes: dma_bus_bytes=8, at most 32): the hardware "
     "reads a column from one"),
    (["verilog", "--top", "core", "--set", "pe_cols=8"],
     "opentrn verilog: error: pe_cols=8: the core needs pe_cols <= sbuf_partitions=4"),
    (["verilog", "--preset", "trn3", "--top", "dma", "--set",
      "pe_macs_per_cycle=mxfp8e4m3:4,mxfp8e5m2:2"],
     "opentrn verilog: error: pe_macs_per_cycle=mxfp8e4m3:4,mxfp8e5m2:2: the MX formats must "
     "have one rate in the hardware (not mxfp8e4m3:4, mxfp8e5m2:2)"),
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


@pytest.mark.parametrize("argv, message", [
    (["run", "gemm", "--seed", "-1", "--sim", "icarus"], "--seed=-1: must be at least 0"),
    # Refused before the inputs are drawn or an instruction generated (it took minutes, or
    # died allocating): the operands alone exceed tiny's 16 MiB of HBM.
    (["run", "gemm", "--m", "300000", "--sim", "icarus"],
     "A 300000 x 64, B 64 x 64, C 300000 x 64: the operands and results need at least "
     "38,404,096 bytes of HBM, more than hbm_bytes=16,777,216"),
    (["run", "gemm", "--m", "99999999", "--k", "99999999", "--sim", "icarus"],
     "the operands and results need at least"),
    (["run", "mlp", "--batch", "9999999", "--sim", "icarus"],
     "x_t 32 x 9999999, w1 32 x 64, w2 64 x 16, out 16 x 9999999: the operands"),
    # The fast path refuses a schedule it cannot model step by step, at once.
    (["project", "--gemm", "100000000000,100000000000,100000000000"],
     "--gemm: m=100000000000, k=100000000000, n=100000000000: 75,120,192,343,750,000,000,"
     "000,000,000 schedule steps on this configuration (4x4), more than the 2,000,000"),
    (["project", "--transformer", "100000000,100000000,1,1000000,8"],
     "--transformer: m=8000000, k=100000000, n=300000000"),
])
def test_sizes_beyond_the_machine_are_refused_at_once(argv, message, capsys):
    started = time.monotonic()
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert time.monotonic() - started < 1.0


def test_output_files_get_their_folder_and_a_directory_is_refused(tmp_path, capsys):
    """``-o``, ``--waves`` and ``--plot``: a missing folder is made (as the runner always
    did for waves); a directory is refused before any work (for waves it was an
    IsADirectoryError traceback after the whole simulation)."""
    nested = tmp_path / "new" / "folder" / "te.v"
    assert main(["verilog", "-o", str(nested)]) == 0
    assert nested.read_text().startswith("/*")
    for argv in (["verilog", "-o", str(tmp_path)],
                 ["demo", "--waves", str(tmp_path), "--sim", "icarus"],
                 ["project", "--gemm", "8,8,8", "--plot", str(tmp_path)]):
        assert main(argv) == 2
        assert f"={tmp_path}: is a directory; name a file" in capsys.readouterr().err


def test_config_files_that_are_not_toml_text_are_refused(tmp_path, capsys):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00pe_rows")
    cases = [(tmp_path, f"file={str(tmp_path)!r}: is a directory, not a TOML file"),
             (binary, f"file={str(binary)!r}: not valid TOML (not UTF-8 text: byte 0xff at "
                      "offset 0)")]
    for path, message in cases:
        assert main(["config", "--file", str(path)]) == 2
        assert f"opentrn config: error: {message}" in capsys.readouterr().err


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
    assert codes.dtype == np.uint8 and codes.min() >= kernels.MX_SCALE_CODES[0]
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
    # The cycle model predicted every counter.
    assert report["prediction_exact"] is True and report["predicted"]["cycles"] == \
        report["cycles"]
    assert report["vcd"] == str(vcd) and vcd.exists()
    # The GTKWave save file beside it (tests/test_gtkw.py checks its contents).
    gtkw = vcd.with_suffix(".gtkw")
    assert report["gtkw"] == str(gtkw) and f'[dumpfile] "{vcd}"' in gtkw.read_text()
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


# -- opentrn project ---------------------------------------------------------------------------

def test_run_model_reports_the_formats_peak_and_the_dma_engines_the_rtl_builds(capsys):
    """On trn3 (MXFP8 4 MACs per PE a cycle, 16 DMA engines configured) the report's
    utilization is against the format's peak, and it says that the RTL (and the model
    following it) builds one DMA engine, which tiny's report does not need to say."""
    argv = ["run", "gemm", "--preset", "trn3", "--dtype", "mxfp8e4m3", "--m", "128", "--k",
            "512", "--n", "64", "--model"]      # K: one whole K tile of 128 rows x 4
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    counters = report["counters"]
    assert report["utilization"] == counters["macs"] / (counters["cycles"] * 128 * 128 * 4)
    assert report["utilization"] == counters["tensor_busy"] / counters["cycles"]
    assert report["dma_engines_built"] == 1
    assert main(argv) == 0
    assert ("dma_engines=16: the RTL builds 1 DMA engine of 64 bytes a cycle"
            in " ".join(capsys.readouterr().out.split()))
    assert main(["run", "gemm", "--model"]) == 0
    assert "dma_engines=" not in capsys.readouterr().out


def test_project_peaks_text_and_json(capsys):
    assert main(["project", "--preset", "trn3", "--peaks"]) == 0
    out = capsys.readouterr().out
    assert "| core | bf16 | TFLOPS | 78.64 | 79 | -0.45% |" in out
    assert "| core | mxfp8e4m3 | TFLOPS | 314.57 | 315 | -0.14% |" in out
    # The chip page's figure and the per-core figure x 8, each with its difference.
    assert "| chip | bf16 | TFLOPS | 629.15 | 671 | -6.24% | 632 | -0.45% |" in out
    assert "| core | fp32 | TFLOPS | - | 20 | - |" in out
    assert main(["project", "--preset", "trn2", "--peaks", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["published"] == "trn2" and report["preset"] == "trn2"
    fp8 = [row for row in report["rows"] if (row["level"], row["quantity"]) ==
           ("core", "fp8e4m3")][0]
    assert fp8["published"] == 158 and abs(fp8["diff_pct"]) < 1
    # Overrides keep the base preset's published figures beside the changed model.
    assert main(["project", "--preset", "trn3", "--set", "pe_macs_per_cycle=", "--peaks",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    mx = [row for row in report["rows"] if (row["level"], row["quantity"]) ==
          ("core", "mxfp8e4m3")][0]
    assert report["preset"] == "trn3 + overrides" and mx["published"] == 315
    assert mx["diff_pct"] == pytest.approx(-75, abs=0.2)


def test_project_gemm_json_and_text(capsys):
    assert main(["project", "--preset", "trn3", "--gemm", "2048,1024,512", "--chips", "4",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gemm"] == {"m": 2048, "k": 1024, "n": 512} and report["dtype"] == "bf16"
    assert [level["level"] for level in report["levels"]] == [
        "1 core", "1 chip (8 cores)", "4 chips (tensor)"]
    keys = {"cycles", "seconds", "comm_s", "achieved_flops", "peak_flops", "utilization",
            "intensity", "ridge", "bound", "flops", "hbm_bytes", "core_split"}
    assert all(keys <= set(level) for level in report["levels"])
    assert report["levels"][2]["comm_s"] > 0 and report["levels"][0]["comm_s"] == 0
    assert main(["project", "--preset", "trn3", "--gemm", "1024,1024,1024", "--dtype",
                 "mxfp8e4m3", "--cores", "2", "--parallel", "data", "--chips", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 MAC/PE/cycle in mxfp8e4m3" in out
    assert "| 1 chip (2 cores) |" in out and "| 2 chips (data) |" in out


def test_project_names_the_model_of_a_cores_cycles(capsys):
    """tiny follows the exact model: a short GEMM's core cycles are the RTL's (the issue's
    example; tests/test_projection.py compares them with predict()), said in the report and
    the JSON; ``--core-model fast`` takes the fast path."""
    from opentrn import projection
    argv = ["project", "--preset", "tiny", "--gemm", "256,1,256", "--dtype", "int8"]
    assert main([*argv, "--json"]) == 0
    level = json.loads(capsys.readouterr().out)["levels"][0]
    exact = projection.gemm(config.preset("tiny"), 256, 1, 256, dtype="int8", model="exact")
    assert (level["model"], level["cycles"]) == ("exact", exact.cycles)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "core cycles  the exact cycle model (the RTL's, cycle for cycle)" in captured.out
    assert "the exact cycle model runs the kernel's program" in captured.err
    assert main([*argv, "--core-model", "fast", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["levels"][0]["model"] == "fast path"


def test_project_transformer_scaling_and_scalesim(capsys):
    assert main(["project", "--preset", "trn3", "--transformer", "1024,4096,16,256,2",
                 "--chips", "2", "--scaling", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chips"] == 2 and len(report["ops"]) == 14
    assert [curve[0]["parallel"] for curve in report["scaling"]] == ["data", "tensor"]
    assert report["scaling"][0][-1]["chips"] == 1_000_000
    assert main(["project", "--preset", "trn3", "--transformer", "1024,4096,16,256,2"]) == 0
    out = capsys.readouterr().out
    assert "| softmax | vector |" in out and "achieved" in out
    assert main(["project", "--preset", "tiny", "--gemm", "16,16,16", "--compare-scalesim",
                 "--json"]) == 0
    compare = json.loads(capsys.readouterr().out)["scalesim"]
    assert compare["scalesim_cycles"] == 16 * (2 * 4 + 4 + 16 - 2)


@pytest.mark.parametrize("argv, message", [
    (["--preset", "trn3", "--gemm", "1,2"],
     "opentrn project: error: --gemm=1,2: must be three positive integers M,K,N"),
    (["--preset", "trn3", "--gemm", "1,0,2"], "--gemm=1,0,2: must be three positive integers"),
    (["--preset", "trn3", "--transformer", "8,8"],
     "--transformer=8,8: must be five positive integers d_model,d_ff,heads,seq,batch"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--dtype", "int8"],
     "--dtype=int8: not among this build's formats, dtypes=bf16,fp8e4m3,fp8e5m2,mxfp8e4m3,"
     "mxfp8e5m2 (add it with --set dtypes=...)"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--chips", "0"], "--chips=0: must be at least 1"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--cores", "9"],
     "--cores=9: must be between 1 and cores_per_chip=8"),
    (["--preset", "trn3", "--transformer", "1024,4096,16,256,2", "--chips", "32"],
     "--chips=32: tensor parallelism splits the heads: must be at most heads=16"),
    (["--preset", "tiny", "--gemm", "8,8,8", "--chips", "2"],
     "link_bytes_per_s=0.0: must be positive to project on chips=2"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--hop-latency", "-1"],
     "--hop-latency=-1.0: must not be negative, and finite"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--hop-latency", "inf"],
     "--hop-latency=inf: must not be negative, and finite"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--hop-latency", "nan"],
     "--hop-latency=nan: must not be negative, and finite"),
    (["--preset", "trn3", "--peaks", "--compare-rtl"], "--compare-rtl: needs --gemm M,K,N"),
    (["--preset", "trn3", "--transformer", "64,64,2,8,1", "--compare-scalesim"],
     "--compare-scalesim: needs --gemm M,K,N"),
    (["--preset", "trn3", "--peaks", "--core-model", "fast"],
     "--core-model=fast: needs --gemm M,K,N"),
    (["--preset", "trn3", "--gemm", "8,8,8", "--core-model", "exact"],
     "model='exact': the exact model follows the RTL's one DMA engine of dma_bus_bytes a "
     "cycle; this configuration has dma_engines=16"),
])
def test_project_errors(argv, message, capsys):
    assert main(["project", *argv]) == 2
    assert message in capsys.readouterr().err


def test_project_needs_exactly_one_workload(capsys):
    for argv in ([], ["--peaks", "--gemm", "8,8,8"]):
        with pytest.raises(SystemExit) as info:
            main(["project", "--preset", "trn3", *argv])
        assert info.value.code == 2
    assert "one of the arguments --peaks --gemm --transformer is required" in \
        capsys.readouterr().err


def test_project_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "gemm.png"
    assert main(["project", "--preset", "trn3", "--gemm", "1024,1024,1024", "--chips", "8",
                 "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {path}" in capsys.readouterr().out
    path = tmp_path / "layer.png"
    assert main(["project", "--preset", "trn3", "--transformer", "1024,4096,16,256,2",
                 "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.sim
def test_project_compare_rtl(capsys):
    """Predicted against measured counters of a tiny GEMM on the core RTL (Icarus)."""
    require_simulator("icarus")
    assert main(["project", "--preset", "tiny", "--gemm", "8,8,8", "--compare-rtl", "--sim",
                 "icarus", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["kernel"] == "bf16 gemm 8x8x8"
    counters = {row["counter"]: row for row in report["counters"]}
    assert {"cycles", "dma_busy", "tensor_busy", "activation_busy", "dma_wait", "tensor_wait",
            "activation_wait"} <= set(counters)
    assert all(row["difference"] == row["predicted"] - row["measured"]
               for row in counters.values())
    # The cycle model predicts every counter exactly.
    assert report["exact"] is True, counters
    assert counters["tensor_busy"]["measured"] == 2 * 2 * 8    # 2 x 2 tiles of 8 vectors


def _numeric_options():
    """Every numeric option of every subcommand, from the parser itself (a new option is
    covered without touching this test)."""
    from opentrn.cli import _parser

    def walk(parser, path):
        subcommands = [action for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction)]
        if subcommands:
            for name, sub in subcommands[0].choices.items():
                yield from walk(sub, [*path, name])
            return
        for action in parser._actions:
            if action.option_strings and action.type in (int, float):
                yield path, action.option_strings[-1]

    return list(walk(_parser(), []))


def test_every_numeric_option_refuses_nonsense_by_name(tmp_path, capsys):
    """-1, NaN, infinity, an overflow and a word, on every numeric option of every
    subcommand: exit 2 at once, one line naming the option, never a traceback."""
    vcd = tmp_path / "tiny.vcd"
    vcd.write_text("$timescale 1ns $end\n$scope module top $end\n$var wire 1 ! clk $end\n"
                   "$upscope $end\n$enddefinitions $end\n#0\n0!\n#5\n1!\n")
    context = {"run": ["--sim", "icarus"], "demo": ["--sim", "icarus"],
               "project": ["--gemm", "8,8,8"], "wave": [str(vcd), "--signal", "clk"]}
    options = _numeric_options()
    assert {tuple(path) for path, _ in options} >= {("demo",), ("run", "gemm"), ("fuzz",),
                                                    ("project",), ("wave",)}
    for path, option in options:
        for value in ("-1", "nan", "inf", "1e400", "ten"):
            argv = [*path, option, value, *context.get(path[0], [])]
            started = time.monotonic()
            try:
                code = main(argv)
            except SystemExit as exc:       # argparse: not a number of the option's type
                code = exc.code
            err = capsys.readouterr().err
            assert code == 2, argv
            assert option in err and "Traceback" not in err, (argv, err)
            assert time.monotonic() - started < 1.0, argv


def test_a_refusal_does_not_import_the_float_dtypes():
    """ml_dtypes takes most of a second to import: a command refused for its arguments
    answers without it (about 0.55 s wall instead of 1.05 s on the development machine)."""
    code = ("import sys; from opentrn.cli import main; "
            "assert main(['run', 'gemm', '--m', '300000']) == 2; "
            "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "more than hbm_bytes" in done.stderr
