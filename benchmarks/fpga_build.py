#!/usr/bin/env python3
"""Benchmark the FPGA flow: each block of a preset built out of context on the ECPIX-5's
part (LFE5UM5G-85F, speed grade 8) by ``opentrn.fpga.build``, then optionally the whole
core and the board top with its bitstream: resources, Fmax against the target clock, the
critical path's ends and the tools' time. docs/fpga.md has the figures.

    python benchmarks/fpga_build.py [--preset fpga] [--set key=value ...]
        [--tops tensor_engine,psum,sbuf,activation_engine,dma,memory_system] [--core]
        [--board ecpix5-85f] [--json] [--build-root DIR]

The core and the board top take the longest (the placer alone ten to twenty minutes on two
cores). A build that does not route is stopped by the flow (``fpga.RoutingStalled``); its
row then says so and names the block with the most overused wires.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from opentrn import config, fpga
from opentrn.report import markdown_table

BLOCKS = ("tensor_engine", "psum", "sbuf", "activation_engine", "dma", "memory_system")


def _row(name, result, seconds):
    resources = {row["resource"]: row for row in result.resources}
    [clock] = result.clocks or [{"achieved_mhz": "-", "target_mhz": "-", "met": False}]
    [path] = result.critical_paths[:1] or [{"start": "-", "end": "-", "logic_ns": "-",
                                            "routing_ns": "-"}]
    return {
        "block": name,
        "LUT4": resources["LUT4"]["used"], "FF": resources["FF"]["used"],
        "DSP": resources["DSP (18x18)"]["used"], "BRAM": resources["block RAM (18 kbit)"]["used"],
        "Fmax MHz": clock["achieved_mhz"], "target MHz": clock["target_mhz"],
        "met": "yes" if clock["met"] else "no",
        "critical path": f"{path['start']} -> {path['end']}",
        "logic/routing ns": f"{path['logic_ns']} / {path['routing_ns']}",
        "seconds": round(seconds),
    }


def _unrouted_row(name, stalled, seconds):
    [worst] = stalled.congestion[:1] or [{"block": "-", "percent": 0.0}]
    return {
        "block": name, "LUT4": "-", "FF": "-", "DSP": "-", "BRAM": "-",
        "Fmax MHz": "does not route", "target MHz": "-", "met": "no",
        "critical path": f"{stalled.overused:,} wires overused after pass "
                         f"{stalled.iteration}; most in {worst['block']} "
                         f"({worst['percent']}%)",
        "logic/routing ns": "-", "seconds": round(seconds),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fpga", choices=list(config.PRESETS))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--tops", default=",".join(BLOCKS))
    parser.add_argument("--core", action="store_true", help="also the whole core")
    parser.add_argument("--board", choices=list(fpga.BOARDS), help="also the board top")
    parser.add_argument("--build-root", default="build/fpga-benchmark")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cfg = config.resolve(args.preset, None, args.overrides)

    def progress(text):
        print(f"    {text}", file=sys.stderr, flush=True)

    builds = [(top, "ooc") for top in args.tops.split(",") if top]
    if args.core:
        builds.append(("core", "ooc"))
    if args.board:
        builds.append(("board top", args.board))
    rows = []
    for name, target in builds:
        print(f"{name} ({target})", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            result = fpga.build(cfg, Path(args.build_root) / f"{args.preset}-{name}-{target}",
                                board=target, top=name if target == "ooc" else "core",
                                progress=progress)
        except fpga.RoutingStalled as stalled:
            rows.append(_unrouted_row(name, stalled, time.monotonic() - started))
            continue
        rows.append(_row(name, result, time.monotonic() - started))
    if args.json:
        print(json.dumps({"preset": args.preset, "overrides": args.overrides,
                          "part": next(iter(fpga.PARTS)), "rows": rows}, indent=2))
    else:
        print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
