"""The processing element on Amaranth's own simulator, against the golden ``mac``."""

import random

from amaranth.sim import Simulator

from opentrn.golden.processing_element import mac
from opentrn.hdl.processing_element import ProcessingElement


def test_mac_banks_and_enable():
    dut = ProcessingElement(in_bits=8, acc_bits=16)
    rng = random.Random(3)
    checked = []

    async def bench(ctx):
        weights = [0, 0]
        psum_out = x_out = bank_out = 0
        for _ in range(400):
            x, psum = rng.randint(-128, 127), rng.randint(-2**15, 2**15 - 1)
            bank, enable, write = rng.randint(0, 1), rng.random() < 0.8, rng.random() < 0.3
            wbank, wdata = rng.randint(0, 1), rng.randint(-128, 127)
            for port, value in ((dut.x_in, x), (dut.psum_in, psum), (dut.bank_in, bank),
                                (dut.enable, enable), (dut.weight_we, write),
                                (dut.weight_bank, wbank), (dut.weight_data, wdata)):
                ctx.set(port, value)
            await ctx.tick()
            if enable:
                psum_out = int(mac(psum, x, weights[bank], 16))
                x_out, bank_out = x, bank
            if write:
                weights[wbank] = wdata
            assert ctx.get(dut.psum_out) == psum_out
            assert (ctx.get(dut.x_out), ctx.get(dut.bank_out)) == (x_out, bank_out)
            checked.append(psum_out)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert len(checked) == 400
    assert min(checked) < -2**14 and max(checked) > 2**14   # the wrapped range was used
