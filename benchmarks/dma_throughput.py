#!/usr/bin/env python3
"""Measure DMA throughput on the RTL (the ``memory_system`` top: the DMA engine and the SBUF
hardware): one large contiguous descriptor (every SBUF partition, its whole size) HBM -> SBUF
and SBUF -> HBM, with a zero-latency and a 100-cycle-latency HBM model and no
back-pressure, in bytes per cycle against the bus peak (dma_bus_bytes).

    python benchmarks/dma_throughput.py [--presets tiny,small] [--sim verilator] [--json]

Cycles run from the cycle the descriptor is accepted to the cycle ``done`` pulses, so the
descriptor check, the first latency and the last write response are all counted.
"""

import argparse
import json
import sys

from opentrn import config
from opentrn.report import markdown_table
from opentrn.sim import runner


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--latencies", default="0,100")
    parser.add_argument("--sim", default=None, help="default: Verilator if it can run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sim = args.sim or runner.long_run_simulator()

    rows = []
    for preset in args.presets.split(","):
        cfg = config.preset(preset)
        for latency in map(int, args.latencies.split(",")):
            for direction in ("hbm_to_sbuf", "sbuf_to_hbm"):
                print(f"{preset}: {direction}, latency {latency}, on {sim}", file=sys.stderr,
                      flush=True)
                result = runner.run(cfg, "opentrn.sim.tb_dma", "memory_system", sim,
                                    testcase="test_throughput",
                                    env={"OPENTRN_LATENCY": latency,
                                         "OPENTRN_DIRECTION": direction})
                if not result.passed:
                    raise SystemExit(f"{preset} {direction}: not bit-exact: {result.log}")
                (record,) = result.reports
                rows.append({
                    "preset": preset, "direction": direction.replace("_to_", " -> "),
                    "latency": latency, "bytes": record["bytes"],
                    "cycles": record["transfer_cycles"],
                    "bytes_per_cycle": round(record["bytes_per_cycle"], 3),
                    "peak": record["peak_bytes_per_cycle"],
                    "of_peak": f"{100 * record['efficiency']:.1f}%",
                })
    if args.json:
        print(json.dumps({"sim": sim, "rows": rows}, indent=2))
    else:
        print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
