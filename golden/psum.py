"""Golden model of :mod:`opentrn.hdl.psum`: the PSUM image, with tensor-engine writes
(overwrite or accumulate, wrapping to ``acc_bits``), activation reads and DMA word access.

Entry ``(bank, entry)`` of partition ``p`` is the 4 bytes at offset
``(bank * psum_bank_entries + entry) * 4`` of ``image[p]``, little-endian: the ``acc_bits``
two's-complement value sign-extended to 32 bits. A read of an entry takes the low
``acc_bits`` bits of those 32 as a signed value (the DMA may have written any bytes).
"""

import numpy as np

from .partitioned_memory import PartitionedMemory, _check_index
from .processing_element import wrap

__all__ = ["PSUM", "ENTRY_BYTES", "geometry", "entry_offset", "entry_location"]

ENTRY_BYTES = 4


def geometry(config):
    """``(partitions, word_bytes, depth)``: ``pe_cols`` partitions of
    ``psum_banks * psum_bank_entries * 4`` bytes in words of ``dma_bus_bytes``."""
    word_bytes = config.dma_bus_bytes
    size = config.psum_banks * config.psum_bank_entries * ENTRY_BYTES
    return config.pe_cols, word_bytes, size // word_bytes


def entry_offset(config, bank, entry):
    """Byte offset of ``(bank, entry)`` in every partition."""
    bank = _check_index("bank", bank, config.psum_banks)
    entry = _check_index("entry", entry, config.psum_bank_entries)
    return (bank * config.psum_bank_entries + entry) * ENTRY_BYTES


def entry_location(config, bank, entry):
    """``(word, first byte within the word)`` of ``(bank, entry)``."""
    return divmod(entry_offset(config, bank, entry), config.dma_bus_bytes)


class PSUM(PartitionedMemory):
    """The ``pe_cols`` partitions of the PSUM, all zero at first."""

    def __init__(self, config):
        partitions, word_bytes, depth = geometry(config)
        super().__init__(partitions=partitions, word_bytes=word_bytes, depth=depth)
        self.config = config

    def _entry_bytes(self, bank, entry):
        offset = entry_offset(self.config, bank, entry)
        return slice(offset, offset + ENTRY_BYTES)

    def act_read(self, bank, entry):
        """Entry ``(bank, entry)`` of every partition: ``int64 [pe_cols]``, ``acc_bits``
        signed."""
        raw = self.image[:, self._entry_bytes(bank, entry)].astype(np.int64)
        stored = raw @ (np.int64(1) << np.arange(0, 8 * ENTRY_BYTES, 8, dtype=np.int64))
        return wrap(stored, self.config.acc_bits)

    def te_write(self, bank, entry, data, accumulate):
        """One tensor-engine result beat into entry ``(bank, entry)`` of every partition:
        ``data`` (``pe_cols`` signed ``acc_bits`` values) overwrites, or with ``accumulate``
        is added to, the stored values, wrapping to ``acc_bits``. Returns the new values."""
        cfg = self.config
        span = self._entry_bytes(bank, entry)
        values = np.asarray(data)
        lo, hi = -(1 << (cfg.acc_bits - 1)), (1 << (cfg.acc_bits - 1)) - 1
        if values.shape != (cfg.pe_cols,):
            raise ValueError(f"data has shape {values.shape}: must be ({cfg.pe_cols},)")
        if not np.issubdtype(values.dtype, np.integer) or values.min() < lo \
                or values.max() > hi:
            raise ValueError(f"data must hold integers in [{lo}, {hi}] (acc_bits="
                             f"{cfg.acc_bits})")
        if accumulate not in (0, 1, False, True):
            raise ValueError(f"accumulate={accumulate!r}: must be 0 or 1")
        values = values.astype(np.int64)
        if accumulate:
            values = wrap(self.act_read(bank, entry) + values, cfg.acc_bits)
        # Sign-extended to 32 bits: the two's-complement bytes of the value.
        unsigned = values & 0xFFFF_FFFF
        self.image[:, span] = np.stack(
            [(unsigned >> (8 * b)) & 0xFF for b in range(ENTRY_BYTES)], axis=1)
        return values

    def dma_read(self, partition, word):
        return self.word_read(partition, word)

    def dma_write(self, partition, word, data, strobe=None):
        self.word_write(partition, word, data, strobe)
