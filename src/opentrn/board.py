"""Drive an opentrn core on an FPGA board from a host, through the board top's UART host
bridge (:mod:`opentrn.hdl.board_top`, :mod:`opentrn.hdl.host_bridge`; docs/fpga.md, "Host
driver").

:class:`Board` speaks the bridge's framed protocol through a *transport*, any object with

* ``write(data)``: send bytes;
* ``read(n, timeout=None)``: up to ``n`` bytes, fewer if ``timeout`` seconds (default its
  ``timeout``) pass first;
* ``discard_input()``: drop bytes received and not read;
* ``pause(seconds)`` and ``now()``: wait, and the time in seconds, on the device's clock
  (the wall clock for a real board, simulated time in a simulation);
* ``baud``, ``timeout`` (the seconds a reply may take beyond its bytes) and ``name`` (for
  messages); optionally ``settle``, the seconds a bridge of unknown timeout may take to go
  quiet.

:class:`SerialTransport` is a serial port (pyserial); :class:`opentrn.sim.tb_board.
SimTransport` is the UART pins of a simulated board top, so that the same driver runs in a
cocotb testbench (docs/fpga.md, "Simulated board").

On top of the registers (by name, :data:`opentrn.hdl.host_registers.REGISTERS`) and the
memory, :meth:`Board.run_job` runs a job as :func:`opentrn.sim.core.run_images` does (an HBM
image and the three program pointers) and returns the same
:class:`opentrn.golden.core.Outcome`, and :meth:`Board.backend` makes the board a backend of
:meth:`opentrn.kernel.Program.run`, so a library kernel runs on a board, on the RTL or on the
golden machine with the same call.

Every failure raises a :class:`BoardError` whose message is one complete line: a port that
cannot be opened, a device that does not answer or answers garbage (a wrong baud rate), a
command the bridge refuses, a run that faults or does not finish in time.
"""

import struct

import numpy as np

from opentrn.golden.core import Outcome
from opentrn.hdl.block_ram_memory import LATENCY as MEMORY_LATENCY
from opentrn.hdl.dma import ErrorCode
from opentrn.hdl.host_bridge import (
    FIELD_BYTES,
    HEADER_BYTES,
    INFO_BYTES,
    INFO_FIELDS,
    REPLY,
    SYNC,
    VERSION,
    Command,
    Status,
)
from opentrn.hdl.host_registers import COUNTERS as _COUNTERS
from opentrn.hdl.host_registers import ID_VALUE, REGISTERS, unpack
from opentrn.isa import Engine, Fault

__all__ = ["Board", "SerialTransport", "BoardError", "TransportError", "ProtocolError",
           "CommandError", "RunTimeout", "RunFault", "DEFAULT_BAUD", "COUNTERS",
           "WAIT_SLICE_SECONDS", "LOAD_GAP_WORDS"]

#: The board top's default UART rate (:data:`opentrn.hdl.board_top.DEFAULT_BAUD`).
DEFAULT_BAUD = 1_000_000
#: The performance counters, in register order.
COUNTERS = tuple(_COUNTERS)
#: The longest single WAIT_IRQ: a wait is a loop of these, so a host never waits on a board
#: for long without hearing from it.
WAIT_SLICE_SECONDS = 0.1
#: :meth:`Board.load_image` sends the words that are not zero, and zeros the rest in the
#: memory (MEM_ZERO, at the memory's speed): two runs of non-zero words at most this many
#: words apart go as one MEM_WRITE (a frame and its reply cost about as much as a word, and
#: a USB-UART a round trip).
LOAD_GAP_WORDS = 8
#: Bits on the line per byte: start, 8 data bits, stop.
_BITS_PER_BYTE = 10
#: Before the bridge's INFO is known: the seconds it may take to go quiet and answer a
#: frame a previous host left half sent (the board top's bridge timeout is 20 ms); a
#: transport may give its own as ``settle``.
_SETTLE_SECONDS = 0.05
_STATUS_CODES = frozenset(int(status) for status in Status)


class BoardError(RuntimeError):
    """Talking to a board failed; the message says what and what to check, in one line."""


class TransportError(BoardError):
    """The transport itself failed: the port cannot be opened, read or written."""


class ProtocolError(BoardError):
    """No reply, a garbled reply, or a reply that stopped short."""


class CommandError(BoardError):
    """The bridge answered a command with an error status (``status``:
    :class:`~opentrn.hdl.host_bridge.Status`)."""

    def __init__(self, message, command, status):
        super().__init__(message)
        self.command, self.status = command, status


class RunTimeout(BoardError):
    """A run did not finish within its timeout."""


class RunFault(BoardError):
    """A run ended with a fault: ``fault``, ``engine``, ``pc``, ``dma_error_code``, and
    ``outcome`` once the job's memory has been read back."""

    def __init__(self, message, fault, engine, pc, dma_error_code, outcome=None):
        super().__init__(message)
        self.fault, self.engine, self.pc = fault, engine, pc
        self.dma_error_code, self.outcome = dma_error_code, outcome


def _one_line(text):
    return " ".join(str(text).split())


class SerialTransport:
    """A serial port as a :class:`Board` transport (pyserial): ``port`` such as
    ``/dev/ttyUSB1`` (the ECPIX-5's FT2232 shows two; the UART is the second) or ``COM5``,
    at ``baud``. ``timeout``: the seconds a reply may take beyond its bytes' time on the
    line (USB adds milliseconds: an FTDI chip holds a short reply for its latency timer,
    16 ms unless lowered)."""

    def __init__(self, port, baud=DEFAULT_BAUD, *, timeout=0.5):
        if not isinstance(baud, int) or isinstance(baud, bool) or baud <= 0:
            raise TransportError(f"baud={baud!r}: must be a positive whole number of bits "
                                 "per second")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise TransportError(f"timeout={timeout!r}: must be a positive number of seconds")
        try:
            import serial
        except ImportError:
            raise TransportError("pyserial is not installed (pip install pyserial)") from None
        self._serial_module = serial
        self.name = f"{port} at {baud:,} baud"
        self.baud, self.timeout = baud, float(timeout)
        try:
            self._port = serial.Serial(port, baud, timeout=self.timeout,
                                       write_timeout=self.timeout)
        except (serial.SerialException, ValueError, OSError) as exc:
            raise TransportError(f"cannot open serial port {port} at {baud:,} baud: "
                                 f"{_one_line(exc)}") from None

    def _failed(self, what, exc):
        return TransportError(f"{self.name}: {what} failed: {_one_line(exc)}")

    def write(self, data):
        try:
            self._port.write(bytes(data))
            self._port.flush()
        except (self._serial_module.SerialException, OSError) as exc:
            raise self._failed("writing", exc) from None

    def read(self, n, timeout=None):
        try:
            self._port.timeout = self.timeout if timeout is None else timeout
            return bytes(self._port.read(n))
        except (self._serial_module.SerialException, OSError) as exc:
            raise self._failed("reading", exc) from None

    def discard_input(self):
        try:
            self._port.reset_input_buffer()
        except (self._serial_module.SerialException, OSError) as exc:
            raise self._failed("discarding input", exc) from None

    def pause(self, seconds):
        import time
        time.sleep(seconds)

    def now(self):
        import time
        return time.monotonic()

    def close(self):
        self._port.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Board:
    """An opentrn board top, through ``transport`` (see the module's documentation).

    Connecting asks the bridge for its INFO (and retries once, after letting the line go
    quiet, so a bridge left in the middle of a frame by a previous host recovers); with a
    ``config`` it also checks that the board's core is that configuration's (its geometry,
    bus, semaphores and memory). ``info`` holds the INFO reply's fields.
    """

    def __init__(self, transport, *, config=None):
        self.transport, self.config = transport, config
        self.info = None
        self.info = self._connect()
        self.word_bytes = self.info["word_bytes"]
        self.memory_bytes = self.info["memory_words"] * self.word_bytes
        self.clock_hz = self.info["clock_hz"]
        if config is not None:
            self._check_config(config)

    # -- the protocol -----------------------------------------------------------------------

    def _reply_timeout(self, line_bytes, extra_seconds=0.0):
        """Seconds to wait for a reply: ``line_bytes`` on the line (both ways), the
        bridge's quiet time before an error reply, ``extra_seconds`` and the transport's
        allowance."""
        quiet = 0.0 if self.info is None else self.info["timeout_cycles"] / self.clock_hz
        line = 1.5 * line_bytes * _BITS_PER_BYTE / self.transport.baud
        return self.transport.timeout + line + 2 * quiet + extra_seconds

    def _resync(self):
        """Let the bridge drop whatever it holds (it answers once the line has been quiet
        for its timeout) and drop that answer."""
        quiet = getattr(self.transport, "settle", _SETTLE_SECONDS) if self.info is None \
            else self.info["timeout_cycles"] / self.clock_hz
        self.transport.pause(2 * quiet + 64 * _BITS_PER_BYTE / self.transport.baud)
        self.transport.discard_input()

    def exchange(self, frame, reply=0, *, extra_seconds=0.0):
        """Send the bytes ``frame`` as they are (a command, or anything else) and read the
        reply: ``(command echoed, Status, payload)``, the payload ``reply`` bytes long for
        an OK status and empty otherwise. Raises :class:`ProtocolError` for no reply or a
        garbled one."""
        transport = self.transport
        transport.write(frame)
        timeout = self._reply_timeout(len(frame) + HEADER_BYTES + reply, extra_seconds)
        header = transport.read(HEADER_BYTES, timeout)
        if len(header) < HEADER_BYTES:
            got = f" (only {header.hex(' ')})" if header else ""
            self._resync()
            raise ProtocolError(
                f"no answer from {transport.name} within {timeout:.3g} s{got}: check that the "
                "board is connected and configured with the opentrn board top, and that its "
                "UART runs at this baud rate")
        if header[0] != REPLY or header[2] not in _STATUS_CODES:
            self._resync()
            raise ProtocolError(
                f"the answer from {transport.name} is not the protocol's (got "
                f"{header.hex(' ')}, expected {REPLY:02x} first): a wrong baud rate, or not "
                "an opentrn board top")
        status = Status(header[2])
        payload = b""
        if status == Status.OK and reply:
            payload = transport.read(reply, timeout)
            if len(payload) < reply:
                self._resync()
                raise ProtocolError(f"the reply from {transport.name} stopped after "
                                    f"{len(payload)} of {reply} bytes")
        return header[1], status, payload

    def command(self, command, *fields, payload=b"", reply=0, extra_seconds=0.0):
        """Send ``command`` with ``fields`` (``(struct format, value)`` pairs, packed
        little-endian) and ``payload``; return the reply's payload. Raises
        :class:`CommandError` for an error status."""
        command = Command(command)
        body = b"".join(struct.pack("<" + fmt, value) for fmt, value in fields)
        if len(body) != FIELD_BYTES[command]:
            raise ValueError(f"{command.name} takes {FIELD_BYTES[command]} bytes of fields, "
                             f"not {len(body)}")
        echo, status, data = self.exchange(bytes([SYNC, command]) + body + payload, reply,
                                           extra_seconds=extra_seconds)
        if echo != command:
            self._resync()
            raise ProtocolError(f"{self.transport.name} answered command {echo:#04x} to "
                                f"{command.name} ({command:#04x}): a reply was left over "
                                "from an earlier exchange")
        if status != Status.OK:
            raise CommandError(f"{command.name} refused by the board: {status.name} "
                               f"({_STATUS_TEXT[status]})", command, status)
        return data

    def _connect(self):
        self.transport.discard_input()
        try:
            return self.read_info()
        except (ProtocolError, CommandError):
            self._resync()
        try:
            return self.read_info()
        except CommandError as exc:
            raise ProtocolError(f"{self.transport.name} does not answer INFO: {exc}") \
                from None

    def read_info(self):
        """The bridge's INFO (:data:`~opentrn.hdl.host_bridge.INFO_FIELDS`), as a dict."""
        data = self.command(Command.INFO, reply=INFO_BYTES)
        info, offset = {}, 0
        for name, size in INFO_FIELDS:
            info[name] = int.from_bytes(data[offset:offset + size], "little")
            offset += size
        if info["version"] != VERSION:
            raise BoardError(f"{self.transport.name} speaks host protocol version "
                             f"{info['version']}; this driver speaks version {VERSION}")
        return info

    def _check_config(self, config):
        mismatches = []
        ident = self.read_register("ID")
        if ident != ID_VALUE:
            raise BoardError(f"{self.transport.name}: register ID reads {ident:#010x}, not an "
                             f"opentrn core ({ID_VALUE:#010x})")
        geometry, caps = unpack("GEOMETRY", self.read_register("GEOMETRY")), \
            unpack("CAPS", self.read_register("CAPS"))
        board = {"pe_rows": geometry["pe_rows"], "pe_cols": geometry["pe_cols"],
                 "semaphores": caps["semaphores"], "dma_bus_bytes": caps["dma_bus_bytes"],
                 "hbm_bytes": self.memory_bytes, "clock_hz": self.clock_hz}
        for name, value in board.items():
            if getattr(config, name) != value:
                mismatches.append(f"{name}={value:,} (config: {getattr(config, name):,})")
        if mismatches:
            raise BoardError(f"the board's core is not this configuration's: "
                             f"{', '.join(mismatches)}")

    # -- registers ----------------------------------------------------------------------------

    @staticmethod
    def _offset(name):
        if isinstance(name, int) and not isinstance(name, bool):
            return name
        if name not in REGISTERS:
            raise ValueError(f"register={name!r}: no such register (docs/registers.md has "
                             "the map)")
        return REGISTERS[name].offset

    def read_register(self, name):
        """The 32-bit register ``name`` (or a byte offset)."""
        return struct.unpack("<I", self.command(Command.REG_READ, ("H", self._offset(name)),
                                                reply=4))[0]

    def write_register(self, name, value):
        """Write the 32-bit register ``name`` (or a byte offset)."""
        self.command(Command.REG_WRITE, ("H", self._offset(name)),
                     ("I", int(value) & 0xFFFF_FFFF))

    def read_register64(self, name):
        """A 64-bit register pair ``name_LO`` / ``name_HI``, LO first (a counter's HI half
        is latched by the LO read)."""
        low = self.read_register(f"{name}_LO")
        return low | self.read_register(f"{name}_HI") << 32

    def write_register64(self, name, value):
        self.write_register(f"{name}_LO", value & 0xFFFF_FFFF)
        self.write_register(f"{name}_HI", value >> 32)

    def status(self):
        """``STATUS``'s fields, as a dict."""
        return unpack("STATUS", self.read_register("STATUS"))

    def counters(self):
        """The performance counters (``{name: value}``, :data:`COUNTERS`)."""
        return {name: self.read_register64(name.upper()) for name in COUNTERS}

    # -- memory -------------------------------------------------------------------------------

    def _check_range(self, address, length):
        if not isinstance(address, int) or not isinstance(length, int) or address < 0 \
                or length < 0:
            raise ValueError(f"address={address!r}, length={length!r}: must be non-negative "
                             "integers")
        if address + length > self.memory_bytes:
            raise ValueError(f"bytes {address:#x}..{address + length:#x} are past the board's "
                             f"memory ({self.memory_bytes:,} bytes)")

    def _read_words(self, first, count):
        data = bytearray()
        step = self.info["max_words"]
        for word in range(first, first + count, step):
            n = min(step, first + count - word)
            data += self.command(Command.MEM_READ, ("I", word), ("H", n),
                                 reply=n * self.word_bytes)
        return bytes(data)

    def _write_words(self, first, data):
        step = self.info["max_words"] * self.word_bytes
        for offset in range(0, len(data), step):
            chunk = data[offset:offset + step]
            self.command(Command.MEM_WRITE, ("I", first + offset // self.word_bytes),
                         ("H", len(chunk) // self.word_bytes), payload=chunk)

    def read_memory(self, address, length):
        """``length`` bytes of the board's memory from byte ``address``."""
        self._check_range(address, length)
        if length == 0:
            return b""
        w = self.word_bytes
        first, end = address // w, -(-(address + length) // w)
        data = self._read_words(first, end - first)
        return data[address - first * w:address - first * w + length]

    def write_memory(self, address, data):
        """Write the bytes ``data`` at byte ``address`` (a partial word at either end is
        read, merged and written back)."""
        data = bytes(np.asarray(data, dtype=np.uint8).reshape(-1)) \
            if not isinstance(data, (bytes, bytearray)) else bytes(data)
        self._check_range(address, len(data))
        if not data:
            return
        w = self.word_bytes
        first, end = address // w, -(-(address + len(data)) // w)
        head, tail = address - first * w, end * w - (address + len(data))
        words = bytearray((end - first) * w)
        if head:
            words[:w] = self._read_words(first, 1)
        if tail and not (head and end - first == 1):
            words[-w:] = self._read_words(end - 1, 1)
        words[head:head + len(data)] = data
        self._write_words(first, bytes(words))

    def zero_memory(self, address, length):
        """Clear ``length`` bytes from byte ``address`` (whole words with MEM_ZERO, at the
        memory's speed)."""
        self._check_range(address, length)
        w = self.word_bytes
        first, end = -(-address // w), (address + length) // w
        if end <= first:
            self.write_memory(address, bytes(length))
            return
        if first * w > address:
            self.write_memory(address, bytes(first * w - address))
        self.command(Command.MEM_ZERO, ("I", first), ("I", end - first),
                     extra_seconds=(end - first) * 4 / self.clock_hz)
        if address + length > end * w:
            self.write_memory(end * w, bytes(address + length - end * w))

    def load_image(self, image, *, base=0, gap_words=LOAD_GAP_WORDS):
        """Make the board's memory hold ``image`` from byte ``base``: clear its range, then
        write only its words that are not zero (runs at most ``gap_words`` apart merged).
        Returns the bytes of words written."""
        image = np.asarray(image, dtype=np.uint8).reshape(-1)
        self._check_range(base, len(image))
        w = self.word_bytes
        if base % w:
            raise ValueError(f"base={base:#x}: must be a multiple of the bus word ({w} bytes)")
        self.zero_memory(base, len(image))
        words = -(-len(image) // w)
        padded = np.zeros(words * w, dtype=np.uint8)
        padded[:len(image)] = image
        used = np.flatnonzero(padded.reshape(words, w).any(axis=1))
        written = 0
        for start, stop in _runs(used, gap_words):
            chunk = image[start * w:min(stop * w, len(image))]
            self.write_memory(base + start * w, chunk.tobytes())
            written += len(chunk)
        return written

    # -- runs ---------------------------------------------------------------------------------

    def wait_irq(self, seconds):
        """Wait for the interrupt up to ``seconds`` (of the board's clock); True if it is
        high."""
        cycles = max(0, min(int(seconds * self.clock_hz), 0xFFFF_FFFF))
        data = self.command(Command.WAIT_IRQ, ("I", cycles), reply=1,
                            extra_seconds=cycles / self.clock_hz)
        return data == b"\x01"

    def _wait_until(self, ready, timeout, what):
        """Poll ``STATUS`` until ``ready(status)``, for at most ``timeout`` seconds."""
        deadline = self.transport.now() + timeout
        while True:
            status = self.status()
            if ready(status):
                return status
            left = deadline - self.transport.now()
            if left <= 0:
                raise RunTimeout(f"the core did not {what} within {timeout:.3g} s: STATUS "
                                 f"{_status_text(status)}")
            self.wait_irq(min(left, WAIT_SLICE_SECONDS, 1000 / self.clock_hz))

    def start(self, programs, *, soft_reset=True, timeout=1.0):
        """Start a run of the three streams at ``programs`` (byte addresses, DMA, tensor,
        activation) as docs/registers.md's run protocol does: once the core is drained (at
        most ``timeout`` seconds), a soft reset (unless ``soft_reset`` is false), the
        pointers, the interrupt's causes cleared and both enabled, then ``CONTROL.start``."""
        pointers = [int(p) for p in programs]
        if len(pointers) != len(Engine):
            raise ValueError(f"programs={programs!r}: one pointer per engine "
                             f"({', '.join(e.name for e in Engine)})")
        self._wait_until(_drained, timeout, "finish the previous run")
        if soft_reset:
            self.write_register("CONTROL", _bit("CONTROL", "soft_reset"))
        for engine, pointer in zip(Engine, pointers, strict=True):
            self.write_register64(f"{engine.name}_PROGRAM", pointer)
        both = _bit("IRQ_STATUS", "done") | _bit("IRQ_STATUS", "error")
        self.write_register("IRQ_STATUS", both)
        self.write_register("IRQ_ENABLE", both)
        self.write_register("CONTROL", _bit("CONTROL", "start"))

    def wait(self, timeout):
        """Wait at most ``timeout`` seconds (of the board's clock) for the run to end;
        return ``STATUS``'s fields. Raises :class:`RunFault` (naming the fault, engine,
        address and DMA error) if it faulted, :class:`RunTimeout` if it is still running."""
        deadline = self.transport.now() + timeout
        while True:
            left = deadline - self.transport.now()
            irq = self.wait_irq(max(0.0, min(left, WAIT_SLICE_SECONDS)))
            status = self.status()
            if irq or status["done"] or status["error"] or left <= 0:
                break
        if status["error"]:
            raise self._fault(status)
        if not status["done"]:
            counters = self.counters()
            raise RunTimeout(f"the run did not finish within {timeout:.3g} s "
                             f"({int(timeout * self.clock_hz):,} cycles): STATUS "
                             f"{_status_text(status)}; {counters['cycles']:,} cycles run")
        return status

    def _fault(self, status):
        fault = Fault(status["error_code"])
        engine = Engine(status["error_engine"])
        pc = self.read_register64("ERROR_PC")
        dma = status["dma_error_code"] if fault == Fault.DMA_ERROR else 0
        detail = f" (DMA error {_dma_error_name(dma)})" if fault == Fault.DMA_ERROR else ""
        return RunFault(f"the run faulted: {fault.name} on the {engine.name} engine at "
                        f"pc={pc:#x}{detail}", fault, engine, pc, dma)

    def run_job(self, hbm, programs, *, soft_reset=True, timeout=None, read_back=None,
                check=False):
        """Run one job as :func:`opentrn.sim.core.run_images` does: load the HBM image
        ``hbm`` (from address 0), start the streams at ``programs``, wait for the end (at
        most ``timeout`` seconds; default: the cycle model's bound for the streams, with the
        transport's allowance), read the counters, wait for the engines to drain and read
        the memory back (a run still going, one that timed out, is waited for first, up to
        ``timeout``). Returns an :class:`~opentrn.golden.core.Outcome` (its ``hbm`` the
        image's length of memory after the run; ``counters`` the board's).

        ``read_back``: byte ranges ``(address, length)`` to read back (default: the whole
        image); the rest of ``Outcome.hbm`` is the image as loaded. ``check``: raise
        :class:`RunFault` (with the outcome) for a faulting run instead of returning it."""
        hbm = np.asarray(hbm, dtype=np.uint8).reshape(-1)
        if timeout is None:
            timeout = self._default_timeout(hbm, programs)
        # A run left going (one that timed out) ends before its memory is touched.
        self._wait_until(_drained, timeout, "finish the previous run")
        self.load_image(hbm)
        self.start(programs, soft_reset=soft_reset, timeout=timeout)
        fault = None
        try:
            self.wait(timeout)
        except RunFault as exc:
            fault = exc
        counters = self.counters()
        self._wait_until(lambda s: s["idle"], timeout, "drain after the run")
        final = hbm.copy()
        for address, length in (read_back if read_back is not None else [(0, len(hbm))]):
            final[address:address + length] = np.frombuffer(
                self.read_memory(address, length), dtype=np.uint8)
        outcome = Outcome(
            fault=fault.fault if fault else Fault.NONE,
            engine=fault.engine if fault else None,
            pc=fault.pc if fault else None,
            dma_error_code=fault.dma_error_code if fault else 0,
            counters=counters, hbm=final, sbuf=None, psum=None, retired={}, semaphores=[])
        if fault and check:
            fault.outcome = outcome
            raise fault
        return outcome

    def _default_timeout(self, hbm, programs):
        if self.config is None:
            return 10.0
        from opentrn import cycle_model
        cycles = cycle_model.upper_bound(self.config, hbm, programs, latency=MEMORY_LATENCY)
        return cycles / self.clock_hz + self.transport.timeout

    def run_images(self, jobs, **kwargs):
        """Each job ``(hbm, programs)`` or ``(hbm, programs, options)`` (``options``: keyword
        arguments of :meth:`run_job`, e.g. ``{"soft_reset": False}``) in turn: a list of
        :class:`~opentrn.golden.core.Outcome`."""
        outcomes = []
        for hbm, programs, *options in jobs:
            outcomes.append(self.run_job(hbm, programs, **{**kwargs, **(options[0]
                                                                       if options else {})}))
        return outcomes

    def run_programs(self, programs, *, outputs_only=False, **kwargs):
        """Run kernel :class:`~opentrn.kernel.Program` objects: their outcomes.
        ``outputs_only``: read back only the output tensors (much less UART time)."""
        outcomes = []
        for program in programs:
            if self.config is not None and program.config != self.config:
                raise ValueError(f"{program.name}: built for another configuration than the "
                                 "board's")
            read_back = None
            if outputs_only:
                read_back = [(addr, int(np.prod(shape)) * np.dtype(dtype).itemsize)
                             for addr, shape, dtype in program.outputs.values()]
            outcomes.append(self.run_job(program.hbm, program.programs, read_back=read_back,
                                         **kwargs))
        return outcomes

    def backend(self, **kwargs):
        """A backend for :meth:`opentrn.kernel.Program.run` that runs on this board."""
        def run(program):
            (outcome,) = self.run_programs([program], **kwargs)
            return outcome
        return run


def _runs(indices, gap):
    """``[(start, stop)]`` of runs of sorted ``indices``, joining runs at most ``gap``
    apart."""
    runs = []
    for index in indices.tolist():
        if runs and index - runs[-1][1] <= gap:
            runs[-1][1] = index + 1
        else:
            runs.append([index, index + 1])
    return [tuple(run) for run in runs]


def _drained(status):
    return not status["busy"] and status["idle"]


def _bit(register, field):
    return 1 << next(f.lsb for f in REGISTERS[register].fields if f.name == field)


def _status_text(status):
    return ", ".join(f"{name}={value}" for name, value in status.items())


def _dma_error_name(code):
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


_STATUS_TEXT = {
    Status.OK: "no error",
    Status.UNKNOWN_COMMAND: "not a command of the protocol",
    Status.BAD_LENGTH: "a word count of 0 or above the bridge's max_words",
    Status.OUT_OF_RANGE: "past the board's memory, or a register address past 4 KiB",
    Status.BUS_ERROR: "the core's register port answered an error: a read-only or "
                      "unmapped register",
    Status.FRAMING: "a byte with a bad stop bit: a wrong baud rate or a noisy line",
    Status.OVERRUN: "bytes came faster than the bridge took them",
    Status.TIMEOUT: "the command stopped short",
    Status.BAD_SYNC: "a frame did not start with the sync byte",
}


def main(argv=None):
    """``python -m opentrn.board PORT [--baud N] [--preset P] {info,gemm M K N}``: ask a board
    for its INFO and registers, or run a random int8 GEMM on it and check it against numpy
    and the golden machine. A failure prints one line and exits with 1."""
    import argparse
    import sys

    from opentrn import config as config_module

    parser = argparse.ArgumentParser(prog="python -m opentrn.board", description=main.__doc__)
    parser.add_argument("port", help="the serial port, e.g. /dev/ttyUSB1")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD)
    parser.add_argument("--preset", default="fpga", help="the board's configuration")
    parser.add_argument("what", choices=("info", "gemm"))
    parser.add_argument("shape", nargs="*", type=int, help="gemm: M K N")
    args = parser.parse_args(argv)
    try:
        cfg = config_module.preset(args.preset)
        with SerialTransport(args.port, args.baud) as transport:
            board = Board(transport, config=cfg)
            if args.what == "info":
                print(board.info)
                print({name: hex(board.read_register(name))
                       for name in ("ID", "VERSION", "GEOMETRY", "CAPS", "STATUS")})
                return 0
            if len(args.shape) != 3:
                parser.error("gemm takes M K N")
            from opentrn import kernels
            from opentrn.golden.core import Core as GoldenCore
            m, k, n = args.shape
            rng = np.random.default_rng(0)
            a = rng.integers(-128, 128, (m, k)).astype(np.int8)
            b = rng.integers(-128, 128, (k, n)).astype(np.int8)
            program, expected = kernels.gemm(cfg, a.T.copy(), b)
            outputs, outcome = program.run(board.backend())
            golden = GoldenCore(cfg).run(program.hbm, program.programs)
            exact = np.array_equal(outputs["c"], expected["c"]) and \
                np.array_equal(outcome.hbm, golden.hbm[:len(program.hbm)])
            print(f"gemm {m}x{k}x{n}: {'bit-exact' if exact else 'MISMATCH'}; "
                  f"counters {outcome.counters}")
            return 0 if exact else 1
    except (BoardError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
