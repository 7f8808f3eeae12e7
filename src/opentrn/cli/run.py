"""``opentrn demo`` and ``opentrn run``: a library kernel on the core RTL (or with
``--model`` the cycle model), its report, waves, GTKWave save file and timeline."""

import json
import sys
from pathlib import Path

from opentrn.config import ConfigError
from opentrn.report import key_value_table

from .common import (
    DTYPES,
    _check_dtype,
    _config,
    _output_file,
    _positive,
    _preset_label,
    _Progress,
)


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
        "peak_macs_per_cycle": _peak(cfg, args.dtype),
        "utilization": counters["macs"] / (cycles * _peak(cfg, args.dtype)) if cycles
        else None,
        "dma_engines_built": _DMA_ENGINES_BUILT,
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
                                           f"{report['peak_macs_per_cycle']} peak "
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
                 *_dma_engine_rows(cfg),
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
        "utilization": counters["macs"] / (cycles * _peak(cfg, args.dtype)),
        "dma_engines_built": _DMA_ENGINES_BUILT,
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
    rows += _dma_engine_rows(cfg)
    print(key_value_table(rows))
    return 0


#: DMA engines the core RTL builds (and the cycle model, which follows it), whatever the
#: configuration's ``dma_engines``, which only the projection's fast path uses.
_DMA_ENGINES_BUILT = 1


def _peak(cfg, dtype):
    """MACs per cycle of the array at full occupancy in ``dtype``."""
    return cfg.peak_macs_per_cycle * cfg.macs_per_pe_cycle(dtype)


def _dma_engine_rows(cfg):
    """A report row when the configuration asks for more DMA engines than the RTL builds."""
    if cfg.dma_engines <= _DMA_ENGINES_BUILT:
        return []
    return [("note", f"dma_engines={cfg.dma_engines}: the RTL builds {_DMA_ENGINES_BUILT} DMA "
                     f"engine of {cfg.dma_bus_bytes} bytes a cycle (the cycle model follows "
                     "it); only opentrn project models the configured engines")]


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
