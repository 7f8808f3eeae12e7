"""``opentrn project``: peaks, GEMM and transformer projections, scaling, SCALE-Sim and
the RTL compared."""

import argparse
import json
import math
import sys

from opentrn import config as configuration
from opentrn.config import ConfigError
from opentrn.report import key_value_table

from .common import (
    _base_preset,
    _check_dtype,
    _config,
    _output_file,
    _positive,
    _preset_label,
    _Progress,
)
from .run import _build_kernel, _core_simulator


def _integers(option, text, names):
    """``"8192,8192,8192"`` as positive integers, one per name."""
    try:
        values = tuple(int(item) for item in text.split(","))
    except ValueError:
        values = ()
    if len(values) != len(names) or min(values) < 1:
        count = ("two", "three", "four", "five")[len(names) - 2]
        raise ConfigError(f"{option}={text}: must be {count} positive integers "
                          f"{','.join(names)}")
    return values


def _number(value, digits=2):
    """A figure of a report: ``-`` when absent, else ``digits`` decimals (large values with
    thousands separators)."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _published_number(value):
    """A published figure as the reference file gives it (no added digits)."""
    return "-" if value is None else f"{value:,.6g}"


def _percent(value):
    return "-" if value is None else f"{value:+.2f}%"


def _seconds(value):
    """A duration with a unit that keeps 3 or more significant digits readable."""
    if value == 0:
        return "0"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3f} {unit}"
    return f"{value / 1e-9:.1f} ns"


def _project_dtype(args, cfg):
    if args.dtype is None:
        # bf16, the format of the published headline figures, when the build has it.
        return "bf16" if "bf16" in cfg.dtypes else ("int8" if "int8" in cfg.dtypes
                                                    else cfg.dtypes[0])
    return _check_dtype(args.dtype, cfg)


def _published(args):
    """The preset whose published figures the report shows beside the model's: the base
    preset of the configuration, when it has published figures."""
    base = _base_preset(args)
    return base if base in configuration.PUBLISHED else None


def _project_peaks(args, cfg):
    from opentrn import projection
    from opentrn.report import markdown_table
    published = _published(args)
    rows = projection.peaks(cfg, published=published)
    if args.json:
        print(json.dumps({"preset": _preset_label(args), "published": published,
                          "rows": rows}, indent=2))
        return 0
    table = [{"level": row["level"], "quantity": row["quantity"], "unit": row["unit"],
              "model": _number(row["model"]), "published": _published_number(row["published"]),
              "diff": _percent(row["diff_pct"]),
              "published per core x cores": _published_number(row["published_cores"]),
              "diff to it": _percent(row["diff_cores_pct"]), "note": row["note"]}
             for row in rows]
    print(f"peaks of {_preset_label(args)} ({cfg.pe_rows}x{cfg.pe_cols} at "
          f"{cfg.clock_hz / 1e9:g} GHz, {cfg.cores_per_chip} cores per chip, "
          f"{cfg.chips_per_server} chips per server); published: "
          f"{published or '(none for this preset)'}")
    print("model = 2 x pe_rows x pe_cols x macs_per_pe_cycle(format) x clock_hz per core")
    print(markdown_table(table, list(table[0])))
    return 0


def _scaling_table(rows):
    from opentrn.report import markdown_table
    return markdown_table([{
        "chips": f"{row['chips']:,}", "parallel": row["parallel"] + (" (training)"
                                                                   if row["training"] else ""),
        "step time": _seconds(row["seconds"]), "communication": _seconds(row["comm_s"]),
        "achieved PFLOP/s": _number(row["achieved_flops"] / 1e15, 3),
        "peak PFLOP/s": _number(row["peak_flops"] / 1e15, 3),
        "efficiency": f"{100 * row['efficiency']:.1f}%"} for row in rows],
        ["chips", "parallel", "step time", "communication", "achieved PFLOP/s",
         "peak PFLOP/s", "efficiency"])


def _core_model_line(levels):
    """Which model gave the busiest core's cycles of each level."""
    names = {"exact": "the exact cycle model (the RTL's, cycle for cycle)",
             "fast path": "the cycle model's fast path (docs/performance.md: its accuracy)"}
    models = {level.model for _, level in levels}
    if len(models) == 1:
        return names[models.pop()]
    return "; ".join(f"{label}: {names[level.model]}" for label, level in levels)


def _project_gemm(args, cfg):
    from opentrn import projection
    from opentrn.report import markdown_table
    m, k, n = _integers("--gemm", args.gemm, ("M", "K", "N"))
    dtype = _project_dtype(args, cfg)
    if args.compare_rtl:
        return _compare_rtl(args, cfg, m, k, n, dtype)
    exact = args.core_model != "fast" and projection.exact_model_follows(cfg)
    if exact:
        progress = _Progress()
        progress("one core: the exact cycle model runs the kernel's program"
                 + (f" where the fast path estimates at most "
                    f"{projection.EXACT_MAX_CYCLES:,} cycles" if args.core_model == "auto"
                    else "") + " (--core-model fast skips it)")
    levels = projection.gemm_levels(cfg, m, k, n, dtype=dtype, cores=args.cores,
                                    chips=args.chips, parallel=args.parallel,
                                    hop_latency_s=args.hop_latency, model=args.core_model)
    if exact:
        progress("done")
    workload = {"kind": "gemm", "m": m, "k": k, "n": n, "dtype": dtype}
    curves = []
    if args.scaling or args.plot:
        curves = [projection.scaling(cfg, workload, parallel=parallel,
                                     hop_latency_s=args.hop_latency)
                  for parallel in ("data", "tensor")]
    compare = projection.scalesim(cfg, m, k, n, dtype=dtype) if args.compare_scalesim \
        else None
    if args.plot:
        projection.plot(args.plot, config=cfg, dtype=dtype, scaling_rows=curves,
                        points=[(label, level.intensity, level.achieved_flops / level.chips)
                                for label, level in levels],
                        title=f"{_preset_label(args)}: {dtype} GEMM {m}x{k}x{n}")
    if args.json:
        report = {"preset": _preset_label(args), "gemm": {"m": m, "k": k, "n": n},
                  "dtype": dtype, "levels": [{"level": label, **level.to_dict()}
                                             for label, level in levels]}
        if args.scaling:
            report["scaling"] = curves
        if compare:
            report["scalesim"] = compare
        if args.plot:
            report["plot"] = args.plot
        print(json.dumps(report, indent=2))
        return 0
    first = levels[0][1]
    print(key_value_table([
        ("GEMM", f"C[{m}, {n}] = A[{m}, {k}] @ B[{k}, {n}], {dtype} inputs, "
                 f"{'INT32' if dtype == 'int8' else 'FP32'} outputs"),
        ("preset", f"{_preset_label(args)} ({cfg.pe_rows}x{cfg.pe_cols}, "
                   f"{cfg.macs_per_pe_cycle(dtype)} MAC/PE/cycle in {dtype}, "
                   f"{cfg.clock_hz / 1e9:g} GHz)"),
        ("FLOPs", f"{first.flops:,}"),
        ("HBM bytes", f"{first.hbm_bytes:,} (inputs read once, output written once)"),
        ("intensity", f"{first.intensity:.1f} FLOPs per HBM byte (per chip: the table)"),
        ("core cycles", _core_model_line(levels)),
    ]))
    print()
    print(markdown_table([{
        "level": label, "split": (f"{level.parallel}, " if level.chips > 1 else "")
        + ("cores by " + level.core_split if level.cores > 1 else "-"),
        "busiest core": "x".join(map(str, level.core_share)),
        "cycles": f"{level.cycles:,}",
        "its DMA bytes": f"{level.dma_bytes:,}",
        "time": _seconds(level.seconds),
        "communication": _seconds(level.comm_s) if level.chips > 1 else "-",
        "achieved TFLOP/s": _number(level.achieved_flops / 1e12),
        "peak TFLOP/s": _number(level.peak_flops / 1e12),
        "utilization": f"{100 * level.utilization:.1f}%",
        "intensity (FLOP/B)": _number(level.intensity, 1),
        "ridge (FLOP/B)": _number(level.ridge, 1),
        "bound": level.bound} for label, level in levels],
        ["level", "split", "busiest core", "cycles", "its DMA bytes", "time", "communication",
         "achieved TFLOP/s", "peak TFLOP/s", "utilization", "intensity (FLOP/B)",
         "ridge (FLOP/B)", "bound"]))
    if args.scaling:
        for rows in curves:
            print()
            print(_scaling_table(rows))
    if compare:
        print()
        print(markdown_table([compare], list(compare)))
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _project_transformer(args, cfg):
    from opentrn import projection
    from opentrn.report import markdown_table
    names = ("d_model", "d_ff", "heads", "seq", "batch")
    shape = dict(zip(names, _integers("--transformer", args.transformer, names),
                     strict=True))
    dtype = _project_dtype(args, cfg)
    if args.chips > shape["heads"]:
        raise ConfigError(f"--chips={args.chips}: tensor parallelism splits the heads: must be "
                          f"at most heads={shape['heads']}")
    layer = projection.transformer_layer(cfg, **shape, dtype=dtype, chips=args.chips,
                                         hop_latency_s=args.hop_latency)
    workload = {"kind": "transformer", **shape, "dtype": dtype}
    curves = []
    if args.scaling or args.plot:
        curves = [projection.scaling(cfg, workload, parallel=parallel,
                                     hop_latency_s=args.hop_latency)
                  for parallel in ("data", "tensor")]
    if args.plot:
        points = []
        for op in layer["ops"]:
            if op["kind"] == "tensor":
                m, k, n = map(int, op["shape"].split("x"))
                intensity = 2 * m * k * n / projection.gemm(cfg, m, k, n, dtype=dtype).hbm_bytes
                points.append((op["op"], intensity, op["flops"] / op["seconds"]))
        projection.plot(args.plot, config=cfg, dtype=dtype, points=points,
                        scaling_rows=curves,
                        title=f"{_preset_label(args)}: {dtype} transformer layer "
                              f"{args.transformer}")
    if args.json:
        report = {"preset": _preset_label(args), **layer}
        if args.scaling:
            report["scaling"] = curves
        if args.plot:
            report["plot"] = args.plot
        print(json.dumps(report, indent=2))
        return 0
    d_head = shape["d_model"] // shape["heads"]
    print(key_value_table([
        ("layer", f"d_model {shape['d_model']}, d_ff {shape['d_ff']}, {shape['heads']} heads "
                  f"of {d_head}, seq {shape['seq']}, batch {shape['batch']}, {dtype}"),
        ("preset", f"{_preset_label(args)}: {args.chips} chip(s) of {cfg.cores_per_chip} "
                   "cores, tensor parallel (heads and d_ff split over the chips)"),
    ]))
    print()
    print(markdown_table([{
        "op": op["op"], "engine": op["kind"], "shape per chip (MxKxN)": op["shape"],
        "count": op["count"],
        "GFLOPs per chip": _number(op["flops"] / 1e9, 1) if op["flops"] else "-",
        "cycles": "-" if op["cycles"] is None else f"{op['cycles']:,}",
        "time": _seconds(op["seconds"]), "share": f"{100 * op['share']:.1f}%"}
        for op in layer["ops"]],
        ["op", "engine", "shape per chip (MxKxN)", "count", "GFLOPs per chip", "cycles",
         "time", "share"]))
    print()
    print(key_value_table([
        ("layer time", _seconds(layer["seconds"])),
        ("tensor engine", f"{_seconds(layer['tensor_s'])} "
                          f"({100 * layer['tensor_s'] / layer['seconds']:.1f}%)"),
        ("activation engine", f"{_seconds(layer['vector_s'])} "
                              f"({100 * layer['vector_s'] / layer['seconds']:.1f}%)"),
        ("communication", f"{_seconds(layer['comm_s'])} ({100 * layer['comm_share']:.1f}%)"),
        ("FLOPs", f"{layer['flops']:,} (the whole layer, all chips)"),
        ("achieved", f"{layer['achieved_flops'] / 1e12:,.1f} TFLOP/s of "
                     f"{layer['peak_flops'] / 1e12:,.1f} peak "
                     f"({100 * layer['utilization']:.1f}% utilization)"),
    ]))
    if args.scaling:
        for rows in curves:
            print()
            print(_scaling_table(rows))
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _compare_rtl(args, cfg, m, k, n, dtype):
    """Run the library GEMM on the core RTL and print the cycle model's prediction of every
    performance counter beside the measured one. Exit status 1 when the simulation fails
    (a fault, a wrong result); a prediction that differs is reported, not a failure."""
    from opentrn import cycle_model
    from opentrn.isa import Fault
    from opentrn.kernel import mismatches as count_mismatches
    from opentrn.sim.core import CoreRunError, run_programs
    if args.chips != 1 or args.scaling or args.compare_scalesim or args.plot:
        raise ConfigError("--compare-rtl: runs one core: it takes none of --chips, "
                          "--scaling, --compare-scalesim, --plot")
    sim = _core_simulator(args, cfg)
    progress = _Progress()
    kernel_args = argparse.Namespace(kernel="gemm", m=m, k=k, n=n, dtype=dtype, seed=args.seed)
    label, program, expected = _build_kernel(kernel_args, cfg)
    predicted = cycle_model.predict(program)
    progress(f"built {label}: {sum(program.instruction_counts.values())} instructions")
    try:
        (outcome,), _ = run_programs([program], sim=sim, progress=progress)
    except CoreRunError as exc:
        print(f"opentrn {args.command}: FAIL: {exc}", file=sys.stderr)
        return 1
    outputs = program.read_outputs(outcome.hbm)
    mismatches = sum(count_mismatches(outputs[name], value) for name, value in expected.items())
    ran = outcome.fault == Fault.NONE and mismatches == 0
    rows = [{"counter": name, "predicted": value, "measured": outcome.counters[name],
             "difference": value - outcome.counters[name]} for name, value in predicted.items()]
    exact = all(row["difference"] == 0 for row in rows)
    if args.json:
        print(json.dumps({"kernel": label, "preset": _preset_label(args), "sim": sim,
                          "passed": ran, "fault": Fault(outcome.fault).name,
                          "mismatches": mismatches, "exact": exact, "counters": rows},
                         indent=2))
    else:
        from opentrn.report import markdown_table
        print(f"{label} on {_preset_label(args)} ({cfg.pe_rows}x{cfg.pe_cols}), {sim}")
        print(markdown_table(rows, ["counter", "predicted", "measured", "difference"]))
        print("prediction: " + ("exact on every counter" if exact else
                                "differs from the RTL (see the difference column)"))
        print("simulation: " + ("PASS: bit-exact against numpy" if ran else
                                f"FAIL: fault {Fault(outcome.fault).name}, {mismatches} "
                                "output mismatches"))
    return 0 if ran else 1


def _cmd_project(args):
    cfg = _config(args)
    _positive("--chips", args.chips)
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed}: must be at least 0")
    if not 0 <= args.hop_latency < math.inf:
        raise ConfigError(f"--hop-latency={args.hop_latency}: must not be negative, and "
                          "finite")
    if args.cores is not None and not 1 <= args.cores <= cfg.cores_per_chip:
        raise ConfigError(f"--cores={args.cores}: must be between 1 and cores_per_chip="
                          f"{cfg.cores_per_chip}")
    if args.compare_rtl and not args.gemm:
        raise ConfigError("--compare-rtl: needs --gemm M,K,N")
    _output_file("--plot", args.plot)
    if args.compare_scalesim and not args.gemm:
        raise ConfigError("--compare-scalesim: needs --gemm M,K,N")
    if args.core_model != "auto" and not args.gemm:
        raise ConfigError(f"--core-model={args.core_model}: needs --gemm M,K,N")
    if args.peaks:
        return _project_peaks(args, cfg)
    try:
        if args.gemm:
            return _project_gemm(args, cfg)
        return _project_transformer(args, cfg)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        # The cycle model's refusals (a schedule too long to model, a bad size).
        option = "--gemm" if args.gemm else "--transformer"
        raise ConfigError(f"{option}: {exc}") from None
