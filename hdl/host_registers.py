"""The host interface of the core: an AXI4-Lite subordinate holding the control and status
registers, the program pointers, the interrupt and the performance counters.

The register map is defined once, in :data:`REGISTERS`: the hardware decodes it, the
testbenches address it, and docs/registers.md holds its :func:`markdown` tables.
"""

from typing import NamedTuple

from amaranth import Const, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opentrn.isa import Engine, Fault

from .axi4_lite import RESP_OKAY, RESP_SLVERR, AXI4LiteSignature
from .dma import ErrorCode

__all__ = ["HostRegisters", "Register", "Field", "REGISTERS", "COUNTERS", "ID_VALUE",
           "VERSION", "ADDR_WIDTH", "DATA_WIDTH", "markdown", "unpack"]

ADDR_WIDTH = 12          # a 4 KiB register window
DATA_WIDTH = 32
WORD_BYTES = DATA_WIDTH // 8
ID_VALUE = int.from_bytes(b"OTRN", "big")     # 0x4F54524E
VERSION = 1

ACCESS = {
    "RO": "read-only; a write answers SLVERR and changes nothing",
    "WO": "write-only; reads return 0",
    "RW": "read-write; each byte is written only when its `wstrb` bit is set",
    "RW1C": "read, write 1 to clear (a bit is cleared when written 1 with its `wstrb` bit set)",
}


class Field(NamedTuple):
    name: str
    lsb: int
    width: int
    description: str

    @property
    def msb(self):
        return self.lsb + self.width - 1


class Register(NamedTuple):
    offset: int
    access: str          # a key of ACCESS
    description: str
    reset: str           # the value after reset, as documented
    fields: tuple[Field, ...]


#: The performance counters, in the order of ``HostRegisters.counters`` and of the map.
COUNTERS = {
    "cycles": "cycles of the run, from start to the done or error pulse",
    "dma_busy": "cycles in which the DMA engine executes a descriptor",
    "tensor_busy": "cycles in which a moving vector enters the tensor engine's array",
    "activation_busy": "cycles in which a vector enters the activation engine",
    "dma_wait": "cycles the DMA sequencer holds a checked instruction whose semaphore wait "
                "is not met",
    "tensor_wait": "the same for the tensor sequencer",
    "activation_wait": "the same for the activation sequencer",
    "dma_bytes": "bytes of the descriptors that finished without error",
    "macs": "useful multiply-accumulates: rows x cols of the stationary tile per moving "
            "vector, times the MACs per PE per cycle of its format",
}
COUNTERS_BASE = 0x080

_FAULT_BITS = max(Fault).bit_length()
_ENGINE_BITS = max(Engine).bit_length()
_DMA_ERROR_BITS = max(ErrorCode).bit_length()


def _word(name, description):
    return (Field(name, 0, DATA_WIDTH, description),)


def _registers():
    regs = {
        "ID": Register(0x000, "RO", "identifies an opentrn core", f"0x{ID_VALUE:08X}",
                       _word("id", 'ASCII "OTRN"')),
        "VERSION": Register(0x004, "RO", "version of this register map", str(VERSION),
                            _word("version", "register map version")),
        "GEOMETRY": Register(0x008, "RO", "systolic array size", "from Config", (
            Field("pe_rows", 0, 16, "`Config.pe_rows`: rows (K) of the systolic array"),
            Field("pe_cols", 16, 16, "`Config.pe_cols`: columns (M) of the systolic array"))),
        "CAPS": Register(0x00C, "RO", "build capabilities", "from Config", (
            Field("semaphores", 0, 16, "`Config.semaphores`: hardware semaphores"),
            Field("dma_bus_bytes", 16, 16, "`Config.dma_bus_bytes`: AXI4 data bytes"))),
        "CONTROL": Register(0x010, "WO", "run control (bits pulse; reads as 0)", "0", (
            Field("start", 0, 1, "1: start a run (ignored while `STATUS.busy` or not "
                  "`STATUS.idle`; also clears "
                  "`STATUS.done` and `STATUS.error`)"),
            Field("soft_reset", 1, 1, "1: reset the core's engines, counters and semaphores; "
                  "clears `STATUS.done`, `STATUS.error` and `IRQ_STATUS` (wins over `start` "
                  "written in the same write)"))),
        "STATUS": Register(0x014, "RO", "run status", "0 in done/error; others follow the core",
                           (
            Field("busy", 0, 1, "the core runs: started, not yet done or faulted"),
            Field("idle", 1, 1, "no instruction in flight in any engine (as of the previous "
                  "cycle)"),
            Field("done", 2, 1, "sticky: the run finished without error; cleared by "
                  "`start` and `soft_reset`"),
            Field("error", 3, 1, "sticky: the run faulted; cleared by `start` and "
                  "`soft_reset`"),
            Field("error_code", 4, _FAULT_BITS, "`isa.Fault` of the fault (docs/isa.md, "
                  "\"Errors\")"),
            Field("error_engine", 8, _ENGINE_BITS, "`isa.Engine` of the fault: 0 DMA, "
                  "1 tensor, 2 activation"),
            Field("dma_error_code", 12, _DMA_ERROR_BITS, "the DMA `ErrorCode` of a "
                  "`DMA_ERROR` fault (docs/architecture.md)"))),
        "ERROR_PC_LO": Register(0x018, "RO", "byte address of the faulting instruction, "
                                "bits 31:0", "follows the core",
                                _word("error_pc_lo", "`error_pc` bits 31:0")),
        "ERROR_PC_HI": Register(0x01C, "RO", "byte address of the faulting instruction, "
                                "bits 63:32", "follows the core",
                                _word("error_pc_hi", "`error_pc` bits 63:32")),
        "IRQ_ENABLE": Register(0x020, "RW", "interrupt enables (not reset by soft_reset)",
                               "0", (
            Field("done", 0, 1, "1: `IRQ_STATUS.done` raises the interrupt"),
            Field("error", 1, 1, "1: `IRQ_STATUS.error` raises the interrupt"))),
        "IRQ_STATUS": Register(0x024, "RW1C", "interrupt causes (cleared by soft_reset)", "0", (
            Field("done", 0, 1, "set when a run finishes without error"),
            Field("error", 1, 1, "set when a run faults"))),
    }
    for index, engine in enumerate(Engine):
        base = 0x030 + 8 * index
        for half, (offset, lsb) in enumerate(((base, 0), (base + 4, 32))):
            suffix = ("LO", "HI")[half]
            regs[f"{engine.name}_PROGRAM_{suffix}"] = Register(
                offset, "RW", f"{engine.name.lower()} engine program pointer, bits "
                f"{lsb + 31}:{lsb} (not reset by soft_reset)", "0",
                _word("pointer", f"byte address of the first instruction, bits "
                      f"{lsb + 31}:{lsb} (a multiple of 32)"))
    for index, (name, description) in enumerate(COUNTERS.items()):
        base = COUNTERS_BASE + 8 * index
        regs[f"{name.upper()}_LO"] = Register(
            base, "RO", f"counter `{name}` bits 31:0: {description}; reading it latches "
            "bits 63:32 for the HI register", "0",
            _word("count", f"`{name}` bits 31:0"))
        regs[f"{name.upper()}_HI"] = Register(
            base + 4, "RO", f"counter `{name}` bits 63:32, as latched by the last read of "
            f"`{name.upper()}_LO`", "0", _word("count", f"`{name}` bits 63:32 (latched)"))
    return regs


#: The register map: name -> :class:`Register` ``(offset, access, description, reset,
#: fields)``, in address order.
REGISTERS = dict(sorted(_registers().items(), key=lambda item: item[1].offset))


def _check_map():
    offsets = [reg.offset for reg in REGISTERS.values()]
    assert len(set(offsets)) == len(offsets), "two registers share an offset"
    for name, reg in REGISTERS.items():
        assert reg.offset % WORD_BYTES == 0 and reg.offset < 2**ADDR_WIDTH, name
        assert reg.access in ACCESS, name
        used = 0
        for f in reg.fields:
            mask = ((1 << f.width) - 1) << f.lsb
            assert used & mask == 0 and f.msb < DATA_WIDTH, (name, f.name)
            used |= mask


_check_map()


def unpack(name, word):
    """The fields of register ``name`` in the 32-bit ``word``, as a dict."""
    return {f.name: (word >> f.lsb) & ((1 << f.width) - 1) for f in REGISTERS[name].fields}


def markdown():
    """The register tables of docs/registers.md."""
    lines = ["| offset | register | access | reset | description |", "|---|---|---|---|---|"]
    for name, reg in REGISTERS.items():
        lines.append(f"| 0x{reg.offset:03X} | `{name}` | {reg.access} | {reg.reset} | "
                     f"{reg.description} |")
    lines.append("")
    for name, reg in REGISTERS.items():
        # Registers of one 32-bit field are described by the map alone.
        if len(reg.fields) == 1 and reg.fields[0].width == DATA_WIDTH:
            continue
        lines += [f"#### `{name}` (0x{reg.offset:03X}, {reg.access})", "",
                  "| bits | field | description |", "|---|---|---|"]
        for f in reg.fields:
            bits = f"{f.msb}:{f.lsb}" if f.width > 1 else f"{f.lsb}"
            lines.append(f"| {bits} | `{f.name}` | {f.description} |")
        lines.append("")
    return "\n".join(lines)


class HostRegisters(wiring.Component):
    """The host's AXI4-Lite register window (docs/registers.md), 32-bit data and a 12-bit
    byte address.

    One write and one read are handled at a time; AW and W are taken in either order and a
    write takes effect once both have arrived. The low two address bits are ignored (the
    byte lanes come from ``wstrb``). A read or write of an address not in the map, or a
    write to a RO register, answers SLVERR and changes nothing. ``bvalid`` / ``rvalid``
    never depend on the ready signals, and the response is held until it is taken.

    ``start`` and ``soft_reset`` pulse in the cycle after the write takes effect (with
    ``bvalid`` rising); the sticky ``STATUS.done`` / ``error`` bits are cleared at that
    edge, so a ``done`` or ``error`` pulse that coincides with the clearing write belongs to
    the finished run and is dropped (``IRQ_STATUS`` still records it, unless the write was a
    soft reset). A pulse that coincides with a write of 1 to its ``IRQ_STATUS`` bit wins.

    Members
    -------
    bus : ``In(AXI4LiteSignature(addr_width=12))``
        The host's AXI4-Lite port (this block is the subordinate).
    start : ``Out(1)``
        One-cycle pulse: the host wrote ``CONTROL.start = 1`` while not ``busy``.
    soft_reset : ``Out(1)``
        One-cycle pulse: the host wrote ``CONTROL.soft_reset = 1``.
    program : ``Out(data.ArrayLayout(64, 3))``
        Program pointers, indexed by ``isa.Engine`` (DMA, TENSOR, ACTIVATION).
    irq : ``Out(1)``
        Level: ``(IRQ_STATUS & IRQ_ENABLE) != 0``.
    busy : ``In(1)``
        The core runs (started, not yet done or faulted).
    idle : ``In(1)``
        No instruction in flight in any engine.
    done : ``In(1)``
        Pulses one cycle when the run finishes without error.
    error : ``In(1)``
        Pulses one cycle when the run faults.
    error_code : ``In(3)``
        ``isa.Fault`` of the fault (held by the core from the ``error`` pulse on).
    error_engine : ``In(2)``
        ``isa.Engine`` of the fault.
    error_pc : ``In(64)``
        Byte address of the faulting instruction.
    dma_error_code : ``In(4)``
        The DMA ``ErrorCode`` of a ``DMA_ERROR`` fault.
    counters : ``In(data.ArrayLayout(64, 9))``
        The performance counters, in the order of :data:`COUNTERS`.
    """

    def __init__(self, *, config):
        for name in ("pe_rows", "pe_cols", "semaphores", "dma_bus_bytes"):
            if getattr(config, name) >= 2**16:
                raise ValueError(f"{name}={getattr(config, name)} does not fit its 16-bit "
                                 "register field")
        self._config = config
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width=ADDR_WIDTH, data_width=DATA_WIDTH)),
            "start": Out(1),
            "soft_reset": Out(1),
            "program": Out(data.ArrayLayout(64, len(Engine))),
            "irq": Out(1),
            "busy": In(1),
            "idle": In(1),
            "done": In(1),
            "error": In(1),
            "error_code": In(_FAULT_BITS),
            "error_engine": In(_ENGINE_BITS),
            "error_pc": In(64),
            "dma_error_code": In(_DMA_ERROR_BITS),
            "counters": In(data.ArrayLayout(64, len(COUNTERS))),
        })

    def elaborate(self, platform):
        m = Module()
        bus, cfg = self.bus, self._config

        done_flag = Signal()          # STATUS.done (sticky)
        error_flag = Signal()         # STATUS.error (sticky)
        irq_enable = Signal(2)
        irq_status = Signal(2)
        # HI halves of the counters, latched by reads of the LO halves.
        shadows = Signal(data.ArrayLayout(32, len(COUNTERS)))

        # The value of every field: the registers of RW / RW1C fields are the storage the
        # writes update.
        sources = {
            "ID": {"id": ID_VALUE},
            "VERSION": {"version": VERSION},
            "GEOMETRY": {"pe_rows": cfg.pe_rows, "pe_cols": cfg.pe_cols},
            "CAPS": {"semaphores": cfg.semaphores, "dma_bus_bytes": cfg.dma_bus_bytes},
            "CONTROL": {},
            "STATUS": {"busy": self.busy, "idle": self.idle, "done": done_flag,
                       "error": error_flag, "error_code": self.error_code,
                       "error_engine": self.error_engine,
                       "dma_error_code": self.dma_error_code},
            "ERROR_PC_LO": {"error_pc_lo": self.error_pc[:32]},
            "ERROR_PC_HI": {"error_pc_hi": self.error_pc[32:]},
            "IRQ_ENABLE": {"done": irq_enable[0], "error": irq_enable[1]},
            "IRQ_STATUS": {"done": irq_status[0], "error": irq_status[1]},
        }
        for engine in Engine:
            sources[f"{engine.name}_PROGRAM_LO"] = {"pointer": self.program[engine][:32]}
            sources[f"{engine.name}_PROGRAM_HI"] = {"pointer": self.program[engine][32:]}
        for index, name in enumerate(COUNTERS):
            sources[f"{name.upper()}_LO"] = {"count": self.counters[index][:32]}
            sources[f"{name.upper()}_HI"] = {"count": shadows[index]}
        assert set(sources) == set(REGISTERS)
        latches = {f"{name.upper()}_LO": index for index, name in enumerate(COUNTERS)}

        words = {}
        for name, reg in REGISTERS.items():
            word = Signal(DATA_WIDTH, name=f"read_{name.lower()}")
            if reg.access != "WO":
                assert set(sources[name]) == {f.name for f in reg.fields}, name
                for f in reg.fields:
                    value = sources[name][f.name]
                    if isinstance(value, int):
                        value = Const(value, f.width)
                    m.d.comb += word[f.lsb:f.lsb + f.width].eq(value)
            words[name] = word

        # -- reads: the response is registered in the cycle AR is taken -------------------
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.rvalid.eq(1)
            with m.Switch(bus.araddr[2:]):
                for name, reg in REGISTERS.items():
                    with m.Case(reg.offset // WORD_BYTES):
                        m.d.sync += [bus.rdata.eq(words[name]), bus.rresp.eq(RESP_OKAY)]
                        if name in latches:
                            index = latches[name]
                            m.d.sync += shadows[index].eq(self.counters[index][32:])
                with m.Default():
                    m.d.sync += [bus.rdata.eq(0), bus.rresp.eq(RESP_SLVERR)]

        # -- writes: AW and W are held until both are here --------------------------------
        aw_full, aw_addr = Signal(), Signal(ADDR_WIDTH - 2)
        w_full, w_data, w_strb = Signal(), Signal(DATA_WIDTH), Signal(WORD_BYTES)
        m.d.comb += [bus.awready.eq(~aw_full), bus.wready.eq(~w_full)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr[2:])]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        # A write takes effect when both halves are here and the previous response is gone.
        write = Signal()
        m.d.comb += write.eq(aw_full & w_full & ~bus.bvalid)
        byte_mask = Signal(DATA_WIDTH)    # the bits of the lanes wstrb enables
        for lane in range(WORD_BYTES):
            m.d.comb += byte_mask[8 * lane:8 * lane + 8].eq(w_strb[lane].replicate(8))
        strobed = Signal(DATA_WIDTH)
        m.d.comb += strobed.eq(w_data & byte_mask)

        control = REGISTERS["CONTROL"]
        start_bit = next(f.lsb for f in control.fields if f.name == "start")
        reset_bit = next(f.lsb for f in control.fields if f.name == "soft_reset")
        start_now, soft_reset_now = Signal(), Signal()
        m.d.comb += [
            soft_reset_now.eq(write & (aw_addr == control.offset // WORD_BYTES)
                              & strobed[reset_bit]),
            start_now.eq(write & (aw_addr == control.offset // WORD_BYTES) & strobed[start_bit]
                         & ~self.busy & self.idle & ~soft_reset_now),
        ]
        m.d.sync += [self.start.eq(start_now), self.soft_reset.eq(soft_reset_now)]

        with m.If(write):
            m.d.sync += [bus.bvalid.eq(1), aw_full.eq(0), w_full.eq(0)]
            with m.Switch(aw_addr):
                for name, reg in REGISTERS.items():
                    with m.Case(reg.offset // WORD_BYTES):
                        m.d.sync += bus.bresp.eq(
                            RESP_SLVERR if reg.access == "RO" else RESP_OKAY)
                        # CONTROL acts through start_now / soft_reset_now above.
                        for f in reg.fields:
                            bits = slice(f.lsb, f.msb + 1)
                            if reg.access == "RW":
                                target = sources[name][f.name]
                                m.d.sync += target.eq(strobed[bits] | (target & ~byte_mask[bits]))
                            elif reg.access == "RW1C":
                                target = sources[name][f.name]
                                m.d.sync += target.eq(target & ~strobed[bits])
                with m.Default():
                    m.d.sync += bus.bresp.eq(RESP_SLVERR)

        # Events after the register writes: a pulse wins over a write-1-to-clear; start and
        # soft reset win over the pulses of the run they end.
        irq_causes = sources["IRQ_STATUS"]
        with m.If(self.done):
            m.d.sync += [done_flag.eq(1), irq_causes["done"].eq(1)]
        with m.If(self.error):
            m.d.sync += [error_flag.eq(1), irq_causes["error"].eq(1)]
        with m.If(start_now | soft_reset_now):
            m.d.sync += [done_flag.eq(0), error_flag.eq(0)]
        with m.If(soft_reset_now):
            m.d.sync += irq_status.eq(0)

        m.d.comb += self.irq.eq((irq_status & irq_enable).any())
        return m
