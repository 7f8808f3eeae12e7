"""The DMA engine's execution unit in the core: ``DMA`` instructions become descriptors of
the :class:`~opentrn.hdl.dma.DMA` engine."""

from amaranth import Cat, Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from opentrn.isa import Fault, Opcode, layout

from .dma import QUEUE_DEPTH, SIZE_BITS, _addr_bits, descriptor_layout
from .sequencer import POINTER_BITS

__all__ = ["DmaUnit", "BYTES_BITS", "IN_FLIGHT"]

#: Width of the byte count of one descriptor: ``(n0 << 3) * n1 * n2``.
BYTES_BITS = 3 * SIZE_BITS + 3
#: Descriptors accepted and not yet finished: the DMA's queue, the running one, and one in
#: the hand-over register.
IN_FLIGHT = QUEUE_DEPTH + 2

_SIDE_FIELDS = ("addr", "partition", "stride1", "stride2", "pstep1", "pstep2")


class DmaUnit(wiring.Component):
    """Checks and forwards ``DMA`` instructions (docs/isa.md, "DMA") to the DMA engine.

    A descriptor finishes in order (``dma_done``); each finish retires one instruction.
    ``fault`` is ``OUT_OF_RANGE`` when an address or stride field does not fit the build's
    descriptor (``max(hbm_addr_bits, log2 of the largest buffer)`` bits); the DMA engine itself
    checks everything else and reports a code at the end.

    Members
    -------
    instruction : ``In(stream.Signature(isa.layout(Opcode.DMA)))``
        Checked instructions, in program order.
    check : ``In(isa.layout(Opcode.DMA))``, ``check_valid`` : ``In(1)``
        An instruction to check; ``fault`` : ``Out(3)`` is its :class:`~opentrn.isa.Fault`
        code, combinationally (0 when it is fine). Its byte count is kept from that cycle
        for ``instruction``, which is the instruction checked last (as the sequencer
        hands them out).
    retire : ``Out(1)``
        Pulses when a descriptor finishes (with or without error), in order.
    retire_bytes : ``Out(BYTES_BITS)``, ``retire_pc`` : ``Out(POINTER_BITS)``
        In a ``retire`` cycle: the bytes the finishing descriptor moves, and the address of
        its instruction.
    active : ``Out(1)``
        A descriptor has been accepted and has not finished.
    descriptor : ``Out(stream.Signature(descriptor_layout(config)))``
        To the DMA engine.
    dma_done : ``In(1)``
        The DMA engine's ``done``.
    pc : ``In(POINTER_BITS)``
        The address of the instruction on ``instruction`` (kept with it until it retires).
    """

    def __init__(self, *, config):
        self._config = config
        self._addr_bits = _addr_bits(config)
        super().__init__({
            "instruction": In(stream.Signature(layout(Opcode.DMA))),
            "check": In(layout(Opcode.DMA)),
            "check_valid": In(1),
            "fault": Out(3),
            "retire": Out(1),
            "retire_bytes": Out(BYTES_BITS), "retire_pc": Out(POINTER_BITS),
            "active": Out(1),
            "descriptor": Out(stream.Signature(descriptor_layout(config))),
            "dma_done": In(1), "pc": In(POINTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        check = self.check
        wide = [getattr(check, f"{side}_{name}")
                for side in ("src", "dst") for name in ("addr", "stride1", "stride2")]
        too_wide = Signal()
        m.d.comb += too_wide.eq(sum(value[self._addr_bits:] != 0 for value in wide) != 0)
        with m.If(self.check_valid & (check.opcode == Opcode.DMA) & too_wide):
            m.d.comb += self.fault.eq(Fault.OUT_OF_RANGE)

        source, sink = self.instruction.payload, self.descriptor.payload
        m.d.comb += [
            sink.src_space.eq(source.src_space), sink.dst_space.eq(source.dst_space),
            sink.elem_log2.eq(source.elem_log2),
            sink.n0.eq(source.n0), sink.n1.eq(source.n1), sink.n2.eq(source.n2),
        ]
        for side in ("src", "dst"):
            for name in _SIDE_FIELDS:
                m.d.comb += getattr(getattr(sink, side), name).eq(
                    getattr(source, f"{side}_{name}"))

        # The byte count of an instruction, ``(n0 << elem_log2) * n1 * n2``, is begun from
        # ``check`` in its check cycle (a row's bytes, and the rows: one multiply) and
        # finished at the issue (the other), at least a cycle later: no path holds both
        # multiplies. The sequencer hands out only the instruction it checked last, so the
        # count is that of ``instruction``.
        checked_row_bytes = Signal(SIZE_BITS + 3)
        checked_rows = Signal(2 * SIZE_BITS)
        with m.If(self.check_valid):
            m.d.sync += [checked_row_bytes.eq(check.n0 << check.elem_log2),
                         checked_rows.eq(check.n1 * check.n2)]
        checked_bytes = Signal(BYTES_BITS)
        m.d.comb += checked_bytes.eq(checked_row_bytes * checked_rows)

        # The byte count of each accepted descriptor waits in a FIFO for its finish.
        # Unbuffered: an entry is readable the cycle after it is written, whenever the
        # descriptor finishes.
        m.submodules.sizes = sizes = fifo.SyncFIFO(width=BYTES_BITS + POINTER_BITS,
                                                   depth=IN_FLIGHT)
        m.d.comb += [
            self.descriptor.valid.eq(self.instruction.valid & sizes.w_rdy),
            self.instruction.ready.eq(self.descriptor.ready & sizes.w_rdy),
            sizes.w_en.eq(self.instruction.valid & self.instruction.ready),
            sizes.w_data.eq(Cat(checked_bytes, self.pc)),
            sizes.r_en.eq(self.dma_done),
            self.retire.eq(self.dma_done),
            self.retire_bytes.eq(sizes.r_data[:BYTES_BITS]),
            self.retire_pc.eq(sizes.r_data[BYTES_BITS:]),
            self.active.eq(sizes.level != 0),
        ]
        return m
