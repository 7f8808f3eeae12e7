"""An 8N1 UART transmitter: a stream of bytes in, the serial line out
(:class:`UARTTransmitter`)."""

from amaranth import C, Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .params import check_positive, refusing

__all__ = ["UARTTransmitter"]

#: Bits of a frame: start, 8 data bits, stop.
FRAME_BITS = 10


class UARTTransmitter(wiring.Component):
    """An 8N1 UART transmitter (one start bit, 8 data bits LSB first, one stop bit; no
    parity), ``divisor`` clocks per bit.

    A byte is taken from ``input`` when the line is idle or in the last cycle of a stop bit,
    so bytes offered back to back leave back to back, each frame exactly ``10 * divisor``
    cycles. ``tx`` is a flip-flop (high at reset and while idle): it can drive a pin
    directly.

    Members
    -------
    input : ``In(stream.Signature(8))``
        The bytes to send.
    tx : ``Out(1)``
        The serial line, idle high.
    """

    def __init__(self, *, divisor):
        with refusing(self):
            check_positive(divisor=divisor)
        self._divisor = divisor
        super().__init__({
            "input": In(stream.Signature(8)),
            "tx": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor
        # The frame being sent, next bit at 0; ones shift in behind it (the idle level).
        shift = Signal(FRAME_BITS, init=(1 << FRAME_BITS) - 1)
        left = Signal(range(FRAME_BITS + 1))        # bits still to finish
        count = Signal(range(divisor))              # cycles left in the current bit
        ready = Signal()
        m.d.comb += [
            self.tx.eq(shift[0]),
            ready.eq((left == 0) | ((left == 1) & (count == 0))),
            self.input.ready.eq(ready),
        ]
        with m.If(left != 0):
            with m.If(count == 0):
                m.d.sync += [shift.eq(Cat(shift[1:], C(1, 1))), left.eq(left - 1),
                             count.eq(divisor - 1)]
            with m.Else():
                m.d.sync += count.eq(count - 1)
        with m.If(self.input.valid & ready):
            m.d.sync += [shift.eq(Cat(C(0, 1), self.input.payload, C(1, 1))),
                         left.eq(FRAME_BITS), count.eq(divisor - 1)]
        return m
