"""The DMA engine: descriptors move tensors between HBM (through an AXI4 manager port), the
state buffer (SBUF) and the partial-sum buffer (PSUM), with up to 3-D access patterns."""

import enum

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from . import sbuf as sbuf_mod
from .access_pattern import AccessPatternWalker
from .axi4 import BURST_INCR, RESP_DECERR, RESP_OKAY, AXI4Signature
from .byte_gearbox import ByteGearbox
from .partitioned_memory import (
    read_signature,
    word_request_layout,
    word_response_layout,
    word_write_layout,
)
from .skid_buffer import SkidBuffer

__all__ = ["DMA", "Space", "ErrorCode", "descriptor_layout", "buffer_geometry", "SIZE_BITS",
           "PARTITION_BITS"]

SIZE_BITS = 16          # n0, n1, n2: up to 65535 each
PARTITION_BITS = 8      # partitions, and partition steps, up to 255
QUEUE_DEPTH = 4         # descriptors waiting behind the running one
MAX_BURST = 64          # beats per AXI4 burst (AXI4 allows 256)
MAX_OUTSTANDING = 4     # AXI4 bursts in flight per direction: 256 beats hide 100+ cycles
GEARBOX_WORDS = 4       # realignment buffer, in bus words


class Space(enum.IntEnum):
    """Where one side of a descriptor lives."""
    HBM = 0
    SBUF = 1
    PSUM = 2


class ErrorCode(enum.IntEnum):
    """The status code of a finished descriptor (docs/architecture.md, "DMA errors")."""
    OK = 0
    ZERO_SIZE = 1        # n0, n1 or n2 is zero: nothing moves
    BAD_SPACE = 2        # a side names space 3: nothing moves
    SRC_BOUNDS = 3       # the source pattern leaves HBM, or the buffer's partitions or bytes
    DST_BOUNDS = 4       # the same for the destination
    OVERLAP = 5          # source and destination in one space share bytes: nothing moves
    READ_SLVERR = 6      # an HBM read beat answered SLVERR: its bytes are not written
    READ_DECERR = 7      # ... DECERR
    WRITE_SLVERR = 8     # an HBM write burst answered SLVERR (the memory dropped it)
    WRITE_DECERR = 9     # ... DECERR


def buffer_geometry(config, space):
    """``(partitions, bytes_per_partition)`` of a buffer space."""
    if space == Space.SBUF:
        return config.sbuf_partitions, config.sbuf_bytes_per_partition
    if space == Space.PSUM:
        return config.pe_cols, config.psum_banks * config.psum_bank_entries * 4
    raise ValueError(f"space={space!r}: not a buffer")


def _addr_bits(config):
    largest = max(config.hbm_bytes, config.sbuf_bytes_per_partition,
                  config.psum_banks * config.psum_bank_entries * 4)
    return max(config.hbm_addr_bits, ceil_log2(largest))


def descriptor_layout(config):
    """One descriptor. Row ``(i1, i2)`` of ``n0 << elem_log2`` contiguous bytes is copied
    from ``src.addr + i1 * src.stride1 + i2 * src.stride2`` to the same on the ``dst`` side.
    On HBM, ``addr`` is a byte address; on SBUF or PSUM it is the byte offset in partition
    ``partition + i1 * pstep1 + i2 * pstep2``. The element size only scales ``n0``."""
    addr_bits = _addr_bits(config)
    side = data.StructLayout({
        "addr": addr_bits, "partition": PARTITION_BITS,
        "stride1": addr_bits, "stride2": addr_bits,
        "pstep1": PARTITION_BITS, "pstep2": PARTITION_BITS,
    })
    return data.StructLayout({
        "src_space": 2, "dst_space": 2, "elem_log2": 2,
        "n0": SIZE_BITS, "n1": SIZE_BITS, "n2": SIZE_BITS,
        "src": side, "dst": side,
    })


class DMA(wiring.Component):
    """One DMA engine: a queue of descriptors, executed one at a time.

    Every side is walked row by row and bus word by bus word (:class:`AccessPatternWalker`):
    the source side issues reads (AXI4 INCR bursts of up to 64 beats that never cross 4 KiB,
    up to 4 in flight; or one buffer word per cycle), the bytes of each response go through a
    realignment buffer (:class:`ByteGearbox`), and the destination side writes them (AXI4
    bursts with byte strobes, up to 4 awaiting their response; or buffer words with byte
    enables). Source and destination lanes need not agree: any byte alignment works.

    A descriptor is checked before anything moves (zero size, bad space, bounds, overlap);
    an AXI4 error response does not stop it: the bytes of an erroring read beat are not
    written, and the memory drops an erroring write burst; the descriptor runs to its end
    so that nothing is left in flight. Then it finishes with its :class:`ErrorCode`: ``done``
    pulses, ``completed`` counts it, and a non-zero code sets ``error`` and ``error_code``,
    which hold, and keep the next descriptor waiting, until ``clear``.

    Members
    -------
    descriptor : ``In(stream.Signature(descriptor_layout(config)))``
        The descriptor queue (4 deep behind the running one).
    axi : ``Out(AXI4Signature(addr_width=hbm_addr_bits, data_width=8 * dma_bus_bytes))``
        The HBM port.
    sbuf_read, psum_read : ``Out(read_signature(word_request_layout, word_response_layout))``
        Word reads of a buffer (its ``dma_read`` port): ``request.payload.{partition,
        word}``, answered by ``response.payload.data`` the cycle after the request's
        transfer (the PSUM), or ``sbuf.read_latency`` cycles after it (the SBUF).
    sbuf_write, psum_write : ``Out(stream.Signature(word_write_layout))``
        Word writes of a buffer (its ``dma_write`` port), with byte enables.
    done : ``Out(1)``
        Pulses for one cycle when a descriptor finishes (with or without an error); in that
        cycle ``completed``, ``error`` and ``error_code`` already show it.
    completed : ``Out(32)``
        Descriptors finished since reset.
    busy : ``Out(1)``
        A descriptor is being executed.
    error : ``Out(1)``, ``error_code`` : ``Out(4)``
        The code of the last failed descriptor, held until ``clear``.
    clear : ``In(1)``
        Clear ``error`` so that the queue moves on.
    """

    def __init__(self, *, config):
        self._config = config
        word_bytes = config.dma_bus_bytes
        self._word_bytes = word_bytes
        buffers = {}
        for space in (Space.SBUF, Space.PSUM):
            partitions, size = buffer_geometry(config, space)
            buffers[space] = (partitions, size // word_bytes)
        self._buffers = buffers
        members = {
            "descriptor": In(stream.Signature(descriptor_layout(config))),
            "axi": Out(AXI4Signature(addr_width=config.hbm_addr_bits,
                                     data_width=8 * word_bytes)),
            "done": Out(1), "completed": Out(32), "busy": Out(1),
            "error": Out(1), "error_code": Out(4), "clear": In(1),
        }
        for space, name in ((Space.SBUF, "sbuf"), (Space.PSUM, "psum")):
            partitions, depth = buffers[space]
            members[f"{name}_read"] = Out(read_signature(
                word_request_layout(partitions, depth), word_response_layout(word_bytes)))
            members[f"{name}_write"] = Out(stream.Signature(
                word_write_layout(partitions, depth, word_bytes)))
        super().__init__(members)

    def elaborate(self, platform):
        cfg = self._config
        width = self._word_bytes
        shift = exact_log2(width)
        addr_bits = _addr_bits(cfg)
        m = Module()

        # The check's products (each dimension's reach in bytes and partitions, a
        # multiplier each) are made as a descriptor enters the queue and wait in it beside
        # the descriptor; IDLE adds them into each side's last byte and partition, so CHECK
        # compares registers only (docs/fpga.md, "Timing").
        products = {}
        for name in ("src", "dst"):
            side = getattr(self.descriptor.payload, name)
            for dim in (1, 2):
                count = getattr(self.descriptor.payload, f"n{dim}") - 1
                products[f"{name}_{dim}_bytes"] = count * side[f"stride{dim}"]
                products[f"{name}_{dim}_partitions"] = count * side[f"pstep{dim}"]
        entry = data.StructLayout({
            "desc": descriptor_layout(cfg),
            "reach": data.StructLayout({key: product.shape()
                                        for key, product in products.items()})})
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(width=entry.size,
                                                           depth=QUEUE_DEPTH)
        incoming = Signal(entry)
        with m.If(self.descriptor.valid):
            # Only what enters the queue counts: under its valid, a process on the
            # simulators, not products recomputed as the sequencer assembles each beat.
            m.d.comb += [incoming.reach[key].eq(product) for key, product in products.items()]
        m.d.comb += [
            incoming.desc.eq(self.descriptor.payload),
            queue.w_data.eq(incoming),
            queue.w_en.eq(self.descriptor.valid),
            self.descriptor.ready.eq(queue.w_rdy),
        ]
        desc = Signal(descriptor_layout(cfg))
        # A row's bytes, registered with the descriptor (below) rather than shifted from it
        # on the way into the check and the walkers.
        row_bytes = Signal(SIZE_BITS + 3)

        def walker():
            return AccessPatternWalker(
                word_bytes=width, addr_bits=addr_bits, partition_bits=PARTITION_BITS,
                size_bits=SIZE_BITS, row_bytes_bits=SIZE_BITS + 3, max_burst=MAX_BURST)

        # Requests and responses of each side walk the same pattern independently, so a
        # response needs no record of the request it answers.
        m.submodules.src_issue = src_issue = walker()
        m.submodules.src_take = src_take = walker()
        m.submodules.dst_issue = dst_issue = walker()
        m.submodules.dst_put = dst_put = walker()
        # The walkers load in CHECK whatever its outcome (a refused descriptor never runs),
        # so the check's arithmetic does not reach their registers.
        start = Signal()
        for walk, side in ((src_issue, desc.src), (src_take, desc.src),
                           (dst_issue, desc.dst), (dst_put, desc.dst)):
            m.d.comb += [
                walk.load.eq(start),
                walk.addr.eq(side.addr), walk.partition.eq(side.partition),
                walk.stride1.eq(side.stride1), walk.stride2.eq(side.stride2),
                walk.pstep1.eq(side.pstep1), walk.pstep2.eq(side.pstep2),
                walk.n1.eq(desc.n1), walk.n2.eq(desc.n2), walk.row_bytes.eq(row_bytes),
            ]

        capacity = GEARBOX_WORDS * width
        m.submodules.gearbox = gearbox = ByteGearbox(word_bytes=width, capacity=capacity)

        running = Signal()
        code = Signal(4)                   # first error of the running descriptor

        # Read errors arrive in the order of the source bytes, write errors in the order of
        # the destination bursts, but the two are not ordered in time; a read error wins so
        # that the code does not depend on the memory's timing.
        def record(error, *, read):
            overridable = (code == ErrorCode.OK) | (
                (code >= ErrorCode.WRITE_SLVERR) if read else 0)
            with m.If(overridable):
                m.d.sync += code.eq(error)

        # Each side's space, one-hot, registered with the descriptor (in IDLE, below): the
        # handshakes and the response select read flip-flops, not compares of the fields
        # (the reads' valid into the core's AXI arbiter was its deepest path, docs/fpga.md).
        spaces = (Space.HBM, Space.SBUF, Space.PSUM)
        src_in = {space: Signal(name=f"src_in_{space.name.lower()}") for space in spaces}
        dst_in = {space: Signal(name=f"dst_in_{space.name.lower()}") for space in spaces}
        src_hbm, dst_hbm = src_in[Space.HBM], dst_in[Space.HBM]

        # Each AXI4 address channel takes its bursts from its walker through a skid buffer:
        # a walker steps on its own activity and the buffer's "empty" register, not on the
        # interconnect's ``arready``/``awready`` (which came through the core's read arbiter
        # into the walker's arithmetic, docs/fpga.md, "Timing"). The buffer adds no cycle.
        address_layout = data.StructLayout({"addr": len(self.axi.araddr), "len": 8})

        def address_skid(name, walk, space_chosen):
            skid = m.submodules[name] = SkidBuffer(layout=address_layout)
            m.d.comb += [
                skid.i.valid.eq(running & space_chosen & walk.active),
                skid.i.payload.addr.eq(walk.address),
                skid.i.payload.len.eq(walk.burst_words - 1),
            ]
            return skid.o, skid.i.valid & skid.i.ready

        # -- source: HBM reads ------------------------------------------------------------
        axi = self.axi
        reads_in_flight = Signal(range(MAX_OUTSTANDING + 1))
        read_room = Signal(init=1)          # reads_in_flight < MAX_OUTSTANDING, registered
        ar, ar_walked = address_skid("ar_skid", src_issue, src_hbm)
        m.d.comb += [
            axi.arid.eq(0), axi.araddr.eq(ar.payload.addr), axi.arsize.eq(shift),
            axi.arburst.eq(BURST_INCR), axi.arlen.eq(ar.payload.len),
            axi.arvalid.eq(ar.valid & read_room),
            ar.ready.eq(axi.arready & read_room),
            # Take a beat only while a whole word fits: no path from the pop to the push.
            axi.rready.eq(running & src_hbm & src_take.active
                          & (gearbox.level <= capacity - width)),
        ]
        ar_sent = axi.arvalid & axi.arready
        r_taken = axi.rvalid & axi.rready
        last_taken = r_taken & axi.rlast
        with m.If(ar_sent & ~last_taken):
            m.d.sync += [reads_in_flight.eq(reads_in_flight + 1),
                         read_room.eq(reads_in_flight + 1 < MAX_OUTSTANDING)]
        with m.Elif(~ar_sent & last_taken):
            m.d.sync += [reads_in_flight.eq(reads_in_flight - 1), read_room.eq(1)]
        read_error = r_taken & (axi.rresp != RESP_OKAY)
        with m.If(read_error):
            record(Mux(axi.rresp == RESP_DECERR, ErrorCode.READ_DECERR, ErrorCode.READ_SLVERR),
                   read=True)

        # -- source: buffer reads ---------------------------------------------------------
        # A response cannot wait, so a request goes out only when its word is sure to fit:
        # ``word_room`` is ``level + (words_in_flight + 1) * width <= capacity``, a register
        # made a cycle ahead (below, after the destination's handshakes).
        # At most L in flight, L the slower buffer's read latency (a request a cycle, each
        # answered L cycles after it).
        words_in_flight = Signal(range(sbuf_mod.read_latency(cfg) + 1))
        word_room = Signal(init=1)
        buffer_request = Signal()
        m.d.comb += buffer_request.eq(running & ~src_hbm & src_issue.active & word_room)
        requested = Signal()
        responses = []
        for space, port in ((Space.SBUF, self.sbuf_read), (Space.PSUM, self.psum_read)):
            chosen = src_in[space]
            m.d.comb += [
                port.request.valid.eq(buffer_request & chosen),
                port.request.payload.partition.eq(src_issue.row_partition),
                port.request.payload.word.eq(src_issue.word),
            ]
            with m.If(port.request.valid & port.request.ready):
                m.d.comb += requested.eq(1)
            responses.append((chosen & port.response.valid, port.response.payload.data))
        responded = Signal()
        response = Signal(data.ArrayLayout(8, width))
        for valid, payload in responses:
            with m.If(valid):
                m.d.comb += [responded.eq(1), response.eq(payload)]
        with m.If(requested & ~responded):
            m.d.sync += words_in_flight.eq(words_in_flight + 1)
        with m.Elif(~requested & responded):
            m.d.sync += words_in_flight.eq(words_in_flight - 1)

        m.d.comb += [
            src_issue.step.eq(ar_walked | requested),
            src_issue.step_burst.eq(src_hbm),
        ]

        # -- into the realignment buffer --------------------------------------------------
        arrived = Signal()
        arrived_word = Signal(8 * width)
        arrived_bad = Signal()
        m.d.comb += [
            arrived.eq(r_taken | responded),
            arrived_word.eq(Mux(src_hbm, axi.rdata, response.as_value())),
            arrived_bad.eq(read_error),
            src_take.step.eq(arrived),
        ]
        with m.If(arrived):
            m.d.comb += [
                gearbox.push_count.eq(src_take.lane_count),
                gearbox.push_lane.eq(src_take.first_lane),
                gearbox.push_data.eq(arrived_word),
                gearbox.push_poison.eq(arrived_bad.replicate(width)),
            ]

        # -- destination ------------------------------------------------------------------
        need = Signal(range(width + 1))
        m.d.comb += need.eq(dst_put.lane_count)
        # ``gearbox.level >= need``, a register made a cycle ahead (below): a destination
        # write's valid, into a memory's write grant, starts from flip-flops.
        level_ok = Signal()
        have = running & dst_put.active & level_ok
        lanes = Signal(width)
        m.d.comb += lanes.eq(((1 << need) - 1) << dst_put.first_lane)
        out_data = Signal(8 * width)
        out_strobe = Signal(width)
        m.d.comb += [
            out_data.eq(gearbox.head.as_value() << (dst_put.first_lane << 3)),
            out_strobe.eq(lanes & ~(gearbox.head_poison << dst_put.first_lane)),
        ]

        # HBM writes: AW bursts run ahead of the data, at most MAX_OUTSTANDING unanswered.
        bursts_sent = Signal(range(MAX_OUTSTANDING + 1))      # AW sent, B not yet back
        bursts_unwritten = Signal(range(MAX_OUTSTANDING + 1))  # AW sent, W not yet done
        aw, aw_walked = address_skid("aw_skid", dst_issue, dst_hbm)
        write_room = bursts_sent < MAX_OUTSTANDING
        m.d.comb += [
            axi.awid.eq(0), axi.awaddr.eq(aw.payload.addr), axi.awsize.eq(shift),
            axi.awburst.eq(BURST_INCR), axi.awlen.eq(aw.payload.len),
            axi.awvalid.eq(aw.valid & write_room),
            aw.ready.eq(axi.awready & write_room),
            dst_issue.step.eq(aw_walked),
            dst_issue.step_burst.eq(1),
        ]
        in_burst = Signal()
        beats_left = Signal(range(MAX_BURST + 1))
        m.d.comb += [
            axi.wvalid.eq(have & dst_hbm & (bursts_unwritten != 0)),
            axi.wdata.eq(out_data), axi.wstrb.eq(out_strobe),
            axi.wlast.eq(Mux(in_burst, beats_left == 1, dst_put.burst_words == 1)),
            axi.bready.eq(running),
        ]
        aw_sent = axi.awvalid & axi.awready
        w_sent = axi.wvalid & axi.wready
        w_last_sent = w_sent & axi.wlast
        b_taken = axi.bvalid & axi.bready
        with m.If(w_sent):
            m.d.sync += [in_burst.eq(~axi.wlast),
                         beats_left.eq(Mux(in_burst, beats_left, dst_put.burst_words) - 1)]
        m.d.sync += [
            bursts_sent.eq(bursts_sent + aw_sent - b_taken),
            bursts_unwritten.eq(bursts_unwritten + aw_sent - w_last_sent),
        ]
        # A read error in the same cycle wins (it is recorded above).
        with m.If(b_taken & (axi.bresp != RESP_OKAY) & ~read_error):
            record(Mux(axi.bresp == RESP_DECERR, ErrorCode.WRITE_DECERR,
                       ErrorCode.WRITE_SLVERR), read=False)

        # Buffer writes.
        put = Signal()
        for space, port in ((Space.SBUF, self.sbuf_write), (Space.PSUM, self.psum_write)):
            m.d.comb += [
                port.valid.eq(have & dst_in[space]),
                port.payload.partition.eq(dst_put.row_partition),
                port.payload.word.eq(dst_put.word),
                port.payload.data.eq(out_data),
                port.payload.strobe.eq(out_strobe),
            ]
            with m.If(port.valid & port.ready):
                m.d.comb += put.eq(1)
        written = w_sent | put
        m.d.comb += [
            dst_put.step.eq(written),
            gearbox.pop_count.eq(Mux(written, need, 0)),
        ]

        # The buffer reads' room for next cycle, for each outcome of this cycle's handshakes
        # (a word arrives: the row's lanes pushed; one is written: the put row's lanes
        # popped; a request and a response change the words in flight) compared from
        # registers; the handshakes only choose, so a memory's read grant does not follow an
        # adder and a compare into the arbiter (docs/fpga.md, "Timing").
        def decide_ahead(register, handshakes, value):
            """``register`` takes ``value(*outcome)`` for the outcome (a bit per handshake,
            in order) of this cycle's ``handshakes``: the values are made from registers,
            the handshakes only choose among them."""
            with m.Switch(Cat(*handshakes)):
                for outcome in range(1 << len(handshakes)):
                    with m.Case(outcome):
                        m.d.sync += register.eq(
                            value(*((outcome >> bit) & 1 for bit in range(len(handshakes)))))

        # The realignment buffer's level next cycle, for a push and a pop or not.
        level_after = {(push, pop): gearbox.level + (src_take.lane_count if push else 0)
                       - (need if pop else 0) for push in (0, 1) for pop in (0, 1)}
        fits = {(push, pop, change): (level_after[push, pop]
                                      + ((words_in_flight + change + 1) << shift) <= capacity)
                for push in (0, 1) for pop in (0, 1) for change in (-1, 0, 1)}
        decide_ahead(word_room, (requested, responded, written, arrived),
                     lambda request, answer, pop, push: fits[push, pop, request - answer])

        # The same for the destination's "enough bytes": next cycle's level against next
        # cycle's need (the put walker's lane count after a step when a word is written). A
        # descriptor starts with the buffer empty (every byte pushed is popped before it
        # finishes) and a row has a byte.
        with m.If(start):
            m.d.sync += level_ok.eq(0)
        with m.Else():
            decide_ahead(level_ok, (written, arrived), lambda pop, push: (
                level_after[push, pop] >= (dst_put.lane_count_after_step if pop else need)))

        # -- descriptor sequencing --------------------------------------------------------
        head = data.View(entry, queue.r_data)
        extents = _extents(m, cfg, head.desc, head.reach)
        checked = Signal(4)
        m.d.comb += checked.eq(_check(m, cfg, desc, extents))
        finished = (~src_take.active & ~dst_put.active & (bursts_sent == 0)
                    & (reads_in_flight == 0) & (words_in_flight == 0))
        # Status outputs are registers: no combinational path from the FSM to the ports.
        m.d.sync += self.done.eq(0)
        with m.If(self.clear):
            m.d.sync += self.error.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(queue.r_rdy & ~self.error):
                    m.d.comb += queue.r_en.eq(1)
                    m.d.sync += [desc.eq(head.desc), self.busy.eq(1),
                                 *(src_in[space].eq(head.desc.src_space == space)
                                   for space in spaces),
                                 *(dst_in[space].eq(head.desc.dst_space == space)
                                   for space in spaces),
                                 row_bytes.eq(head.desc.n0 << head.desc.elem_log2),
                                 *(register.eq(value)
                                   for register, value in extents.values())]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += start.eq(1)
                with m.If(checked != ErrorCode.OK):
                    m.d.sync += code.eq(checked)
                    m.next = "FINISH"
                with m.Else():
                    m.d.sync += [code.eq(ErrorCode.OK), running.eq(1)]
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(finished):
                    m.d.sync += running.eq(0)
                    m.next = "FINISH"
            with m.State("FINISH"):
                # done, completed, error and error_code change together.
                m.d.sync += [self.done.eq(1), self.busy.eq(0),
                             self.completed.eq(self.completed + 1)]
                with m.If(code != ErrorCode.OK):
                    m.d.sync += [self.error.eq(1), self.error_code.eq(code)]
                m.next = "IDLE"
        return m


def _extents(m, cfg, desc, reach):
    """Each side's last byte and last partition, ``{(side, "byte" | "partition"):
    (register, value)}``: the registers CHECK reads, and their values from the queue's head
    ``desc`` with its products ``reach`` (``(n_dim - 1) * stride_dim`` and ``(n_dim - 1) *
    pstep_dim``)."""
    extents = {}
    row_bytes = desc.n0 << desc.elem_log2
    for name in ("src", "dst"):
        side = getattr(desc, name)
        last_byte = Signal(_addr_bits(cfg) + SIZE_BITS + 4, name=f"{name}_last_byte")
        last_part = Signal(PARTITION_BITS + SIZE_BITS + 2, name=f"{name}_last_partition")
        extents[name, "byte"] = (last_byte, side.addr + row_bytes - 1
                                 + reach[f"{name}_1_bytes"] + reach[f"{name}_2_bytes"])
        extents[name, "partition"] = (last_part, side.partition + reach[f"{name}_1_partitions"]
                                      + reach[f"{name}_2_partitions"])
    return extents


def _check(m, cfg, desc, extents):
    """The descriptor's :class:`ErrorCode` before anything moves (combinational), with
    ``extents`` from :func:`_extents`."""
    src, dst = desc.src, desc.dst
    src_last, src_part = extents["src", "byte"][0], extents["src", "partition"][0]
    dst_last, dst_part = extents["dst", "byte"][0], extents["dst", "partition"][0]

    def in_bounds(space, last_byte, last_part):
        sbuf_parts, sbuf_bytes = buffer_geometry(cfg, Space.SBUF)
        psum_parts, psum_bytes = buffer_geometry(cfg, Space.PSUM)
        return Mux(space == Space.HBM, last_byte < cfg.hbm_bytes,
                   Mux(space == Space.SBUF,
                       (last_part < sbuf_parts) & (last_byte < sbuf_bytes),
                       (last_part < psum_parts) & (last_byte < psum_bytes)))

    bytes_meet = (src.addr <= dst_last) & (dst.addr <= src_last)
    parts_meet = (src.partition <= dst_part) & (dst.partition <= src_part)
    overlap = (desc.src_space == desc.dst_space) & bytes_meet & (
        (desc.src_space == Space.HBM) | parts_meet)

    result = Signal(4, name="check_result")
    with m.If((desc.n0 == 0) | (desc.n1 == 0) | (desc.n2 == 0)):
        m.d.comb += result.eq(ErrorCode.ZERO_SIZE)
    with m.Elif((desc.src_space == 3) | (desc.dst_space == 3)):
        m.d.comb += result.eq(ErrorCode.BAD_SPACE)
    with m.Elif(~in_bounds(desc.src_space, src_last, src_part)):
        m.d.comb += result.eq(ErrorCode.SRC_BOUNDS)
    with m.Elif(~in_bounds(desc.dst_space, dst_last, dst_part)):
        m.d.comb += result.eq(ErrorCode.DST_BOUNDS)
    with m.Elif(overlap):
        m.d.comb += result.eq(ErrorCode.OVERLAP)
    return result
