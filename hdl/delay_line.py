"""A delay line of programmable length that advances with an enable: the skew and de-skew
of the systolic array; and :func:`delayed`, a short fixed delay as a chain of registers."""

from amaranth import Module, Mux, Signal, Value, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

__all__ = ["DelayLine", "delayed"]


def delayed(m, value, count, *, name, enable=None, reset_less=True):
    """``value`` through ``count`` registers in ``m`` (``value`` itself for 0), named
    ``{name}_stage0`` on, that advance while ``enable`` is high (every cycle without one):
    the pipeline stages' short delays, where :class:`DelayLine` serves long ones."""
    value = Value.cast(value)
    for stage in range(count):
        register = Signal(value.shape(), name=f"{name}_stage{stage}", reset_less=reset_less)
        if enable is None:
            m.d.sync += register.eq(value)
        else:
            with m.If(enable):
                m.d.sync += register.eq(value)
        value = register
    return value


class DelayLine(wiring.Component):
    """``o`` is ``i`` as it was ``delay`` advances ago (``delay = 0``: ``i`` itself), for a
    ``delay`` of up to ``depth - 1``.

    A circular buffer of ``depth`` words rather than a chain of registers: an advance writes
    ``i`` at ``index`` (the caller's count of advances, modulo ``depth``, shared by all the
    lines that advance together) and ``o`` reads the word written ``delay`` advances ago,
    ``index - delay``. So every line of one width and depth is the same block whatever its
    delay (``delay`` is an input, a constant where it is instantiated), one Verilog module
    (:mod:`opentrn.hdl.hierarchy`), and a simulator moves one word per advance instead of
    shifting ``delay`` registers. The words written before the first ``depth`` advances are
    zero; the buffer has no reset (it holds data only; whoever reads it knows which outputs
    are valid).

    For a ``delay`` of 1 or more ``o`` is a register: the buffer's read port is synchronous
    and reads, one cycle ahead, the word the next cycle shows (``index + 1 - delay``,
    transparent to this cycle's write), holding while ``enable`` is low. On an FPGA the
    array's first multiplier then starts from a flip-flop, not from a LUT RAM behind an
    address subtraction (docs/fpga.md, "Timing").

    Members
    -------
    enable : ``In(1)``
        Advance: write ``i`` this cycle (the caller increments ``index``).
    index : ``In(range(depth))``
        Where this cycle's advance writes: advances so far, modulo ``depth``.
    delay : ``In(range(depth))``
        The delay in advances.
    i : ``In(unsigned(width))``
    o : ``Out(unsigned(width))``
        ``i`` delayed (combinational from ``i`` when ``delay`` is 0).
    """

    def __init__(self, *, width, depth):
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            self._MustUse__silence = True     # refused, so it is not an unused elaboratable
            raise ValueError(f"width={width!r}: must be a positive integer")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2 \
                or depth & (depth - 1):
            self._MustUse__silence = True
            raise ValueError(f"depth={depth!r}: must be a power of two, at least 2")
        self._width, self._depth = width, depth
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (width, depth)
        super().__init__({
            "enable": In(1),
            "index": In(range(depth)),
            "delay": In(range(depth)),
            "i": In(unsigned(width)),
            "o": Out(unsigned(width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.buffer = buffer = Memory(shape=unsigned(self._width), depth=self._depth,
                                              init=[])
        write = buffer.write_port()
        read = buffer.read_port(transparent_for=(write,))
        address_bits = exact_log2(self._depth)
        ahead = Signal(address_bits)
        m.d.comb += [
            write.addr.eq(self.index),
            write.data.eq(self.i),
            write.en.eq(self.enable),
            # Modulo depth: the arithmetic wraps in address_bits bits. Read at an advance the
            # word the next cycle shows; hold it otherwise, as the index holds.
            ahead.eq(self.index + 1 - self.delay),
            read.addr.eq(ahead),
            read.en.eq(self.enable),
            self.o.eq(Mux(self.delay == 0, self.i, read.data)),
        ]
        return m
