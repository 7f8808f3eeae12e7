"""The ``opentrn`` command line.

Every command that builds hardware takes the configuration options ``--preset``, ``--file``
and ``--set key=value`` (repeatable), resolved by :func:`opentrn.config.resolve`. Progress of
long steps goes to standard error, results to standard output; ``--json`` prints one JSON
object for scripts.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from opentrn.config import ConfigError
from opentrn.kernel import KernelError

# _config, _parser and _build_kernel are the tests' way in, as when this was one module.
from .common import DTYPES, _add_config_options, _base_preset, _config, _output_file, _Progress
from .project import _cmd_project
from .run import _add_gemm_options, _add_run_options, _cmd_demo, _cmd_run
from .run import _build_kernel as _build_kernel

__all__ = ["main"]


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


def _cmd_wave(args):
    from opentrn.sim import gtkw, wave
    return wave.command(args, run=gtkw.run if args.gtkw is not None else None)


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
        if result.bitstream and result.fits and not result.timing_met:
            advice = (f"the bitstream clocks the core at {cfg.clock_hz / 1e6:g} MHz, faster "
                      f"than the {result.achieved_mhz:g} MHz its routing allows: do not "
                      "load it")
            if result.suggested_clock_hz:
                advice += (f"; rebuild at a slower clock, e.g. --set "
                           f"clock_hz={result.suggested_clock_hz} (another placement lands "
                           "a few percent either way)")
            print(advice)
    return 0 if result.fits and result.timing_met else 1


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
    p.add_argument("--core-model", choices=("auto", "exact", "fast"), default="auto",
                   help="with --gemm: one core's cycles from the exact cycle model (the "
                        "RTL's, cycle for cycle; one DMA engine only) or the fast path; auto: "
                        "exact where it follows the configuration and the kernel is at most "
                        "50,000 cycles (default: auto)")
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
