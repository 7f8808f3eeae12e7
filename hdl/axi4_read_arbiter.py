"""Several AXI4 read managers (the DMA engine and the instruction fetchers) on one AXI4 read
port: round-robin on the AR channel, R beats routed back by ID."""

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .axi4 import AXI4ReadSignature

__all__ = ["AXI4ReadArbiter"]


class AXI4ReadArbiter(wiring.Component):
    """Manager ``i`` of ``count`` gets ARID ``i`` on the shared port (its own ARID is not
    used: each manager here keeps its reads in order). An AR request is granted round-robin
    (the manager after the last winner first) and the grant is held until the address
    transfers, so AR payloads stay stable as AXI4 requires. R beats go to the manager named
    by RID; ``rready`` is that manager's.

    Members
    -------
    managers : ``In(AXI4ReadSignature(addr_width, data_width)).array(count)``
        The managers' read ports (flipped: this block is their subordinate).
    port : ``Out(AXI4ReadSignature(addr_width, data_width, id_width=ceil_log2(count)))``
        The shared port.
    """

    def __init__(self, *, count, addr_width, data_width):
        if not isinstance(count, int) or count < 2:
            raise ValueError(f"count must be an integer >= 2, not {count!r}")
        self._count = count
        id_width = max(1, ceil_log2(count))
        super().__init__({
            "managers": In(AXI4ReadSignature(addr_width=addr_width,
                                             data_width=data_width)).array(count),
            "port": Out(AXI4ReadSignature(addr_width=addr_width, data_width=data_width,
                                          id_width=id_width)),
        })

    def elaborate(self, platform):
        count = self._count
        m = Module()
        managers, port = self.managers, self.port

        owner = Signal(range(count))        # manager presenting AR (held while locked)
        locked = Signal()                   # owner's AR is on the port, not yet taken
        last = Signal(range(count), init=count - 1)
        choice = Signal(range(count))
        any_valid = Signal()
        # Round-robin choice among the requesters, starting after the last winner.
        with m.Switch(last):
            for previous in range(count):
                with m.Case(previous):
                    order = [(previous + step) % count for step in range(1, count + 1)]
                    for index in reversed(order):
                        with m.If(managers[index].arvalid):
                            m.d.comb += [choice.eq(index), any_valid.eq(1)]
        current = Signal(range(count))
        m.d.comb += current.eq(choice)
        with m.If(locked):
            m.d.comb += current.eq(owner)
        presenting = Signal()
        m.d.comb += presenting.eq(locked | any_valid)

        with m.Switch(current):
            for index in range(count):
                with m.Case(index):
                    source = managers[index]
                    m.d.comb += [
                        port.arid.eq(index), port.araddr.eq(source.araddr),
                        port.arlen.eq(source.arlen), port.arsize.eq(source.arsize),
                        port.arburst.eq(source.arburst),
                        port.arvalid.eq(presenting & source.arvalid),
                        source.arready.eq(presenting & port.arready),
                    ]
        with m.If(port.arvalid & port.arready):
            m.d.sync += [locked.eq(0), last.eq(current)]
        with m.Elif(port.arvalid):
            m.d.sync += [locked.eq(1), owner.eq(current)]

        for index in range(count):
            sink = managers[index]
            m.d.comb += [
                sink.rid.eq(0), sink.rdata.eq(port.rdata), sink.rresp.eq(port.rresp),
                sink.rlast.eq(port.rlast), sink.rvalid.eq(port.rvalid & (port.rid == index)),
            ]
            with m.If(port.rid == index):
                m.d.comb += port.rready.eq(sink.rready)
        return m
