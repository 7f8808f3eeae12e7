"""Tests for opentrn.sim.gtkw, the GTKWave save files of `opentrn wave FILE --gtkw` and of
`opentrn run/demo --waves`.

The save files are read back by a parser of GTKWave's format written here, and checked
against the dumps themselves: every trace must name one of the dump's variables as GTKWave
names it (the full name and a vector's `[MSB:0]`; checked against GTKWave 3.3 by hand, see
docs/waves.md), and the markers must sit where the dump's text has the start pulse and the
interrupt rise, read off that text by a scanner of its own. The dumps are a real run of a
4x4x4 GEMM on Icarus (a few seconds), a tensor engine's run, and small VCDs written here
in the style of Verilator's and of a board top's dumps.
"""

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
from amaranth import Module, Signal
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from vcd.gtkw import GTKWFlag

from opentrn import config
from opentrn.cli import main
from opentrn.isa import Engine
from opentrn.sim import gtkw, wave

from .conftest import require_simulator

CORE_GROUPS = [group.title for group in gtkw.GROUPS]
HEX, DEC = GTKWFlag.hex.value, GTKWFlag.dec.value
GROUP_BEGIN, GROUP_END, CLOSED = (GTKWFlag.grp_begin.value, GTKWFlag.grp_end.value,
                                  GTKWFlag.closed.value)


# -- a reader of GTKWave save files and of VCD text ---------------------------------------

def _read_save(path):
    """``{"directives": {key: [values]}, "zoom", "primary", "markers": {letter: time},
    "groups": [(title, closed)], "traces": [{"alias", "flags", "group", "names",
    "bits"}]}``; ``names`` the GTKWave names a trace reads (one, or a vector's parent),
    ``bits`` the parent's bit indices of a vector of bits."""
    save = {"directives": {}, "groups": [], "traces": [], "markers": {}}
    flags, group = 0, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("[*]"):
            continue
        if line.startswith("["):
            key, _, value = line[1:].partition("] ")
            save["directives"].setdefault(key.rstrip("]"), []).append(value)
        elif line.startswith("*"):
            zoom, primary, *letters = line[1:].split()
            save["zoom"], save["primary"] = float(zoom), int(primary)
            save["markers"] = {chr(ord("a") + i): int(t) for i, t in enumerate(letters)
                               if int(t) != -1}
        elif line.startswith("@"):
            flags = int(line[1:], 16)
        elif line.startswith("-"):
            if flags & GROUP_BEGIN:
                group = line[1:]
                save["groups"].append((group, bool(flags & CLOSED)))
            elif flags & GROUP_END:
                assert line[1:] == group, f"group {group!r} ends as {line[1:]!r}"
                group = None
        else:
            alias = None
            if line.startswith("+{"):
                alias, _, line = line[2:].partition("} ")
            if line.startswith("#{"):
                _, _, bits = line[2:].partition("} ")
                pairs = [re.fullmatch(r"\((\d+)\)(.+)", part).groups() for part in bits.split()]
                names = {name for _, name in pairs}
                trace_bits = [int(index) for index, _ in pairs]
            else:
                names, trace_bits = {line}, None
            save["traces"].append({"alias": alias, "flags": flags, "group": group,
                                   "names": names, "bits": trace_bits})
    assert group is None, f"group {group!r} is not closed"
    return save


def _gtkwave_names(path):
    """``{GTKWave's name: width}`` of the dump's variables."""
    return {name + (f"[{width - 1}:0]" if width > 1 else ""): width
            for name, width in wave.list_signals(path)}


def _check_traces_exist(save, path):
    names = _gtkwave_names(path)
    assert save["traces"]
    for trace in save["traces"]:
        for name in trace["names"]:
            assert name in names, f"{name} is not a variable of {path}"
        if trace["bits"] is not None:
            (name,) = trace["names"]
            assert all(0 <= bit < names[name] for bit in trace["bits"]), trace


def _first_rise(path, scope, name, after=0):
    """The time of the first change of ``scope.name`` (a 1-bit VCD variable) to 1 at or
    after ``after``, read off the VCD's text."""
    scopes, ident, time = [], None, 0
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "$scope":
                scopes.append(parts[2])
            elif parts[0] == "$upscope":
                scopes.pop()
            elif parts[0] == "$var" and ".".join(scopes) == scope and parts[4] == name:
                ident = parts[3]
            elif parts[0].startswith("#"):
                time = int(parts[0][1:])
            elif ident is not None and parts[0] == "1" + ident and time >= after:
                return time
    raise AssertionError(f"{scope}.{name} never rises in {path}")


def _shown_span(save, wave_pixels):
    """The time units GTKWave shows across ``wave_pixels`` at the save file's zoom (a frame
    of 200 pixels spans 2 ** -zoom units)."""
    return 2 ** -save["zoom"] * wave_pixels / 200


# -- a real run of the core on Icarus -------------------------------------------------------

@pytest.fixture(scope="module", params=["icarus", "verilator"])
def core_run(request, tmp_path_factory):
    """A 4x4x4 GEMM on the tiny core (about 180 cycles), waves to a VCD: its path, `opentrn
    run --json`'s report and the simulator. (The Verilator build with waves is the one the
    CLI's demo test makes.)"""
    sim = request.param
    require_simulator(sim)
    path = tmp_path_factory.mktemp(f"gtkw-{sim}") / "gemm.vcd"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", "gemm", "--m", "4", "--k", "4", "--n", "4", "--sim", sim,
                     "--waves", str(path), "--json"]) == 0
    return path, json.loads(out.getvalue()), sim


@pytest.mark.sim
def test_a_run_writes_its_save_file_beside_its_waves(core_run):
    path, report, sim = core_run
    assert report["vcd"] == str(path)
    assert report["gtkw"] == str(path.with_suffix(".gtkw")) and report["gtkw_error"] is None
    save = _read_save(report["gtkw"])
    assert save["directives"]["dumpfile"] == [f'"{path.resolve()}"']
    # Icarus escapes Yosys's `$auto...` names; Verilator's stop GTKWave's VCD reader.
    assert ("optimize_vcd" in save["directives"]) == (sim == "verilator")


@pytest.mark.sim
def test_every_trace_names_a_variable_of_the_waves(core_run):
    path, report, _ = core_run
    save = _read_save(report["gtkw"])
    _check_traces_exist(save, path)
    names = [name for trace in save["traces"] for name in trace["names"]]
    assert len(names) == len(set(names)), "a signal is traced twice"


@pytest.mark.sim
def test_the_groups_are_the_engines_in_order(core_run):
    _, report, _ = core_run
    save = _read_save(report["gtkw"])
    assert [title for title, _ in save["groups"]] == CORE_GROUPS
    closed = {title for title, is_closed in save["groups"] if is_closed}
    assert closed == {"SBUF ports", "PSUM ports"}
    by_group = {}
    for trace in save["traces"]:
        by_group.setdefault(trace["group"], []).append(trace["alias"].split(" ")[0])
    assert by_group["DMA sequencer"][:2] == ["pc", "fsm_state"]
    assert by_group["Semaphores"] == [f"values[{i}]" for i in range(config.preset("tiny")
                                                                     .semaphores)]
    assert {"moving__payload.swap", "load_bank", "moving__valid", "moving__ready"} <= set(
        by_group["Tensor engine"])
    assert {f"axi__{channel}{end}" for channel in ("ar", "r", "aw", "w", "b")
            for end in ("valid", "ready")} | {"axi__rlast", "axi__wlast"} <= set(
        by_group["DMA engine"])
    assert by_group["Host"][-1] == "irq"


@pytest.mark.sim
def test_radix_hex_for_buses_and_decimal_for_counts(core_run):
    _, report, _ = core_run
    save = _read_save(report["gtkw"])
    flags = {(trace["group"], trace["alias"].split(" ")[0]): trace["flags"]
             for trace in save["traces"]}
    for key in [("Tensor sequencer", "pc"), ("DMA engine", "axi__araddr"),
                ("DMA engine", "axi__awaddr")]:
        assert flags[key] & HEX and not flags[key] & DEC, key
    for key in [("Semaphores", "values[0]"), ("DMA sequencer", "fsm_state"),
                ("DMA engine", "completed"), ("Host", "error_code")]:
        assert flags[key] & DEC and not flags[key] & HEX, key


@pytest.mark.sim
def test_pc_shows_the_hbm_address_bits(core_run):
    _, report, _ = core_run
    save = _read_save(report["gtkw"])
    (pc,) = [trace for trace in save["traces"]
             if trace["group"] == "DMA sequencer" and trace["alias"] == "pc"]
    hbm_bits = config.preset("tiny").hbm_addr_bits
    # The parent's bit indices count from its MSB: the low hbm_bits bits of 64.
    assert pc["names"] == {"core_with_memory.core.dma_sequencer.pc[63:0]"}
    assert pc["bits"] == list(range(64 - hbm_bits, 64))


@pytest.mark.sim
def test_markers_at_the_start_pulse_and_the_interrupt(core_run, capsys):
    path, report, _ = core_run
    save = _read_save(report["gtkw"])
    start = _first_rise(path, "core_with_memory.core.dma_sequencer", "start")
    irq = _first_rise(path, "core_with_memory.core.registers", "irq", after=start)
    assert save["markers"] == {"a": start, "b": irq}
    assert save["primary"] == irq
    assert save["directives"]["markername"] == ["Astart", "Birq"]
    # The cycle counter runs from the cycle after the start pulse to the done pulse; the
    # interrupt rises the cycle after that.
    assert main(["wave", str(path), "--gtkw", str(path.with_name("again.gtkw")),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    marks = {marker["name"]: marker for marker in printed["markers"]}
    assert marks["B irq"]["cycle"] - marks["A start"]["cycle"] == report["cycles"] + 1
    assert (marks["A start"]["time"], marks["B irq"]["time"]) == (start, irq)
    # The view opens on the run: from before the start to after the interrupt.
    timestart = int(save["directives"]["timestart"][0])
    size_x = int(save["directives"]["size"][0].split()[0])
    signals = int(save["directives"]["signals_width"][0])
    assert timestart <= start
    assert timestart + _shown_span(save, size_x - signals - 100) >= irq
    assert timestart + _shown_span(save, size_x - signals) < 2 * irq


@pytest.mark.sim
@pytest.mark.parametrize("core_run", ["icarus"], indirect=True)     # Icarus writes FST
def test_an_fst_of_the_run_gets_the_same_save_file(core_run, tmp_path, capsys):
    path, report, _ = core_run
    fst = tmp_path / "gemm.fst"
    assert main(["run", "gemm", "--m", "4", "--k", "4", "--n", "4", "--sim", "icarus",
                 "--waves", str(fst)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^GTKWave\s+{re.escape(str(tmp_path / 'gemm.gtkw'))}$", out, re.M)
    from_vcd, from_fst = _read_save(report["gtkw"]), _read_save(tmp_path / "gemm.gtkw")
    assert from_fst["directives"]["dumpfile"] == [f'"{fst.resolve()}"']
    assert from_fst["traces"] == from_vcd["traces"]
    assert from_fst["markers"] == from_vcd["markers"]


# -- the FSM state names the aliases give -------------------------------------------------

def _fsm_decoding(elaboratable, name):
    """``{value: state name}`` of the FSM state signal ``name`` that Amaranth builds."""
    fragment = Fragment.get(elaboratable, None)
    for statements in fragment.statements.values():
        for statement in statements:
            for signal in statement._lhs_signals():
                if signal.name == name:
                    return {value: signal.decoder(value).split("/")[0]
                            for value in range(1 << len(signal))}
    raise AssertionError(f"no signal {name}")


def test_fsm_state_names_are_the_hdls():
    from opentrn.hdl.activation_unit import ActivationUnit
    from opentrn.hdl.dma import DMA
    from opentrn.hdl.sequencer import Sequencer
    tiny = config.preset("tiny")
    for engine in Engine:
        assert _fsm_decoding(Sequencer(config=tiny, engine=engine), "fsm_state") == \
            gtkw.SEQUENCER_STATES
    assert _fsm_decoding(DMA(config=tiny), "fsm_state") == gtkw.DMA_STATES
    assert _fsm_decoding(ActivationUnit(config=tiny), "state_state") == \
        gtkw.ACTIVATION_STATES


# -- small dumps in the style of other tops and simulators --------------------------------

def _write_vcd(path, variables, clocks, pulses, *, timescale="1ps", end):
    """A VCD of ``variables`` (``(scope path, name with range, width)``), each clock in
    ``clocks`` (``{variable index: half period}``) toggling from 0 at time 0, and
    ``pulses`` (``{variable index: [(time, value)]}``); the rest 0 throughout."""
    ident = [f"v{i}" for i in range(len(variables))]
    lines = [f"$timescale {timescale} $end"]
    open_scopes = []
    for i, (scope, name, width) in enumerate(variables):
        parts = scope.split(".")
        common = 0
        while (common < min(len(parts), len(open_scopes))
               and parts[common] == open_scopes[common]):
            common += 1
        for _ in open_scopes[common:]:
            lines.append("$upscope $end")
        lines += [f"$scope module {part} $end" for part in parts[common:]]
        open_scopes = parts
        lines.append(f"$var wire {width} {ident[i]} {name} $end")
    lines += ["$upscope $end"] * len(open_scopes) + ["$enddefinitions $end"]
    events = {0: [(i, 0) for i in range(len(variables))]}
    for i, half in clocks.items():
        for k, t in enumerate(range(half, end, half)):
            events.setdefault(t, []).append((i, (k + 1) % 2))
    for i, changes in pulses.items():
        for t, value in changes:
            events.setdefault(t, []).append((i, value))
    for t in sorted(events):
        lines.append(f"#{t}")
        for i, value in events[t]:
            width = variables[i][2]
            lines.append(f"{value}{ident[i]}" if width == 1 else f"b{value:b} {ident[i]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _core_variables(root, *, escape, semaphores_scope):
    """The variables a core's dump holds under ``root`` for the groups of the DMA sequencer,
    the semaphores, the tensor engine and the host (names as Verilator writes them, or as
    Icarus does with ``escape``)."""
    esc = "\\" if escape else ""
    sequencer = f"{root}.dma_sequencer"
    engine = f"{root}.tensor_unit.engine"
    registers = f"{root}.registers"
    return [
        (sequencer, "clk", 1), (sequencer, "start", 1), (sequencer, "pc [63:0]", 64),
        (sequencer, f"{esc}pc$25 [63:0]", 64), (sequencer, "fetch__araddr [23:0]", 24),
        (sequencer, "fsm_state [1:0]", 2), (sequencer, "waiting", 1),
        *[(f"{root}.{semaphores_scope}", f"{esc}values[{i}] [31:0]", 32) for i in range(3)],
        (f"{root}.{semaphores_scope}", "values [95:0]", 96),
        (engine, "moving__valid", 1), (engine, "moving__ready", 1),
        (f"{engine}.{esc}moving__payload", "swap", 1), (engine, "load_bank", 1),
        (registers, "clk", 1), (registers, "start", 1), (registers, "busy", 1),
        (registers, "irq", 1),
    ]


def _index(variables, scope, name):
    return next(i for i, (s, n, _) in enumerate(variables) if (s, n) == (scope, name))


def test_verilator_style_dump(tmp_path, capsys):
    root = "core_with_memory.core"
    variables = [("$rootio", "clk", 1), ("$rootio", "irq", 1),
                 (root, "$auto$verilog_backend.cc:2355:dump_module$1", 1),
                 *_core_variables(root, escape=False, semaphores_scope="semaphores$394")]
    clocks = {_index(variables, "$rootio", "clk"): 5,
              _index(variables, f"{root}.dma_sequencer", "clk"): 5,
              _index(variables, f"{root}.registers", "clk"): 5}
    start = _index(variables, f"{root}.dma_sequencer", "start")
    irq = _index(variables, f"{root}.registers", "irq")
    # Rising edges at 5, 15, 25...: a start pulse in cycle 3, the interrupt from cycle 12.
    path = _write_vcd(tmp_path / "verilator.vcd", variables, clocks,
                      {start: [(35, 1), (45, 0)], irq: [(125, 1)]}, end=200)
    assert main(["wave", str(path), "--gtkw"]) == 0
    out = capsys.readouterr().out
    assert "Semaphores (3)" in out and "traces     " in out
    save = _read_save(tmp_path / "verilator.gtkw")
    _check_traces_exist(save, path)
    assert [title for title, _ in save["groups"]] == [
        "DMA sequencer", "Semaphores", "Tensor engine", "Host"]
    assert save["markers"] == {"a": 35, "b": 125}
    # GTKWave's VCD reader stops at the `$auto...` name: it must convert the VCD first.
    assert "optimize_vcd" in save["directives"]
    assert "converts the VCD to FST" in out
    aliases = {trace["alias"] for trace in save["traces"]}
    assert "moving__payload.swap" in aliases and "pc$25" not in aliases


def test_board_top_style_dump_uses_the_cores_clock_and_timescale(tmp_path):
    root = "board_top.core"
    variables = [("board_top", "clk", 1),
                 *_core_variables(root, escape=True, semaphores_scope="semaphores$12")]
    # The board's clock is faster than the core's (edges every 3 units against 10).
    clocks = {0: 3, _index(variables, f"{root}.dma_sequencer", "clk"): 10,
              _index(variables, f"{root}.registers", "clk"): 10}
    start = _index(variables, f"{root}.dma_sequencer", "start")
    irq = _index(variables, f"{root}.registers", "irq")
    # Core edges at 10, 30, 50...: start in core cycle 2, the interrupt from cycle 7.
    path = _write_vcd(tmp_path / "board.vcd", variables, clocks,
                      {start: [(50, 1), (70, 0)], irq: [(150, 1)]},
                      timescale="10 ps", end=400)
    save_plan, out = gtkw.make(path)
    assert [(m.label, m.cycle, m.time) for m in save_plan.markers] == [
        ("start", 2, 50), ("irq", 7, 150)]
    save = _read_save(out)
    _check_traces_exist(save, path)
    # GTKWave counts a `10 ps` dump's times in ps.
    assert save["markers"] == {"a": 500, "b": 1500}
    timestart = int(save["directives"]["timestart"][0])
    assert timestart % 10 == 0 and 500 - 10 * 40 <= timestart < 500     # a cycle or two
    assert "optimize_vcd" not in save["directives"]
    semaphores = [trace for trace in save["traces"] if trace["group"] == "Semaphores"]
    assert [trace["names"] for trace in semaphores] == [
        {f"board_top.core.semaphores$12.\\values[{i}][31:0]"} for i in range(3)]


@pytest.mark.sim
def test_a_unit_top_gets_the_groups_it_holds(tmp_path):
    """A tensor engine's own dump: its group only, no markers, the whole dump in view."""
    from .test_wave import _engine_run
    require_simulator("icarus")
    path = tmp_path / "engine.vcd"
    _engine_run("icarus", path)
    save_plan, out = gtkw.make(path)
    assert [group.title for group in save_plan.groups] == ["Tensor engine"]
    assert save_plan.groups[0].scope == "tensor_engine"
    assert save_plan.markers == ()
    save = _read_save(out)
    _check_traces_exist(save, path)
    table = wave.cycle_table(path, [r"^tensor_engine\.clk$"])
    first, last = table["rows"][0]["time"], table["rows"][-1]["time"]
    begin, end = save_plan.window
    assert begin <= first and end >= last


# -- refusals -----------------------------------------------------------------------------

@pytest.fixture
def foreign_vcd(tmp_path):
    """An Amaranth simulation's VCD of a counter: none of the core's signals."""
    m = Module()
    count = Signal(8)
    m.d.sync += count.eq(count + 1)
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def bench(ctx):
        for _ in range(4):
            await ctx.tick()

    sim.add_testbench(bench)
    path = tmp_path / "counter.vcd"
    with sim.write_vcd(str(path)):
        sim.run()
    return path


def test_a_dump_without_the_cores_signals_is_refused(foreign_vcd, capsys):
    assert main(["wave", str(foreign_vcd), "--gtkw"]) == 2
    err = capsys.readouterr().err
    assert str(foreign_vcd) in err and "none of the core's signals" in err
    assert "--list" in err
    assert not foreign_vcd.with_suffix(".gtkw").exists()
    with pytest.raises(gtkw.GtkwError, match="none of the core's signals"):
        gtkw.plan(foreign_vcd)


@pytest.mark.parametrize("argv, needles", [
    (["{missing}", "--gtkw"], ["{missing}", "No such file"]),
    (["{vcd}", "--gtkw", "{tmp}"], ["{tmp}", "is a directory"]),
    (["{vcd}", "--gtkw", "{vcd}"], ["{vcd}", "is the waves file itself"]),
    (["{vcd}", "--gtkw", "--list"], ["--gtkw", "--list"]),
    (["{vcd}", "--signal", "clk", "--gtkw"], ["--gtkw", "--signal"]),
])
def test_bad_input_is_refused_naming_it(tmp_path, capsys, argv, needles):
    vcd = tmp_path / "w.vcd"
    vcd.write_text("$timescale 1ps $end\n$scope module t $end\n$var wire 1 ! clk $end\n"
                   "$upscope $end\n$enddefinitions $end\n#0\n0!\n#5\n1!\n")
    names = {"missing": tmp_path / "missing.vcd", "vcd": vcd, "tmp": tmp_path}
    assert main(["wave", *(arg.format(**names) for arg in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opentrn wave: error: ")
    for needle in needles:
        assert needle.format(**names) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.vcd"]     # nothing written


def test_the_save_file_goes_to_a_folder_made_for_it(tmp_path):
    variables = _core_variables("top.core", escape=False, semaphores_scope="semaphores")
    path = _write_vcd(tmp_path / "w.vcd", variables, {}, {}, end=10)
    out = tmp_path / "new" / "folder" / "w.gtkw"
    save_plan, written = gtkw.make(path, out)
    assert written == out and out.is_file()
    # No clock edges: no cycles, so no markers, and the save file is written all the same.
    assert save_plan.markers == () and save_plan.window is None
    assert math.isclose(_read_save(out)["zoom"], 0.0)
