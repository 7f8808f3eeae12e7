"""cocotb drivers and monitors for ``amaranth.lib.stream`` interfaces.

Amaranth names the Verilog ports of a stream member ``<name>__valid``, ``<name>__ready`` and
``<name>__payload``; a payload of a ``data.Layout`` is one bit vector, packed and unpacked
here (:class:`PayloadCodec`) from the same layout object the hardware was built from, so the
testbench cannot disagree with the hardware about bit positions.

Every driver and monitor works on the same cycle discipline, so the two simulators agree
cycle for cycle: inputs change at the falling edge, handshakes are sampled in the read-only
phase before the rising edge that completes them.
"""

import random
from collections import deque

from amaranth.hdl import Shape
from amaranth.lib import data
from cocotb import start_soon
from cocotb.triggers import Event, FallingEdge, First, ReadOnly, RisingEdge, Timer

__all__ = ["PayloadCodec", "ClockDomain", "StreamSource", "StreamSink"]


def _codec(shape):
    """(encode, decode) closures for one layout or shape: nested dicts and lists of ints
    to and from the raw bits. Built once per layout; plain integer arithmetic per beat
    (``Layout.const`` costs tens of microseconds a call, more than the simulator cycle)."""
    if isinstance(shape, data.StructLayout):
        parts = [(name, field.offset, field.width, *_codec(field.shape))
                 for name, field in shape]

        def encode(value):
            bits = 0
            for name, offset, _, enc, _ in parts:
                bits |= enc(value[name]) << offset
            return bits

        def decode(bits):
            return {name: dec((bits >> offset) & ((1 << width) - 1))
                    for name, offset, width, _, dec in parts}
        return encode, decode
    if isinstance(shape, data.ArrayLayout):
        width, length = Shape.cast(shape.elem_shape).width, shape.length
        enc, dec = _codec(shape.elem_shape)
        mask = (1 << width) - 1

        def encode(values):
            if len(values) != length:
                raise ValueError(f"{len(values)} elements for an array of {length}")
            bits = 0
            for index, value in enumerate(values):
                bits |= enc(value) << (index * width)
            return bits

        def decode(bits):
            return [dec((bits >> (index * width)) & mask) for index in range(length)]
        return encode, decode
    if isinstance(shape, data.Layout):
        raise TypeError(f"no codec for layout {shape!r}")
    shape = Shape.cast(shape)
    width, signed = shape.width, shape.signed
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    mask, top = (1 << width) - 1, 1 << (width - 1)

    def encode(value):
        value = int(value)
        if not lo <= value <= hi:
            raise ValueError(f"{value} does not fit {shape}")
        return value & mask

    def decode(bits):
        return bits - (top << 1) if signed and bits & top else bits
    return encode, decode


class PayloadCodec:
    """Packs a payload value (nested ``dict``/``list`` of ints, as ``Layout.const`` takes)
    into the raw bits of ``layout`` and back, bit-identical to Amaranth's own packing."""

    def __init__(self, layout):
        self.layout = layout
        self.encode, self.decode = _codec(layout)


class ClockDomain:
    """Runs every agent of one clock from a single coroutine, one cycle at a time.

    Each cycle: at the falling edge every agent's ``drive()`` sets its inputs to the design;
    in the read-only phase before the next rising edge every agent's ``sample(cycle)`` reads
    the settled handshakes (which transfer at that rising edge). One coroutine and three
    triggers per cycle however many agents there are: the scheduler's wake-ups, not the
    design, bound the speed of a cocotb bench. ``now`` is the number of the current cycle.
    """

    def __init__(self, clock):
        self.clock = clock
        self.now = 0
        self.agents = []
        self._task = start_soon(self._run())

    def add(self, agent):
        self.agents.append(agent)
        return agent

    async def _run(self):
        falling, read_only, rising = FallingEdge(self.clock), ReadOnly(), RisingEdge(self.clock)
        while True:
            await falling
            for agent in self.agents:
                agent.drive()
            await read_only
            for agent in self.agents:
                agent.sample(self.now)
            await rising
            self.now += 1


class _Port:
    def __init__(self, domain, dut, name, layout, *, has_ready=True):
        self.valid = getattr(dut, f"{name}__valid")
        # An always-ready stream has no ready port (its ready is a constant 1).
        self.ready = getattr(dut, f"{name}__ready") if has_ready else None
        self.payload = getattr(dut, f"{name}__payload")
        self.codec = PayloadCodec(layout)
        self.name = name
        domain.add(self)


class StreamSource(_Port):
    """Drives a stream into the design from a queue of payloads (``dict`` values of the
    layout). With ``gaps`` > 0, ``valid`` drops for a random cycle with that probability
    between beats; ``valid`` never depends on ``ready`` and the payload is held until the
    transfer, as the stream rules require.

    ``accepted`` records ``(cycle, payload)`` of each transfer, and ``offered`` the cycle in
    which the same beat was first presented (``valid`` rose), so that waits can be measured.
    ``send(payload, idle=n)`` keeps ``valid`` low for ``n`` cycles before that beat, for
    directed timing.
    """

    def __init__(self, domain, dut, name, layout, *, gaps=0.0, rng=None):
        super().__init__(domain, dut, name, layout)
        self.gaps = gaps
        self.rng = rng or random.Random(0)
        self.queue = deque()
        self.accepted = []
        self.offered = []
        self.valid.value = 0
        self._presenting = False
        self._offered_at = None
        self._idle = deque()

    def send(self, payload, *, idle=0):
        self.queue.append(payload)
        self._idle.append(idle)

    @property
    def idle(self):
        return not self.queue

    def drive(self):
        if not self._presenting:
            if self._idle and self._idle[0] > 0 and len(self._idle) == len(self.queue):
                self._idle[0] -= 1
                self.valid.value = 0
                return
            # A beat once presented stays (valid high, payload held) until it transfers.
            self._presenting = bool(self.queue) and not (
                self.gaps and self.rng.random() < self.gaps)
            if self._presenting:
                self.payload.value = self.codec.encode(self.queue[0])
            self.valid.value = int(self._presenting)

    def sample(self, cycle):
        if self._presenting and self._offered_at is None:
            self._offered_at = cycle
        if self._presenting and self.ready.value:
            self.accepted.append((cycle, self.queue.popleft()))
            self.offered.append(self._offered_at)
            if len(self._idle) > len(self.queue):
                self._idle.popleft()
            self._presenting = False
            self._offered_at = None


class StreamSink(_Port):
    """Receives a stream from the design. With ``backpressure`` > 0, ``ready`` is low for a
    random cycle with that probability. ``received`` records ``(cycle, view)`` of each
    transfer, the payload decoded by :class:`PayloadCodec` (``payload["data"][i]`` etc.).
    With ``always_ready`` the stream has no ready port (``stream.Signature(...,
    always_ready=True)``): every cycle with ``valid`` high is a beat."""

    def __init__(self, domain, dut, name, layout, *, backpressure=0.0, rng=None,
                 always_ready=False):
        if always_ready and backpressure:
            raise ValueError(f"{name}: an always-ready stream cannot take back-pressure")
        super().__init__(domain, dut, name, layout, has_ready=not always_ready)
        self.backpressure = backpressure
        self.rng = rng or random.Random(0)
        self.received = []
        self.always_ready = always_ready
        if not always_ready:
            self.ready.value = 0
        self._ready = always_ready
        self._waiting = None

    def drive(self):
        if self.always_ready:
            return
        ready = not (self.backpressure and self.rng.random() < self.backpressure)
        if ready != self._ready:
            self.ready.value = int(ready)
            self._ready = ready

    def sample(self, cycle):
        if self._ready and self.valid.value:
            raw = self.payload.value.to_unsigned()
            self.received.append((cycle, self.codec.decode(raw)))
            if self._waiting is not None and len(self.received) >= self._waiting[0]:
                self._waiting[1].set()

    async def wait_for(self, count, timeout_ns):
        """Wait until ``count`` beats have arrived; return ``False`` after ``timeout_ns``."""
        if len(self.received) >= count:
            return True
        done = Event()
        self._waiting = (count, done)
        timer = Timer(timeout_ns, "ns")
        fired = await First(done.wait(), timer)
        self._waiting = None
        return fired is not timer
