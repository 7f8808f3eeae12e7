"""The golden memory models: byte layout, strobes, PSUM accumulate/overwrite with wrap and
sign extension, PSUM float accumulate as float32 addition, the round-robin arbiter, and
bounds checks that name the argument."""

import numpy as np
import pytest

from opentrn import config, numerics
from opentrn.golden import psum as golden_psum
from opentrn.golden import sbuf as golden_sbuf
from opentrn.golden.partitioned_memory import PartitionedMemory, RoundRobin


def test_vector_and_word_access_share_one_image():
    memory = PartitionedMemory(partitions=3, word_bytes=4, depth=5)
    data = np.arange(12).reshape(3, 4) + 1
    memory.vector_write(2, data, strobe=[0b1111, 0b0101, 0])
    assert memory.image[0, 8:12].tolist() == [1, 2, 3, 4]
    assert memory.image[1, 8:12].tolist() == [5, 0, 7, 0]
    assert memory.image[2].tolist() == [0] * 20
    assert memory.word_read(1, 2).tolist() == [5, 0, 7, 0]
    memory.word_write(2, 2, [9, 9, 9, 9], strobe=0b1000)
    assert memory.vector_read(2).tolist() == [[1, 2, 3, 4], [5, 0, 7, 0], [0, 0, 0, 9]]
    memory.word_write(0, 4, [255, 254, 253, 252])        # default: every byte
    assert memory.image[0, 16:].tolist() == [255, 254, 253, 252]
    # A read returns a copy, not a view into the image.
    memory.vector_read(2)[0, 0] = 77
    assert memory.image[0, 8] == 1


@pytest.mark.parametrize("call, message", [
    (lambda m: m.vector_read(5), "word=5: must be an integer in 0..4"),
    (lambda m: m.vector_read(-1), "word=-1: must be an integer in 0..4"),
    (lambda m: m.word_read(3, 0), "partition=3: must be an integer in 0..2"),
    (lambda m: m.word_read(0, 1.0), "word=1.0: must be an integer"),
    (lambda m: m.word_write(0, 0, [1, 2, 3]), r"data has shape \(3,\): must be \(4,\)"),
    (lambda m: m.word_write(0, 0, [1, 2, 3, 256]), "data must hold bytes"),
    (lambda m: m.word_write(0, 0, [1, 2, 3, 4], strobe=16), "strobe=16: must be a 4-bit"),
    (lambda m: m.vector_write(0, np.zeros((2, 4), int)), r"data has shape \(2, 4\)"),
    (lambda m: m.vector_write(0, np.zeros((3, 4), int), strobe=[1, 1]),
     "strobe has 2 masks: must have one per partition"),
    (lambda m: m.vector_write(0, np.zeros((3, 4), int), strobe=[1, 1, -1]),
     r"strobe\[2\]=-1: must be a 4-bit"),
])
def test_bounds_checks_name_the_argument(call, message):
    memory = PartitionedMemory(partitions=3, word_bytes=4, depth=5)
    with pytest.raises(ValueError, match=message):
        call(memory)


def test_constructor_checks():
    with pytest.raises(ValueError, match="depth=0: must be an integer >= 1"):
        PartitionedMemory(partitions=1, word_bytes=4, depth=0)
    with pytest.raises(ValueError, match="count=0: must be an integer >= 1"):
        RoundRobin(0)


def test_round_robin_order_and_bound():
    arbiter = RoundRobin(3)
    assert [arbiter.grant({0, 1, 2}) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    assert arbiter.grant(set()) is None
    assert arbiter.grant({1}) == 1
    assert arbiter.grant({0, 1}) == 0          # after 1: 2, 0, 1
    with pytest.raises(ValueError, match="requesting=3"):
        arbiter.grant({3})
    # A requester that keeps asking waits at most count - 1 grants, whatever the others do.
    rng = np.random.default_rng(0)
    arbiter, waited = RoundRobin(4), 0
    for _ in range(500):
        others = {int(i) for i in np.flatnonzero(rng.random(3) < 0.7) + 1}
        if arbiter.grant(others | {0}) == 0:
            waited = 0
        else:
            waited += 1
            assert waited <= 3


def test_sbuf_geometry_follows_the_config():
    cfg = config.preset("small")
    sbuf = golden_sbuf.SBUF(cfg)
    assert golden_sbuf.geometry(cfg) == (8, 8, 1024)
    assert sbuf.image.shape == (cfg.sbuf_partitions, cfg.sbuf_bytes_per_partition)
    sbuf.act_write(1023, np.full((8, 8), 7), [0xFF] * 8)
    assert sbuf.te_read(1023).tolist() == [[7] * 8] * 8
    sbuf.dma_write(3, 1023, list(range(8)), strobe=0x0F)
    assert sbuf.dma_read(3, 1023).tolist() == [0, 1, 2, 3, 7, 7, 7, 7]
    assert sbuf.act_read(1023)[3].tolist() == [0, 1, 2, 3, 7, 7, 7, 7]


def test_psum_entries_are_little_endian_sign_extended_words():
    cfg = config.preset("tiny")                           # 4 partitions, W = 8
    psum = golden_psum.PSUM(cfg)
    assert golden_psum.geometry(cfg) == (4, 8, 4 * 16 * 4 // 8)
    assert golden_psum.entry_offset(cfg, 1, 3) == (16 + 3) * 4
    assert golden_psum.entry_location(cfg, 1, 3) == (9, 4)
    psum.te_write(1, 3, [1, -1, -2**31, 2**31 - 1], accumulate=0)
    assert psum.image[:, 76:80].tolist() == [[1, 0, 0, 0], [255, 255, 255, 255],
                                             [0, 0, 0, 128], [255, 255, 255, 127]]
    assert psum.dma_read(1, 9).tolist() == [0, 0, 0, 0, 255, 255, 255, 255]
    assert psum.act_read(1, 3).tolist() == [1, -1, -2**31, 2**31 - 1]
    # Accumulate wraps to acc_bits.
    assert psum.te_write(1, 3, [2, 1, -1, 1], accumulate=1).tolist() == \
        [3, 0, 2**31 - 1, -2**31]
    # Other entries of the word are untouched.
    assert psum.image[:, 72:76].tolist() == [[0] * 4] * 4


def test_psum_acc16_wraps_and_sign_extends():
    cfg = config.preset("tiny").replace(dtypes=("int8",), acc_bits=16)
    psum = golden_psum.PSUM(cfg)
    psum.te_write(0, 0, [32767, -32768, 100, -1], accumulate=0)
    assert psum.te_write(0, 0, [1, -1, -200, -1], accumulate=1).tolist() == \
        [-32768, 32767, -100, -2]
    # Stored sign-extended to 32 bits.
    assert psum.image[:, 0:4].tolist() == [[0, 128, 255, 255], [255, 127, 0, 0],
                                           [156, 255, 255, 255], [254, 255, 255, 255]]
    # A DMA write of arbitrary bytes reads back as the low acc_bits bits, signed.
    psum.dma_write(0, 0, [0x34, 0x92, 0x55, 0x66, 0, 0, 0, 0], strobe=0x0F)
    assert psum.act_read(0, 0)[0] == 0x9234 - 0x10000
    with pytest.raises(ValueError, match=r"data must hold integers in \[-32768, 32767\]"):
        psum.te_write(0, 0, [32768, 0, 0, 0], accumulate=0)


def _float32_sum(a, b):
    """numpy float32 addition of FP32 codes, NaN results canonical."""
    with np.errstate(all="ignore"):
        total = (np.asarray(a, np.uint32).view(np.float32)
                 + np.asarray(b, np.uint32).view(np.float32))
    codes = total.view(np.uint32).astype(np.int64)
    codes[np.isnan(total)] = numerics.CANONICAL_NAN32
    return codes


def test_psum_float_accumulate_is_float32_addition():
    """Float beats: overwrite stores the codes, accumulate adds in FP32 (as numpy float32,
    NaN canonical): cancellation to +0, infinities, inf - inf and NaN."""
    cfg = config.preset("tiny")
    psum = golden_psum.PSUM(cfg)
    one, minus_one, inf, minus_inf = 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000
    nan_payload, max_finite = 0x7FA00001, 0x7F7FFFFF
    stored = [one, inf, max_finite, 0x80000000]
    assert psum.te_write(2, 5, stored, accumulate=0, float=True).tolist() == stored
    assert psum.act_read_bits(2, 5).tolist() == stored
    # The 32 bits as they are, and as a signed int32 by act_read.
    assert psum.act_read(2, 5).tolist() == [one, inf, max_finite, 0x80000000 - 2**32]
    beat = [minus_one, minus_inf, max_finite, 0x80000000]
    got = psum.te_write(2, 5, beat, accumulate=1, float=True)
    assert got.tolist() == [0, numerics.CANONICAL_NAN32, inf, 0x80000000]
    assert psum.act_read_bits(2, 5).tolist() == got.tolist()
    got = psum.te_write(2, 5, [nan_payload, one, minus_inf, 1], accumulate=1, float=True)
    assert got.tolist() == [numerics.CANONICAL_NAN32] * 2 + [numerics.CANONICAL_NAN32, 1]
    # Random codes against numpy.
    rng = np.random.default_rng(4)
    for _ in range(200):
        before = psum.act_read_bits(0, 0)
        beat = rng.integers(0, 1 << 32, 4)
        np.testing.assert_array_equal(psum.te_write(0, 0, beat, 1, float=True),
                                      _float32_sum(before, beat))


def test_psum_float_is_ignored_without_float_formats():
    """As in the hardware, which builds no FP32 adder then: an integer accumulate."""
    psum = golden_psum.PSUM(config.preset("small"))
    psum.te_write(0, 0, [0x3F800000] * 8, accumulate=0, float=True)
    assert psum.te_write(0, 0, [0x3F800000] * 8, accumulate=1, float=True).tolist() == \
        [0x7F000000] * 8


@pytest.mark.parametrize("call, message", [
    (lambda p: p.te_write(0, 0, [-1, 0, 0, 0], 0, float=True),
     r"data must hold FP32 codes in \[0, 4294967295\]"),
    (lambda p: p.te_write(0, 0, [2**32, 0, 0, 0], 1, float=True),
     r"data must hold FP32 codes in \[0, 4294967295\]"),
    (lambda p: p.te_write(0, 0, [0, 0, 0, 0], 0, float=2), "float=2: must be 0 or 1"),
    (lambda p: p.act_read_bits(0, 16), "entry=16: must be an integer in 0..15"),
    (lambda p: p.act_read(4, 0), "bank=4: must be an integer in 0..3"),
    (lambda p: p.act_read(0, 16), "entry=16: must be an integer in 0..15"),
    (lambda p: p.te_write(0, 0, [0, 0, 0], 0), r"data has shape \(3,\): must be \(4,\)"),
    (lambda p: p.te_write(0, 0, [0, 0, 0, 0], 2), "accumulate=2: must be 0 or 1"),
    (lambda p: p.dma_read(4, 0), "partition=4: must be an integer in 0..3"),
    (lambda p: p.dma_write(0, 32, [0] * 8), "word=32: must be an integer in 0..31"),
])
def test_psum_bounds_checks(call, message):
    with pytest.raises(ValueError, match=message):
        call(golden_psum.PSUM(config.preset("tiny")))
