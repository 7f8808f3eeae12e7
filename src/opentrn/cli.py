"""The ``opentrn`` command line.

Every command that builds hardware takes the configuration options ``--preset``, ``--file``
and ``--set key=value`` (repeatable), resolved by :func:`opentrn.config.resolve`. Progress of
long steps goes to standard error, results to standard output; ``--json`` prints one JSON
object for scripts.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from opentrn import config as configuration
from opentrn.config import ConfigError
from opentrn.kernel import KernelError
from opentrn.report import key_value_table

__all__ = ["main"]


class _Progress:
    """Timestamped progress lines on standard error."""

    def __init__(self):
        self.started = time.monotonic()

    def __call__(self, text):
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", file=sys.stderr, flush=True)


def _add_config_options(parser):
    group = parser.add_argument_group("configuration")
    group.add_argument("--preset", choices=list(configuration.PRESETS),
                       help="base configuration (default: tiny, or the file's preset key)")
    group.add_argument("--file", metavar="FILE.toml", help="TOML file of configuration keys")
    group.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                       default=[], help="override one configuration key (repeatable)")


def _config(args):
    return configuration.resolve(args.preset, args.file, args.overrides)


# -- commands ---------------------------------------------------------------------------------

def _cmd_config(args):
    cfg = _config(args)
    print(json.dumps(cfg.to_dict(), indent=2) if args.json else cfg.to_toml(), end="\n"
          if args.json else "")
    return 0


def _cmd_verilog(args):
    from opentrn.sim.runner import verilog_source
    cfg = _config(args)
    _output_file("--output", args.output)
    progress = _Progress()
    formats = "/".join(cfg.dtypes)
    progress(f"generating Verilog for {args.top} ({cfg.pe_rows}x{cfg.pe_cols}, {formats})")
    text = verilog_source(cfg, args.top, progress=progress)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise ConfigError(f"--output={args.output}: cannot be written "
                              f"({exc.strerror or exc})") from None
        progress(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


def _base_preset(args):
    """The preset named by ``--preset`` or the file's ``preset`` key (None: the default)."""
    base = args.preset
    if base is None and args.file:
        base = configuration.load_file(args.file).get("preset")
    return base


def _preset_label(args):
    """The preset a run's configuration comes from, and whether a file or overrides changed
    it: ``tiny``, ``small + overrides``."""
    label = _base_preset(args) or "tiny"
    return f"{label} + overrides" if args.file or args.overrides else label


def _check_dtype(dtype, cfg):
    """``--dtype``, unless the build lacks it."""
    if dtype not in cfg.dtypes:
        raise ConfigError(f"--dtype={dtype}: not among this build's formats, dtypes="
                          f"{','.join(cfg.dtypes)} (add it with --set dtypes=...)")
    return dtype


def _output_file(option, path):
    """An output file option (``-o``, ``--waves``, ``--plot``), before any work: its folder
    is made when missing (as the simulator runner does for waves); a directory, or a folder
    that cannot be made, is refused."""
    if path is None or path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{option}={path}: is a directory; name a file")
    try:
        target.resolve().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option}={path}: its folder cannot be made "
                          f"({exc.strerror or exc})") from None


def _positive(name, value):
    if value < 1:
        raise ConfigError(f"{name}={value}: must be at least 1")
    return value


#: The kernel input formats of ``--dtype`` (the MX formats: FP8 elements with random E8M0
#: block scales).
DTYPES = ("int8", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")
def _build_kernel(args, cfg):
    """The kernel of ``opentrn run`` / ``opentrn demo``: ``(label, program, expected)``.
    The MX formats take random E8M0 scales (``kernels.MX_SCALE_CODES``) per block of 32 rows
    along K and per column, drawn after the elements and biases."""
    import numpy as np

    from opentrn import kernels, numerics
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed}: must be at least 0")
    rng = np.random.default_rng(args.seed)
    dtype = _check_dtype(args.dtype, cfg)
    mx = numerics.data_format(dtype).mx
    # Float scales keep the outputs in range; int8 requantizes by a shift instead.
    scaling = ({} if dtype == "int8" else {"scales": (0.25, 0.25)})
    if args.kernel == "mlp":
        batch, d_in, hidden, d_out = (_positive(f"--{name}", getattr(args, name.replace(
            "-", "_"))) for name in ("batch", "d-in", "hidden", "d-out"))
        # Before drawing the inputs: sizes far beyond the HBM are refused at once.
        kernels.check_fits(cfg, dtype, {"x_t": (d_in, batch, None), "w1": (d_in, hidden, None),
                                        "w2": (hidden, d_out, None),
                                        "out": (d_out, batch, None)},
                           products=[(d_in, hidden, batch), (hidden, d_out, batch)])
        x_t, w1 = (kernels.random_inputs(rng, (d_in, batch), dtype),
                   kernels.random_inputs(rng, (d_in, hidden), dtype))
        b1 = kernels.random_bias(rng, hidden, dtype, 2000)
        w2 = kernels.random_inputs(rng, (hidden, d_out), dtype)
        b2 = kernels.random_bias(rng, d_out, dtype, 2000)
        if mx:
            scaling["block_scales"] = (kernels.random_scales(rng, d_in, batch),
                                       kernels.random_scales(rng, d_in, hidden),
                                       kernels.random_scales(rng, hidden, d_out))
        program, expected = kernels.mlp(
            cfg, x_t, w1, b1, w2, b2, requant=((1, 7), (1, 7)) if dtype == "int8" else None,
            **scaling)
        return f"{dtype} mlp {batch}x{d_in}x{hidden}x{d_out}", program, expected
    m, k, n = (_positive(f"--{name}", getattr(args, name)) for name in ("m", "k", "n"))
    kernels.check_fits(cfg, dtype, {"A": (m, k, None), "B": (k, n, None), "C": (m, n, None)},
                       products=[(k, m, n)])
    a, b = kernels.random_inputs(rng, (m, k), dtype), kernels.random_inputs(rng, (k, n), dtype)
    bias = kernels.random_bias(rng, m, dtype, 4000) if args.kernel == "gemm-relu" else None
    extra = ({"block_scales": (kernels.random_scales(rng, k, m),
                               kernels.random_scales(rng, k, n))} if mx else {})
    if args.kernel == "gemm-relu":
        requant = {"multiplier": 1, "shift": 8} if dtype == "int8" else {"scale": 0.125}
        program, expected = kernels.gemm_bias_relu(cfg, a.T.copy(), b, bias, **requant,
                                                   **extra)
        return f"{dtype} gemm+bias+relu {m}x{k}x{n}", program, expected
    program, expected = kernels.gemm(cfg, a.T.copy(), b, **extra)
    return f"{dtype} gemm {m}x{k}x{n}", program, expected


def _core_simulator(args, cfg):
    """The simulator ``--sim`` names (default: the fastest to start), after checking that
    the core can be built for ``cfg`` and that the simulator runs here."""
    from opentrn.hdl import check
    from opentrn.sim import runner
    from opentrn.sim.core import choose_hbm
    sim = args.sim or runner.default_simulator()
    args.hbm = choose_hbm(cfg, getattr(args, "hbm", None), sim=sim)
    check("core_with_memory" if args.hbm == "fast" else "core", cfg)
    runner.require(sim)
    return sim


def _run_kernel(args):
    """Build a kernel, run it on the core RTL, check it against numpy and the golden
    machine, and report the performance counters."""
    import numpy as np

    from opentrn import cycle_model
    from opentrn.golden.core import Core as GoldenCore
    from opentrn.isa import Fault
    from opentrn.kernel import mismatches as count_mismatches
    from opentrn.sim.core import CoreRunError, run_programs
    from opentrn.sim.runner import WavesError
    cfg = _config(args)
    _output_file("--trace", args.trace)
    _output_file("--timeline", args.timeline)
    if args.waves_scope is not None and not args.waves:
        raise ConfigError(f"--waves-scope={args.waves_scope!r}: selects what the waves hold; "
                          "give --waves FILE too")
    if args.model:
        return _model_kernel(args, cfg)
    sim = _core_simulator(args, cfg)
    _output_file("--waves", args.waves)
    _check_waves(sim, args.waves, args.waves_scope)
    if (args.trace or args.timeline) and args.hbm == "axi" and sim == "verilator":
        from opentrn.sim.runner import HIERARCHICAL_PES
        if cfg.pe_rows * cfg.pe_cols >= HIERARCHICAL_PES:
            raise ConfigError(f"--{'trace' if args.trace else 'timeline'}: the hierarchical "
                              f"Verilator build of a {cfg.pe_rows}x{cfg.pe_cols} core with "
                              "--hbm axi shows its ports only; use the fast HBM or Icarus")
    progress = _Progress()
    label, program, expected = _build_kernel(args, cfg)
    progress(f"built {label}: {sum(program.instruction_counts.values())} instructions")
    reference = GoldenCore(cfg).run(program.hbm, program.programs)
    try:
        (outcome,), result = run_programs([program], sim=sim, vcd=args.waves,
                                          scope=args.waves_scope,
                                          hbm=args.hbm, progress=progress,
                                          timeline=bool(args.trace or args.timeline))
    except CoreRunError as exc:
        print(f"opentrn {args.command}: FAIL: {exc}", file=sys.stderr)
        # The waves of a failed run are the ones to look at.
        if args.waves and Path(args.waves).is_file():
            gtkw, why = _write_gtkw(args.waves, progress)
            print(f"opentrn {args.command}: GTKWave save file: {gtkw or f'(none: {why})'}",
                  file=sys.stderr)
        return 1
    except WavesError as exc:       # a scope that matches none of the design's
        raise _waves_error(exc) from None
    gtkw, gtkw_error = _write_gtkw(result.vcd, progress) if result.vcd else (None, None)
    progress("done")
    outputs = program.read_outputs(outcome.hbm)
    mismatches = sum(count_mismatches(outputs[name], value) for name, value in expected.items())
    golden_mismatches = int(np.count_nonzero(outcome.hbm != reference.hbm[:len(outcome.hbm)]))
    counters = outcome.counters
    cycles = counters["cycles"]
    record = result.reports[-1]
    # The cycle model's prediction of every counter, from the program alone.
    predicted = cycle_model.predict(program) if outcome.fault == Fault.NONE else None
    report = {
        "passed": outcome.fault == Fault.NONE and mismatches == 0 and golden_mismatches == 0,
        "kernel": label,
        "preset": _preset_label(args),
        "sim": sim,
        "hbm": args.hbm,
        "array": f"{cfg.pe_rows}x{cfg.pe_cols}",
        "dtype": args.dtype,
        "fault": Fault(outcome.fault).name,
        "mismatches": mismatches,
        "golden_mismatches": golden_mismatches,
        "cycles": cycles,
        "macs": counters["macs"],
        "macs_per_cycle": counters["macs"] / cycles if cycles else None,
        "peak_macs_per_cycle": cfg.peak_macs_per_cycle,
        "utilization": counters["macs"] / (cycles * cfg.peak_macs_per_cycle) if cycles
        else None,
        "engine_busy": {"dma": counters["dma_busy"], "tensor": counters["tensor_busy"],
                        "activation": counters["activation_busy"]},
        "engine_wait": {"dma": counters["dma_wait"], "tensor": counters["tensor_wait"],
                        "activation": counters["activation_wait"]},
        "dma_bytes": counters["dma_bytes"],
        "predicted": predicted,
        "prediction_exact": predicted == counters,
        "instructions": dict(program.instruction_counts),
        "sim_seconds": round(result.seconds, 3),
        "cycles_per_second": round(cycles / record["wall_seconds"]) if cycles else None,
        "vcd": str(result.vcd) if result.vcd else None,
        "gtkw": gtkw,
        "gtkw_error": gtkw_error,
        "log": str(result.log),
        **_write_timeline(args, cfg, outcome.timeline, label, f"the RTL ({sim})"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        def share(value):
            return f"{value} cycles ({100 * value / cycles:.1f}%)" if cycles else str(value)
        verdict = ("PASS: bit-exact against numpy and the golden machine" if report["passed"]
                   else f"FAIL: fault {report['fault']}, {mismatches} output mismatches, "
                        f"{golden_mismatches} HBM bytes differ from the golden machine")
        rows = [
            ("kernel", label),
            ("preset", f"{report['preset']} ({report['array']} {report['dtype']})"),
            ("simulator", f"{sim}, {args.hbm} HBM ({report['cycles_per_second']} cycles/s)"),
            ("instructions", ", ".join(f"{engine} {count}" for engine, count in
                                      program.instruction_counts.items())),
            ("mismatches", f"{mismatches} (golden machine: {golden_mismatches} bytes)"),
            ("cycles", cycles),
            ("MACs", counters["macs"]),
        ]
        if cycles:
            rows.append(("MACs per cycle", f"{report['macs_per_cycle']:.2f} of "
                                           f"{cfg.peak_macs_per_cycle} peak "
                                           f"({100 * report['utilization']:.1f}% utilization)"))
        rows += [(f"{engine} busy", share(value))
                 for engine, value in report["engine_busy"].items()]
        rows += [(f"{engine} waits", share(value))
                 for engine, value in report["engine_wait"].items()]
        if predicted is not None:
            differ = [name for name in predicted if predicted[name] != counters[name]]
            rows.append(("cycle model", f"{predicted['cycles']} cycles predicted; " + (
                f"all {len(predicted)} counters equal the RTL's" if not differ else
                f"differs in {', '.join(differ)}")))
        rows += [("DMA bytes", counters["dma_bytes"]),
                 ("waves", report["vcd"] or "(none: --waves FILE.vcd)"),
                 ("GTKWave", gtkw or (f"(none: {gtkw_error})" if gtkw_error else
                                      "(none: --waves FILE.vcd writes FILE.gtkw too)")),
                 *_timeline_rows(report),
                 ("result", verdict)]
        print(key_value_table(rows))
    return 0 if report["passed"] else 1


def _write_gtkw(waves, progress):
    """The GTKWave save file beside the waves of a run (:mod:`opentrn.sim.gtkw`): its path
    and ``None``, or ``None`` and why there is none (a dump cut to scopes that hold none of
    the signals it shows)."""
    from opentrn.sim import gtkw
    from opentrn.sim.wave import WaveError
    progress(f"writing the GTKWave save file of {waves}")
    try:
        _, out = gtkw.make(waves)
    except WaveError as exc:
        return None, str(exc)
    return str(out), None


def _write_timeline(args, cfg, timeline_, label, source):
    """Write ``--trace`` and ``--timeline`` of a run of kernel ``label`` on ``source`` (the
    RTL or the cycle model: the trace's events are the same); their report entries."""
    from opentrn import timeline
    written = {"trace": None, "timeline": None}
    if args.trace:
        timeline.write_trace(timeline_, args.trace, clock_hz=cfg.clock_hz, label=label,
                             source=source)
        written["trace"] = str(args.trace)
    if args.timeline:
        timeline.render(timeline_, args.timeline, title=f"{label} on {source}")
        written["timeline"] = str(args.timeline)
    return written


def _timeline_rows(report):
    return [("trace", report["trace"] or "(none: --trace FILE.json, for ui.perfetto.dev)"),
            ("timeline", report["timeline"] or "(none: --timeline FILE.png)")]


def _model_kernel(args, cfg):
    """``--model``: the kernel on the cycle model alone (no simulation, no data): its
    counters and timeline, for kernels too large to simulate."""
    from opentrn import cycle_model
    if args.waves:
        raise ConfigError("--waves: the cycle model has no waves; drop --model for them")
    progress = _Progress()
    label, program, _ = _build_kernel(args, cfg)
    progress(f"built {label}: {sum(program.instruction_counts.values())} instructions; "
             "running the cycle model")
    counters, timeline_ = cycle_model.predict_timeline(program)
    progress("done")
    cycles = counters["cycles"]
    report = {
        "kernel": label, "preset": _preset_label(args), "model": "cycle model",
        "array": f"{cfg.pe_rows}x{cfg.pe_cols}", "dtype": args.dtype,
        "counters": counters,
        "utilization": counters["macs"] / (cycles * cfg.peak_macs_per_cycle),
        **_write_timeline(args, cfg, timeline_, label, "the cycle model"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    rows = [("kernel", label),
            ("preset", f"{report['preset']} ({report['array']} {report['dtype']})"),
            ("run on", "the cycle model (the RTL's counters, cycle for cycle; no data)"),
            ("cycles", cycles),
            ("utilization", f"{100 * report['utilization']:.1f}% of the MAC peak")]
    rows += [(f"{engine} busy", f"{counters[f'{engine}_busy']} cycles "
                                f"({100 * counters[f'{engine}_busy'] / cycles:.1f}%)")
             for engine in ("dma", "tensor", "activation")]
    rows += _timeline_rows(report)
    print(key_value_table(rows))
    return 0


def _check_waves(sim, waves, scope):
    """``--waves`` and ``--waves-scope`` that ``sim`` can serve, before any work."""
    from opentrn.sim.runner import WavesError, check_waves
    try:
        check_waves(sim, waves, scope)
    except WavesError as exc:
        raise _waves_error(exc) from None


def _waves_error(exc):
    """A simulator runner's :class:`~opentrn.sim.runner.WavesError` in terms of the options."""
    if exc.field == "scope":
        return ConfigError(f"--waves-scope={exc.value!r}: {exc.rule}")
    return ConfigError(f"--waves={exc.value}: {exc.rule}")


def _cmd_run(args):
    return _run_kernel(args)


def _cmd_demo(args):
    args.kernel = "gemm-relu"
    return _run_kernel(args)


def _cmd_wave(args):
    from opentrn.sim import wave
    return wave.command(args)


# -- opentrn project --------------------------------------------------------------------------

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


def _project_gemm(args, cfg):
    from opentrn import projection
    from opentrn.report import markdown_table
    m, k, n = _integers("--gemm", args.gemm, ("M", "K", "N"))
    dtype = _project_dtype(args, cfg)
    if args.compare_rtl:
        return _compare_rtl(args, cfg, m, k, n, dtype)
    levels = projection.gemm_levels(cfg, m, k, n, dtype=dtype, cores=args.cores,
                                    chips=args.chips, parallel=args.parallel,
                                    hop_latency_s=args.hop_latency)
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


def _cmd_fuzz(args):
    from opentrn import fuzz
    from opentrn.hdl import check
    from opentrn.sim import runner

    cfg = _config(args)
    for name, value, low in (("--count", args.count, 1), ("--seeds", args.seeds, 0),
                             ("--jobs", args.jobs, 1)):
        if value < low:
            raise ConfigError(f"{name}={value}: must be at least {low}")
    cores = os.cpu_count() or 1
    if args.jobs > cores:
        # Each worker runs a simulator: more of them than cores only adds memory.
        raise ConfigError(f"--jobs={args.jobs}: at most this machine's {cores} cores")
    if args.count > fuzz.MAX_PROGRAMS:
        raise ConfigError(f"--count={args.count}: at most {fuzz.MAX_PROGRAMS:,} programs a "
                          "campaign (its results stay in memory); run several with --seeds")
    if not 0 <= args.illegal <= 1:
        raise ConfigError(f"--illegal={args.illegal}: must be a share from 0 to 1")
    if args.shrink and args.count != 1:
        raise ConfigError(f"--shrink: shrinks one program; give --count 1, not {args.count}")
    if args.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(f"--ray={args.ray}: needs the ray package: "
                              "pip install 'opentrn[ray]'") from None
        try:
            fuzz.check_ray_address(args.ray)
        except ValueError as exc:
            raise ConfigError(f"--ray={args.ray}: {str(exc).partition(': ')[2]}") from None
    check("core_with_memory", cfg)
    sim = args.sim or runner.long_run_simulator()
    runner.require(sim)
    progress = _Progress()
    preset = f"--preset {args.preset} " if args.preset else ""
    extra = (f" --file {args.file}" if args.file else "") + "".join(
        f" --set {item}" for item in args.overrides)

    def replay(seed):
        return (f"opentrn fuzz {preset}--seeds {seed} --count 1 --illegal {args.illegal} "
                f"--sim {sim}{extra} --shrink")

    if args.shrink:
        try:
            keep, result = fuzz.shrink(cfg, args.seeds, illegal=args.illegal, sim=sim,
                                       progress=progress)
        except ValueError as exc:
            print(f"opentrn fuzz: {exc}")
            return 0
        print(f"seed {args.seeds} still fails with body operations {keep}: "
              + "; ".join(result["problems"]))
        return 1
    progress(f"building the {sim} model of the core with its HBM")
    runner.build(cfg, "core_with_memory", sim, progress=progress)

    def tell(done, total, failures, seconds):
        progress(f"{done}/{total} programs, {failures} mismatches, "
                 f"{done / seconds:.1f} programs/s")

    campaign = fuzz.run_campaign(
        cfg, range(args.seeds, args.seeds + args.count), illegal=args.illegal,
        jobs=args.jobs, sim=sim, ray_address=args.ray, progress=tell,
        timeline=args.timeline)
    if args.json:
        print(json.dumps({"summary": campaign.summary(), "results": campaign.results},
                         indent=1))
    else:
        print(fuzz.report(campaign, replay=replay))
    return 1 if campaign.failures else 0


# -- parser -----------------------------------------------------------------------------------

def _cmd_fpga(args):
    from opentrn import fpga
    cfg = _config(args)
    if args.seed < 1:
        raise ConfigError(f"--seed={args.seed}: must be at least 1 (nextpnr's placer seed)")
    if args.baud < 1:
        raise ConfigError(f"--baud={args.baud}: must be at least 1")
    if args.board != "ooc" and args.top != "core":
        raise ConfigError(f"--top={args.top}: a board build has the board top; --top is for "
                          "--board ooc")
    build_dir = args.build_dir or f"build/fpga-{_base_preset(args) or 'tiny'}-{args.board}"
    if Path(build_dir).exists() and not Path(build_dir).is_dir():
        raise ConfigError(f"--build-dir={build_dir}: is a file; name a folder")
    progress = _Progress()
    progress(f"building {args.top if args.board == 'ooc' else 'the board top'} "
             f"({cfg.pe_rows}x{cfg.pe_cols}, {'/'.join(cfg.dtypes)}) for {args.board} "
             f"in {build_dir}")
    try:
        result = fpga.build(cfg, build_dir, board=args.board, top=args.top, baud=args.baud,
                            seed=args.seed, progress=progress)
    except fpga.RoutingStalled as stalled:
        # Not a usage error: the design does not route. Where it is congested, per block.
        if args.json:
            print(json.dumps(stalled.to_dict(), indent=2))
        else:
            print(f"{stalled}\n\nwhere the router found too few wires (router2's overuse "
                  f"after pass {stalled.iteration}, per block):\n")
            print(fpga.congestion_table(stalled.congestion))
            print("\nDOES NOT route")
        return 1
    except fpga.ToolError as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"{result.top} on {result.part} ({result.target}), build in {result.build_dir}")
        print()
        print(fpga.main_table(result))
        if result.bitstream:
            print(f"\nbitstream: {result.bitstream}")
        print("\n" + ("fits and meets timing" if result.fits and result.timing_met else
                      "DOES NOT " + ("fit" if not result.fits else "meet timing")))
    return 0 if result.fits and result.timing_met else 1


def _add_run_options(parser, *, sims, default_sim):
    parser.add_argument("--sim", choices=sims, help=f"simulator (default: {default_sim})")
    parser.add_argument("--waves", metavar="FILE.vcd",
                        help="write a VCD waveform; an FST one when FILE ends in .fst "
                        "(Icarus only)")
    parser.add_argument("--waves-scope", metavar="REGEX",
                        help="with --waves: dump only the scopes (module instances, named by "
                        "their dotted path below the top, e.g. core.tensor_unit.engine) that "
                        "REGEX matches (re.search), and the top level's own signals (clock, "
                        "ports); Icarus dumps just those, Verilator traces everything to a "
                        "temporary VCD and filters it")
    parser.add_argument("--hbm", choices=("fast", "axi"),
                        help="the HBM: fast, in hardware beside the core (no Python on the "
                        "clock), or axi, cocotbext-axi's RAM answering from Python; the same "
                        "cycles (default: fast where it can hold the HBM, on Icarus up to "
                        "16 MiB of it)")
    parser.add_argument("--seed", type=int, default=1, help="input data seed (default: 1)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--dtype", choices=DTYPES, default="int8",
                        help="input format of the kernel, one of the build's dtypes; the MX "
                        "formats take random E8M0 block scales (default: int8)")
    parser.add_argument("--trace", metavar="FILE.json",
                        help="write the engines' timeline as a Perfetto / Chrome trace "
                        "(open it in ui.perfetto.dev)")
    parser.add_argument("--timeline", metavar="FILE.png",
                        help="draw the engines' timeline as a picture")
    parser.add_argument("--model", action="store_true",
                        help="run the cycle model instead of the RTL: the same counters and "
                        "timeline, no simulation and no data (kernels too large to "
                        "simulate)")


def _add_gemm_options(parser, *, default):
    for name, value in zip("mkn", default, strict=True):
        parser.add_argument(f"--{name}", type=int, default=value,
                            help=f"GEMM {name.upper()} (default: {value})")


def _parser():
    from opentrn.hdl import TOPS
    from opentrn.sim import wave
    from opentrn.sim.runner import SIMULATORS

    parser = argparse.ArgumentParser(
        prog="opentrn", description="An RTL-level model of a Trainium3-like accelerator core.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("config", help="print the resolved configuration (TOML or JSON)")
    _add_config_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    p.set_defaults(func=_cmd_config)

    p = commands.add_parser("verilog", help="generate Verilog of a block")
    _add_config_options(p)
    p.add_argument("--top", choices=list(TOPS), default="tensor_engine",
                   help="block to generate (default: tensor_engine)")
    p.add_argument("-o", "--output", metavar="FILE.v", help="output file (default: stdout)")
    p.set_defaults(func=_cmd_verilog)

    p = commands.add_parser(
        "demo", help="run a GEMM + bias + ReLU through the whole core RTL under cocotb, "
                     "bit-exact check, performance counters")
    _add_config_options(p)
    _add_run_options(p, sims=SIMULATORS, default_sim="Icarus if installed, else Verilator")
    _add_gemm_options(p, default=(32, 64, 64))
    p.set_defaults(func=_cmd_demo)

    p = commands.add_parser(
        "run", help="run a library kernel on the core RTL under cocotb, bit-exact check, "
                    "performance counters")
    kinds = p.add_subparsers(dest="kernel", required=True, metavar="KERNEL")
    for kind, text in (("gemm", "C = A @ B: int8 inputs, int32 results; float inputs, "
                                "FP32 results"),
                       ("gemm-relu", "int8 relu((A @ B + bias) / 2**8), or in a float "
                                     "format relu((A @ B) / 8 + bias)")):
        q = kinds.add_parser(kind, help=text)
        _add_config_options(q)
        _add_run_options(q, sims=SIMULATORS, default_sim="Icarus if installed, else "
                                                         "Verilator")
        _add_gemm_options(q, default=(64, 64, 64))
        q.set_defaults(func=_cmd_run)
    q = kinds.add_parser("mlp", help="a 2-layer MLP (relu, requantized or scaled), "
                                     "feature-major")
    _add_config_options(q)
    _add_run_options(q, sims=SIMULATORS, default_sim="Icarus if installed, else Verilator")
    for name, default in (("batch", 16), ("d-in", 32), ("hidden", 64), ("d-out", 16)):
        q.add_argument(f"--{name}", type=int, default=default,
                       help=f"(default: {default})")
    q.set_defaults(func=_cmd_run)

    p = commands.add_parser(
        "fuzz", help="run constrained-random programs on the golden machine, the core RTL "
                     "and the cycle model and compare them, with a coverage report")
    _add_config_options(p)
    p.add_argument("--count", type=int, default=200, help="programs (default: 200)")
    p.add_argument("--seeds", type=int, default=0, metavar="FIRST",
                   help="the first seed; the programs are seeds FIRST .. FIRST+COUNT-1 "
                        "(default: 0)")
    p.add_argument("--illegal", type=float, default=0.2, metavar="SHARE",
                   help="share of programs with one injected fault (default: 0.2)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: the machine's cores)")
    p.add_argument("--sim", choices=SIMULATORS,
                   help="simulator (default: Verilator if it runs here, else Icarus)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the batches on the Ray cluster at ADDRESS "
                        "(pip install 'opentrn[ray]') instead of local processes")
    p.add_argument("--shrink", action="store_true",
                   help="with --count 1: shrink a failing program to the fewest operations")
    p.add_argument("--timeline", action="store_true",
                   help="also compare each legal program's engine timeline with the cycle "
                   "model's, event for event (a slower simulation)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=_cmd_fuzz)

    p = commands.add_parser(
        "project", help="performance projection: peaks against the published figures, a GEMM "
                        "or a transformer layer on cores, chips and servers (cycle model)")
    _add_config_options(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--peaks", action="store_true",
                      help="peak FLOP/s per format of a core, chip and server, and the "
                           "bandwidths, beside the published figures")
    what.add_argument("--gemm", metavar="M,K,N", help="project C[M,N] = A[M,K] @ B[K,N]")
    what.add_argument("--transformer", metavar="D_MODEL,D_FF,HEADS,SEQ,BATCH",
                      help="project the forward pass of one transformer layer")
    p.add_argument("--dtype", choices=DTYPES,
                   help="input format, one of the build's dtypes (default: bf16 when the "
                        "build has it, else int8)")
    p.add_argument("--chips", type=int, default=1, help="chips (default: 1)")
    p.add_argument("--cores", type=int,
                   help="cores per chip that share a GEMM (default: cores_per_chip)")
    p.add_argument("--parallel", choices=("tensor", "data"), default="tensor",
                   help="how a GEMM splits over chips: tensor (K, then a ring all-reduce of "
                        "the output) or data (M) (default: tensor)")
    p.add_argument("--hop-latency", type=float, default=0.0, metavar="SECONDS",
                   help="latency of each of a ring all-reduce's 2 (N - 1) steps (default: 0, "
                        "ignored; none is published)")
    p.add_argument("--scaling", action="store_true",
                   help="also print the scaling curves, 1 chip to the largest published "
                        "cluster (data parallel training; tensor parallel)")
    p.add_argument("--compare-scalesim", action="store_true",
                   help="with --gemm: SCALE-Sim's weight-stationary cycles against this "
                        "model's tensor engine")
    p.add_argument("--compare-rtl", action="store_true",
                   help="with --gemm: run the GEMM on the core RTL and print the cycle "
                        "model's prediction beside every measured counter")
    p.add_argument("--sim", choices=SIMULATORS,
                   help="simulator of --compare-rtl (default: Icarus if installed, else "
                        "Verilator)")
    p.add_argument("--seed", type=int, default=1, help="input data seed of --compare-rtl")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw a roofline with the workload's points and its scaling curves")
    p.set_defaults(func=_cmd_project)

    from opentrn.fpga import DEFAULT_BAUD, TARGETS
    p = commands.add_parser(
        "fpga", help="synthesise, place and route for an ECP5 FPGA (the core out of context, "
                     "or the board top and its bitstream): resource and timing tables")
    _add_config_options(p)
    p.add_argument("--board", choices=TARGETS, default="ooc",
                   help="ooc: the core alone on the board's part; or a board (default: ooc)")
    p.add_argument("--top", choices=list(TOPS), default="core",
                   help="with --board ooc: the block to build (default: core)")
    p.add_argument("--build-dir", metavar="DIR",
                   help="folder of the tools' files (default: build/fpga-PRESET-BOARD)")
    p.add_argument("--seed", type=int, default=1, help="nextpnr's placer seed (default: 1)")
    p.add_argument("--baud", type=int, default=DEFAULT_BAUD,
                   help=f"the board's UART rate (default: {DEFAULT_BAUD:,})")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_fpga)

    p = commands.add_parser("wave", help="list the signals of a VCD or FST or print them per cycle")
    wave.add_arguments(p)
    p.set_defaults(func=_cmd_wave)
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    from opentrn.sim.runner import SimulatorMissing
    try:
        return args.func(args)
    except (ConfigError, KernelError, SimulatorMissing) as exc:
        print(f"opentrn {args.command}: error: {exc}", file=sys.stderr)
        return 2
