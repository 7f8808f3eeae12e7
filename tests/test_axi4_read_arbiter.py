"""AXI4ReadArbiter on Amaranth's simulator: four managers with random AR traffic and random
``rready``, a subordinate model that answers each ID's bursts in order after random latency
(interleaving IDs, holding each beat until taken). Every AR on the shared port is its
manager's, stable while it waits and granted round-robin; every manager gets exactly its
own beats, in order."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from opentrn.hdl.axi4 import BURST_INCR, RESP_OKAY, RESP_SLVERR
from opentrn.hdl.axi4_read_arbiter import AXI4ReadArbiter

COUNT = 4
ADDR_WIDTH = 16
DATA_WIDTH = 32
AR_FIELDS = ("araddr", "arlen", "arsize", "arburst")


def _run(*, seed, requests=30, request_rate=0.5, arready=0.6, rready=0.7, latency=(1, 12),
         gap=0.3, cycles=30000):
    """Each manager issues ``requests`` random bursts. Returns statistics."""
    rng = random.Random(seed)
    dut = AXI4ReadArbiter(count=COUNT, addr_width=ADDR_WIDTH, data_width=DATA_WIDTH)
    # Per manager: its requests, and the beats it must receive, in order.
    plans = []
    for _ in range(COUNT):
        plan = [(rng.randrange(1 << ADDR_WIDTH), rng.choice([0, 0, 1, 3, rng.randrange(16)]),
                 rng.randrange(3), rng.choice([BURST_INCR, 0, 2])) for _ in range(requests)]
        plans.append(plan)
    stats = {"grants": [0] * COUNT, "order": [], "max_passed": 0, "cycles": 0}

    async def bench(ctx):
        port = dut.port
        managers = dut.managers
        next_request = [0] * COUNT
        presenting = [None] * COUNT        # the AR a manager holds until arready
        waited = [0] * COUNT               # grants to others while it requested
        bursts = {i: deque() for i in range(COUNT)}   # per ID: [ready cycle, beats left]
        expected = [deque() for _ in range(COUNT)]    # beats each manager must get
        beat = None                        # (id, data, resp, last) held on R until taken
        held_ar = None
        for cycle in range(cycles):
            # -- drive --------------------------------------------------------------------
            for i in range(COUNT):
                if presenting[i] is None and next_request[i] < len(plans[i]) \
                        and rng.random() < request_rate:
                    presenting[i] = plans[i][next_request[i]]
                    next_request[i] += 1
                ctx.set(managers[i].arvalid, presenting[i] is not None)
                if presenting[i] is not None:
                    for name, value in zip(AR_FIELDS, presenting[i], strict=True):
                        ctx.set(getattr(managers[i], name), value)
                ctx.set(managers[i].arid, rng.randrange(2))     # not used: the arbiter's ID
            takes = [rng.random() < rready for _ in range(COUNT)]
            for i in range(COUNT):
                ctx.set(managers[i].rready, takes[i])
            ar_ready = rng.random() < arready
            ctx.set(port.arready, ar_ready)
            if beat is None:
                ids = [i for i in range(COUNT) if bursts[i] and bursts[i][0][0] <= cycle]
                if ids and rng.random() >= gap:
                    rid = rng.choice(ids)
                    burst = bursts[rid][0]
                    data = rng.getrandbits(DATA_WIDTH)
                    resp = RESP_SLVERR if rng.random() < 0.1 else RESP_OKAY
                    beat = (rid, data, resp, burst[1] == 1)
                    expected[rid].append((data, resp, burst[1] == 1))
                    burst[1] -= 1
                    if burst[1] == 0:
                        bursts[rid].popleft()
            ctx.set(port.rvalid, beat is not None)
            if beat is not None:
                for name, value in zip(("rid", "rdata", "rresp", "rlast"), beat, strict=True):
                    ctx.set(getattr(port, name), value)

            # -- sample -------------------------------------------------------------------
            arvalid = ctx.get(port.arvalid)
            ar = tuple(ctx.get(getattr(port, name)) for name in ("arid", *AR_FIELDS))
            if held_ar is not None:
                assert arvalid and ar == held_ar, (cycle, "AR changed while waiting")
            if arvalid:
                owner = ar[0]
                assert owner < COUNT and presenting[owner] is not None, cycle
                assert ar[1:] == presenting[owner], cycle
            granted = [ctx.get(managers[i].arready) and presenting[i] is not None
                       for i in range(COUNT)]
            if arvalid and ar_ready:
                assert granted == [i == owner for i in range(COUNT)], cycle
                _, _, length, _, _ = ar
                bursts[owner].append([cycle + rng.randint(*latency), length + 1])
                presenting[owner] = None
                stats["grants"][owner] += 1
                stats["order"].append(owner)
                for i in range(COUNT):
                    if i != owner and presenting[i] is not None:
                        waited[i] += 1
                        # Round-robin: another manager wins at most COUNT - 1 times first.
                        assert waited[i] <= COUNT - 1, (cycle, i)
                        stats["max_passed"] = max(stats["max_passed"], waited[i])
                waited[owner] = 0
                held_ar = None
            else:
                assert not any(granted), cycle
                held_ar = ar if arvalid else None
            if beat is not None:
                rid = beat[0]
                assert ctx.get(port.rready) == takes[rid], cycle
            for i in range(COUNT):
                sink = managers[i]
                rvalid = ctx.get(sink.rvalid)
                assert rvalid == (beat is not None and beat[0] == i), cycle
                assert ctx.get(sink.rid) == 0
                if rvalid:
                    got = (ctx.get(sink.rdata), ctx.get(sink.rresp), ctx.get(sink.rlast))
                    assert got == beat[1:], cycle
                    if takes[i]:
                        assert expected[i].popleft() == got, cycle
                        beat = None
            done = all(n == len(p) for n, p in zip(next_request, plans, strict=True)) and \
                not any(presenting) and not any(bursts.values()) and beat is None
            if done:
                assert not any(expected)
                stats["cycles"] = cycle
                return
            await ctx.tick()
        raise AssertionError("traffic did not finish")

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return stats


@pytest.mark.parametrize("seed", range(3))
def test_random_traffic(seed):
    stats = _run(seed=seed)
    assert stats["grants"] == [30] * COUNT


def test_saturated_round_robin():
    """Every manager always requesting, the port always ready: grants rotate 0, 1, 2, 3 and
    each waiting manager sees exactly COUNT - 1 others go first."""
    stats = _run(seed=10, request_rate=1.0, arready=1.0, rready=1.0, gap=0.0)
    assert stats["order"] == list(range(COUNT)) * 30 and stats["max_passed"] == COUNT - 1


def test_slow_port():
    """A port that rarely takes an address: long waits with held ARs; fairness holds."""
    stats = _run(seed=11, request_rate=0.9, arready=0.15, requests=15)
    assert stats["max_passed"] == COUNT - 1

