"""The floating-point multiplier RTL under cocotb on both simulators: every FP8 x FP8 product
of both FP8 formats, every pair again for the MX formats with corner-seeking scales, 10**6
random BF16 and 10**5 random FP32 products (a tenth of those on Icarus in the suite:
tests/conftest.py, FP_VECTORS), each bit-exact against the golden model, and
the corners actually reached. Build variants (format subsets) on Amaranth's simulator."""

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from opentrn import config, numerics
from opentrn.golden import fp_multiplier as golden
from opentrn.hdl.fp_multiplier import TEST_LANES, FPMultiplier, unit_test_top
from opentrn.sim import runner
from opentrn.sim.tb_fp_multiplier import (
    random_operands,
    random_scales,
    special_codes,
)

from .conftest import FP_VECTORS, require_simulator

#: Random (BF16, FP32) products per simulator: FP_VECTORS BF16 products and a tenth as many
#: FP32 ones. Icarus evaluates a BF16 product in 100-140 us (10**6 take 100-140 s of its
#: 135-180 s run, against 30-40 s for all of Verilator's run, its build included).
RANDOM_VECTORS = {sim: (count, count // 10) for sim, count in FP_VECTORS.items()}
SEED = 3


@pytest.mark.sim
@pytest.mark.parametrize("sim", runner.SIMULATORS)
def test_fp_multiplier(sim):
    require_simulator(sim)
    bf16_vectors, fp32_vectors = RANDOM_VECTORS[sim]
    result = runner.run(config.preset("tiny"), "opentrn.sim.tb_fp_multiplier", "fp_multiplier",
                        sim, env={"OPENTRN_BF16_VECTORS": bf16_vectors,
                                  "OPENTRN_FP32_VECTORS": fp32_vectors, "OPENTRN_SEED": SEED})
    assert result.passed, f"{result.failed} of {result.tests} cocotb tests failed; {result.log}"
    records = {(r["test"], r["format"]): r for r in result.reports}
    assert set(records) == {("fp8_exhaustive", "fp8e4m3"), ("fp8_exhaustive", "fp8e5m2"),
                            ("mx", "mxfp8e4m3"), ("mx", "mxfp8e5m2"),
                            ("bf16_random", "bf16"), ("fp32_random", "fp32")}
    for record in records.values():
        assert record["mismatches"] == 0, record
    for key in ("fp8_exhaustive", "fp8e4m3"), ("fp8_exhaustive", "fp8e5m2"), \
            ("mx", "mxfp8e4m3"), ("mx", "mxfp8e5m2"):
        assert records[key]["vectors"] == 1 << 16
    assert records["bf16_random", "bf16"]["vectors"] == bf16_vectors
    assert records["fp32_random", "fp32"]["vectors"] == fp32_vectors

    # Every format where it can meet them: NaNs from NaN operands, zeros of both signs.
    for record in records.values():
        for key in ("nan_from_nan_operand", "zero_positive", "zero_negative"):
            assert record[key] > 0, (record["format"], key)
    # Where rounding exists (MX, BF16, FP32): subnormal results, overflow, underflow to
    # zero, ties rounded to even both ways.
    for key in ("mx", "mxfp8e4m3"), ("mx", "mxfp8e5m2"), ("bf16_random", "bf16"), \
            ("fp32_random", "fp32"):
        for corner in ("subnormal_results", "overflow_to_inf", "underflow_to_zero", "inexact",
                       "ties_to_even_down", "ties_to_even_up"):
            assert records[key][corner] > 0, (key, corner)
    # FP32 ties in the normal range too (24 x 24-bit products).
    assert records["fp32_random", "fp32"]["ties_normal_range"] > 0
    # FP8 products without scales are exact.
    for name in ("fp8e4m3", "fp8e5m2"):
        assert records["fp8_exhaustive", name]["inexact"] == 0
    # The three sources of NaN and infinite operands, in the formats that have them.
    for key in ("fp8_exhaustive", "fp8e5m2"), ("mx", "mxfp8e5m2"), ("bf16_random", "bf16"), \
            ("fp32_random", "fp32"):
        assert records[key]["nan_from_inf_times_zero"] > 0, key
        assert records[key]["inf_from_inf_operand"] > 0, key
    for key in ("mx", "mxfp8e4m3"), ("mx", "mxfp8e5m2"):
        assert records[key]["nan_from_scale_255"] > 0, key


# -- build variants on Amaranth's simulator -----------------------------------------------

def _simulate(formats, cases, lanes=8, stages=0):
    """Run ``cases`` (``(format, a, b, scale_a, scale_b)``, each a multiple of ``lanes``
    long) through a build for ``formats`` on Amaranth's simulator; return the mismatches
    and the number of products checked. With ``stages`` a step's operands are clocked in
    (``enable`` high) and its products read after the ``stages``-th clock edge from there,
    while the next step's operands are already driven: what is read must be the operands'
    of that edge; every fourth step, with ``enable`` low, the next step's operands must not
    reach ``product``."""
    dut = FPMultiplier(formats=formats, lanes=lanes, stages=stages)
    width = len(dut.a.as_value()) // lanes
    counts = {"checked": 0, "mismatches": 0, "held": 0}

    def packed(values, bits, step):
        return sum(int(v) << (bits * lane)
                   for lane, v in enumerate(values[step * lanes:(step + 1) * lanes]))

    def drive(ctx, code, a, b, scale_a, scale_b, step):
        ctx.set(dut.format, code)
        ctx.set(dut.a.as_value(), packed(a, width, step))
        ctx.set(dut.b.as_value(), packed(b, width, step))
        if scale_a is not None:
            ctx.set(dut.scale_a.as_value(), packed(scale_a, 8, step))
            ctx.set(dut.scale_b.as_value(), packed(scale_b, 8, step))

    def check(got, expected, step):
        for lane in range(lanes):
            counts["checked"] += 1
            counts["mismatches"] += (got >> (32 * lane)) & 0xFFFFFFFF != \
                expected[step * lanes + lane]

    async def bench(ctx):
        for name, a, b, scale_a, scale_b in cases:
            code = numerics.data_format(name).code
            expected = golden.multiply(a, b, name, scale_a, scale_b)
            steps = len(a) // lanes
            if not stages:
                for step in range(steps):
                    drive(ctx, code, a, b, scale_a, scale_b, step)
                    await ctx.delay(1e-9)
                    check(ctx.get(dut.product.as_value()), expected, step)
                continue
            ctx.set(dut.enable, 1)
            for cycle in range(steps + stages - 1):
                drive(ctx, code, a, b, scale_a, scale_b, cycle % steps)
                await ctx.tick()
                # The next operands already on the inputs: the registers hold these.
                drive(ctx, code, a, b, scale_a, scale_b, (cycle + 1) % steps)
                step = cycle - (stages - 1)
                if step < 0:
                    continue
                got = ctx.get(dut.product.as_value())
                check(got, expected, step)
                if step % 4 == 3:   # a stall: the product holds
                    ctx.set(dut.enable, 0)
                    await ctx.tick()
                    counts["held"] += ctx.get(dut.product.as_value()) == got
                    ctx.set(dut.enable, 1)

    sim = Simulator(dut)
    if stages:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return counts


def _edges_and_random(format_name, rng, n):
    """Every pair of edge values of the format, then ``n`` random pairs."""
    element = numerics.data_format(format_name).element
    specials = special_codes(element)
    a, b = np.repeat(specials, specials.size), np.tile(specials, specials.size)
    if element.bits == 8:
        ra, rb = rng.integers(0, 256, n), rng.integers(0, 256, n)
    else:
        ra, rb = random_operands(format_name, rng, n)
    return np.concatenate([a, ra]), np.concatenate([b, rb])


def _cases(formats, rng, n, lanes):
    """:func:`_simulate`'s cases: each format's edge pairs and ``n`` random ones (with
    random scales for an MX format), cut to a multiple of ``lanes``."""
    cases = []
    for name in formats:
        a, b = _edges_and_random(name, rng, n)
        a, b = a[:a.size - a.size % lanes], b[:b.size - b.size % lanes]
        scales = random_scales(name, rng, a, b) if numerics.data_format(name).mx \
            else (None, None)
        cases.append((name, a, b, *scales))
    return cases


@pytest.mark.parametrize("formats", [
    ("fp8e4m3", "fp8e5m2"),            # no rounding, overflow or subnormal logic at all
    ("fp32",),                         # the activation engine's build
    ("mxfp8e5m2", "bf16"),             # scales, 8-bit significands, no FP32 rounding
])
def test_build_variants(formats):
    """Builds for subsets of the formats generate only the logic they need; each still
    equals the golden model on the edge values and random pairs of every format it has."""
    lanes = 8
    cases = _cases(formats, np.random.default_rng(7), 256, lanes)
    counts = _simulate(formats, cases, lanes)
    assert counts["checked"] == sum(case[1].size for case in cases)
    assert counts["mismatches"] == 0, counts


@pytest.mark.parametrize("formats", [
    ("fp8e4m3", "fp8e5m2"),             # exact products: no rounding logic after the cut
    ("fp32",),                          # the activation lanes' (subnormals, overflow)
    ("bf16", "mxfp8e4m3"),              # scales through the register
])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_stages(formats, stages):
    """``stages`` 1 to 3: each product ``stages`` clocks after its operands, equal to the
    golden model's on the edge values and random pairs, held while ``enable`` is low."""
    lanes = 4
    cases = _cases(formats, np.random.default_rng(11), 128, lanes)
    counts = _simulate(formats, cases, lanes, stages=stages)
    assert counts["checked"] == sum(case[1].size for case in cases)
    assert counts["mismatches"] == 0, counts
    stalls = sum(case[1].size // lanes // 4 for case in cases)
    assert counts["held"] == stalls > 0, counts


def _port_declarations(component):
    text = verilog.convert(component, name="top")
    return {line.strip() for line in text.splitlines()
            if line.strip().startswith(("input ", "output "))}


def test_ports_follow_the_formats():
    # FP8 only: 8-bit operands, no scales.
    assert _port_declarations(FPMultiplier(formats=("fp8e4m3",), lanes=3)) == {
        "input [2:0] format;", "input [23:0] a;", "input [23:0] b;",
        "output [95:0] product;"}
    # The widest format sets the operand width; an MX format adds the scales.
    assert _port_declarations(FPMultiplier(formats=("bf16", "mxfp8e4m3"), lanes=2)) == {
        "input [2:0] format;", "input [31:0] a;", "input [31:0] b;",
        "input [15:0] scale_a;", "input [15:0] scale_b;", "output [63:0] product;"}
    top = unit_test_top(config=config.preset("tiny"))
    assert top.formats == golden.FORMATS and top.lanes == TEST_LANES
    assert top.signature.members["a"].shape.size == 32 * TEST_LANES
    assert top.signature.members["scale_b"].shape.size == 8 * TEST_LANES
    Fragment.get(top, None)     # elaborates


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="lanes must be at least 1, not 0"):
        FPMultiplier(formats=("bf16",), lanes=0)
    with pytest.raises(ValueError, match="'int8' is not one of fp32, bf16"):
        FPMultiplier(formats=("int8",))
    with pytest.raises(ValueError, match="names a format more than once"):
        FPMultiplier(formats=("bf16", "bf16"))
    with pytest.raises(ValueError, match="must name at least one of"):
        FPMultiplier(formats=())
    with pytest.raises(TypeError, match="must be a tuple of format names"):
        FPMultiplier(formats="bf16")
    with pytest.raises(TypeError, match="lanes=2.0: must be an integer"):
        FPMultiplier(formats=("bf16",), lanes=2.0)
    with pytest.raises(ValueError, match="stages must be from 0 to 3, not 4"):
        FPMultiplier(formats=("bf16",), stages=4)
