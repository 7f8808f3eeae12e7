"""A one-entry skid buffer: a stream passes through it without delay, and the producer's
``ready`` is a flip-flop, so a consumer's handshake does not reach the producer's logic."""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """``o`` shows ``i``'s payload in the cycle it is offered (no latency) while the buffer is
    empty; a transfer into the buffer that ``o`` does not take in the same cycle is kept in
    its register and shown from there until ``o`` takes it. ``i.ready`` is "empty", a
    register: the producer advances on its own valid and that register, never on ``o.ready``.

    Throughput is one transfer per cycle: when ``o`` takes the kept payload, the producer's
    next one is offered through the bypass in the next cycle. ``o.valid`` never depends on
    ``o.ready``, and once offered, ``o``'s payload holds until it is taken (as AXI4 requires
    of an address channel). ``i`` need not hold an offer: the buffer takes every offer made
    while it is empty.

    The DMA engine puts one between each AXI4 address walker and its channel (``hdl/dma.py``):
    the burst registers then no longer wait for the interconnect's ``arready`` or ``awready``
    (docs/fpga.md, "Timing"). No cycle changes.

    Members
    -------
    i : ``In(stream.Signature(layout))``
        The producer's stream; ``i.ready`` is a register.
    o : ``Out(stream.Signature(layout))``
        The same transfers, in order: ``i``'s payload while the buffer is empty, else the
        kept one.
    """

    def __init__(self, *, layout):
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        full = Signal()
        kept = Signal.like(self.i.payload, reset_less=True)
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(full | self.i.valid),
            self.o.payload.eq(kept),
        ]
        with m.If(~full):
            m.d.comb += self.o.payload.eq(self.i.payload)
            # Every offer is taken while empty: kept if ``o`` does not take it now.
            m.d.sync += kept.eq(self.i.payload)
            with m.If(self.i.valid & ~self.o.ready):
                m.d.sync += full.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += full.eq(0)
        return m
