"""The host bridge of a board top: a small framed byte protocol, received and answered over a
UART's byte streams, that reads and writes the core's host registers (as an AXI4-Lite
manager) and the memory (through its host port), and waits for the interrupt
(:class:`HostBridge`; docs/fpga.md, "Host protocol").

The protocol is defined here once (:class:`Command`, :class:`Status`, :data:`FIELD_BYTES`,
:data:`INFO_FIELDS`); the host driver :mod:`opentrn.board` speaks it from these tables.
"""

import enum

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .axi4_lite import RESP_OKAY, AXI4LiteSignature
from .block_ram_memory import MemoryPortSignature
from .params import check_positive, refusing

__all__ = ["HostBridge", "check_parameters", "Command", "Status", "SYNC", "REPLY", "VERSION",
           "FIELD_BYTES", "INFO_FIELDS", "INFO_BYTES", "HEADER_BYTES", "DEFAULT_MAX_WORDS"]

#: The first byte of every command frame, and of every reply.
SYNC = 0xA5
REPLY = 0x5A
#: The protocol's version, the first byte of the INFO reply.
VERSION = 1
#: Bytes of a reply before its payload: REPLY, the command echoed, the status.
HEADER_BYTES = 3
#: Words a MEM_READ or MEM_WRITE moves at most (a larger count is BAD_LENGTH).
DEFAULT_MAX_WORDS = 256


class Command(enum.IntEnum):
    """The command codes (the byte after :data:`SYNC`)."""
    INFO = 0x01          # -> the INFO_FIELDS
    REG_READ = 0x02      # addr u16 -> data u32
    REG_WRITE = 0x03     # addr u16, data u32
    MEM_READ = 0x04      # word u32, count u16 -> count words
    MEM_WRITE = 0x05     # word u32, count u16, then count words
    MEM_ZERO = 0x06      # word u32, count u32
    WAIT_IRQ = 0x07      # cycles u32 -> irq u8


class Status(enum.IntEnum):
    """The status byte of a reply; a reply other than OK has no payload."""
    OK = 0
    UNKNOWN_COMMAND = 1  # the command byte is none of Command
    BAD_LENGTH = 2       # a word count of 0, or over max_words (MEM_READ, MEM_WRITE)
    OUT_OF_RANGE = 3     # words past the memory, or a register address past 4 KiB
    BUS_ERROR = 4        # the register port answered SLVERR or DECERR
    FRAMING = 5          # a byte's stop bit was low (a wrong baud rate, noise, a break)
    OVERRUN = 6          # a byte came before the one before it was read: the host sent
                         # while the bridge was busy (before the reply)
    TIMEOUT = 7          # the command stopped short: no byte for timeout_cycles
    BAD_SYNC = 8         # a frame did not begin with SYNC (the reply echoes that byte)


#: Bytes of each command's fields, after the command byte (all little-endian).
FIELD_BYTES = {
    Command.INFO: 0, Command.REG_READ: 2, Command.REG_WRITE: 6, Command.MEM_READ: 6,
    Command.MEM_WRITE: 6, Command.MEM_ZERO: 8, Command.WAIT_IRQ: 4,
}
#: The INFO reply's payload: ``(name, bytes)`` in order, little-endian.
INFO_FIELDS = (("version", 1), ("word_bytes", 1), ("max_words", 2), ("memory_words", 4),
               ("timeout_cycles", 4), ("clock_hz", 4))
INFO_BYTES = sum(size for _, size in INFO_FIELDS)


def check_parameters(*, word_bytes, memory_words, timeout_cycles, clock_hz, max_words,
                     reg_addr_width):
    """Raise ``ValueError`` naming a parameter of :class:`HostBridge` that the protocol cannot
    carry."""
    check_positive(word_bytes=word_bytes, memory_words=memory_words,
                   timeout_cycles=timeout_cycles, clock_hz=clock_hz, max_words=max_words,
                   reg_addr_width=reg_addr_width)
    for name, value, bits in (("word_bytes", word_bytes, 8),
                              ("memory_words", memory_words, 32),
                              ("timeout_cycles", timeout_cycles, 32),
                              ("clock_hz", clock_hz, 32), ("max_words", max_words, 16),
                              ("reg_addr_width", reg_addr_width, 16)):
        if value >= 1 << bits:
            raise ValueError(f"{name}={value:,}: must fit {bits} bits (the protocol's field)")


class HostBridge(wiring.Component):
    """A framed byte protocol between a UART and the core: its host registers (AXI4-Lite
    manager ``host``) and the memory (word port ``memory``).

    A command is ``SYNC, command, fields..., payload...``; every command is answered with
    ``REPLY, command, status, payload...`` (the payload only with status OK). Multi-byte
    fields are little-endian; memory addresses and counts are in words of ``word_bytes``.

    ========= ==== ============================ ============== ===========================
    command   code fields                       payload in     reply payload (OK)
    ========= ==== ============================ ============== ===========================
    INFO      0x01 none                         none           :data:`INFO_FIELDS`, 16 bytes
    REG_READ  0x02 addr u16                     none           data u32
    REG_WRITE 0x03 addr u16, data u32           none           none
    MEM_READ  0x04 word u32, count u16          none           count words
    MEM_WRITE 0x05 word u32, count u16          count words    none
    MEM_ZERO  0x06 word u32, count u32          none           none
    WAIT_IRQ  0x07 cycles u32                   none           irq u8: 1 if it rose
    ========= ==== ============================ ============== ===========================

    Register accesses are whole 32-bit words (``wstrb`` all ones) at byte address ``addr``;
    the reply comes once the core's port has answered (``BUS_ERROR`` for SLVERR / DECERR).
    MEM_READ and MEM_WRITE move 1 to ``max_words`` words; MEM_ZERO clears any number (one
    word a cycle, at the memory's speed rather than the UART's). WAIT_IRQ answers as soon as
    ``irq`` is high (payload 1), or after ``cycles`` cycles, or when a byte arrives (payload
    0): a host polls with ``cycles = 0`` and waits in slices, so the bridge never stays
    deaf.

    Errors, and how the bridge never hangs on bad input:

    * ``timeout_cycles`` without a byte in the middle of a command (a truncated frame)
      drops it and answers ``TIMEOUT`` (a MEM_WRITE keeps the words already complete).
    * A first byte other than ``SYNC`` (``BAD_SYNC``, echoing that byte), an unknown command,
      a UART framing error or overrun in a command, and refused MEM_WRITE fields (whose
      payload is on its way) make the bridge discard every byte until the line has been
      quiet for ``timeout_cycles``, then answer: the host's next frame starts clean.
    * Other refused fields (``BAD_LENGTH``, ``OUT_OF_RANGE``) are answered at once, nothing
      done. A framing error or overrun while the bridge executes or answers is reported as
      the next frame's error.

    Members
    -------
    rx : ``In(stream.Signature(8))``
        Bytes from the UART receiver.
    rx_framing_error, rx_overrun : ``In(1)``
        The receiver's error pulses.
    tx : ``Out(stream.Signature(8))``
        Bytes to the UART transmitter (``valid`` and the byte come from registers).
    host : ``Out(AXI4LiteSignature(addr_width=reg_addr_width))``
        The core's host registers.
    memory : ``Out(MemoryPortSignature(addr_width, data_width=8 * word_bytes))``
        The memory's host port (``addr_width = ceil_log2(memory_words)``).
    irq : ``In(1)``
        The core's interrupt.
    error : ``Out(1)``
        The last reply had a status other than OK (for a LED).
    """

    def __init__(self, *, word_bytes, memory_words, timeout_cycles, clock_hz,
                 max_words=DEFAULT_MAX_WORDS, reg_addr_width=12):
        with refusing(self):
            check_parameters(word_bytes=word_bytes, memory_words=memory_words,
                             timeout_cycles=timeout_cycles, clock_hz=clock_hz,
                             max_words=max_words, reg_addr_width=reg_addr_width)
        self._word_bytes, self._memory_words = word_bytes, memory_words
        self._timeout, self._clock_hz = timeout_cycles, clock_hz
        self._max_words, self._reg_addr_width = max_words, reg_addr_width
        super().__init__({
            "rx": In(stream.Signature(8)),
            "rx_framing_error": In(1),
            "rx_overrun": In(1),
            "tx": Out(stream.Signature(8)),
            "host": Out(AXI4LiteSignature(addr_width=reg_addr_width)),
            "memory": Out(MemoryPortSignature(addr_width=max(1, ceil_log2(memory_words)),
                                              data_width=8 * word_bytes)),
            "irq": In(1),
            "error": Out(1),
        })

    def info(self):
        """The INFO reply's payload, as bytes."""
        values = {"version": VERSION, "word_bytes": self._word_bytes,
                  "max_words": self._max_words, "memory_words": self._memory_words,
                  "timeout_cycles": self._timeout, "clock_hz": self._clock_hz}
        return b"".join(values[name].to_bytes(size, "little") for name, size in INFO_FIELDS)

    def elaborate(self, platform):
        m = Module()
        rx, tx, bus, port = self.rx, self.tx, self.host, self.memory
        word_bytes, word_width = self._word_bytes, 8 * self._word_bytes
        payload_bytes = max(word_bytes, INFO_BYTES, 4)

        command = Signal(8)
        fields = Signal(8 * max(FIELD_BYTES.values()))
        field_index = Signal(range(max(FIELD_BYTES.values()) + 1))
        field_count = Signal.like(field_index)      # the command's field bytes
        known = Signal()
        with m.Switch(command):
            for code, size in FIELD_BYTES.items():
                with m.Case(code):
                    m.d.comb += [field_count.eq(size), known.eq(1)]
        # The fields, as each command reads them.
        reg_addr, reg_data = fields[:16], fields[16:48]
        mem_word, mem_count, zero_count = fields[:32], fields[32:48], fields[32:64]
        wait_cycles = fields[:32]
        # The fields' checks, registered in the cycle after their last byte.
        beyond_memory, bad_count, reg_outside = Signal(), Signal(), Signal()

        timer = Signal(range(self._timeout + 1))
        status = Signal(8)
        word = Signal(32)                 # the next word address of a memory command
        words_left = Signal(32)
        assembled = Signal(word_width)    # MEM_WRITE: the word being received
        byte_index = Signal(range(word_bytes))
        waited = Signal(32)

        # The reply: bytes shift out of ``out`` from bit 0; ``out_left`` of them remain.
        out = Signal(8 * (3 + payload_bytes))
        out_left = Signal(range(3 + payload_bytes + 1))
        m.d.comb += [tx.payload.eq(out[:8]), tx.valid.eq(out_left != 0)]
        with m.If(tx.valid & tx.ready):
            m.d.sync += [out.eq(out >> 8), out_left.eq(out_left - 1)]

        # Line errors: remembered while the bridge is busy, consumed where a frame is read.
        framing_seen, overrun_seen = Signal(), Signal()
        framing, overrun = Signal(), Signal()
        reading = Signal()        # this state reads the line (and consumes its errors)
        m.d.comb += [framing.eq(framing_seen | self.rx_framing_error),
                     overrun.eq(overrun_seen | self.rx_overrun)]
        with m.If(~reading):
            with m.If(self.rx_framing_error):
                m.d.sync += framing_seen.eq(1)
            with m.If(self.rx_overrun):
                m.d.sync += overrun_seen.eq(1)

        def reply(code, payload=None, size=0):
            """Answer with status ``code`` (a Status or a value) and ``size`` payload bytes
            (an int or a value)."""
            byte = Signal(8, name="reply_status")
            m.d.comb += byte.eq(code)
            value = Cat(C(REPLY, 8), command, byte)
            if payload is not None:
                value = Cat(value, payload)
            m.d.sync += [out.eq(value), out_left.eq(3 + size), status.eq(byte),
                         self.error.eq(byte != Status.OK)]
            m.next = "SEND"

        def drain(code):
            m.d.sync += [status.eq(code), timer.eq(self._timeout)]
            m.next = "DRAIN"

        def receive(take, *, timed=True):
            """Read the line: drain on a line error (consuming it), else ``take()`` a byte
            that is there, else (``timed``) count down to a TIMEOUT reply. One chain of
            conditions, to be called where nothing else decides the cycle."""
            m.d.comb += reading.eq(1)
            m.d.sync += [framing_seen.eq(0), overrun_seen.eq(0)]
            with m.If(framing):
                drain(Status.FRAMING)
            with m.Elif(overrun):
                drain(Status.OVERRUN)
            with m.Elif(rx.valid):
                m.d.comb += rx.ready.eq(1)
                take()
            if timed:
                with m.Elif(timer == 0):
                    reply(Status.TIMEOUT)
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)

        # -- the AXI4-Lite manager: valid signals are registers, held until ready -----------
        m.d.comb += [
            bus.awaddr.eq(reg_addr), bus.araddr.eq(reg_addr), bus.wdata.eq(reg_data),
            bus.wstrb.eq(0b1111), bus.awprot.eq(0), bus.arprot.eq(0),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += bus.awvalid.eq(0)
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += bus.wvalid.eq(0)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.arvalid.eq(0)

        # -- the memory port: one request at a time -----------------------------------------
        request = port.request
        m.d.comb += [
            request.payload.addr.eq(word),
            request.payload.write.eq(command != Command.MEM_READ),
            request.payload.data.eq(Mux(command == Command.MEM_ZERO, 0, assembled)),
        ]
        with m.If(request.valid & request.ready):
            m.d.sync += request.valid.eq(0)

        def take_sync():
            with m.If(rx.payload == SYNC):
                m.d.sync += timer.eq(self._timeout)
                m.next = "COMMAND"
            with m.Else():
                m.d.sync += command.eq(rx.payload)
                drain(Status.BAD_SYNC)

        def take_command():
            m.d.sync += [command.eq(rx.payload), fields.eq(0), field_index.eq(0),
                         timer.eq(self._timeout)]
            m.next = "FIELDS"

        def take_field():
            with m.Switch(field_index):
                for index in range(len(fields) // 8):
                    with m.Case(index):
                        m.d.sync += fields[8 * index:8 * index + 8].eq(rx.payload)
            m.d.sync += [field_index.eq(field_index + 1), timer.eq(self._timeout)]

        def take_payload():
            with m.Switch(byte_index):
                for index in range(word_bytes):
                    with m.Case(index):
                        m.d.sync += assembled[8 * index:8 * index + 8].eq(rx.payload)
            m.d.sync += timer.eq(self._timeout)
            with m.If(byte_index == word_bytes - 1):
                m.d.sync += [byte_index.eq(0), request.valid.eq(1)]
                m.next = "MEM_WRITE"
            with m.Else():
                m.d.sync += byte_index.eq(byte_index + 1)

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += command.eq(0)
                receive(take_sync, timed=False)

            with m.State("COMMAND"):
                receive(take_command)

            with m.State("FIELDS"):
                with m.If(~known):
                    drain(Status.UNKNOWN_COMMAND)
                with m.Elif(field_index == field_count):
                    # The fields are complete: their checks registered for CHECK (the
                    # range's 33-bit sum and compares, in front of the reply's registers,
                    # were the board build's critical path).
                    words_end = Signal(33)
                    m.d.comb += words_end.eq(mem_word + Mux(command == Command.MEM_ZERO,
                                                            zero_count, mem_count))
                    m.d.sync += [
                        beyond_memory.eq(words_end > self._memory_words),
                        bad_count.eq((mem_count == 0) | (mem_count > self._max_words)),
                        reg_outside.eq(reg_addr >> self._reg_addr_width != 0),
                    ]
                    m.next = "CHECK"
                with m.Else():
                    receive(take_field)

            with m.State("CHECK"):
                # Refuse the fields, or start the command.
                m.d.sync += [word.eq(mem_word), waited.eq(0), byte_index.eq(0),
                             words_left.eq(Mux(command == Command.MEM_ZERO, zero_count,
                                               mem_count))]
                with m.Switch(command):
                    with m.Case(Command.INFO):
                        reply(Status.OK, C(int.from_bytes(self.info(), "little"),
                                           8 * INFO_BYTES), INFO_BYTES)
                    with m.Case(Command.REG_READ, Command.REG_WRITE):
                        with m.If(reg_outside):
                            reply(Status.OUT_OF_RANGE)
                        with m.Elif(command == Command.REG_READ):
                            m.d.sync += bus.arvalid.eq(1)
                            m.next = "REG_READ"
                        with m.Else():
                            m.d.sync += [bus.awvalid.eq(1), bus.wvalid.eq(1)]
                            m.next = "REG_WRITE"
                    with m.Case(Command.MEM_READ, Command.MEM_WRITE):
                        with m.If(bad_count):
                            with m.If(command == Command.MEM_WRITE):
                                drain(Status.BAD_LENGTH)
                            with m.Else():
                                reply(Status.BAD_LENGTH)
                        with m.Elif(beyond_memory):
                            with m.If(command == Command.MEM_WRITE):
                                drain(Status.OUT_OF_RANGE)
                            with m.Else():
                                reply(Status.OUT_OF_RANGE)
                        with m.Elif(command == Command.MEM_READ):
                            reply(Status.OK)          # the header, then the words
                        with m.Else():
                            m.d.sync += timer.eq(self._timeout)
                            m.next = "PAYLOAD"
                    with m.Case(Command.MEM_ZERO):
                        with m.If(zero_count == 0):
                            reply(Status.BAD_LENGTH)
                        with m.Elif(beyond_memory):
                            reply(Status.OUT_OF_RANGE)
                        with m.Else():
                            m.d.sync += request.valid.eq(1)
                            m.next = "MEM_WRITE"
                    with m.Case(Command.WAIT_IRQ):
                        m.next = "WAIT"

            with m.State("REG_WRITE"):
                m.d.comb += bus.bready.eq(~bus.awvalid & ~bus.wvalid)
                with m.If(bus.bvalid & bus.bready):
                    reply(Mux(bus.bresp == RESP_OKAY, Status.OK, Status.BUS_ERROR))

            with m.State("REG_READ"):
                m.d.comb += bus.rready.eq(~bus.arvalid)
                with m.If(bus.rvalid & bus.rready):
                    ok = bus.rresp == RESP_OKAY
                    reply(Mux(ok, Status.OK, Status.BUS_ERROR), bus.rdata, Mux(ok, 4, 0))

            with m.State("PAYLOAD"):
                receive(take_payload)

            with m.State("MEM_WRITE"):
                # MEM_WRITE's word, or MEM_ZERO's next word: requested on entry.
                m.d.comb += port.response.ready.eq(1)
                with m.If(port.response.valid):
                    m.d.sync += [word.eq(word + 1), words_left.eq(words_left - 1)]
                    with m.If(words_left == 1):
                        reply(Status.OK)
                    with m.Elif(command == Command.MEM_ZERO):
                        m.d.sync += request.valid.eq(1)
                    with m.Else():
                        m.d.sync += timer.eq(self._timeout)
                        m.next = "PAYLOAD"

            with m.State("MEM_READ"):
                m.d.comb += port.response.ready.eq(1)
                with m.If(port.response.valid):
                    m.d.sync += [out.eq(port.response.payload.data), out_left.eq(word_bytes),
                                 word.eq(word + 1), words_left.eq(words_left - 1)]
                    m.next = "SEND"

            with m.State("WAIT"):
                with m.If(self.irq):
                    reply(Status.OK, C(1, 8), 1)
                with m.Elif((waited == wait_cycles) | rx.valid | framing | overrun):
                    reply(Status.OK, C(0, 8), 1)
                with m.Else():
                    m.d.sync += waited.eq(waited + 1)

            with m.State("SEND"):
                with m.If(out_left == 0):
                    with m.If((command == Command.MEM_READ) & (status == Status.OK)
                              & (words_left != 0)):
                        m.d.sync += request.valid.eq(1)
                        m.next = "MEM_READ"
                    with m.Else():
                        m.next = "IDLE"

            with m.State("DRAIN"):
                # Discard everything until the line has been quiet for the timeout.
                m.d.comb += [reading.eq(1), rx.ready.eq(1)]
                m.d.sync += [framing_seen.eq(0), overrun_seen.eq(0)]
                with m.If(rx.valid | self.rx_framing_error | self.rx_overrun):
                    m.d.sync += timer.eq(self._timeout)
                with m.Elif(timer == 0):
                    reply(status)
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
        return m
