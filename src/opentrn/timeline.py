"""Engine timelines: what each engine of the core did, cycle by cycle, as a trace for
Perfetto (the Chrome trace-event JSON that ui.perfetto.dev opens) and as a picture.

A :class:`Recorder` is fed one cycle at a time with what happened in it; the RTL testbench
(:mod:`opentrn.sim.tb_core`, from the core's signals) and the cycle model
(:func:`opentrn.cycle_model.simulate`) feed the same recorder, so their
:class:`Timeline` objects compare equal when the model is exact, and the trace of a kernel
too large to simulate comes from the model alone.

Cycle ``0`` is the cycle of the core's start pulse; the performance counters count from
cycle 1 (docs/registers.md), so an engine's busy cycles in the timeline sum to its busy
counter. What a timeline holds (docs/waves.md, "Engine timelines"):

- per engine, its instructions in program order: opcode, pc, the cycle the sequencer handed
  it over (``issued``; ``NOP`` and ``END`` too) and the cycle it completed (``retired``:
  left the retire queue, when its semaphore signal goes out);
- per engine, its semaphore waits (a checked instruction held by ``wait_sem >=
  wait_value``), as cycle ranges;
- per engine, its busy cycles (the busy counters' increments: the DMA engine executing a
  descriptor, the tensor engine taking a moving column, the activation engine a vector);
- the HBM bursts: reads per manager (the DMA engine, each sequencer's fetch), from the
  accepted AR to the last R beat taken, and the DMA's writes, from AW to the B response.
"""

import json
from collections import deque
from dataclasses import asdict, dataclass, field

from .isa import Engine

__all__ = ["ENGINES", "MANAGERS", "Instruction", "Wait", "Burst", "Timeline", "Recorder",
           "trace_events", "write_trace", "render"]

#: The engines, in the order of :class:`~opentrn.isa.Engine`.
ENGINES = tuple(engine.name.lower() for engine in Engine)
#: The HBM read managers by AXI ID (hdl/core.py: the DMA engine, then each sequencer's fetch).
MANAGERS = ("dma",) + tuple(f"{name} fetch" for name in ENGINES)


@dataclass(frozen=True)
class Instruction:
    engine: int
    opcode: str
    pc: int
    issued: int
    retired: int


@dataclass(frozen=True)
class Wait:
    """Cycles ``start`` to ``end - 1`` waiting for ``semaphore >= value``."""
    engine: int
    start: int
    end: int
    semaphore: int
    value: int


@dataclass(frozen=True)
class Burst:
    """An HBM burst of ``beats`` beats by ``manager`` (an index of :data:`MANAGERS`; writes
    are the DMA's): accepted in cycle ``start``, finished in cycle ``end - 1``."""
    manager: int
    write: bool
    beats: int
    start: int
    end: int


@dataclass
class Timeline:
    """A run: ``cycles`` counted cycles (1 .. cycles), and what happened in them."""
    cycles: int
    instructions: list = field(default_factory=list)
    waits: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)        # engine name -> [(start, end)]
    bursts: list = field(default_factory=list)

    def executing(self):
        """``(instruction, start)`` of each instruction: ``start`` the cycle its engine could
        begin on it (handed over, and the one before it completed), so that an engine's
        spans ``start .. retired`` follow one another without overlapping."""
        previous = {}
        for ins in self.instructions:
            yield ins, max(ins.issued, previous.get(ins.engine, -1) + 1)
            previous[ins.engine] = ins.retired

    def busy_cycles(self, engine):
        return sum(end - start for start, end in self.busy.get(engine, ()))

    def to_dict(self):
        return {"cycles": self.cycles,
                "instructions": [asdict(i) for i in self.instructions],
                "waits": [asdict(w) for w in self.waits],
                "busy": {name: [list(run) for run in runs] for name, runs in self.busy.items()},
                "bursts": [asdict(b) for b in self.bursts]}

    @classmethod
    def from_dict(cls, value):
        return cls(cycles=value["cycles"],
                   instructions=[Instruction(**i) for i in value["instructions"]],
                   waits=[Wait(**w) for w in value["waits"]],
                   busy={name: [tuple(run) for run in runs]
                         for name, runs in value["busy"].items()},
                   bursts=[Burst(**b) for b in value["bursts"]])


class Recorder:
    """Builds a :class:`Timeline` from one :meth:`cycle` call per cycle, in order."""

    def __init__(self):
        self._issued = [deque() for _ in Engine]          # (opcode, pc, cycle)
        self._waiting = [None] * len(Engine)              # (start, semaphore, value)
        self._busy_since = {name: None for name in ENGINES}
        self._reads = [deque() for _ in MANAGERS]         # (beats, cycle)
        self._writes = deque()
        self._last = None
        self.timeline = Timeline(cycles=0, busy={name: [] for name in ENGINES})

    def cycle(self, cycle, *, issued=(), retired=(), waiting=(), busy=(), read=None,
              read_last=None, write=None, write_response=False):
        """What happened in ``cycle``: ``issued`` ``(engine, opcode, pc)`` handed over,
        ``retired`` engines whose oldest instruction completed, ``waiting`` ``(engine,
        semaphore, value)``, ``busy`` engine names, ``read`` ``(manager, beats)`` an AR
        accepted, ``read_last`` the manager whose last R beat was taken, ``write`` the
        beats of an AW accepted, ``write_response`` a B taken."""
        if self._last is not None and cycle <= self._last:
            raise ValueError(f"cycle={cycle}: cycles must increase (last {self._last})")
        self._last = cycle
        timeline = self.timeline
        for engine in retired:
            opcode, pc, when = self._issued[engine].popleft()
            timeline.instructions.append(Instruction(engine, opcode, pc, when, cycle))
        for engine, opcode, pc in issued:
            self._issued[engine].append((opcode, pc, cycle))
        now_waiting = {engine: (semaphore, value) for engine, semaphore, value in waiting}
        for engine in range(len(Engine)):
            open_wait = self._waiting[engine]
            if open_wait is not None and (engine not in now_waiting
                                          or now_waiting[engine] != open_wait[1:]):
                timeline.waits.append(Wait(engine, open_wait[0], cycle, *open_wait[1:]))
                open_wait = None
            if open_wait is None and engine in now_waiting:
                open_wait = (cycle, *now_waiting[engine])
            self._waiting[engine] = open_wait
        for name in ENGINES:
            since = self._busy_since[name]
            if name in busy and since is None:
                self._busy_since[name] = cycle
            elif name not in busy and since is not None:
                timeline.busy[name].append((since, cycle))
                self._busy_since[name] = None
        if read_last is not None:
            beats, when = self._reads[read_last].popleft()
            timeline.bursts.append(Burst(read_last, False, beats, when, cycle + 1))
        if read is not None:
            self._reads[read[0]].append((read[1], cycle))
        if write_response:
            beats, when = self._writes.popleft()
            timeline.bursts.append(Burst(0, True, beats, when, cycle + 1))
        if write is not None:
            self._writes.append((write, cycle))

    def finish(self, cycles):
        """The timeline of a run of ``cycles`` counted cycles (the ``cycles`` counter)."""
        timeline = self.timeline
        end = cycles + 1
        for engine, open_wait in enumerate(self._waiting):
            if open_wait is not None:
                timeline.waits.append(Wait(engine, open_wait[0], end, *open_wait[1:]))
        for name, since in self._busy_since.items():
            if since is not None:
                timeline.busy[name].append((since, end))
        timeline.cycles = cycles
        # One order for both sources: by time, then by engine or manager.
        timeline.instructions.sort(key=lambda i: (i.engine, i.issued))
        timeline.waits.sort(key=lambda w: (w.engine, w.start))
        timeline.bursts.sort(key=lambda b: (b.start, b.write, b.manager))
        return timeline


# -- the Perfetto trace ---------------------------------------------------------------------

_PID = 1


def _track(engine, lane):
    """The thread id of an engine's lane (0 instructions, 1 waits, 2 busy)."""
    return 10 * (engine + 1) + lane


def trace_events(timeline, *, clock_hz, label="opentrn core", source=None):
    """The Chrome trace-event JSON object (a dict) of ``timeline``: one thread per engine
    lane (its instructions, its semaphore waits, its busy cycles), the HBM bursts as async
    slices per manager; times in microseconds at ``clock_hz``, cycles in each event's
    ``args``; ``source`` (the RTL or the cycle model) only in ``otherData``, so the events
    of one program are the same from both. An instruction's slice is its
    :meth:`Timeline.executing` span, so an engine's slices never overlap."""
    us = 1e6 / clock_hz

    def ts(cycle):
        return cycle * us

    events = [{"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": label}}]
    for engine, name in enumerate(ENGINES):
        for lane, what in enumerate(("instructions", "semaphore waits", "busy")):
            tid = _track(engine, lane)
            events.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name",
                           "args": {"name": f"{name} {what}"}})
            events.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_sort_index",
                           "args": {"sort_index": tid}})
    for ins, start in timeline.executing():
        events.append({"ph": "X", "pid": _PID, "tid": _track(ins.engine, 0),
                       "name": ins.opcode, "ts": ts(start), "dur": ts(ins.retired + 1 - start),
                       "args": {"pc": ins.pc, "issued": ins.issued, "retired": ins.retired}})
    for wait in timeline.waits:
        events.append({"ph": "X", "pid": _PID, "tid": _track(wait.engine, 1),
                       "name": f"wait sem[{wait.semaphore}] >= {wait.value}",
                       "ts": ts(wait.start), "dur": ts(wait.end - wait.start),
                       "args": {"cycles": wait.end - wait.start, "from": wait.start}})
    for engine, name in enumerate(ENGINES):
        for start, end in timeline.busy.get(name, ()):
            events.append({"ph": "X", "pid": _PID, "tid": _track(engine, 2), "name": "busy",
                           "ts": ts(start), "dur": ts(end - start),
                           "args": {"cycles": end - start, "from": start}})
    for number, burst in enumerate(timeline.bursts):
        name = "HBM write (dma)" if burst.write else f"HBM read ({MANAGERS[burst.manager]})"
        common = {"pid": _PID, "cat": "hbm", "name": name, "id": number}
        events.append({**common, "ph": "b", "ts": ts(burst.start),
                       "args": {"beats": burst.beats, "from": burst.start,
                                "to": burst.end - 1}})
        events.append({**common, "ph": "e", "ts": ts(burst.end)})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": source, "cycles": timeline.cycles, "clock_hz": clock_hz,
                          "busy_cycles": {name: timeline.busy_cycles(name)
                                          for name in ENGINES}}}


def write_trace(timeline, path, *, clock_hz, label="opentrn core", source=None):
    """Write :func:`trace_events` of ``timeline`` to ``path`` (JSON)."""
    with open(path, "w") as f:
        json.dump(trace_events(timeline, clock_hz=clock_hz, label=label, source=source), f)


# -- the picture ----------------------------------------------------------------------------

#: The colour of each engine's busy lane in :func:`render` (RGB 0..1), distinct from the
#: instructions' and the waits' colours so that a picture can be checked pixel by pixel.
BUSY_COLOURS = {"dma": (0.12, 0.47, 0.71), "tensor": (0.84, 0.15, 0.16),
                "activation": (0.17, 0.63, 0.17)}
WAIT_COLOUR = (0.6, 0.6, 0.6)
FETCH_COLOUR = (0.55, 0.34, 0.29)
_INSTRUCTION_COLOURS = ((0.62, 0.78, 0.91), (1.0, 0.73, 0.47), (0.6, 0.87, 0.54),
                        (0.77, 0.69, 0.84), (0.86, 0.86, 0.55), (0.97, 0.71, 0.82))

#: Rows of :func:`render`, top to bottom: per engine its instructions, waits and busy
#: cycles, then the HBM reads and writes.
ROWS = tuple(f"{name} {lane}" for name in ENGINES
             for lane in ("instructions", "waits", "busy")) + ("HBM reads", "HBM writes")


def render(timeline, path, *, title="", width=1600, dpi=100):
    """Draw ``timeline`` to the PNG ``path`` (matplotlib, no display needed): one row per
    entry of :data:`ROWS` over cycles 1 .. ``timeline.cycles``, each engine's busy share
    written beside its busy row. Returns the layout a reader needs to find the rows in the
    picture: ``{"rows": {row: y pixel from the top}, "x": (first, last) pixel of the
    cycle axis, "busy": {engine: busy cycles}}``."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    cycles = max(timeline.cycles, 1)
    height = 0.3 * len(ROWS) + 1.3
    figure, axes = plt.subplots(figsize=(width / dpi, height), dpi=dpi)
    try:
        positions = {row: len(ROWS) - 1 - index for index, row in enumerate(ROWS)}
        bar = 0.8

        def bars(row, spans, **style):
            # Not antialiased: a cycle range covers whole pixels, so a reader can count them.
            axes.broken_barh([(start, end - start) for start, end in spans],
                             (positions[row] - bar / 2, bar), antialiased=False,
                             linewidth=0, **style)

        opcodes = sorted({ins.opcode for ins in timeline.instructions})
        colour_of = {op: _INSTRUCTION_COLOURS[i % len(_INSTRUCTION_COLOURS)]
                     for i, op in enumerate(opcodes)}
        # One collection per row and colour: a bar per call takes minutes for 10,000s.
        spans = {}
        for ins, start in timeline.executing():
            spans.setdefault((f"{ENGINES[ins.engine]} instructions", ins.opcode), []).append(
                (start, ins.retired + 1))
        for (row, opcode), runs in spans.items():
            bars(row, runs, facecolor=colour_of[opcode])
        for engine, name in enumerate(ENGINES):
            bars(f"{name} waits", [(wait.start, wait.end) for wait in timeline.waits
                                   if wait.engine == engine], facecolor=WAIT_COLOUR)
        for name in ENGINES:
            bars(f"{name} busy", timeline.busy.get(name, ()), facecolor=BUSY_COLOURS[name])
            share = timeline.busy_cycles(name) / cycles
            axes.text(1.005, positions[f"{name} busy"], f"{100 * share:.1f}%",
                      transform=axes.get_yaxis_transform(), va="center", fontsize=8)
        for write, row in ((False, "HBM reads"), (True, "HBM writes")):
            for fetch, colour in ((False, BUSY_COLOURS["dma"]), (True, FETCH_COLOUR)):
                bars(row, [(b.start, b.end) for b in timeline.bursts
                           if b.write == write and (b.manager != 0) == fetch],
                     facecolor=colour, alpha=0.5)
        axes.set_xlim(1, cycles + 1)
        axes.set_ylim(-0.6, len(ROWS) - 0.4)
        axes.set_yticks([positions[row] for row in ROWS], ROWS, fontsize=8)
        axes.set_xlabel("cycle")
        axes.grid(axis="x", alpha=0.3)
        axes.set_axisbelow(True)            # the grid behind the bars, not across them
        handles = [matplotlib.patches.Patch(facecolor=colour_of[op], label=op)
                   for op in opcodes]
        handles += [matplotlib.patches.Patch(facecolor=WAIT_COLOUR, label="semaphore wait"),
                    matplotlib.patches.Patch(facecolor=BUSY_COLOURS["dma"], alpha=0.5,
                                             label="DMA burst"),
                    matplotlib.patches.Patch(facecolor=FETCH_COLOUR, alpha=0.5,
                                             label="instruction fetch")]
        figure.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8,
                      frameon=False)
        axes.set_title(title or f"{timeline.cycles} cycles", fontsize=10)
        figure.tight_layout(rect=(0, 0.07, 1, 1))
        figure.canvas.draw()
        # Pixel positions for a reader, from the top left as image libraries count.
        pixel_height = figure.get_size_inches()[1] * dpi
        to_pixels = axes.transData.transform
        rows = {row: round(pixel_height - to_pixels((1, positions[row]))[1])
                for row in ROWS}
        first = to_pixels((1, 0))[0]
        last = to_pixels((cycles + 1, 0))[0]
        figure.savefig(path, dpi=dpi)
    finally:
        plt.close(figure)
    return {"rows": rows, "x": (first, last),
            "busy": {name: timeline.busy_cycles(name) for name in ENGINES}}
