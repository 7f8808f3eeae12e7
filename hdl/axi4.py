"""The AXI4 interface (AMBA AXI4, IHI 0022): the bus an FPGA's DDR controller speaks."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AXI4Signature", "AXI4ReadSignature", "READ_MEMBERS", "RESP_OKAY", "RESP_EXOKAY",
           "RESP_SLVERR", "RESP_DECERR", "BURST_INCR", "MAX_BURST_BEATS", "BOUNDARY_BYTES"]

RESP_OKAY, RESP_EXOKAY, RESP_SLVERR, RESP_DECERR = 0, 1, 2, 3
BURST_INCR = 1
MAX_BURST_BEATS = 256     # AXI4 INCR bursts: AxLEN is 8 bits
BOUNDARY_BYTES = 4096     # no burst may cross a 4 KiB boundary


def _check_width(data_width):
    if data_width not in (8, 16, 32, 64, 128, 256, 512, 1024):
        raise ValueError(f"data_width must be a power of two from 8 to 1024, not {data_width}")


def _read_members(addr_width, data_width, id_width):
    return {
        "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
        "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
        "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
        "rvalid": In(1), "rready": Out(1),
    }


class _AXI4Base(wiring.Signature):
    def __init__(self, members, *, addr_width, data_width, id_width):
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        super().__init__(members)

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width and other.id_width == self.id_width)

    def __repr__(self):
        return (f"{type(self).__name__}(addr_width={self.addr_width}, "
                f"data_width={self.data_width}, id_width={self.id_width})")


class AXI4Signature(_AXI4Base):
    """An AXI4 manager port (``Out`` members are driven by the manager), with the five
    channels' signals named as in the specification (``awaddr``, ``wdata``, ``bresp``...),
    so that in Verilog a member ``axi`` reads ``axi__awaddr`` and cocotbext-axi binds to it
    with ``AxiBus.from_prefix(dut, "axi_")``.

    Lock, cache, protection, QoS, region and user signals are not used and not present.
    """

    def __init__(self, *, addr_width, data_width, id_width=1):
        _check_width(data_width)
        super().__init__({
            "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8),
            "awsize": Out(3), "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            **_read_members(addr_width, data_width, id_width),
        }, addr_width=addr_width, data_width=data_width, id_width=id_width)


class AXI4ReadSignature(_AXI4Base):
    """The read half of an AXI4 manager port (AR and R channels), named as in
    :class:`AXI4Signature`: what an instruction fetcher needs."""

    def __init__(self, *, addr_width, data_width, id_width=1):
        _check_width(data_width)
        super().__init__(_read_members(addr_width, data_width, id_width),
                         addr_width=addr_width, data_width=data_width, id_width=id_width)


#: The members of the read channels (AR, R), common to both signatures.
READ_MEMBERS = tuple(_read_members(12, 32, 1))
