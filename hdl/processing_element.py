"""One processing element (PE) of the weight-stationary systolic array."""

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ProcessingElement"]


class ProcessingElement(wiring.Component):
    """A multiply-accumulate cell with two weight registers.

    The PE holds one weight in each of two banks. A moving element arrives from the left
    with the number of the bank it is to be multiplied by; the PE passes it to the right and
    sends ``psum_in + x * weight[bank]`` down, wrapping to ``acc_bits`` (two's complement).
    Because every moving element carries its own bank number, a new stationary tile can be
    written into one bank while the other bank's tile is still in use by elements in flight
    (background weight load); no array-wide swap is needed.

    All registers advance only while ``enable`` is high (the array stalls as one).

    Members
    -------
    enable : ``In(1)``
        Advance the pipeline registers (``x_out``, ``bank_out``, ``psum_out``) this cycle.
    x_in : ``In(signed(in_bits))``
        Moving element from the left neighbour (or the row's skew line).
    bank_in : ``In(1)``
        Weight bank that ``x_in`` is to be multiplied by.
    psum_in : ``In(signed(acc_bits))``
        Partial sum from the PE above (zero for the top row).
    x_out, bank_out : ``Out(...)``
        ``x_in`` and ``bank_in`` registered, to the right neighbour.
    psum_out : ``Out(signed(acc_bits))``
        ``psum_in + x_in * weight[bank_in]`` registered, to the PE below.
    weight_we : ``In(1)``
        Write ``weight_data`` into bank ``weight_bank`` this cycle (independent of ``enable``).
    weight_bank : ``In(1)``
    weight_data : ``In(signed(in_bits))``
    """

    def __init__(self, *, in_bits, acc_bits):
        if acc_bits < 2 * in_bits:
            raise ValueError(f"acc_bits must be at least 2 * in_bits = {2 * in_bits}, "
                             f"not {acc_bits}")
        self._in_bits = in_bits
        self._acc_bits = acc_bits
        super().__init__({
            "enable": In(1),
            "x_in": In(signed(in_bits)),
            "bank_in": In(1),
            "psum_in": In(signed(acc_bits)),
            "x_out": Out(signed(in_bits)),
            "bank_out": Out(1),
            "psum_out": Out(signed(acc_bits)),
            "weight_we": In(1),
            "weight_bank": In(1),
            "weight_data": In(signed(in_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        weights = [Signal(signed(self._in_bits), name=f"weight{bank}") for bank in range(2)]

        with m.If(self.weight_we):
            with m.If(self.weight_bank):
                m.d.sync += weights[1].eq(self.weight_data)
            with m.Else():
                m.d.sync += weights[0].eq(self.weight_data)

        weight = Mux(self.bank_in, weights[1], weights[0])
        with m.If(self.enable):
            m.d.sync += [
                self.x_out.eq(self.x_in),
                self.bank_out.eq(self.bank_in),
                # Assignment truncates to acc_bits: two's-complement wrap-around.
                self.psum_out.eq(self.psum_in + self.x_in * weight),
            ]
        return m
