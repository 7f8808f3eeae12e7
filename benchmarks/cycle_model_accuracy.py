"""The cycle model against the core RTL, and its fast path against it.

1. RTL vs ``cycle_model.predict``: library kernels (the shapes of the core benchmark in each
   format of the preset, then random GEMM / GEMM + bias + ReLU / MLP shapes) run on the core
   RTL in one simulation per preset; every performance counter is compared.
2. Fast path (``cycle_model.gemm``) vs ``predict`` on GEMM shapes both run: the core
   benchmark's shapes, then ``--shapes`` seeded random shapes per preset and format (K = 1,
   K much larger than M and N, sizes just past a tile, a PSUM bank or the SBUF's K tiles,
   and log-uniform ones); and ``--trainium-shapes`` random shapes per format on ``trn3``
   with the one DMA engine the RTL builds, and ``--large-trainium-shapes`` there with M, K
   and N from 512 to 4096 (where ``opentrn project`` takes the fast path's count);
   ``--bus-widths 4,16,32,64``: ``--shapes`` random int8 shapes on ``tiny`` with each of
   those buses (and an HBM that does not limit it, so that the exact model follows the
   configuration). Beside them, what ``opentrn project``
   reports for one core (the exact model's cycles where it follows the configuration and the kernel
   is short, else the fast path's: ``projection.EXACT_MAX_CYCLES``). ``--full-size 4096``:
   the same at S^3 on that ``trn3`` in BF16, FP8 and MXFP8 (minutes each: the program is
   built and the exact model runs every cycle), or in those of ``--full-size-formats``.
   ``--one-slot``: the same on a few ``trn3`` GEMMs whose blocks keep one moving slot,
   refilled a K tile at a time (a minute).
3. Speed: ``predict``'s cycles per second; the fast path on an 8192^3 GEMM of a ``trn3``
   core; a sweep of 1,000 configurations.

    python benchmarks/cycle_model_accuracy.py [--presets tiny,small] [--random 40]
        [--shapes 300] [--trainium-shapes 0] [--large-trainium-shapes 0]
        [--bus-widths W[,W...]] [--full-size S[,S...]]
        [--full-size-formats F[,F...]] [--one-slot] [--skip-rtl] [--json]

Markdown tables on stdout (docs/performance.md), progress on stderr.
"""

import argparse
import itertools
import json
import sys
import time

import numpy as np

from opentrn import config, cycle_model, kernels, projection, schedule
from opentrn.cycle_model import COUNTERS
from opentrn.report import markdown_table

SHAPES = [(16, 16, 16), (7, 13, 29), (64, 64, 64), (32, 256, 32), (256, 32, 64),
          (100, 60, 90), (128, 128, 128)]


def log(text):
    print(text, file=sys.stderr, flush=True)


def gemm_program(cfg, shape, dtype, rng):
    return kernels.random_gemm(cfg, rng, *shape, dtype)


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


def compare(cfg, label, dtype, shape, kind, rng):
    """One row: the fast path's cycles against predict()'s for a GEMM of ``shape``, and
    what ``opentrn project`` reports for one core (the exact model's cycles where it
    follows the configuration and the fast path estimates at most
    ``projection.EXACT_MAX_CYCLES``, else the fast path's)."""
    exact = cycle_model.predict(gemm_program(cfg, shape, dtype, rng))["cycles"]
    fast = cycle_model.gemm(cfg, *shape, dtype=dtype).cycles
    projected = (exact if projection.exact_model_follows(cfg)
                 and fast <= projection.EXACT_MAX_CYCLES else fast)
    return {"preset": label, "format": dtype, "shapes": kind,
            "gemm": "x".join(map(str, shape)), "model_cycles": exact, "fast_cycles": fast,
            "error": f"{100 * (fast - exact) / exact:+.1f}%", "projected_cycles": projected}


def fast_path_accuracy(presets, random_count):
    rows = []
    for name in presets:
        cfg = config.preset(name)
        rng = np.random.default_rng(7)
        for dtype in formats(cfg):
            shapes = [(shape, "table") for shape in SHAPES]
            shapes += [(shape, "random") for shape in cycle_model.random_gemm_shapes(
                cfg, dtype, random_count, rng)]
            rows += [compare(cfg, name, dtype, shape, kind, rng) for shape, kind in shapes]
            log(f"fast path {name} {dtype}: {len(shapes)} shapes")
    return rows


def trainium_accuracy(count):
    """The fast path against predict() at Trainium size: ``count`` random shapes per format
    on ``trn3`` with the one DMA engine the RTL builds (``dma_engines=1``: the exact model
    follows the RTL, so it can check the fast path only there)."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    rng = np.random.default_rng(11)
    rows = []

    def spread(low, high):
        return int(np.exp(rng.uniform(np.log(low), np.log(high))))

    for dtype in ("bf16", "fp8e4m3", "mxfp8e4m3"):
        for index in range(count):
            k = 128 * cfg.macs_per_pe_cycle(dtype) if index % 4 == 0 else spread(1, 2048)
            shape = (spread(64, 2048), k, spread(64, 2048))
            rows.append(compare(cfg, "trn3, dma_engines=1", dtype, shape, "random", rng))
        log(f"fast path trn3 (one DMA engine) {dtype}: {count} shapes")
    return rows


def large_trainium_accuracy(count):
    """The fast path against predict() where ``opentrn project`` mostly takes the fast
    path's count (above ``projection.EXACT_MAX_CYCLES``): ``count`` random shapes per format
    on ``trn3`` with one DMA engine, M, K and N log-uniform from 512 to 4096 (about 4 x 10^4
    to 2 x 10^6 cycles; seconds of ``predict`` each)."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    rng = np.random.default_rng(13)
    rows = []

    def spread():
        return int(np.exp(rng.uniform(np.log(512), np.log(4096))))

    for dtype in ("bf16", "fp8e4m3", "mxfp8e4m3"):
        for _ in range(count):
            shape = (spread(), spread(), spread())
            rows.append(compare(cfg, "trn3, dma_engines=1, 512 to 4096", dtype, shape,
                                "random", rng))
        log(f"fast path trn3 (one DMA engine), M, K, N 512 to 4096, {dtype}: {count} shapes")
    return rows


#: GEMMs on ``trn3`` with one DMA engine whose blocks keep one moving slot, refilled a K
#: tile at a time (``--one-slot``): K of 8192 and more, which the random ``--trainium-shapes``
#: (K up to 2048) never reach.
ONE_SLOT_SHAPES = [("bf16", (256, 8192, 4096)), ("bf16", (384, 8192, 3072)),
                   ("mxfp8e4m3", (256, 16384, 4096))]


def one_slot_accuracy():
    """The fast path against predict() on :data:`ONE_SLOT_SHAPES` (about 20 s each)."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    rng = np.random.default_rng(17)
    rows = []
    for dtype, shape in ONE_SLOT_SHAPES:
        buffers = schedule.gemm_tiling(cfg, *shape, dtype)[3]
        if buffers != 1:
            raise SystemExit(f"{dtype} {shape}: {buffers} moving slots, not one; "
                             "ONE_SLOT_SHAPES no longer tests a refill")
        rows.append(compare(cfg, "trn3, dma_engines=1", dtype, shape, "one slot", rng))
        log(f"one slot {dtype} {'x'.join(map(str, shape))}: {rows[-1]['error']}")
    return rows


def bus_width_config(width):
    """``tiny`` with a ``width``-byte bus and an HBM as fast as it (the core's DMA moves a bus
    word a cycle, as the RTL and the exact model do)."""
    cfg = config.preset("tiny")
    return cfg.replace(dma_bus_bytes=width,
                       hbm_bytes_per_s=float(width * cfg.clock_hz * cfg.cores_per_chip))


def bus_width_accuracy(widths, count):
    """The fast path against predict() on ``count`` random int8 shapes of ``tiny`` with each
    bus width of ``widths``."""
    rows = []
    for width in widths:
        cfg = bus_width_config(width)
        rng = np.random.default_rng(13)
        label = f"tiny, dma_bus_bytes={width}"
        rows += [compare(cfg, label, "int8", shape, "random", rng)
                 for shape in cycle_model.random_gemm_shapes(cfg, "int8", count, rng)]
        log(f"fast path {label}: {count} shapes")
    return rows


#: The formats of ``--full-size``.
FULL_SIZE_FORMATS = ("bf16", "fp8e4m3", "mxfp8e4m3")


def full_size_accuracy(sizes, dtypes=FULL_SIZE_FORMATS):
    """The fast path against predict() on S^3 GEMMs on ``trn3`` with one DMA engine, in
    each format of ``dtypes``, with the time to build each program and to run the exact
    model on it."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    rows = []
    for size in sizes:
        for dtype in dtypes:
            started = time.perf_counter()
            program = gemm_program(cfg, (size, size, size), dtype, np.random.default_rng(1))
            built = time.perf_counter()
            exact = cycle_model.predict(program)["cycles"]
            predicted = time.perf_counter()
            fast = cycle_model.gemm(cfg, size, size, size, dtype=dtype).cycles
            rows.append({"preset": "trn3, dma_engines=1", "format": dtype,
                         "gemm": f"{size}^3", "model_cycles": exact, "fast_cycles": fast,
                         "error": f"{100 * (fast - exact) / exact:+.2f}%",
                         "build_s": round(built - started, 1),
                         "predict_s": round(predicted - built, 1),
                         "model_cycles_per_s": round(exact / (predicted - built))})
            log(f"full size {size}^3 {dtype}: {rows[-1]['error']}")
    return rows


def fast_path_summary(rows):
    """Per preset and format: the fast path's largest difference from predict() on the
    shapes of at least 5,000 cycles and on the shorter ones, and how many exceed the bounds
    (2% and 5%) the issue asks for."""
    summary = []
    for key in dict.fromkeys((r["preset"], r["format"]) for r in rows):
        group = [r for r in rows if (r["preset"], r["format"]) == key]
        out = {"preset": key[0], "format": key[1], "shapes": len(group)}
        for label, test, bound in (("long", lambda c: c >= 5000, 0.02),
                                   ("short", lambda c: c < 5000, 0.05)):
            errors = [abs(r["fast_cycles"] - r["model_cycles"]) / r["model_cycles"]
                      for r in group if test(r["model_cycles"])]
            out[f"{label} shapes"] = len(errors)
            out[f"{label} max error"] = f"{100 * max(errors, default=0):.1f}%"
            out[f"{label} mean error"] = (f"{100 * sum(errors) / len(errors):.1f}%"
                                          if errors else "-")
            out[f"{label} over {100 * bound:.0f}%"] = sum(e > bound for e in errors)
        # opentrn project's one-core cycles against the bounds.
        out["projected over bound"] = sum(
            abs(r["projected_cycles"] - r["model_cycles"]) / r["model_cycles"]
            > (0.02 if r["model_cycles"] >= 5000 else 0.05) for r in group)
        out["projected max error"] = "{:.1f}%".format(100 * max(
            abs(r["projected_cycles"] - r["model_cycles"]) / r["model_cycles"]
            for r in group))
        summary.append(out)
    return summary


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


def sizes(text):
    """``--full-size``: comma-separated positive integers, checked before anything runs."""
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"--full-size={text!r}: must be comma-separated positive integers (S of S^3)")
    return values


def full_size_formats(text):
    """``--full-size-formats``: comma-separated formats of :data:`FULL_SIZE_FORMATS`."""
    values = text.split(",")
    for value in values:
        if value not in FULL_SIZE_FORMATS:
            raise argparse.ArgumentTypeError(
                f"--full-size-formats={text!r}: {value!r} is not one of "
                f"{','.join(FULL_SIZE_FORMATS)}")
    return values


def count(flag):
    """An option's count of shapes: a non-negative integer, checked before anything runs."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: must be a non-negative integer")
        return value
    return parse


def widths(text):
    """``--bus-widths``: comma-separated bus widths that ``tiny`` takes, checked before
    anything runs."""
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--bus-widths={text!r}: must be comma-separated bus widths in bytes") from None
    for value in values:
        try:
            bus_width_config(value)
        except config.ConfigError as error:
            raise argparse.ArgumentTypeError(f"--bus-widths={text!r}: {error}") from None
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--random", type=int, default=40, help="random kernels per preset")
    parser.add_argument("--sim", default="verilator")
    parser.add_argument("--shapes", type=int, default=300,
                        help="random GEMM shapes per preset and format for the fast path")
    parser.add_argument("--trainium-shapes", type=count("--trainium-shapes"), default=0,
                        help="random GEMM shapes per format on trn3 with one DMA engine")
    parser.add_argument("--large-trainium-shapes", type=count("--large-trainium-shapes"),
                        default=0,
                        help="random GEMM shapes per format on trn3 with one DMA engine, "
                             "M, K, N 512 to 4096 (seconds of predict each)")
    parser.add_argument("--bus-widths", type=widths, default=[],
                        help="comma-separated bus widths: random int8 shapes on tiny with each")
    parser.add_argument("--full-size", type=sizes, default=[],
                        help="comma-separated S: S^3 GEMMs on trn3 with one DMA engine")
    parser.add_argument("--full-size-formats", type=full_size_formats,
                        default=list(FULL_SIZE_FORMATS),
                        help="comma-separated formats of the --full-size GEMMs "
                             f"(default: {','.join(FULL_SIZE_FORMATS)})")
    parser.add_argument("--one-slot", action="store_true",
                        help="trn3 GEMMs with one moving slot, refilled a K tile at a time")
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
    result["fast_path"] = (fast_path_accuracy(presets, args.shapes)
                           + trainium_accuracy(args.trainium_shapes)
                           + large_trainium_accuracy(args.large_trainium_shapes)
                           + bus_width_accuracy(args.bus_widths, args.shapes))
    result["fast_path_summary"] = fast_path_summary(result["fast_path"])
    if args.full_size:
        result["full_size"] = full_size_accuracy(args.full_size, args.full_size_formats)
    if args.one_slot:
        result["one_slot"] = one_slot_accuracy()
    result["speed"] = speed()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if "rtl" in result:
        print(table(result["rtl"]))
        print()
        print(table(result["rtl_summary"]))
        print()
    print(table([r for r in result["fast_path"] if r["shapes"] == "table"]))
    print()
    print(table(result["fast_path_summary"]))
    print()
    worst = sorted(result["fast_path"], key=lambda r: -abs(r["fast_cycles"] - r["model_cycles"])
                   / r["model_cycles"])
    print(table(worst[:20]))
    print()
    for key in ("full_size", "one_slot"):
        if key in result:
            print(table(result[key]))
            print()
    print(table([result["speed"]]))


if __name__ == "__main__":
    main()
