"""The processing element on Amaranth's own simulator, against the golden ``mac`` (int8) and
``mac_float`` (BF16, FP8), bit for bit."""

import random

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from opentrn import numerics
from opentrn.golden.processing_element import mac, mac_float
from opentrn.hdl.processing_element import ProcessingElement
from opentrn.sim.tb_fp_adder import SPECIAL_CODES
from opentrn.sim.tb_fp_multiplier import random_operands, special_codes

FLOATS = ("bf16", "fp8e4m3", "fp8e5m2")
ALL = ("int8", *FLOATS)


def _run(dut, steps, bench_step):
    """Drive ``steps`` random cycles through ``bench_step(ctx, state)`` (returns the expected
    registered outputs) and check them after every clock edge."""
    checked = []

    async def bench(ctx):
        state = {"weights": [0, 0], "out": (0, 0, 0, 0)}
        for step in range(steps):
            bench_step(ctx, state, step)
            await ctx.tick()
            got = (ctx.get(dut.psum_out), ctx.get(dut.x_out), ctx.get(dut.bank_out),
                   ctx.get(dut.format_out))
            assert got == state["out"], (step, got, state["out"])
            checked.append(state["out"][0])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return checked


def _drive(ctx, dut, state, rng, *, x, psum, fmt):
    """Set the inputs (a random bank, enable and weight write), and update ``state`` with
    what the PE registers at the clock edge; the expected sum comes from ``state['mac']``."""
    bank, enable, write = rng.randint(0, 1), rng.random() < 0.8, rng.random() < 0.3
    wbank, wdata = rng.randint(0, 1), state["next_weight"]()
    for port, value in ((dut.x_in, x), (dut.psum_in, psum), (dut.bank_in, bank),
                        (dut.format_in, fmt), (dut.enable, enable), (dut.weight_we, write),
                        (dut.weight_bank, wbank), (dut.weight_data, wdata)):
        ctx.set(port, value)
    if enable:
        state["out"] = (state["mac"](psum, x, state["weights"][bank], fmt), x, bank, fmt)
    if write:
        state["weights"][wbank] = wdata


def _sext(bits):
    return ((bits & 0xFF) ^ 0x80) - 0x80


@pytest.mark.parametrize("in_bits, acc_bits, formats", [
    (8, 16, ("int8",)),
    (16, 32, ALL),
], ids=["int8-only-acc16", "mixed"])
def test_int8_mac_banks_and_enable(in_bits, acc_bits, formats):
    """int8: ``psum + sext(x[7:0]) * sext(w[7:0])`` wrapped to acc_bits; on a 16-bit build
    the high byte of the raw elements is ignored."""
    dut = ProcessingElement(in_bits=in_bits, acc_bits=acc_bits, formats=formats)
    rng = random.Random(3)
    top = 1 << (acc_bits - 1)

    def step(ctx, state, _):
        state["next_weight"] = lambda: rng.randrange(1 << in_bits)
        state["mac"] = lambda psum, x, w, fmt: int(mac(psum, _sext(x), _sext(w), acc_bits))
        _drive(ctx, dut, state, rng, x=rng.randrange(1 << in_bits),
               psum=rng.randint(-top, top - 1), fmt=0)

    checked = _run(dut, 400, step)
    assert min(checked) < -top // 2 and max(checked) > top // 2   # the wrapped range used


def _as_signed32(code):
    return code - (1 << 32) if code & (1 << 31) else code


def _float_operands(rng, fmt, n):
    """``n`` (x, weight, psum) triples: x and weight from the multiplier testbench's corner
    generator (specials, subnormals, overflow and underflow products, ties), psum an FP32
    special (zeros, infinities, NaNs, extremes) or the negated product (cancellation) or a
    random code."""
    element = numerics.data_format(fmt).element
    a, b = random_operands(fmt, rng, n)
    specials = np.concatenate([np.array(SPECIAL_CODES, np.int64),
                               np.array(SPECIAL_CODES, np.int64) | (1 << 31)])
    roll = rng.random(n)
    products = mac_float(0, b, a, fmt).astype(np.int64)
    psum = np.where(roll < 0.3, rng.choice(specials, n),
                    np.where(roll < 0.5, products ^ (1 << 31),
                             rng.integers(0, 1 << 32, n)))
    edge = special_codes(element)
    pick = rng.random(n) < 0.15
    a = np.where(pick, rng.choice(edge, n), a)
    return list(zip(b.tolist(), a.tolist(), psum.tolist(), strict=True))


@pytest.mark.parametrize("fmt", FLOATS)
def test_float_mac(fmt):
    """A float format: ``fp_add32(psum, fp_mul(weight, x))``, bit for bit, with the corner
    operands; the weights keep random bits above the format's width (ignored), and int8
    elements are interleaved (the format travels with every element)."""
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL)
    rng = random.Random(5)
    nrng = np.random.default_rng(list(fmt.encode()))
    code = numerics.data_format(fmt).code
    width = numerics.data_format(fmt).element.bits
    triples = _float_operands(nrng, fmt, 600)
    high = (1 << 16) - (1 << width)           # bits above the format's width

    def expected(psum, x, w, f):
        if f == 0:
            return int(mac(_as_signed32(psum & 0xFFFF_FFFF), _sext(x), _sext(w), 32))
        mask = (1 << width) - 1
        return _as_signed32(int(mac_float(psum & 0xFFFF_FFFF, x & mask, w & mask, fmt)))

    def step(ctx, state, index):
        x, w, psum = triples[index]
        # The weight written now is used by later elements: the next triple's weight.
        upcoming = triples[min(index + 1, len(triples) - 1)][1]
        state["next_weight"] = lambda: upcoming | (rng.randrange(1 << 16) & high)
        state["mac"] = expected
        is_int = rng.random() < 0.15
        _drive(ctx, dut, state, rng, x=rng.randrange(1 << 16) if is_int else x,
               psum=_as_signed32(psum), fmt=0 if is_int else code)

    checked = _run(dut, len(triples), step)
    codes = [value & 0xFFFF_FFFF for value in checked]
    # The specials came out: NaN, both infinities, both zeros.
    assert numerics.CANONICAL_NAN32 in codes
    assert {0x7F800000, 0xFF800000, 0, 0x80000000} <= set(codes)


@pytest.mark.parametrize("fmt", FLOATS)
def test_float_specials_exhaustive_products(fmt):
    """Every pair of the format's edge codes (both signs, zeros, subnormals, max finite,
    infinities, NaNs) with psum +0, -0 and +inf, through the PE."""
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL)
    edge = special_codes(numerics.data_format(fmt).element).tolist()
    pairs = [(x, w, psum) for x in edge for w in edge
             for psum in (0, 0x80000000, 0x7F800000)]
    code = numerics.data_format(fmt).code

    async def bench(ctx):
        ctx.set(dut.enable, 1)
        for x, w, psum in pairs:
            ctx.set(dut.weight_we, 1)
            ctx.set(dut.weight_bank, 1)
            ctx.set(dut.weight_data, w)
            await ctx.tick()
            ctx.set(dut.weight_we, 0)
            ctx.set(dut.x_in, x)
            ctx.set(dut.bank_in, 1)
            ctx.set(dut.format_in, code)
            ctx.set(dut.psum_in, _as_signed32(psum))
            await ctx.tick()
            want = int(mac_float(psum, x, w, fmt))
            assert ctx.get(dut.psum_out) & 0xFFFF_FFFF == want, (hex(x), hex(w), hex(psum))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def _submodules(dut):
    """The names of the submodules ``dut`` elaborates into."""
    return sorted(name for _, name, _ in Fragment.get(dut, None).subfragments)


def test_int8_only_build_has_no_float_units():
    assert _submodules(ProcessingElement(in_bits=8, acc_bits=32)) == []
    assert _submodules(ProcessingElement(in_bits=16, acc_bits=32, formats=ALL)) == \
        ["adder", "multiplier"]
    # An FP8-only float build: 8-bit elements, a multiplier sized for FP8 alone.
    dut = ProcessingElement(in_bits=8, acc_bits=32, formats=("int8", "fp8e4m3"))
    assert _submodules(dut) == ["adder", "multiplier"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"formats": "int8"}, TypeError, r"formats='int8': must be a non-empty tuple"),
    ({"formats": ()}, TypeError, r"formats=\(\): must be a non-empty tuple"),
    ({"formats": ("int8", "mxfp8e4m3")}, ValueError,
     r"formats: 'mxfp8e4m3' is not a format the PE implements"),
    ({"formats": ("int8", "int8")}, ValueError, "names a format more than once"),
    ({"formats": ("bf16",), "in_bits": 16}, ValueError, "must include int8"),
    ({"formats": ("int8", "bf16")}, ValueError, r"in_bits=8: must be at least 16"),
    ({"acc_bits": 12}, ValueError, r"acc_bits=12: must be at least 16"),
    ({"formats": ("int8", "fp8e5m2"), "acc_bits": 24}, ValueError,
     r"acc_bits=24: must be 32 \(FP32 sums\) with the float format fp8e5m2"),
])
def test_refuses_bad_parameters(kwargs, error, message):
    args = {"in_bits": 8, "acc_bits": 32, **kwargs}
    with pytest.raises(error, match=message):
        ProcessingElement(**args)
