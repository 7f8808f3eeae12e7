"""The hardware, in Amaranth HDL: one block per module."""

from .processing_element import ProcessingElement
from .tensor_engine import TensorEngine

__all__ = ["ProcessingElement", "TensorEngine", "TOPS", "toplevel"]

#: Blocks that can be a simulation or Verilog top level, by name.
TOPS = {
    "tensor_engine": TensorEngine,
}


def toplevel(name, config):
    """Build the top-level component ``name`` sized by ``config``."""
    if name not in TOPS:
        raise ValueError(f"top={name!r}: must be one of {', '.join(TOPS)}")
    return TOPS[name](config=config)
