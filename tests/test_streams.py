"""The testbench payload codec packs exactly as Amaranth's layouts do."""

import random

import pytest
from amaranth import signed, unsigned
from amaranth.lib import data

from opentrn import config
from opentrn.hdl.tensor_engine import moving_layout, result_layout, stationary_layout
from opentrn.sim.streams import PayloadCodec

NESTED = data.StructLayout({
    "a": signed(5),
    "rows": data.ArrayLayout(data.StructLayout({"x": unsigned(3), "y": signed(9)}), 3),
    "flag": 1,
})


def _random_value(layout, rng):
    if isinstance(layout, data.StructLayout):
        return {name: _random_value(field.shape, rng) for name, field in layout}
    if isinstance(layout, data.ArrayLayout):
        return [_random_value(layout.elem_shape, rng) for _ in range(layout.length)]
    shape = layout if hasattr(layout, "signed") else unsigned(layout)
    if shape.signed:
        return rng.randint(-(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1)
    return rng.randint(0, (1 << shape.width) - 1)


@pytest.mark.parametrize("layout", [
    NESTED,
    stationary_layout(config.preset("small")),
    moving_layout(config.preset("tiny")),
    result_layout(config.preset("small").replace(acc_bits=19)),
])
def test_codec_matches_amaranth(layout):
    codec, rng = PayloadCodec(layout), random.Random(1)
    for _ in range(300):
        value = _random_value(layout, rng)
        bits = layout.const(value).as_bits()
        assert codec.encode(value) == bits
        assert codec.decode(bits) == value


def test_codec_refuses_values_that_do_not_fit():
    codec = PayloadCodec(moving_layout(config.preset("tiny")))
    # tiny's elements are 16 raw bits (bf16 is among its formats).
    with pytest.raises(ValueError, match="65536 does not fit unsigned\\(16\\)"):
        codec.encode({"data": [1 << 16, 0, 0, 0], "swap": 0, "last": 0, "format": 0})
    with pytest.raises(ValueError, match="3 elements for an array of 4"):
        codec.encode({"data": [0, 0, 0], "swap": 0, "last": 0, "format": 0})
