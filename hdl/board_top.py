"""The top level of an FPGA board: the core, block RAM standing in for its HBM, and a UART
host bridge, with the pins a board wires to its USB-UART (:class:`BoardTop`; docs/fpga.md,
"Board top")."""

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .block_ram_memory import BlockRAMMemory
from .core import AXI_ID_BITS, HOST_ADDR_BITS, Core
from .host_bridge import DEFAULT_MAX_WORDS, HostBridge
from .host_bridge import check_parameters as check_bridge
from .params import refusing
from .uart_receiver import MIN_DIVISOR, UARTReceiver
from .uart_transmitter import UARTTransmitter

__all__ = ["BoardTop", "DEFAULT_BAUD", "MAX_BAUD_ERROR", "MAX_MEMORY_BYTES", "divisor_for",
           "simulation_top", "SIMULATION_DIVISOR", "SIMULATION_TIMEOUT_CYCLES"]

#: The UART's default rate: 1 Mbaud, which an FT2232H (the ECPIX-5's USB-UART) makes exactly.
DEFAULT_BAUD = 1_000_000
#: The largest difference between the rate asked for and the rate the clock divides down
#: to: a UART tolerates about 4% between the two ends in all, so each may take half.
MAX_BAUD_ERROR = 0.02
#: The most memory a board top holds on chip: 4 MiB, more than the block RAM of any FPGA
#: such a board carries (the ECP5-85F has 208 x 18 kbit, 468 KiB with parity bits); a larger
#: ``hbm_bytes`` wants an external memory controller on the same AXI4 port.
MAX_MEMORY_BYTES = 4 << 20
#: The host bridge's timeout, as a fraction of a second: a frame may pause this long between
#: two bytes (a USB-UART sends in packets, a millisecond or so apart) before it is dropped.
TIMEOUT_SECONDS = 0.02
#: The activity LED's pulse, a fraction of a second, so single bytes show.
ACTIVITY_SECONDS = 0.05

#: The simulation build of the board top (:func:`simulation_top`): 4 clocks per bit (the
#: receiver's fewest), so a byte takes 40 cycles, and a bridge timeout of 2,000 cycles (50
#: byte times: a simulated host sends a frame without pauses).
SIMULATION_DIVISOR = MIN_DIVISOR
SIMULATION_TIMEOUT_CYCLES = 2_000


def divisor_for(clock_hz, baud):
    """``(divisor, error)``: the clocks per bit nearest ``clock_hz / baud`` and the relative
    error of the rate it gives."""
    divisor = max(1, round(clock_hz / baud))
    return divisor, abs(clock_hz / divisor - baud) / baud


class BoardTop(wiring.Component):
    """The core of ``config`` on a board: :class:`~opentrn.hdl.core.Core`, a
    :class:`~opentrn.hdl.block_ram_memory.BlockRAMMemory` of ``config.hbm_bytes`` on its
    AXI4 port, and a :class:`~opentrn.hdl.host_bridge.HostBridge` behind an 8N1 UART at
    ``baud`` that reaches the core's host registers and the memory (docs/fpga.md)::

        uart_rx -> UARTReceiver --bytes--> HostBridge --bytes--> UARTTransmitter -> uart_tx
                                           |        |
                                AXI4-Lite  |        |  word port (host first)
                                           v        v
                                  Core.host      BlockRAMMemory.host
                                  Core.axi  ---AXI4---> BlockRAMMemory.axi
                                  Core.irq  ----------> HostBridge.irq, irq

    An external memory slots in where the block RAM is: anything that answers the core's
    AXI4 port (``Core.axi``: ``config.hbm_addr_bits`` address bits, ``8 *
    config.dma_bus_bytes`` data bits, INCR bursts of the bus width, 2 ID bits) replaces
    :class:`BlockRAMMemory` on it, for instance LiteDRAM's AXI port on the ECPIX-5's DDR3
    (behind an AXI width or clock-domain converter if its port differs). The host bridge
    then needs a way to that memory too: an AXI4 interconnect with the bridge as a second
    manager, or the bridge's word port turned into AXI4 single-beat bursts. The core's
    counters then depend on the controller's latency, which the cycle model takes as a
    fixed ``latency`` (a lower bound when the latency varies).

    Refused, with ``ValueError`` naming the field: a configuration the core cannot be built
    for; a ``clock_hz`` and ``baud`` whose divisor is below the receiver's
    :data:`~opentrn.hdl.uart_receiver.MIN_DIVISOR` or off the asked rate by more than
    :data:`MAX_BAUD_ERROR`; an ``hbm_bytes`` above :data:`MAX_MEMORY_BYTES`.

    Members
    -------
    uart_rx : ``In(1)``
        The UART's receive line (from the host), idle high; asynchronous, synchronised
        inside.
    uart_tx : ``Out(1)``
        The UART's transmit line (to the host), a flip-flop, idle high.
    irq : ``Out(1)``
        The core's interrupt (level), for a LED.
    activity : ``Out(1)``
        High for :data:`ACTIVITY_SECONDS` after each byte received or sent (a LED).
    error : ``Out(1)``
        The bridge's last reply was an error (a LED).
    """

    def __init__(self, *, config, baud=DEFAULT_BAUD, timeout_cycles=None,
                 max_words=DEFAULT_MAX_WORDS):
        from . import check as check_top
        with refusing(self):
            check_top("core", config)
            if not isinstance(baud, (int, float)) or isinstance(baud, bool) or not baud > 0:
                raise ValueError(f"baud={baud!r}: must be a positive number")
            divisor, error = divisor_for(config.clock_hz, baud)
            if divisor < MIN_DIVISOR:
                raise ValueError(
                    f"baud={baud:,} with clock_hz={config.clock_hz:,}: {divisor} clocks per "
                    f"bit, fewer than the {MIN_DIVISOR} the UART receiver needs; the fastest "
                    f"rate is {config.clock_hz // MIN_DIVISOR:,} baud")
            if error > MAX_BAUD_ERROR:
                raise ValueError(
                    f"baud={baud:,} with clock_hz={config.clock_hz:,}: {divisor} clocks per "
                    f"bit give {config.clock_hz / divisor:,.0f} baud, {100 * error:.1f}% off "
                    f"(at most {100 * MAX_BAUD_ERROR:g}%); choose a rate closer to "
                    "clock_hz divided by a whole number")
            if config.hbm_bytes > MAX_MEMORY_BYTES:
                raise ValueError(
                    f"hbm_bytes={config.hbm_bytes:,}: the board top holds its HBM in on-chip "
                    f"block RAM, at most {MAX_MEMORY_BYTES:,} bytes; a larger memory needs an "
                    "external controller on the core's AXI4 port (docs/fpga.md)")
            if timeout_cycles is None:
                timeout_cycles = max(1, round(config.clock_hz * TIMEOUT_SECONDS))
            check_bridge(word_bytes=config.dma_bus_bytes,
                         memory_words=config.hbm_bytes // config.dma_bus_bytes,
                         timeout_cycles=timeout_cycles, clock_hz=config.clock_hz,
                         max_words=max_words, reg_addr_width=HOST_ADDR_BITS)
        self._config, self._baud = config, baud
        self._timeout_cycles, self._max_words = timeout_cycles, max_words
        self.divisor = divisor
        super().__init__({
            "uart_rx": In(1, init=1),
            "uart_tx": Out(1),
            "irq": Out(1),
            "activity": Out(1),
            "error": Out(1),
        })

    @property
    def baud(self):
        """The UART's actual rate: ``clock_hz / divisor``."""
        return self._config.clock_hz / self.divisor

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        m.submodules.core = core = Core(config=cfg)
        axi = core.signature.members["axi"].signature
        m.submodules.memory = memory = BlockRAMMemory(
            size_bytes=cfg.hbm_bytes, addr_width=axi.addr_width, data_width=axi.data_width,
            id_width=AXI_ID_BITS)
        m.submodules.bridge = bridge = HostBridge(
            word_bytes=cfg.dma_bus_bytes, memory_words=memory.words,
            timeout_cycles=self._timeout_cycles, clock_hz=cfg.clock_hz,
            max_words=self._max_words, reg_addr_width=HOST_ADDR_BITS)
        m.submodules.receiver = receiver = UARTReceiver(divisor=self.divisor)
        m.submodules.transmitter = transmitter = UARTTransmitter(divisor=self.divisor)

        wiring.connect(m, core.axi, memory.axi)
        wiring.connect(m, bridge.host, core.host)
        wiring.connect(m, bridge.memory, memory.host)
        wiring.connect(m, receiver.output, bridge.rx)
        wiring.connect(m, bridge.tx, transmitter.input)
        m.d.comb += [
            receiver.rx.eq(self.uart_rx),
            self.uart_tx.eq(transmitter.tx),
            bridge.rx_framing_error.eq(receiver.framing_error),
            bridge.rx_overrun.eq(receiver.overrun),
            bridge.irq.eq(core.irq),
            self.irq.eq(core.irq),
            self.error.eq(bridge.error),
        ]

        # A byte each way restarts the activity LED's pulse.
        pulse = max(1, round(self._config.clock_hz * ACTIVITY_SECONDS))
        left = Signal(range(pulse + 1))
        moved = (receiver.output.valid & receiver.output.ready) | \
            (transmitter.input.valid & transmitter.input.ready)
        with m.If(moved):
            m.d.sync += left.eq(pulse)
        with m.Elif(left != 0):
            m.d.sync += left.eq(left - 1)
        m.d.comb += self.activity.eq(left != 0)
        return m


def simulation_top(config):
    """The board top as the simulations build it (``board_top`` of
    :mod:`opentrn.sim.runner`): :data:`SIMULATION_DIVISOR` clocks per bit and a bridge
    timeout of :data:`SIMULATION_TIMEOUT_CYCLES`, so that a kernel's image crosses the UART
    in tens of thousands of cycles rather than millions."""
    return BoardTop(config=config, baud=config.clock_hz / SIMULATION_DIVISOR,
                    timeout_cycles=SIMULATION_TIMEOUT_CYCLES)
