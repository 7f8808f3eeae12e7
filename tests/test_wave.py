"""Tests for opentrn.sim.wave, the VCD and FST reader behind `opentrn wave`, and for the
waves the simulator runner writes: FST on Icarus, and waves cut to some scopes.

Expected values come from the simulator, not from the tool: the Amaranth testbench records
what the design holds after each clock edge, and the Icarus dump below is checked against
values read off its text by hand. The scopes and variables a cut dump must hold are read
off the text of the whole dump of the same run.
"""

import argparse
import json
import re
import subprocess

import pytest
from amaranth import Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from amaranth.sim import Simulator

from opentrn import config
from opentrn.cli import main
from opentrn.sim import runner, wave

from .conftest import require_simulator

PERIOD = 1e-6
TICKS = 8


class _Inner(wiring.Component):
    q: Out(4)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.q.eq(self.q + 1)
        return m


class _Dut(wiring.Component):
    count: Out(8)
    # 5, 2, -1, -4, ...: negative from the second edge on, to exercise signed decoding.
    level: Out(signed(8), init=5)

    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def elaborate(self, platform):
        m = Module()
        # A submodule in the sync domain makes pysim dump the clock under two scopes.
        m.submodules.inner = self.inner
        m.d.sync += [self.count.eq(self.count + 1), self.level.eq(self.level - 3)]
        return m


def _vcd_variables(path):
    """``(scope, fields)`` of each ``$var`` of a VCD, read off its text independently of the
    code under test: ``scope`` its dotted path from the root, ``fields`` the line's words."""
    scopes = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts[:1] == ["$scope"]:
                scopes.append(parts[2])
            elif parts[:1] == ["$upscope"]:
                scopes.pop()
            elif parts[:1] == ["$var"]:
                yield ".".join(scopes), parts
            elif parts[:1] == ["$enddefinitions"]:
                return
    raise AssertionError(f"{path}: no $enddefinitions")

@pytest.fixture(scope="module")
def amaranth_vcd(tmp_path_factory):
    """Simulate _Dut for TICKS edges; return the VCD path, its names and what the TB saw."""
    dut = _Dut()
    sim = Simulator(dut)
    sim.add_clock(PERIOD)
    seen = []

    async def tb(ctx):
        for _ in range(TICKS):
            await ctx.tick()
            # After tick() returns, the edge's register updates are visible: this is the
            # value each register holds during the cycle that edge starts.
            seen.append(
                {
                    "count": ctx.get(dut.count),
                    "level": ctx.get(dut.level),
                    "q": ctx.get(dut.inner.q),
                }
            )

    sim.add_testbench(tb)
    path = tmp_path_factory.mktemp("wave") / "dut.vcd"
    with sim.write_vcd(str(path)):
        sim.run()

    # pysim's scope names differ between versions (`top`, `bench.top`): read them off the
    # file instead of guessing, independently of the code under test.
    names = {}
    for scope, parts in _vcd_variables(path):
        names.setdefault(f"{scope}.{parts[4]}", int(parts[2]))
    top = next(n for n in names if n.endswith(".count")).rsplit(".", 1)[0]
    assert "$timescale 1 fs $end" in path.read_text()
    return {"path": path, "top": top, "names": names, "seen": seen}


def _edge_time(cycle):
    # add_clock starts low and rises half a period in; the dump is in fs.
    return round((cycle + 0.5) * PERIOD * 1e15)


# A real Icarus Verilog 11 dump (vector names carry [7:0], the clock net appears under three
# scopes with one id, `U$0` is an escaped instance name, q starts as x). cnt is forced to 0xf0
# at #7; q registers cnt, sub.d is cnt, sub.q registers d.
ICARUS_VCD = """\
$date
\tWed Dec  2 14:57:47 2026
$end
$version
\tIcarus Verilog
$end
$timescale
\t1s
$end
$scope module tb $end
$var reg 1 ! clk $end
$scope module tensor_engine $end
$var wire 1 ! clk $end
$var wire 8 " q [7:0] $end
$var reg 8 # cnt [7:0] $end
$scope module U$0 $end
$var wire 1 ! clk $end
$var wire 8 $ d [7:0] $end
$var reg 8 % q [7:0] $end
$upscope $end
$upscope $end
$upscope $end
$enddefinitions $end
#0
$dumpvars
bx %
bx $
bx #
bx "
0!
$end
#5
1!
#7
b11110000 #
b11110000 $
#10
0!
#15
b11110001 #
b11110001 $
b11110000 "
b11110000 %
1!
#20
0!
#25
b11110001 "
b11110001 %
b11110010 #
b11110010 $
1!
#30
0!
"""


@pytest.fixture
def icarus_vcd(tmp_path):
    path = tmp_path / "icarus.vcd"
    path.write_text(ICARUS_VCD)
    return path


def _run(capsys, *argv):
    """Run `opentrn wave ARGV` the way the CLI will: a subparser filled by add_arguments."""
    parser = argparse.ArgumentParser(prog="opentrn")
    sub = parser.add_subparsers(dest="cmd", required=True)
    wave_parser = sub.add_parser("wave")
    wave.add_arguments(wave_parser)
    wave_parser.set_defaults(func=wave.command)
    args = parser.parse_args(["wave", *map(str, argv)])
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


def _parse_table(out):
    lines = out.strip().splitlines()
    header = lines[0].split()
    return header, [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]


# --list


def test_list_signals_names_and_widths(amaranth_vcd):
    top = amaranth_vcd["top"]
    got = wave.list_signals(amaranth_vcd["path"])
    for expected in [
        (f"{top}.clk", 1),
        (f"{top}.count", 8),
        (f"{top}.level", 8),
        (f"{top}.inner.clk", 1),
        (f"{top}.inner.q", 4),
    ]:
        assert expected in got
    assert got == list(amaranth_vcd["names"].items())


def test_list_cli_table(amaranth_vcd, capsys):
    top = amaranth_vcd["top"]
    rc, out, err = _run(capsys, amaranth_vcd["path"], "--list")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["signal", "width"]
    assert any(re.fullmatch(rf"{re.escape(top)}\.count\s+8", line) for line in lines)
    assert any(re.fullmatch(rf"{re.escape(top)}\.inner\.q\s+4", line) for line in lines)
    # Both scopes of the clock are listed.
    assert any(line.split()[0] == f"{top}.clk" for line in lines[1:])
    assert any(line.split()[0] == f"{top}.inner.clk" for line in lines[1:])


def test_list_filtered_json(amaranth_vcd, capsys):
    top = amaranth_vcd["top"]
    rc, out, _ = _run(capsys, amaranth_vcd["path"], "--list", "--json", "--signal", r"\.clk$")
    assert rc == 0
    assert json.loads(out) == [
        {"name": f"{top}.clk", "width": 1},
        {"name": f"{top}.inner.clk", "width": 1},
    ]


def test_list_icarus_strips_bit_range(icarus_vcd):
    assert wave.list_signals(icarus_vcd) == [
        ("tb.clk", 1),
        ("tb.tensor_engine.clk", 1),
        ("tb.tensor_engine.q", 8),
        ("tb.tensor_engine.cnt", 8),
        ("tb.tensor_engine.U$0.clk", 1),
        ("tb.tensor_engine.U$0.d", 8),
        ("tb.tensor_engine.U$0.q", 8),
    ]


# cycle table


def test_counter_value_each_cycle(amaranth_vcd):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    # The design counts from 0 with no reset, so the register holds c + 1 after edge c.
    assert [s["count"] for s in seen] == list(range(1, TICKS + 1))
    table = wave.cycle_table(amaranth_vcd["path"], [r"\.count$", r"inner\.q$"])
    assert table["clock"] == f"{top}.clk"
    assert table["signals"] == [f"{top}.count", f"{top}.inner.q"]
    assert len(table["rows"]) == TICKS
    for c, row in enumerate(table["rows"]):
        assert row["cycle"] == c
        assert row["time"] == _edge_time(c)
        assert row["values"] == {f"{top}.count": seen[c]["count"], f"{top}.inner.q": seen[c]["q"]}


def test_signed_decoding(amaranth_vcd):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    name = f"{top}.level"
    levels = [s["level"] for s in seen]
    assert min(levels) < 0
    signed_rows = wave.cycle_table(amaranth_vcd["path"], [r"\.level$"], signed=True)["rows"]
    assert [r["values"][name] for r in signed_rows] == levels
    unsigned_rows = wave.cycle_table(amaranth_vcd["path"], [r"\.level$"])["rows"]
    assert [r["values"][name] for r in unsigned_rows] == [v & 0xFF for v in levels]


def test_window(amaranth_vcd):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    rows = wave.cycle_table(amaranth_vcd["path"], ["count"], start=2, stop=4)["rows"]
    assert [r["cycle"] for r in rows] == [2, 3, 4]
    assert [r["time"] for r in rows] == [_edge_time(c) for c in (2, 3, 4)]
    assert [r["values"][f"{top}.count"] for r in rows] == [seen[c]["count"] for c in (2, 3, 4)]
    # --to past the end stops at the last cycle, which shows the final value.
    rows = wave.cycle_table(amaranth_vcd["path"], ["count"], start=TICKS - 2, stop=10 * TICKS)[
        "rows"
    ]
    assert [r["cycle"] for r in rows] == [TICKS - 2, TICKS - 1]
    assert rows[-1]["values"][f"{top}.count"] == seen[-1]["count"]


def test_regex_matching_many_signals(amaranth_vcd):
    top = amaranth_vcd["top"]
    table = wave.cycle_table(amaranth_vcd["path"], [r"clk$", r"\.clk$"])
    # Each signal once, in the order first matched.
    assert table["signals"] == [f"{top}.clk", f"{top}.inner.clk"]
    # The clock fell mid-cycle, so it is low at the end of every complete cycle (the dump
    # stops before the last cycle's falling edge, and the last cycle shows the final value).
    assert all(v == 0 for r in table["rows"][:-1] for v in r["values"].values())


def test_clock_option(amaranth_vcd):
    top = amaranth_vcd["top"]
    table = wave.cycle_table(amaranth_vcd["path"], ["count"], clock=r"inner\.clk")
    assert table["clock"] == f"{top}.inner.clk"
    assert len(table["rows"]) == TICKS


def test_cli_table(amaranth_vcd, capsys):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    rc, out, err = _run(
        capsys, amaranth_vcd["path"], "--signal", "count", "--signal", "level", "--signed"
    )
    assert rc == 0 and err == ""
    header, rows = _parse_table(out)
    assert header == ["cycle", "time", f"{top}.count", f"{top}.level"]
    assert len(rows) == TICKS
    for c, row in enumerate(rows):
        assert row["cycle"] == str(c)
        assert row["time"] == str(_edge_time(c))
        assert row[f"{top}.count"] == str(seen[c]["count"])
        assert row[f"{top}.level"] == str(seen[c]["level"])


def test_cli_window_and_hex(amaranth_vcd, capsys):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    path = amaranth_vcd["path"]
    rc, out, _ = _run(
        capsys, path, "--signal", r"\.(count|level)$", "--hex", "--from", 1, "--to", 3
    )
    assert rc == 0
    _, rows = _parse_table(out)
    assert [r["cycle"] for r in rows] == ["1", "2", "3"]
    for row in rows:
        c = int(row["cycle"])
        assert row[f"{top}.count"] == f"0x{seen[c]['count']:02x}"
        assert row[f"{top}.level"] == f"0x{seen[c]['level'] & 0xFF:02x}"
    rc, out, _ = _run(
        capsys, path, "--signal", "level", "--hex", "--signed", "--from", 2, "--to", 2
    )
    assert seen[2]["level"] < 0
    assert _parse_table(out)[1][0][f"{top}.level"] == f"-0x{-seen[2]['level']:02x}"


def test_cli_json(amaranth_vcd, capsys):
    top, seen = amaranth_vcd["top"], amaranth_vcd["seen"]
    rc, out, _ = _run(capsys, amaranth_vcd["path"], "--signal", r"\.count$", "--json", "--from", 3)
    assert rc == 0
    data = json.loads(out)
    assert set(data) == {"clock", "signals", "rows"}
    assert data["clock"] == f"{top}.clk"
    assert data["signals"] == [f"{top}.count"]
    assert data["rows"] == [
        {"cycle": c, "time": _edge_time(c), "values": {f"{top}.count": seen[c]["count"]}}
        for c in range(3, TICKS)
    ]


def test_icarus_x_and_duplicate_scopes(icarus_vcd, capsys):
    # Edges at #5, #15, #25; each cycle shows the last change before the next edge.
    table = wave.cycle_table(icarus_vcd, [r"\.q$", r"cnt"])
    assert table["clock"] == "tb.clk"
    assert table["signals"] == [
        "tb.tensor_engine.q",
        "tb.tensor_engine.U$0.q",
        "tb.tensor_engine.cnt",
    ]
    assert [(r["cycle"], r["time"]) for r in table["rows"]] == [(0, 5), (1, 15), (2, 25)]
    assert [list(r["values"].values()) for r in table["rows"]] == [
        [None, None, 0xF0],
        [0xF0, 0xF0, 0xF1],
        [0xF1, 0xF1, 0xF2],
    ]
    signed_rows = wave.cycle_table(icarus_vcd, ["cnt"], signed=True)["rows"]
    assert [r["values"]["tb.tensor_engine.cnt"] for r in signed_rows] == [-16, -15, -14]

    rc, out, _ = _run(capsys, icarus_vcd, "--signal", r"engine\.q$")
    assert rc == 0
    assert [r["tb.tensor_engine.q"] for r in _parse_table(out)[1]] == ["x", "240", "241"]
    rc, out, _ = _run(capsys, icarus_vcd, "--signal", r"clk", "--json", "--to", 0)
    assert json.loads(out)["signals"] == [
        "tb.clk",
        "tb.tensor_engine.clk",
        "tb.tensor_engine.U$0.clk",
    ]
    rc, out, _ = _run(capsys, icarus_vcd, "--signal", r"engine\.q$", "--json")
    assert json.loads(out)["rows"][0]["values"] == {"tb.tensor_engine.q": None}


# bad input


@pytest.fixture
def bad_files(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a waveform\n")
    empty_defs = tmp_path / "nodefs.vcd"
    empty_defs.write_text("$timescale 1ns $end\n$enddefinitions $end\n#0\n")
    noclk = tmp_path / "noclk.vcd"
    noclk.write_text(ICARUS_VCD.replace(" clk ", " ck "))
    return {"text": text, "nodefs": empty_defs, "noclk": noclk, "missing": tmp_path / "gone.vcd"}


@pytest.mark.parametrize(
    ("file", "argv", "needles"),
    [
        ("missing", ["--list"], ["file", "gone.vcd", "No such file"]),
        ("missing", ["--signal", "x"], ["file", "gone.vcd"]),
        ("text", ["--list"], ["file", "notes.txt", "not a VCD"]),
        ("nodefs", ["--signal", "x"], ["file", "nodefs.vcd", "not a VCD"]),
        ("noclk", ["--signal", "cnt"], ["--clock", "clk"]),
        ("vcd", ["--signal", "count", "--clock", "nosuch"], ["--clock 'nosuch'", "--list"]),
        ("vcd", ["--signal", "count", "--clock", "count"], ["--clock 'count'", "multi-bit"]),
        ("vcd", ["--signal", "count", "--signal", "nosuch"], ["--signal 'nosuch'", "--list"]),
        ("vcd", ["--list", "--signal", "nosuch"], ["--signal 'nosuch'"]),
        ("vcd", ["--signal", "count", "--from", "5", "--to", "2"], ["--from 5", "--to 2"]),
        ("vcd", ["--signal", "count", "--from", "-1"], ["--from -1"]),
        ("vcd", ["--signal", "count", "--from", "99"], ["--from 99", "0..7"]),
        ("vcd", ["--signal", "(count"], ["--signal '(count'", "bad regex"]),
        ("vcd", ["--signal", "count", "--clock", "[clk"], ["--clock '[clk'", "bad regex"]),
        ("vcd", [], ["--signal", "--list"]),
    ],
)
def test_bad_input_exits_2(amaranth_vcd, bad_files, capsys, file, argv, needles):
    path = amaranth_vcd["path"] if file == "vcd" else bad_files[file]
    rc, out, err = _run(capsys, path, *argv)
    assert rc == 2
    assert out == ""
    assert err.startswith("opentrn wave: error: ")
    assert len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err


def test_library_raises_wave_error(amaranth_vcd, bad_files):
    with pytest.raises(wave.WaveError, match="not a VCD"):
        wave.list_signals(bad_files["text"])
    with pytest.raises(wave.WaveError, match="--signal 'nosuch'"):
        wave.cycle_table(amaranth_vcd["path"], ["nosuch"])
    with pytest.raises(wave.WaveError, match="--from 3 is after --to 1"):
        wave.cycle_table(amaranth_vcd["path"], ["count"], start=3, stop=1)
    with pytest.raises(wave.WaveError, match="--clock"):
        wave.cycle_table(bad_files["noclk"], ["cnt"])


def _cut_inside_declarations():
    """The Icarus VCD cut in the middle of a `$var` line (it used to list a signal with
    an empty name and exit 0)."""
    head = ICARUS_VCD[:ICARUS_VCD.index("$enddefinitions")]
    last_var = head.rindex("$var")
    return head[:last_var + len("$var wire 8")]


@pytest.mark.parametrize(("text", "argv", "needles"), [
    (_cut_inside_declarations(), ["--list"],
     ["$var is not closed by $end", "ends inside its declarations"]),
    (ICARUS_VCD[:ICARUS_VCD.index("$enddefinitions")], ["--list"],
     ["ends inside its declarations", "no $enddefinitions"]),
    (ICARUS_VCD.replace("$enddefinitions", "$wibble $end\n$enddefinitions"), ["--list"],
     ["unknown section $wibble"]),
    (ICARUS_VCD + "1?\n", ["--signal", "q"],
     ["a value change of identifier '?', which no $var declares"]),
    (ICARUS_VCD + "#40\nb1010\n", ["--signal", "q"],
     ["ends inside the value change 'b1010'"]),
    (ICARUS_VCD + "#4x\n", ["--signal", "q"], ["'#4x' is not a time"]),
    (ICARUS_VCD.replace("$var wire 1 ! clk $end", "$var wire one ! clk $end"), ["--list"],
     ["`$var wire one ! clk $end` is not `$var TYPE SIZE ID NAME $end`"]),
])
def test_malformed_vcds_are_refused_with_the_line(tmp_path, capsys, text, argv, needles):
    path = tmp_path / "bad.vcd"
    path.write_text(text)
    rc, out, err = _run(capsys, path, *argv)
    assert (rc, out) == (2, "")
    assert err.startswith("opentrn wave: error: file ") and "line " in err
    assert len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err


def test_any_cut_or_corruption_of_a_vcd_is_read_or_refused(tmp_path):
    """Hypothesis: the Icarus VCD cut anywhere, or with any character replaced, is either
    read (a prefix of whole value changes is a valid VCD) or refused with a WaveError;
    never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    path = tmp_path / "fuzz.vcd"

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cut=st.integers(0, len(ICARUS_VCD)), at=st.integers(0, len(ICARUS_VCD) - 1),
           char=st.sampled_from(list("$#01xzb !%&\n")))
    def check(cut, at, char):
        text = (ICARUS_VCD[:at] + char + ICARUS_VCD[at + 1:])[:cut]
        path.write_text(text)
        for read in (lambda: wave.list_signals(path),
                     lambda: wave.cycle_table(path, ["."])):
            try:
                read()
            except wave.WaveError:
                pass

    check()


# FST: Icarus writes one for a file named *.fst, and it reads as the VCD of the same run.

# A small design with what the readers could tell apart: a value that starts x, a real, an
# escaped instance name, an escaped name with an index (pywellen makes `\a` a scope of its
# own, holding `[0]`), declared between plain ones, and the same net under two scopes.
SMALL_DESIGN = r"""
module sub(input clk, input [7:0] d, output reg [7:0] q);
  always @(posedge clk) q <= d;
endmodule
module tb;
  reg clk = 0;
  reg [7:0] cnt;
  wire [3:0] \a[0] ;
  wire [7:0] q;
  real r = 1.5;
  assign \a[0] = cnt[3:0];
  sub \U$0 (.clk(clk), .d(cnt), .q(q));
  always #5 clk = ~clk;
  initial begin
    #7 cnt = 8'hf0;  // between clock edges: no race with the registers
    #10 cnt = cnt + 1; r = -2.25;
    #10 cnt = 8'h0f;
    #20 $finish;
  end
endmodule
module dump;  // a root of its own, so that its file name is not in the dump
  reg [8*256-1:0] path;
  initial if ($value$plusargs("dump=%s", path)) begin $dumpfile(path); $dumpvars(0, tb); end
endmodule
"""


@pytest.mark.sim
def test_icarus_fst_of_a_small_design_reads_as_its_vcd(tmp_path, capsys):
    require_simulator("icarus")
    (tmp_path / "tb.v").write_text(SMALL_DESIGN)
    subprocess.run(["iverilog", "-g2005", "-o", "tb.vvp", "tb.v"], cwd=tmp_path, check=True)
    vcd, fst = tmp_path / "waves.vcd", tmp_path / "waves.fst"
    for path, flags in ((vcd, []), (fst, ["-fst"])):
        subprocess.run(["vvp", "-n", "tb.vvp", *flags, f"+dump={path}"], cwd=tmp_path,
                       check=True, capture_output=True)
    assert vcd.read_bytes().startswith(b"$date") and fst.read_bytes()[:1] == b"\x00"
    expected = [("tb.clk", 1), ("tb.cnt", 8), ("tb.\\a[0]", 4), ("tb.q", 8), ("tb.r", 1),
                ("tb.U$0.clk", 1), ("tb.U$0.d", 8), ("tb.U$0.q", 8)]
    assert sorted(wave.list_signals(vcd)) == sorted(expected)
    assert wave.list_signals(fst) == wave.list_signals(vcd)
    table = wave.cycle_table(fst, ["."], signed=True)
    assert table == wave.cycle_table(vcd, ["."], signed=True)
    # Edges at 5, 15, ... 45; cnt is x in cycle 0, then 0xf0, 0xf1, then 0x0f.
    assert [row["time"] for row in table["rows"]] == [5, 15, 25, 35, 45]
    assert [row["values"]["tb.cnt"] for row in table["rows"]] == [-16, -15, 15, 15, 15]
    assert [row["values"]["tb.U$0.q"] for row in table["rows"]] == [None, -16, -15, 15, 15]
    assert [row["values"]["tb.\\a[0]"] for row in table["rows"]] == [0, 1, -1, -1, -1]
    assert [row["values"]["tb.r"] for row in table["rows"]] == [1.5, -2.25, -2.25, -2.25,
                                                                 -2.25]
    for argv in (["--list"], ["--list", "--json"], ["--signal", "q$", "--signal", "a",
                                                    "--hex"],
                 ["--signal", ".", "--json", "--from", "1", "--to", "3"]):
        outputs = [_run(capsys, path, *argv) for path in (vcd, fst)]
        assert outputs[0] == outputs[1] and outputs[0][0] == 0


def _engine_run(sim, path, scope=None):
    """The tiny tensor engine's short ``test_extremes`` (about 130 cycles) on ``sim``, its
    waves to ``path``."""
    result = runner.run(config.preset("tiny"), "opentrn.sim.tb_tensor_engine",
                        "tensor_engine", sim, testcase="test_extremes",
                        env={"OPENTRN_SEED": 11}, vcd=path, scope=scope)
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    assert result.vcd == path
    return result


@pytest.fixture(scope="module")
def engine_vcd(tmp_path_factory):
    """The whole dump of :func:`_engine_run` on Icarus."""
    require_simulator("icarus")
    path = tmp_path_factory.mktemp("engine") / "whole.vcd"
    _engine_run("icarus", path)
    return path


@pytest.mark.sim
def test_icarus_fst_of_a_run_reads_as_its_vcd(engine_vcd, tmp_path, capsys):
    fst = tmp_path / "engine.fst"
    _engine_run("icarus", fst)
    assert fst.read_bytes()[:1] == b"\x00"
    signals = wave.list_signals(engine_vcd)
    assert len(signals) > 1000 and wave.list_signals(fst) == signals
    for patterns in ([r"^[^.]+\.result__(valid|ready)$"], ["scale_a", r"\.clk$"], ["."]):
        assert wave.cycle_table(fst, patterns) == wave.cycle_table(engine_vcd, patterns)
    for argv in (["--signal", "result__", "--hex"], ["--signal", "payload", "--json"],
                 ["--list", "--signal", "deskew_1"]):
        outputs = [_run(capsys, path, *argv) for path in (engine_vcd, fst)]
        assert outputs[0] == outputs[1] and outputs[0][0] == 0


# Scopes: only the matching module instances, and the top level, are dumped.

def _declared(path):
    """``{scope: {variable}}`` of a VCD, read off its text: a scope is its dotted path from
    the root, a variable its name with its range (``q [7:0]``)."""
    declared = {}
    for scope, parts in _vcd_variables(path):
        declared.setdefault(scope, set()).add(" ".join(parts[4:-1]))
    return declared


def _cut(declared, scope):
    """What a dump cut to ``scope`` holds of the whole dump ``declared``: the roots' own
    variables and those of the scopes whose path below the root the regex matches."""
    return {path: names for path, names in declared.items()
            if "." not in path or re.search(scope, path.split(".", 1)[1])}


# A block of the array shared by many instances (its PEs' multipliers, 16 of them), a PE deep
# in the array's shared sub-blocks, and two of the top's own submodules.
SCOPES = [r"multiplier$", r"upper\.lower\.right\.left$", r"deskew_[02]$"]


@pytest.mark.sim
@pytest.mark.parametrize("scope", SCOPES)
def test_icarus_dumps_only_the_matching_scopes(engine_vcd, tmp_path, scope):
    whole = _declared(engine_vcd)
    # The build's scopes are the instances of the whole dump.
    build_dir = runner.build(config.preset("tiny"), "tensor_engine", "icarus")
    assert sorted(runner.scopes(build_dir)) == sorted(
        path.split(".", 1)[1] for path in whole if "." in path)
    cut = tmp_path / "cut.vcd"
    _engine_run("icarus", cut, scope)
    declared = _declared(cut)
    expected = _cut(whole, scope)
    assert declared == expected
    assert 1 < len(expected) < len(whole)
    assert {name for name, _ in wave.list_signals(cut)} < {
        name for name, _ in wave.list_signals(engine_vcd)}
    # The top's ports are in, with the same values as in the whole dump.
    patterns = [r"^tensor_engine\.(clk|result__valid)$"]
    assert wave.cycle_table(cut, patterns) == wave.cycle_table(engine_vcd, patterns)


@pytest.mark.sim
def test_verilator_waves_are_filtered_to_the_matching_scopes(tmp_path):
    require_simulator("verilator")
    scope = "|".join(SCOPES)
    whole, cut = tmp_path / "whole.vcd", tmp_path / "cut.vcd"
    _engine_run("verilator", whole)
    _engine_run("verilator", cut, scope)
    declared = _declared(cut)
    # $rootio (the ports) and the top are the roots; the temporary whole dump is gone.
    assert declared == _cut(_declared(whole), scope)
    assert {"$rootio", "tensor_engine", "tensor_engine.deskew_0"} <= set(declared)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cut.vcd", "whole.vcd"]
    patterns = [r"^tensor_engine\.(clk|result__valid)$", r"deskew_2\."]
    assert wave.cycle_table(cut, patterns) == wave.cycle_table(whole, patterns)
    with pytest.raises(runner.WavesError, match=r"vcd='\S+\.fst': Verilator writes VCD"):
        _engine_run("verilator", tmp_path / "waves.fst")


# A VCD as Verilator writes one: $rootio, then the top; `"` is one net under three scopes.
VERILATOR_VCD = """\
$version Generated by VerilatedVcd $end
$timescale 1ps $end
 $scope module $rootio $end
  $var wire 1 " clk $end
 $upscope $end
 $scope module top $end
  $var wire 1 " clk $end
  $var wire 8 # count [7:0] $end
  $scope module left $end
   $var wire 1 " clk $end
   $var wire 4 $ q [3:0] $end
   $scope module leaf $end
    $var wire 1 % bit $end
   $upscope $end
  $upscope $end
  $scope module right $end
   $scope module leaf $end
    $var wire 2 & pair [1:0] $end
   $upscope $end
  $upscope $end
 $upscope $end
$enddefinitions $end


#0
0"
b00000000 #
b0000 $
0%
b00 &
#5
1"
b00000001 #
1%
#10
0"
b0001 $
b11 &
"""


@pytest.mark.parametrize(("scope", "kept"), [
    # Only the inner leaf of `right`: `right` is opened for it, `left` not at all.
    (r"right\.leaf", {'"', "#", "&"}),
    # `left` itself, not its leaf.
    (r"left$", {'"', "#", "$"}),
    # Scopes are matched below the root: the root's name matches nothing.
    (r"^top", {'"', "#"}),
])
def test_verilator_filter_keeps_the_top_level_and_the_matching_scopes(tmp_path, scope, kept):
    source, target = tmp_path / "whole.vcd", tmp_path / "cut.vcd"
    source.write_text(VERILATOR_VCD)
    runner._filter_vcd(source, target, re.compile(scope))
    head, values = target.read_text().split("$enddefinitions $end\n")
    assert _declared(target) == _cut(_declared(source), scope)
    # Every scope written holds a kept variable, or a scope that does.
    assert ("scope module left" in head) == ("$" in kept)
    assert head.count("$scope") == head.count("$upscope")

    def ident(line):
        return line.split()[-1] if line[0] == "b" else line[1:]

    changes = [line for line in values.splitlines() if line[:1] in ("0", "1", "b")]
    assert {ident(line) for line in changes} == kept
    # The times and blank lines stay; of the value changes, those of kept variables, in order.
    whole = VERILATOR_VCD.split("$enddefinitions $end\n")[1].splitlines()
    assert values.splitlines() == [line for line in whole
                                   if line[:1] in ("", "#") or ident(line) in kept]


@pytest.mark.sim
def test_scope_errors_name_the_field_the_value_and_the_rule(tmp_path):
    require_simulator("icarus")
    waves = tmp_path / "w.vcd"
    with pytest.raises(runner.WavesError,
                       match=r"^scope='deskew\(\[': not a valid regex .* dotted path"):
        _engine_run("icarus", waves, "deskew([")
    with pytest.raises(runner.WavesError) as error:
        _engine_run("icarus", waves, "sequencer")
    message = str(error.value)
    assert message.startswith("scope='sequencer': matches none of the 71 scopes of "
                              "tensor_engine")
    # A few scopes, the shallowest first.
    assert "array, deskew_0, deskew_1" in message and message.endswith(", ...")
    assert not waves.exists()
    with pytest.raises(runner.WavesError, match="^scope='array': .* give vcd="):
        runner.run(config.preset("tiny"), "opentrn.sim.tb_tensor_engine", scope="array")


@pytest.mark.parametrize(("argv", "needles"), [
    (["--waves-scope", "core"], ["--waves-scope='core'", "give --waves FILE"]),
    (["--waves", "{tmp}/w.vcd", "--waves-scope", "core("],
     ["--waves-scope='core('", "not a valid regex", "dotted path"]),
    (["--waves", "{tmp}/w.fst", "--sim", "verilator"],
     ["--waves={tmp}/w.fst", "Verilator writes VCD waves only"]),
])
def test_cli_waves_errors(tmp_path, capsys, argv, needles):
    if "--waves" in argv:
        require_simulator("verilator" if "verilator" in argv else "icarus")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    assert main(["demo", "--preset", "tiny", "--sim", "icarus", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opentrn demo: error: ")
    for needle in needles:
        assert needle.replace("{tmp}", str(tmp_path)) in err
