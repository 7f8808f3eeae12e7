"""Verilog with one module per distinct block, however many times it is built.

Amaranth elaborates every instance of a component on its own and emits each as a module of
its own, named after its place in the hierarchy: a 128x128 array becomes 16,384 copies of
the processing element, which take minutes and gigabytes to elaborate and to write. Here a
block that a design builds many times (a row of processing elements, a processing element,
an SRAM partition) is wrapped by :func:`shared`:

* in Amaranth's simulator, and wherever no :func:`convert` is running, it is the component
  itself, elaborated as usual;
* while :func:`convert` writes Verilog, it becomes an ``Instance`` of one module per
  distinct :attr:`shared_key`, elaborated and converted once, the first time the key is met
  (its own shared blocks become modules of their own in turn).

So the generated Verilog has one module per distinct block and its size and generation time
follow the number of distinct blocks, not the number of instances (docs/performance.md,
"Verilog generation").

A shared block must satisfy two rules, both checked here:

* it declares ``shared_key``: a tuple that determines its elaboration completely (its class
  and every constructor argument that changes its logic). Two blocks with one key must
  elaborate to the same logic, since only the first is elaborated;
* it holds no resettable state (its registers are ``reset_less``, or it has none): a
  ``ResetInserter`` around a parent does not reach into an ``Instance``, so a resettable
  register would reset in Amaranth's simulator and not in the Verilog. A block whose module
  has an ``rst`` port is refused.
"""

import contextlib
import contextvars
import hashlib
import re

from amaranth import ClockSignal, Signal
from amaranth.back import rtlil, verilog
from amaranth.hdl import Const, Fragment, Instance, Value, ValueCastable, _nir
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

__all__ = ["shared", "convert", "zero_filled", "SharedBlockError"]


class SharedBlockError(ValueError):
    """A shared block that breaks a rule of :mod:`opentrn.hdl.hierarchy`."""


_LIBRARY = contextvars.ContextVar("opentrn_hdl_library", default=None)

#: The module header lines of Amaranth's RTLIL: ``wire width 8 input 3 signed \x_in``.
_PORT = re.compile(r"^\s*wire (?:width \d+ )?(input|output|inout) \d+\s+(?:signed )?\\(\S+)$")
#: A mention of the reset wire (its declaration is one), not as the name of an instance's
#: port (``connect \rst 1'0`` inside a cell) nor as what a submodule's reset port is
#: given (``connect \rst \rst [0]``: the submodule's own text shows whether it uses it).
_RESET_USE = re.compile(r"(?<!connect )(?<!connect \\rst )\\rst(?![\w$.])")
#: The declaration of a module's reset port, one per module of the text that has a domain.
_RESET_DECLARATION = re.compile(r"^\s*wire width 1 input \d+\s+\\rst$", re.MULTILINE)


def _ports(component):
    """``{port name: (value, direction)}`` of a component's signature, as Amaranth names the
    ports of a top level (``path__joined__by__double_underscores``)."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if isinstance(value, Const):
            raise SharedBlockError(f"{type(component).__name__}: member {'.'.join(map(str, path))} "
                                   "is a constant; a shared block's members must be signals")
        ports["__".join(map(str, path))] = (value, "i" if member.flow == wiring.In else "o")
    return ports


class _Library:
    """The modules of one :func:`convert`: RTLIL text per distinct key, in the order they
    were first met (a block's own shared blocks before it)."""

    def __init__(self, top, progress):
        self.top = top
        self.progress = progress
        self.names = {}             # shared_key -> module name
        self.texts = []             # RTLIL of each module, without the top attribute
        self.clocked = {}           # module name -> it has a clk port
        self.instances = 0

    def _name(self, component, key):
        base = re.sub(r"(?<!^)(?=[A-Z])", "_", type(component).__name__).lower()
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
        # No double underscore: Verilator spells it "___05F" in the names of the blocks of a
        # hierarchical build, which then no longer match their instances.
        return f"{self.top}_{base}_{digest}"

    def instance(self, component):
        key = getattr(component, "shared_key", None)
        if not isinstance(key, tuple):
            component._MustUse__silence = True      # refused: not an unused elaboratable
            raise SharedBlockError(f"{type(component).__name__}: a shared block must have a "
                                   "shared_key tuple (its class and constructor arguments)")
        key = (type(component).__qualname__, *key)
        ports = _ports(component)
        name = self.names.get(key)
        if name is None:
            name = self._name(component, key)
            if self.progress is not None:
                self.progress(f"elaborating {name}")
            text = rtlil.convert(component, name=name,
                                 ports={port: (value, None) for port, (value, _) in ports.items()})
            declared = {match.group(2) for match in map(_PORT.match, text.splitlines())
                        if match}
            # Amaranth gives a module the reset port of its domain even when nothing uses it.
            if "rst" in declared and \
                    len(_RESET_USE.findall(text)) > len(_RESET_DECLARATION.findall(text)):
                raise SharedBlockError(
                    f"{type(component).__name__}: a shared block must hold no resettable "
                    "state (make its registers reset_less): ResetInserter does not reach "
                    "into the Verilog instance of a shared module")
            # Only the design's own top level keeps the top attribute.
            self.texts.append(text.replace("attribute \\top 1\n", "", 1))
            self.names[key] = name
            self.clocked[name] = "clk" in declared
        else:
            component._MustUse__silence = True      # stands for the module already built
        self.instances += 1
        connections = {f"{direction}_{port}": value
                       for port, (value, direction) in ports.items()}
        if self.clocked[name]:
            # The reset port is there but unused (checked above): tie it off.
            connections.update(i_clk=ClockSignal("sync"), i_rst=Const(0, 1))
        return Instance(name, **connections)


def shared(component):
    """``component``, or while :func:`convert` runs an ``Instance`` of its module (emitted
    once per ``component.shared_key``). Add the result as the submodule."""
    library = _LIBRARY.get()
    if library is None:
        return component
    return library.instance(component)


@contextlib.contextmanager
def _collecting(top, progress):
    library = _Library(top, progress)
    token = _LIBRARY.set(library)
    try:
        yield library
    finally:
        _LIBRARY.reset(token)


def _whole_cell(cell):
    """Whether every output bit of ``cell`` depends combinationally on all of its inputs
    (so the cell is one node of the cycle check), rather than bit by bit."""
    if isinstance(cell, _nir.Operator):
        if len(cell.inputs) == 1:
            return cell.operator != "~"
        if len(cell.inputs) == 2:
            return cell.operator not in ("&", "|", "^")
        return False
    return isinstance(cell, _nir.Part | _nir.Matches | _nir.Top)


def _check_comb_cycles(netlist):
    """Amaranth 0.5's combinational cycle check, with the cells whose every output bit
    depends on all their inputs (wide adders, shifts, comparisons, ``word_select``)
    visited once rather than once per output bit: the same verdict and message, in time
    linear in the netlist instead of the square of those cells' widths (minutes for a
    512-bit shifter). The same change as upstream amaranth-lang/amaranth#1632, which no
    0.5 release has."""

    class Cycle:
        def __init__(self, start):
            self.start = start
            self.path = []

    checked, busy = set(), set()

    def traverse(net):
        if net in checked:
            return None
        if net in busy:
            return Cycle(net)
        busy.add(net)
        cycle = None
        siblings = []
        if net.is_const:
            pass
        elif net.is_late:
            cycle = traverse(netlist.connections[net])
            if cycle is not None:
                sig, bit = netlist.late_to_signal[net]
                cycle.path.append((sig, bit, sig.src_loc))
        else:
            cell = netlist.cells[net.cell]
            if _whole_cell(cell):
                # Its other outputs depend on the same inputs: they are settled with this.
                siblings = [other for other in cell.output_nets(net.cell) if other != net]
                busy.update(siblings)
            for source, src_loc in cell.comb_edges_to(net.bit):
                cycle = traverse(source)
                if cycle is not None:
                    cycle.path.append((cell, net.bit, src_loc))
                    break
        if cycle is not None and cycle.start in (net, *siblings):
            message = ["Combinational cycle detected, path:\n"]
            for obj, bit, src_loc in reversed(cycle.path):
                if isinstance(obj, Signal):
                    obj = f"signal {obj.name}"
                elif isinstance(obj, _nir.Operator):
                    obj = f"operator {obj.operator}"
                else:
                    obj = f"cell {obj.__class__.__qualname__}"
                where = "<unknown>:0" if src_loc is None else f"{src_loc[0]}:{src_loc[1]}"
                message.append(f"  {where}: {obj} bit {bit}\n")
            raise _nir.CombinationalCycle("".join(message))
        for done in (net, *siblings):
            busy.discard(done)
            checked.add(done)
        return cycle

    for index, cell in enumerate(netlist.cells):
        for net in cell.output_nets(index):
            assert traverse(net) is None
    for value in netlist.signals.values():
        for net in value:
            assert traverse(net) is None


@contextlib.contextmanager
def _replaced(owner, name, replacement):
    """``owner.name`` is ``replacement`` for one conversion: Amaranth 0.5's netlist builder
    with :func:`_check_comb_cycles`, its RTLIL emitter with :func:`_emit_memory_init`."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


#: The attribute of a memory that :func:`zero_filled` marks.
ZERO_FILL = "opentrn_zero_fill"
#: A marked memory's declaration in Yosys's Verilog: the mark, other attributes, the array.
_ZERO_FILLED = re.compile(
    rf"^([ \t]*)\(\* {ZERO_FILL} = [^*]*\*\)\n(?:[ \t]*\(\*[^\n]*\*\)\n)*"
    r"[ \t]*reg (?:\[(\d+):0\] )?([A-Za-z_][\w$]*) \[(\d+):0\];\n", re.M)


def zero_filled(memory):
    """Mark ``memory`` (an ``amaranth.lib.memory.Memory`` whose contents start at zero) to
    be zeroed by one loop in the Verilog of :func:`convert`. Yosys writes a memory's
    initial contents as one statement per word (2,097,152 lines for the 16 MiB of a
    simulated HBM on an 8-byte bus); the loop is the same contents. Returns ``memory``."""
    if any(memory.init):
        raise ValueError("zero_filled: the memory's initial contents must all be zero")
    memory.attrs[ZERO_FILL] = 1
    return memory


def _write_zero_fills(text):
    """The Verilog with each :func:`zero_filled` memory's initial loop after its
    declaration."""
    def fill(match):
        indent, msb, name, last = match.groups()
        width = int(msb or 0) + 1
        counter = f"{name}__zero_fill"
        return (f"{match.group(0)}{indent}integer {counter};\n"
                f"{indent}initial for ({counter} = 0; {counter} <= {last}; "
                f"{counter} = {counter} + 1) {name}[{counter}] = {width}'d0;\n")
    text, count = _ZERO_FILLED.subn(fill, text)
    if count != text.count(f"(* {ZERO_FILL} ="):
        raise RuntimeError("a zero-filled memory's declaration is not in the form expected "
                           "of Yosys's Verilog: its initial loop cannot be written")
    return text


def _emit_memory_init(self, cell_idx, cell):
    """``ModuleEmitter.emit_memory`` of Amaranth 0.5 with the initial contents written as
    one constant: Amaranth builds it bit by bit, a net object per bit (2,097,152 for one
    SBUF partition of trn3: 4.5 s, against 0.1 s), for the same RTLIL text. A
    :func:`zero_filled` memory gets none here: :func:`convert` writes its loop."""
    if ZERO_FILL in cell.attributes:
        return
    memory_info = self.memories[cell_idx]
    total = cell.width * cell.depth
    contents = 0
    for index, row in enumerate(cell.init):
        contents |= (row & ((1 << cell.width) - 1)) << (index * cell.width)
    self.builder.cell("$meminit_v2", ports={
        "ADDR": self.sigspec(),
        "DATA": f"{total}'{contents:0{total}b}",
        "EN": self.sigspec(_nir.Value.ones(cell.width)),
    }, parameters={
        "MEMID": memory_info.memid,
        "ABITS": 0,
        "WIDTH": cell.width,
        "WORDS": cell.depth,
        "PRIORITY": 0,
    }, src_loc=cell.src_loc)


def _fast_memory_init():
    return _replaced(rtlil.ModuleEmitter, "emit_memory", _emit_memory_init)


def _top_ports(component, ports):
    """``ports`` as ``rtlil.convert`` makes them from a component's signature when ``None``
    (in Amaranth 0.5, ``rtlil.convert`` both elaborates and converts; :func:`convert` does
    the steps one by one to report them)."""
    if ports is not None:
        return ports
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if isinstance(value, Value):
            direction = PortDirection.Input if member.flow == wiring.In \
                else PortDirection.Output
            ports["__".join(map(str, path))] = (value, direction)
    return ports


def convert(component, *, name, ports=None, progress=None):
    """The Verilog text of ``component`` as the top-level module ``name``, each distinct
    shared block (:func:`shared`) a module of its own, instantiated where it is used.
    ``ports`` as ``amaranth.back.verilog.convert`` takes it (``None``: the signature's).
    ``progress`` (a callable taking a string) hears about each step."""
    say = progress if progress is not None else (lambda text: None)
    with _collecting(name, progress) as library, \
            _replaced(_nir.Netlist, "check_comb_cycles", _check_comb_cycles), \
            _fast_memory_init():
        say(f"elaborating {name}")
        fragment = Fragment.get(component, None)
        say(f"elaborated {name} ({len(library.texts)} shared modules); building its netlist")
        top, _ = rtlil.convert_fragment(fragment, _top_ports(component, ports), name)
    say(f"{len(library.texts)} shared modules, {library.instances} instances; "
        "writing Verilog (Yosys)")
    text = "\n".join([top, *library.texts])
    # Amaranth's own Verilog back end runs these same Yosys passes on one module tree.
    return _write_zero_fills(verilog._convert_rtlil_text(text))
