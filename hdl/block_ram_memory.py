"""On-chip block RAM standing in for HBM on an FPGA board: an AXI4 subordinate over one
memory with a synchronous read port and a byte-write port, which Yosys maps onto ECP5 DP16KD
block RAMs, plus a word port for the host (:class:`BlockRAMMemory`)."""

import itertools

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from .axi4 import BOUNDARY_BYTES, BURST_INCR, RESP_DECERR, RESP_OKAY, RESP_SLVERR, AXI4Signature
from .axi4_memory import AW_QUEUE, aw_sink_ready
from .hierarchy import zero_filled
from .params import check_positive, refusing

__all__ = ["BlockRAMMemory", "MemoryPortSignature", "request_layout", "response_layout",
           "LATENCY", "READ_QUEUE", "RESPONSE_QUEUE"]

#: The latency of :class:`~opentrn.hdl.axi4_memory.AXI4Memory` whose timing this memory has,
#: handshake for handshake (``opentrn.cycle_model.predict(program, latency=LATENCY)`` gives a
#: board's counters): a read address is queued before it is read, so no path runs from a
#: manager's AR channel into the block RAMs' address inputs, and the address of each read
#: is a register of its own, so only that register's net reaches the block RAMs spread
#: over the die (docs/fpga.md, "Timing").
LATENCY = 2

#: Read beats between the memory and the R channel: the beats in the read pipeline (the
#: address register and the memory's output) and in the output queue together. Issuing the
#: next read only while fewer are in flight, with registered counts, keeps one beat per cycle
#: flowing when ``rready`` stays high and loses no beat when it drops: a stalled queue takes
#: the beats already read.
READ_QUEUE = 4
#: Write responses waiting for ``bready`` (W stalls before the queue could overflow; the
#: core has at most 4 write bursts awaiting their response).
RESPONSE_QUEUE = 8


def request_layout(addr_width, data_width):
    """A host port request: read or write one word at word address ``addr``."""
    return data.StructLayout({"write": 1, "addr": addr_width, "data": data_width})


def response_layout(data_width):
    """A host port response: the word read (0 for a write), and ``error`` for an address
    outside the memory (nothing was read or written)."""
    return data.StructLayout({"data": data_width, "error": 1})


class MemoryPortSignature(wiring.Signature):
    """A word port of a memory, as its user sees it: ``request`` out
    (:func:`request_layout`), one ``response`` in (:func:`response_layout`) per request, in
    order. A memory takes it flipped: ``In(MemoryPortSignature(...))``."""

    def __init__(self, *, addr_width, data_width):
        check_positive(addr_width=addr_width, data_width=data_width)
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "request": Out(stream.Signature(request_layout(addr_width, data_width))),
            "response": In(stream.Signature(response_layout(data_width))),
        })

    def __eq__(self, other):
        return (isinstance(other, MemoryPortSignature) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __repr__(self):
        return (f"MemoryPortSignature(addr_width={self.addr_width}, "
                f"data_width={self.data_width})")


class _Queue:
    """A first-in first-out queue of registers whose head is always slot 0 (a pop shifts the
    rest down), so what it presents comes straight from flip-flops."""

    def __init__(self, m, layout, depth, name):
        self.slots = [Signal(layout, name=f"{name}{index}") for index in range(depth)]
        self.count = Signal(range(depth + 1), name=f"{name}_count")
        self.m, self.depth = m, depth

    @property
    def head(self):
        return self.slots[0]

    def update(self, push, value, pop):
        m, slots = self.m, self.slots
        with m.If(pop):
            for index in range(self.depth - 1):
                m.d.sync += slots[index].eq(slots[index + 1])
        with m.If(push):
            for index in range(self.depth):
                with m.If(self.count - pop == index):
                    m.d.sync += slots[index].eq(value)
        m.d.sync += self.count.eq(self.count + push - pop)


class BlockRAMMemory(wiring.Component):
    """``size_bytes`` of on-chip memory as an AXI4 subordinate (the core's HBM on a board),
    with a word port for the host.

    The storage is one :class:`amaranth.lib.memory.Memory` of ``data_width``-bit words with
    one synchronous read port (with an enable) and one write port of byte granularity: the
    form Yosys maps onto ECP5 DP16KD block RAMs (a pseudo-dual-port RAM: one read and one
    write port; a third port, or an asynchronous read, would not map). The AXI4 side and the
    host port share the two ports. Every output (R, B, the host's responses) comes from
    flip-flops, and the memory's output goes into a register before any logic, so nothing
    after a block RAM's slow clock-to-output is on a combinational path out.

    Timing, with no host access (the timing of :class:`~opentrn.hdl.axi4_memory.AXI4Memory`
    at latency :data:`LATENCY`, handshake for handshake, so :mod:`opentrn.cycle_model`
    predicts the core's counters on a board):

    * AR is ready while fewer than ``outstanding`` bursts are in flight (from the address to
      the last beat's transfer; the core has at most 7: always). A burst whose address
      transfers in cycle ``t`` is queued, and presents its first beat in ``t + 4``, then one
      beat per cycle while ``rready`` is high; bursts are answered in order. A beat's read
      address is registered, read from the memory the cycle after and queued the cycle
      after that, in a queue of :data:`READ_QUEUE` registers, so a stalled R channel costs
      nothing when it resumes. The burst's checks (the error it answers) are made on the
      queue's head, not on the AR channel.
    * W is ready once its burst's address has transferred (it never is earlier; the core's
      managers send W after AW). A beat is registered at its transfer and written the cycle
      after; the burst's response presents four cycles after its last beat.
    * AW ready follows cocotbext-axi's AW queue (two addresses) in front of the RAM's write
      process, as :class:`~opentrn.hdl.axi4_memory.AXI4Memory` models it.

    A burst it does not serve is answered with an error, never hangs and writes nothing: one
    that runs past the end of the memory answers DECERR; a narrow burst (``size`` other than
    the bus), a burst type other than INCR or one that crosses a 4 KiB boundary answers
    SLVERR. A read burst answers every one of its beats with the error (data 0), a write
    burst takes all its beats and answers the error (the core's DMA turns either into its
    ``READ_*`` / ``WRITE_*`` error codes, its fetchers into ``FETCH_ERROR``).

    The host port takes one request at a time and has priority: a host read takes the read
    address register in the cycle its request is taken (the AXI side then issues no read
    that cycle) and answers three cycles later; a host write stalls W for the cycle its
    request is taken and answers the cycle after. The host may so delay AXI beats (which
    AXI allows), never lose or reorder them. A request outside the memory answers ``error``
    and touches nothing.

    Members
    -------
    axi : ``In(AXI4Signature(addr_width, data_width, id_width))``
        The subordinate port (flipped: a manager's ``Out`` members are inputs here).
    host : ``In(MemoryPortSignature(addr_width=ceil_log2(words), data_width))``
        The host's word port (``words = size_bytes // (data_width // 8)``).
    """

    def __init__(self, *, size_bytes, addr_width, data_width, id_width, outstanding=16):
        with refusing(self):
            check_positive(size_bytes=size_bytes, addr_width=addr_width,
                           data_width=data_width, id_width=id_width, outstanding=outstanding)
            axi = AXI4Signature(addr_width=addr_width, data_width=data_width,
                                id_width=id_width)
            bus_bytes = data_width // 8
            if size_bytes % bus_bytes:
                raise ValueError(f"size_bytes={size_bytes}: must be a multiple of the bus word "
                                 f"({bus_bytes} bytes)")
            if size_bytes > 1 << addr_width:
                raise ValueError(f"size_bytes={size_bytes:,} does not fit {addr_width} "
                                 "address bits")
        self._size_bytes, self._bus_bytes = size_bytes, bus_bytes
        self._words = size_bytes // bus_bytes
        self._outstanding = outstanding
        super().__init__({
            "axi": In(axi),
            "host": In(MemoryPortSignature(addr_width=max(1, ceil_log2(self._words)),
                                           data_width=data_width)),
        })

    @property
    def words(self):
        return self._words

    def elaborate(self, platform):
        m = Module()
        axi, host = self.axi, self.host
        addr_width = axi.signature.addr_width
        id_width = axi.signature.id_width
        data_width = axi.signature.data_width
        bus_bytes = self._bus_bytes
        word_bits = exact_log2(bus_bytes)
        words = self._words
        word_width = addr_width - word_bits + 1   # a word address and its carry

        m.submodules.storage = storage = Memory(shape=data_width, depth=words, init=[])
        zero_filled(storage)
        read = storage.read_port()
        write = storage.write_port(granularity=8)

        def burst_response(name, addr, length, size, burst):
            """The response a burst gets: OKAY, or the error of one this memory refuses."""
            resp = Signal(2, name=f"{name}_resp")
            end = Signal(exact_log2(BOUNDARY_BYTES) + 9 + word_bits, name=f"{name}_end")
            last = Signal(word_width + 8, name=f"{name}_last_word")
            m.d.comb += [end.eq(addr[:exact_log2(BOUNDARY_BYTES)] + ((length + 1) << word_bits)),
                         last.eq(addr[word_bits:] + length)]
            with m.If(last >= words):
                m.d.comb += resp.eq(RESP_DECERR)
            with m.Elif((size != word_bits) | (burst != BURST_INCR) | (end > BOUNDARY_BYTES)):
                m.d.comb += resp.eq(RESP_SLVERR)
            with m.Else():
                m.d.comb += resp.eq(RESP_OKAY)
            return resp

        # -- the host port: one request at a time, first call on both memory ports ----------
        request, response = host.request, host.response
        host_busy = Signal()
        host_take, host_read, host_write = Signal(), Signal(), Signal()
        host_outside = Signal()
        m.d.comb += [
            request.ready.eq(~host_busy),
            host_take.eq(request.valid & request.ready),
            host_read.eq(host_take & ~request.payload.write),
            host_write.eq(host_take & request.payload.write),
            host_outside.eq(request.payload.addr >= words),
        ]
        with m.If(response.valid & response.ready):
            m.d.sync += [response.valid.eq(0), host_busy.eq(0)]
        with m.If(host_take):
            m.d.sync += host_busy.eq(1)

        # -- reads: bursts queued in order, checked at the head, beats read ahead --------------
        queued = data.StructLayout({"addr": addr_width, "length": 8, "id": id_width,
                                    "size": 3, "burst": 2})
        burst = data.StructLayout({"word": word_width - 1, "length": 8, "id": id_width,
                                   "resp": 2})
        m.submodules.reads = reads = SyncFIFO(width=queued.size, depth=self._outstanding)
        head = data.View(queued, reads.r_data)
        ar_taken = Signal()
        # Bursts from their address to their last beat's transfer, as AXI4Memory counts them
        # (its queue holds each until then); the queue here holds fewer: never full.
        in_flight = Signal(range(self._outstanding + 1))
        m.d.comb += [
            axi.arready.eq(in_flight != self._outstanding),
            ar_taken.eq(axi.arvalid & axi.arready),
            reads.w_en.eq(ar_taken),
            reads.w_data.eq(Cat(axi.araddr, axi.arlen, axi.arid, axi.arsize, axi.arburst)),
        ]
        oldest = Signal(burst)
        m.d.comb += [
            oldest.word.eq(head.addr[word_bits:]), oldest.length.eq(head.length),
            oldest.id.eq(head.id),
            oldest.resp.eq(burst_response("ar", head.addr, head.length, head.size, head.burst)),
        ]
        # The burst being read (``length``: beats after the one at ``word``).
        current = Signal(burst)
        current_valid = Signal()
        # The next beat to read: the current burst's, else the oldest queued burst's first.
        source = Signal(burst)
        source_valid = Signal()
        with m.If(current_valid):
            m.d.comb += [source.eq(current), source_valid.eq(1)]
        with m.Elif(reads.r_rdy):
            m.d.comb += [source.eq(oldest), source_valid.eq(1)]

        beat = data.StructLayout({"data": data_width, "id": id_width, "resp": 2, "last": 1})
        queue = _Queue(m, beat, READ_QUEUE, "r_slot")
        # The read pipeline's two stages: what the read address register holds this cycle,
        # and what the memory's output holds.
        stage_layout = data.StructLayout({"axi": 1, "host": 1, "outside": 1, "id": id_width,
                                          "resp": 2, "last": 1})
        addressed, stage = Signal(stage_layout), Signal(stage_layout)
        read_addr = Signal.like(read.addr)
        issue = Signal()
        m.d.comb += [
            issue.eq(source_valid & (addressed.axi + stage.axi + queue.count < READ_QUEUE)
                     & ~host_read),
            reads.r_en.eq(issue & ~current_valid),
            read.en.eq(addressed.axi | addressed.host),
            read.addr.eq(read_addr),
        ]
        with m.If(issue | host_read):
            m.d.sync += read_addr.eq(Mux(host_read, request.payload.addr, source.word))
        with m.If(issue):
            m.d.sync += [
                current_valid.eq(source.length != 0),
                current.word.eq(source.word + 1),
                current.length.eq(source.length - 1),
                current.id.eq(source.id),
                current.resp.eq(source.resp),
            ]
        m.d.sync += [
            addressed.axi.eq(issue), addressed.host.eq(host_read),
            addressed.outside.eq(host_outside), addressed.id.eq(source.id),
            addressed.resp.eq(source.resp), addressed.last.eq(source.length == 0),
            stage.eq(addressed),
        ]
        arriving = Signal(beat)
        m.d.comb += [
            arriving.data.eq(Mux(stage.resp == RESP_OKAY, read.data, 0)),
            arriving.id.eq(stage.id),
            arriving.resp.eq(stage.resp),
            arriving.last.eq(stage.last),
        ]
        r_taken = Signal()
        m.d.comb += [
            axi.rvalid.eq(queue.count != 0),
            axi.rdata.eq(queue.head.data),
            axi.rid.eq(queue.head.id),
            axi.rresp.eq(queue.head.resp),
            axi.rlast.eq(queue.head.last),
            r_taken.eq(axi.rvalid & axi.rready),
        ]
        queue.update(stage.axi, arriving, r_taken)
        m.d.sync += in_flight.eq(in_flight + ar_taken - (r_taken & axi.rlast))
        with m.If(stage.host):
            m.d.sync += [response.valid.eq(1), response.payload.error.eq(stage.outside),
                         response.payload.data.eq(Mux(stage.outside, 0, read.data))]

        # -- writes: W beats registered, written the cycle after ----------------------------
        address = data.StructLayout({"word": word_width - 1, "id": id_width, "resp": 2})
        # The AW sink's queue, the burst the write process holds, and one more: never full.
        m.submodules.writes = writes = SyncFIFO(width=address.size, depth=AW_QUEUE + 2)
        aw_resp = burst_response("aw", axi.awaddr, axi.awlen, axi.awsize, axi.awburst)
        m.d.comb += [
            writes.w_en.eq(axi.awvalid & axi.awready),
            writes.w_data.eq(Cat(axi.awaddr[word_bits:], axi.awid, aw_resp)),
        ]
        writing_burst = data.View(address, writes.r_data)
        responses = _Queue(m, data.StructLayout({"id": id_width, "resp": 2}), RESPONSE_QUEUE,
                           "b_slot")
        # The responses on their way to the queue: one stage per cycle of LATENCY, and one.
        b_stages = [Signal(data.StructLayout({"valid": 1, "id": id_width, "resp": 2}),
                           name=f"b_stage{index}") for index in range(LATENCY + 1)]
        w_beat = Signal(8)
        w_taken, w_last = Signal(), Signal()
        target = Signal(word_width)
        m.d.comb += [
            # No W beat before its address, none in a cycle the host writes, none that could
            # find the response queue full.
            axi.wready.eq(writes.r_rdy & ~host_write
                          & (responses.count + sum(stage.valid for stage in b_stages)
                             < RESPONSE_QUEUE)),
            w_taken.eq(axi.wvalid & axi.wready),
            w_last.eq(w_taken & axi.wlast),
            target.eq(writing_burst.word + w_beat),
        ]
        # The write stage: one word and its byte enables, registered (0: no write).
        write_addr = Signal(range(words))
        write_data = Signal(data_width)
        write_enable = Signal(bus_bytes)
        m.d.sync += write_enable.eq(0)
        with m.If(host_write):
            m.d.sync += [write_addr.eq(request.payload.addr), write_data.eq(request.payload.data),
                         write_enable.eq(Mux(host_outside, 0, (1 << bus_bytes) - 1)),
                         response.valid.eq(1), response.payload.data.eq(0),
                         response.payload.error.eq(host_outside)]
        with m.Elif(w_taken):
            # A beat of a refused burst, or one past the memory (a burst longer than its
            # AWLEN said), writes nothing.
            m.d.sync += [write_addr.eq(target), write_data.eq(axi.wdata),
                         write_enable.eq(Mux((writing_burst.resp == RESP_OKAY)
                                             & (target < words), axi.wstrb, 0))]
        m.d.comb += [write.addr.eq(write_addr), write.data.eq(write_data),
                     write.en.eq(write_enable)]
        with m.If(w_taken):
            m.d.sync += w_beat.eq(w_beat + 1)
            with m.If(axi.wlast):
                m.d.sync += w_beat.eq(0)
                m.d.comb += writes.r_en.eq(1)
        # The response: registered at the last beat, through the stages, queued, presented the
        # cycle after.
        m.d.sync += [b_stages[0].valid.eq(w_last), b_stages[0].id.eq(writing_burst.id),
                     b_stages[0].resp.eq(writing_burst.resp)]
        for earlier, later in itertools.pairwise(b_stages):
            m.d.sync += later.eq(earlier)
        b_taken = Signal()
        m.d.comb += [
            axi.bvalid.eq(responses.count != 0),
            axi.bid.eq(responses.head.id),
            axi.bresp.eq(responses.head.resp),
            b_taken.eq(axi.bvalid & axi.bready),
        ]
        responses.update(b_stages[-1].valid, Cat(b_stages[-1].id, b_stages[-1].resp), b_taken)

        # -- AW ready, as cocotbext-axi's sink in front of the RAM's write process ------------
        # (as AXI4Memory models it, so the timing is the cycle model's.) The sink samples the
        # handshake at each edge: it queues a transferred address and, unless it sleeps
        # (ready low, waiting for the write process to take one), recomputes ready from its
        # queue. The write process takes the next address once it holds no burst (its last
        # beat has come); a take wakes a sleeping sink an edge later.
        aw_sink_ready(m, axi, w_last)
        return m
