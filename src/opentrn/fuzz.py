"""Constrained-random program campaigns: :mod:`opentrn.random_program` programs on the golden
machine, the core RTL and the cycle model, compared (``opentrn fuzz``).

For each seed: the program (legal, or with one injected fault for a share of the seeds),
its run on the golden machine, its run on the RTL (programs in batches, each batch one
simulation with the fast HBM), and for a legal program the cycle model's prediction. A
legal program passes when the RTL ends without a fault, its HBM image equals the golden
machine's bit for bit, its ``macs`` and ``dma_bytes`` equal the golden machine's, and every
performance counter equals the cycle model's (with ``timeline``, also its engine timeline,
event for event: :mod:`opentrn.timeline`). A program with a fault passes when the golden
machine ends with the injected code and the RTL with the same code, engine, address and DMA
error code (docs/isa.md: for a program with one fault both report the same; what the
engines did before it can differ, so the images are not compared).

Batches run on a process pool (``jobs``) or on a Ray cluster (``ray_address``); a batch's
result is plain data, so either returns the same. A failing seed replays alone
(``opentrn fuzz --seeds SEED --count 1``) and :func:`shrink` drops operations while it still
fails.
"""

import socket
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from opentrn import cycle_model, numerics
from opentrn.golden.core import Core as GoldenCore
from opentrn.isa import Fault
from opentrn.timeline import Recorder

from . import random_program

__all__ = ["Campaign", "run_campaign", "check_batch", "fault_of_seed", "coverage_goals",
           "check_ray_address", "shrink", "report"]

#: Programs per simulation: the simulator's start-up (about a second) is shared by them.
BATCH = 25
#: The most programs of one campaign: its results stay in memory (a few KB a program).
MAX_PROGRAMS = 1_000_000


def fault_of_seed(seed, illegal):
    """The fault injected into the program of ``seed`` (None: legal) for a share ``illegal``
    of illegal programs: drawn from the seed, every fault code in turn."""
    faults = [fault for fault in Fault if fault != Fault.NONE]
    rng = np.random.default_rng(seed ^ 0x5EED)
    if rng.random() >= illegal:
        return None
    return faults[int(rng.integers(len(faults)))]


def _compare(program, golden, rtl, predicted, timeline=None):
    """The ways ``rtl`` differs from what it must be (an empty list: it passed);
    ``timeline``, the model's, is compared with the RTL's when the run recorded one."""
    problems = []
    expected = program.fault
    if golden.fault != expected:
        problems.append(f"golden machine ended with {golden.fault.name}, the generator "
                        f"meant {expected.name}")
    fields = ("fault", "engine", "pc", "dma_error_code")
    if expected != Fault.NONE:
        if tuple(getattr(rtl, f) for f in fields) != tuple(getattr(golden, f) for f in fields):
            problems.append("fault differs: RTL " + ", ".join(
                f"{f}={getattr(rtl, f)}" for f in fields) + "; golden " + ", ".join(
                f"{f}={getattr(golden, f)}" for f in fields))
        return problems
    if rtl.fault != Fault.NONE:
        problems.append(f"RTL ended with {rtl.fault.name} on {rtl.engine} at pc={rtl.pc} "
                        f"(dma_error_code={rtl.dma_error_code})")
        return problems
    image = golden.hbm[:len(program.hbm)]
    if not np.array_equal(rtl.hbm, image):
        differ = np.flatnonzero(rtl.hbm != image)
        problems.append(f"HBM differs from the golden machine in {len(differ)} bytes, "
                        f"first at {int(differ[0]):#x}")
    for name in ("macs", "dma_bytes"):
        if rtl.counters[name] != golden.counters[name]:
            problems.append(f"{name}: RTL {rtl.counters[name]}, golden {golden.counters[name]}")
    if predicted != rtl.counters:
        wrong = {name: (rtl.counters[name], predicted.get(name)) for name in rtl.counters
                 if rtl.counters[name] != predicted.get(name)}
        problems.append(f"cycle model differs (RTL, model): {wrong}")
    if timeline is not None and rtl.timeline != timeline:
        problems.append("timeline differs from the cycle model's: "
                        + _first_difference(rtl.timeline, timeline))
    return problems


def _first_difference(rtl, model):
    for name in ("cycles", "instructions", "waits", "busy", "bursts"):
        ours, theirs = getattr(rtl, name), getattr(model, name)
        if ours == theirs:
            continue
        if isinstance(ours, list):
            for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
                if a != b:
                    return f"{name}[{index}]: RTL {a}, model {b}"
            return f"{name}: RTL {len(ours)}, model {len(theirs)}"
        return f"{name}: RTL {ours}, model {theirs}"
    return "none"


def check_batch(config, seeds, *, illegal=0.2, sim=None, operations=None, keeps=None,
                timeline=False):
    """Run the programs of ``seeds`` (one simulation) and compare them: a list of result
    dicts ``{seed, fault, variant, passed, problems, cycles, coverage}``. ``keeps`` (for
    shrinking: per seed, the operation indices to keep, or None for all) may repeat a seed
    with different subsets. ``timeline``: also compare every legal program's timeline, event
    for event, with the cycle model's (a per-cycle probe: a slower simulation)."""
    from opentrn.sim.core import CoreRunError, run_images

    keeps = [None] * len(seeds) if keeps is None else list(keeps)
    if len(keeps) != len(seeds):
        raise ValueError(f"keeps has {len(keeps)} entries for {len(seeds)} seeds")
    golden = GoldenCore(config)
    programs, references, predictions, timelines = [], [], [], []
    for seed, keep in zip(seeds, keeps, strict=True):
        program = random_program.generate(config, seed, fault=fault_of_seed(seed, illegal),
                                          operations=operations, keep=keep)
        programs.append(program)
        references.append(golden.run(program.hbm, program.programs))
        recorder = Recorder() if timeline and program.fault == Fault.NONE else None
        predictions.append(cycle_model.simulate(config, program.hbm, program.programs,
                                                recorder=recorder)
                           if program.fault == Fault.NONE else None)
        timelines.append(recorder.finish(predictions[-1]["cycles"]) if recorder else None)
    try:
        outcomes, _ = run_images(config, [(p.hbm, p.programs) for p in programs], sim=sim,
                                 hbm="fast", timeline=timeline)
    except CoreRunError as exc:
        # One failed simulation fails every program of it: replay them one by one to know
        # which (a hang, a testbench error).
        if len(seeds) > 1:
            return [result for seed, keep in zip(seeds, keeps, strict=True)
                    for result in check_batch(config, [seed], illegal=illegal, sim=sim,
                                              operations=operations, keeps=[keep],
                                              timeline=timeline)]
        return [_result(programs[0], [f"simulation failed: {exc}"], None)]
    return [_result(program, _compare(program, reference, outcome, predicted, expected),
                    outcome)
            for program, reference, outcome, predicted, expected in
            zip(programs, references, outcomes, predictions, timelines, strict=True)]


def _result(program, problems, outcome):
    return {"seed": program.seed, "fault": program.fault.name,
            "variant": program.fault_variant, "operations": len(program.operations),
            "passed": not problems, "problems": problems,
            "cycles": outcome.counters["cycles"] if outcome is not None else None,
            "coverage": sorted(map(list, program.coverage))}


def coverage_goals(config):
    """What a campaign on ``config`` should hit: every opcode with every format of the
    build, every DMA space pair, every fault code with each of its variants, every
    semaphore pattern."""
    goals = set()
    for fmt in numerics.matmul_formats(config):
        goals.add(("opcode", "LOAD_STATIONARY", fmt.name))
        goals.add(("opcode", "MATMUL", fmt.name))
    for fmt in numerics.activation_formats(config):
        goals.add(("opcode", "ACTIVATE", fmt.name))
    goals.add(("opcode", "DMA", ""))
    goals.add(("opcode", "NOP", ""))
    for src in ("HBM", "SBUF", "PSUM"):
        for dst in ("HBM", "SBUF", "PSUM"):
            goals.add(("dma", src, dst))
    for fault, variants in random_program.FAULTS.items():
        for variant in variants:
            if variant == "format not built" and not [
                    f for f in numerics.TENSOR_FORMATS if f not in config.dtypes]:
                continue
            goals.add(("fault", fault, variant))
    for pattern in random_program.PATTERNS:
        goals.add(("pattern", pattern))
    return goals


@dataclass
class Campaign:
    """A campaign's results: ``results`` per program, and the coverage against the goals."""
    config: object
    results: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self):
        return [r for r in self.results if not r["passed"]]

    def covered(self):
        return {tuple(item) for r in self.results for item in r["coverage"]}

    def missing(self):
        return sorted(coverage_goals(self.config) - self.covered())

    def summary(self):
        faults = {}
        for r in self.results:
            faults[r["fault"]] = faults.get(r["fault"], 0) + 1
        legal = [r for r in self.results if r["fault"] == "NONE"]
        goals = coverage_goals(self.config)
        return {
            "programs": len(self.results), "failures": len(self.failures),
            "legal": len(legal), "by_fault": faults,
            "cycles": sum(r["cycles"] or 0 for r in self.results),
            "seconds": round(self.seconds, 1),
            "programs_per_second": round(len(self.results) / self.seconds, 2)
            if self.seconds else None,
            "coverage": f"{len(goals & self.covered())}/{len(goals)}",
            "missing": [" ".join(item) for item in self.missing()],
        }


def _batches(seeds, size):
    for start in range(0, len(seeds), size):
        yield seeds[start:start + size]


def run_campaign(config, seeds, *, illegal=0.2, jobs=1, sim=None, ray_address=None,
                 batch=BATCH, progress=None, timeline=False):
    """Run every seed of ``seeds``; return a :class:`Campaign`. ``progress(done, total,
    failures)`` hears after each batch; ``timeline``: :func:`check_batch`'s."""
    if len(seeds) > MAX_PROGRAMS:
        raise ValueError(f"{len(seeds):,} programs: a campaign runs at most "
                         f"{MAX_PROGRAMS:,} (its results stay in memory); run several")
    seeds = list(seeds)
    campaign = Campaign(config)
    started = time.monotonic()

    def collect(results):
        campaign.results += results
        if progress is not None:
            progress(len(campaign.results), len(seeds), len(campaign.failures),
                     time.monotonic() - started)

    batches = list(_batches(seeds, batch))
    if ray_address is not None:
        import ray

        check_ray_address(ray_address)
        ray.init(address=ray_address, ignore_reinit_error=True, log_to_driver=False)
        remote = ray.remote(check_batch)
        pending = [remote.remote(config, chunk, illegal=illegal, sim=sim, timeline=timeline)
                   for chunk in batches]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            collect(ray.get(ready[0]))
    elif jobs <= 1:
        for chunk in batches:
            collect(check_batch(config, chunk, illegal=illegal, sim=sim, timeline=timeline))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(check_batch, config, chunk, illegal=illegal, sim=sim,
                                   timeline=timeline)
                       for chunk in batches]
            for future in as_completed(futures):
                collect(future.result())
    campaign.results.sort(key=lambda r: r["seed"])
    campaign.seconds = time.monotonic() - started
    return campaign


def check_ray_address(address, timeout=5.0):
    """Refuse a Ray address ``host:port`` (or ``ray://host:port``) that nothing answers at,
    in seconds: ``ray.init`` would retry for minutes. Other forms (``auto``) go to Ray."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray address {address!r}: the port must be a number from 1 to "
                         f"65535, not {port!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(f"ray address {address!r}: nothing answers at {host}:{port} "
                         f"({exc.strerror or exc})") from None


def shrink(config, seed, *, illegal=0.2, sim=None, progress=None):
    """The smallest list of body operations of ``seed``'s program (indices) found that still
    fails, by removing chunks of operations while it does (delta debugging); each round's
    candidates run in one simulation. Returns ``(indices, result)``; raises ``ValueError``
    if the seed passes."""
    say = progress or (lambda text: None)
    (first,) = check_batch(config, [seed], illegal=illegal, sim=sim)
    if first["passed"]:
        raise ValueError(f"seed {seed}: passes; nothing to shrink")
    keep = list(range(first["operations"]))
    result = first
    chunk = max(1, len(keep) // 2)
    while chunk >= 1:
        candidates = [keep[:start] + keep[start + chunk:]
                      for start in range(0, len(keep), chunk)]
        outcomes = check_batch(config, [seed] * len(candidates), illegal=illegal, sim=sim,
                               keeps=candidates)
        found = next(((candidate, outcome) for candidate, outcome
                      in zip(candidates, outcomes, strict=True) if not outcome["passed"]), None)
        if found is not None:
            keep, result = found
            say(f"seed {seed}: {len(keep)} operations still fail")
            chunk = min(chunk, max(1, len(keep) // 2))
        elif chunk == 1:
            break
        else:
            chunk //= 2
    return keep, result



def report(campaign, *, replay):
    """The readable report of ``campaign``: a summary, the failures with the command that
    replays each (``replay(seed)``), and the coverage."""
    from opentrn.report import key_value_table, markdown_table

    summary = campaign.summary()
    lines = [key_value_table([
        ("programs", f"{summary['programs']} ({summary['legal']} legal, "
                     + ", ".join(f"{count} {fault}" for fault, count in
                                 sorted(summary["by_fault"].items()) if fault != "NONE")
                     + ")"),
        ("mismatches", summary["failures"]),
        ("simulated cycles", f"{summary['cycles']:,}"),
        ("wall time", f"{summary['seconds']} s ({summary['programs_per_second']} "
                      "programs/s)"),
        ("coverage", summary["coverage"] + (" (missing: " + "; ".join(summary["missing"])
                                            + ")" if summary["missing"] else "")),
    ])]
    if campaign.failures:
        lines += ["", markdown_table([
            {"seed": r["seed"], "fault": r["fault"], "problem": r["problems"][0],
             "replay": f"`{replay(r['seed'])}`"} for r in campaign.failures[:50]],
            ["seed", "fault", "problem", "replay"])]
    counts = {}
    for r in campaign.results:
        for item in r["coverage"]:
            counts[tuple(item)] = counts.get(tuple(item), 0) + 1
    rows = [{"kind": kind, "item": " ".join(rest), "programs": count}
            for (kind, *rest), count in sorted(counts.items())]
    lines += ["", markdown_table(rows, ["kind", "item", "programs"])]
    return "\n".join(lines)
