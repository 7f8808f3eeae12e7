"""The hardware, in Amaranth HDL: one block per module."""

from amaranth.hdl import Const, ValueCastable

from opentrn.config import ConfigError
from opentrn.numerics import check_buildable

from . import fp_adder, fp_cast, fp_multiplier
from .activation_engine import ActivationEngine
from .core import Core
from .core import check_config as check_core
from .dma import DMA
from .memory_system import MemorySystem
from .processing_element import ProcessingElement
from .psum import PSUM
from .sbuf import SBUF
from .tensor_engine import TensorEngine

__all__ = ["ProcessingElement", "TensorEngine", "SBUF", "PSUM", "DMA", "MemorySystem",
           "ActivationEngine", "Core", "TOPS", "check", "toplevel", "ports"]

#: Blocks that can be a simulation or Verilog top level, by name.
TOPS = {
    "tensor_engine": TensorEngine,
    "sbuf": SBUF,
    "psum": PSUM,
    "dma": DMA,
    "memory_system": MemorySystem,
    "activation_engine": ActivationEngine,
    "core": Core,
    "fp_adder": fp_adder.unit_test_top,
    "fp_cast": fp_cast.unit_test_top,
    "fp_multiplier": fp_multiplier.unit_test_top,
}


def check(name, config):
    """Raise :class:`ConfigError` unless the top level ``name`` can be built for ``config``
    (before any hardware is elaborated)."""
    if name not in TOPS:
        raise ValueError(f"top={name!r}: must be one of {', '.join(TOPS)}")
    try:
        check_buildable(config, "the hardware")
    except ValueError as exc:
        # A valid configuration (projections use it) that the hardware cannot build.
        raise ConfigError(f"{exc} (try --set dtypes={','.join(('int8', *config.dtypes))})"
                          ) from None
    if config.pe_macs_per_cycle:
        # The PEs have one multiplier each: rates above 1 MAC per cycle are what the
        # projections assume of a Trainium core, not something this RTL implements.
        raise ConfigError(f"pe_macs_per_cycle={config.pe_macs_per_cycle!r}: the hardware does "
                          "one MAC per PE per cycle in every format; rates above 1 are for "
                          "projections only (try --set pe_macs_per_cycle=)")
    if name == "core":
        check_core(config)


def toplevel(name, config):
    """Build the top-level component ``name`` sized by ``config``."""
    check(name, config)
    return TOPS[name](config=config)


def ports(component):
    """The ``ports=`` argument of ``amaranth.back.verilog.convert`` for a top level:
    ``None`` (Amaranth's own port list) unless a member is constant. The ``ready`` of an
    ``always_ready`` stream is ``Const(1)``, which Amaranth's own list includes and then
    refuses as a port; here it is left out, and the other members keep their path names
    (``te_read__request__valid``)."""
    result, constant = {}, False
    for path, _member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if isinstance(value, Const):
            constant = True
            continue
        # Direction None: Amaranth infers it (driven inside: output; else input).
        result["__".join(map(str, path))] = (value, None)
    return result if constant else None
