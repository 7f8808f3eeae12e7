#!/usr/bin/env python3
"""Benchmark whole-core simulation with each HBM: the HBM in hardware beside the core
(``fast``: no Python on the clock) against cocotbext-axi's RAM (``axi``: Python every
cycle), on a library GEMM, on each simulator.

    python benchmarks/core_sim_speed.py [--preset tiny] [--sims verilator,icarus]
        [--shape 128,128,128] [--icarus-shape 64,64,64] [--dtype int8] [--json]

Each row is one run (the model already built: a first run builds it and is not timed):
``cycles``, ``run_s`` (from start to the interrupt), ``cycles_per_s`` (cycles / run_s),
``load_s`` and ``read_s`` (the image into the HBM before the run, back after it) and
``total_s`` (the whole simulation: start-up, load, run, read back). Both HBMs' counters must
be equal and the results bit-exact against numpy, or the benchmark fails: a wrong result is
not a speed. The figures in docs/performance.md come from this script.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from opentrn import config, kernels
from opentrn.kernel import FORMAT_DTYPES, same_bits
from opentrn.report import markdown_table
from opentrn.sim import runner
from opentrn.sim.core import HBMS, run_programs


def _shape(text):
    m, k, n = (int(x) for x in text.split(","))
    return m, k, n


def _program(cfg, dtype, shape):
    m, k, n = shape
    rng = np.random.default_rng(5)
    if dtype == "int8":
        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    else:
        a = rng.standard_normal((m, k)).astype(FORMAT_DTYPES[dtype])
        b = rng.standard_normal((k, n)).astype(FORMAT_DTYPES[dtype])
    return kernels.gemm(cfg, a.T.copy(), b)


def measure(cfg, preset, sim, dtype, shape, progress):
    program, expected = _program(cfg, dtype, shape)
    rows, counters = [], {}
    for hbm in HBMS:
        progress(f"{preset} {sim} {hbm}: building (untimed)")
        runner.build(cfg, "core_with_memory" if hbm == "fast" else "core", sim,
                     progress=progress)
        progress(f"{preset} {sim} {hbm}: running {'x'.join(map(str, shape))} {dtype}")
        started = time.monotonic()
        (outcome,), result = run_programs([program], sim=sim, hbm=hbm)
        total = time.monotonic() - started
        if not same_bits(program.read_outputs(outcome.hbm)["c"], expected["c"]):
            raise SystemExit(f"{sim}/{hbm}: the GEMM was not bit-exact, see {result.log}")
        counters[hbm] = outcome.counters
        record = next(r for r in result.reports if r.get("test") == "job")
        cycles = outcome.counters["cycles"]
        rows.append({
            "preset": preset, "sim": sim, "hbm": hbm, "dtype": dtype,
            "gemm": "x".join(map(str, shape)), "cycles": cycles,
            "run_s": round(record["wall_seconds"], 2),
            "cycles_per_s": round(cycles / record["wall_seconds"]),
            "load_s": round(record["load_seconds"], 3),
            "read_s": round(record["read_seconds"], 3),
            "total_s": round(total, 2),
        })
    if counters["fast"] != counters["axi"]:
        raise SystemExit(f"{sim}: the HBMs' counters differ: {counters}")
    fast, axi = rows
    fast["speedup"] = axi["speedup"] = round(fast["cycles_per_s"] / axi["cycles_per_s"], 1)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--sims", default=None, help="default: every simulator that can run")
    parser.add_argument("--shape", type=_shape, default=(128, 128, 128),
                        help="M,K,N of the GEMM on Verilator (default 128,128,128)")
    parser.add_argument("--icarus-shape", type=_shape, default=(64, 64, 64),
                        help="M,K,N on Icarus (default 64,64,64)")
    parser.add_argument("--dtype", default="int8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sims = args.sims.split(",") if args.sims else [
        sim for sim in runner.SIMULATORS if runner.available(sim) is None]

    def progress(text):
        print(f"  {text}", file=sys.stderr, flush=True)

    cfg = config.preset(args.preset)
    rows = []
    for sim in sims:
        shape = args.icarus_shape if sim == "icarus" else args.shape
        rows += measure(cfg, args.preset, sim, args.dtype, shape, progress)
    if args.json:
        print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                                     f"Python {platform.python_version()}",
                          "rows": rows}, indent=2))
        return 0
    print(markdown_table(rows, ["preset", "sim", "hbm", "dtype", "gemm", "cycles", "run_s",
                                "cycles_per_s", "speedup", "load_s", "read_s", "total_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
