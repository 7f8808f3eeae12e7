"""Read VCD and FST waveforms from the terminal: the engine behind ``opentrn wave``.

Built on :mod:`vcdvcd`, so it reads the VCDs written by Icarus, Verilator (under
cocotb) and Amaranth's own simulator; a file named ``*.fst`` is read as FST (Icarus
writes one for ``--waves FILE.fst``) with :mod:`pywellen`, with the same names, cycles
and values as the VCD of the same run.

Signal names are full hierarchical names joined with ``.``, in declaration order
(``tb.tensor_engine.U$0.clk``). A trailing bit range such as ``[7:0]``, which
Icarus and Verilator append to vector names, is dropped. The same net dumped
under several scopes is listed once per scope.

Cycle convention
----------------
The clock is the first signal whose last name component is ``clk`` unless
``--clock REGEX`` picks another (the first 1-bit signal it matches). A rising
edge is a change to ``1`` from ``0``, ``x`` or ``z``; the clock's first dumped
value is not an edge, since nothing precedes it. Changes at the same VCD time
are collapsed to the last one, so zero-time glitches do not count.

Cycle ``c`` runs from rising edge ``c`` (``c = 0`` is the first rising edge) to
rising edge ``c + 1``. Its ``time`` is the VCD time of rising edge ``c``. Its
value for a signal is what a flip-flop would sample at the END of the cycle:
the last value change at a time strictly before rising edge ``c + 1``. The last
cycle has no next edge, so it shows the signal's final value. A register
therefore shows the value it took at edge ``c``: a counter that counts from 0
with no reset reads 1 in cycle 0.

A VCD is checked before vcdvcd reads it (vcdvcd skips what it does not expect): a
declaration not closed by ``$end``, a file that ends before ``$enddefinitions``, an unknown
section, a malformed ``$var`` or time, a value change of an identifier no ``$var``
declares: each is refused with its line number. An FST that pywellen cannot read (cut
short, corrupt, not an FST) is refused with pywellen's reason.

Values are unsigned ints by default and two's-complement ints with ``signed``.
If any bit is ``x`` or ``z`` the value is ``None`` (``x`` in the table, ``null``
in JSON). ``real`` variables decode to floats. vcdvcd drops the values of
``string`` variables (Amaranth dumps enums that way), so they always read as
``x``.
"""

import argparse
import bisect
import gzip
import json
import re
import struct
import sys
from collections import Counter
from dataclasses import dataclass

from vcdvcd import VCDVCD

__all__ = ["WaveError", "add_arguments", "command", "cycle_table", "list_signals"]


class WaveError(Exception):
    """Bad input: missing or malformed file, bad regex, no clock, empty match, bad window."""


# Icarus and Verilator write `$var wire 8 # q [7:0] $end`; vcdvcd glues that into `q[7:0]`.
_RANGE = re.compile(r"\[\d+:\d+\]$")


@dataclass(frozen=True)
class _Var:
    name: str  # what users see and match regexes against
    ref: str  # vcdvcd's reference, needed to ask vcdvcd for this variable
    width: int
    kind: str  # VCD var type: wire, reg, real, string, ...


#: Sections of free text up to their `$end`.
_TEXT_SECTIONS = {"$date", "$version", "$timescale", "$comment"}
#: Keywords of the value-change part (IEEE 1364-2005, 18.2.3).
_DUMP_KEYWORDS = {"$dumpvars", "$dumpall", "$dumpon", "$dumpoff", "$end"}


def _tokens(f):
    for line_number, line in enumerate(f, 1):
        for token in line.split():
            yield line_number, token


def _check_vcd(path, *, values=True):
    """Read the VCD's structure before vcdvcd does, which drops what it does not expect:
    every declaration closed by `$end`, `$var TYPE SIZE ID NAME`, `$enddefinitions`
    reached, no unknown section; with ``values``, every value change is one and names a
    declared identifier. Raises :class:`WaveError` naming the line."""
    where = f"file {str(path)!r}"
    declared = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        tokens = _tokens(f)
        line = 0

        def statement(keyword, start):
            """The tokens up to the keyword's `$end`."""
            body = []
            for _, token in tokens:
                if token == "$end":
                    return body
                body.append(token)
            raise WaveError(f"{where}: line {start}: {keyword} is not closed by $end (the "
                            "file ends inside its declarations)")

        for line, token in tokens:
            if token in _TEXT_SECTIONS or token in ("$scope", "$upscope"):
                statement(token, line)
            elif token == "$var":
                body = statement(token, line)
                if len(body) < 4 or not body[1].isdigit():
                    raise WaveError(f"{where}: line {line}: `$var {' '.join(body)} $end` is "
                                    "not `$var TYPE SIZE ID NAME $end`")
                declared.add(body[2])
            elif token == "$enddefinitions":
                statement(token, line)
                break
            elif token.startswith("$"):
                raise WaveError(f"{where}: line {line}: unknown section {token}")
            else:
                raise WaveError(f"{where}: line {line}: {token!r} outside any declaration")
        else:
            raise WaveError(f"{where}: the file ends inside its declarations (line {line}, "
                            "no $enddefinitions)")
        if not values:
            return
        for line, token in tokens:
            first = token[0]
            if first == "#":
                if not token[1:].isdigit():
                    raise WaveError(f"{where}: line {line}: {token!r} is not a time")
                continue
            if first == "$":
                if token == "$comment":
                    statement(token, line)
                elif token not in _DUMP_KEYWORDS:
                    raise WaveError(f"{where}: line {line}: unknown section {token}")
                continue
            if first in "01xzXZ":
                ident = token[1:]
            elif first in "bBrRsS":          # vectors, reals, strings (Amaranth's enums)
                ident = next(tokens, (line, None))[1]
                if ident is None:
                    raise WaveError(f"{where}: line {line}: the file ends inside the value "
                                    f"change {token!r}")
            else:
                raise WaveError(f"{where}: line {line}: {token!r} is not a value change")
            if ident not in declared:
                raise WaveError(f"{where}: line {line}: a value change of identifier "
                                f"{ident!r}, which no $var declares")


def _open_vcd(path, **kwargs) -> VCDVCD:
    path = str(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096).lstrip()
    except OSError as exc:
        raise WaveError(f"file {path!r}: {exc.strerror or exc}") from None
    # Every VCD starts with a `$keyword` section; checking first spares vcdvcd a
    # whole-file scan of something that is not a VCD.
    if not head.startswith("$"):
        raise WaveError(f"file {path!r}: not a VCD file (does not start with a $ section)")
    _check_vcd(path, values=not kwargs.get("only_sigs", False))
    try:
        return VCDVCD(path, **kwargs)
    except OSError as exc:
        raise WaveError(f"file {path!r}: {exc.strerror or exc}") from None
    except Exception as exc:  # vcdvcd raises bare Exception/ValueError on bad syntax
        raise WaveError(f"file {path!r}: not a readable VCD file ({exc})") from None


def _header(path) -> list[_Var]:
    if _is_fst(path):
        return _fst_header(path)
    # only_sigs stops at $enddefinitions, so this is cheap even for huge dumps.
    vcd = _open_vcd(path, only_sigs=True)
    seen: set[str] = set()
    refs: list[str] = []
    for ref in vcd.signals:
        if ref not in seen:  # vcdvcd repeats a reference declared twice
            seen.add(ref)
            refs.append(ref)
    if not refs:
        raise WaveError(f"file {str(path)!r}: not a VCD file (no $var declarations)")
    stripped = [_RANGE.sub("", ref) for ref in refs]
    counts = Counter(stripped)
    out = []
    for ref, name in zip(refs, stripped, strict=True):
        if counts[name] > 1:
            name = ref  # keep the range where dropping it would merge two variables
        sig = vcd.data[vcd.references_to_ids[ref]]
        try:
            width = int(sig.size)
        except ValueError:
            width = 0
        out.append(_Var(name, ref, width, sig.var_type))
    return out


def _changes(path, refs) -> dict[str, list[tuple[int, str]]]:
    """``{ref: [(time, raw value)]}`` of the variables ``refs`` (``_Var.ref``), each raw
    value a VCD value without its type letter (``1010``, ``x``, ``1.5``)."""
    if _is_fst(path):
        return _fst_changes(path, refs)
    vcd = _open_vcd(path, signals=refs)
    return {ref: vcd[ref].tv for ref in refs}


# -- FST, through pywellen ----------------------------------------------------------------------

def _is_fst(path) -> bool:
    return str(path).lower().endswith(".fst")


def _pywellen_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is pywellen refusing a file: a ``RuntimeError``, or a Rust panic
    (``pyo3_runtime.PanicException``, a ``BaseException`` like ``KeyboardInterrupt``)."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _reason(exc: BaseException) -> str:
    """pywellen's message, on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _open_fst(path):
    import pywellen
    path = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(1)
    except OSError as exc:
        raise WaveError(f"file {path!r}: {exc.strerror or exc}") from None
    # An FST starts with its header block (type 0); pywellen panics on some other files.
    if head != b"\x00":
        raise WaveError(f"file {path!r}: not an FST file (it does not start with an FST "
                        "header block)")
    try:
        waveform = pywellen.Waveform(path)
    except BaseException as exc:
        if not _pywellen_failed(exc):
            raise
        raise WaveError(f"file {path!r}: not a readable FST file ({_reason(exc)})") from None
    if waveform.file_format != "FST":
        raise WaveError(f"file {path!r}: not an FST file (pywellen reads it as "
                        f"{waveform.file_format}); a VCD must be named *.vcd")
    return waveform


def _fst_variables(waveform) -> list[tuple[str, object]]:
    """``[(name, pywellen Var)]`` in pywellen's order, each named as in a VCD: scope names
    joined by ``.``, an escaped name with an index (``\\a[0]``) whole (pywellen makes
    ``\\a`` an array scope of its own, holding ``[0]``)."""
    found = [(var.name, var) for var in waveform.vars()]

    def walk(scope, prefix):
        name = prefix + scope.name + ("" if scope.scope_type == "vhdl_array" else ".")
        found.extend((name + var.name, var) for var in scope.vars())
        for child in scope.scopes():
            walk(child, name)

    for scope in waveform.scopes():
        walk(scope, "")
    return found


#: FST block types (fstapi.h): the hierarchy, gzip-compressed, and its tags.
_FST_HIERARCHY = 4
_FST_ATTRIBUTE_BEGIN, _FST_ATTRIBUTE_END, _FST_SCOPE, _FST_UPSCOPE = 252, 253, 254, 255


def _fst_declaration_order(path) -> dict[str, int] | None:
    """``{name: position}`` of the variables in the order the FST declares them, named as
    :func:`_header` names a VCD's: the order a VCD of the same run lists them, which
    pywellen's hierarchy does not keep (it lists ``\\a[0]``, in an array scope, after
    the module's other variables). ``None`` when the hierarchy block is not the gzip one
    that Icarus writes, or cannot be read: the order is then pywellen's."""
    try:
        with open(path, "rb") as f:
            while header := f.read(9):
                kind, length = header[0], struct.unpack(">Q", header[1:])[0]
                if kind == _FST_HIERARCHY:
                    data = gzip.decompress(f.read(length - 8)[8:])
                    break
                f.seek(length - 8, 1)
            else:
                return None
        return _parse_fst_hierarchy(data)
    except (OSError, EOFError, ValueError, IndexError, struct.error, gzip.BadGzipFile):
        return None


def _parse_fst_hierarchy(data: bytes) -> dict[str, int]:
    position = 0

    def byte():
        nonlocal position
        position += 1
        return data[position - 1]

    def text():
        nonlocal position
        end = data.index(b"\0", position)
        value, position = data[position:end].decode(errors="replace"), end + 1
        return value

    def varint():
        value = shift = 0
        while True:
            part = byte()
            value |= (part & 0x7F) << shift
            shift += 7
            if part < 0x80:
                return value

    scopes, order = [], {}
    while position < len(data):
        tag = byte()
        if tag == _FST_SCOPE:
            byte()
            scopes.append(text())
            text()                                   # the component (module) name
        elif tag == _FST_UPSCOPE:
            scopes.pop()
        elif tag == _FST_ATTRIBUTE_BEGIN:
            byte(), byte(), text(), varint()
        elif tag == _FST_ATTRIBUTE_END:
            pass
        else:                                        # a variable: its tag is its type
            byte()
            name = text()
            varint(), varint()                       # its length and alias
            # As vcdvcd joins `q [7:0]` and _header then drops the range.
            full = ".".join([*scopes, name.replace(" ", "")])
            for key in (full, _RANGE.sub("", full)):
                order.setdefault(key, len(order))
    return order


def _fst_header(path) -> list[_Var]:
    waveform = _open_fst(path)
    variables = _fst_variables(waveform)
    order = _fst_declaration_order(path)
    if order:
        variables.sort(key=lambda item: order.get(item[0], len(order)))
    out, seen = [], set()
    for name, var in variables:
        if name in seen:                             # as vcdvcd keeps a name declared twice once
            continue
        seen.add(name)
        kind = "real" if var.is_real else "string" if var.is_string else var.var_type.lower()
        # pywellen gives a real no width; Icarus declares it 1 bit wide in a VCD.
        out.append(_Var(name, name, var.bitwidth or 1, kind))
    if not out:
        raise WaveError(f"file {str(path)!r}: an FST file with no variables")
    return out


def _raw(value) -> str:
    """A pywellen value as a VCD raw value: ints in binary, floats, bit strings with x/z."""
    if isinstance(value, int):
        return format(value, "b")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _fst_changes(path, refs) -> dict[str, list[tuple[int, str]]]:
    waveform = _open_fst(path)
    variables = {}
    for name, var in _fst_variables(waveform):
        variables.setdefault(name, var)
    changes = {}
    for ref in refs:
        var = variables[ref]
        if var.is_string:
            changes[ref] = []                        # x throughout, as vcdvcd reads strings
            continue
        try:
            changes[ref] = [(time, _raw(value)) for time, value in var.signal]
        except BaseException as exc:
            if not _pywellen_failed(exc):
                raise
            raise WaveError(f"file {str(path)!r}: the values of {ref} cannot be read "
                            f"({_reason(exc)})") from None
    return changes


def _compile(option: str, pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise WaveError(f"{option} {pattern!r}: bad regex: {exc}") from None


def _select(variables: list[_Var], patterns) -> list[_Var]:
    """Variables matched by any pattern, grouped by pattern, each kept once."""
    chosen: list[_Var] = []
    names: set[str] = set()
    for pattern in patterns:
        rx = _compile("--signal", pattern)
        hits = [v for v in variables if rx.search(v.name)]
        if not hits:
            raise WaveError(
                f"--signal {pattern!r}: matches no signal; run with --list to see the names"
            )
        for v in hits:
            if v.name not in names:
                names.add(v.name)
                chosen.append(v)
    return chosen


def _find_clock(variables: list[_Var], clock: str | None) -> _Var:
    if clock is None:
        for v in variables:
            if v.name.rsplit(".", 1)[-1] == "clk":
                return v
        raise WaveError(
            "--clock: no signal named 'clk' in the dump; pass --clock REGEX (see --list)"
        )
    rx = _compile("--clock", clock)
    hits = [v for v in variables if rx.search(v.name)]
    if not hits:
        raise WaveError(f"--clock {clock!r}: matches no signal; run with --list to see the names")
    for v in hits:
        if v.width == 1:
            return v
    raise WaveError(f"--clock {clock!r}: matches only multi-bit signals ({hits[0].name}, ...)")


def _rising_edges(tv: list[tuple[int, str]]) -> list[int]:
    edges = []
    prev = None
    for i, (t, value) in enumerate(tv):
        if i + 1 < len(tv) and tv[i + 1][0] == t:
            continue  # a later change at the same time wins
        value = value.lower()
        if value == "1" and prev is not None and prev != "1":
            edges.append(t)
        prev = value
    return edges


def _decode(raw: str | None, var: _Var, signed: bool) -> int | float | None:
    if raw is None:
        return None
    if var.kind == "real":
        try:
            return float(raw)
        except ValueError:
            return None
    bits = raw.lower()
    if not bits or bits.strip("01"):
        return None  # any x/z (or junk) bit makes the whole value unknown
    # VCD drops leading zeros (`b1` for an 8-bit 1), and int() zero-extends likewise.
    value = int(bits, 2)
    if signed and var.width > 0 and value >> (var.width - 1) & 1:
        value -= 1 << var.width
    return value


def list_signals(path) -> list[tuple[str, int]]:
    """``(full name, width)`` of every variable in the VCD, in declaration order."""
    return [(v.name, v.width) for v in _header(path)]


def cycle_table(path, patterns, *, start=None, stop=None, clock=None, signed=False) -> dict:
    """Per-cycle values of the signals matching ``patterns`` (see the module docstring).

    ``start``/``stop`` are inclusive cycle numbers. Returns
    ``{"clock": name, "signals": [names], "rows": [{"cycle", "time", "values"}]}``
    with values as ints (floats for ``real`` variables) or ``None`` for x/z.
    Raises :class:`WaveError` on bad input; messages name the CLI option at fault.
    """
    table, _ = _cycle_table(path, patterns, start, stop, clock, signed)
    return table


def _cycle_table(path, patterns, start, stop, clock, signed) -> tuple[dict, list[_Var]]:
    if isinstance(patterns, str):
        patterns = [patterns]
    patterns = list(patterns)
    if not patterns:
        raise WaveError("--signal: no REGEX given; pass --signal REGEX (see --list)")
    if start is not None and start < 0:
        raise WaveError(f"--from {start}: cycle numbers start at 0")
    if stop is not None and stop < 0:
        raise WaveError(f"--to {stop}: cycle numbers start at 0")
    if start is not None and stop is not None and start > stop:
        raise WaveError(f"--from {start} is after --to {stop}")

    variables = _header(path)
    chosen = _select(variables, patterns)
    clk = _find_clock(variables, clock)

    # Second pass loads value changes of the needed variables only.
    wanted = list(dict.fromkeys([clk.ref, *(v.ref for v in chosen)]))
    changes = _changes(path, wanted)

    edges = _rising_edges(changes[clk.ref])
    if not edges:
        raise WaveError(f"--clock: clock {clk.name!r} has no rising edges in the dump")
    last = len(edges) - 1
    first = 0 if start is None else start
    final = last if stop is None else min(stop, last)
    if first > last:
        raise WaveError(f"--from {first}: the dump has only cycles 0..{last}")

    columns = []
    for v in chosen:
        tv = changes[v.ref]
        times = [t for t, _ in tv]
        raws = []
        for c in range(first, final + 1):
            if c == last:
                raws.append(tv[-1][1] if tv else None)
                continue
            # Last change strictly before the next rising edge: what a flop samples there.
            i = bisect.bisect_left(times, edges[c + 1]) - 1
            raws.append(tv[i][1] if i >= 0 else None)
        columns.append([_decode(raw, v, signed) for raw in raws])

    rows = []
    for k, c in enumerate(range(first, final + 1)):
        values = {v.name: col[k] for v, col in zip(chosen, columns, strict=True)}
        rows.append({"cycle": c, "time": edges[c], "values": values})
    table = {"clock": clk.name, "signals": [v.name for v in chosen], "rows": rows}
    return table, chosen


def _fmt(value, width: int, hexa: bool) -> str:
    if value is None:
        return "x"
    if hexa and isinstance(value, int):
        digits = max(1, (width + 3) // 4)
        sign = "-" if value < 0 else ""
        return f"{sign}0x{abs(value):0{digits}x}"
    return str(value)


def _table(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    """Columns padded to fit; the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``opentrn wave``'s arguments to ``parser``."""
    parser.add_argument("file", help="VCD file (Icarus, Verilator or Amaranth), or FST file "
                        "(named *.fst)")
    parser.add_argument(
        "--list",
        action="store_true",
        help="list signals (full name, width); with --signal, only the matching ones",
    )
    parser.add_argument(
        "--signal",
        dest="signals",
        action="append",
        default=[],
        metavar="REGEX",
        help="show signals whose full name matches REGEX (re.search); repeatable",
    )
    parser.add_argument(
        "--from", dest="start", type=int, metavar="CYCLE", help="first cycle shown (inclusive)"
    )
    parser.add_argument(
        "--to", dest="stop", type=int, metavar="CYCLE", help="last cycle shown (inclusive)"
    )
    parser.add_argument(
        "--clock",
        metavar="REGEX",
        help="clock signal (first 1-bit match); default: the first signal named clk",
    )
    parser.add_argument(
        "--signed", action="store_true", help="decode values as two's-complement signed ints"
    )
    parser.add_argument(
        "--hex", action="store_true", help="show values in hex (table only; JSON keeps numbers)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--gtkw", nargs="?", const="", metavar="OUT.gtkw",
        help="write a GTKWave save file that opens FILE on the signals that explain a run, "
        "grouped per engine, with markers at the start and the interrupt (default: beside "
        "FILE, its suffix replaced by .gtkw)",
    )


def _run(args: argparse.Namespace) -> str:
    signals = list(getattr(args, "signals", None) or [])
    if args.list:
        variables = _header(args.file)
        if signals:
            variables = _select(variables, signals)
        if args.json:
            return json.dumps([{"name": v.name, "width": v.width} for v in variables], indent=2)
        rows = [[v.name, str(v.width)] for v in variables]
        return _table(["signal", "width"], rows, left=1)

    if not signals:
        raise WaveError("--signal: no REGEX given; pass --signal REGEX (or --list for the names)")
    table, chosen = _cycle_table(args.file, signals, args.start, args.stop, args.clock, args.signed)
    if args.json:
        return json.dumps(table, indent=2)
    header = ["cycle", "time", *table["signals"]]
    rows = [
        [str(row["cycle"]), str(row["time"])]
        + [_fmt(row["values"][v.name], v.width, args.hex) for v in chosen]
        for row in table["rows"]
    ]
    return _table(header, rows)


def command(args: argparse.Namespace, run=None) -> int:
    """Run ``opentrn wave``: print to stdout, return the exit status (2 on bad input).
    ``run``: what makes the output instead of the listing or table (``--gtkw``:
    :func:`opentrn.sim.gtkw.run`), with the same handling of bad input."""
    try:
        out = (run or _run)(args)
    except WaveError as exc:
        print(f"opentrn wave: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
