#!/usr/bin/env python3
"""Benchmark Verilog generation at Trainium scale: for each array size and top level, the
wall time and peak memory of ``opentrn.sim.runner.verilog_source`` (Amaranth's elaboration
and the bundled Yosys), and the size of the Verilog it writes (lines, bytes, modules);
optionally the time of ``verilator --lint-only`` on it, module by module
(``runner.lint(..., per_module=True)``: a whole-design lint does not fit in memory at
128x128).

    python benchmarks/verilog_generation.py [--preset trn3] [--sizes 16,32,64,128]
        [--tops tensor_engine,core] [--set key=value ...] [--lint] [--json]

Each size is the preset with ``pe_rows = pe_cols = sbuf_partitions = size`` (every other
field, the formats among them, as the preset has it). Each generation runs in a fresh
process, so its peak memory (``ru_maxrss``: Python, Amaranth and the WebAssembly Yosys all
live in it) is its own. docs/performance.md has the figures.
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from opentrn import config
from opentrn.report import markdown_table


def _generate(cfg, top, path):
    """In the worker process: write the Verilog, return the measurements."""
    from opentrn.sim import runner

    started = time.monotonic()
    text = runner.verilog_source(cfg, top, progress=lambda line: print(
        f"    {line}", file=sys.stderr, flush=True))
    seconds = time.monotonic() - started
    Path(path).write_text(text)
    return {
        "seconds": round(seconds, 2),
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "lines": text.count("\n"),
        "mbytes": round(len(text) / 1e6, 2),
        "modules": sum(1 for line in text.splitlines() if line.startswith("module ")),
    }


def measure(cfg, top, *, lint, timeout):
    with TemporaryDirectory() as folder:
        path = Path(folder) / f"{top}.v"
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(cfg.to_dict()), top,
                 str(path)],
                stdout=subprocess.PIPE, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"seconds": f"> {timeout}", "note": "timed out"}
        if done.returncode != 0:
            return {"note": f"failed (exit {done.returncode})"}
        row = json.loads(done.stdout)
        if lint:
            from opentrn.sim import runner
            started = time.monotonic()
            ok, output = runner.lint(path, top, per_module=True)
            row["lint_s"] = round(time.monotonic() - started, 1)
            row["lint"] = "clean" if ok else output.strip().splitlines()[0][:120]
        return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="trn3")
    parser.add_argument("--sizes", default="16,32,64,128")
    parser.add_argument("--tops", default="tensor_engine,core")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="configuration override (repeatable)")
    parser.add_argument("--lint", action="store_true", help="also time verilator --lint-only")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds before a generation is given up (default: 3600)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        values, top, path = args.worker
        cfg = config.Config.from_dict(json.loads(values))
        print(json.dumps(_generate(cfg, top, path)))
        return 0

    rows = []
    for top in args.tops.split(","):
        for size in (int(text) for text in args.sizes.split(",")):
            cfg = config.resolve(args.preset, overrides=[
                *args.overrides, f"pe_rows={size}", f"pe_cols={size}",
                f"sbuf_partitions={size}"])
            print(f"{top} {size}x{size} ({','.join(cfg.dtypes)}):", file=sys.stderr,
                  flush=True)
            row = {"top": top, "array": f"{size}x{size}", "formats": ",".join(cfg.dtypes),
                   **measure(cfg, top, lint=args.lint, timeout=args.timeout)}
            print(f"  {row}", file=sys.stderr, flush=True)
            rows.append(row)
    if args.json:
        print(json.dumps({"machine": platform.platform(), "preset": args.preset,
                          "overrides": args.overrides, "rows": rows}, indent=1))
    else:
        headers = list(dict.fromkeys(key for row in rows for key in row))
        print(markdown_table([{key: row.get(key, "") for key in headers} for row in rows],
                             headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
