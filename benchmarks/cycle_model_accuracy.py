"""The cycle model against the core RTL, and its fast path against it.

1. RTL vs ``cycle_model.predict``: library kernels (the shapes of the core benchmark in each
   format of the preset, then random GEMM / GEMM + bias + ReLU / MLP shapes) run on the core
   RTL in one simulation per preset; every performance counter is compared.
2. Fast path (``cycle_model.gemm``) vs ``predict`` on GEMM shapes both run.
3. Speed: ``predict``'s cycles per second; the fast path on an 8192^3 GEMM of a ``trn3``
   core; a sweep of 1,000 configurations.

    python benchmarks/cycle_model_accuracy.py [--presets tiny,small] [--random 40] [--json]

Markdown tables on stdout (docs/performance.md), progress on stderr.
"""

import argparse
import itertools
import json
import sys
import time

import numpy as np

from opentrn import config, cycle_model, kernels, numerics
from opentrn.cycle_model import COUNTERS
from opentrn.report import markdown_table

SHAPES = [(16, 16, 16), (7, 13, 29), (64, 64, 64), (32, 256, 32), (256, 32, 64),
          (100, 60, 90), (128, 128, 128)]


def log(text):
    print(text, file=sys.stderr, flush=True)


def gemm_program(cfg, shape, dtype, rng):
    m, k, n = shape
    a, b = kernels.random_inputs(rng, (m, k), dtype), kernels.random_inputs(rng, (k, n), dtype)
    extra = ({"block_scales": (kernels.random_scales(rng, k, m), kernels.random_scales(rng, k, n))}
             if numerics.data_format(dtype).mx else {})
    return kernels.gemm(cfg, a.T.copy(), b, **extra)[0]


def formats(cfg):
    """int8 and one format of each element size and kind the preset builds."""
    wanted = ("int8", "bf16", "fp8e4m3", "mxfp8e4m3")
    return [name for name in wanted if name in cfg.dtypes]


def rtl_accuracy(presets, random_count, sim):
    from opentrn.sim.core import run_programs
    rows = []
    for name in presets:
        cfg = config.preset(name)
        rng = np.random.default_rng(2026)
        jobs = [(f"{dtype} gemm {'x'.join(map(str, shape))}", gemm_program(cfg, shape, dtype,
                                                                           rng))
                for dtype in formats(cfg) for shape in SHAPES]
        jobs += [kernels.random_kernel(cfg, rng, largest=70) for _ in range(random_count)]
        log(f"{name}: {len(jobs)} kernels on {sim}")
        started = time.perf_counter()
        outcomes, _ = run_programs([program for _, program in jobs], sim=sim)
        log(f"{name}: RTL done in {time.perf_counter() - started:.0f} s; predicting")
        for (label, program), outcome in zip(jobs, outcomes, strict=True):
            started = time.perf_counter()
            predicted = cycle_model.predict(program)
            seconds = time.perf_counter() - started
            measured = outcome.counters
            rows.append({
                "preset": name, "kernel": label, "rtl_cycles": measured["cycles"],
                "model_cycles": predicted["cycles"],
                "cycle_error": predicted["cycles"] - measured["cycles"],
                "counters_equal": sum(predicted[c] == measured[c] for c in COUNTERS),
                "model_seconds": round(seconds, 3),
                "model_cycles_per_s": round(predicted["cycles"] / seconds),
            })
    return rows


def fast_path_accuracy(presets):
    rows = []
    for name in presets:
        cfg = config.preset(name)
        rng = np.random.default_rng(7)
        for dtype in formats(cfg):
            for shape in SHAPES:
                program = gemm_program(cfg, shape, dtype, rng)
                exact = cycle_model.predict(program)["cycles"]
                fast = cycle_model.gemm(cfg, *shape, dtype=dtype).cycles
                rows.append({"preset": name, "format": dtype,
                             "gemm": "x".join(map(str, shape)), "model_cycles": exact,
                             "fast_cycles": fast,
                             "error": f"{100 * (fast - exact) / exact:+.1f}%"})
                log(f"fast path {name} {dtype} {shape}: {fast} vs {exact}")
    return rows


def speed():
    trn3 = config.preset("trn3")
    started = time.perf_counter()
    est = cycle_model.gemm(trn3, 8192, 8192, 8192, dtype="bf16")
    one = time.perf_counter() - started
    # 1,000 configurations: array sizes, SBUF sizes, bus widths, bank sizes, HBM bandwidths
    # and formats around trn3's, each projecting a 4096^3 GEMM.
    grid = itertools.product((32, 64, 128, 256), (64, 128, 192, 256, 384), (16, 32, 64, 128),
                             (128, 256, 512), (2.9e12, 4.9e12, 6.0e12), ("bf16", "mxfp8e4m3"))
    configs = [(trn3.replace(pe_rows=rows, pe_cols=rows, sbuf_partitions=rows,
                             sbuf_bytes_per_partition=kib * 1024, dma_bus_bytes=bus,
                             moving_max=moving, hbm_bytes_per_s=hbm), dtype)
               for rows, kib, bus, moving, hbm, dtype in grid]
    configs = configs[:1000]
    started = time.perf_counter()
    for cfg, dtype in configs:
        cycle_model.gemm(cfg, 4096, 4096, 4096, dtype=dtype)
    sweep = time.perf_counter() - started
    return {"trn3_8192_cubed_seconds": round(one, 3), "trn3_8192_cubed_cycles": est.cycles,
            "sweep_configs": len(configs), "sweep_seconds": round(sweep, 2)}


def table(rows):
    return markdown_table(rows, list(rows[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--random", type=int, default=40, help="random kernels per preset")
    parser.add_argument("--sim", default="verilator")
    parser.add_argument("--skip-rtl", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    presets = args.presets.split(",")
    result = {}
    if not args.skip_rtl:
        result["rtl"] = rtl_accuracy(presets, args.random, args.sim)
        result["rtl_summary"] = []
        for name in presets:
            rows = [row for row in result["rtl"] if row["preset"] == name]
            errors = [abs(row["cycle_error"]) / row["rtl_cycles"] for row in rows]
            result["rtl_summary"].append({
                "preset": name, "kernels": len(rows),
                "rtl_cycles": sum(row["rtl_cycles"] for row in rows),
                "all_counters_equal": sum(row["counters_equal"] == len(COUNTERS)
                                          for row in rows),
                "max_cycle_error": f"{100 * max(errors):.2f}%",
                "mean_cycle_error": f"{100 * sum(errors) / len(errors):.2f}%",
                # the model's speed on the kernels long enough for start-up not to count
                "model_cycles_per_s": "{:,} to {:,}".format(*(f(
                    r["model_cycles_per_s"] for r in rows if r["rtl_cycles"] >= 5000)
                    for f in (min, max))),
            })
    result["fast_path"] = fast_path_accuracy(presets)
    errors = [abs(r["fast_cycles"] - r["model_cycles"]) / r["model_cycles"]
              for r in result["fast_path"]]
    result["fast_path_summary"] = {"shapes": len(errors), "max_error": round(max(errors), 4),
                                   "mean_error": round(sum(errors) / len(errors), 4)}
    result["speed"] = speed()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if "rtl" in result:
        print(table(result["rtl"]))
        print()
        print(table(result["rtl_summary"]))
        print()
    print(table(result["fast_path"]))
    print()
    print(table([result["fast_path_summary"]]))
    print()
    print(table([result["speed"]]))


if __name__ == "__main__":
    main()
