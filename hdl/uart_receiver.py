"""An 8N1 UART receiver: the serial line in, a stream of bytes out, with framing and overrun
errors (:class:`UARTReceiver`)."""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from .params import check_positive, refusing

__all__ = ["UARTReceiver", "MIN_DIVISOR"]

#: The fewest clocks per bit the receiver takes: it confirms a start bit half a bit after the
#: falling edge and samples every bit at its middle, which needs a middle at least a cycle
#: from either edge of the bit (the synchroniser's two cycles delay every edge alike).
MIN_DIVISOR = 4


class UARTReceiver(wiring.Component):
    """An 8N1 UART receiver (one start bit, 8 data bits LSB first, one stop bit; no parity),
    ``divisor`` clocks per bit.

    ``rx`` passes through a two-flip-flop synchroniser (it comes from a pin, asynchronous to
    the clock). A falling edge starts a byte; the start bit is confirmed ``divisor // 2``
    cycles later (still low; else it was a glitch and is ignored), and every data bit and the
    stop bit are sampled ``divisor`` cycles apart from there, at their middles. The byte is
    offered on ``output`` at the stop bit's middle, when the receiver is already watching for
    the next start bit, so back-to-back bytes are received whole.

    A low stop bit is a framing error: ``framing_error`` pulses, the byte is dropped, and the
    receiver waits for the line to go high again before it looks for a start bit (so a break,
    the line held low, is one error, not one per byte time). A byte complete while the
    previous one is still on ``output`` untaken is dropped and ``overrun`` pulses.

    Members
    -------
    rx : ``In(1)``
        The serial line, idle high.
    output : ``Out(stream.Signature(8))``
        The bytes received. ``valid`` is a register and the byte is held until taken.
    framing_error : ``Out(1)``
        Pulses for one cycle when a byte's stop bit is low (the byte is dropped).
    overrun : ``Out(1)``
        Pulses for one cycle when a byte arrives while ``output`` still holds the one
        before (the new byte is dropped).
    """

    def __init__(self, *, divisor):
        with refusing(self):
            check_positive(divisor=divisor)
            if divisor < MIN_DIVISOR:
                raise ValueError(f"divisor={divisor}: must be at least {MIN_DIVISOR} clocks "
                                 "per bit")
        self._divisor = divisor
        super().__init__({
            "rx": In(1, init=1),
            "output": Out(stream.Signature(8)),
            "framing_error": Out(1),
            "overrun": Out(1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor
        line = Signal(init=1)
        m.submodules.synchroniser = FFSynchronizer(self.rx, line, init=1, stages=2)

        count = Signal(range(divisor))
        bit = Signal(range(8))
        shift = Signal(8)
        output = self.output

        # Pulses are one cycle long; a transfer empties the output (both may be overridden
        # below in the same cycle).
        m.d.sync += [self.framing_error.eq(0), self.overrun.eq(0)]
        with m.If(output.valid & output.ready):
            m.d.sync += output.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += count.eq(divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(line):
                    m.next = "IDLE"          # high again at mid-bit: a glitch
                with m.Else():
                    m.d.sync += [count.eq(divisor - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Else():
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), count.eq(divisor - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(~line):
                    m.d.sync += self.framing_error.eq(1)
                    m.next = "BREAK"
                with m.Else():
                    with m.If(output.valid & ~output.ready):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [output.payload.eq(shift), output.valid.eq(1)]
                    m.next = "IDLE"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m
