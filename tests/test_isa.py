"""The instruction formats (``opentrn.isa``): encoding and decoding round-trip, the hardware
layouts put every field at its documented bits, and docs/isa.md holds the tables."""

import random
from pathlib import Path

import pytest
from amaranth.lib import data

from opentrn import isa
from opentrn.isa import Opcode


def _random_fields(rng, opcode):
    values = {}
    for f in isa.fields(opcode):
        if f.name == "opcode":
            continue
        if f.signed:
            values[f.name] = rng.randint(-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1)
        else:
            values[f.name] = rng.choice([0, (1 << f.width) - 1,
                                         rng.randint(0, (1 << f.width) - 1)])
    return values


@pytest.mark.parametrize("opcode", list(Opcode))
def test_encode_decode_round_trip(opcode):
    rng = random.Random(int(opcode))
    for _ in range(200):
        values = _random_fields(rng, opcode)
        encoded = isa.encode(opcode, **values)
        assert len(encoded) == isa.instruction_bytes(opcode)
        decoded_opcode, decoded = isa.decode(encoded)
        assert decoded_opcode == opcode
        assert decoded == values


@pytest.mark.parametrize("opcode", list(Opcode))
def test_hardware_layout_matches_the_fields(opcode):
    """The layout the sequencers and units decode with is built from the same table: every
    field at its bits, and a value written through the layout encodes like ``encode``."""
    layout = isa.layout(opcode)
    assert layout.size == 8 * isa.instruction_bytes(opcode)
    rng = random.Random(7)
    values = _random_fields(rng, opcode)
    bits = int.from_bytes(isa.encode(opcode, **values), "little")
    for f in isa.fields(opcode):
        assert layout[f.name].offset == f.lsb
        assert layout[f.name].shape.width == f.width
        assert layout[f.name].shape.signed == f.signed
        expected = int(opcode) if f.name == "opcode" else values[f.name]
        assert data.Const(layout, bits)[f.name] == expected


def test_fields_do_not_overlap():
    for opcode in Opcode:
        used = 0
        for f in isa.fields(opcode):
            mask = ((1 << f.width) - 1) << f.lsb
            assert used & mask == 0, (opcode, f)
            used |= mask
        assert used < 1 << (8 * isa.instruction_bytes(opcode))


@pytest.mark.parametrize("opcode, values, message", [
    (Opcode.MATMUL, {"n": 1 << 16}, "MATMUL.n=65536: must be between 0 and 65535"),
    (Opcode.ACTIVATE, {"multiplier": 1 << 31}, "ACTIVATE.multiplier=2147483648: must be "
                                                "between -2147483648 and 2147483647"),
    (Opcode.NOP, {"wait_value": -1}, "NOP.wait_value=-1: must be between 0 and"),
    (Opcode.END, {"n": 3}, "n: not a field of END"),
    (0x7F, {}, "opcode=127: not an opcode"),
])
def test_encode_refuses_what_does_not_fit(opcode, values, message):
    with pytest.raises(isa.IsaError, match=message):
        isa.encode(opcode, **values)


def test_wait_and_signal_bits_follow_their_semaphores():
    _, fields = isa.decode(isa.encode(Opcode.NOP, wait_sem=3, wait_value=9))
    assert (fields["wait"], fields["signal"], fields["wait_sem"]) == (1, 0, 3)
    _, fields = isa.decode(isa.encode(Opcode.NOP, signal_sem=2))
    assert (fields["wait"], fields["signal"], fields["signal_sem"]) == (0, 1, 2)


def test_decode_of_unknown_and_short_words():
    code, fields = isa.decode(bytes([0x7F]) + bytes(31))
    assert code == 0x7F and set(fields) == {"wait", "signal", "wait_sem", "signal_sem",
                                            "wait_value"}
    with pytest.raises(isa.IsaError, match="needs 64 bytes"):
        isa.decode(isa.encode(Opcode.DMA)[:32])
    with pytest.raises(isa.IsaError, match="no instruction word there"):
        isa.decode(bytes(16))


def test_docs_hold_the_tables():
    text = (Path(__file__).parent.parent / "docs" / "isa.md").read_text()
    assert isa.markdown() in text
    for fault in isa.Fault:
        assert f"| {int(fault)} | `{fault.name}` |" in text
