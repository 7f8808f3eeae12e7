"""A block of processing elements (:mod:`opentrn.hdl.processing_element_array`) on Amaranth's
simulator against its golden model, every output every cycle: blocks of one row, of one
column and of several of each (the halving down to PEs), formats at 1, 2 and 4 MACs per PE
per cycle, with and without int8, elements of every format interleaved, random enables and
weight writes."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import numerics
from opentrn.golden.processing_element_array import ProcessingElementArray as Model
from opentrn.hdl.processing_element_array import ProcessingElementArray
from opentrn.sim.tb_tensor_engine import float_codes


def _pack(values, bits):
    """Fields of ``bits`` bits side by side, the first lowest."""
    return sum(int(v) << (i * bits) for i, v in enumerate(values))


def _element(rng, nrng, fmt, rate):
    """Raw bits of one column of ``fmt``: ``rate`` random elements (int8 values, float codes
    with the formats' edge values)."""
    data = numerics.data_format(fmt)
    if data.element is None:
        return _pack([rng.randrange(256) for _ in range(rate)], 8)
    return _pack(float_codes(nrng, fmt, rate), data.element.bits)


@pytest.mark.parametrize("rows, cols, formats, macs, banks, writes", [
    (1, 2, ("int8", "bf16"), {}, 2, 1),
    (2, 1, ("int8", "fp8e4m3", "mxfp8e4m3"), {"mxfp8e4m3": 4}, 2, 1),
    (4, 2, ("bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"),
     {"fp8e4m3": 2, "mxfp8e4m3": 4, "mxfp8e5m2": 4}, 2, 1),
    (2, 4, ("int8", "bf16", "fp8e5m2"), {"int8": 2, "bf16": 2}, 2, 1),
    # The two-column fast weight load: three banks, two columns a write.
    (1, 2, ("int8", "mxfp8e4m3"), {}, 3, 2),
    (2, 4, ("int8", "bf16", "mxfp8e5m2"), {"mxfp8e5m2": 4}, 3, 2),
], ids=["1x2-int8-bf16", "2x1-mx4", "4x2-trn3-like", "2x4-int8x2-bf16x2",
        "1x2-3banks-pairs-mx", "2x4-3banks-pairs"])
def test_block_against_the_golden_model(rows, cols, formats, macs, banks, writes):
    rates = {name: macs.get(name, 1) for name in formats}
    in_bits = max(rates[f] * numerics.data_format(f).bytes * 8 for f in formats)
    dut = ProcessingElementArray(rows=rows, cols=cols, in_bits=in_bits, acc_bits=32,
                                 formats=formats, macs=macs, banks=banks,
                                 write_columns=writes)
    model = Model(rows=rows, cols=cols, formats=formats, macs=macs, banks=banks,
                  write_columns=writes)
    bank_bits = (banks - 1).bit_length()
    mx = "x_scale_in" in dut.signature.members
    rng = random.Random(rows * 10 + cols)
    nrng = np.random.default_rng(rows * 10 + cols)
    seen = {"formats": set(), "checked": 0}

    def field(bus, index, width):
        return (bus >> (index * width)) & ((1 << width) - 1)

    async def bench(ctx):
        for _ in range(250):
            fmts = [rng.choice(formats) for _ in range(rows)]
            inputs = {
                "enable": int(rng.random() < 0.85),
                "x_in": [_element(rng, nrng, f, rates[f]) for f in fmts],
                "bank_in": [rng.randrange(banks) for _ in range(rows)],
                "format_in": [numerics.data_format(f).code for f in fmts],
                "psum_in": [int(c) for c in float_codes(nrng, "bf16", cols)]
                if rng.random() < 0.5 else [rng.randrange(1 << 32) for _ in range(cols)],
                # Each row writes its own column and bank (the tensor engine skews them).
                "weight_we": [int(rng.random() < 0.3) for _ in range(rows)],
                "weight_bank": [rng.randrange(banks) for _ in range(rows)],
                "weight_data": [[_element(rng, nrng, rng.choice(formats), in_bits // 8)
                                 & ((1 << in_bits) - 1) for _ in range(writes)]
                                for _ in range(rows)],
            }
            if cols > writes:
                inputs["weight_column"] = [rng.randrange(cols // writes) for _ in range(rows)]
            if mx:
                inputs["x_scale_in"] = [rng.choice((0, 1, 127, 120, 130, 254, 255))
                                        for _ in range(rows)]
                inputs["weight_scale"] = [[rng.choice((0, 127, 121, 133, 255))
                                           for _ in range(writes)] for _ in range(rows)]
            seen["formats"] |= set(fmts)
            widths = {"x_in": in_bits, "bank_in": bank_bits, "format_in": 3, "psum_in": 32,
                      "weight_we": 1, "weight_bank": bank_bits,
                      "weight_column": (cols // writes - 1).bit_length(),
                      "weight_data": in_bits, "x_scale_in": 8, "weight_scale": 8}
            for name, value in inputs.items():
                if isinstance(value, list):
                    # Per-row groups (a write's columns) flatten row by row, first lowest.
                    flat = [v for item in value
                            for v in (item if isinstance(item, list) else [item])]
                    value = _pack(flat, widths[name])
                ctx.set(getattr(dut, name), value)
            await ctx.tick()
            model.clock(**{name: value for name, value in inputs.items()})
            want = model.outputs()
            got = {"psum_out": [field(ctx.get(dut.psum_out), c, 32) for c in range(cols)],
                   "x_out": [field(ctx.get(dut.x_out), r, in_bits) for r in range(rows)],
                   "bank_out": [field(ctx.get(dut.bank_out), r, bank_bits) for r in range(rows)],
                   "format_out": [field(ctx.get(dut.format_out), r, 3) for r in range(rows)]}
            if mx:
                got["x_scale_out"] = [field(ctx.get(dut.x_scale_out), r, 8)
                                      for r in range(rows)]
            for name, values in got.items():
                assert values == [int(v) for v in want[name]], (name, values, want[name])
            seen["checked"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen["checked"] == 250 and seen["formats"] == set(formats)


@pytest.mark.parametrize("kwargs, message", [
    ({"rows": 3, "cols": 2}, r"rows=3: must be a power of two"),
    ({"rows": 2, "cols": 0}, r"cols=0: must be a power of two"),
    ({"rows": 2, "cols": 2, "formats": ("int8", "int8")}, r"names a format more than once"),
    ({"rows": 2, "cols": 1, "write_columns": 2}, r"write_columns=2: must be 1 or 2, at most "
                                                 r"cols=1"),
    ({"rows": 2, "cols": 2, "banks": 1}, r"banks=1: must be an integer from 2 to 4"),
])
def test_refuses_bad_parameters(kwargs, message):
    args = {"in_bits": 8, "acc_bits": 32, "formats": ("int8",), **kwargs}
    with pytest.raises(ValueError, match=message):
        ProcessingElementArray(**args)
