"""Run jobs on the simulated FPGA board top through the host driver (:mod:`opentrn.board`,
the code that drives a real board), with the result in the golden machine's terms
(:class:`opentrn.golden.core.Outcome`), as :mod:`opentrn.sim.core` does for the core alone
(docs/fpga.md, "Simulated board")."""

import json
import tempfile
from pathlib import Path

import numpy as np

from opentrn.golden.core import Outcome
from opentrn.isa import Engine, Fault

from . import runner

__all__ = ["run_images", "run_programs", "board_backend", "BoardRunError"]


class BoardRunError(RuntimeError):
    """The simulation itself failed (the testbench or the driver raised unexpectedly)."""


def run_images(config, jobs, *, cases=(), sim=None, vcd=None, progress=None):
    """Run the protocol ``cases`` (see :mod:`opentrn.sim.tb_board`), then each job
    ``(hbm, programs)`` or ``(hbm, programs, options)`` (``options``: keyword arguments of
    :meth:`opentrn.board.Board.run_job`) on the board top of ``config`` in one simulation,
    through :class:`opentrn.board.Board` over the simulated UART. Returns ``(outcomes,
    records, SimResult)``: an :class:`Outcome` per job (``None`` for a job whose run raised
    without one, e.g. a timeout; the job's record has the exception), and the records of
    the cases and jobs in order (with the board's INFO first)."""
    sim = sim or runner.long_run_simulator()
    with tempfile.TemporaryDirectory(prefix="opentrn-board-") as folder:
        folder = Path(folder)
        specs = []
        for index, (hbm, programs, *options) in enumerate(jobs):
            image = folder / f"image{index}.npz"
            np.savez(image, hbm=np.asarray(hbm, dtype=np.uint8),
                     programs=np.array(programs, dtype=np.uint64))
            specs.append({"image": str(image), "result": str(folder / f"result{index}.npz"),
                          "options": options[0] if options else {}})
        script = {"cases": list(cases), "jobs": specs}
        result = runner.run(config, "opentrn.sim.tb_board", "board_top", sim,
                            env={"OPENTRN_BOARD_SCRIPT": json.dumps(script)}, vcd=vcd,
                            progress=progress)
        records = result.reports
        job_records = [r for r in records if r.get("test") == "job"]
        if not result.passed or len(job_records) != len(jobs):
            error = BoardRunError(f"the board simulation failed on {sim}: see {result.log}")
            error.result = result
            raise error
        outcomes = []
        for spec, record in zip(specs, job_records, strict=True):
            if not record.get("outcome"):
                outcomes.append(None)
                continue
            hbm = np.load(spec["result"])["hbm"].copy()
            faulted = record["fault"] != Fault.NONE
            outcomes.append(Outcome(
                fault=Fault(record["fault"]),
                engine=Engine(record["engine"]) if faulted else None,
                pc=record["pc"] if faulted else None,
                dma_error_code=record["dma_error_code"],
                counters={name: int(value) for name, value in record["counters"].items()},
                hbm=hbm, sbuf=None, psum=None, retired={}, semaphores=[]))
        return outcomes, records, result


def run_programs(programs, *, sim=None, **kwargs):
    """Run kernel :class:`~opentrn.kernel.Program` objects of one configuration on the
    simulated board, in one simulation: ``(outcomes, records, SimResult)``."""
    configs = {program.config for program in programs}
    if len(configs) != 1:
        raise ValueError("programs: every program must be built for the same configuration")
    return run_images(configs.pop(), [(p.hbm, p.programs) for p in programs], sim=sim,
                      **kwargs)


def board_backend(*, sim=None, **kwargs):
    """A backend for :meth:`opentrn.kernel.Program.run` that runs on the simulated board."""
    def backend(program):
        (outcome,), _, result = run_programs([program], sim=sim, **kwargs)
        backend.last_result = result
        return outcome
    backend.last_result = None
    return backend
