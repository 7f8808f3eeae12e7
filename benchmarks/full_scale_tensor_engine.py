#!/usr/bin/env python3
"""Benchmark the tensor engine at Trainium scale in simulation: the preset's array (every
format it builds) built by Verilator, running ``test_full_matmuls`` of
``opentrn.sim.tb_tensor_engine`` (per format, K = the format's contraction, M = pe_cols,
N = moving_max: a fresh stationary tile, then the tile reused), then ``test_back_to_back``
(24 matmuls, each with a fresh tile, of N = the fresh-tile issue interval: 64 at 128x128
with trn3's fast weight load), every result beat compared with the golden model for
equality and with the documented cycle formulas.

    python benchmarks/full_scale_tensor_engine.py [--preset trn3] [--size 128] [--json]

Reports the Verilog generation and Verilator build times (from an empty cache), the peak
memory of the largest build process, the simulated cycles, the wall time of the simulation
and the simulated cycles per second; for the fresh-tile stream, its N and the moving
stream's idle cycles between its first and last vector (0: a matmul every N cycles).
docs/performance.md has the figures. Rerunning with the same cache (``OPENTRN_CACHE``)
reuses the build and reports its recorded times.
"""

import argparse
import json
import platform
import resource
import sys

from opentrn import config
from opentrn.golden import tensor_engine as golden
from opentrn.report import markdown_table
from opentrn.sim import runner


def measure(cfg, progress):
    build_dir = runner.build(cfg, "tensor_engine", "verilator", progress=progress)
    info = runner.build_info(build_dir)
    peak_build_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", "verilator",
                        testcase="test_full_matmuls", env={"OPENTRN_SEED": 1},
                        progress=progress)
    if not result.passed or len(result.reports) != 1:
        raise SystemExit(f"the full-size run failed: see {result.log}")
    record = result.reports[0]
    n = golden.issue_interval(cfg, 1, fresh=True)
    stream = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", "verilator",
                        testcase="test_back_to_back", env={"OPENTRN_SEED": 1, "OPENTRN_N": n},
                        progress=progress)
    if not stream.passed or len(stream.reports) != 1:
        raise SystemExit(f"the fresh-tile stream failed: see {stream.log}")
    fresh = stream.reports[0]
    return {
        "array": f"{cfg.pe_rows}x{cfg.pe_cols}",
        "formats": "/".join(record["formats"]),
        "verilog_s": round(info["verilog_seconds"], 1),
        "build_s": round(info["build_seconds"], 1),
        "hierarchical": info.get("hierarchical", False),
        "peak_build_mib": round(peak_build_mib),
        "matmuls": record["cases"],
        "beats": record["beats"],
        "mismatches": record["mismatches"],
        "cycle_mismatches": record["cycle_mismatches"],
        "cycles": record["cycles"],
        "sim_s": round(result.seconds, 1),
        "cycles_per_s": round(record["cycles"] / result.seconds, 1),
        "fresh_tile_n": fresh["n"],
        "fresh_tile_matmuls": fresh["cases"],
        "fresh_tile_idle": fresh["moving_idle_cycles"],
        "fresh_tile_mismatches": fresh["mismatches"] + fresh["cycle_mismatches"],
        "fresh_tile_sim_s": round(stream.seconds, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="trn3")
    parser.add_argument("--size", type=int, default=None,
                        help="pe_rows = pe_cols = sbuf_partitions (default: the preset's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    overrides = [] if args.size is None else [
        f"{key}={args.size}" for key in ("pe_rows", "pe_cols", "sbuf_partitions")]
    cfg = config.resolve(args.preset, overrides=overrides)

    def progress(line):
        print(f"  {line}", file=sys.stderr, flush=True)

    row = measure(cfg, progress)
    row["machine"] = f"{platform.machine()}, Python {platform.python_version()}"
    if args.json:
        print(json.dumps(row, indent=1))
        return
    headers = ["array", "formats", "verilog_s", "build_s", "peak_build_mib", "matmuls",
               "beats", "mismatches", "cycle_mismatches", "cycles", "sim_s", "cycles_per_s",
               "fresh_tile_n", "fresh_tile_matmuls", "fresh_tile_idle",
               "fresh_tile_mismatches", "fresh_tile_sim_s"]
    print(markdown_table([row], headers))


if __name__ == "__main__":
    main()
