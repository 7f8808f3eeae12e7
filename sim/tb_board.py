"""cocotb testbench of the FPGA board top (:mod:`opentrn.hdl.board_top`: the core, its block
RAM and the UART host bridge), in which the host driver :class:`opentrn.board.Board` runs
unchanged: the driver's blocking code runs in a thread (:func:`cocotb.task.bridge`) and
talks to the board's UART pins through :class:`SimTransport`, whose blocking calls resume
the simulation until they are done (:func:`cocotb.task.resume`), with cocotbext-uart's
``UartSource`` on ``uart_rx`` and ``UartSink`` on ``uart_tx``. So what runs here is what
runs against a real board over a serial port, byte for byte; only the transport differs.

The script (``OPENTRN_BOARD_SCRIPT``, written by :func:`opentrn.sim.board.run_images`)
holds protocol cases, each reported as a record ``{"test": "case", ...}``:

* ``{"label", "send": hex, "reply": n}``: the raw bytes sent, the reply read
  (:meth:`Board.exchange`); ``"bad_stop": true`` sends the last byte with its stop bit low
  (a framing error on the line);
* ``{"label", "call": name, "args": [...]}``: a method of the driver called, its result or
  its exception's class and message recorded;

and jobs (``{"image": npz, "result": npz, "options": {...}}``, run by
:meth:`Board.run_job`), each reported as ``{"test": "job", ...}``: the outcome's fields, or
the exception's class and message (the outcome of a :class:`~opentrn.board.RunFault` is
kept). After every case the driver must still talk to the board (its INFO again).

Environment: ``OPENTRN_CONFIG``, ``OPENTRN_REPORT``, ``OPENTRN_BOARD_SCRIPT``.
"""

import json
import logging
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import Timer
from cocotb.utils import get_sim_time
from cocotbext.uart import UartSink, UartSource

from opentrn.board import Board, BoardError, RunFault
from opentrn.hdl.board_top import SIMULATION_DIVISOR, SIMULATION_TIMEOUT_CYCLES
from opentrn.hdl.host_bridge import Status

from . import harness

__all__ = ["SimTransport"]


class SimTransport:
    """The UART pins of a simulated board top as a :class:`opentrn.board.Board` transport.

    Its methods block (they are called from a :func:`cocotb.task.bridge` thread) and run the
    simulation until they are done: ``write`` queues bytes on ``UartSource``, ``read`` waits
    for ``UartSink``'s bytes or the timeout, ``pause`` and ``now`` are simulated time.
    ``divisor`` clocks of ``period_ns`` per bit; ``timeout``: the simulated seconds a reply
    may take beyond its bytes (default 20,000 cycles)."""

    def __init__(self, dut, *, divisor=SIMULATION_DIVISOR, period_ns=harness.CLOCK_PERIOD_NS,
                 timeout=None):
        self.dut = dut
        self.bit_ns = divisor * period_ns
        self.baud = 1e9 / self.bit_ns
        # cocotbext-uart times a bit as int(1e9 / baud) ns: exact only for whole nanoseconds.
        assert int(1e9 / self.baud) == self.bit_ns, "the bit time must be whole nanoseconds"
        self.source = UartSource(dut.uart_rx, baud=self.baud)
        self.sink = UartSink(dut.uart_tx, baud=self.baud)
        for agent in (self.source, self.sink):
            agent.log.setLevel(logging.WARNING)      # it logs every byte at INFO
        self.timeout = timeout if timeout is not None else 20_000 * period_ns * 1e-9
        self.settle = SIMULATION_TIMEOUT_CYCLES * period_ns * 1e-9
        self.name = "the simulated board"
        self.bytes_sent = self.bytes_received = 0

    # Each public method runs its coroutine in the simulation and blocks until it is done.
    def write(self, data):
        self.bytes_sent += len(data)
        resume(self.source.write)(bytes(data))

    def read(self, n, timeout=None):
        data = resume(self._read)(n, self.timeout if timeout is None else timeout)
        self.bytes_received += len(data)
        return data

    def discard_input(self):
        resume(self._discard)()

    def pause(self, seconds):
        resume(self._pause)(seconds)

    def now(self):
        return resume(self._now)()

    def send_bad_stop(self, data):
        """Send ``data`` with the last byte's stop bit low (the line driven directly)."""
        self.bytes_sent += len(data)
        resume(self._send_bad_stop)(bytes(data))

    async def _read(self, n, timeout):
        deadline = get_sim_time("ns") + round(timeout * 1e9)
        data = bytearray()
        while len(data) < n:
            if not self.sink.empty():
                data += self.sink.read_nowait(min(n - len(data), self.sink.count()))
                continue
            left = deadline - get_sim_time("ns")
            if left <= 0:
                break
            await self.sink.wait(timeout=left, timeout_unit="ns")
        return bytes(data)

    async def _discard(self):
        self.sink.clear()

    async def _pause(self, seconds):
        await Timer(max(1, round(seconds * 1e9)), unit="ns")

    async def _now(self):
        return get_sim_time("ns") * 1e-9

    async def _send_bad_stop(self, data):
        await self.source.write(data[:-1])
        await self.source.wait()
        line, byte = self.dut.uart_rx, data[-1]
        for level in [0] + [(byte >> bit) & 1 for bit in range(8)] + [0]:
            line.value = level
            await Timer(self.bit_ns, unit="ns")
        line.value = 1


def _case(board, transport, case):
    record = {"test": "case", "label": case["label"]}
    try:
        if "call" in case:
            result = getattr(board, case["call"])(*case.get("args", ()))
            record["result"] = result.hex() if isinstance(result, bytes) else result
        else:
            data = bytes.fromhex(case["send"])
            if case.get("bad_stop"):
                transport.send_bad_stop(data)
                echo, status, payload = board.exchange(b"", case.get("reply", 0))
            else:
                echo, status, payload = board.exchange(data, case.get("reply", 0))
            record.update(echo=echo, status=Status(status).name, payload=payload.hex())
    except (BoardError, ValueError) as exc:
        record.update(error=type(exc).__name__, message=str(exc))
    # Whatever happened, the driver still talks to the board.
    record["recovered"] = board.read_info() == board.info
    harness.report(record)


def _job(board, index, job):
    image = np.load(job["image"])
    hbm, programs = image["hbm"], [int(p) for p in image["programs"]]
    options = dict(job.get("options", {}))
    if "read_back" in options:
        options["read_back"] = [tuple(r) for r in options["read_back"]]
    record = {"test": "job", "job": index}
    sent, received = board.transport.bytes_sent, board.transport.bytes_received
    started = board.transport.now()
    outcome = None
    try:
        outcome = board.run_job(hbm, programs, **options)
    except RunFault as exc:
        record.update(error="RunFault", message=str(exc))
        outcome = exc.outcome
    except BoardError as exc:
        record.update(error=type(exc).__name__, message=str(exc))
    record.update(uart_bytes_sent=board.transport.bytes_sent - sent,
                  uart_bytes_received=board.transport.bytes_received - received,
                  sim_seconds=board.transport.now() - started)
    if outcome is not None:
        record.update(outcome=True, fault=int(outcome.fault),
                      engine=None if outcome.engine is None else int(outcome.engine),
                      pc=outcome.pc, dma_error_code=outcome.dma_error_code,
                      counters=outcome.counters)
        np.savez(job["result"], hbm=outcome.hbm)
    harness.report(record)


def _script(transport, config, script):
    """The host's side, in a thread: the driver, as on a real board."""
    board = Board(transport, config=config)
    harness.report({"test": "info", **board.info})
    for case in script.get("cases", ()):
        _case(board, transport, case)
    for index, job in enumerate(script.get("jobs", ())):
        _job(board, index, job)


@cocotb.test()
async def run_script(dut):
    config = harness.config()
    script = json.loads(os.environ["OPENTRN_BOARD_SCRIPT"])
    # The clock in the simulator (no Python on each edge); low first, as tb_core's.
    Clock(dut.clk, harness.CLOCK_PERIOD_NS, unit="ns", impl="gpi").start(start_high=False)
    dut.uart_rx.value = 1
    await harness.reset(dut)
    transport = SimTransport(dut)
    await bridge(_script)(transport, config, script)
