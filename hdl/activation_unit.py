"""The activation engine's execution unit: runs ``ACTIVATE`` instructions (docs/isa.md) by
reading PSUM or SBUF vectors, streaming them through the
:class:`~opentrn.hdl.activation_engine.ActivationEngine` pipeline and writing the results
to the SBUF."""

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from opentrn import isa, numerics

from . import psum as psum_mod
from . import sbuf as sbuf_mod
from .activation_engine import OUT_BITS, PARAM_BITS, ActivationEngine, float_outputs
from .activation_engine import _check_config as check_engine_config
from .activation_unit_lane import ActivationUnitLane
from .hierarchy import shared
from .params import refusing
from .partitioned_memory import (
    read_signature,
    vector_request_layout,
    vector_response_layout,
    vector_write_layout,
)

__all__ = ["ActivationUnit", "input_slots", "WRITE_SLOTS"]


def input_slots(config):
    """Slots of the input buffer. A slot is reserved when its read is granted and freed when
    the engine takes its last vector, ``L + 1`` cycles later at the earliest (the response
    comes ``L`` cycles after the grant: 1 from the PSUM, ``sbuf.read_latency`` from the
    SBUF, and is registered before the engine sees it), so ``L + 2`` sustain one read per
    cycle from either."""
    return sbuf_mod.read_latency(config) + 2


#: Bytes of a bias value (an int32, or FP32 on the float path), and of the widest result.
INT32_BYTES = 4
#: Completed words the unit holds for the SBUF's write port. With two, whether the engine
#: may hand over a result depends on registers only (a slot is free), not on this cycle's
#: write grant: the grant, which comes from the DMA's side of the SBUF arbitration, stops
#: at the queue's count and pointer instead of running on into the engine's pipeline.
WRITE_SLOTS = 2


def _check_config(config):
    check_engine_config(config)
    if config.pe_cols > config.sbuf_partitions:
        raise ValueError(f"pe_cols={config.pe_cols}: must be at most sbuf_partitions="
                         f"{config.sbuf_partitions} (lane p writes SBUF partition p)")


def _out_bytes(out_format, config):
    """The bytes of one result (1, 2 or 4) of the output format code ``out_format`` (a
    value), for the formats of the build; 4 for a code the build lacks (refused anyway)."""
    result = INT32_BYTES
    for fmt in numerics.activation_formats(config):
        if fmt.bytes != INT32_BYTES:
            result = Mux(out_format == fmt.code, fmt.bytes, result)
    return result


def fault_of(m, check, config):
    """The :class:`opentrn.isa.Fault` code (a value) of ``check`` (a view of
    ``isa.layout(ACTIVATE)``) by the ACTIVATE rules: ``ILLEGAL_OPCODE`` for an
    ``out_format`` the build lacks, then ``BAD_FIELD``, then ``OUT_OF_RANGE``; 0 for any
    other opcode."""
    cfg = config
    size_bytes = cfg.sbuf_bytes_per_partition
    n = check.n
    formats = numerics.activation_formats(cfg)
    floats = [numerics.data_format(name).code for name in float_outputs(cfg)]
    out_format = check.out_format
    illegal = Signal(name="check_illegal_format")
    m.d.comb += illegal.eq(~Cat(out_format == fmt.code for fmt in formats).any())
    is_float = Signal(name="check_float")
    m.d.comb += is_float.eq(Cat(out_format == code for code in floats).any() if floats else 0)
    out_bytes = Signal(range(INT32_BYTES + 1), name="check_out_bytes")
    m.d.comb += out_bytes.eq(_out_bytes(out_format, cfg))
    # Field values are at most 32 bits: these sums cannot wrap. The result bytes are 1, 2
    # or 4: a shift, not a multiplier, in the check's path.
    dst_end = check.dst_offset + Mux(out_bytes == INT32_BYTES, n << 2,
                                     Mux(out_bytes == 2, n << 1, n))
    src_end = check.src_offset + n

    overlap = (check.src_offset < dst_end) & (check.dst_offset < src_end)
    # In place: each SBUF source byte read before its one-byte result is written.
    in_place = ((check.src_offset == check.dst_offset)
                & (out_format == numerics.data_format("int8").code))
    # The element bytes are 1, 2 or 4: the low two bits of the offset tell the alignment.
    misaligned = Mux(out_bytes == INT32_BYTES, check.dst_offset[:2] != 0,
                     Mux(out_bytes == 2, check.dst_offset[0], 0))
    bad_field = Signal(name="check_bad_field")
    m.d.comb += bad_field.eq(
        (n == 0) | (n > cfg.moving_max)
        | misaligned
        | (check.bias & (check.bias_offset % INT32_BYTES != 0))
        | (check.src & overlap & ~in_place)
        # The float path reads PSUM only (SBUF holds int8 sources) and has no shift.
        | (is_float & (check.src | (check.shift != 0))))

    out_of_range = Signal(name="check_out_of_range")
    m.d.comb += out_of_range.eq(
        Mux(check.src,
            src_end > size_bytes,
            (check.psum_bank >= cfg.psum_banks)
            | (check.psum_entry + n > cfg.psum_bank_entries))
        | (dst_end > size_bytes)
        | (check.bias & (check.bias_offset + INT32_BYTES > size_bytes)))

    return Mux(check.opcode != isa.Opcode.ACTIVATE, isa.Fault.NONE,
               Mux(illegal, isa.Fault.ILLEGAL_OPCODE,
                   Mux(bad_field, isa.Fault.BAD_FIELD,
                       Mux(out_of_range, isa.Fault.OUT_OF_RANGE, isa.Fault.NONE))))


class ActivationUnit(wiring.Component):
    """Executes ``ACTIVATE`` instructions, one at a time, in program order.

    Per instruction (docs/isa.md, "ACTIVATE"):

    1. With ``bias = 1``: one SBUF read of the word holding ``bias_offset``; lane ``p``'s
       bias is the little-endian 32 bits at byte ``bias_offset % W`` of partition ``p``
       (``W = Config.vector_word_bytes``, the SBUF's vector word; ``bias_offset`` is
       4-aligned and ``W >= 4``, so it lies in one word): an int32 on the integer path, an
       FP32 on the float path. Without bias the lanes' bias is 0 (int 0, FP32 ``+0``).
    2. The ``n`` input vectors: PSUM entries ``psum_entry + j`` of ``psum_bank`` (one read
       each; on the float path their 32 bits are FP32 codes), or (integer path only) the
       int8 SBUF bytes ``src_offset + j`` sign-extended to ``acc_bits`` (each SBUF word
       read once, its bytes taken in turn).
    3. The :class:`~opentrn.hdl.activation_engine.ActivationEngine` pipeline, its params
       held from the instruction register and the bias register; ``out_format`` selects
       its path.
    4. Results to SBUF partition ``p`` (lane ``p < pe_cols``; other partitions have strobe
       0) at ``dst_offset + B j``, ``B = data_format(out_format).bytes``: 1 (int8, fp8: the
       low byte of the lane), 2 (bf16) or 4 (int32, fp32), little-endian. ``dst_offset``
       is a multiple of ``B`` and ``W`` of 4, so a result never straddles words. Results
       that fall in one SBUF word are merged into one write with byte strobes; other bytes
       are untouched.

    Flow control. A read is requested only while an input buffer slot is free for its
    response (:func:`input_slots`: one read per cycle is sustained), since responses
    cannot be refused. Results are merged in an assembly register and completed words
    queued for ``sbuf_write`` (``WRITE_SLOTS`` words, the head the write's payload), so the
    engine stalls only when a result completes a word while the queue is full (as of the
    cycle before: the write grant reaches the queue's count, not the engine).

    Between instructions the unit drains: the next instruction is accepted only once the
    previous one has retired, so the engine params never change under vectors in flight.
    Within an instruction one vector enters the engine per cycle when the memories grant
    every cycle; an instruction takes ``n + 8 + activation_input_stages +
    activation_multiply_stages + activation_add_stages`` cycles from its transfer to the
    cycle after its retire (``+ S`` from the SBUF, ``S = sbuf_input_stages``; ``+ 2 + S``
    more with bias), when the next can transfer, on either path and for every output
    format.
    In-place operation (``src = 1``, ``src_offset == dst_offset``, int8 out) is correct
    because every source word is read once, before any result of its bytes exists.

    Members
    -------
    instruction : ``In(stream.Signature(isa.layout(isa.Opcode.ACTIVATE)))``
        Checked ``ACTIVATE`` instructions in program order; ready only while the unit is
        idle.
    check : ``In(isa.layout(isa.Opcode.ACTIVATE))``
        An instruction to check (combinational).
    check_valid : ``In(1)``
        ``check`` holds an instruction.
    fault : ``Out(3)``
        The :class:`opentrn.isa.Fault` code of ``check`` (0 when fine, when ``check_valid``
        is low, or for another opcode): ``ILLEGAL_OPCODE`` for an ``out_format`` not in
        ``numerics.activation_formats(config)``, then the ``BAD_FIELD`` rules, then
        ``OUT_OF_RANGE``.
    retire : ``Out(1)``
        One pulse per accepted instruction, in order, in the cycle its last result write
        transfers (the SBUF shows it from the next cycle).
    active : ``Out(1)``
        An accepted instruction has not retired: high from the cycle of its transfer up to
        and including its retire cycle.
    busy : ``Out(1)``
        A vector enters the activation engine this cycle.
    psum_read : ``Out(read_signature(psum.act_request_layout, psum.act_response_layout))``
        To ``PSUM.act_read``: ``request.payload.{bank, entry}``; ``response.payload.data``.
    sbuf_read : ``Out(read_signature(vector_request_layout, vector_response_layout))``
        To ``SBUF.act_read``: ``request.payload.word``; ``response.payload.data``.
    sbuf_write : ``Out(stream.Signature(vector_write_layout))``
        To ``SBUF.act_write``: ``word``, ``data``, ``strobe``.
    """

    def __init__(self, *, config):
        with refusing(self):
            _check_config(config)
        self._config = config
        partitions, word_bytes, depth = sbuf_mod.vector_geometry(config)
        self._sbuf_geometry = partitions, word_bytes, depth
        layout = isa.layout(isa.Opcode.ACTIVATE)
        super().__init__({
            "instruction": In(stream.Signature(layout)),
            "check": In(layout),
            "check_valid": In(1),
            "fault": Out(3),
            "retire": Out(1),
            "active": Out(1),
            "busy": Out(1),
            "psum_read": Out(read_signature(psum_mod.act_request_layout(config),
                                            psum_mod.act_response_layout(config))),
            "sbuf_read": Out(read_signature(vector_request_layout(depth),
                                            vector_response_layout(partitions, word_bytes))),
            "sbuf_write": Out(stream.Signature(vector_write_layout(partitions, word_bytes,
                                                                   depth))),
        })

    def elaborate(self, platform):
        cfg = self._config
        partitions, width, depth = self._sbuf_geometry
        lanes = cfg.pe_cols
        byte_bits = exact_log2(width)
        m = Module()

        # -- the instruction check (combinational) ----------------------------------------
        fault = fault_of(m, self.check, cfg)
        m.d.comb += self.fault.eq(Mux(self.check_valid, fault, isa.Fault.NONE))

        m.submodules.engine = engine = ActivationEngine(config=cfg)

        # -- instruction register and sequencing ------------------------------------------
        ins = Signal(isa.layout(isa.Opcode.ACTIVATE))
        bias = Signal(data.ArrayLayout(signed(PARAM_BITS), lanes))
        m.d.comb += [
            engine.params.function.eq(ins.function),
            engine.params.multiplier.eq(ins.multiplier),
            engine.params.shift.eq(ins.shift),
            engine.params.out_format.eq(ins.out_format),
            engine.params.bias.eq(bias),
        ]

        # Read side: reads still to request, the next PSUM entry or SBUF word.
        reads_left = Signal(range(cfg.moving_max + 1))
        read_index = Signal(range(max(depth, cfg.psum_bank_entries)))
        inputs = input_slots(cfg)
        in_flight = Signal(range(inputs + 1))     # reads granted, not answered yet
        # Input buffer: a slot holds a PSUM vector or an SBUF word of every lane, in the
        # lanes' blocks (below).
        head = Signal(range(inputs))
        tail = Signal(range(inputs))
        level = Signal(range(inputs + 1))
        # Engine input side: the index of the next vector, its byte in the SBUF word.
        in_index = Signal(range(cfg.moving_max))
        in_byte = Signal(byte_bits)
        # Result side: the next result's index and SBUF byte address; the word being
        # assembled; the write queue (completed words, each with its "last of the
        # instruction" flag; the head is the write port's payload).
        out_index = Signal(range(cfg.moving_max))
        out_address = Signal(range(cfg.sbuf_bytes_per_partition + 1))
        assembly_strobe = Signal(width)
        write_layout = self.sbuf_write.payload.shape()
        slots = [Signal(write_layout, name=f"write_slot_{i}") for i in range(WRITE_SLOTS)]
        slot_lasts = [Signal(name=f"write_slot_{i}_last") for i in range(WRITE_SLOTS)]
        write_head = Signal(range(WRITE_SLOTS))
        write_tail = Signal(range(WRITE_SLOTS))
        write_count = Signal(range(WRITE_SLOTS + 1))
        # Bytes of one result, decoded once per instruction; the index of its last vector.
        result_bytes = Signal(range(INT32_BYTES + 1))
        last_index = Signal(range(cfg.moving_max))
        # The next result completes its SBUF word or is the instruction's last (the word
        # then goes out), registered with the address and index it depends on: the engine's
        # back-pressure then starts from flip-flops and the SBUF's write grant alone.
        complete = Signal()

        def completes(address, size, index, last):
            return (address[:byte_bits] + size == width) | (index == last)

        src = ins.src

        # Each lane's slots, input value, bias word and result assembly: one shared block
        # per lane (activation_unit_lane.py), so the unit does not grow with the lanes.
        # (Per-lane values are joined with Cat where a port takes all lanes: one wide signal
        # assigned lane by lane costs elaboration time in the square of its width.)
        result = engine.output
        lane_blocks = []
        for p in range(lanes):
            block = ActivationUnitLane(slots=inputs, word_bytes=width,
                                       acc_bits=cfg.acc_bits, result_bits=OUT_BITS)
            m.submodules[f"lane_{p}"] = shared(block)
            lane_blocks.append(block)

        instruction = self.instruction
        read_req = self.sbuf_read.request
        read_resp = self.sbuf_read.response
        psum_req = self.psum_read.request
        psum_resp = self.psum_read.response
        write = self.sbuf_write
        write_last = Signal()
        head_payload, head_last = slots[0], slot_lasts[0]
        for index in range(1, WRITE_SLOTS):
            head_payload = Mux(write_head == index, slots[index], head_payload)
            head_last = Mux(write_head == index, slot_lasts[index], head_last)
        m.d.comb += [write.valid.eq(write_count != 0), write.payload.eq(head_payload),
                     write_last.eq(head_last)]
        retire = write.valid & write.ready & write_last
        m.d.comb += self.retire.eq(retire)

        streaming = Signal()                     # the STREAM state
        with m.FSM(name="state"):
            with m.State("IDLE"):
                m.d.comb += [instruction.ready.eq(1), self.active.eq(instruction.valid)]
                with m.If(instruction.valid):
                    new = instruction.payload
                    new_bytes = _out_bytes(new.out_format, cfg)
                    first_word = new.src_offset >> byte_bits
                    end_word = (new.src_offset + new.n - 1) >> byte_bits
                    m.d.sync += [
                        ins.eq(new),
                        # One read per PSUM entry, or per SBUF word the source touches.
                        reads_left.eq(Mux(new.src, end_word - first_word + 1, new.n)),
                        read_index.eq(Mux(new.src, first_word, new.psum_entry)),
                        in_index.eq(0),
                        in_byte.eq(new.src_offset[:byte_bits]),
                        out_index.eq(0),
                        out_address.eq(new.dst_offset),
                        result_bytes.eq(new_bytes),
                        last_index.eq(new.n - 1),
                        complete.eq(completes(new.dst_offset, new_bytes, 0, new.n - 1)),
                    ]
                    m.d.sync += bias.eq(0)
                    with m.If(new.bias):
                        m.next = "BIAS"
                    with m.Else():
                        m.next = "STREAM"
            with m.State("BIAS"):
                m.d.comb += [
                    self.active.eq(1),
                    read_req.valid.eq(1),
                    read_req.payload.word.eq(ins.bias_offset >> byte_bits),
                ]
                with m.If(read_req.ready):
                    m.next = "BIAS_RESPONSE"
            with m.State("BIAS_RESPONSE"):
                m.d.comb += self.active.eq(1)
                # The int32 of each lane is 4-aligned within the word (the lanes pick it).
                with m.If(read_resp.valid):
                    m.d.sync += bias.eq(Cat(block.bias for block in lane_blocks))
                    m.next = "STREAM"
            with m.State("STREAM"):
                m.d.comb += [self.active.eq(1), streaming.eq(1)]
                with m.If(retire):
                    m.next = "IDLE"

        # -- reads: only with a free slot for the response ---------------------------------
        request = Signal()
        m.d.comb += request.eq(streaming & (reads_left != 0)
                               & (level + in_flight < inputs))
        with m.If(streaming):
            m.d.comb += [
                psum_req.valid.eq(request & ~src),
                psum_req.payload.bank.eq(ins.psum_bank),
                psum_req.payload.entry.eq(read_index),
                read_req.valid.eq(request & src),
                read_req.payload.word.eq(read_index),
            ]
        granted = Signal()
        m.d.comb += granted.eq(streaming & Mux(src, read_req.valid & read_req.ready,
                                               psum_req.valid & psum_req.ready))
        with m.If(granted):
            m.d.sync += [reads_left.eq(reads_left - 1), read_index.eq(read_index + 1)]

        # -- input buffer -> engine --------------------------------------------------------
        push = Signal()
        pop = Signal()
        m.d.comb += push.eq(streaming & Mux(src, read_resp.valid, psum_resp.valid))
        with m.If(push):
            m.d.sync += tail.eq(Mux(tail == inputs - 1, 0, tail + 1))
        m.d.sync += in_flight.eq(in_flight + granted - push)
        for block in lane_blocks:
            m.d.comb += [
                block.push.eq(push), block.push_at.eq(tail), block.src.eq(src),
                block.head.eq(head), block.in_byte.eq(in_byte),
            ]
            if width > INT32_BYTES:
                m.d.comb += block.bias_slot.eq(ins.bias_offset[2:byte_bits])
        # Responses split into the lanes once (a Cat on the left; the SBUF's partitions
        # beyond the lanes are not taken): a slice of a field of a wide signal per lane
        # would rebuild the field's bits every time.
        m.d.comb += [
            Cat(block.sbuf_data for block in lane_blocks).eq(read_resp.payload.data),
            Cat(block.psum_data for block in lane_blocks).eq(psum_resp.payload.data),
        ]

        m.d.comb += [
            engine.input.valid.eq(level != 0),
            engine.input.payload.last.eq(in_index == last_index),
        ]
        m.d.comb += engine.input.payload.data.eq(Cat(block.input for block in lane_blocks))
        take = engine.input.valid & engine.input.ready
        m.d.comb += self.busy.eq(take)
        with m.If(take):
            m.d.sync += [in_index.eq(in_index + 1), in_byte.eq(in_byte + 1)]
        # A PSUM slot is one vector; an SBUF slot is done at its last byte or the last
        # vector.
        m.d.comb += pop.eq(take & (~src | (in_byte == width - 1)
                                   | (in_index == last_index)))
        with m.If(pop):
            m.d.sync += head.eq(Mux(head == inputs - 1, 0, head + 1))
        m.d.sync += level.eq(level + push - pop)

        # -- engine -> assembly register -> write queue ----------------------------------
        position = out_address[:byte_bits]
        m.d.comb += result.ready.eq(~complete | (write_count != WRITE_SLOTS))
        enable = Signal(width)
        m.d.comb += enable.eq(Mux(result_bytes == INT32_BYTES, 0b1111,
                                  Mux(result_bytes == 2, 0b11, 0b1)) << position)
        hold = Signal()         # a result that does not complete its word: keep merging
        m.d.comb += hold.eq(result.valid & result.ready & ~complete)
        for block in lane_blocks:
            m.d.comb += [block.result_bytes.eq(result_bytes), block.enable.eq(enable),
                         block.hold.eq(hold)]
        m.d.comb += Cat(block.result for block in lane_blocks).eq(result.payload.data)
        merged = [block.merged for block in lane_blocks]
        merged_strobe = assembly_strobe | enable

        push = Signal()
        pop = Signal()
        m.d.comb += [push.eq(result.valid & result.ready & complete),
                     pop.eq(write.valid & write.ready)]
        def following(slot):
            return Mux(slot == WRITE_SLOTS - 1, 0, slot + 1)

        m.d.sync += write_count.eq(write_count + push - pop)
        with m.If(pop):
            m.d.sync += write_head.eq(following(write_head))
        with m.If(result.valid & result.ready):
            next_address = out_address + result_bytes
            m.d.sync += [out_index.eq(out_index + 1), out_address.eq(next_address),
                         complete.eq(completes(next_address, result_bytes, out_index + 1,
                                               last_index))]
            with m.If(complete):
                m.d.sync += [write_tail.eq(following(write_tail)), assembly_strobe.eq(0)]
                for index, (slot, slot_last) in enumerate(zip(slots, slot_lasts, strict=True)):
                    with m.If(write_tail == index):
                        m.d.sync += [
                            slot.word.eq(out_address >> byte_bits),
                            slot.data.eq(Cat(merged)),
                            slot.strobe.eq(merged_strobe.replicate(lanes)),
                            slot_last.eq(out_index == last_index),
                        ]
            with m.Else():
                m.d.sync += assembly_strobe.eq(merged_strobe)
        return m
