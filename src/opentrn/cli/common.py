"""What every command shares: progress lines, the configuration options, output files,
numbers."""

import sys
import time
from pathlib import Path

from opentrn import config as configuration
from opentrn.config import ConfigError


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
