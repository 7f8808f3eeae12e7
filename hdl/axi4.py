"""The AXI4 interface (AMBA AXI4, IHI 0022): the bus an FPGA's DDR controller speaks."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AXI4Signature", "AXI4ReadSignature", "READ_MEMBERS", "RESP_OKAY", "RESP_EXOKAY",
           "RESP_SLVERR", "RESP_DECERR", "BURST_INCR", "MAX_BURST_BEATS", "BOUNDARY_BYTES"]

RESP_OKAY, RESP_EXOKAY, RESP_SLVERR, RESP_DECERR = 0, 1, 2, 3
BURST_INCR = 1
MAX_BURST_BEATS = 256     # AXI4 INCR bursts: AxLEN is 8 bits
BOUNDARY_BYTES = 4096     # no burst may cross a 4 KiB boundary


class AXI4Signature(wiring.Signature):
    """An AXI4 manager port (``Out`` members are driven by the manager), with the five
    channels' signals named as in the specification (``awaddr``, ``wdata``, ``bresp``...),
    so that in Verilog a member ``axi`` reads ``axi__awaddr`` and cocotbext-axi binds to it
    with ``AxiBus.from_prefix(dut, "axi_")``.

    Lock, cache, protection, QoS, region and user signals are not used and not present.
    """

    def __init__(self, *, addr_width, data_width, id_width=1):
        if data_width not in (8, 16, 32, 64, 128, 256, 512, 1024):
            raise ValueError(f"data_width must be a power of two from 8 to 1024, "
                             f"not {data_width}")
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        super().__init__({
            "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8),
            "awsize": Out(3), "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
            "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AXI4Signature) and other.addr_width == self.addr_width
                and other.data_width == self.data_width and other.id_width == self.id_width)

    def __repr__(self):
        return (f"AXI4Signature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")


class AXI4ReadSignature(wiring.Signature):
    """The read half of an AXI4 manager port (AR and R channels), named as in
    :class:`AXI4Signature`: what an instruction fetcher needs."""

    def __init__(self, *, addr_width, data_width, id_width=1):
        if data_width not in (8, 16, 32, 64, 128, 256, 512, 1024):
            raise ValueError(f"data_width must be a power of two from 8 to 1024, "
                             f"not {data_width}")
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        super().__init__({
            "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
            "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AXI4ReadSignature) and other.addr_width == self.addr_width
                and other.data_width == self.data_width and other.id_width == self.id_width)

    def __repr__(self):
        return (f"AXI4ReadSignature(addr_width={self.addr_width}, "
                f"data_width={self.data_width}, id_width={self.id_width})")


#: The members of the read channels (AR, R), common to both signatures.
READ_MEMBERS = tuple(AXI4ReadSignature(addr_width=12, data_width=32).members.keys())
