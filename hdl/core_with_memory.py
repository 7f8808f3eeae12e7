"""The core with its HBM as hardware (:class:`~opentrn.hdl.axi4_memory.AXI4Memory`): the
top level of fast whole-core simulations, in which the testbench only writes the host
registers, waits for the interrupt and reaches the memory through the simulator before and
after a run (``opentrn run --hbm fast``, docs/performance.md)."""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi4_lite import AXI4LiteSignature
from .axi4_memory import AXI4Memory
from .core import HOST_ADDR_BITS, Core

__all__ = ["CoreWithMemory"]


class CoreWithMemory(wiring.Component):
    """:class:`~opentrn.hdl.core.Core` on an :class:`~opentrn.hdl.axi4_memory.AXI4Memory` of
    ``config.hbm_bytes`` (submodules ``core`` and ``hbm``; the contents are
    ``hbm.storage``).

    Members
    -------
    host : ``In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS))``
        The core's host registers.
    irq : ``Out(1)``
        The core's interrupt.
    hbm_latency : ``In(16)``
        The memory's added latency (cycles), held for a run.
    hbm_clear_written, hbm_written_begin, hbm_written_end
        The memory's ``clear_written``, ``written_begin`` and ``written_end``: the range
        of HBM bytes written since it was last cleared.
    hbm_error : ``Out(3)``
        The memory's error code (:data:`~opentrn.hdl.axi4_memory.ERRORS`), 0 if none.
    """

    def __init__(self, *, config):
        self._config = config
        self._core = Core(config=config)
        axi = self._core.signature.members["axi"].signature
        self._hbm = AXI4Memory(size_bytes=config.hbm_bytes, addr_width=axi.addr_width,
                               data_width=axi.data_width, id_width=axi.id_width)
        super().__init__({
            "host": In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS)),
            "irq": Out(1),
            "hbm_latency": In(16),
            "hbm_clear_written": In(1),
            "hbm_written_begin": Out(config.hbm_addr_bits + 1),
            "hbm_written_end": Out(config.hbm_addr_bits + 1),
            "hbm_error": Out(3),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self._core
        m.submodules.hbm = hbm = self._hbm
        wiring.connect(m, core.axi, hbm.axi)
        wiring.connect(m, wiring.flipped(self.host), core.host)
        m.d.comb += [
            self.irq.eq(core.irq),
            hbm.latency.eq(self.hbm_latency),
            hbm.clear_written.eq(self.hbm_clear_written),
            self.hbm_written_begin.eq(hbm.written_begin),
            self.hbm_written_end.eq(hbm.written_end),
            self.hbm_error.eq(hbm.error),
        ]
        return m

