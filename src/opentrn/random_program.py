"""Constrained-random programs for the core: instruction streams for all three engines, drawn
from a seed, legal by construction (or with exactly one fault), for ``opentrn fuzz``.

A program is a list of **operations** in one global order, each on one engine: a DMA
descriptor (any pair of HBM, SBUF and PSUM, 1 to 3 dimensions, any element size, strides
and partition steps), a tensor group (a ``LOAD_STATIONARY`` and one to three ``MATMUL`` s
of its format, overwriting or accumulating), an ``ACTIVATE`` (PSUM or SBUF source, either
path, every output format of the build, with or without bias), or a ``NOP``. A prologue
fills the working windows of the SBUF and the PSUM from HBM (the buffers keep their
contents from one run to the next on the RTL, so nothing reads what the program did not
write), and an epilogue copies them back to HBM, so that every value the program computes
reaches the image the golden machine and the RTL are compared on.

**Semaphores.** :func:`assemble` makes any subset of the operations a race-free program:
each access (a bounding box of partitions and bytes in one space) waits for every earlier
conflicting access of another engine (and of its own activation engine on the SBUF, whose
reads may overtake its writes) to complete. How each wait is met is drawn per program and
per wait (:data:`PATTERNS`): the producer engine's **counter** semaphore, signalled by some
of its instructions (``signal_rate``), waited on at the count of the first signalling
instruction at or after the producer (completions are in program order, so that one
completing implies it); a **join** semaphore that ``NOP`` s appended to two producer
streams both signal, waited on at 2 (each join has a semaphore of its own); an extra
**redundant** wait that already holds; and ``NOP`` s carrying the waits an instruction
cannot (one wait each). :func:`races` checks the result independently, from the signals
alone: :func:`generate` refuses a program it finds a race in.

**Faults.** With ``fault`` set, :func:`generate` builds the legal program and then breaks
one instruction (or a program pointer) so that the run ends with that code (docs/isa.md,
"Errors"): an opcode of another engine or none, a format the build lacks, a semaphore index
or a count outside its rule, an offset or bank past a buffer, a descriptor that the DMA
refuses (each of its five refusal codes), a wait that never holds, a misaligned program
pointer or a stream that runs past the end of HBM.

Everything is drawn from ``random.Random(seed)`` (the data, an injected fault and the MX
scale partitions from streams of their own): the same seed and configuration give the
same program, and :func:`assemble` of a subset of ``Program.operations`` is how a failing
program shrinks.
"""

import random
from dataclasses import dataclass, field

import numpy as np

from opentrn import isa, numerics
from opentrn.golden.dma import ErrorCode, Space, buffer_geometry
from opentrn.isa import Engine, Fault, Opcode

__all__ = ["Program", "Operation", "generate", "assemble", "races", "PATTERNS", "FAULTS"]

DMA, TENSOR, ACT = Engine.DMA, Engine.TENSOR, Engine.ACTIVATION
#: How a wait is met (reported as coverage).
PATTERNS = ("counter", "counter-later-signal", "join", "redundant", "nop-wait", "self-wait")
#: The faults :func:`generate` injects: ISA fault name -> its variants.
FAULTS = {
    "ILLEGAL_OPCODE": ("unknown opcode", "another engine's opcode", "format not built"),
    "BAD_FIELD": ("semaphore index", "zero count", "misaligned offset"),
    "OUT_OF_RANGE": ("psum bank", "sbuf offset", "dma field too wide"),
    "DMA_ERROR": tuple(code.name for code in (ErrorCode.ZERO_SIZE, ErrorCode.BAD_SPACE,
                                              ErrorCode.SRC_BOUNDS, ErrorCode.DST_BOUNDS,
                                              ErrorCode.OVERLAP)),
    "DEADLOCK": ("wait never satisfied",),
    "FETCH_ERROR": ("misaligned pointer", "past the end of HBM"),
}
_SPACES = (Space.HBM, Space.SBUF, Space.PSUM)
_ALIGN = 4096           # data areas
_STREAM_BYTES = 8192    # each engine's stream area
_DMA_CODES = {name: ErrorCode[name] for name in FAULTS["DMA_ERROR"]}


@dataclass
class Operation:
    """One operation: ``instructions`` are ``(opcode, fields, accesses)``, each access
    ``(space, write, (p0, p1, b0, b1))`` (inclusive bounding box)."""
    engine: Engine
    kind: str
    instructions: list


@dataclass
class Program:
    """A generated program: the image and pointers, and what it covers."""
    config: object
    seed: int
    hbm: np.ndarray
    programs: tuple
    operations: list
    fault: Fault = Fault.NONE
    fault_variant: str = ""
    coverage: set = field(default_factory=set)

    def label(self):
        what = f"{len(self.operations)} operations"
        if self.fault != Fault.NONE:
            what += f", {self.fault.name} ({self.fault_variant})"
        return f"seed {self.seed}: {what}"


class _Layout:
    """Where things are: the HBM image (streams, input data, output area) and the buffer
    windows the program works in."""

    def __init__(self, config, rng):
        self.config = config
        self.sbuf_parts, self.sbuf_bytes = buffer_geometry(config, Space.SBUF)
        self.psum_parts, self.psum_bytes = buffer_geometry(config, Space.PSUM)
        bus = config.dma_bus_bytes
        # The SBUF window: a few hundred bytes per partition (the buffers are big; the
        # prologue and epilogue move the window, so it stays small).
        self.sbuf_window = min(self.sbuf_bytes, rng.choice((128, 256, 512)))
        self.psum_window = self.psum_bytes
        self.code_bytes = 3 * _STREAM_BYTES
        self.data = self.code_bytes                     # random input bytes
        self.data_bytes = 2048
        self.out = self.data + self.data_bytes          # written by DMAs, then the dump
        self.out_bytes = 2048
        self.dump = self.out + self.out_bytes
        self.dump_bytes = (self.sbuf_parts * self.sbuf_window
                           + self.psum_parts * self.psum_window)
        self.total = -(-(self.dump + self.dump_bytes) // _ALIGN) * _ALIGN
        assert self.total <= config.hbm_bytes and bus <= 64

    def window(self, space):
        if space == Space.SBUF:
            return self.sbuf_parts, self.sbuf_window
        return self.psum_parts, self.psum_window


def _box(p0, p1, b0, b1):
    return (p0, p1, b0, b1)


def _meets(a, b):
    return a[0] <= b[1] and b[0] <= a[1] and a[2] <= b[3] and b[2] <= a[3]


def _dma_fields(src, dst, n0, n1, n2, elem_log2):
    fields = {"n0": n0, "n1": n1, "n2": n2, "elem_log2": elem_log2}
    for prefix, side in (("src", src), ("dst", dst)):
        space, addr, part, s1, s2, p1, p2 = side
        fields.update({f"{prefix}_space": int(space), f"{prefix}_addr": addr,
                       f"{prefix}_partition": part, f"{prefix}_stride1": s1,
                       f"{prefix}_stride2": s2, f"{prefix}_pstep1": p1,
                       f"{prefix}_pstep2": p2})
    return fields


def _side_box(side, row_bytes, n1, n2):
    space, addr, part, s1, s2, p1, p2 = side
    last_byte = addr + row_bytes - 1 + (n1 - 1) * s1 + (n2 - 1) * s2
    last_part = part + (n1 - 1) * p1 + (n2 - 1) * p2
    if space == Space.HBM:
        return (space, _box(0, 0, addr, last_byte))
    return (space, _box(part, last_part, addr, last_byte))


class _Generator:
    def __init__(self, config, rng, scale_rng=None):
        self.config, self.rng = config, rng
        # MX scale partitions come from their own stream, so that the rest of a seed's
        # program is what it was before the ISA had them.
        self.scale_rng = scale_rng or random.Random(0)
        self.layout = _Layout(config, rng)
        self.formats = [f.name for f in numerics.matmul_formats(config)]
        self.out_formats = [f.name for f in numerics.activation_formats(config)]

    # -- DMA --------------------------------------------------------------------------------

    def _side(self, space, row_bytes, n1, n2, *, writing, avoid=None):
        """A random side of ``space`` that fits its window (and misses ``avoid``, the other
        side's box in the same space), or None."""
        rng, lay = self.rng, self.layout
        for _ in range(20):
            if space == Space.HBM:
                s1 = row_bytes + rng.randrange(0, 64) if writing or rng.random() < 0.8 else 0
                s2 = s1 * n1 + rng.randrange(0, 64)
                extent = row_bytes + (n1 - 1) * s1 + (n2 - 1) * s2
                lo, size = (lay.out, lay.out_bytes) if writing else \
                    rng.choice(((lay.data, lay.data_bytes), (lay.out, lay.out_bytes)))
                if extent > size:
                    continue
                side = (space, lo + rng.randrange(size - extent + 1), 0, s1, s2, 0, 0)
            else:
                parts, window = lay.window(space)
                p1 = rng.choice((0, 1, 1, 2)) if n1 > 1 else 0
                p2 = rng.choice((0, 1, 2)) if n2 > 1 else 0
                if writing:
                    # Every row of a written side has bytes of its own: it never lands on
                    # another row of the same descriptor, whatever the partitions.
                    s1 = row_bytes + rng.choice((0, 0, 4, 8))
                    s2 = s1 * n1 + rng.choice((0, 8))
                else:
                    s1 = rng.choice((0, row_bytes, row_bytes + 4))
                    s2 = rng.choice((0, s1 * n1, row_bytes))
                last_part = (n1 - 1) * p1 + (n2 - 1) * p2
                extent = row_bytes + (n1 - 1) * s1 + (n2 - 1) * s2
                if last_part >= parts or extent > window:
                    continue
                side = (space, rng.randrange(window - extent + 1),
                        rng.randrange(parts - last_part), s1, s2, p1, p2)
            box = _side_box(side, row_bytes, n1, n2)
            if avoid is not None and box[0] == avoid[0] and _meets(box[1], avoid[1]):
                continue
            return side
        return None

    def dma(self, spaces=None):
        rng = self.rng
        for _ in range(50):
            src_space, dst_space = spaces or (rng.choice(_SPACES), rng.choice(_SPACES))
            elem_log2 = rng.randrange(4)
            n0 = rng.choice((1, 2, 3, 8, 16, 24)) if elem_log2 < 3 else rng.choice((1, 2, 4))
            n1, n2 = rng.choice((1, 1, 2, 3, 4)), rng.choice((1, 1, 1, 2, 3))
            row_bytes = n0 << elem_log2
            src = self._side(src_space, row_bytes, n1, n2, writing=False)
            if src is None:
                continue
            dst = self._side(dst_space, row_bytes, n1, n2, writing=True,
                             avoid=_side_box(src, row_bytes, n1, n2))
            if dst is None:
                continue
            (src_space, src_box), (dst_space, dst_box) = (
                _side_box(side, row_bytes, n1, n2) for side in (src, dst))
            accesses = [(src_space, False, src_box), (dst_space, True, dst_box)]
            fields = _dma_fields(src, dst, n0, n1, n2, elem_log2)
            return Operation(DMA, f"DMA {src_space.name}->{dst_space.name}",
                             [(Opcode.DMA, fields, accesses)])
        raise RuntimeError("no DMA fits the windows")

    # -- tensor -----------------------------------------------------------------------------

    def _scales(self, fmt, count):
        """The scale offset and partition of an MX operand of ``count`` columns and its
        access (the partition the first or the last group of ``mx_blocks`` half of the
        time)."""
        if not numerics.data_format(fmt).mx:
            return {}, []
        blocks = numerics.mx_blocks(self.config)
        groups = self.config.sbuf_partitions // blocks
        window = self.layout.sbuf_window
        offset = self.rng.randrange(window - count + 1)
        first = blocks * self.scale_rng.choice([0, groups - 1, self.scale_rng.randrange(groups)])
        return {"scale_offset": offset, "scale_partition": first}, [
            (Space.SBUF, False, _box(first, first + blocks - 1, offset, offset + count - 1))]

    def tensor(self):
        rng, cfg, lay = self.rng, self.config, self.layout
        fmt = rng.choice(self.formats)
        column = numerics.column_bytes(cfg, fmt)
        # Columns within the SBUF window (wide packed columns, e.g. MXFP8's 4 bytes at 4
        # MACs per PE, may not fit pe_cols or moving_max of them).
        fitting = lay.sbuf_window // column
        rows, cols = rng.randint(1, cfg.pe_rows), rng.randint(1, min(cfg.pe_cols, fitting))
        offset = rng.randrange((lay.sbuf_window - cols * column) // column + 1) * column
        scale_fields, scale_access = self._scales(fmt, cols)
        code = numerics.data_format(fmt).code
        instructions = [(Opcode.LOAD_STATIONARY,
                         {"sbuf_offset": offset, "rows": rows, "cols": cols, "format": code,
                          **scale_fields},
                         [(Space.SBUF, False, _box(0, rows - 1, offset,
                                                   offset + cols * column - 1))]
                         + scale_access)]
        entry_bytes = 4
        for _ in range(rng.choice((1, 1, 2, 3))):
            n = rng.randint(1, min(cfg.moving_max, cfg.psum_bank_entries, fitting))
            moving = rng.randrange((lay.sbuf_window - n * column) // column + 1) * column
            bank = rng.randrange(cfg.psum_banks)
            entry = rng.randrange(cfg.psum_bank_entries - n + 1)
            accumulate = rng.random() < 0.4
            scale_fields, scale_access = self._scales(fmt, n)
            first = (bank * cfg.psum_bank_entries + entry) * entry_bytes
            psum_box = _box(0, cfg.pe_cols - 1, first, first + n * entry_bytes - 1)
            accesses = [(Space.SBUF, False, _box(0, cfg.pe_rows - 1, moving,
                                                 moving + n * column - 1)),
                        *scale_access, (Space.PSUM, True, psum_box)]
            if accumulate:
                accesses.append((Space.PSUM, False, psum_box))
            instructions.append((Opcode.MATMUL, {
                "sbuf_offset": moving, "n": n, "psum_bank": bank, "psum_entry": entry,
                "accumulate": int(accumulate), "format": code, **scale_fields}, accesses))
        return Operation(TENSOR, f"tensor {fmt}", instructions)

    # -- activation -------------------------------------------------------------------------

    def activate(self):
        rng, cfg, lay = self.rng, self.config, self.layout
        out = rng.choice(self.out_formats)
        out_bytes = numerics.data_format(out).bytes
        floating = numerics.data_format(out).element is not None
        lanes = cfg.pe_cols
        n = rng.randint(1, cfg.moving_max)
        src = 0 if floating or rng.random() < 0.7 else 1
        if src == 0:
            n = min(n, cfg.psum_bank_entries)
        fields = {"src": src, "function": rng.randrange(2), "out_format":
                  numerics.data_format(out).code, "n": n}
        accesses = []
        window = lay.sbuf_window
        if n * out_bytes > window:
            n = window // out_bytes
            fields["n"] = n
        dst = rng.randrange((window - n * out_bytes) // out_bytes + 1) * out_bytes
        fields["dst_offset"] = dst
        accesses.append((Space.SBUF, True, _box(0, lanes - 1, dst, dst + n * out_bytes - 1)))
        if src == 0:
            bank = rng.randrange(cfg.psum_banks)
            entry = rng.randrange(cfg.psum_bank_entries - n + 1)
            first = (bank * cfg.psum_bank_entries + entry) * 4
            fields.update(psum_bank=bank, psum_entry=entry)
            accesses.append((Space.PSUM, False, _box(0, lanes - 1, first, first + 4 * n - 1)))
        else:
            if out == "int8" and rng.random() < 0.3:
                offset = dst                    # in place: allowed for int8 out
            else:
                for _ in range(20):
                    offset = rng.randrange(window - n + 1)
                    if offset + n <= dst or dst + n * out_bytes <= offset:
                        break
                else:
                    offset = dst if out == "int8" else None
                if offset is None:
                    return self.activate()
            fields["src_offset"] = offset
            accesses.append((Space.SBUF, False, _box(0, lanes - 1, offset, offset + n - 1)))
        if floating:
            scale = rng.choice((1.0, 0.5, -2.0, 0.375, 3.0e38, 1e-30, float("inf"),
                                float("nan"), -0.0, rng.uniform(-4, 4)))
            fields["multiplier"] = int(np.float32(scale).view(np.uint32))
            fields["shift"] = 0
        else:
            fields["multiplier"] = rng.choice((1, 3, -7, 1 << 20, -(1 << 31), (1 << 31) - 1,
                                               rng.randrange(-1000, 1000)))
            fields["shift"] = rng.choice((0, 1, 7, 12, 31, 40, 63))
        if rng.random() < 0.5:
            bias = rng.randrange((window - 4) // 4 + 1) * 4
            fields.update(bias=1, bias_offset=bias)
            accesses.append((Space.SBUF, False, _box(0, lanes - 1, bias, bias + 3)))
        # The multiplier field is signed: encode wants its value in range.
        if fields["multiplier"] >= 1 << 31:
            fields["multiplier"] -= 1 << 32
        return Operation(ACT, f"activate {'psum' if src == 0 else 'sbuf'}->{out}",
                         [(Opcode.ACTIVATE, fields, accesses)])

    def nop(self):
        engine = self.rng.choice(list(Engine))
        return Operation(engine, "nop", [(Opcode.NOP, {}, [])])

    # -- the program ------------------------------------------------------------------------

    def prologue(self):
        lay = self.layout
        ops = []
        for space in (Space.SBUF, Space.PSUM):
            parts, window = lay.window(space)
            src = (Space.HBM, lay.data, 0, window % lay.data_bytes, 0, 0, 0)
            dst = (space, 0, 0, 0, 0, 1, 0)
            fields = _dma_fields(src, dst, window, parts, 1, 0)
            # Every partition gets the input bytes from a partition-dependent start.
            fields["src_stride1"] = 8
            accesses = [(Space.HBM, False, _box(0, 0, lay.data, lay.data + window +
                                                8 * parts)),
                        (space, True, _box(0, parts - 1, 0, window - 1))]
            ops.append(Operation(DMA, f"prologue {space.name}",
                                 [(Opcode.DMA, fields, accesses)]))
        return ops

    def epilogue(self):
        lay = self.layout
        ops, at = [], lay.dump
        for space in (Space.SBUF, Space.PSUM):
            parts, window = lay.window(space)
            src = (space, 0, 0, 0, 0, 1, 0)
            dst = (Space.HBM, at, 0, window, 0, 0, 0)
            accesses = [(space, False, _box(0, parts - 1, 0, window - 1)),
                        (Space.HBM, True, _box(0, 0, at, at + parts * window - 1))]
            ops.append(Operation(DMA, f"epilogue {space.name}",
                                 [(Opcode.DMA, _dma_fields(src, dst, window, parts, 1, 0),
                                   accesses)]))
            at += parts * window
        return ops

    def body(self, count):
        rng = self.rng
        weights = {"dma": 3, "tensor": 3, "activate": 3, "nop": 1}
        makers = {"dma": self.dma, "tensor": self.tensor, "activate": self.activate,
                  "nop": self.nop}
        kinds = rng.choices(list(weights), weights=list(weights.values()), k=count)
        return [makers[kind]() for kind in kinds]


def assemble(config, operations, *, seed=0):
    """The instruction streams of ``operations`` (in their global order, each engine's
    instructions in order), with the semaphores that make them race-free drawn from
    ``seed``: ``(streams, accesses, coverage)``, ``streams[engine]`` a list of ``[opcode,
    fields]`` and ``accesses[engine]`` its ``(index, space, write, box)`` (what
    :func:`races` checks)."""
    rng = random.Random(seed * 7919 + 17)
    semaphores = list(range(config.semaphores))
    rng.shuffle(semaphores)
    counters = {engine: semaphores[engine] for engine in Engine}
    # Each join semaphore serves one join: were one reused, the second join's NOP on one
    # producer could make up the first join's total while the other producer lags.
    joins = semaphores[len(Engine):]
    signal_rate = {engine: rng.choice((1.0, 0.6, 0.25)) for engine in Engine}
    streams = {engine: [] for engine in Engine}     # [opcode, fields] (fields mutable)
    history = {engine: [] for engine in Engine}     # [(index, space, write, box)]
    known = {engine: {other: -1 for other in Engine} for engine in Engine}
    coverage = set()

    def append(engine, opcode, fields):
        entry = [opcode, dict(fields)]
        if not entry[1].get("signal") and rng.random() < signal_rate[engine]:
            entry[1].update(signal=1, signal_sem=counters[engine])
        streams[engine].append(entry)
        return len(streams[engine]) - 1

    def count_at(engine, index):
        """The counter value once instruction ``index`` of ``engine`` completed, making the
        first instruction at or after it signal if none does."""
        stream = streams[engine]
        later = next((i for i in range(index, len(stream))
                      if stream[i][1].get("signal_sem") == counters[engine]
                      and stream[i][1].get("signal")), None)
        if later is None:
            last = len(stream) - 1
            if stream[last][1].get("signal"):         # signals a join: add a NOP after it
                append(engine, Opcode.NOP, {})
                last = len(stream) - 1
            stream[last][1].update(signal=1, signal_sem=counters[engine])
            later = last
            coverage.add(("pattern", "counter-later-signal" if later != index
                          else "counter"))
        else:
            coverage.add(("pattern", "counter" if later == index
                          else "counter-later-signal"))
        return sum(1 for opcode, f in stream[:later + 1]
                   if f.get("signal") and f.get("signal_sem") == counters[engine])

    for op in operations:
        engine = op.engine
        for opcode, fields, accesses in op.instructions:
            need = {}
            for space, write, box in accesses:
                for other in Engine:
                    if other == engine and not (engine == ACT and space == Space.SBUF):
                        continue
                    for index, o_space, o_write, o_box in history[other]:
                        if o_space == space and (write or o_write) and _meets(box, o_box):
                            need[other] = max(need.get(other, -1), index)
            need = {o: i for o, i in need.items() if i > known[engine][o]}
            waits = []
            producers = [other for other in sorted(need) if other != engine]
            if len(producers) >= 2 and joins and rng.random() < 0.5:
                # Both producers' streams get a NOP that signals one semaphore: it completes
                # after everything before it there; the consumer waits for the new total.
                sem = joins.pop(rng.randrange(len(joins)))
                for producer in producers[:2]:
                    append(producer, Opcode.NOP, {"signal": 1, "signal_sem": sem})
                    known[engine][producer] = need.pop(producer)
                waits.append((sem, 2))
                coverage.add(("pattern", "join"))
            for other, index in need.items():
                if other == engine:
                    coverage.add(("pattern", "self-wait"))
                waits.append((counters[other], count_at(other, index)))
                known[engine][other] = index
            if rng.random() < 0.1 and streams[DMA]:
                # A wait that already holds (the counter was reached before).
                waits.append((counters[DMA], 0))
                coverage.add(("pattern", "redundant"))
            rng.shuffle(waits)
            for sem, value in waits[:-1]:
                append(engine, Opcode.NOP, {"wait": 1, "wait_sem": sem, "wait_value": value})
                coverage.add(("pattern", "nop-wait"))
            final = dict(fields)
            if waits:
                sem, value = waits[-1]
                final.update(wait=1, wait_sem=sem, wait_value=value)
            index = append(engine, opcode, final)
            for space, write, box in accesses:
                history[engine].append((index, space, write, box))
            coverage.add(("opcode", opcode.name, _format_name(opcode, fields)))
            if opcode == Opcode.DMA:
                coverage.add(("dma", Space(fields["src_space"]).name,
                              Space(fields["dst_space"]).name))
    return streams, history, coverage


def races(streams, accesses):
    """The pairs of conflicting accesses (same space, overlapping boxes, one a write) that
    the semaphores of ``streams`` leave unordered: ``[(engine, index, engine, index)]``,
    empty for a race-free program. Independent of :func:`assemble`'s reasoning: from the
    signals alone, what each wait guarantees has completed, whatever the timing.

    A wait ``sem >= v`` guarantees engine ``e``'s ``k``-th signal on ``sem`` (and so, with
    completions in program order, everything of ``e`` up to it, and whatever that
    instruction's own waits guaranteed) where ``k = v - `` the signals every other engine
    has on ``sem`` in the whole program. Conflicts within one engine need ordering only on
    the activation engine's SBUF accesses (its reads may overtake its writes)."""
    engines = list(streams)
    signals = {}                    # (engine, sem) -> indices of the signalling instructions
    for engine in engines:
        for index, (_, fields) in enumerate(streams[engine]):
            if fields.get("signal"):
                signals.setdefault((engine, fields["signal_sem"]), []).append(index)
    # done[engine][index][other]: the last instruction of ``other`` certainly complete when
    # ``index`` starts (-1: none); grown to a fixed point (the waits can point any way).
    done = {e: [dict.fromkeys(engines, -1) for _ in streams[e]] for e in engines}
    changed = True
    while changed:
        changed = False
        for engine in engines:
            for index, (_, fields) in enumerate(streams[engine]):
                known = dict(done[engine][index - 1]) if index else dict.fromkeys(engines, -1)
                if fields.get("wait"):
                    sem, value = fields["wait_sem"], fields["wait_value"]
                    total = sum(len(signals.get((e, sem), ())) for e in engines)
                    for other in engines:
                        mine = signals.get((other, sem), ())
                        k = value - (total - len(mine))
                        if k >= 1 and k <= len(mine):
                            at = mine[k - 1]
                            known[other] = max(known[other], at)
                            for e, last in done[other][at].items():
                                known[e] = max(known[e], last)
                if known != done[engine][index]:
                    done[engine][index] = known
                    changed = True
    found = []
    flat = [(engine, *access) for engine in engines for access in accesses[engine]]
    for a, (e1, i1, space1, write1, box1) in enumerate(flat):
        for e2, i2, space2, write2, box2 in flat[a + 1:]:
            if space1 != space2 or not (write1 or write2) or not _meets(box1, box2):
                continue
            if e1 == e2:
                if e1 != ACT or space1 != Space.SBUF or i1 == i2:
                    continue
                first, second = min(i1, i2), max(i1, i2)
                if done[e1][second][e1] < first:
                    found.append((e1, first, e1, second))
            elif done[e2][i2][e1] < i1 and done[e1][i1][e2] < i2:
                found.append((e1, i1, e2, i2))
    return sorted(set(found))


def _format_name(opcode, fields):
    if opcode in (Opcode.LOAD_STATIONARY, Opcode.MATMUL):
        return numerics.format_of_code(fields["format"]).name
    if opcode == Opcode.ACTIVATE:
        return numerics.format_of_code(fields["out_format"]).name
    return ""


def _word(opcode, fields):
    if isinstance(opcode, _RawOpcode):
        word = bytearray(isa.encode(Opcode.NOP))
        word[0] = int(opcode)
        return bytes(word)
    return isa.encode(opcode, **fields)


def _encode(streams, image):
    """Write the streams (each ended by ``END``) into ``image``; return the pointers."""
    programs = []
    for engine in Engine:
        at = engine * _STREAM_BYTES
        code = b"".join(_word(opcode, fields) for opcode, fields in
                        [*streams[engine], [Opcode.END, {}]])
        if len(code) > _STREAM_BYTES:
            raise ValueError(f"the {engine.name} stream is {len(code)} bytes, more than its "
                             f"{_STREAM_BYTES}-byte area")
        image[at:at + len(code)] = np.frombuffer(code, np.uint8)
        programs.append(at)
    return tuple(programs)


def _inject(config, rng, streams, layout, fault):
    """Break the program so that it ends with ``fault``; return (variant, pointers change)."""
    variant = rng.choice(FAULTS[fault.name])
    engine_streams = {e: s for e, s in streams.items() if s}

    def pick(opcodes):
        candidates = [(e, i) for e, s in engine_streams.items() for i, (op, _) in enumerate(s)
                      if op in opcodes]
        return rng.choice(candidates) if candidates else None

    def replace(at, opcode, fields):
        engine, index = at
        streams[engine][index] = [opcode, fields]

    if fault == Fault.ILLEGAL_OPCODE:
        if variant == "format not built":
            missing = [f for f in numerics.TENSOR_FORMATS if f not in config.dtypes]
            at = pick((Opcode.LOAD_STATIONARY,))
            if missing and at:
                fields = dict(streams[at[0]][at[1]][1])
                fields["format"] = numerics.data_format(rng.choice(missing)).code
                replace(at, Opcode.LOAD_STATIONARY, fields)
                return variant, None
            variant = "unknown opcode"
        engine = rng.choice(list(Engine))
        index = rng.randrange(len(streams[engine]) + 1)
        if variant == "unknown opcode":
            opcode = 0x7F
        else:
            own = {DMA: (Opcode.DMA,), TENSOR: (Opcode.MATMUL, Opcode.LOAD_STATIONARY),
                   ACT: (Opcode.ACTIVATE,)}
            opcode = rng.choice([op for e, ops in own.items() if e != engine for op in ops])
        streams[engine].insert(index, [_RawOpcode(opcode), {}])
        return variant, None
    if fault == Fault.BAD_FIELD:
        engine = rng.choice(list(Engine))
        index = rng.randrange(len(streams[engine]) + 1)
        if variant == "semaphore index":
            streams[engine].insert(index, [Opcode.NOP, {"signal": 1,
                                                        "signal_sem": config.semaphores}])
            return variant, None
        if variant == "zero count":
            at = pick((Opcode.MATMUL, Opcode.ACTIVATE))
            if at:
                fields = dict(streams[at[0]][at[1]][1], n=0)
                replace(at, streams[at[0]][at[1]][0], fields)
                return variant, None
        at = pick((Opcode.ACTIVATE,))
        if at:
            fields = dict(streams[at[0]][at[1]][1], bias=1, bias_offset=2)
            replace(at, Opcode.ACTIVATE, fields)
            return "misaligned offset", None
        streams[engine].insert(index, [Opcode.NOP, {"wait": 1,
                                                    "wait_sem": config.semaphores + 3}])
        return "semaphore index", None
    if fault == Fault.OUT_OF_RANGE:
        if variant == "psum bank":
            at = pick((Opcode.MATMUL,))
            if at:
                replace(at, Opcode.MATMUL, dict(streams[at[0]][at[1]][1],
                                                psum_bank=config.psum_banks))
                return variant, None
        if variant in ("psum bank", "sbuf offset"):
            at = pick((Opcode.ACTIVATE,))
            if at:
                _, size = buffer_geometry(config, Space.SBUF)
                fields = dict(streams[at[0]][at[1]][1])
                out = numerics.format_of_code(fields["out_format"]).bytes
                fields["dst_offset"] = (size // out) * out
                replace(at, Opcode.ACTIVATE, fields)
                return "sbuf offset", None
        at = pick((Opcode.DMA,))
        fields = dict(streams[at[0]][at[1]][1])
        fields["src_stride2"] = (1 << 48) - 1
        replace(at, Opcode.DMA, fields)
        return "dma field too wide", None
    if fault == Fault.DMA_ERROR:
        at = pick((Opcode.DMA,))
        fields = dict(streams[at[0]][at[1]][1])
        code = _DMA_CODES[variant]
        if code == ErrorCode.ZERO_SIZE:
            fields["n1"] = 0
        elif code == ErrorCode.BAD_SPACE:
            fields["dst_space"] = 3
        elif code == ErrorCode.SRC_BOUNDS:
            fields.update(src_space=int(Space.HBM), src_addr=config.hbm_bytes - 1, n0=8,
                          elem_log2=0)
        elif code == ErrorCode.DST_BOUNDS:
            parts, _ = buffer_geometry(config, Space.SBUF)
            fields.update(dst_space=int(Space.SBUF), dst_partition=parts,
                          dst_pstep1=0, dst_pstep2=0)
            fields["src_space"] = int(Space.HBM)
            fields["src_addr"] = layout.data
            fields.update(src_stride1=0, src_stride2=0)
        else:
            fields.update(src_space=int(Space.HBM), dst_space=int(Space.HBM),
                          src_addr=layout.out, dst_addr=layout.out + 1, n0=8, elem_log2=0,
                          src_stride1=8, src_stride2=8, dst_stride1=8, dst_stride2=8)
        replace(at, Opcode.DMA, fields)
        return variant, None
    if fault == Fault.DEADLOCK:
        engine = rng.choice([e for e in Engine if streams[e]] or list(Engine))
        index = rng.randrange(len(streams[engine]) + 1)
        streams[engine].insert(index, [Opcode.NOP, {"wait": 1, "wait_sem": 0,
                                                    "wait_value": 0xFFFF_FFFF}])
        return variant, None
    # FETCH_ERROR
    engine = rng.choice(list(Engine))
    if variant == "misaligned pointer":
        return variant, (engine, engine * _STREAM_BYTES + 8)
    return variant, (engine, config.hbm_bytes - isa.WORD_BYTES)


class _RawOpcode(int):
    """An opcode byte that is no :class:`~opentrn.isa.Opcode` of the engine (or none)."""


def generate(config, seed, *, operations=None, fault=None, keep=None):
    """The random program of ``seed`` for ``config``: a :class:`Program`. ``operations``:
    how many body operations (default drawn, 4 to 40); ``fault``: a :class:`Fault` to inject
    (``None``: a legal program); ``keep``: indices of the body operations to keep (shrinking:
    the others are left out, the rest drawn as before)."""
    rng = random.Random(seed)
    gen = _Generator(config, rng, random.Random(seed + 3))
    count = operations if operations is not None else rng.randint(4, 40)
    body = gen.body(count)
    if keep is not None:
        keep = set(keep)
        body = [op for index, op in enumerate(body) if index in keep]
    ops = gen.prologue() + body + gen.epilogue()
    image = np.zeros(gen.layout.total, np.uint8)
    data = np.frombuffer(random.Random(seed + 1).randbytes(gen.layout.data_bytes), np.uint8)
    image[gen.layout.data:gen.layout.data + gen.layout.data_bytes] = data
    image[gen.layout.out:gen.layout.out + gen.layout.out_bytes] = 0xA5
    streams, accesses, coverage = assemble(config, ops, seed=seed)
    unordered = races(streams, accesses)
    if unordered:
        raise AssertionError(f"seed {seed}: the generator left accesses unordered "
                             f"(engine, index): {unordered[:4]}")
    variant, pointer = "", None
    fault = Fault(fault) if fault is not None else Fault.NONE
    if fault != Fault.NONE:
        variant, pointer = _inject(config, random.Random(seed + 2), streams, gen.layout, fault)
        coverage.add(("fault", fault.name, variant))
    programs = list(_encode(streams, image))
    if pointer is not None:
        engine, programs[engine] = pointer
        if variant == "past the end of HBM":
            # A NOP in the last word of HBM, nothing after it: the fetch leaves HBM.
            image = np.concatenate([image, np.zeros(config.hbm_bytes - len(image), np.uint8)])
            image[-isa.WORD_BYTES:] = np.frombuffer(isa.encode(Opcode.NOP), np.uint8)
    return Program(config=config, seed=seed, hbm=image, programs=tuple(programs),
                   operations=body, fault=fault, fault_variant=variant, coverage=coverage)
