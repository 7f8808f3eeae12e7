"""The golden DMA model's semantics, on small hand-made cases."""

import numpy as np
import pytest

from opentrn import config
from opentrn.golden.dma import Descriptor, Images, Side, check, execute
from opentrn.hdl.dma import ErrorCode, Space

TINY = config.preset("tiny")


def _images():
    images = Images.zeros(TINY)
    images.hbm[:4096] = np.arange(4096) % 251
    return images


def test_tile_lands_as_partitions_by_elements():
    # hbm[r0:r0+R, c0:c0+C] of a row-major int16 matrix with 40 columns -> R partitions.
    images, cols, r0, c0, rows, width = _images(), 40, 3, 5, 4, 7
    matrix = images.hbm[:2 * 40 * 20].view(np.int16).reshape(20, cols)
    desc = Descriptor(Side(Space.HBM, addr=2 * (r0 * cols + c0), stride1=2 * cols),
                      Side(Space.SBUF, addr=6, partition=0, pstep1=1),
                      n0=width, n1=rows, elem_log2=1)
    assert execute(TINY, images, desc) == ErrorCode.OK
    landed = images.sbuf[:rows, 6:6 + 2 * width].copy().view(np.int16)
    assert np.array_equal(landed, matrix[r0:r0 + rows, c0:c0 + width])


def test_transposed_placement():
    # Element (r, c) of a 3 x 4 byte matrix goes to partition c, offset r.
    images = _images()
    matrix = images.hbm[100:112].reshape(3, 4).copy()
    desc = Descriptor(Side(Space.HBM, addr=100, stride1=1, stride2=4),
                      Side(Space.SBUF, addr=0, partition=0, pstep1=1, stride2=1),
                      n0=1, n1=4, n2=3)
    assert execute(TINY, images, desc) == ErrorCode.OK
    assert np.array_equal(images.sbuf[:4, :3], matrix.T)


@pytest.mark.parametrize("desc, code", [
    (Descriptor(Side(Space.HBM), Side(Space.SBUF), n0=0), ErrorCode.ZERO_SIZE),
    (Descriptor(Side(3), Side(Space.SBUF), n0=1), ErrorCode.BAD_SPACE),
    (Descriptor(Side(Space.HBM, addr=TINY.hbm_bytes - 2), Side(Space.SBUF), n0=3),
     ErrorCode.SRC_BOUNDS),
    (Descriptor(Side(Space.HBM), Side(Space.SBUF, partition=3, pstep1=1), n0=1, n1=2),
     ErrorCode.DST_BOUNDS),
    (Descriptor(Side(Space.HBM), Side(Space.PSUM, addr=4 * 16 * 4 - 1), n0=2),
     ErrorCode.DST_BOUNDS),
    (Descriptor(Side(Space.HBM, addr=0), Side(Space.HBM, addr=10), n0=11),
     ErrorCode.OVERLAP),
    (Descriptor(Side(Space.SBUF, partition=0), Side(Space.SBUF, partition=1), n0=64),
     ErrorCode.OK),                                  # same bytes, other partitions
])
def test_checks(desc, code):
    assert check(TINY, desc) == code


def test_refused_descriptor_moves_nothing():
    images = _images()
    before = images.copy()
    desc = Descriptor(Side(Space.HBM, addr=0), Side(Space.SBUF, partition=3, pstep1=1),
                      n0=8, n1=2)
    assert execute(TINY, images, desc) == ErrorCode.DST_BOUNDS
    assert np.array_equal(images.sbuf, before.sbuf)


def test_axi_errors_skip_bytes_and_read_errors_win():
    images = _images()
    images.read_errors = {1: "DECERR"}         # HBM bytes 8..15
    images.write_errors = {130: "SLVERR"}      # HBM bytes 1040..1047
    desc = Descriptor(Side(Space.HBM, addr=4), Side(Space.HBM, addr=1036), n0=16)
    before = images.hbm.copy()
    assert execute(TINY, images, desc) == ErrorCode.READ_DECERR
    expected = before.copy()
    # Source bytes 4..19 -> 1036..1051: bytes 8..15 are poisoned (-> 1040..1047), and the
    # write word 1040..1047 is dropped: both leave the same hole.
    for offset in range(16):
        src, dst = 4 + offset, 1036 + offset
        if not (8 <= src < 16) and not (1040 <= dst < 1048):
            expected[dst] = before[src]
    assert np.array_equal(images.hbm, expected)
    images.read_errors = {}
    assert execute(TINY, images, desc) == ErrorCode.WRITE_SLVERR


def test_descriptor_field_ranges():
    with pytest.raises(ValueError, match="n1=65536: must be between 0 and 65535"):
        Descriptor(Side(Space.HBM), Side(Space.SBUF), n1=65536)
    with pytest.raises(ValueError, match="pstep1=256: must be between 0 and 255"):
        Descriptor(Side(Space.HBM), Side(Space.SBUF, pstep1=256))
