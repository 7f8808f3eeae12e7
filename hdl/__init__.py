"""The hardware, in Amaranth HDL: one block per module."""

from amaranth.hdl import Const, ValueCastable

from opentrn.config import ConfigError
from opentrn.numerics import check_buildable

from . import fp_adder, fp_cast, fp_multiplier
from .activation_engine import ActivationEngine
from .axi4_memory import MAX_BYTES as MAX_HBM_BYTES
from .core import Core
from .core import check_config as check_core
from .core_with_memory import CoreWithMemory
from .dma import DMA
from .memory_system import MemorySystem
from .processing_element import ProcessingElement
from .psum import PSUM
from .sbuf import SBUF
from .tensor_engine import TensorEngine

__all__ = ["ProcessingElement", "TensorEngine", "SBUF", "PSUM", "DMA", "MemorySystem",
           "ActivationEngine", "Core", "CoreWithMemory", "TOPS", "check", "toplevel", "ports"]

#: Blocks that can be a simulation or Verilog top level, by name.
TOPS = {
    "tensor_engine": TensorEngine,
    "sbuf": SBUF,
    "psum": PSUM,
    "dma": DMA,
    "memory_system": MemorySystem,
    "activation_engine": ActivationEngine,
    "core": Core,
    "core_with_memory": CoreWithMemory,
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
        raise ConfigError(str(exc)) from None
    if name in _WITH_SBUF:
        _check_vector_width(config)
    if name in ("core", "core_with_memory"):
        check_core(config)
    if name == "core_with_memory" and config.hbm_bytes > MAX_HBM_BYTES:
        raise ConfigError(
            f"hbm_bytes={config.hbm_bytes:,}: the simulated HBM (core_with_memory) holds at "
            f"most {MAX_HBM_BYTES:,} bytes; simulate a configuration with less HBM")


#: The tops that hold the SBUF and so its vector ports.
_WITH_SBUF = ("sbuf", "memory_system", "activation_engine", "core", "core_with_memory")
#: The widest signal Amaranth writes: 2**16 bits, the vector width IEEE 1364-2005 requires
#: every Verilog tool to support (wider wires raise OverflowError in its RTLIL back end).
MAX_SIGNAL_BITS = 1 << 16


def _check_vector_width(config):
    from amaranth.hdl import Shape

    from .partitioned_memory import vector_write_layout
    from .sbuf import vector_geometry

    partitions, vector_bytes, depth = vector_geometry(config)
    bits = Shape.cast(vector_write_layout(partitions, vector_bytes, depth)).width
    if bits > MAX_SIGNAL_BITS:
        raise ConfigError(
            f"sbuf_partitions={partitions}: the SBUF's vector write (a {vector_bytes}-byte "
            f"vector word, Config.vector_word_bytes, and its byte strobes in each of "
            f"{partitions} partitions) is {bits:,} bits, wider than the "
            f"{MAX_SIGNAL_BITS:,} bits of a Verilog vector Amaranth can write (about "
            "9 x sbuf_partitions x vector_word_bytes bits must fit); the tensor engine "
            "builds at any size")


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
