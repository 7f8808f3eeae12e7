"""The semaphore file: the counters through which the engines' instruction streams
synchronise (docs/isa.md, "Streams")."""

from amaranth import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SemaphoreFile", "VALUE_BITS", "INDEX_BITS"]

#: Width of one semaphore (docs/isa.md: 32-bit counters that only increment).
VALUE_BITS = 32
#: Width of a semaphore index in an instruction.
INDEX_BITS = 8


class SemaphoreFile(wiring.Component):
    """``config.semaphores`` counters, zero after reset (the core resets them at start), each
    incremented by every ``signal`` port that names it in a cycle (several in one cycle all
    count); the new values are seen from the next cycle.

    Members
    -------
    signal : ``In(data.StructLayout({"valid": 1, "index": INDEX_BITS})).array(ports)``
        Increment requests, one per sequencer; an index ``>= semaphores`` never arrives (the
        sequencers refuse it).
    values : ``Out(data.ArrayLayout(VALUE_BITS, semaphores))``
        The counters.
    """

    def __init__(self, *, config, ports):
        if not isinstance(ports, int) or ports < 1:
            raise ValueError(f"ports must be a positive integer, not {ports!r}")
        self._count = config.semaphores
        self._ports = ports
        super().__init__({
            "signal": In(data.StructLayout({"valid": 1, "index": INDEX_BITS})).array(ports),
            "values": Out(data.ArrayLayout(VALUE_BITS, config.semaphores)),
        })

    def elaborate(self, platform):
        m = Module()
        for index in range(self._count):
            increment = sum(request.valid & (request.index == index)
                            for request in self.signal)
            m.d.sync += self.values[index].eq(self.values[index] + increment)
        return m
