"""GTKWave save files for this project's waves: ``opentrn wave FILE --gtkw`` and the
``.gtkw`` that ``opentrn demo`` and ``opentrn run`` write beside their ``--waves``.

A dump of the core holds some 15,000 signals and GTKWave opens it on an empty wave pane.
The save file opens it on the few signals that explain a run instead, one group per engine
(:data:`GROUPS`): each sequencer's program counter, state and waits, the semaphores, the
tensor engine's streams and weight bank swaps, the DMA engine's state and AXI4 handshakes,
the SBUF and PSUM port grants, the host's start, done and interrupt. Buses show in hex,
counters, states and semaphore values in decimal. Named markers stand at the core's start
(``A``, the cycle its start pulse reaches the sequencers) and at the interrupt's rising edge
(``B``, also the primary marker, so that the signal pane shows the values the run ended
with); the view spans the run between them.

Signals are found by the scopes that hold them, not by the top: a group is looked for in
the scopes whose path ends with one of its scope paths (``memory.dma``, or ``dma`` for a
DMA alone), a name's escaping (Icarus's ``\\moving__payload``) and Yosys's ``$N`` suffix on
an instance (``semaphores$394``) aside. So the save file works for Icarus's, Verilator's
and Amaranth's dumps, VCD or FST, of ``core``, ``core_with_memory`` or ``board_top``, and
for unit tops (``dma``, ``tensor_engine``...) with the groups they hold; groups with no
signal in the dump are left out, and a dump with none of them is refused.

Traces are named as GTKWave names them: the full dotted name as :mod:`opentrn.sim.wave`
lists it, and a vector's ``[MSB:0]`` (GTKWave appends it whether or not the dump declares a
range; the design's vectors all count down to bit 0).

GTKWave's own VCD reader (3.3) stops at a variable whose name starts with ``$``: Verilator
writes Yosys's ``$auto$verilog_backend...`` flags unescaped. For such a dump the save file
asks GTKWave to convert the VCD to FST first (``[optimize_vcd]``, as ``gtkwave -o``), which
reads it; GTKWave then writes ``FILE.vcd.fst`` beside it.
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from vcd.gtkw import GTKWSave

from .wave import WaveError, cycle_table, list_signals

__all__ = ["GROUPS", "SEQUENCER_STATES", "DMA_STATES", "ACTIVATION_STATES", "GtkwError",
           "Trace", "Group", "Marker", "SavePlan", "default_path", "plan", "write",
           "make", "run", "summary", "report"]


class GtkwError(WaveError):
    """A save file that cannot be made: the dump holds none of the signals, or the output
    cannot be written."""


#: FSM encodings, as Amaranth numbers states (in the order the code first names them); the
#: tests check them against the HDL.
SEQUENCER_STATES = {0: "IDLE", 1: "FAULT", 2: "FETCH", 3: "READY"}
DMA_STATES = {0: "IDLE", 1: "CHECK", 2: "FINISH", 3: "RUN"}
ACTIVATION_STATES = {0: "IDLE", 1: "BIAS", 2: "STREAM", 3: "BIAS_RESPONSE"}


def _states(encoding):
    return " ".join(f"{value}={name}" for value, name in encoding.items())


@dataclass(frozen=True)
class _Spec:
    """A trace to look for: ``path`` below the group's scope (escaping aside), or a regex
    of such paths (all matches, in index order) when ``pattern``. With ``bits_of``, only
    as many low bits show as the sibling of that path has (a 64-bit pointer into a
    16 MiB HBM as 6 hex digits, not 16)."""
    path: str
    radix: str = "hex"
    note: str = ""
    pattern: bool = False
    bits_of: str = ""


@dataclass(frozen=True)
class _GroupSpec:
    title: str
    scopes: tuple[tuple[str, ...], ...]      # scope paths, the core's first
    traces: tuple[_Spec, ...]
    closed: bool = False


def _sequencer(title, name):
    return _GroupSpec(title, ((name,),), (
        _Spec("pc", bits_of="fetch__araddr"),
        _Spec("fsm_state", "dec", _states(SEQUENCER_STATES)),
        _Spec("instruction__valid"), _Spec("instruction__ready"),
        _Spec("waiting"), _Spec("pending"), _Spec("error"),
    ))


def _handshakes(*ports):
    return tuple(_Spec(f"{port}__{end}") for port in ports for end in ("valid", "ready"))


#: The groups, in the order the save file shows them.
GROUPS = (
    _sequencer("DMA sequencer", "dma_sequencer"),
    _sequencer("Tensor sequencer", "tensor_sequencer"),
    _sequencer("Activation sequencer", "activation_sequencer"),
    _GroupSpec("Semaphores", (("semaphores",),), (
        _Spec(r"values\[(\d+)\]", "dec", pattern=True),)),
    _GroupSpec("Tensor engine", (("tensor_unit", "engine"), ("tensor_engine",)), (
        *_handshakes("stationary", "moving"),
        # The swap (a matmul's first vector switches to the tile loaded last), the bank
        # loads write (it flips at a swap), a loaded tile waiting for its swap.
        _Spec("moving__payload.swap"), _Spec("load_bank"), _Spec("pending"),
        *_handshakes("result"),
    )),
    _GroupSpec("Activation engine", (("activation_unit",),), (
        _Spec("state_state", "dec", _states(ACTIVATION_STATES)),
        *_handshakes("input", "output"),
    )),
    _GroupSpec("DMA engine", (("memory", "dma"), ("dma",)), (
        _Spec("fsm_state", "dec", _states(DMA_STATES)),
        _Spec("busy"), _Spec("done"), _Spec("error"), _Spec("completed", "dec"),
        _Spec("axi__araddr"), _Spec("axi__arvalid"), _Spec("axi__arready"),
        _Spec("axi__rvalid"), _Spec("axi__rready"), _Spec("axi__rlast"),
        _Spec("axi__awaddr"), _Spec("axi__awvalid"), _Spec("axi__awready"),
        _Spec("axi__wvalid"), _Spec("axi__wready"), _Spec("axi__wlast"),
        _Spec("axi__bvalid"), _Spec("axi__bready"),
    )),
    # A request's ready is high exactly in the cycle its port is granted.
    _GroupSpec("SBUF ports", (("memory", "sbuf"), ("sbuf",)), (
        *_handshakes("te_read__request", "act_read__request", "dma_read__request",
                     "act_write", "dma_write"),
    ), closed=True),
    _GroupSpec("PSUM ports", (("memory", "psum"), ("psum",)), (
        *_handshakes("te_write", "act_read__request", "dma_read__request", "dma_write"),
    ), closed=True),
    _GroupSpec("Host", (("registers",),), (
        _Spec("start"), _Spec("busy"), _Spec("done"), _Spec("error"),
        _Spec("error_code", "dec"), _Spec("irq"),
    )),
)

#: Where the markers' signals are, in order of preference: the core's start pulse as each
#: sequencer receives it (the host's request, ``registers.start``, is the same pulse when
#: the core is idle), and the interrupt.
_START = ((("dma_sequencer",), "start"), (("tensor_sequencer",), "start"),
          (("activation_sequencer",), "start"), (("registers",), "start"))
_IRQ = ((("registers",), "irq"), ((), "irq"))    # or the top's port, in a dump cut to scopes

#: The window GTKWave opens on, and the share of the run left as margin on either side.
_SIZE = (1600, 1000)
_MARGIN = 0.02


@dataclass(frozen=True)
class Trace:
    signal: str      # the dump's name, as opentrn.sim.wave lists it
    name: str        # as GTKWave names it: the dump's name and a vector's [MSB:0]
    alias: str       # shown instead: the path below the group's scope, and a note
    radix: str       # hex or dec
    width: int       # of the signal
    shown: int       # its low bits that show: ``width``, or fewer (``_Spec.bits_of``)

    def line(self) -> str:
        """The trace in the save file, after its alias: the name, or a vector of the low
        bits (GTKWave's ``#{name} (index)parent...``, index 0 the parent's MSB)."""
        if self.shown == self.width:
            return self.name
        low = f"{self.signal}[{self.shown - 1}:0]"
        bits = " ".join(f"({index}){self.name}"
                        for index in range(self.width - self.shown, self.width))
        return f"#{{{low}}} {bits}"


@dataclass(frozen=True)
class Group:
    title: str
    scope: str       # the dump's scope the traces are in
    traces: tuple[Trace, ...]
    closed: bool


@dataclass(frozen=True)
class Marker:
    letter: str      # GTKWave's named marker
    label: str
    signal: str      # the dump's name of the signal it marks
    cycle: int
    time: int        # in the dump's time units


@dataclass(frozen=True)
class SavePlan:
    wave: Path
    groups: tuple[Group, ...]
    markers: tuple[Marker, ...]
    window: tuple[int, int] | None     # dump times the view spans
    time_factor: int                   # GTKWave's time = the dump's time * this
    optimize: bool                     # GTKWave must convert the VCD to FST to read it

    @property
    def traces(self):
        return [trace for group in self.groups for trace in group.traces]


def default_path(wave) -> Path:
    """The save file beside ``wave``: its name with ``.gtkw`` for its suffix."""
    return Path(wave).with_suffix(".gtkw")


# -- finding the signals ------------------------------------------------------------------

def _component(actual: str, wanted: str, *, instance: bool) -> bool:
    """Whether a dump's name component is ``wanted``: Icarus escapes some (``\\name``), and
    Yosys suffixes some instances with ``$N`` (``instance``)."""
    if actual.startswith("\\"):
        actual = actual[1:]
    if actual == wanted:
        return True
    return instance and re.fullmatch(re.escape(wanted) + r"\$\d+", actual) is not None


def _unescaped(path: str) -> str:
    return ".".join(part[1:] if part.startswith("\\") else part for part in path.split("."))


class _Index:
    """The dump's names, by scope."""

    def __init__(self, signals):
        self.widths = dict(signals)
        self.scopes = {}
        for name in self.widths:
            parts = name.split(".")
            for depth in range(1, len(parts)):
                self.scopes.setdefault(tuple(parts[:depth]), None)

    def scopes_ending(self, path):
        n = len(path)
        if n == 0:
            return list(self.scopes)
        return [scope for scope in self.scopes if len(scope) >= n and all(
            _component(actual, wanted, instance=True)
            for actual, wanted in zip(scope[-n:], path, strict=True))]

    def below(self, scope):
        """``{unescaped path below scope: the dump's name}``, the first name of a path."""
        prefix = ".".join(scope) + "."
        found = {}
        for name in self.widths:
            if name.startswith(prefix):
                found.setdefault(_unescaped(name[len(prefix):]), name)
        return found


def _gtkwave_name(name: str, width: int) -> str:
    # A name that kept its range (two variables differ only by it) is GTKWave's already.
    if width > 1 and not re.search(r"\[\d+:\d+\]$", name):
        return f"{name}[{width - 1}:0]"
    return name


def _traces(index, spec, below):
    out = []
    for path_spec in spec.traces:
        if path_spec.pattern:
            rx = re.compile(path_spec.path)
            hits = [(path, m) for path in below if (m := rx.fullmatch(path))]
            hits.sort(key=lambda hit: tuple(int(g) for g in hit[1].groups()))
            paths = [path for path, _ in hits]
        else:
            paths = [path_spec.path] if path_spec.path in below else []
        for path in paths:
            name = below[path]
            width = shown = index.widths[name]
            if path_spec.bits_of and path_spec.bits_of in below:
                shown = min(width, index.widths[below[path_spec.bits_of]])
            alias = f"{path} ({path_spec.note})" if path_spec.note else path
            out.append(Trace(name, _gtkwave_name(name, width), alias, path_spec.radix, width,
                             shown))
    return out


def _find_group(index, spec):
    """The group's traces in the scope that holds most of them (the outermost of equals)."""
    best = None
    for path in spec.scopes:
        for scope in index.scopes_ending(path):
            traces = _traces(index, spec, index.below(scope))
            key = (len(traces), -len(scope))
            if traces and (best is None or key > best[0]):
                best = (key, scope, traces)
        if best is not None:
            break               # the core's scope path wins over a unit top's
    if best is None:
        return None
    _, scope, traces = best
    return Group(spec.title, ".".join(scope), tuple(traces), spec.closed)


def _find_signal(index, candidates):
    for path, leaf in candidates:
        for scope in sorted(index.scopes_ending(path), key=len):
            prefix = ".".join(scope) + "."
            for name in (prefix + leaf, prefix + "\\" + leaf):
                if index.widths.get(name) == 1:
                    return name
    return None


# -- the wave's times -----------------------------------------------------------------------

def _time_factor(path) -> int:
    """GTKWave scales a VCD's times by its timescale's number (``$timescale 10ps``: 10);
    an FST's times are GTKWave's already."""
    if str(path).lower().endswith(".fst"):
        return 1
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)
    except OSError:
        return 1
    m = re.search(r"\$timescale\s+(\d+)\s*[a-z]*\s*\$end", head)
    return int(m.group(1)) if m else 1


def _rising(rows, name, after=0):
    """The first row from cycle ``after`` on in which ``name`` is 1 and was not before."""
    previous = None
    for row in rows:
        value = row["values"][name]
        if row["cycle"] >= after and value == 1 and previous != 1:
            return row
        previous = value
    return None


def _markers_and_window(path, index):
    start = _find_signal(index, _START)
    irq = _find_signal(index, _IRQ)
    wanted = [name for name in (start, irq) if name is not None]
    # The clock of the core's scope: a board top has a clock of its own.
    clock = None
    if wanted:
        sibling = wanted[0].rsplit(".", 1)[0] + ".clk"
        if sibling in index.widths:
            clock = "^" + re.escape(sibling) + "$"
    patterns = ["^" + re.escape(name) + "$" for name in wanted] or [
        "^" + re.escape(next(iter(index.widths))) + "$"]
    try:
        rows = cycle_table(path, patterns, clock=clock)["rows"]
    except WaveError as exc:
        if str(exc).startswith("--clock"):     # no clock, or no edge: no cycles to mark
            return (), None
        raise
    first, last = rows[0]["time"], rows[-1]["time"]
    period = rows[1]["time"] - rows[0]["time"] if len(rows) > 1 else 1
    markers = []
    begin, end = first, last + period
    started = None
    if start is not None and (row := _rising(rows, start)) is not None:
        started = row
        markers.append(Marker("A", "start", start, row["cycle"], row["time"]))
        begin = row["time"]
    if irq is not None:
        row = _rising(rows, irq, after=started["cycle"] if started else 0)
        if row is not None:
            markers.append(Marker("B", "irq", irq, row["cycle"], row["time"]))
            end = row["time"]
    margin = max(period, round((end - begin) * _MARGIN))
    return tuple(markers), (max(first, begin - margin), min(last + period, end + margin))


# -- the save file ------------------------------------------------------------------------

def plan(path) -> SavePlan:
    """What the save file of the dump ``path`` shows. Raises :class:`GtkwError` when the
    dump holds none of the groups' signals, :class:`~opentrn.sim.wave.WaveError` when it
    cannot be read."""
    path = Path(path)
    index = _Index(list_signals(path))
    groups = tuple(group for spec in GROUPS if (group := _find_group(index, spec)))
    if not groups:
        titles = ", ".join(spec.title for spec in GROUPS)
        raise GtkwError(f"file {str(path)!r}: holds none of the core's signals that a save "
                        f"file shows ({titles}); its signals are in `opentrn wave "
                        f"{path} --list`")
    markers, window = _markers_and_window(path, index)
    # A top scope may be named `$rootio` (Verilator's), which GTKWave reads; a variable
    # or an instance below it never is, except for those `$` names.
    optimize = not str(path).lower().endswith(".fst") and any(
        part.startswith("$") for name in index.widths for part in name.split(".")[1:])
    return SavePlan(path, groups, markers, window, _time_factor(path), optimize)


def _zoom(span, pixels):
    """GTKWave's zoom that shows ``span`` time units in ``pixels``: a frame of 200 pixels
    spans ``2 ** -zoom`` units (GTKWave's default zoom base)."""
    return -math.log2(max(span, 1) * 200 / pixels)


def write(save: SavePlan, out) -> Path:
    """Write the save file of ``save`` to ``out``; returns its path."""
    out = Path(out)
    if out.is_dir():
        raise GtkwError(f"file {str(out)!r}: is a directory, not a save file")
    # The signal pane shows the aliases right-aligned, then `=` and each value at the
    # primary marker (a hex value with all its digits, a decimal one seldom more than 8), in
    # GTKWave's default font of about 8.5 pixels a character.
    chars = max(len(trace.alias) for trace in save.traces) + 1 + max(
        [8] + [(trace.shown + 3) // 4 for trace in save.traces if trace.radix == "hex"])
    signals_width = min(_SIZE[0] // 2, 40 + round(8.5 * chars))
    factor = save.time_factor
    try:
        f = open(out, "w", encoding="utf-8")
    except OSError as exc:
        raise GtkwError(f"file {str(out)!r}: cannot write the save file: "
                        f"{exc.strerror or exc}") from None
    with f:
        gtkw = GTKWSave(f)
        gtkw.comment(f"opentrn: the signals that explain a run of {save.wave.name}",
                     "A: the core's start, B: the interrupt's rising edge")
        gtkw.dumpfile(str(save.wave))
        if save.optimize:
            # GTKWave's VCD reader refuses names starting with `$` (Verilator's
            # `$auto$verilog_backend...`): it reads the dump once converted to FST.
            f.write("[optimize_vcd]\n")
        gtkw.savefile(str(out))
        gtkw.size(*_SIZE)
        gtkw.signals_width(signals_width)
        gtkw.sst_expanded(False)
        if save.window is not None:
            begin, end = save.window
            gtkw.timestart(begin * factor)
            # Less the scroll bar and the frame, so that the whole window shows.
            zoom = _zoom((end - begin) * factor, _SIZE[0] - signals_width - 100)
        else:
            zoom = 0.0
        by_letter = {marker.letter.lower(): marker.time * factor for marker in save.markers}
        primary = save.markers[-1].time * factor if save.markers else -1
        gtkw.zoom_markers(zoom, primary, **by_letter)
        for marker in save.markers:
            f.write(f"[markername] {marker.letter}{marker.label}\n")
        for group in save.groups:
            with gtkw.group(group.title, closed=group.closed):
                for trace in group.traces:
                    gtkw.trace(trace.line(), alias=trace.alias, datafmt=trace.radix)
    return out


def make(wave, out=None) -> tuple[SavePlan, Path]:
    """The save file of the dump ``wave``, written to ``out`` (default: beside it)."""
    out = default_path(wave) if out in (None, "") else Path(out)
    # Before reading the waves, which can take a while.
    if out.resolve() == Path(wave).resolve():
        raise GtkwError(f"file {str(out)!r}: is the waves file itself; name another save file")
    if out.is_dir():
        raise GtkwError(f"file {str(out)!r}: is a directory, not a save file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)    # as --waves makes its folder
    except OSError as exc:
        raise GtkwError(f"file {str(out)!r}: cannot make its folder: "
                        f"{exc.strerror or exc}") from None
    save = plan(wave)
    return save, write(save, out)


#: ``opentrn wave`` options that shape a table, which a save file has no use for.
_TABLE_OPTIONS = (("list", "--list"), ("signals", "--signal"), ("start", "--from"),
                  ("stop", "--to"), ("signed", "--signed"), ("hex", "--hex"),
                  ("clock", "--clock"))


def run(args) -> str:
    """``opentrn wave FILE --gtkw [OUT]``: write the save file, return what to print."""
    given = [option for field, option in _TABLE_OPTIONS if getattr(args, field, None)]
    if given:
        raise GtkwError(f"--gtkw: writes a save file and prints no table; drop "
                        f"{', '.join(given)}")
    save, out = make(args.file, args.gtkw)
    return summary(save, out, as_json=getattr(args, "json", False))


def report(save: SavePlan, out) -> dict:
    """What a save file holds, for JSON."""
    return {
        "gtkw": str(out), "wave": str(save.wave),
        "groups": [{"title": group.title, "scope": group.scope,
                    "traces": [trace.name for trace in group.traces]}
                   for group in save.groups],
        "traces": len(save.traces),
        "markers": [{"name": f"{marker.letter} {marker.label}", "signal": marker.signal,
                     "cycle": marker.cycle, "time": marker.time} for marker in save.markers],
        "window": list(save.window) if save.window else None,
        "optimize_vcd": save.optimize,
    }


def summary(save: SavePlan, out, *, as_json=False) -> str:
    """What ``opentrn wave FILE --gtkw`` prints."""
    if as_json:
        return json.dumps(report(save, out), indent=2)
    from opentrn.report import key_value_table
    markers = ", ".join(f"{marker.letter} {marker.label} at cycle {marker.cycle} "
                        f"(time {marker.time})" for marker in save.markers)
    rows = [("save file", str(out)),
            ("waves", str(save.wave)),
            ("groups", ", ".join(f"{group.title} ({len(group.traces)})"
                                 for group in save.groups)),
            ("traces", len(save.traces)),
            ("markers", markers or "(none: no start pulse or interrupt in the dump)")]
    if save.window is not None:
        rows.append(("view", f"times {save.window[0]} to {save.window[1]}"))
    command = f"gtkwave {out}"
    if save.optimize:
        rows.append(("note", "names starting with $ (Verilator's): GTKWave converts the "
                             "VCD to FST to read it ([optimize_vcd])"))
    rows.append(("open with", command))
    return key_value_table(rows)
