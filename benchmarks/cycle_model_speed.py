#!/usr/bin/env python3
"""The exact cycle model's speed: cycles predicted per second of Python.

    python benchmarks/cycle_model_speed.py [--repeat 3] [--json]

Times ``cycle_model.predict`` (the whole core stepped cycle by cycle) on three library GEMMs
of about 17,000 to 144,000 cycles: int8 128^3 and MXFP8 64^3 on ``tiny``, and BF16 1024^3 on
one ``trn3`` core with the one DMA engine the RTL builds (``dma_engines=1``). Each is the
best of ``--repeat`` runs, since other work on the machine only slows a run down. The
program is built once, outside the timing.
"""

import argparse
import json
import sys
import time

import numpy as np

from opentrn import config, cycle_model, kernels
from opentrn.report import markdown_table

#: (preset, overrides, format, (M, K, N)); the exact model follows trn3 with one DMA engine.
CASES = [("tiny", [], "int8", (128, 128, 128)),
         ("tiny", [], "mxfp8e4m3", (64, 64, 64)),
         ("trn3", ["dma_engines=1"], "bf16", (1024, 1024, 1024))]


def measure(preset, overrides, dtype, shape, repeat):
    cfg = config.resolve(preset, overrides=overrides)
    program = kernels.random_gemm(cfg, np.random.default_rng(0), *shape, dtype)
    best = None
    for _ in range(repeat):
        started = time.perf_counter()
        cycles = cycle_model.predict(program)["cycles"]
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    return {"preset": ", ".join([preset, *overrides]), "format": dtype,
            "gemm": "x".join(map(str, shape)),
            "cycles": cycles, "seconds": round(best, 3),
            "cycles_per_s": round(cycles / best)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each kernel, the fastest reported (default 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}: must be at least 1")
    rows = []
    for preset, overrides, dtype, shape in CASES:
        print(f"timing {preset} {dtype} {'x'.join(map(str, shape))} ({args.repeat} runs)",
              file=sys.stderr, flush=True)
        rows.append(measure(preset, overrides, dtype, shape, args.repeat))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    headers = ["preset", "format", "GEMM MxKxN", "cycles", "seconds", "cycles/s"]
    print(markdown_table([dict(zip(headers, [
        r["preset"], r["format"], r["gemm"], f"{r['cycles']:,}", f"{r['seconds']:.2f}",
        f"{r['cycles_per_s']:,}"], strict=True)) for r in rows], headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
