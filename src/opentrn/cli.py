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
    progress(f"generating Verilog for {args.top} ({cfg.pe_rows}x{cfg.pe_cols}, {cfg.dtype})")
    text = verilog_source(cfg, args.top)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        progress(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


def _cmd_demo(args):
    from opentrn.sim import runner
    cfg = _config(args)
    if args.cases < 1:
        raise ConfigError(f"--cases={args.cases}: must be at least 1")
    sim = args.sim or runner.default_simulator()
    reason = runner.available(sim)
    if reason is not None:
        raise runner.SimulatorMissing(reason)
    progress = _Progress()
    result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                        testcase="test_random_workload",
                        env={"OPENTRN_CASES": args.cases, "OPENTRN_SEED": args.seed},
                        vcd=args.waves, progress=progress)
    progress("done")
    stats = result.reports[0] if result.reports else {}
    report = {
        "passed": result.passed and stats.get("mismatches") == 0,
        "preset": args.preset or "tiny",
        "sim": sim,
        "array": f"{cfg.pe_rows}x{cfg.pe_cols}",
        "dtype": cfg.dtype,
        "cases": stats.get("cases", 0),
        "mismatches": stats.get("mismatches"),
        "cycle_mismatches": stats.get("cycle_mismatches"),
        "cycles": stats.get("cycles"),
        "macs": stats.get("macs"),
        "macs_per_cycle": stats["macs"] / stats["cycles"] if stats else None,
        "peak_macs_per_cycle": cfg.peak_macs_per_cycle,
        "utilization": stats.get("utilization"),
        "sim_seconds": round(result.seconds, 3),
        "vcd": str(result.vcd) if result.vcd else None,
        "log": str(result.log),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verdict = "PASS: bit-exact" if report["passed"] else "FAIL"
        rows = [
            ("preset", f"{report['preset']} ({report['array']} {report['dtype']})"),
            ("simulator", sim),
            ("cases", f"{report['cases']} random matmuls, N = 1..{cfg.moving_max}"),
            ("mismatches", f"{report['mismatches']} (cycle formula: "
                           f"{report['cycle_mismatches']})"),
            ("cycles", report["cycles"]),
            ("MACs", report["macs"]),
        ]
        if stats:
            rows += [
                ("MACs per cycle", f"{report['macs_per_cycle']:.2f} of "
                                   f"{report['peak_macs_per_cycle']} peak "
                                   f"({100 * report['utilization']:.1f}% utilization)"),
            ]
        rows += [("waves", report["vcd"] or "(none: --waves FILE.vcd)"),
                 ("result", verdict if stats else f"FAIL: simulation did not finish, see "
                                                  f"{report['log']}")]
        print(key_value_table(rows))
    return 0 if report["passed"] else 1


def _cmd_wave(args):
    from opentrn.sim import wave
    return wave.command(args)


# -- parser -----------------------------------------------------------------------------------

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
        "demo", help="run a random matmul workload on the RTL under cocotb, bit-exact check")
    _add_config_options(p)
    p.add_argument("--sim", choices=SIMULATORS,
                   help="simulator (default: Icarus if installed, else Verilator)")
    p.add_argument("--waves", metavar="FILE.vcd", help="write a VCD waveform")
    p.add_argument("--cases", type=int, default=200, help="random matmuls (default: 200)")
    p.add_argument("--seed", type=int, default=1, help="workload seed (default: 1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_demo)

    p = commands.add_parser("wave", help="list the signals of a VCD or print them per cycle")
    wave.add_arguments(p)
    p.set_defaults(func=_cmd_wave)
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    from opentrn.sim.runner import SimulatorMissing
    try:
        return args.func(args)
    except (ConfigError, SimulatorMissing) as exc:
        print(f"opentrn {args.command}: error: {exc}", file=sys.stderr)
        return 2
