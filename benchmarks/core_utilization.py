#!/usr/bin/env python3
"""Measure the whole core on library kernels: how busy the tensor engine is (the hardware's
performance counters) and how fast each simulator runs the core.

    python benchmarks/core_utilization.py [--presets tiny,small] [--sims verilator,icarus]
        [--dtypes int8,bf16,fp8e4m3,mxfp8e4m3] [--set KEY=VALUE ...] [--shapes M,K,N;...]

``--set`` changes every preset as ``opentrn --set`` does, e.g. trn3 scaled to a 16x16 array
(docs/performance.md): ``--presets trn3 --set pe_rows=16 --set pe_cols=16 ...``.

Every shape runs as a kernel (:mod:`opentrn.kernels`) on the core RTL, is checked bit for bit
against numpy, and reports: cycles, tensor-engine busy cycles / cycles (utilization), the
DMA and activation engines' busy cycles, the cycles the tensor engine's sequencer waited on a
semaphore, and the simulated cycles per wall-clock second of the run (from start to the
interrupt, without the build).
"""

import argparse
import json
import sys

import numpy as np

from opentrn import config, kernels, numerics
from opentrn.kernel import FORMAT_DTYPES, same_bits
from opentrn.report import markdown_table
from opentrn.sim import runner
from opentrn.sim.core import run_programs

#: (M, K, N): the issue's compute-bound case, square and skinny shapes, and shapes that are
#: not multiples of the array.
SHAPES = [(128, 128, 128), (64, 64, 64), (32, 256, 32), (256, 32, 64), (100, 60, 90),
          (7, 13, 29), (16, 16, 16)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--sims", default=None, help="default: every simulator that can run")
    parser.add_argument("--speed-shape", default="64,64,64",
                        help="the shape timed on the slower simulators (default: 64,64,64)")
    parser.add_argument("--dtypes", default="int8",
                        help="input formats, each run where the preset has it (default: int8)")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                        default=[], help="override one configuration key (repeatable)")
    parser.add_argument("--shapes", default=None,
                        help="GEMM shapes M,K,N separated by ';' (default: the table's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        shape_list = SHAPES if args.shapes is None else [
            tuple(int(x) for x in text.split(",")) for text in args.shapes.split(";")]
        if any(len(shape) != 3 or min(shape) < 1 for shape in shape_list):
            raise ValueError
    except ValueError:
        parser.error(f"--shapes {args.shapes!r}: must be M,K,N triples of positive integers "
                     "separated by ';'")
    sims = args.sims.split(",") if args.sims else [
        sim for sim in runner.SIMULATORS if runner.available(sim) is None]
    fast = runner.long_run_simulator()
    speed_shape = tuple(int(x) for x in args.speed_shape.split(","))

    rows = []
    for preset in args.presets.split(","):
        try:
            cfg = config.resolve(preset, overrides=args.overrides)
        except config.ConfigError as error:
            parser.error(str(error))
        for sim in sims:
            # The cycle counts do not depend on the simulator: the full table runs on the
            # fastest one, the others time one shape.
            shapes = shape_list if sim == fast else [speed_shape]
            rng = np.random.default_rng(1)
            programs, expected, labels = [], [], []
            for dtype in args.dtypes.split(","):
                if dtype not in cfg.dtypes:
                    continue
                for m, k, n in shapes:
                    fmt = numerics.data_format(dtype)
                    extra = {}
                    if dtype == "int8":
                        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
                        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
                    else:
                        element = fmt.element.name
                        a, b = (rng.standard_normal(shape).astype(np.float32).astype(
                            FORMAT_DTYPES[element]) for shape in ((m, k), (k, n)))
                    if fmt.mx:
                        # E8M0 scales 2**-3 .. 2**3 per block of 32 along K.
                        blocks = -(-k // numerics.MX_BLOCK)
                        extra["block_scales"] = tuple(
                            rng.integers(124, 131, (blocks, cols)).astype(np.uint8)
                            for cols in (m, n))
                    program, reference = kernels.gemm(cfg, a.T.copy(), b, **extra)
                    programs.append(program)
                    expected.append(reference["c"])
                    labels.append((dtype, m, k, n))
            print(f"{preset}: {len(programs)} GEMMs on {sim}", file=sys.stderr, flush=True)
            outcomes, result = run_programs(programs, sim=sim)
            for (dtype, m, k, n), program, outcome, reference, record in zip(
                    labels, programs, outcomes, expected, result.reports, strict=True):
                if not same_bits(program.read_outputs(outcome.hbm)["c"], reference):
                    raise SystemExit(f"{preset} {dtype} {m}x{k}x{n} on {sim}: not bit-exact")
                c = outcome.counters
                rows.append({
                    "preset": preset, "array": f"{cfg.pe_rows}x{cfg.pe_cols}",
                    "sim": sim, "dtype": dtype, "gemm": f"{m}x{k}x{n}", "cycles": c["cycles"],
                    "macs": c["macs"],
                    "tensor_busy": round(c["tensor_busy"] / c["cycles"], 4),
                    # The format's peak: an MX format may do several MACs per PE a cycle.
                    "mac_utilization": round(c["macs"] / (
                        c["cycles"] * cfg.peak_macs_per_cycle * cfg.macs_per_pe_cycle(dtype)),
                        4),
                    "dma_busy": round(c["dma_busy"] / c["cycles"], 4),
                    "activation_busy": round(c["activation_busy"] / c["cycles"], 4),
                    "tensor_wait": c["tensor_wait"],
                    "instructions": sum(program.instruction_counts.values()),
                    "cycles_per_second": round(c["cycles"] / record["wall_seconds"]),
                })
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    headers = ["preset", "simulator", "format", "GEMM MxKxN", "cycles", "tensor busy",
               "MAC utilization", "DMA busy", "activation busy", "tensor waits",
               "instructions", "cycles/s"]
    table = [dict(zip(headers, [
        f"{r['preset']} ({r['array']})", r["sim"], r["dtype"], r["gemm"], r["cycles"],
        f"{100 * r['tensor_busy']:.1f}%", f"{100 * r['mac_utilization']:.1f}%",
        f"{100 * r['dma_busy']:.1f}%", f"{100 * r['activation_busy']:.1f}%",
        r["tensor_wait"], r["instructions"], r["cycles_per_second"]], strict=True))
        for r in rows]
    print(markdown_table(table, headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
