"""Golden model of :mod:`opentrn.hdl.dma`: what a descriptor does to the HBM, SBUF and PSUM
images, byte for byte, and the error code it finishes with."""

from dataclasses import asdict, dataclass, field

import numpy as np

from opentrn.hdl.dma import PARTITION_BITS, SIZE_BITS, ErrorCode, Space, buffer_geometry

__all__ = ["Side", "Descriptor", "Images", "execute", "row_addresses"]


@dataclass(frozen=True)
class Side:
    """One side of a descriptor: HBM byte address, or buffer byte offset in ``partition``;
    per-dimension byte strides and partition steps (unsigned)."""
    space: Space
    addr: int = 0
    partition: int = 0
    stride1: int = 0
    stride2: int = 0
    pstep1: int = 0
    pstep2: int = 0


@dataclass(frozen=True)
class Descriptor:
    """``n2 x n1`` rows of ``n0`` elements of ``2 ** elem_log2`` bytes."""
    src: Side
    dst: Side
    n0: int = 1
    n1: int = 1
    n2: int = 1
    elem_log2: int = 0

    @property
    def row_bytes(self):
        return self.n0 << self.elem_log2

    def payload(self):
        """The value of :func:`opentrn.hdl.dma.descriptor_layout` for this descriptor."""
        def side(s):
            values = asdict(s)
            del values["space"]
            return values
        return {"src_space": int(self.src.space), "dst_space": int(self.dst.space),
                "elem_log2": self.elem_log2, "n0": self.n0, "n1": self.n1, "n2": self.n2,
                "src": side(self.src), "dst": side(self.dst)}

    def __post_init__(self):
        for name in ("n0", "n1", "n2"):
            value = getattr(self, name)
            if not 0 <= value < 1 << SIZE_BITS:
                raise ValueError(f"{name}={value}: must be between 0 and {(1 << SIZE_BITS) - 1}")
        if not 0 <= self.elem_log2 <= 3:
            raise ValueError(f"elem_log2={self.elem_log2}: must be between 0 and 3")
        for side in (self.src, self.dst):
            for name in ("partition", "pstep1", "pstep2"):
                if not 0 <= getattr(side, name) < 1 << PARTITION_BITS:
                    raise ValueError(f"{name}={getattr(side, name)}: must be between 0 and "
                                     f"{(1 << PARTITION_BITS) - 1}")


@dataclass
class Images:
    """The memories a DMA engine reaches: HBM bytes, and SBUF and PSUM as
    ``[partitions, bytes_per_partition]`` bytes (PSUM entries are 4-byte little-endian)."""
    hbm: np.ndarray
    sbuf: np.ndarray
    psum: np.ndarray
    read_errors: dict = field(default_factory=dict)    # HBM word -> "SLVERR" | "DECERR"
    write_errors: dict = field(default_factory=dict)

    @classmethod
    def zeros(cls, config):
        sbuf = buffer_geometry(config, Space.SBUF)
        psum = buffer_geometry(config, Space.PSUM)
        return cls(np.zeros(config.hbm_bytes, np.uint8), np.zeros(sbuf, np.uint8),
                   np.zeros(psum, np.uint8))

    def copy(self):
        return Images(self.hbm.copy(), self.sbuf.copy(), self.psum.copy(),
                      dict(self.read_errors), dict(self.write_errors))


def row_addresses(desc, side):
    """``(partition, byte address)`` of the first byte of every row, in the order the
    engine moves them (``i1`` fastest)."""
    for i2 in range(desc.n2):
        for i1 in range(desc.n1):
            yield (side.partition + i1 * side.pstep1 + i2 * side.pstep2,
                   side.addr + i1 * side.stride1 + i2 * side.stride2)


def _extent(desc, side):
    last_byte = (side.addr + desc.row_bytes - 1 + (desc.n1 - 1) * side.stride1
                 + (desc.n2 - 1) * side.stride2)
    last_part = side.partition + (desc.n1 - 1) * side.pstep1 + (desc.n2 - 1) * side.pstep2
    return last_byte, last_part


def _in_bounds(config, desc, side):
    last_byte, last_part = _extent(desc, side)
    if side.space == Space.HBM:
        return last_byte < config.hbm_bytes
    partitions, size = buffer_geometry(config, side.space)
    return last_part < partitions and last_byte < size


def check(config, desc):
    """The :class:`ErrorCode` found before anything moves, in the hardware's order."""
    if 0 in (desc.n0, desc.n1, desc.n2):
        return ErrorCode.ZERO_SIZE
    if 3 in (int(desc.src.space), int(desc.dst.space)):
        return ErrorCode.BAD_SPACE
    if not _in_bounds(config, desc, desc.src):
        return ErrorCode.SRC_BOUNDS
    if not _in_bounds(config, desc, desc.dst):
        return ErrorCode.DST_BOUNDS
    if desc.src.space == desc.dst.space:
        (src_last, src_part), (dst_last, dst_part) = (_extent(desc, desc.src),
                                                      _extent(desc, desc.dst))
        bytes_meet = desc.src.addr <= dst_last and desc.dst.addr <= src_last
        parts_meet = desc.src.partition <= dst_part and desc.dst.partition <= src_part
        if bytes_meet and (desc.src.space == Space.HBM or parts_meet):
            return ErrorCode.OVERLAP
    return ErrorCode.OK


def execute(config, images, desc):
    """Run ``desc`` on ``images`` (in place); return its :class:`ErrorCode`.

    An HBM read word in ``images.read_errors`` answers with that error: its bytes are not
    written. An HBM write to a word in ``images.write_errors`` is dropped by the memory.
    The code is that of the first erroring read word in source order, else of the first
    erroring write word in destination order.
    """
    code = check(config, desc)
    if code != ErrorCode.OK:
        return code
    width = config.dma_bus_bytes
    length = desc.row_bytes
    space_image = {Space.SBUF: images.sbuf, Space.PSUM: images.psum}

    # Gather the source bytes in stream order, with their poison.
    chunks, poisons, read_error = [], [], None
    for partition, addr in row_addresses(desc, desc.src):
        if desc.src.space == Space.HBM:
            chunk = images.hbm[addr:addr + length].copy()
            words = np.arange(addr, addr + length) // width
            bad = np.array([int(w) in images.read_errors for w in words], dtype=bool)
            if read_error is None and bad.any():
                read_error = images.read_errors[int(words[np.argmax(bad)])]
        else:
            chunk = space_image[desc.src.space][partition, addr:addr + length].copy()
            bad = np.zeros(length, dtype=bool)
        chunks.append(chunk)
        poisons.append(bad)

    write_error = None
    for (partition, addr), chunk, bad in zip(row_addresses(desc, desc.dst), chunks, poisons,
                                             strict=True):
        if desc.dst.space == Space.HBM:
            words = np.arange(addr, addr + length) // width
            dropped = np.array([int(w) in images.write_errors for w in words], dtype=bool)
            if write_error is None and dropped.any():
                write_error = images.write_errors[int(words[np.argmax(dropped)])]
            keep = ~bad & ~dropped
            images.hbm[addr:addr + length][keep] = chunk[keep]
        else:
            target = space_image[desc.dst.space][partition, addr:addr + length]
            target[~bad] = chunk[~bad]

    if read_error is not None:
        return ErrorCode.READ_DECERR if read_error == "DECERR" else ErrorCode.READ_SLVERR
    if write_error is not None:
        return ErrorCode.WRITE_DECERR if write_error == "DECERR" else ErrorCode.WRITE_SLVERR
    return ErrorCode.OK
