"""cocotb testbench of the SBUF (:mod:`opentrn.hdl.sbuf`), and the memory-bench machinery
that :mod:`opentrn.sim.tb_psum` shares.

Drivers (:class:`~opentrn.sim.streams.StreamSource`) present requests on every port at once,
with random valid gaps; monitors (always-ready :class:`~opentrn.sim.streams.StreamSink`)
collect the responses. The scoreboard replays every transfer in cycle order on the golden
model (:mod:`opentrn.golden.sbuf`): in each cycle the granted read sees the memory before the
write committed in that cycle (the documented read-during-write rule). It checks:

* every response bit for bit, and that it came exactly the read latency after its request
  (1 cycle; the SBUF's ``sbuf.read_latency``: one more per ``sbuf_input_stages``);
* at most one read and one write granted per cycle;
* every grant against the golden round-robin arbiter
  (:class:`~opentrn.golden.partitioned_memory.RoundRobin`), from the cycles in which each
  requester held ``valid``, and the longest wait against the documented bound;
* the whole memory, read back through the ports at the end, against the golden image.

The memories keep their contents across reset, so the golden image carries over from one
test to the next. Run it through :mod:`opentrn.sim.runner`, which passes:

``OPENTRN_CONFIG``  the :class:`~opentrn.config.Config` as JSON;
``OPENTRN_OPS``     requests of the random mix (default 3000);
``OPENTRN_SEED``    seed of the workload;
``OPENTRN_REPORT``  a JSON file the tests write their statistics to.
"""

import random
import zlib
from collections import defaultdict
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from opentrn.golden import sbuf as golden
from opentrn.golden.partitioned_memory import RoundRobin
from opentrn.hdl.partitioned_memory import (
    vector_request_layout,
    vector_response_layout,
    vector_write_layout,
    word_request_layout,
    word_response_layout,
    word_write_layout,
)

from . import harness
from .streams import StreamSink, StreamSource


def settings():
    return harness.config(), harness.setting("ops", 3000), harness.setting("seed", 1)


report = harness.report


def workload_rng(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# -- the shared bench ------------------------------------------------------------------------

@dataclass
class ReadPort:
    """A request source, its response monitor, and the golden read of one request."""
    name: str
    request: StreamSource
    response: StreamSink
    expect: object          # golden, request payload -> expected response payload


@dataclass
class WritePort:
    """A write source; its writes take effect ``delay`` cycles after the transfer (a
    ``te_write`` writes back one cycle later), by ``apply`` on the golden model."""
    name: str
    request: StreamSource
    apply: object           # golden, request payload -> None
    delay: int = 0


class MemoryBench:
    """Clock, reset, agents, watchdog and the replay scoreboard of a memory block.

    ``read_groups`` and ``write_groups`` list the arbitration groups in the hardware's
    requester order (names of ports); ``blocked_writes(events)`` returns the cycles in which
    the arbitrated writers get nothing (PSUM: the cycles a ``te_write`` writes back).
    """

    def __init__(self, dut, golden_model, *, seed, read_latency=1):
        self.dut = dut
        self.golden = golden_model
        self.read_latency = read_latency      # cycles from a request's transfer to its answer
        self.domain = harness.start_clock(dut)
        self.rng = random.Random(seed)
        self.reads, self.writes = {}, {}
        self.read_order, self.write_order = [], []

    def read_port(self, name, request_layout, response_layout, expect, *, gaps=0.0):
        port = ReadPort(
            name,
            StreamSource(self.domain, self.dut, f"{name}__request", request_layout,
                         gaps=gaps, rng=self.rng),
            StreamSink(self.domain, self.dut, f"{name}__response", response_layout,
                       always_ready=True),
            expect)
        self.reads[name] = port
        self.read_order.append(name)
        return port

    def write_port(self, name, layout, apply, *, gaps=0.0, delay=0, arbitrated=True):
        port = WritePort(name, StreamSource(self.domain, self.dut, name, layout, gaps=gaps,
                                            rng=self.rng), apply, delay)
        self.writes[name] = port
        if arbitrated:
            self.write_order.append(name)
        return port

    def set_gaps(self, gaps):
        for port in [*self.reads.values(), *self.writes.values()]:
            port.request.gaps = gaps

    async def reset(self):
        await harness.reset(self.dut)

    def _done(self):
        return (all(p.request.idle for p in [*self.reads.values(), *self.writes.values()])
                and all(len(p.response.received) == len(p.request.accepted)
                        for p in self.reads.values()))

    def _state(self):
        lines = [f"cycle {self.domain.now}"]
        for port in [*self.reads.values(), *self.writes.values()]:
            source = port.request
            lines.append(f"  {port.name}: queued {len(source.queue)}, accepted "
                         f"{len(source.accepted)}, valid={source.valid.value} "
                         f"ready={source.ready.value}")
        for port in self.reads.values():
            lines.append(f"  {port.name} responses: {len(port.response.received)}")
        return "\n".join(lines)

    async def drain(self, budget):
        """Wait until every request has transferred and been answered; not done within
        ``budget`` cycles (a hang) fails with the state of every port."""
        start = self.domain.now
        while not self._done():
            if self.domain.now - start > budget:
                raise AssertionError(f"watchdog: not done after {budget} cycles\n"
                                     + self._state())
            await ClockCycles(self.dut.clk, 8)
        await ClockCycles(self.dut.clk, self.read_latency + 2)

    def begin(self):
        """Mark the start of a test's traffic: the scoreboard looks at transfers from here."""
        self._marks = {name: (len(p.request.accepted), len(p.response.received))
                       for name, p in self.reads.items()}
        self._marks.update({name: (len(p.request.accepted), 0)
                            for name, p in self.writes.items()})

    def _accepted(self, name, port):
        first = self._marks[name][0]
        return list(zip(port.request.accepted[first:], port.request.offered[first:],
                        strict=True))

    def score(self, *, blocked_writes=lambda events: set(), on_write=None):
        """Replay this test's transfers on the golden model and compare; returns the
        statistics (``mismatches``, ``late``, ``arbitration_mismatches`` must be zero)."""
        events = []     # (cycle, 0 read / 1 write, port name, index, payload)
        for name, port in self.reads.items():
            for index, ((cycle, payload), _) in enumerate(self._accepted(name, port)):
                events.append((cycle, 0, name, index, payload))
        for name, port in self.writes.items():
            for index, ((cycle, payload), _) in enumerate(self._accepted(name, port)):
                events.append((cycle + port.delay, 1, name, index, payload))
        events.sort(key=lambda event: (event[0], event[1]))

        stats = defaultdict(int)
        per_cycle = defaultdict(lambda: [0, 0])
        write_words = {}                    # cycle -> word committed then
        expected = defaultdict(list)
        read_words = {}
        for cycle, kind, name, _, payload in events:
            per_cycle[cycle][kind] += 1
            if kind == 0:
                expected[name].append(self.reads[name].expect(self.golden, payload))
                read_words[cycle] = payload.get("word")
                stats["reads"] += 1
            else:
                if on_write is not None:
                    on_write(cycle, name, payload, write_words, stats)
                self.writes[name].apply(self.golden, payload)
                write_words[cycle] = payload["word"]
                stats["writes"] += 1
        stats["double_grants"] = sum(1 for reads, writes in per_cycle.values()
                                     if reads > 1 or writes > 1)
        stats["read_during_write"] = sum(
            1 for cycle, word in read_words.items()
            if word is not None and write_words.get(cycle) == word)

        log = self.dut._log
        for name, port in self.reads.items():
            accepted = self._accepted(name, port)
            received = port.response.received[self._marks[name][1]:]
            if len(received) != len(accepted):
                raise AssertionError(f"{name}: {len(received)} responses to "
                                     f"{len(accepted)} requests")
            for ((cycle, request), _), (got_cycle, got), want in zip(
                    accepted, received, expected[name], strict=True):
                if got_cycle != cycle + self.read_latency:
                    stats["late"] += 1
                if got != want:
                    stats["mismatches"] += 1
                    if stats["mismatches"] <= 5:
                        log.error("%s: request %s at cycle %d answered %s, expected %s",
                                  name, request, cycle, got, want)

        for group, order, blocked in (
                ("read", self.read_order, set()),
                ("write", self.write_order, blocked_writes(events))):
            self._check_arbitration(group, order, blocked, stats)
        stats = dict(stats)
        for key in ("mismatches", "late", "arbitration_mismatches", "double_grants"):
            stats.setdefault(key, 0)
        return stats

    def _check_arbitration(self, group, order, blocked, stats):
        """Replay the golden round-robin arbiter on the cycles each requester held valid."""
        if not order:
            return
        requesting = defaultdict(set)
        granted = {}
        longest = 0
        for index, name in enumerate(order):
            port = self.reads.get(name) or self.writes[name]
            for (cycle, _), offered in self._accepted(name, port):
                for c in range(offered, cycle + 1):
                    requesting[c].add(index)
                granted[cycle] = index
                longest = max(longest, cycle - offered)
        arbiter = RoundRobin(len(order))
        for cycle in sorted(requesting):
            want = None if cycle in blocked else arbiter.grant(requesting[cycle])
            if granted.get(cycle) != want:
                stats["arbitration_mismatches"] += 1
                if stats["arbitration_mismatches"] <= 5:
                    self.dut._log.error("%s arbitration, cycle %d: requesting %s, granted %s,"
                                        " expected %s", group, cycle,
                                        sorted(requesting[cycle]), granted.get(cycle), want)
        stats[f"max_{group}_wait"] = longest


# -- the SBUF ---------------------------------------------------------------------------------

def _vector_bytes(array):
    return [[int(b) for b in row] for row in array]


class SBUFBench(MemoryBench):
    _golden = None          # the memories outlive a test (reset does not clear them)

    def __init__(self, dut, config, *, seed, gaps):
        if SBUFBench._golden is None:
            SBUFBench._golden = golden.SBUF(config)
        super().__init__(dut, SBUFBench._golden, seed=seed,
                         read_latency=golden.read_latency(config))
        parts, width, depth = golden.geometry(config)
        _, vector_width, vector_depth = golden.vector_geometry(config)
        self.geometry = parts, width, depth
        self.vector_geometry = parts, vector_width, vector_depth
        vector = (vector_request_layout(vector_depth),
                  vector_response_layout(parts, vector_width))
        word = (word_request_layout(parts, depth), word_response_layout(width))

        def vector_read(model, request):
            return {"data": _vector_bytes(model.vector_read(request["word"]))}

        def word_read(model, request):
            return {"data": [int(b) for b in model.word_read(request["partition"],
                                                             request["word"])]}

        self.read_port("te_read", *vector, vector_read, gaps=gaps)
        self.read_port("act_read", *vector, vector_read, gaps=gaps)
        self.read_port("dma_read", *word, word_read, gaps=gaps)
        self.write_port("act_write", vector_write_layout(parts, vector_width, vector_depth),
                        lambda model, r: model.vector_write(r["word"], r["data"], r["strobe"]),
                        gaps=gaps)
        self.write_port("dma_write", word_write_layout(parts, depth, width),
                        lambda model, r: model.word_write(r["partition"], r["word"],
                                                          r["data"], r["strobe"]),
                        gaps=gaps)


def random_requests(bench, rng, ops, hot_words=4):
    """``ops`` requests spread over every port: half of them on a few hot words (so reads
    and writes of one word meet in one cycle), the rest anywhere; random bytes and strobes
    (a tenth all enabled, a twentieth none)."""
    parts, width, depth = bench.geometry
    _, vector_width, _ = bench.vector_geometry
    lanes = width // vector_width          # vector words per (DMA) word
    names = [*bench.reads, *bench.writes]
    hot = rng.choice(depth, size=min(hot_words, depth), replace=False)

    def word():
        return int(rng.choice(hot)) if rng.random() < 0.5 else int(rng.integers(depth))

    def vector_word():
        """A vector word in a word chosen as ``word()`` (so vector and word ports meet)."""
        return word() * lanes + int(rng.integers(lanes))

    def strobe(size):
        roll = rng.random()
        if roll < 0.1:
            return (1 << size) - 1
        if roll < 0.15:
            return 0
        # Bit by bit: a 64-byte word's mask does not fit numpy's int64.
        return sum(int(bit) << b for b, bit in enumerate(rng.integers(0, 2, size)))

    def data(size):
        return [int(b) for b in rng.integers(0, 256, size)]

    for _ in range(ops):
        name = names[int(rng.integers(len(names)))]
        if name in ("te_read", "act_read"):
            bench.reads[name].request.send({"word": vector_word()})
        elif name == "dma_read":
            bench.reads[name].request.send({"partition": int(rng.integers(parts)),
                                            "word": word()})
        elif name == "act_write":
            bench.writes[name].request.send({
                "word": vector_word(), "data": [data(vector_width) for _ in range(parts)],
                "strobe": [strobe(vector_width) for _ in range(parts)]})
        else:
            bench.writes[name].request.send({"partition": int(rng.integers(parts)),
                                             "word": word(), "data": data(width),
                                             "strobe": strobe(width)})


async def read_back(bench, port_name):
    """Read every vector word through a vector read port; return the image it shows."""
    parts, width, depth = bench.vector_geometry
    port = bench.reads[port_name]
    first = len(port.response.received)
    for word in range(depth):
        port.request.send({"word": word})
    await bench.drain(budget=8 * depth + 100)
    image = np.zeros((parts, depth * width), dtype=np.uint8)
    for word, (_, got) in enumerate(port.response.received[first:]):
        image[:, word * width:(word + 1) * width] = np.array(got["data"], dtype=np.uint8)
    return image


def check(stats, name):
    assert stats["mismatches"] == 0, f"{name}: {stats['mismatches']} responses differ"
    assert stats["late"] == 0, f"{name}: {stats['late']} responses off the read latency"
    assert stats["double_grants"] == 0, f"{name}: more than one read or write in a cycle"
    assert stats["arbitration_mismatches"] == 0, \
        f"{name}: {stats['arbitration_mismatches']} grants differ from round robin"


@cocotb.test()
async def test_random_mix(dut):
    """Every port at once with random gaps, then the whole memory read back through
    ``te_read``: every response and the final image bit-exact."""
    config, ops, seed = settings()
    bench = SBUFBench(dut, config, seed=seed, gaps=0.3)
    await bench.reset()
    bench.begin()
    random_requests(bench, workload_rng(seed, "random_mix"), ops)
    await bench.drain(budget=4 * ops + 200)
    bench.set_gaps(0.0)
    image = await read_back(bench, "te_read")
    stats = bench.score()
    stats["image_equal"] = bool(np.array_equal(image, bench.golden.image))
    stats["cycles"] = bench.domain.now
    report({"test": "random_mix", "seed": seed, "ops": ops, **stats})
    check(stats, "random_mix")
    assert stats["image_equal"], "the memory read back differs from the golden image"
    assert stats["max_read_wait"] <= 2 and stats["max_write_wait"] <= 1


@cocotb.test()
async def test_saturated(dut):
    """Every port requesting every cycle: one read and one write per cycle, round robin,
    and each requester waits exactly the bound (2 cycles for reads, 1 for writes)."""
    config, ops, seed = settings()
    bench = SBUFBench(dut, config, seed=seed, gaps=0.0)
    await bench.reset()
    bench.begin()
    random_requests(bench, workload_rng(seed, "saturated"), ops // 3, hot_words=2)
    await bench.drain(budget=4 * ops + 200)
    stats = bench.score()
    report({"test": "saturated", "seed": seed, "ops": ops // 3, **stats})
    check(stats, "saturated")
    assert stats["max_read_wait"] == 2 and stats["max_write_wait"] == 1, stats
