"""An AXI4 memory for simulation: the HBM of a core under test, as hardware, so that a run
needs no Python on any clock (:class:`AXI4Memory`)."""

from amaranth import C, Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi4 import BOUNDARY_BYTES, BURST_INCR, RESP_OKAY, AXI4Signature
from .hierarchy import zero_filled
from .params import refusing

__all__ = ["AXI4Memory", "ERRORS", "MAX_BYTES", "aw_sink_ready"]

#: ``error`` codes: a burst of another size than the bus (narrow), of a burst type other than
#: INCR, one that crosses a 4 KiB boundary, one outside the memory, and a W beat that comes
#: before its burst's address (AXI4 allows it; no manager of the core does it).
ERRORS = {1: "narrow burst", 2: "burst type not INCR", 3: "burst crosses a 4 KiB boundary",
          4: "address outside the memory", 5: "W beat before its address"}
_NARROW, _NOT_INCR, _CROSSES, _OUTSIDE, _W_FIRST = 1, 2, 3, 4, 5

#: The largest memory simulated: Verilator keeps it as an array of this many bytes, Icarus
#: at about four bits per bit.
MAX_BYTES = 1 << 30

#: cocotbext-axi's AW sink queue (``queue_occupancy_limit``), which the AW ready follows.
AW_QUEUE = 2
#: Cycles from an address (read) or a last write beat to the first answer, at zero latency.
ANSWER_CYCLES = 2
#: Width of the cycle counter that times the answers (never wraps in a simulation).
TIME_BITS = 48


class AXI4Memory(wiring.Component):
    """An AXI4 memory for simulation: the HBM of a core under test, as hardware, so that a run
    needs no Python on any clock.

    The testbench's other HBM (``sim/hbm.py``: cocotbext-axi's RAM with random latency,
    back-pressure and injected errors) answers the bus from Python coroutines every cycle; this
    one answers it in the simulator. It keeps that model's timing at a fixed latency, handshake
    for handshake (docs/architecture.md, "The simulated HBM"), so the two give the same cycle
    counts and the cycle model (:mod:`opentrn.cycle_model`) predicts both:

    * AR is always ready while fewer than ``outstanding`` read bursts wait. A burst whose
      address transfers in cycle ``t`` presents its first beat in ``t + 2 + latency``, then one
      beat per cycle while ``rready`` is high; bursts are answered in order, the beats of one
      burst with the ID of its address.
    * W is always ready. A beat is written (its byte strobes) at the transfer, to the address of
      the oldest write burst not yet complete; its response presents in
      ``last beat + 2 + latency``.
    * AW: ready as cocotbext-axi's AW sink before the RAM's write process, which queues at most
      two addresses and takes the next when the burst it holds is complete (the state
      ``aw_queued``, ``writing``, ``aw_wake`` below; the cycle model's ``_Hbm`` in the same
      terms).

    The contents are reached from the testbench through the simulator (VPI) before and after a
    run: the storage is a plain array ``storage`` of ``data_width``-bit words, zero at time 0
    (:func:`opentrn.hdl.hierarchy.zero_filled`: written as one loop rather than a statement per
    word). It is a simulation model: it does not build on an FPGA.

    A burst this model does not serve stops nothing but sets ``error`` (the first one's code,
    kept until reset): the testbench checks it after each run.

    Members
    -------
    axi : ``In(AXI4Signature(addr_width, data_width, id_width))``
        The subordinate port (flipped: a manager's ``Out`` members are inputs here).
    latency : ``In(16)``
        Cycles added to the fixed two of every read burst and write response.
    clear_written : ``In(1)``
        Forget the bytes written so far (``written_begin`` and ``written_end`` become 0).
    written_begin, written_end : ``Out(addr_width + 1)``
        The bytes written since reset or ``clear_written``: from the lowest address written to
        one past the highest (both 0 if none). The testbench reads back only these.
    error : ``Out(3)``
        0, or the code of the first burst not served (:data:`ERRORS`).
    """

    def __init__(self, *, size_bytes, addr_width, data_width, id_width, outstanding=16):
        with refusing(self):
            for name, value in (("addr_width", addr_width), ("data_width", data_width),
                                ("id_width", id_width), ("outstanding", outstanding),
                                ("size_bytes", size_bytes)):
                if not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive integer, not {value!r}")
            bus_bytes = data_width // 8
            if size_bytes % bus_bytes:
                raise ValueError(f"size_bytes must be a multiple of the bus word ({bus_bytes} "
                                 f"bytes), not {size_bytes}")
            if size_bytes > MAX_BYTES:
                raise ValueError(f"size_bytes={size_bytes:,}: a simulated memory holds at most "
                                 f"{MAX_BYTES:,} bytes")
            if size_bytes > 1 << addr_width:
                raise ValueError(f"size_bytes={size_bytes:,} does not fit {addr_width} address "
                                 "bits")
        self._size_bytes, self._bus_bytes = size_bytes, bus_bytes
        self._outstanding = outstanding
        super().__init__({
            "axi": In(AXI4Signature(addr_width=addr_width, data_width=data_width,
                                    id_width=id_width)),
            "latency": In(16),
            "clear_written": In(1),
            "written_begin": Out(addr_width + 1),
            "written_end": Out(addr_width + 1),
            "error": Out(3),
        })

    def elaborate(self, platform):
        m = Module()
        axi = self.axi
        addr_width = axi.signature.addr_width
        id_width = axi.signature.id_width
        bus_bytes = self._bus_bytes
        word_bits = exact_log2(bus_bytes)
        words = self._size_bytes // bus_bytes

        m.submodules.storage = storage = Memory(shape=8 * bus_bytes, depth=words, init=[])
        zero_filled(storage)
        read = storage.read_port(domain="comb")
        write = storage.write_port(granularity=8)

        now = Signal(TIME_BITS)
        m.d.sync += now.eq(now + 1)
        due = Signal(TIME_BITS)
        m.d.comb += due.eq(now + ANSWER_CYCLES + self.latency)

        error = Signal(3)
        m.d.comb += self.error.eq(error)

        def check(code, condition):
            with m.If(condition & (error == 0)):
                m.d.sync += error.eq(code)

        def burst_checks(valid, ready, addr, length, size, burst):
            taken = valid & ready
            check(_NARROW, taken & (size != word_bits))
            check(_NOT_INCR, taken & (burst != BURST_INCR))
            end = Signal(addr_width + 9)
            m.d.comb += end.eq(addr[:exact_log2(BOUNDARY_BYTES)]
                               + ((length + 1) << word_bits))
            check(_CROSSES, taken & (end > BOUNDARY_BYTES))
            check(_OUTSIDE, taken & ((addr >> word_bits) + length >= words))

        # -- reads: one queue of bursts, answered in order ------------------------------------
        burst = data.StructLayout({"word": addr_width - word_bits, "length": 8,
                                   "id": id_width, "due": TIME_BITS})
        m.submodules.reads = reads = SyncFIFO(width=burst.size, depth=self._outstanding)
        m.d.comb += [
            axi.arready.eq(reads.w_rdy),
            reads.w_en.eq(axi.arvalid),
            reads.w_data.eq(Cat(axi.araddr[word_bits:], axi.arlen, axi.arid, due)),
        ]
        burst_checks(axi.arvalid, axi.arready, axi.araddr, axi.arlen, axi.arsize,
                     axi.arburst)
        head = data.View(burst, reads.r_data)
        beat = Signal(8)
        m.d.comb += [
            read.addr.eq(head.word + beat),
            axi.rvalid.eq(reads.r_rdy & (now >= head.due)),
            axi.rid.eq(head.id),
            axi.rdata.eq(read.data),
            axi.rresp.eq(RESP_OKAY),
            axi.rlast.eq(beat == head.length),
        ]
        with m.If(axi.rvalid & axi.rready):
            m.d.sync += beat.eq(beat + 1)
            with m.If(axi.rlast):
                m.d.sync += beat.eq(0)
                m.d.comb += reads.r_en.eq(1)

        # -- writes: the addresses in order, the responses after their last beats ----------
        address = data.StructLayout({"word": addr_width - word_bits, "id": id_width})
        # The AW sink's queue, the burst the write process holds, and one more: never full.
        m.submodules.writes = writes = SyncFIFO(width=address.size, depth=AW_QUEUE + 2)
        m.d.comb += [
            writes.w_en.eq(axi.awvalid & axi.awready),
            writes.w_data.eq(Cat(axi.awaddr[word_bits:], axi.awid)),
        ]
        burst_checks(axi.awvalid, axi.awready, axi.awaddr, axi.awlen, axi.awsize,
                     axi.awburst)
        current = data.View(address, writes.r_data)
        w_beat = Signal(8)
        w_taken = Signal()
        m.d.comb += [
            axi.wready.eq(1),
            w_taken.eq(axi.wvalid & writes.r_rdy),
            write.addr.eq(current.word + w_beat),
            write.data.eq(axi.wdata),
            write.en.eq(axi.wstrb & w_taken.replicate(bus_bytes)),
        ]
        check(_W_FIRST, axi.wvalid & ~writes.r_rdy)
        w_last = Signal()
        m.d.comb += w_last.eq(w_taken & axi.wlast)
        # Nothing written yet: written_end, one past a written word, is 0 only then.
        written = Signal()
        m.d.comb += written.eq(self.written_end != 0)
        begin, end = Signal.like(self.written_begin), Signal.like(self.written_end)
        m.d.comb += [begin.eq(Cat(C(0, word_bits), current.word + w_beat)),
                     end.eq(begin + bus_bytes)]
        with m.If(self.clear_written):
            m.d.sync += [self.written_begin.eq(0), self.written_end.eq(0)]
        with m.Elif(w_taken):
            with m.If(~written | (begin < self.written_begin)):
                m.d.sync += self.written_begin.eq(begin)
            with m.If(~written | (end > self.written_end)):
                m.d.sync += self.written_end.eq(end)
        with m.If(w_taken):
            m.d.sync += w_beat.eq(w_beat + 1)
            with m.If(axi.wlast):
                m.d.sync += w_beat.eq(0)
                m.d.comb += writes.r_en.eq(1)

        response = data.StructLayout({"id": id_width, "due": TIME_BITS})
        m.submodules.responses = responses = SyncFIFO(width=response.size,
                                                      depth=AW_QUEUE + 2)
        m.d.comb += [
            responses.w_en.eq(w_last),
            responses.w_data.eq(Cat(current.id, due)),
        ]
        answer = data.View(response, responses.r_data)
        m.d.comb += [
            axi.bvalid.eq(responses.r_rdy & (now >= answer.due)),
            axi.bid.eq(answer.id),
            axi.bresp.eq(RESP_OKAY),
            responses.r_en.eq(axi.bvalid & axi.bready),
        ]

        # -- AW ready, as cocotbext-axi's sink in front of the RAM's write process ------------
        # The sink samples the handshake at each edge: it queues a transferred address and,
        # unless it sleeps (ready low, waiting for the write process to take one), recomputes
        # ready from its queue. The write process takes the next address once it holds no
        # burst (its last beat has come); a take wakes a sleeping sink an edge later.
        aw_sink_ready(m, axi, w_last)
        return m


def aw_sink_ready(m, axi, w_last):
    """Drive ``axi.awready`` as cocotbext-axi's AW sink in front of its RAM's write process
    does (the memories of :class:`AXI4Memory` and
    :class:`~opentrn.hdl.block_ram_memory.BlockRAMMemory` share it, so both have the cycle
    model's timing). ``w_last``: the last beat of the burst being written transfers."""
    aw_ready = Signal(init=1)
    aw_queued = Signal(range(AW_QUEUE + 2))
    writing = Signal()
    aw_wake = Signal()
    queued = Signal.like(aw_queued)
    ready_next = Signal()
    still_writing = Signal()
    take = Signal()
    m.d.comb += [
        axi.awready.eq(aw_ready),
        queued.eq(aw_queued + (axi.awvalid & aw_ready)),
        ready_next.eq(aw_ready),
        still_writing.eq(writing & ~w_last),
        take.eq(~still_writing & (queued != 0)),
    ]
    with m.If(aw_wake | aw_ready):
        m.d.comb += ready_next.eq(queued < AW_QUEUE)
    m.d.sync += [
        aw_ready.eq(ready_next),
        aw_queued.eq(queued - take),
        writing.eq(still_writing | take),
        aw_wake.eq(take & ~ready_next),
    ]
