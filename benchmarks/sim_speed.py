#!/usr/bin/env python3
"""Benchmark the simulation flow of the tensor engine: Verilog generation and simulator
build times (from an empty cache), and simulated cycles per wall-clock second of the
cocotb random workload, on Icarus and Verilator, for the chosen presets.

    python benchmarks/sim_speed.py [--presets tiny,small] [--cases 2000] [--json]

``cycles_per_s`` is the steady speed: (cycles of the long run - cycles of a 10-matmul run) /
(their difference in wall time), so the simulator's and Python's start-up (``startup_s``)
is not counted in it.

The figures in docs/performance.md come from this script. A benchmark is not a test: it
asserts nothing but that the run is bit-exact (a wrong result is not a speed).
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time

from opentrn import config
from opentrn.report import markdown_table
from opentrn.sim import runner

SHORT_CASES = 10


def _workload(cfg, sim, cases, progress):
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                        testcase="test_random_workload",
                        env={"OPENTRN_CASES": cases, "OPENTRN_SEED": 1}, progress=progress)
    if not result.passed or result.reports[0]["mismatches"]:
        raise SystemExit(f"{sim}: the run was not bit-exact, see {result.log}")
    return result.seconds, result.reports[0]


def measure(preset, sim, cases, progress):
    cfg = config.preset(preset)
    started = time.monotonic()
    build_dir = runner.build(cfg, "tensor_engine", sim, progress=progress)
    built = time.monotonic() - started
    info = runner.build_info(build_dir)
    # Two runs, one short: their difference is the steady simulation speed, without the
    # simulator's and Python's start-up.
    short_seconds, short = _workload(cfg, sim, SHORT_CASES, progress)
    seconds, stats = _workload(cfg, sim, cases, progress)
    return {
        "preset": preset, "sim": sim, "array": f"{cfg.pe_rows}x{cfg.pe_cols}",
        "verilog_s": round(info["verilog_seconds"], 2),
        "build_s": round(info["build_seconds"], 2),
        "first_run_total_s": round(built + seconds, 2),
        "matmuls": stats["cases"], "cycles": stats["cycles"],
        "run_s": round(seconds, 2),
        "startup_s": round(short_seconds - short["cycles"] * (seconds - short_seconds)
                           / (stats["cycles"] - short["cycles"]), 2),
        "cycles_per_s": round((stats["cycles"] - short["cycles"]) / (seconds - short_seconds)),
        "utilization": round(stats["utilization"], 4),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--sims", default=",".join(runner.SIMULATORS))
    parser.add_argument("--cases", type=int, default=2000, help="random matmuls per run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    def progress(text):
        print(f"  {text}", file=sys.stderr, flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OPENTRN_CACHE"] = cache      # time the builds from scratch
        for preset in args.presets.split(","):
            for sim in args.sims.split(","):
                print(f"{preset} on {sim}:", file=sys.stderr, flush=True)
                rows.append(measure(preset, sim, args.cases, progress))
    if args.json:
        print(json.dumps({"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                                     f"Python {platform.python_version()}",
                          "rows": rows}, indent=2))
        return 0
    headers = ["preset", "array", "sim", "verilog_s", "build_s", "matmuls", "cycles",
               "run_s", "startup_s", "cycles_per_s", "first_run_total_s"]
    print(markdown_table(rows, headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
