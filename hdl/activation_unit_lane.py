"""One lane of the activation unit's buffers: the input slots that hold its part of the PSUM
vectors or SBUF words read, and the SBUF word its results are assembled into."""

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .params import check_positive, check_power_of_two, refusing

__all__ = ["ActivationUnitLane"]

#: Bytes of a bias value and of the widest result (int32, FP32).
_WORD32_BYTES = 4


class ActivationUnitLane(wiring.Component):
    """Lane ``p``'s data path of :class:`~opentrn.hdl.activation_unit.ActivationUnit`
    (``V = word_bytes``, the SBUF's vector word; the unit holds the counters and the
    control, the same for every lane).

    Input. A ``push`` in cycle ``t`` stores, in slot ``push_at``, the lane's part of the
    response: ``sbuf_data`` (its V bytes) with ``src``, else ``psum_data`` (zero-extended).
    ``input`` is, combinationally, the value slot ``head`` holds: with ``src`` its byte
    ``in_byte`` sign-extended, else its low ``acc_bits`` bits as signed. ``bias`` is the
    little-endian 32 bits ``bias_slot`` (a 4-byte index) of ``sbuf_data``.

    Output. ``merged`` is the assembly word with the result written into the bytes
    ``enable`` selects: ``result_bytes`` (1, 2 or 4) low bytes of ``result``, repeated over
    4 bytes and then over the word, so that an aligned result's copy is where the strobes
    are. ``hold`` stores ``merged`` as the assembly word (the next result of the same word
    merges into it).

    Every lane is this one block (:mod:`opentrn.hdl.hierarchy`), so the unit's Verilog and
    elaboration do not grow with the lanes. It holds data only (no reset): the unit's
    counters and strobes say which bytes are valid.

    Members
    -------
    push : ``In(1)``; push_at : ``In(range(slots))``; src : ``In(1)``
    sbuf_data : ``In(8 * word_bytes)``; psum_data : ``In(acc_bits)``
    head : ``In(range(slots))``; in_byte : ``In(log2(word_bytes))``
    input : ``Out(signed(acc_bits))``
    bias_slot : ``In(log2(word_bytes / 4))`` (only with ``word_bytes > 4``); bias : ``Out(32)``
    result : ``In(result_bits)``; result_bytes : ``In(range(5))``; enable : ``In(word_bytes)``
    hold : ``In(1)``; merged : ``Out(8 * word_bytes)``
    """

    def __init__(self, *, slots, word_bytes, acc_bits, result_bits):
        with refusing(self):
            check_positive(slots=slots, acc_bits=acc_bits, result_bits=result_bits)
            check_power_of_two(word_bytes=word_bytes)
            if word_bytes < _WORD32_BYTES:
                raise ValueError(f"word_bytes={word_bytes}: must be at least {_WORD32_BYTES} "
                                 "(a bias is a 32-bit word of it)")
        self._slots, self._word_bytes = slots, word_bytes
        self._acc_bits, self._result_bits = acc_bits, result_bits
        #: Everything the logic depends on (:mod:`opentrn.hdl.hierarchy`).
        self.shared_key = (slots, word_bytes, acc_bits, result_bits)
        members = {
            "push": In(1), "push_at": In(range(slots)), "src": In(1),
            "sbuf_data": In(8 * word_bytes), "psum_data": In(acc_bits),
            "head": In(range(slots)), "in_byte": In(exact_log2(word_bytes)),
            "input": Out(signed(acc_bits)), "bias": Out(32),
            "result": In(result_bits), "result_bytes": In(range(_WORD32_BYTES + 1)),
            "enable": In(word_bytes), "hold": In(1), "merged": Out(8 * word_bytes),
        }
        if word_bytes > _WORD32_BYTES:      # no port of 0 bits: Verilog has no such thing
            members["bias_slot"] = In(exact_log2(word_bytes // _WORD32_BYTES))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        width, acc_bits = self._word_bytes, self._acc_bits
        slot_bits = max(acc_bits, 8 * width)

        # -- input slots -----------------------------------------------------------------
        slots = [Signal(slot_bits, name=f"slot_{index}", reset_less=True)
                 for index in range(self._slots)]
        with m.If(self.push):
            with m.Switch(self.push_at):
                for index, slot in enumerate(slots):
                    with m.Case(index):
                        m.d.sync += slot.eq(Mux(self.src, self.sbuf_data, self.psum_data))
        current = Signal(slot_bits)
        with m.Switch(self.head):
            for index, slot in enumerate(slots):
                with m.Case(index):
                    m.d.comb += current.eq(slot)
        byte = current.word_select(self.in_byte, 8).as_signed()
        m.d.comb += [
            self.input.eq(Mux(self.src, byte, current[:acc_bits].as_signed())),
            self.bias.eq(self.sbuf_data.word_select(self.bias_slot, 32)
                         if width > _WORD32_BYTES else self.sbuf_data),
        ]

        # -- result assembly ---------------------------------------------------------------
        assembly = Signal(8 * width, reset_less=True)
        value = self.result
        # A 1- or 2-byte result is the low bytes of the lane, repeated over 4 bytes and then
        # over the word; it is aligned to its size, so the strobes pick its copy. (A signal:
        # an expression used for every byte would be built once per byte.)
        bytes4 = Signal(32)
        m.d.comb += bytes4.eq(Mux(self.result_bytes == _WORD32_BYTES, value,
                                  Mux(self.result_bytes == 2, value[:16].replicate(2),
                                      value[:8].replicate(_WORD32_BYTES))))
        m.d.comb += self.merged.eq(Cat(*[
            Mux(self.enable[b], bytes4[8 * (b % 4):8 * (b % 4) + 8],
                assembly[8 * b:8 * b + 8])
            for b in range(width)]))
        with m.If(self.hold):
            m.d.sync += assembly.eq(self.merged)
        return m
