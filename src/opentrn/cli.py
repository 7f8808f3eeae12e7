"""The ``opentrn`` command line.

Every command that builds hardware takes the configuration options ``--preset``, ``--file``
and ``--set key=value`` (repeatable), resolved by :func:`opentrn.config.resolve`. Progress of
long steps goes to standard error, results to standard output; ``--json`` prints one JSON
object for scripts.
"""

import argparse
import json
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
    progress = _Progress()
    formats = "/".join(cfg.dtypes)
    progress(f"generating Verilog for {args.top} ({cfg.pe_rows}x{cfg.pe_cols}, {formats})")
    text = verilog_source(cfg, args.top)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        progress(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


def _preset_label(args):
    """The preset a run's configuration comes from, and whether a file or overrides changed
    it: ``tiny``, ``small + overrides``."""
    base = args.preset
    if base is None and args.file:
        base = configuration.load_file(args.file).get("preset")
    label = base or "tiny"
    return f"{label} + overrides" if args.file or args.overrides else label


def _positive(name, value):
    if value < 1:
        raise ConfigError(f"{name}={value}: must be at least 1")
    return value


#: The kernel input formats of ``--dtype`` (the MX formats: FP8 elements with random E8M0
#: block scales).
DTYPES = ("int8", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")
#: Random E8M0 scale codes of the MX formats, from ``low`` to ``high - 1``: ``2**-3`` to
#: ``2**3`` per operand, so that the scaled sums stay mostly within FP8 range.
MX_SCALE_CODES = (124, 131)


def _random_inputs(rng, shape, dtype):
    """Random int8 values, or normal values rounded to the float format ``dtype`` (an MX
    format: its FP8 element format)."""
    import numpy as np

    from opentrn import numerics
    from opentrn.kernel import FORMAT_DTYPES
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    element = numerics.data_format(dtype).element.name
    return rng.standard_normal(shape).astype(np.float32).astype(FORMAT_DTYPES[element])


def _random_scales(rng, rows, cols):
    """Random E8M0 scale codes (uint8) of an MX operand of ``rows`` x ``cols``: one per
    block of 32 rows and per column."""
    import numpy as np

    from opentrn import numerics
    return rng.integers(*MX_SCALE_CODES, (-(-rows // numerics.MX_BLOCK), cols)).astype(
        np.uint8)


def _random_bias(rng, size, dtype, span):
    import numpy as np
    if dtype == "int8":
        return rng.integers(-span, span, size).astype(np.int32)
    return rng.standard_normal(size).astype(np.float32)


def _build_kernel(args, cfg):
    """The kernel of ``opentrn run`` / ``opentrn demo``: ``(label, program, expected)``.
    The MX formats take random E8M0 scales (:data:`MX_SCALE_CODES`) per block of 32 rows
    along K and per column, drawn after the elements and biases."""
    import numpy as np

    from opentrn import kernels, numerics
    rng = np.random.default_rng(args.seed)
    dtype = args.dtype
    if dtype not in cfg.dtypes:
        raise ConfigError(f"--dtype={dtype}: not among this build's formats, dtypes="
                          f"{','.join(cfg.dtypes)} (add it with --set dtypes=...)")
    mx = numerics.data_format(dtype).mx
    # Float scales keep the outputs in range; int8 requantizes by a shift instead.
    scaling = ({} if dtype == "int8" else {"scales": (0.25, 0.25)})
    if args.kernel == "mlp":
        batch, d_in, hidden, d_out = (_positive(f"--{name}", getattr(args, name.replace(
            "-", "_"))) for name in ("batch", "d-in", "hidden", "d-out"))
        x_t, w1 = (_random_inputs(rng, (d_in, batch), dtype),
                   _random_inputs(rng, (d_in, hidden), dtype))
        b1 = _random_bias(rng, hidden, dtype, 2000)
        w2, b2 = _random_inputs(rng, (hidden, d_out), dtype), _random_bias(rng, d_out, dtype,
                                                                            2000)
        if mx:
            scaling["block_scales"] = (_random_scales(rng, d_in, batch),
                                       _random_scales(rng, d_in, hidden),
                                       _random_scales(rng, hidden, d_out))
        program, expected = kernels.mlp(
            cfg, x_t, w1, b1, w2, b2, requant=((1, 7), (1, 7)) if dtype == "int8" else None,
            **scaling)
        return f"{dtype} mlp {batch}x{d_in}x{hidden}x{d_out}", program, expected
    m, k, n = (_positive(f"--{name}", getattr(args, name)) for name in ("m", "k", "n"))
    a, b = _random_inputs(rng, (m, k), dtype), _random_inputs(rng, (k, n), dtype)
    bias = _random_bias(rng, m, dtype, 4000) if args.kernel == "gemm-relu" else None
    extra = ({"block_scales": (_random_scales(rng, k, m), _random_scales(rng, k, n))} if mx
             else {})
    if args.kernel == "gemm-relu":
        requant = {"multiplier": 1, "shift": 8} if dtype == "int8" else {"scale": 0.125}
        program, expected = kernels.gemm_bias_relu(cfg, a.T.copy(), b, bias, **requant,
                                                   **extra)
        return f"{dtype} gemm+bias+relu {m}x{k}x{n}", program, expected
    program, expected = kernels.gemm(cfg, a.T.copy(), b, **extra)
    return f"{dtype} gemm {m}x{k}x{n}", program, expected


def _run_kernel(args):
    """Build a kernel, run it on the core RTL, check it against numpy and the golden
    machine, and report the performance counters."""
    import numpy as np

    from opentrn.golden.core import Core as GoldenCore
    from opentrn.hdl import check
    from opentrn.isa import Fault
    from opentrn.kernel import mismatches as count_mismatches
    from opentrn.sim import runner
    from opentrn.sim.core import CoreRunError, run_programs
    cfg = _config(args)
    check("core", cfg)
    sim = args.sim or runner.default_simulator()
    reason = runner.available(sim)
    if reason is not None:
        raise runner.SimulatorMissing(reason)
    progress = _Progress()
    label, program, expected = _build_kernel(args, cfg)
    progress(f"built {label}: {sum(program.instruction_counts.values())} instructions")
    reference = GoldenCore(cfg).run(program.hbm, program.programs)
    try:
        (outcome,), result = run_programs([program], sim=sim, vcd=args.waves,
                                          progress=progress)
    except CoreRunError as exc:
        print(f"opentrn {args.command}: FAIL: {exc}", file=sys.stderr)
        return 1
    progress("done")
    outputs = program.read_outputs(outcome.hbm)
    mismatches = sum(count_mismatches(outputs[name], value) for name, value in expected.items())
    golden_mismatches = int(np.count_nonzero(outcome.hbm != reference.hbm[:len(outcome.hbm)]))
    counters = outcome.counters
    cycles = counters["cycles"]
    record = result.reports[-1]
    report = {
        "passed": outcome.fault == Fault.NONE and mismatches == 0 and golden_mismatches == 0,
        "kernel": label,
        "preset": _preset_label(args),
        "sim": sim,
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
        "instructions": dict(program.instruction_counts),
        "sim_seconds": round(result.seconds, 3),
        "cycles_per_second": round(cycles / record["wall_seconds"]) if cycles else None,
        "vcd": str(result.vcd) if result.vcd else None,
        "log": str(result.log),
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
            ("simulator", f"{sim} ({report['cycles_per_second']} cycles/s)"),
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
        rows += [("DMA bytes", counters["dma_bytes"]),
                 ("waves", report["vcd"] or "(none: --waves FILE.vcd)"),
                 ("result", verdict)]
        print(key_value_table(rows))
    return 0 if report["passed"] else 1


def _cmd_run(args):
    return _run_kernel(args)


def _cmd_demo(args):
    args.kernel = "gemm-relu"
    return _run_kernel(args)


def _cmd_wave(args):
    from opentrn.sim import wave
    return wave.command(args)


# -- parser -----------------------------------------------------------------------------------

def _add_run_options(parser, *, sims, default_sim):
    parser.add_argument("--sim", choices=sims, help=f"simulator (default: {default_sim})")
    parser.add_argument("--waves", metavar="FILE.vcd", help="write a VCD waveform")
    parser.add_argument("--seed", type=int, default=1, help="input data seed (default: 1)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--dtype", choices=DTYPES, default="int8",
                        help="input format of the kernel, one of the build's dtypes; the MX "
                        "formats take random E8M0 block scales (default: int8)")


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

    p = commands.add_parser("wave", help="list the signals of a VCD or print them per cycle")
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
