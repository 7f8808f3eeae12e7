"""Constrained-random programs (``opentrn.random_program``) and their campaigns
(``opentrn.fuzz``): the generator's programs are legal (or end with the fault injected) on
the golden machine, the comparison catches every kind of difference, shrinking finds the
operation that fails, and a few hundred programs run on the RTL against the golden machine
and the cycle model with no mismatch and every opcode, format, DMA space pair, fault code
and semaphore pattern hit, on local processes and on a Ray instance."""

import dataclasses
import os

import numpy as np
import pytest

from opentrn import config, cycle_model, fuzz, random_program
from opentrn.cli import main
from opentrn.golden.core import Core as GoldenCore
from opentrn.golden.dma import ErrorCode, Space
from opentrn.isa import Engine, Fault, Opcode
from opentrn.sim import runner

from .conftest import TRN3_16, require_simulator

TINY = config.preset("tiny")
SMALL = config.preset("small")
#: TRN3_16 (trn3 at 1/8): MXFP8 columns of 4 bytes (4 MACs per PE), two MX blocks a K
#: tile, the two-column fast weight load. Found the generator drawing more columns than its
#: SBUF window holds.


@pytest.mark.parametrize("cfg", [TINY, SMALL, TRN3_16], ids=["tiny", "small", "trn3-16x16"])
def test_programs_are_legal_or_end_with_their_fault_on_the_golden_machine(cfg):
    golden = GoldenCore(cfg)
    seen = set()
    for seed in range(150):
        fault = fuzz.fault_of_seed(seed, 0.3)
        program = random_program.generate(cfg, seed, fault=fault)
        again = random_program.generate(cfg, seed, fault=fault)
        assert np.array_equal(program.hbm, again.hbm) and program.programs == again.programs
        outcome = golden.run(program.hbm, program.programs)
        assert outcome.fault == (fault or Fault.NONE), (seed, program.fault_variant, outcome)
        if fault == Fault.DMA_ERROR:
            assert ErrorCode(outcome.dma_error_code).name == program.fault_variant
        seen.add(outcome.fault)
    assert seen == set(Fault)


@pytest.mark.parametrize("cfg", [TINY, SMALL], ids=["tiny", "small"])
def test_generated_programs_are_race_free(cfg):
    """Every conflicting pair of accesses is ordered by the semaphores whatever the timing.
    Found by seed 5029 on tiny (--illegal 0.3): a join semaphore used twice let the second
    join's NOP on one producer make up the first join's total; the RTL's timing then let an
    activation overwrite SBUF bytes a matmul had still to read."""
    for seed in range(1000):
        # generate() runs races() on every legal program and raises on a race.
        random_program.generate(cfg, seed)


def _stream(*instructions):
    return [[opcode, dict(fields)] for opcode, fields in instructions]


def test_the_race_check_finds_a_reused_join_and_an_unordered_activation():
    sem, box = 5, (0, 3, 0, 15)
    dma, tensor, act = Engine.DMA, Engine.TENSOR, Engine.ACTIVATION
    streams = {
        dma: _stream((Opcode.DMA, {}), (Opcode.NOP, {"signal": 1, "signal_sem": sem}),
                     (Opcode.NOP, {"signal": 1, "signal_sem": sem})),
        tensor: _stream((Opcode.MATMUL, {}), (Opcode.NOP, {"signal": 1, "signal_sem": sem})),
        act: _stream((Opcode.ACTIVATE, {"wait": 1, "wait_sem": sem, "wait_value": 2})),
    }
    accesses = {dma: [(0, Space.SBUF, True, box)], tensor: [(0, Space.PSUM, True, box)],
                act: [(0, Space.PSUM, False, box), (0, Space.SBUF, False, box)]}
    # Two of DMA's signals make 2 without the tensor engine's: its write is unordered.
    assert random_program.races(streams, accesses) == [(tensor, 0, act, 0)]
    streams[act][0][1]["wait_value"] = 3
    assert random_program.races(streams, accesses) == []
    # The activation engine's reads may overtake its own earlier writes.
    streams[act] = _stream((Opcode.ACTIVATE, {"wait": 1, "wait_sem": sem, "wait_value": 3}),
                           (Opcode.ACTIVATE, {}))
    accesses[act] = [(0, Space.SBUF, True, (0, 3, 32, 47)), (1, Space.SBUF, False,
                                                              (0, 3, 40, 41))]
    assert random_program.races(streams, accesses) == [(act, 0, act, 1)]
    streams[act][0][1].update(signal=1, signal_sem=1)
    streams[act][1][1].update(wait=1, wait_sem=1, wait_value=1)
    assert random_program.races(streams, accesses) == []


def test_the_comparison_names_each_difference():
    program = random_program.generate(TINY, 3)
    golden = GoldenCore(TINY).run(program.hbm, program.programs)
    predicted = cycle_model.simulate(TINY, program.hbm, program.programs)
    counters = {**golden.counters, **{name: predicted[name] for name in predicted
                                      if golden.counters.get(name) is None}}
    rtl = dataclasses.replace(golden, hbm=golden.hbm[:len(program.hbm)].copy(),
                              counters=counters)
    assert fuzz._compare(program, golden, rtl, dict(counters)) == []
    flipped = rtl.hbm.copy()
    flipped[program.hbm.size - 1] ^= 1
    (problem,) = fuzz._compare(program, golden, dataclasses.replace(rtl, hbm=flipped),
                               dict(counters))
    assert problem.startswith("HBM differs from the golden machine in 1 bytes")
    (problem,) = fuzz._compare(program, golden, rtl, {**counters,
                                                      "cycles": counters["cycles"] + 1})
    assert problem.startswith("cycle model differs") and "'cycles'" in problem
    (problem,) = fuzz._compare(program, golden, dataclasses.replace(rtl, fault=Fault.DEADLOCK),
                               dict(counters))
    assert problem.startswith("RTL ended with DEADLOCK")
    # A timeline that differs in one event, named by its first difference.
    _, timeline = cycle_model.predict_timeline(program)
    assert fuzz._compare(program, golden, dataclasses.replace(rtl, timeline=timeline),
                         dict(counters), timeline) == []
    late = dataclasses.replace(timeline, instructions=list(timeline.instructions))
    first = late.instructions[3]
    late.instructions[3] = dataclasses.replace(first, retired=first.retired + 1)
    (problem,) = fuzz._compare(program, golden, dataclasses.replace(rtl, timeline=late),
                               dict(counters), timeline)
    assert problem == (f"timeline differs from the cycle model's: instructions[3]: RTL "
                       f"{late.instructions[3]}, model {first}")


def test_shrinking_keeps_only_the_operation_that_fails(monkeypatch):
    """Delta debugging over the body operations: a failure that needs operation 7 and
    operation 12 of 30 shrinks to exactly those two."""
    def fake_check(cfg, seeds, *, illegal, sim, keeps=None, operations=None):
        results = []
        for seed, keep in zip(seeds, keeps or [None] * len(seeds), strict=True):
            kept = set(range(30) if keep is None else keep)
            results.append({"seed": seed, "operations": len(kept),
                            "passed": not {7, 12} <= kept, "problems": ["fails"]})
        return results

    monkeypatch.setattr(fuzz, "check_batch", fake_check)
    keep, result = fuzz.shrink(TINY, 5)
    assert keep == [7, 12] and not result["passed"]
    monkeypatch.setattr(fuzz, "check_batch", lambda *a, **k: [{"passed": True}])
    with pytest.raises(ValueError, match="seed 5: passes"):
        fuzz.shrink(TINY, 5)


@pytest.mark.parametrize("argv, message", [
    (["--count", "0"], "--count=0: must be at least 1"),
    (["--count", "99999999999"], "--count=99999999999: at most 1,000,000 programs"),
    (["--jobs", "99999999999999999999"],
     "--jobs=99999999999999999999: at most this machine's"),
    (["--seeds", "-1"], "--seeds=-1: must be at least 0"),
    (["--illegal", "1.5"], "--illegal=1.5: must be a share from 0 to 1"),
    (["--count", "3", "--shrink"], "--shrink: shrinks one program; give --count 1, not 3"),
    (["--ray", "localhost:x"], "--ray=localhost:x: the port must be a number from 1 to 65535"),
    (["--ray", "127.0.0.1:1"], "--ray=127.0.0.1:1: nothing answers at 127.0.0.1:1"),
])
def test_bad_options_are_refused_by_name(argv, message, capsys):
    assert main(["fuzz", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.sim
@pytest.mark.parametrize("cfg, count", [(TINY, 250), (SMALL, 60)], ids=["tiny", "small"])
def test_random_programs_match_on_the_rtl(cfg, count):
    """A campaign on the RTL: no mismatch (the engine timelines included), every opcode
    with every format of the build,
    every DMA space pair and every semaphore pattern hit on tiny, every fault code on both
    (each fault's variants are drawn: the long campaigns of docs/performance.md hit them
    all)."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    campaign = fuzz.run_campaign(cfg, range(count), illegal=0.3, sim=sim, timeline=True)
    assert [r for r in campaign.results if not r["passed"]] == []
    assert len(campaign.results) == count
    if cfg is TINY:
        assert [goal for goal in campaign.missing() if goal[0] != "fault"] == []
    assert {r["fault"] for r in campaign.results} == {fault.name for fault in Fault}


@pytest.mark.sim
def test_a_campaign_runs_on_a_local_ray_instance():
    """Seeds 5000-5039 include 5029, the program that found the reused join."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        import ray  # the test extra has it: CI runs this test
    else:
        ray = pytest.importorskip("ray")
    sim = runner.long_run_simulator()
    require_simulator(sim)
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        campaign = fuzz.run_campaign(TINY, range(5000, 5040), illegal=0.3, sim=sim, batch=10,
                                     ray_address=context.address_info["address"])
    finally:
        ray.shutdown()
    local = fuzz.run_campaign(TINY, range(5000, 5040), illegal=0.3, sim=sim, batch=10)
    assert campaign.results == local.results
    assert len(campaign.results) == 40 and not campaign.failures
