"""The memory side of a core: the DMA engine wired to the SBUF and the PSUM."""

from amaranth import Module
from amaranth.lib import wiring

from .dma import DMA
from .psum import PSUM
from .sbuf import SBUF

__all__ = ["MemorySystem"]

_DMA_PORTS = ("descriptor", "axi", "done", "completed", "busy", "error", "error_code",
              "clear")
_SBUF_PORTS = ("te_read", "act_read", "act_write")
_PSUM_PORTS = ("te_write", "act_read")


class MemorySystem(wiring.Component):
    """A :class:`~opentrn.hdl.dma.DMA` engine whose buffer ports drive the ``dma_read`` and
    ``dma_write`` ports of an :class:`~opentrn.hdl.sbuf.SBUF` and a
    :class:`~opentrn.hdl.psum.PSUM`. The engines' ports of the buffers (the tensor and
    activation engines, in a core) are brought out.

    Members
    -------
    descriptor, axi, done, completed, busy, error, error_code, clear
        The DMA engine's (:class:`~opentrn.hdl.dma.DMA`).
    sbuf_te_read, sbuf_act_read, sbuf_act_write
        The SBUF's ``te_read``, ``act_read`` and ``act_write``.
    psum_te_write, psum_act_read
        The PSUM's ``te_write`` and ``act_read``.
    """

    def __init__(self, *, config):
        self._dma, self._sbuf, self._psum = (DMA(config=config), SBUF(config=config),
                                             PSUM(config=config))
        members = {name: self._dma.signature.members[name] for name in _DMA_PORTS}
        for prefix, block, names in (("sbuf", self._sbuf, _SBUF_PORTS),
                                     ("psum", self._psum, _PSUM_PORTS)):
            for name in names:
                members[f"{prefix}_{name}"] = block.signature.members[name]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma, m.submodules.sbuf, m.submodules.psum = (self._dma, self._sbuf,
                                                                  self._psum)
        for name in _DMA_PORTS:
            inner, outer = getattr(self._dma, name), getattr(self, name)
            member = self.signature.members[name]
            if member.is_signature:
                wiring.connect(m, wiring.flipped(outer), inner)
            elif member.flow == wiring.In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        for prefix, block, names in (("sbuf", self._sbuf, _SBUF_PORTS),
                                     ("psum", self._psum, _PSUM_PORTS)):
            for name in names:
                wiring.connect(m, wiring.flipped(getattr(self, f"{prefix}_{name}")),
                               getattr(block, name))
        wiring.connect(m, self._dma.sbuf_read, self._sbuf.dma_read)
        wiring.connect(m, self._dma.sbuf_write, self._sbuf.dma_write)
        wiring.connect(m, self._dma.psum_read, self._psum.dma_read)
        wiring.connect(m, self._dma.psum_write, self._psum.dma_write)
        return m
