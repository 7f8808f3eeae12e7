"""The processing element on Amaranth's own simulator, against the golden ``mac`` (int8) and
``mac_float`` (BF16, FP8, MXFP8 with its E8M0 scales), bit for bit."""

import random

import numpy as np
import pytest
from amaranth.hdl import Fragment, Shape, unsigned
from amaranth.sim import Simulator

from opentrn import numerics
from opentrn.golden.processing_element import mac, mac_float, mac_packed
from opentrn.hdl.processing_element import ProcessingElement
from opentrn.sim.tb_fp_adder import SPECIAL_CODES
from opentrn.sim.tb_fp_multiplier import random_operands, random_scales, special_codes

FLOATS = ("bf16", "fp8e4m3", "fp8e5m2")
ALL = ("int8", *FLOATS)
MX = ("mxfp8e4m3", "mxfp8e5m2")
ALL_MX = (*ALL, *MX)
#: E8M0 codes at the edges: the smallest, 1, 2**0, the largest, the NaN.
EDGE_SCALES = (0, 1, 127, 254, 255)


def _outputs(dut):
    """The registered outputs of ``dut`` (``x_scale_out`` last, in an MX build)."""
    ports = [dut.psum_out, dut.x_out, dut.bank_out, dut.format_out]
    return ports + ([dut.x_scale_out] if hasattr(dut, "x_scale_out") else [])


def _run(dut, steps, bench_step):
    """Drive ``steps`` random cycles through ``bench_step(ctx, state)`` (returns the expected
    registered outputs) and check them after every clock edge."""
    checked = []
    outputs = _outputs(dut)

    async def bench(ctx):
        state = {"weights": [0, 0], "scales": [0, 0], "out": (0,) * len(outputs)}
        for step in range(steps):
            bench_step(ctx, state, step)
            await ctx.tick()
            got = tuple(ctx.get(port) for port in outputs)
            assert got == state["out"], (step, got, state["out"])
            checked.append(state["out"][0])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return checked


def _drive(ctx, dut, state, rng, *, x, psum, fmt, x_scale=None):
    """Set the inputs (a random bank, enable and weight write), and update ``state`` with
    what the PE registers at the clock edge; the expected sum comes from ``state['mac']``
    (called with the weight's scale and ``x_scale`` in an MX build). In an MX build the
    weight written comes with the scale ``state['next_scale']()``."""
    bank, enable, write = rng.randint(0, 1), rng.random() < 0.8, rng.random() < 0.3
    wbank, wdata = rng.randint(0, 1), state["next_weight"]()
    ports = [(dut.x_in, x), (dut.psum_in, psum), (dut.bank_in, bank), (dut.format_in, fmt),
             (dut.enable, enable), (dut.weight_we, write), (dut.weight_bank, wbank),
             (dut.weight_data, wdata)]
    mx = x_scale is not None
    if mx:
        wscale = state["next_scale"]()
        ports += [(dut.x_scale_in, x_scale), (dut.weight_scale, wscale)]
    for port, value in ports:
        ctx.set(port, value)
    if enable:
        if mx:
            total = state["mac"](psum, x, state["weights"][bank], fmt,
                                 state["scales"][bank], x_scale)
            state["out"] = (total, x, bank, fmt, x_scale)
        else:
            state["out"] = (state["mac"](psum, x, state["weights"][bank], fmt), x, bank, fmt)
    if write:
        state["weights"][wbank] = wdata
        if mx:
            state["scales"][wbank] = wscale


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


def _mx_operands(rng, fmt, n):
    """``n`` (x, weight, psum, x_scale, weight_scale) of the MX format ``fmt``: the
    operands of :func:`_float_operands` (its element format's corners), the scales from the
    multiplier testbench's corner generator (subnormal ties, underflow, overflow, 255,
    unscaled) or, one in three, edge scales (0, 1, 127, 254, 255) each."""
    element = numerics.data_format(fmt).element
    triples = _float_operands(rng, element.name, n)
    x, w, _ = (np.array(column, np.int64) for column in zip(*triples, strict=True))
    scale_w, scale_x = random_scales(fmt, rng, w, x)
    edge = rng.random(n) < 1 / 3
    scale_w = np.where(edge, rng.choice(EDGE_SCALES, n), scale_w)
    scale_x = np.where(edge, rng.choice(EDGE_SCALES, n), scale_x)
    # One psum in twenty -0: with a product that underflows to -0, the sum is -0.
    psum = np.where(rng.random(n) < 0.05, 0x8000_0000, [psum for _, _, psum in triples])
    return [(int(x), int(w), int(p), int(sx), int(sw))
            for x, w, p, sx, sw in zip(x, w, psum, scale_x, scale_w, strict=True)]


@pytest.mark.parametrize("fmt", MX)
def test_mx_mac(fmt):
    """An MX format: ``fp_add32(psum, fp_mul(weight, x) * 2**(sw + sx - 254))``, bit for
    bit, with the corner operands and scales; ``sw`` is the scale written with the weight
    into its bank (the two banks hold different ones), ``sx`` the one that comes with
    ``x`` and leaves with it (``x_scale_out``). int8, BF16 and FP8 elements are
    interleaved: they ignore both scales."""
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL_MX)
    rng = random.Random(7)
    nrng = np.random.default_rng(list(fmt.encode()))
    code = numerics.data_format(fmt).code
    width = numerics.data_format(fmt).element.bits
    mask = (1 << width) - 1
    operands = _mx_operands(nrng, fmt, 800)
    high = (1 << 16) - (1 << width)           # bits above the format's width
    others = {name: _float_operands(nrng, name, 800) for name in FLOATS}
    seen = {"formats": set(), "scales": set()}

    def expected(psum, x, w, f, scale_w, scale_x):
        psum &= 0xFFFF_FFFF
        seen["formats"].add(f)
        if f == 0:
            return int(mac(_as_signed32(psum), _sext(x), _sext(w), 32))
        name = numerics.format_of_code(f).name
        if name in MX:
            seen["scales"] |= {scale_w, scale_x}
            return _as_signed32(int(mac_float(psum, x & mask, w & mask, name,
                                              scale_weight=scale_w, scale_x=scale_x)))
        bits = (1 << numerics.data_format(name).element.bits) - 1
        return _as_signed32(int(mac_float(psum, x & bits, w & bits, name)))

    def step(ctx, state, index):
        x, w, psum, scale_x, _ = operands[index]
        # The weight (and its scale) written now is used by later elements: the next
        # operands' weight.
        upcoming = operands[min(index + 1, len(operands) - 1)]
        state["next_weight"] = lambda: upcoming[1] | (rng.randrange(1 << 16) & high)
        state["next_scale"] = lambda: upcoming[4]
        state["mac"] = expected
        roll = rng.random()
        if roll < 0.1:
            x, f = rng.randrange(1 << 16), 0
        elif roll < 0.25:
            name = rng.choice(FLOATS)
            x, _, psum = others[name][index]
            f = numerics.data_format(name).code
        else:
            f = code
        _drive(ctx, dut, state, rng, x=x, psum=_as_signed32(psum), fmt=f,
               x_scale=rng.choice(EDGE_SCALES) if f != code and roll < 0.2 else scale_x)

    checked = _run(dut, len(operands), step)
    codes = [value & 0xFFFF_FFFF for value in checked]
    assert seen["formats"] == {numerics.data_format(name).code for name in ALL + (fmt,)}
    assert set(EDGE_SCALES) <= seen["scales"]
    # The specials came out: NaN, both infinities, both zeros, FP32 subnormals.
    assert numerics.CANONICAL_NAN32 in codes
    assert {0x7F800000, 0xFF800000, 0, 0x80000000} <= set(codes)
    assert any(0 < code & 0x7FFF_FFFF < 0x0080_0000 for code in codes)


@pytest.mark.parametrize("fmt", MX)
def test_mx_specials_exhaustive_products(fmt):
    """Every pair of the element format's edge codes, each with the pairs of edge scales
    (0, 1, 127, 254, 255) in turn and psum +0, -0 or +inf, through the PE: the weight in
    one bank, the other bank holding another weight and scale."""
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL_MX)
    edge = special_codes(numerics.data_format(fmt).element).tolist()
    scale_pairs = [(sw, sx) for sw in EDGE_SCALES for sx in EDGE_SCALES]
    cases = [(x, w, *scale_pairs[index % len(scale_pairs)], (0, 0x80000000, 0x7F800000)[index % 3])
             for index, (x, w) in enumerate((x, w) for x in edge for w in edge)]
    code = numerics.data_format(fmt).code
    one = int(numerics.to_bits(np.float32(1.0), numerics.data_format(fmt).element))
    results = set()

    async def bench(ctx):
        ctx.set(dut.enable, 1)
        for index, (x, w, scale_w, scale_x, psum) in enumerate(cases):
            bank = index % 2
            # The other bank: 1.0 with a scale that changes every product it would meet.
            ctx.set(dut.weight_we, 1)
            ctx.set(dut.weight_bank, 1 - bank)
            ctx.set(dut.weight_data, one)
            ctx.set(dut.weight_scale, (scale_w + 3) % 255)
            await ctx.tick()
            ctx.set(dut.weight_bank, bank)
            ctx.set(dut.weight_data, w)
            ctx.set(dut.weight_scale, scale_w)
            await ctx.tick()
            ctx.set(dut.weight_we, 0)
            ctx.set(dut.x_in, x)
            ctx.set(dut.x_scale_in, scale_x)
            ctx.set(dut.bank_in, bank)
            ctx.set(dut.format_in, code)
            ctx.set(dut.psum_in, _as_signed32(psum))
            await ctx.tick()
            want = int(mac_float(psum, x, w, fmt, scale_weight=scale_w, scale_x=scale_x))
            got = ctx.get(dut.psum_out) & 0xFFFF_FFFF
            assert got == want, (hex(x), hex(w), scale_w, scale_x, hex(psum), hex(got))
            assert ctx.get(dut.x_scale_out) == scale_x
            results.add(got)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert len(cases) == len(edge) ** 2
    assert {numerics.CANONICAL_NAN32, 0x7F800000, 0xFF800000, 0, 0x80000000} <= results


def test_mx_banks_keep_their_scales():
    """Directed, per MX format: both banks hold 1.0, with scales 127 and 130; elements of
    1.0 alternate between the banks with scales 127, 1 and 254, an int8 element between
    them (its scale, 255, ignored); then the E8M0 NaN and a zero. Each product is exactly
    ``2**(sw + sx - 254)`` (``2**-126``, the smallest normal, down to it; ``2**130``
    overflows to infinity)."""
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL_MX)
    fp32 = lambda value: int(numerics.to_bits(value, "fp32"))  # noqa: E731
    bank_scales = (127, 130)

    async def bench(ctx):
        ctx.set(dut.enable, 1)
        ctx.set(dut.psum_in, 0)
        for fmt in MX:
            one = int(numerics.to_bits(1.0, numerics.data_format(fmt).element))
            code = numerics.data_format(fmt).code
            ctx.set(dut.weight_we, 1)
            for bank, scale in enumerate(bank_scales):
                ctx.set(dut.weight_bank, bank)
                ctx.set(dut.weight_data, one)
                ctx.set(dut.weight_scale, scale)
                await ctx.tick()
            ctx.set(dut.weight_we, 0)
            steps = []                      # (x, format, bank, x_scale, expected psum_out)
            for scale_x in (127, 1, 254):
                for bank, scale_w in enumerate(bank_scales):
                    steps.append((one, code, bank, scale_x,
                                  fp32(2.0 ** (scale_w + scale_x - 254))))
                steps.append((3, 0, 1, 255, 3 * one))       # int8: 3 * sext(one)
            steps += [(one, code, 0, 255, numerics.CANONICAL_NAN32),
                      (0, code, 1, 0, 0)]                   # +0 * 2**-124
            for x, fmt_code, bank, scale_x, want in steps:
                ctx.set(dut.x_in, x)
                ctx.set(dut.format_in, fmt_code)
                ctx.set(dut.bank_in, bank)
                ctx.set(dut.x_scale_in, scale_x)
                await ctx.tick()
                assert (ctx.get(dut.psum_out) & 0xFFFF_FFFF, ctx.get(dut.x_scale_out)) == \
                    (want, scale_x), (fmt, x, fmt_code, bank, scale_x)

    assert int(numerics.to_bits(2.0 ** -126, "fp32")) == 0x0080_0000
    assert int(numerics.to_bits(2.0 ** 130, "fp32")) == 0x7F80_0000
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


def test_scale_ports_only_with_an_mx_format():
    """The E8M0 scale ports exist only in a build with an MX format."""
    scale_ports = {"x_scale_in", "x_scale_out", "weight_scale"}
    for formats, in_bits in ((("int8",), 8), (ALL, 16), (("int8", "fp8e4m3"), 8)):
        dut = ProcessingElement(in_bits=in_bits, acc_bits=32, formats=formats)
        assert not set(dut.signature.members) & scale_ports, formats
        Fragment.get(dut, None)          # elaborated: not an unused elaboratable
    for formats in (("int8", "mxfp8e4m3"), ("int8", "mxfp8e5m2"), ALL_MX):
        dut = ProcessingElement(in_bits=16, acc_bits=32, formats=formats)
        assert scale_ports <= set(dut.signature.members)
        assert [dut.signature.members[name].flow.name for name in sorted(scale_ports)] == \
            ["In", "In", "Out"]
        assert all(Shape.cast(dut.signature.members[name].shape) == unsigned(8)
                   for name in scale_ports)
        assert _submodules(dut) == ["adder", "multiplier"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"formats": "int8"}, TypeError, r"formats='int8': must be a non-empty tuple"),
    ({"formats": ()}, TypeError, r"formats=\(\): must be a non-empty tuple"),
    ({"formats": ("int8", "fp32")}, ValueError,
     r"formats: 'fp32' is not a format the PE implements"),
    ({"formats": ("int8", "mxfp8e4m3"), "acc_bits": 16}, ValueError,
     r"acc_bits=16: must be 32 \(FP32 sums\) with the float format mxfp8e4m3"),
    ({"formats": ("int8", "int8")}, ValueError, "names a format more than once"),
    ({"formats": ("int8", "bf16")}, ValueError, r"in_bits=8: must be at least 16"),
    ({"formats": ("fp8e4m3",), "macs": {"fp8e4m3": 4}}, ValueError,
     r"in_bits=8: must be at least 32, the width of the widest column of formats"),
    ({"formats": ("int8",), "macs": {"bf16": 2}}, ValueError,
     r"macs: 'bf16' is not among formats=\('int8',\)"),
    ({"formats": ("int8",), "macs": {"int8": 3}, "in_bits": 32}, ValueError,
     r"macs\['int8'\]=3: must be a power of two from 1 to 16"),
    ({"formats": ("int8",), "macs": ["int8:2"]}, TypeError,
     r"macs=\['int8:2'\]: must be a dict of format name: MACs per cycle"),
    ({"acc_bits": 12}, ValueError, r"acc_bits=12: must be at least 16"),
    ({"formats": ("int8", "fp8e5m2"), "acc_bits": 24}, ValueError,
     r"acc_bits=24: must be 32 \(FP32 sums\) with the float format fp8e5m2"),
])
def test_refuses_bad_parameters(kwargs, error, message):
    args = {"in_bits": 8, "acc_bits": 32, **kwargs}
    with pytest.raises(error, match=message):
        ProcessingElement(**args)


def test_add_stages_refused_with_packed_macs():
    with pytest.raises(ValueError, match=r"add_stages=5: must be an integer from 0 to 4"):
        ProcessingElement(in_bits=16, acc_bits=32, formats=ALL, add_stages=5)
    with pytest.raises(ValueError, match=r"add_stages=1: needs one MAC per cycle in every "
                                         r"format, not 2 in fp8e4m3"):
        ProcessingElement(in_bits=16, acc_bits=32, formats=("fp8e4m3",),
                          macs={"fp8e4m3": 2}, add_stages=1)


@pytest.mark.parametrize("multiply_stages, add_stages", [(0, 1), (1, 2), (2, 1), (3, 1),
                                                          (4, 3)])
def test_stages_delay_the_sum(multiply_stages, add_stages):
    """With ``S`` multiply and ``A`` add stages, an element's product meets the partial sum
    that arrives ``S`` advances after it and their sum leaves ``A + 1`` advances after that
    (``x_out`` still one advance after ``x_in``), bit for bit, with every format and a
    random enable (a stalled PE holds every stage)."""
    stages = multiply_stages + add_stages
    dut = ProcessingElement(in_bits=16, acc_bits=32, formats=ALL,
                            multiply_stages=multiply_stages, add_stages=add_stages)
    rng = random.Random(11)
    nrng = np.random.default_rng(11)
    steps = []                  # per advance: (x, weight, format, psum)
    for fmt in ("int8", *FLOATS):
        code = numerics.data_format(fmt).code
        if fmt == "int8":
            triples = [(rng.randrange(1 << 16), rng.randrange(1 << 16),
                        rng.randint(-(1 << 31), (1 << 31) - 1)) for _ in range(80)]
        else:
            triples = [(w, x, _as_signed32(p)) for x, w, p in _float_operands(nrng, fmt, 150)]
        steps += [(x, w, code, psum) for x, w, psum in triples]
    rng.shuffle(steps)          # formats interleaved: each element's travels with it

    def expected(x, w, code, psum):
        if code == 0:
            return int(mac(psum, _sext(x), _sext(w), 32))
        fmt = next(name for name in FLOATS if numerics.data_format(name).code == code)
        mask = (1 << numerics.data_format(fmt).element.bits) - 1
        return _as_signed32(int(mac_float(psum & 0xFFFF_FFFF, x & mask, w & mask, fmt)))

    results = {"checked": 0, "held": 0}

    async def bench(ctx):
        advanced = 0
        last = None
        while advanced < len(steps) + stages + 1:
            enable = rng.random() < 0.75
            x, w, code, _ = steps[min(advanced, len(steps) - 1)]
            # The partial sum for the element S advances back.
            psum = steps[advanced - multiply_stages][3] \
                if 0 <= advanced - multiply_stages < len(steps) else 0
            ctx.set(dut.enable, 0)                  # the element's weight, into bank 0
            ctx.set(dut.weight_we, 1)
            ctx.set(dut.weight_bank, 0)
            ctx.set(dut.weight_data, w)
            await ctx.tick()
            ctx.set(dut.weight_we, 0)
            for port, value in ((dut.x_in, x), (dut.bank_in, 0), (dut.format_in, code),
                                (dut.psum_in, psum), (dut.enable, enable)):
                ctx.set(port, value)
            await ctx.tick()
            got = ctx.get(dut.psum_out)
            if not enable:
                results["held"] += got == last
                continue
            advanced += 1
            done = advanced - 1 - stages    # the element whose sum shows now
            if 0 <= done < len(steps):
                x, w, code, _ = steps[done]
                assert got == expected(x, w, code, steps[done][3]), (done, got)
                results["checked"] += 1
            last = got

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert results["checked"] == len(steps) and results["held"] > 50, results


# -- several MACs per cycle (Config.pe_macs_per_cycle) -------------------------------------------

#: A Trainium3-like PE: no int8, FP8 "double row" (2 MACs per cycle), MXFP8 at 4.
TRN3_LIKE = ("bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")
TRN3_MACS = {"fp8e4m3": 2, "mxfp8e4m3": 4, "mxfp8e5m2": 4}


def _pack(values, bits):
    return sum(int(v) << (i * bits) for i, v in enumerate(values))


@pytest.mark.parametrize("formats, macs", [
    (TRN3_LIKE, TRN3_MACS),
    (("int8", "bf16", "fp8e5m2"), {"int8": 4, "bf16": 2, "fp8e5m2": 2}),
], ids=["trn3-like", "int8x4-bf16x2"])
def test_packed_macs(formats, macs):
    """``macs[F]`` elements of K per cycle: ``acc = psum``, then ``acc + w_j * x_j`` for each
    field ``j`` in order (int8: the exact sum of the products, wrapped), bit for bit against
    :func:`~opentrn.golden.processing_element.mac_packed`, with the corner operands of
    :func:`_float_operands` in every lane, the formats interleaved (so lanes a format does
    not use see other formats' bits) and, for MX, one scale per operand shared by the
    lanes. Every format's lanes must matter: the packed result differs from the first lane
    alone in at least a quarter of the steps (the corner operands make many results NaN,
    infinite or zero whatever the other lanes hold; a lane not wired in would differ in
    none)."""
    rates = {name: macs.get(name, 1) for name in formats}
    in_bits = max(rates[f] * numerics.data_format(f).bytes * 8 for f in formats)
    dut = ProcessingElement(in_bits=in_bits, acc_bits=32, formats=formats, macs=macs)
    assert dut.macs == rates
    mx = any(numerics.data_format(f).mx for f in formats)
    rng = random.Random(11)
    nrng = np.random.default_rng(11)
    steps = 900
    plan = [rng.choice(formats) for _ in range(steps)]
    seen = {name: 0 for name in formats}
    differs = {name: 0 for name in formats}

    def operands(fmt):
        """Raw x and w of ``rate`` elements each, a psum, and MX scales."""
        rate = rates[fmt]
        data = numerics.data_format(fmt)
        if data.element is None:
            xs = [rng.randrange(256) for _ in range(rate)]
            ws = [rng.randrange(256) for _ in range(rate)]
            return _pack(xs, 8), _pack(ws, 8), rng.randrange(1 << 32), None, None
        triples = _float_operands(nrng, data.element.name, rate)
        bits = data.element.bits
        xs, ws = [t[0] for t in triples], [t[1] for t in triples]
        scales = (rng.choice(EDGE_SCALES + (120, 131)), rng.choice(EDGE_SCALES + (124, 129)))
        return _pack(xs, bits), _pack(ws, bits), triples[0][2], *scales

    cases = [operands(fmt) for fmt in plan]

    async def bench(ctx):
        ctx.set(dut.enable, 1)
        for fmt, (x, w, psum, scale_x, scale_w) in zip(plan, cases, strict=True):
            ctx.set(dut.weight_we, 1)
            ctx.set(dut.weight_bank, 0)
            # Random bits above the format's fields: a packed column never reads them.
            width = rates[fmt] * numerics.data_format(fmt).bytes * 8
            ctx.set(dut.weight_data, w | (rng.randrange(1 << in_bits) >> width << width))
            if mx:
                ctx.set(dut.weight_scale, scale_w or 0)
            await ctx.tick()
            ctx.set(dut.weight_we, 0)
            ctx.set(dut.x_in, x | (rng.randrange(1 << in_bits) >> width << width))
            ctx.set(dut.bank_in, 0)
            ctx.set(dut.format_in, numerics.data_format(fmt).code)
            ctx.set(dut.psum_in, _as_signed32(psum))
            if mx:
                ctx.set(dut.x_scale_in, scale_x or 0)
            await ctx.tick()
            scales = {}
            if numerics.data_format(fmt).mx:
                scales = {"scale_weight": scale_w, "scale_x": scale_x}
            want = int(mac_packed(psum, x, w, fmt, macs=rates[fmt], **scales)) & 0xFFFF_FFFF
            got = ctx.get(dut.psum_out) & 0xFFFF_FFFF
            assert got == want, (fmt, hex(x), hex(w), hex(psum), hex(got), hex(want))
            seen[fmt] += 1
            first = int(mac_packed(psum, x & 0xFF if numerics.data_format(fmt).bytes == 1
                                   else x & 0xFFFF, w, fmt, macs=1, **scales)) & 0xFFFF_FFFF
            differs[fmt] += got != first

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert all(count > 50 for count in seen.values()), seen
    for fmt, rate in rates.items():
        if rate > 1:
            assert differs[fmt] > seen[fmt] // 4, (fmt, differs[fmt], seen[fmt])


def test_lanes_of_a_build():
    """Lane ``j`` has a multiplier built for the float formats with more than ``j`` MACs per
    cycle, and an adder; no integer path without int8."""
    dut = ProcessingElement(in_bits=32, acc_bits=32, formats=TRN3_LIKE, macs=TRN3_MACS)
    assert _submodules(dut) == ["adder", "adder_1", "adder_2", "adder_3", "multiplier",
                                "multiplier_1", "multiplier_2", "multiplier_3"]
    fragment = Fragment.get(ProcessingElement(in_bits=32, acc_bits=32, formats=TRN3_LIKE,
                                              macs=TRN3_MACS), None)
    multipliers = {name: sub for sub, name, _ in fragment.subfragments
                   if name.startswith("multiplier")}
    assert set(multipliers) == {"multiplier", "multiplier_1", "multiplier_2", "multiplier_3"}
