"""The AXI4-Lite interface (AMBA AXI4-Lite, IHI 0022): the register bus a host CPU speaks."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi4 import RESP_DECERR, RESP_EXOKAY, RESP_OKAY, RESP_SLVERR

__all__ = ["AXI4LiteSignature", "RESP_OKAY", "RESP_EXOKAY", "RESP_SLVERR", "RESP_DECERR"]


class AXI4LiteSignature(wiring.Signature):
    """An AXI4-Lite manager port (``Out`` members are driven by the manager), with the five
    channels' signals named as in the specification (``awaddr``, ``wdata``, ``bresp``...),
    so that in Verilog a member ``host`` reads ``host__awaddr`` and cocotbext-axi binds to
    it with ``AxiLiteBus.from_prefix(dut, "host_")``. A subordinate takes it flipped:
    ``In(AXI4LiteSignature(...))``.

    Every transaction is one beat of the full data width; there are no IDs, bursts or
    ``last`` signals.
    """

    def __init__(self, *, addr_width, data_width=32):
        # AXI4-Lite allows only 32- and 64-bit data buses.
        if data_width not in (32, 64):
            raise ValueError(f"data_width must be 32 or 64, not {data_width}")
        if not isinstance(addr_width, int) or addr_width < 1:
            raise ValueError(f"addr_width must be a positive integer, not {addr_width!r}")
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AXI4LiteSignature) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __repr__(self):
        return f"AXI4LiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"
