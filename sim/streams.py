"""cocotb drivers and monitors for ``amaranth.lib.stream`` interfaces.

Amaranth names the Verilog ports of a stream member ``<name>__valid``, ``<name>__ready`` and
``<name>__payload``; a payload of a ``data.Layout`` is one bit vector, packed and unpacked
here with the same layout object the hardware was built from, so the testbench cannot
disagree with the hardware about bit positions.

Every driver and monitor works on the same cycle discipline, so the two simulators agree
cycle for cycle: inputs change at the falling edge, handshakes are sampled in the read-only
phase before the rising edge that completes them.
"""

import random
from collections import deque

from cocotb import start_soon
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

__all__ = ["CycleCounter", "StreamSource", "StreamSink"]


class CycleCounter:
    """Counts rising edges of ``clock``; ``now`` is the number of the current cycle."""

    def __init__(self, clock):
        self.clock = clock
        self.now = 0
        self._task = start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.clock)
            self.now += 1


class _Port:
    def __init__(self, dut, name, layout):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.layout = layout
        self.name = name


class StreamSource(_Port):
    """Drives a stream into the design from a queue of payloads (``dict`` values of the
    layout). With ``gaps`` > 0, ``valid`` drops for a random cycle with that probability
    between beats; ``valid`` never depends on ``ready`` and the payload is held until the
    transfer, as the stream rules require.

    ``accepted`` records ``(cycle, payload)`` of each transfer.
    """

    def __init__(self, dut, name, layout, clock, cycles, *, gaps=0.0, rng=None):
        super().__init__(dut, name, layout)
        self.clock = clock
        self.cycles = cycles
        self.gaps = gaps
        self.rng = rng or random.Random(0)
        self.queue = deque()
        self.accepted = []
        self.valid.value = 0
        self._task = start_soon(self._run())

    def send(self, payload):
        self.queue.append(payload)

    @property
    def idle(self):
        return not self.queue

    async def _run(self):
        presenting = False
        while True:
            await FallingEdge(self.clock)
            if not presenting and self.queue:
                presenting = not (self.gaps and self.rng.random() < self.gaps)
                if presenting:
                    self.payload.value = self.layout.const(self.queue[0]).as_bits()
            self.valid.value = int(presenting)
            await ReadOnly()
            if presenting and self.ready.value:
                self.accepted.append((self.cycles.now, self.queue.popleft()))
                presenting = False
            await RisingEdge(self.clock)


class StreamSink(_Port):
    """Receives a stream from the design. With ``backpressure`` > 0, ``ready`` is low for a
    random cycle with that probability. ``received`` records ``(cycle, view)`` of each
    transfer, the view decoded with the layout (``view.data[i]`` etc. as Python ints)."""

    def __init__(self, dut, name, layout, clock, cycles, *, backpressure=0.0, rng=None):
        super().__init__(dut, name, layout)
        self.clock = clock
        self.cycles = cycles
        self.backpressure = backpressure
        self.rng = rng or random.Random(0)
        self.received = []
        self.ready.value = 0
        self._task = start_soon(self._run())

    async def _run(self):
        while True:
            await FallingEdge(self.clock)
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            self.ready.value = int(ready)
            await ReadOnly()
            if ready and self.valid.value:
                raw = self.payload.value.to_unsigned()
                self.received.append((self.cycles.now, self.layout.from_bits(raw)))
            await RisingEdge(self.clock)
