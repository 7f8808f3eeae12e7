"""The core: three engines with their instruction sequencers and semaphores, the memories,
the host registers; an AXI4 manager to HBM, an AXI4-Lite subordinate for the host and an
interrupt, ready to drop into an FPGA design."""

from amaranth import Module, Mux, Signal, Value
from amaranth.hdl import ResetInserter
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opentrn.config import ConfigError
from opentrn.isa import Engine, Fault

from . import host_registers
from .activation_unit import ActivationUnit
from .axi4 import READ_MEMBERS, AXI4Signature
from .axi4_lite import AXI4LiteSignature
from .axi4_read_arbiter import AXI4ReadArbiter
from .dma_unit import DmaUnit
from .host_registers import HostRegisters
from .memory_system import MemorySystem
from .semaphores import SemaphoreFile
from .sequencer import POINTER_BITS, Sequencer
from .tensor_unit import TensorUnit

__all__ = ["Core", "COUNTERS", "HOST_ADDR_BITS", "AXI_ID_BITS"]

#: The performance counters, in register order (docs/registers.md).
COUNTERS = tuple(host_registers.COUNTERS)
COUNTER_BITS = 64
#: The host port's byte address width.
HOST_ADDR_BITS = 12
#: AXI IDs: 0 the DMA engine's reads (and all writes), 1 + engine the instruction fetches.
AXI_ID_BITS = 2
#: Cycles the deadlock condition must hold. One suffices (an instruction's entry stays in
#: its retire queue, so ``pending``, in the cycle its semaphore increment is made); the
#: second is a margin that costs one cycle of a faulting run.
_DEADLOCK_CYCLES = 2


def check_config(config):
    """Raise :class:`ConfigError` for a configuration the core cannot be built for."""
    if config.pe_cols > config.sbuf_partitions:
        raise ConfigError(f"pe_cols={config.pe_cols}: the core needs pe_cols <= "
                          f"sbuf_partitions={config.sbuf_partitions} (the activation engine "
                          "writes one SBUF partition per PSUM partition)")


class Core(wiring.Component):
    """An opentrn core (docs/architecture.md, "Core"; docs/isa.md; docs/registers.md).

    A run: the host writes the three program pointers and ``CONTROL.start``; each engine's
    :class:`~opentrn.hdl.sequencer.Sequencer` fetches and issues its stream to its unit
    (:class:`~opentrn.hdl.dma_unit.DmaUnit` feeding the DMA engine,
    :class:`~opentrn.hdl.tensor_unit.TensorUnit`,
    :class:`~opentrn.hdl.activation_unit.ActivationUnit`), the semaphores ordering them. The
    run ends *done* when every engine has completed its ``END``, or with the first *fault*
    (a sequencer's, a DMA error, or a deadlock), which halts every sequencer from the next
    cycle; either raises the interrupt if enabled. ``CONTROL.soft_reset`` resets everything
    but the host registers' pointers and interrupt enables (and the memories' contents).

    Members
    -------
    axi : ``Out(AXI4Signature(addr_width=hbm_addr_bits, data_width=8 * dma_bus_bytes,
    id_width=AXI_ID_BITS))``
        HBM: instruction fetches and DMA traffic.
    host : ``In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS))``
        The host registers.
    irq : ``Out(1)``
        The interrupt (level).
    """

    def __init__(self, *, config):
        check_config(config)
        self._config = config
        super().__init__({
            "axi": Out(AXI4Signature(addr_width=config.hbm_addr_bits,
                                     data_width=8 * config.dma_bus_bytes,
                                     id_width=AXI_ID_BITS)),
            "host": In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS)),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        cfg = self._config
        m = Module()

        m.submodules.registers = registers = HostRegisters(config=cfg)
        wiring.connect(m, wiring.flipped(self.host), registers.bus)
        m.d.comb += self.irq.eq(registers.irq)
        soft_reset = registers.soft_reset

        def reset_on_soft(name, block):
            m.submodules[name] = ResetInserter(soft_reset)(block)
            return block

        memory = reset_on_soft("memory", MemorySystem(config=cfg))
        units = {
            Engine.DMA: reset_on_soft("dma_unit", DmaUnit(config=cfg)),
            Engine.TENSOR: TensorUnit(config=cfg),
            Engine.ACTIVATION: reset_on_soft("activation_unit", ActivationUnit(config=cfg)),
        }
        sequencers = {engine: reset_on_soft(f"{engine.name.lower()}_sequencer",
                                            Sequencer(config=cfg, engine=engine))
                      for engine in Engine}
        start = Signal()
        # The tensor unit's program state (the tile loaded, a load pending) and the weight
        # banks belong to one run: they restart with it.
        m.submodules.tensor_unit = ResetInserter(soft_reset | start)(units[Engine.TENSOR])
        semaphores = SemaphoreFile(config=cfg, ports=len(Engine))
        m.submodules.semaphores = ResetInserter(soft_reset | start)(semaphores)
        arbiter = reset_on_soft("read_arbiter", AXI4ReadArbiter(
            count=1 + len(Engine), addr_width=cfg.hbm_addr_bits,
            data_width=8 * cfg.dma_bus_bytes))

        # -- HBM: DMA reads and the fetches share the read channels; writes are the DMA's --
        dma_axi = memory.axi
        for name in READ_MEMBERS:
            if name in ("arid", "rid"):
                continue        # the arbiter assigns the IDs
            inner, outer = getattr(dma_axi, name), getattr(arbiter.managers[0], name)
            if dma_axi.signature.members[name].flow == Out:     # the DMA drives it
                m.d.comb += outer.eq(inner)
            else:
                m.d.comb += inner.eq(outer)
        for name, member in dma_axi.signature.members.items():
            if name in READ_MEMBERS:
                continue
            if member.flow == Out:
                m.d.comb += getattr(self.axi, name).eq(getattr(dma_axi, name))
            else:
                m.d.comb += getattr(dma_axi, name).eq(getattr(self.axi, name))
        for name in READ_MEMBERS:
            port, outer = getattr(arbiter.port, name), getattr(self.axi, name)
            if arbiter.port.signature.members[name].flow == Out:
                m.d.comb += outer.eq(port)
            else:
                m.d.comb += port.eq(outer)

        # -- engines ------------------------------------------------------------------------
        wiring.connect(m, units[Engine.DMA].descriptor, memory.descriptor)
        m.d.comb += [units[Engine.DMA].dma_done.eq(memory.done),
                     units[Engine.DMA].pc.eq(sequencers[Engine.DMA].pc)]
        tensor, activation = units[Engine.TENSOR], units[Engine.ACTIVATION]
        wiring.connect(m, tensor.sbuf_read, memory.sbuf_te_read)
        wiring.connect(m, tensor.psum_write, memory.psum_te_write)
        wiring.connect(m, activation.sbuf_read, memory.sbuf_act_read)
        wiring.connect(m, activation.sbuf_write, memory.sbuf_act_write)
        wiring.connect(m, activation.psum_read, memory.psum_act_read)

        fault_latched = Signal()
        for index, engine in enumerate(Engine):
            sequencer, unit = sequencers[engine], units[engine]
            for other in Engine:
                m.d.comb += sequencer.signals[other].eq(sequencers[other].signal)
            wiring.connect(m, sequencer.fetch, arbiter.managers[1 + index])
            wiring.connect(m, sequencer.instruction, unit.instruction)
            m.d.comb += [
                unit.check.eq(sequencer.check),
                unit.check_valid.eq(sequencer.check_valid),
                sequencer.fault.eq(unit.fault),
                sequencer.retire.eq(unit.retire),
                sequencer.start.eq(start),
                sequencer.program.eq(registers.program[index]),
                sequencer.semaphores.eq(semaphores.values),
                semaphores.signal[index].eq(sequencer.signal),
            ]

        # -- run control ----------------------------------------------------------------------
        running = Signal()
        idle = Signal()
        m.d.comb += idle.eq(
            (sum(~sequencers[e].quiet | sequencers[e].pending for e in Engine) == 0)
            & ~tensor.active & ~activation.active & ~units[Engine.DMA].active & ~memory.busy)
        # STATUS.idle as of the cycle before: a register, so that the engines' state (their
        # semaphore waits, queues and FIFOs) is on neither the host bus's read path nor the
        # start's. A start pulse follows a write the registers took while STATUS showed idle
        # and not busy; nothing is started while the core does not run, so the engines are
        # still idle at the pulse: the registered idle tells the same as the engines'.
        idle_shown = Signal()
        m.d.sync += idle_shown.eq(idle)
        m.d.comb += start.eq(registers.start & ~running & idle_shown)

        # Faults, in priority order when several arise in one cycle: the sequencers by
        # engine number, then a DMA error, then a deadlock.
        fault = Signal()
        code = Signal(3)
        engine_of = Signal(2)
        pc = Signal(POINTER_BITS)
        dma_code = Signal(4)
        waiting_or_done = sum(~(sequencers[e].waiting | sequencers[e].finished)
                              for e in Engine) == 0
        someone_waits = sum(sequencers[e].waiting for e in Engine) != 0
        nothing_pending = sum(sequencers[e].pending for e in Engine) == 0
        deadlocked = Signal(range(_DEADLOCK_CYCLES + 1))
        with m.If(running & waiting_or_done & someone_waits & nothing_pending):
            with m.If(deadlocked != _DEADLOCK_CYCLES):
                m.d.sync += deadlocked.eq(deadlocked + 1)
        with m.Else():
            m.d.sync += deadlocked.eq(0)

        with m.If(running):
            conditions = []
            for engine in Engine:
                conditions.append((sequencers[engine].error, sequencers[engine].error_code,
                                   int(engine), sequencers[engine].error_pc, 0))
            conditions.append((memory.done & memory.error, Fault.DMA_ERROR, int(Engine.DMA),
                               units[Engine.DMA].retire_pc, memory.error_code))
            first = True
            for condition, fault_code, engine_number, fault_pc, fault_dma in conditions:
                with (m.If if first else m.Elif)(condition):
                    m.d.comb += [fault.eq(1), code.eq(fault_code), engine_of.eq(engine_number),
                                 pc.eq(fault_pc), dma_code.eq(fault_dma)]
                first = False
            with m.Elif(deadlocked == _DEADLOCK_CYCLES):
                m.d.comb += [fault.eq(1), code.eq(Fault.DEADLOCK)]
                for engine in reversed(Engine):
                    with m.If(sequencers[engine].waiting):
                        m.d.comb += [engine_of.eq(int(engine)), pc.eq(sequencers[engine].pc)]

        done = Signal()
        m.d.comb += done.eq(running & ~fault &
                            (sum(~sequencers[e].finished for e in Engine) == 0))
        error_code = Signal(3)
        error_engine = Signal(2)
        error_pc = Signal(POINTER_BITS)
        error_dma = Signal(4)
        with m.If(start):
            m.d.sync += [running.eq(1), fault_latched.eq(0), error_code.eq(0),
                         error_engine.eq(0), error_pc.eq(0), error_dma.eq(0)]
        with m.If(fault):
            m.d.sync += [running.eq(0), fault_latched.eq(1), error_code.eq(code),
                         error_engine.eq(engine_of), error_pc.eq(pc), error_dma.eq(dma_code)]
        with m.If(done):
            m.d.sync += running.eq(0)
        # The halt is the latched fault, a flip-flop: the fault's own logic and its nets from
        # every sequencer stay off the sequencers' issue paths across the core (docs/fpga.md).
        # An instruction another engine hands over in the fault's cycle still starts.
        for engine in Engine:
            m.d.comb += sequencers[engine].halt.eq(fault_latched)
        # After a fault the DMA's error is cleared so that the descriptors already queued
        # finish (docs/isa.md, "Errors") and the core can go idle.
        m.d.comb += memory.clear.eq(start | fault_latched)

        # -- performance counters -------------------------------------------------------------
        counters = Signal(data.ArrayLayout(COUNTER_BITS, len(COUNTERS)))
        increments = {
            "cycles": 1,
            "dma_busy": memory.busy,
            "tensor_busy": tensor.busy,
            "activation_busy": activation.busy,
            "dma_wait": sequencers[Engine.DMA].waiting,
            "tensor_wait": sequencers[Engine.TENSOR].waiting,
            "activation_wait": sequencers[Engine.ACTIVATION].waiting,
            "dma_bytes": Mux(units[Engine.DMA].retire & ~memory.error,
                             units[Engine.DMA].retire_bytes, 0),
            "macs": tensor.macs,
        }
        # A cycle's increments are registered before they are added, so that no engine's
        # handshake (a busy flag behind a memory's grant) reaches the 64-bit adders: each
        # counter holds its final value from the second cycle after the done or error pulse
        # (the host reads it over the bus later than that).
        counted = {}
        for name in COUNTERS:
            increment = Value.cast(increments[name])
            counted[name] = Signal(increment.shape(), name=f"counted_{name}")
            m.d.sync += counted[name].eq(Mux(running, increment, 0))
        with m.If(start):
            m.d.sync += counters.eq(0)
        with m.Else():
            for index, name in enumerate(COUNTERS):
                m.d.sync += counters[index].eq(counters[index] + counted[name])

        m.d.comb += [
            registers.busy.eq(running),
            registers.idle.eq(idle_shown),
            registers.done.eq(done),
            registers.error.eq(fault),
            registers.counters.eq(counters),
        ]
        # From the error pulse on, the registers see the fault's fields.
        with m.If(fault):
            m.d.comb += [registers.error_code.eq(code), registers.error_engine.eq(engine_of),
                         registers.error_pc.eq(pc), registers.dma_error_code.eq(dma_code)]
        with m.Else():
            m.d.comb += [registers.error_code.eq(error_code),
                         registers.error_engine.eq(error_engine),
                         registers.error_pc.eq(error_pc),
                         registers.dma_error_code.eq(error_dma)]
        # Soft reset: the run state and counters too.
        with m.If(soft_reset):
            m.d.sync += [running.eq(0), fault_latched.eq(0), counters.eq(0), error_code.eq(0),
                         error_engine.eq(0), error_pc.eq(0), error_dma.eq(0),
                         deadlocked.eq(0), *(value.eq(0) for value in counted.values())]
        return m
