"""PartitionedMemory, SBUF and PSUM on Amaranth's own simulator: every grant against the
golden round-robin arbiter, every response against the golden image, read-during-write,
and the PSUM read-modify-write hazard (with the forward removed, it fails)."""

import random
from collections import deque

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import config
from opentrn.golden import psum as golden_psum
from opentrn.golden.partitioned_memory import PartitionedMemory as GoldenMemory
from opentrn.golden.partitioned_memory import RoundRobin
from opentrn.hdl.partitioned_memory import PartitionedMemory
from opentrn.hdl.psum import PSUM
from opentrn.hdl.sbuf import SBUF
from opentrn.sim.streams import PayloadCodec


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


class _Port:
    """Raw-bits access to a stream's payload through the testbench codec."""

    def __init__(self, stream):
        self.stream = stream
        self.codec = PayloadCodec(stream.payload.shape())

    def set(self, ctx, payload):
        ctx.set(self.stream.valid, payload is not None)
        if payload is not None:
            ctx.set(self.stream.payload.as_value(), self.codec.encode(payload))

    def get(self, ctx):
        return self.codec.decode(ctx.get(self.stream.payload.as_value()))


@pytest.mark.parametrize("name, value, message", [
    ("partitions", 0, "partitions=0: must be an integer >= 1"),
    ("word_bytes", 6, "word_bytes=6: must be a power of two"),
    ("depth", 0, "depth=0: must be an integer >= 1"),
    ("vector_readers", -1, "vector_readers=-1: must be an integer >= 0"),
    ("vector_writers", 1.5, "vector_writers=1.5: must be an integer >= 0"),
    ("vector_bytes", 8, "vector_bytes=8: must be a power of two of at most word_bytes=4"),
    ("vector_bytes", 3, "vector_bytes=3: must be a power of two of at most word_bytes=4"),
    ("input_stages", 3, "input_stages=3: must be 0, 1 or 2"),
    ("rmw_port", True, "input_stages=1: must be 0 with rmw_port"),
])
def test_constructor_refuses_bad_arguments(name, value, message):
    args = dict(partitions=2, word_bytes=4, depth=8, vector_readers=1, vector_writers=1,
                input_stages=1)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PartitionedMemory(**{**args, name: value})


def _random_traffic(*, partitions, word_bytes, depth, readers, writers, cycles, load, seed,
                    vector_bytes=None, input_stages=0):
    """Random requests on every port (each held until granted, as the stream rules
    require); checks each cycle's ``ready`` against the golden arbiter and each response
    against the golden image, read in the order of the grants, ``1 + input_stages`` cycles
    after its grant. Returns statistics."""
    vector_bytes = word_bytes if vector_bytes is None else vector_bytes
    lanes = word_bytes // vector_bytes                # vector words per word
    dut = PartitionedMemory(partitions=partitions, word_bytes=word_bytes, depth=depth,
                            vector_bytes=vector_bytes, vector_readers=readers,
                            vector_writers=writers, input_stages=input_stages)
    rng = random.Random(seed)
    read_ports = [_Port(r.request) for r in dut.vector_read] + [_Port(dut.word_read.request)]
    responses = [_Port(r.response) for r in dut.vector_read] + [_Port(dut.word_read.response)]
    write_ports = [_Port(w) for w in dut.vector_write] + [_Port(dut.word_write)]
    model = GoldenMemory(partitions=partitions, word_bytes=word_bytes, depth=depth,
                         vector_bytes=vector_bytes)
    arbiters = RoundRobin(len(read_ports)), RoundRobin(len(write_ports))
    stats = {"reads": 0, "writes": 0, "max_read_wait": 0, "max_write_wait": 0,
             "read_during_write": 0}

    def random_bytes(count):
        return [rng.randrange(256) for _ in range(count)]

    def new_word():
        return rng.randrange(min(depth, 4) if rng.random() < 0.5 else depth)

    def new_read(index):
        if index == readers:
            return {"word": new_word(), "partition": rng.randrange(partitions)}
        return {"word": new_word() * lanes + rng.randrange(lanes)}

    def new_write(index):
        if index == writers:
            return {"partition": rng.randrange(partitions), "word": new_word(),
                    "data": random_bytes(word_bytes),
                    "strobe": rng.randrange(1 << word_bytes)}
        return {"word": new_word() * lanes + rng.randrange(lanes),
                "data": [random_bytes(vector_bytes) for _ in range(partitions)],
                "strobe": [rng.randrange(1 << vector_bytes) for _ in range(partitions)]}

    def row(request):
        """The word a request touches."""
        return request["word"] if "partition" in request else request["word"] // lanes

    async def bench(ctx):
        reading = [None] * len(read_ports)       # (request, cycle first presented)
        writing = [None] * len(write_ports)
        # (reader, data) of the grants of the last 1 + input_stages cycles (None: no
        # grant), oldest first: the oldest answers this cycle.
        due = deque([None] * (1 + input_stages))
        for cycle in range(cycles):
            for pending, new in ((reading, new_read), (writing, new_write)):
                for index in range(len(pending)):
                    if pending[index] is None and rng.random() < load:
                        pending[index] = (new(index), cycle)
            for port, pending in [*zip(read_ports, reading, strict=True),
                                 *zip(write_ports, writing, strict=True)]:
                port.set(ctx, pending and pending[0])
            expected = due.popleft()
            for index, response in enumerate(responses):
                valid = ctx.get(response.stream.valid)
                assert valid == (expected is not None and expected[0] == index), cycle
                if valid:
                    assert response.get(ctx)["data"] == expected[1], cycle
            read = arbiters[0].grant([i for i, p in enumerate(reading) if p])
            write = arbiters[1].grant([i for i, p in enumerate(writing) if p])
            for ports, winner in ((read_ports, read), (write_ports, write)):
                for index, port in enumerate(ports):
                    assert ctx.get(port.stream.ready) == (index == winner), (cycle, index)
            expected = read_word = None
            if read is not None:
                request, since = reading[read]
                if request.get("partition") is not None:
                    got = model.word_read(request["partition"], request["word"]).tolist()
                else:
                    got = model.vector_read(request["word"]).tolist()
                expected, read_word = (read, got), row(request)
                reading[read] = None
                stats["reads"] += 1
                stats["max_read_wait"] = max(stats["max_read_wait"], cycle - since)
            if write is not None:
                request, since = writing[write]
                if "partition" in request:
                    model.word_write(request["partition"], request["word"], request["data"],
                                     request["strobe"])
                else:
                    model.vector_write(request["word"], request["data"], request["strobe"])
                writing[write] = None
                stats["writes"] += 1
                stats["max_write_wait"] = max(stats["max_write_wait"], cycle - since)
                if read_word == row(request):
                    stats["read_during_write"] += 1
            due.append(expected)
            await ctx.tick()

    _run(dut, bench)
    return stats


@pytest.mark.parametrize("word_bytes, vector_bytes, input_stages",
                         [(4, 4, 0), (16, 4, 0), (16, 4, 1), (4, 4, 2)])
def test_random_traffic_grants_and_data(word_bytes, vector_bytes, input_stages):
    """With vector words a quarter of a word too (trn3 has half): vector and word ports
    meet in the same words; with input stages the same answers, later."""
    stats = _random_traffic(partitions=3, word_bytes=word_bytes, depth=8, readers=3,
                            writers=2, cycles=1500, load=0.4, seed=1,
                            vector_bytes=vector_bytes, input_stages=input_stages)
    assert stats["reads"] > 1000 and stats["writes"] > 800
    assert stats["max_read_wait"] <= 3 and stats["max_write_wait"] <= 2
    # Reads of a word written in the same cycle happened, and returned the old data.
    assert stats["read_during_write"] > 20


@pytest.mark.parametrize("readers, writers", [(0, 0), (1, 0), (2, 3)])
def test_saturated_ports_wait_exactly_the_bound(readers, writers):
    """Every requester always requesting: each waits at most (requesters - 1) cycles, and
    under full load it does wait that long."""
    stats = _random_traffic(partitions=2, word_bytes=8, depth=5, readers=readers,
                            writers=writers, cycles=300, load=1.0, seed=2)
    assert stats["max_read_wait"] == readers
    assert stats["max_write_wait"] == writers


def test_read_during_write_returns_old_data():
    dut = PartitionedMemory(partitions=2, word_bytes=4, depth=4, vector_readers=1,
                            vector_writers=1)
    read, response = _Port(dut.vector_read[0].request), _Port(dut.vector_read[0].response)
    write = _Port(dut.vector_write[0])
    old, new = [[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 9, 9, 9], [10, 11, 12, 13]]

    async def bench(ctx):
        write.set(ctx, {"word": 2, "data": old, "strobe": [0xF, 0xF]})
        await ctx.tick()
        # Same word, same cycle: the read sees the data from before this write...
        write.set(ctx, {"word": 2, "data": new, "strobe": [0xF, 0b0101]})
        read.set(ctx, {"word": 2})
        assert ctx.get(read.stream.ready) and ctx.get(write.stream.ready)
        await ctx.tick()
        write.set(ctx, None)
        assert ctx.get(response.stream.valid)
        assert response.get(ctx)["data"] == old
        # ... and the next read the merged bytes.
        await ctx.tick()
        assert ctx.get(response.stream.valid)
        assert response.get(ctx)["data"] == [[9, 9, 9, 9], [10, 6, 12, 8]]
        read.set(ctx, None)
        await ctx.tick()
        assert not ctx.get(response.stream.valid)

    _run(dut, bench)


def test_sbuf_ports_are_the_documented_requesters():
    """te_read, act_read, dma_read all requesting: granted in that order, round robin."""
    cfg = config.preset("tiny")
    dut = SBUF(config=cfg)
    ports = [_Port(dut.te_read.request), _Port(dut.act_read.request),
             _Port(dut.dma_read.request)]

    async def bench(ctx):
        for port in ports:
            port.set(ctx, {"word": 1, "partition": 0} if port is ports[2] else {"word": 1})
        order = []
        for _ in range(6):
            order.append([ctx.get(port.stream.ready) for port in ports].index(1))
            await ctx.tick()
        assert order == [0, 1, 2, 0, 1, 2]

    _run(dut, bench)


class _PSUMWithoutForward(PSUM):
    _forward = False


def _psum_hazards(dut_class, seed):
    """Back-to-back accumulates to one entry, then accumulates each meeting a dma_write
    to its word in the cycle of its read; returns (hardware image, golden image, hits)."""
    cfg = config.preset("tiny")
    dut = dut_class(config=cfg)
    rng = np.random.default_rng(seed)
    te, dma_write = _Port(dut.te_write), _Port(dut.dma_write)
    dma_read, dma_data = _Port(dut.dma_read.request), _Port(dut.dma_read.response)
    model = golden_psum.PSUM(cfg)
    partitions, word_bytes, depth = golden_psum.geometry(cfg)
    lo, hi = -(1 << (cfg.acc_bits - 1)), (1 << (cfg.acc_bits - 1)) - 1
    bank, entry = 1, 3
    word, _ = golden_psum.entry_location(cfg, bank, entry)
    image = np.zeros_like(model.image)
    # Cycle by cycle: a te_write beat or None, a dma_write or None.
    schedule = [(True, None)] * 12 + [(None, None)] * 2
    for _ in range(10):
        write = {"partition": int(rng.integers(partitions)), "word": word,
                 "data": [int(b) for b in rng.integers(0, 256, word_bytes)],
                 "strobe": int(rng.integers(1, 1 << word_bytes))}
        schedule += [(True, write), (None, None)]
    schedule += [(None, None)] * 2
    hits = 0

    async def bench(ctx):
        nonlocal hits
        commits = {}
        for cycle, (beat, write) in enumerate(schedule):
            payload = None
            if beat:
                payload = {"bank": bank, "entry": entry, "accumulate": 1, "float": 0,
                           "data": [int(v) for v in rng.integers(lo, hi + 1, partitions)]}
            te.set(ctx, payload)
            dma_write.set(ctx, write)
            assert ctx.get(te.stream.ready)
            if write is not None:
                assert ctx.get(dma_write.stream.ready), "the write port is free this cycle"
                commits[cycle] = ("dma", write)
            if payload is not None:
                hits += cycle in commits
                commits[cycle + 1] = ("te", payload)
            await ctx.tick()
        te.set(ctx, None)
        dma_write.set(ctx, None)
        for cycle in sorted(commits):
            kind, op = commits[cycle]
            if kind == "dma":
                model.dma_write(op["partition"], op["word"], op["data"], op["strobe"])
            else:
                model.te_write(op["bank"], op["entry"], op["data"], op["accumulate"])
        for p in range(partitions):
            for w in range(depth):
                dma_read.set(ctx, {"partition": p, "word": w})
                await ctx.tick()
                image[p, w * word_bytes:(w + 1) * word_bytes] = dma_data.get(ctx)["data"]

    _run(dut, bench)
    return image, model.image, hits


def test_psum_read_modify_write_forwards_the_write_of_its_read_cycle():
    image, expected, hits = _psum_hazards(PSUM, seed=5)
    assert hits == 11 + 10      # 11 back-to-back accumulates and 10 dma_write collisions
    np.testing.assert_array_equal(image, expected)


def test_psum_without_the_forward_loses_writes():
    image, expected, _ = _psum_hazards(_PSUMWithoutForward, seed=5)
    assert not np.array_equal(image, expected)
