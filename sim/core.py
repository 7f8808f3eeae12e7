"""Run programs on the core RTL under cocotb, with the result in the golden machine's terms
(:class:`opentrn.golden.core.Outcome`), so that a kernel runs on either with the same call.
"""

import json
import tempfile
from pathlib import Path

import numpy as np

from opentrn import cycle_model
from opentrn.golden.core import Outcome
from opentrn.hdl.core import COUNTERS
from opentrn.isa import Engine, Fault
from opentrn.timeline import Timeline

from . import runner

__all__ = ["run_images", "run_programs", "rtl_backend", "watchdog_cycles", "choose_hbm",
           "HBMS", "CoreRunError"]


class CoreRunError(RuntimeError):
    """The simulation itself failed (a hang caught by the watchdog, a testbench error)."""


#: The HBMs a core simulation can have (sim/tb_core.py): ``fast``, hardware beside the core
#: (:class:`opentrn.hdl.axi4_memory.AXI4Memory`: a fixed latency, no Python on the clock);
#: ``axi``, cocotbext-axi's RAM (random latency, back-pressure; every cycle in Python).
HBMS = ("fast", "axi")


#: The most HBM the fast memory holds by default on Icarus: Icarus keeps four-state
#: memories, about 46 bytes a bus word (743 MB for an HBM of 128 MiB, and 8 s
#: of start-up, against 81 MB in all with cocotbext-axi's pages-on-use RAM), for at most
#: 1.4x on Icarus (docs/performance.md); past it the default is ``axi``.
ICARUS_FAST_HBM_BYTES = 16 << 20


def choose_hbm(config, hbm=None, *, latency=(0, 0), backpressure=0.0, sim=None):
    """The HBM of a run: ``hbm`` if given and able to serve it, else ``fast`` where it can
    serve (a fixed latency, no back-pressure, an HBM it can hold) and pays (on Icarus, an
    HBM of at most :data:`ICARUS_FAST_HBM_BYTES`), else ``axi``. Raises ``ValueError``
    naming the setting that ``hbm="fast"`` cannot serve."""
    from opentrn.hdl.axi4_memory import MAX_BYTES

    low, high = (int(x) for x in latency)
    if not 0 <= low <= high:
        raise ValueError(f"latency={latency!r}: must be (low, high) cycles, 0 <= low <= high")
    if hbm not in (None, *HBMS):
        raise ValueError(f"hbm={hbm!r}: must be one of {', '.join(HBMS)}")
    reasons = []
    if low != high:
        reasons.append(f"latency=({low}, {high}) varies (the fast HBM has one latency)")
    if backpressure:
        reasons.append(f"backpressure={backpressure} (the fast HBM never stalls)")
    if config.hbm_bytes > MAX_BYTES:
        reasons.append(f"hbm_bytes={config.hbm_bytes:,} is more than the {MAX_BYTES:,} the "
                       "fast HBM holds")
    if hbm == "fast" and reasons:
        raise ValueError("hbm='fast' cannot serve this run: " + "; ".join(reasons)
                         + "; use hbm='axi'")
    if hbm is None and sim == "icarus" and config.hbm_bytes > ICARUS_FAST_HBM_BYTES:
        return "axi"
    return hbm or ("axi" if reasons else "fast")


#: Cycles the default watchdog adds to the program's bound (the testbench's start-up).
WATCHDOG_SLACK = 10_000


def watchdog_cycles(config, hbm, programs, *, latency=(0, 0), backpressure=0.0):
    """The cycles after which a run has hung: the cycle model's bound for the program at the
    largest latency (:func:`opentrn.cycle_model.upper_bound`: every instruction in turn,
    each at more than its own cost; 1.7 to 9 times the exact prediction on the suite's
    kernels), over ``1 - backpressure``, plus ``WATCHDOG_SLACK``. A legitimate program is
    never cut short; a deadlock on semaphores the hardware reports by itself (``DEADLOCK``)."""
    bound = cycle_model.upper_bound(config, hbm, programs, latency=int(max(latency)))
    return int(bound / (1 - min(backpressure, 0.9))) + WATCHDOG_SLACK


def run_images(config, jobs, *, sim=None, vcd=None, scope=None, latency=(0, 0),
               backpressure=0.0, seed=1, watchdog=None, progress=None, hbm=None,
               timeline=False):
    """Run each job ``(hbm, programs)`` (an HBM image from address 0 and three program
    pointers; a third item ``{"soft_reset": False}`` starts it without the soft reset that
    otherwise comes first) on the core in one simulation, one after another;
    return one :class:`Outcome` per job (its ``hbm`` the image's length of HBM after the run;
    ``counters`` the hardware's) and the :class:`~opentrn.sim.runner.SimResult`, whose
    ``reports`` hold each job's status and timing. ``watchdog`` (cycles) overrides
    :func:`watchdog_cycles` (each job's bound from its instructions). ``hbm``: one of
    :data:`HBMS`, default :func:`choose_hbm`'s (both give the same cycles at a fixed
    latency). ``vcd``: a waves file (VCD; FST on Icarus when it ends in ``.fst``);
    ``scope``: a regex of the scopes it holds (:func:`opentrn.sim.runner.run`).
    ``timeline``: also record each job's :class:`~opentrn.timeline.Timeline` (its
    outcome's ``timeline``; a per-cycle probe, which slows the simulation). A simulation
    that fails raises :class:`CoreRunError`."""
    sim = sim or runner.long_run_simulator()
    hbm_kind = choose_hbm(config, hbm, latency=latency, backpressure=backpressure, sim=sim)
    if timeline and hbm_kind == "axi" and sim == "verilator" and \
            config.pe_rows * config.pe_cols >= runner.HIERARCHICAL_PES:
        # That build makes only the top's ports public (sim/runner.py, PUBLIC_SIGNALS).
        raise ValueError(f"timeline: the hierarchical Verilator build of a "
                         f"{config.pe_rows}x{config.pe_cols} core with the axi HBM shows "
                         "its ports only; use the fast HBM or Icarus for a timeline")
    with tempfile.TemporaryDirectory(prefix="opentrn-core-") as folder:
        folder = Path(folder)
        specs = []
        for index, (hbm, programs, *options) in enumerate(jobs):
            hbm = np.asarray(hbm, dtype=np.uint8)
            image = folder / f"image{index}.npz"
            np.savez(image, hbm=hbm, programs=np.array(programs, dtype=np.uint64))
            specs.append({"image": str(image), "result": str(folder / f"result{index}.npz"),
                          "watchdog": watchdog or watchdog_cycles(
                              config, hbm, programs, latency=latency,
                              backpressure=backpressure),
                          "timeline": str(folder / f"timeline{index}.json") if timeline
                          else None,
                          **(options[0] if options else {})})
        top = "core_with_memory" if hbm_kind == "fast" else "core"
        result = runner.run(config, "opentrn.sim.tb_core", top, sim, env={
            "OPENTRN_JOBS": json.dumps(specs), "OPENTRN_HBM": hbm_kind,
            "OPENTRN_LATENCY": ",".join(str(int(x)) for x in latency),
            "OPENTRN_BACKPRESSURE": backpressure, "OPENTRN_SEED": seed,
        }, vcd=vcd, scope=scope, progress=progress)
        records = [r for r in result.reports if r.get("test") == "job"]
        if not result.passed or len(records) != len(jobs):
            error = CoreRunError(f"the core simulation ({hbm_kind} HBM) failed on {sim}: "
                                 f"see {result.log}")
            error.result = result
            raise error
        outcomes = []
        for spec, record in zip(specs, records, strict=True):
            saved = np.load(spec["result"])
            fault = Fault(record["error_code"]) if record["error"] else Fault.NONE
            outcomes.append(Outcome(
                fault=fault,
                engine=Engine(record["error_engine"]) if record["error"] else None,
                pc=record["error_pc"] if record["error"] else None,
                dma_error_code=record["dma_error_code"] if record["error"] else 0,
                counters={name: int(value) for name, value in
                          zip(COUNTERS, saved["counters"], strict=True)},
                hbm=saved["hbm"].copy(), sbuf=None, psum=None, retired={}, semaphores=[],
                timeline=_timeline(spec["timeline"]) if timeline else None))
        return outcomes, result



def _timeline(path):
    with open(path) as f:
        return Timeline.from_dict(json.load(f))


def run_programs(programs, *, sim=None, **kwargs):
    """Run kernel :class:`~opentrn.kernel.Program` objects of one configuration in one
    simulation: ``(outcomes, SimResult)``."""
    configs = {program.config for program in programs}
    if len(configs) != 1:
        raise ValueError("programs: every program must be built for the same configuration")
    return run_images(configs.pop(), [(p.hbm, p.programs) for p in programs], sim=sim,
                      **kwargs)


def rtl_backend(*, sim=None, **kwargs):
    """A backend for :meth:`opentrn.kernel.Program.run` that runs on the core RTL: the
    same call as the golden machine's. The last run's :class:`SimResult` is kept as the
    backend's ``last_result``."""
    def backend(program):
        (outcome,), result = run_programs([program], sim=sim, **kwargs)
        backend.last_result = result
        return outcome
    backend.last_result = None
    return backend
