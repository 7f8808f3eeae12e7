"""The FPGA board top driven by the host driver, without a board: the whole board top
(UART, host bridge, core, block RAM) simulated on Verilator with cocotbext-uart on its pins,
and the same :class:`opentrn.board.Board` that drives a real board over a serial port
running in the testbench (sim/tb_board.py). Library kernels bit-exact against numpy and the
golden machine with every counter as the cycle model predicts it, a faulting program and a
run past its timeout reported by the driver, and every protocol error answered with its
code. Without a simulator: the board top's refusals, its Verilog lint, and the serial
transport's one-line errors (a missing port, a device that does not answer, one that answers
garbage)."""

import os
import pty
import re
import struct
import threading

import numpy as np
import pytest

from opentrn import config, cycle_model, kernels
from opentrn.board import Board, ProtocolError, SerialTransport, TransportError
from opentrn.golden.core import Core as GoldenCore
from opentrn.hdl.block_ram_memory import LATENCY
from opentrn.hdl.board_top import MAX_MEMORY_BYTES, BoardTop
from opentrn.hdl.host_bridge import REPLY, SYNC, Command, Status
from opentrn.hdl.host_registers import REGISTERS
from opentrn.isa import Engine, Fault, Opcode, encode
from opentrn.sim import runner
from opentrn.sim.board import run_images

from .conftest import require_simulator

FPGA = config.preset("fpga")


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _frame(command, *fields, payload=b""):
    return bytes([SYNC, command]) + b"".join(struct.pack("<" + fmt, value)
                                            for fmt, value in fields) + payload


#: Protocol cases: ``(label, case, expected)``; ``expected`` a ``(echo, Status)`` reply or
#: ``(exception class name, message pattern)``.
WORDS = FPGA.hbm_bytes // FPGA.dma_bus_bytes
CASES = [
    ("unknown command", {"send": _frame(0x42, payload=b"\x00" * 5).hex()},
     (0x42, "UNKNOWN_COMMAND")),
    ("bad sync", {"send": "3c01"}, (0x3C, "BAD_SYNC")),
    ("read of 0 words", {"send": _frame(Command.MEM_READ, ("I", 0), ("H", 0)).hex()},
     (Command.MEM_READ, "BAD_LENGTH")),
    ("write of 257 words", {"send": _frame(Command.MEM_WRITE, ("I", 0), ("H", 257),
                                           payload=bytes(257 * 8)).hex()},
     (Command.MEM_WRITE, "BAD_LENGTH")),
    ("read past the memory", {"send": _frame(Command.MEM_READ, ("I", WORDS - 2),
                                             ("H", 3)).hex()},
     (Command.MEM_READ, "OUT_OF_RANGE")),
    ("register past 4 KiB", {"send": _frame(Command.REG_READ, ("H", 0x1000)).hex()},
     (Command.REG_READ, "OUT_OF_RANGE")),
    ("truncated command", {"send": _frame(Command.REG_WRITE, ("H", 0x20),
                                          ("I", 3))[:5].hex()},
     (Command.REG_WRITE, "TIMEOUT")),
    ("framing error", {"send": _frame(Command.REG_READ, ("H", 0)).hex(), "bad_stop": True},
     (Command.REG_READ, "FRAMING")),
    ("read-only register", {"call": "write_register", "args": ["ID", 1]},
     ("CommandError", r"^REG_WRITE refused by the board: BUS_ERROR \(")),
    ("memory past the end", {"call": "read_memory", "args": [FPGA.hbm_bytes - 4, 8]},
     ("ValueError", r"^bytes 0x1fffc\.\.0x20004 are past the board's memory \(131,072 "
                    r"bytes\)$")),
    ("unknown register", {"call": "read_register", "args": ["NOPE"]},
     ("ValueError", r"^register='NOPE': no such register")),
    ("an odd write, read back", {"call": "write_memory", "args": [0x1003, [1, 2, 3, 4, 5,
                                                                           6, 7, 8, 9, 10]]},
     None),
    ("the odd write", {"call": "read_memory", "args": [0x1000, 16]},
     ("result", "000000" + bytes(range(1, 11)).hex() + "000000")),
]


def _dma_image(*instructions):
    """A 256-byte image: the DMA stream ``instructions`` and END at 0x80, the tensor and
    activation streams (END) at 0x20 and 0x40."""
    end = encode(Opcode.END)
    dma = b"".join(instructions) + end
    hbm = np.zeros(0x100, np.uint8)
    hbm[0x80:0x80 + len(dma)] = np.frombuffer(dma, np.uint8)
    hbm[0x20:0x40] = np.frombuffer(end, np.uint8)
    hbm[0x40:0x60] = np.frombuffer(end, np.uint8)
    return hbm, (0x80, 0x20, 0x40)


#: A DMA of zero bytes (refused: DMA_ERROR, ZERO_SIZE) after a NOP.
FAULT = _dma_image(encode(Opcode.NOP), encode(Opcode.DMA, n0=0, n1=1, n2=1, dst_space=1))
#: 64 KiB of HBM into the SBUF (a run of 64 KiB / sbuf_partitions bytes into each
#: partition): 8,287 cycles of bursts at the bus's full rate, the block RAM's read timing
#: in every counter.
_ROW = 65536 // FPGA.sbuf_partitions
LONG = _dma_image(encode(Opcode.DMA, n0=_ROW, n1=FPGA.sbuf_partitions, n2=1, src_addr=0,
                         src_stride1=_ROW, dst_space=1, dst_pstep1=1))


@pytest.mark.sim
def test_kernels_faults_and_protocol_errors_through_the_host_driver():
    sim = "verilator"
    require_simulator(sim)
    rng = np.random.default_rng(15)
    a, b = _int8(rng, (16, 32)), _int8(rng, (32, 24))
    gemm, gemm_expected = kernels.gemm(FPGA, a.T.copy(), b)
    assert np.array_equal(gemm_expected["c"], a.astype(np.int64) @ b.astype(np.int64))
    a, b = _int8(rng, (9, 6)), _int8(rng, (6, 35))
    bias = rng.integers(-3000, 3000, 9).astype(np.int32)
    relu, relu_expected = kernels.gemm_bias_relu(FPGA, a.T.copy(), b, bias, multiplier=3,
                                                 shift=7)
    fault_hbm, fault_programs = FAULT
    relu_out = relu.outputs["y"]
    jobs = [
        (gemm.hbm, gemm.programs),                         # the whole image read back
        (relu.hbm, relu.programs, {"read_back": [(relu_out[0], 9 * 35)]}),
        (fault_hbm, fault_programs, {"check": True}),
        (*LONG, {"timeout": 2e-6}),                        # 160 cycles at 80 MHz: too few
        (relu.hbm, relu.programs, {"read_back": [(relu_out[0], 9 * 35)]}),
        LONG,
    ]
    cases = [{"label": label, **case} for label, case, _ in CASES]
    outcomes, records, result = run_images(FPGA, jobs, cases=cases, sim=sim)
    info = records[0]
    assert info == {"test": "info", "version": 1, "word_bytes": 8, "max_words": 256,
                    "memory_words": WORDS, "timeout_cycles": 2000, "clock_hz": FPGA.clock_hz}

    # Every case answered with its code, and the driver talks to the board after each.
    case_records = {r["label"]: r for r in records if r.get("test") == "case"}
    for label, _, expected in CASES:
        record = case_records[label]
        assert record["recovered"] is True, label
        if expected is None:
            assert "error" not in record, record
        elif expected[0] == "result":
            assert record["result"] == expected[1], record
        elif isinstance(expected[0], str):
            assert record["error"] == expected[0], record
            assert re.search(expected[1], record["message"]), record
            assert "\n" not in record["message"]
        else:
            assert (record["echo"], record["status"]) == expected, record

    golden = GoldenCore(FPGA)
    job_records = [r for r in records if r.get("test") == "job"]
    # The GEMM: the whole image bit for bit, the output as numpy's, every counter predicted.
    reference = golden.run(gemm.hbm, gemm.programs)
    assert outcomes[0].fault == reference.fault == Fault.NONE
    assert np.array_equal(outcomes[0].hbm, reference.hbm[:len(gemm.hbm)])
    assert np.array_equal(gemm.read_outputs(outcomes[0].hbm)["c"], gemm_expected["c"])
    assert outcomes[0].counters == cycle_model.predict(gemm, latency=LATENCY)
    assert outcomes[0].counters["macs"] == reference.counters["macs"] == gemm.macs
    # Only the words that are not zero crossed the UART, and the image came back whole.
    assert job_records[0]["uart_bytes_sent"] < len(gemm.hbm) / 2
    assert job_records[0]["uart_bytes_received"] > len(gemm.hbm)

    # GEMM + bias + ReLU (the activation engine), its output read back, twice: before and
    # after a fault and a timeout.
    reference = golden.run(relu.hbm, relu.programs)
    for outcome in (outcomes[1], outcomes[4]):
        assert outcome.fault == Fault.NONE
        assert np.array_equal(relu.read_outputs(outcome.hbm)["y"], relu_expected["y"])
        assert np.array_equal(outcome.hbm, reference.hbm[:len(relu.hbm)])
        assert outcome.counters == cycle_model.predict(relu, latency=LATENCY)
    assert job_records[1]["uart_bytes_received"] < 1000

    # The faulting program: the driver names the fault; the outcome is the golden machine's.
    reference = golden.run(fault_hbm, fault_programs)
    assert (reference.fault, reference.engine, reference.pc) == \
        (Fault.DMA_ERROR, Engine.DMA, 0x80 + 32)
    fault = outcomes[2]
    assert (fault.fault, fault.engine, fault.pc, fault.dma_error_code) == \
        (reference.fault, reference.engine, reference.pc, reference.dma_error_code)
    assert np.array_equal(fault.hbm, reference.hbm[:len(fault_hbm)])
    assert job_records[2]["error"] == "RunFault"
    assert job_records[2]["message"] == ("the run faulted: DMA_ERROR on the DMA engine at "
                                         "pc=0xa0 (DMA error ZERO_SIZE)")

    # The run past its timeout: no outcome, a one-line error with the state it was in.
    assert outcomes[3] is None
    assert job_records[3]["error"] == "RunTimeout"
    cycles = round(2e-6 * FPGA.clock_hz)
    assert re.fullmatch(rf"the run did not finish within 2e-06 s \({cycles} cycles\): STATUS "
                        r"busy=1, idle=0, done=0, error=0, .*; [\d,]+ cycles run",
                        job_records[3]["message"]), job_records[3]["message"]
    # The next job waited for that run to end before its soft reset (outcomes[4] above); the
    # same program run to its end: every counter as the cycle model has it.
    assert outcomes[5].fault == Fault.NONE
    assert outcomes[5].counters == cycle_model.simulate(FPGA, *LONG, latency=LATENCY)
    assert outcomes[5].counters["dma_bytes"] == 65536


# -- without a simulator ----------------------------------------------------------------------

#: The rates below are of a 100 MHz clock (the ECPIX-5's oscillator without its PLL).
AT_100_MHZ = {"clock_hz": 100_000_000}


@pytest.mark.parametrize("changes, baud, message", [
    (AT_100_MHZ, 30_000_000, "baud=30,000,000 with clock_hz=100,000,000: 3 clocks per bit, "
                             "fewer than the 4 the UART receiver needs; the fastest rate is "
                             "25,000,000 baud"),
    # The FT2232H's fastest rate: 8 clocks per bit at 100 MHz are 12.5 Mbaud.
    (AT_100_MHZ, 12_000_000, "baud=12,000,000 with clock_hz=100,000,000: 8 clocks per bit "
                             "give 12,500,000 baud, 4.2% off (at most 2%)"),
    (AT_100_MHZ, 7_000_000, "baud=7,000,000 with clock_hz=100,000,000: 14 clocks per bit "
                            "give 7,142,857 baud, 2.0% off (at most 2%)"),
    ({}, 0, "baud=0: must be a positive number"),
    ({}, "fast", "baud='fast': must be a positive number"),
    ({"hbm_bytes": 8 << 20}, 1_000_000, "hbm_bytes=8,388,608: the board top holds its HBM "
                                        "in on-chip block RAM, at most 4,194,304 bytes"),
    ({"pe_cols": 8}, 1_000_000, "pe_cols=8: the core needs pe_cols <= sbuf_partitions=4"),
])
def test_the_board_top_refuses_what_it_cannot_build(changes, baud, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BoardTop(config=FPGA.replace(**changes), baud=baud)
    assert MAX_MEMORY_BYTES == 4 << 20


@pytest.mark.parametrize("baud, divisor", [(1_000_000, 100), (3_000_000, 33),
                                           (3_500_000, 29), (6_000_000, 17), (25_000_000, 4)])
def test_the_board_top_takes_rates_within_2_percent(baud, divisor):
    top = BoardTop(config=FPGA.replace(**AT_100_MHZ), baud=baud)
    top._MustUse__silence = True       # built to be looked at, not elaborated
    assert top.divisor == divisor
    assert abs(top.baud - baud) / baud <= 0.02


@pytest.mark.sim
def test_the_board_top_verilog_lints_clean(tmp_path):
    require_simulator("verilator")
    from opentrn.hdl import hierarchy, ports
    top = BoardTop(config=FPGA, baud=1_000_000)
    assert top.divisor == FPGA.clock_hz // 1_000_000 and top.baud == 1_000_000
    out = tmp_path / "board_top.v"
    out.write_text(hierarchy.convert(top, name="board_top", ports=ports(top)))
    ok, output = runner.lint(out, "board_top")
    assert ok, output


def _pty():
    """A pseudo-terminal: the driver opens its device as a serial port; the test plays the
    board on the other end."""
    controller, device = pty.openpty()
    return controller, os.ttyname(device), device


def test_a_missing_serial_port_is_one_line():
    with pytest.raises(TransportError, match=r"^cannot open serial port /dev/opentrn-none at "
                       r"1,000,000 baud: .*No such file or directory.*$") as info:
        SerialTransport("/dev/opentrn-none", 1_000_000)
    assert "\n" not in str(info.value)
    with pytest.raises(TransportError, match=r"^baud=0: must be a positive whole number"):
        SerialTransport("/dev/opentrn-none", 0)


def test_a_device_that_does_not_answer_is_one_line():
    controller, name, device = _pty()
    try:
        transport = SerialTransport(name, 1_000_000, timeout=0.05)
        transport.settle = 0.01
        with pytest.raises(ProtocolError, match=rf"^no answer from {re.escape(name)} at "
                           r"1,000,000 baud within .* s: check that the board is connected"):
            Board(transport)
        transport.close()
    finally:
        os.close(controller)
        os.close(device)


def test_a_device_that_answers_garbage_is_a_wrong_baud_rate():
    """What a board at another baud rate sends back: bytes, but not the protocol's."""
    controller, name, device = _pty()
    stop = threading.Event()

    def garbage():
        while not stop.is_set():
            try:
                if os.read(controller, 64):
                    os.write(controller, b"\xf3\x00\x9e\xff")
            except OSError:
                return

    thread = threading.Thread(target=garbage, daemon=True)
    thread.start()
    try:
        transport = SerialTransport(name, 1_000_000, timeout=0.05)
        transport.settle = 0.01
        with pytest.raises(ProtocolError, match=r"is not the protocol's \(got f3 00 9e, "
                           r"expected 5a first\): a wrong baud rate"):
            Board(transport)
        transport.close()
    finally:
        stop.set()
        os.close(device)
        os.close(controller)
        thread.join(1)


def test_a_device_that_answers_the_protocol_over_a_serial_port():
    """The serial transport end to end against a minimal board on a pseudo-terminal: INFO,
    then a register read."""
    controller, name, device = _pty()
    info = struct.pack("<BBHIII", 1, 8, 256, 16, 2000, 100_000_000)
    stop = threading.Event()

    def board():
        pending = b""
        while not stop.is_set():
            try:
                pending += os.read(controller, 64)
            except OSError:
                return
            if pending[:2] == bytes([SYNC, Command.INFO]):
                os.write(controller, bytes([REPLY, Command.INFO, Status.OK]) + info)
                pending = pending[2:]
            elif len(pending) >= 4 and pending[:2] == bytes([SYNC, Command.REG_READ]):
                offset = struct.unpack("<H", pending[2:4])[0]
                os.write(controller, bytes([REPLY, Command.REG_READ, Status.OK])
                         + struct.pack("<I", 0x1234_0000 | offset))
                pending = pending[4:]

    thread = threading.Thread(target=board, daemon=True)
    thread.start()
    try:
        with SerialTransport(name, 1_000_000, timeout=0.5) as transport:
            b = Board(transport)
            assert b.info["memory_words"] == 16 and b.memory_bytes == 128
            assert b.read_register("STATUS") == 0x1234_0000 | REGISTERS["STATUS"].offset
    finally:
        stop.set()
        os.close(device)
        os.close(controller)
        thread.join(1)
