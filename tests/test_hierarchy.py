"""Verilog with one module per distinct block (:mod:`opentrn.hdl.hierarchy`): the modules
and instances of the generated Verilog, the rules a shared block must keep, and that the
Verilog behaves as Amaranth's own elaboration of the same design."""

import random
import re

import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from opentrn import config
from opentrn.hdl import hierarchy
from opentrn.hdl.delay_line import DelayLine
from opentrn.hdl.processing_element import ProcessingElement
from opentrn.sim import runner

from .conftest import require_simulator


def _modules(text):
    """``{module name: count of its instances}`` of a Verilog text."""
    names = re.findall(r"^module \\?([^\s(]+)", text, re.M)
    return {name: len(re.findall(rf"^\s*\\?{re.escape(name)} \S+ \(", text, re.M))
            for name in names}


@pytest.mark.parametrize("size", [4, 8, 32])
def test_one_module_per_distinct_block(size):
    """A ``size x size`` tensor engine: one PE module, one module per array block size
    (two instances each, the halves), one module per delay line size, and nothing that
    grows with the array (16,385 modules at 128 x 128 before)."""
    cfg = config.preset("tiny").replace(pe_rows=size, pe_cols=size, sbuf_partitions=size)
    text = runner.verilog_source(cfg)
    modules = _modules(text)
    pes = [name for name in modules if re.fullmatch(r"tensor_engine_processing_element_[0-9a-f]+",
                                                    name)]
    arrays = [name for name in modules if "processing_element_array" in name
              and "." not in name]
    lines = [name for name in modules if "delay_line" in name and "." not in name]
    assert len(pes) == 1 and modules[pes[0]] == 2          # the halves of a 1 x 2 block
    # Halving rows, then columns, down to 1 x 2: one module per size, the largest is the
    # array itself (one instance), every other two.
    assert len(arrays) == 2 * (size.bit_length() - 1)
    assert sorted(modules[name] for name in arrays) == [1] + [2] * (len(arrays) - 1)
    # A skew line per row and a de-skew line per column: two modules (one per width).
    assert len(lines) == 2 and sum(modules[name] for name in lines) == 2 * size
    assert len(modules) < 40


def test_module_names_follow_the_top():
    """Shared modules are named after the top level, so two designs' Verilog never clash."""
    cfg = config.preset("tiny")
    assert all(name.startswith(("tensor_engine", "\\tensor_engine"))
               for name in _modules(runner.verilog_source(cfg)))
    assert any(name.startswith("core_processing_element")
               for name in _modules(runner.verilog_source(cfg, "core")))


class _Resettable(wiring.Component):
    """A block with a register that has a reset: not shareable."""

    shared_key = ()

    def __init__(self):
        super().__init__({"i": In(4), "o": Out(4)})

    def elaborate(self, platform):
        m = Module()
        register = Signal(4)
        m.d.sync += register.eq(self.i)
        m.d.comb += self.o.eq(register)
        return m


class _RegisterInside(wiring.Component):
    """A block whose register sits in a submodule: its reset port is connected to the
    submodule's, which shows whether it uses it (``_Resettable`` does, a reset-less
    register does not)."""

    def __init__(self, inner):
        self._inner = inner
        self.shared_key = (type(inner).__name__,)
        super().__init__({"i": In(4), "o": Out(4)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self._inner
        m.d.comb += [self._inner.i.eq(self.i), self.o.eq(self._inner.o)]
        return m


class _ResetLess(_Resettable):
    def elaborate(self, platform):
        m = Module()
        register = Signal(4, reset_less=True)
        m.d.sync += register.eq(self.i)
        m.d.comb += self.o.eq(register)
        return m


class _Keyless(_Resettable):
    shared_key = None


class _Top(wiring.Component):
    def __init__(self, block):
        self._block = block
        super().__init__({"i": In(4), "o": Out(4)})

    def elaborate(self, platform):
        block = hierarchy.shared(self._block)       # first: a refusal leaves no Module behind
        m = Module()
        m.submodules.block = block
        m.d.comb += [self._block.i.eq(self.i), self.o.eq(self._block.o)]
        return m


def test_a_shared_block_with_a_reset_is_refused():
    with pytest.raises(hierarchy.SharedBlockError, match="_Resettable: a shared block must "
                                                         "hold no resettable state"):
        hierarchy.convert(_Top(_Resettable()), name="top")


def test_a_submodule_with_a_reset_is_refused_one_without_is_shared():
    with pytest.raises(hierarchy.SharedBlockError, match="_RegisterInside: a shared block "
                                                         "must hold no resettable state"):
        hierarchy.convert(_Top(_RegisterInside(_Resettable())), name="top")
    text = hierarchy.convert(_Top(_RegisterInside(_ResetLess())), name="top")
    assert "module top_" in text


def test_a_shared_block_needs_a_key():
    with pytest.raises(hierarchy.SharedBlockError, match="_Keyless: a shared block must "
                                                         "have a shared_key tuple"):
        hierarchy.convert(_Top(_Keyless()), name="top")


def test_outside_convert_a_shared_block_is_itself():
    """In Amaranth's simulator (no convert running) the block is elaborated as usual."""
    line = DelayLine(width=8, depth=4)
    assert hierarchy.shared(line) is line
    pe = ProcessingElement(in_bits=8, acc_bits=32)
    assert hierarchy.shared(pe) is pe
    for block in (line, pe):
        block._MustUse__silence = True


def test_blocks_with_one_key_become_one_module():
    """Two delay lines of one size: one module, two instances; another size: another."""

    class Two(wiring.Component):
        def __init__(self):
            super().__init__({"i": In(8), "o": Out(8), "p": Out(16)})

        def elaborate(self, platform):
            m = Module()
            lines = [DelayLine(width=8, depth=4), DelayLine(width=8, depth=4),
                     DelayLine(width=16, depth=4)]
            for index, line in enumerate(lines):
                m.submodules[f"line_{index}"] = hierarchy.shared(line)
                m.d.comb += [line.enable.eq(1), line.index.eq(0), line.delay.eq(index)]
            m.d.comb += [lines[0].i.eq(self.i), lines[1].i.eq(lines[0].o),
                         self.o.eq(lines[1].o), lines[2].i.eq(self.i), self.p.eq(lines[2].o)]
            return m

    modules = _modules(hierarchy.convert(Two(), name="two"))
    counts = sorted(count for name, count in modules.items() if "delay_line" in name
                    and "." not in name)
    assert counts == [1, 2]


@pytest.mark.sim
def test_trn3_tensor_engine_verilog_lints_clean(tmp_path):
    """The Trainium3 preset's tensor engine (128 x 128, BF16, FP8, MXFP8 at 4 MACs per PE per
    cycle) as ``opentrn verilog`` writes it: one module per distinct block, every module
    lint-clean on its own (a whole-design lint of 16,384 PEs does not fit in memory)."""
    require_simulator("verilator")
    out = tmp_path / "te.v"
    out.write_text(runner.verilog_source(config.preset("trn3")))
    ok, output = runner.lint(out, "tensor_engine", per_module=True)
    assert ok, output
    assert len(_modules(out.read_text())) < 40


@pytest.mark.sim
def test_per_module_lint_checks_the_connections(tmp_path):
    """A per-module lint sees a parent's connection to a port its child does not have, and
    agrees with the whole-design lint on the design as written."""
    require_simulator("verilator")
    text = runner.verilog_source(config.preset("tiny"))
    good, bad = tmp_path / "good.v", tmp_path / "bad.v"
    good.write_text(text)
    assert runner.lint(good, "tensor_engine")[0]
    assert runner.lint(good, "tensor_engine", per_module=True)[0]
    bad.write_text(text.replace(".x_in(", ".x_misspelt(", 1))
    ok, output = runner.lint(bad, "tensor_engine", per_module=True)
    assert not ok and "x_misspelt" in output


def test_combinational_cycles_through_wide_cells_are_found():
    """The linear cycle check still finds a loop, also through a whole-cell operator."""

    class Loop(wiring.Component):
        def __init__(self):
            super().__init__({"i": In(64), "o": Out(64)})

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.o.eq(self.i + (self.o >> 1))
            return m

    with pytest.raises(Exception, match="Combinational cycle detected"):
        hierarchy.convert(Loop(), name="loop")


def test_memory_contents_are_written_as_amaranth_writes_them():
    """The one-constant memory init (hierarchy._emit_memory_init) gives Amaranth's RTLIL
    text, for zero and for random contents (rows of a signed shape too)."""
    from amaranth import signed
    from amaranth.back import rtlil
    from amaranth.lib.memory import Memory

    rng = random.Random(3)

    class Block(wiring.Component):
        def __init__(self, shape, init):
            self.shape, self.init = shape, init
            super().__init__({"addr": In(4), "data": Out(shape)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.memory = memory = Memory(shape=self.shape, depth=16, init=self.init)
            read = memory.read_port(domain="comb")
            m.d.comb += [read.addr.eq(self.addr), self.data.eq(read.data)]
            return m

    for shape, init in ((24, []), (24, [rng.randrange(1 << 24) for _ in range(16)]),
                        (signed(9), [rng.randrange(-256, 256) for _ in range(16)])):
        amaranths = rtlil.convert(Block(shape, init), name="block")
        with hierarchy._fast_memory_init():
            ours = rtlil.convert(Block(shape, init), name="block")
        assert ours == amaranths and "$meminit_v2" in ours


@pytest.mark.parametrize("block_pes, marked", [(1, "processing_element_[0-9a-f]{8}"),
                                               (64, "processing_element_array_[0-9a-f]{8}"),
                                               (100, "processing_element_array_[0-9a-f]{8}")])
def test_verilator_hier_blocks_are_array_blocks(block_pes, marked, monkeypatch):
    """A hierarchical Verilator build marks the array blocks of the largest size up to
    ``OPENTRN_HIER_BLOCK_PES`` PEs (64: the 8x8 blocks; 100: still those), or the PE; the
    mark is a comment inside that one module."""
    monkeypatch.setenv("OPENTRN_HIER_BLOCK_PES", str(block_pes))
    cfg = config.preset("tiny").replace(pe_rows=16, pe_cols=16, sbuf_partitions=16)
    text = runner.verilog_source(cfg)
    hier = runner._mark_hier_blocks(text, "tensor_engine")
    marked_modules = re.findall(r"^module (\S+)\(.*\);\n  /\*verilator hier_block\*/$", hier,
                                re.M)
    assert len(marked_modules) == 1 and re.fullmatch(rf"tensor_engine_{marked}",
                                                     marked_modules[0])
    body = runner.verilog_modules(hier)[marked_modules[0]]
    if block_pes > 1:
        # An 8x8 block: two 4x8 halves.
        halves = re.findall(r"^\s*(tensor_engine_processing_element_array_\S+) \S+ \(", body,
                            re.M)
        assert len(halves) == 2
    assert hier.replace("\n  /*verilator hier_block*/", "") == text


def test_a_bad_hier_block_size_is_refused(monkeypatch):
    monkeypatch.setenv("OPENTRN_HIER_BLOCK_PES", "eight")
    with pytest.raises(ValueError, match="OPENTRN_HIER_BLOCK_PES=eight: must be a whole number "
                                         "of processing elements, at least 1"):
        runner.hier_block_pes()
