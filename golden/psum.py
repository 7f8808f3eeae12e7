"""Golden model of :mod:`opentrn.hdl.psum`: the PSUM image, with tensor-engine writes
(overwrite or accumulate, wrapping to ``acc_bits``, or in FP32 for float results),
activation reads and DMA word access.

Entry ``(bank, entry)`` of partition ``p`` is the 4 bytes at offset
``(bank * psum_bank_entries + entry) * 4`` of ``image[p]``, little-endian: the ``acc_bits``
two's-complement value sign-extended to 32 bits, or an FP32 code. A read of an entry takes
the low ``acc_bits`` bits of those 32 as a signed value (the DMA may have written any
bytes); :meth:`PSUM.act_read_bits` gives the 32 bits as they are (the float path).
"""

import numpy as np

from opentrn import numerics

from . import fp_adder
from .partitioned_memory import PartitionedMemory, _check_index
from .processing_element import wrap

__all__ = ["PSUM", "ENTRY_BYTES", "geometry", "write_cycles", "entry_offset",
           "entry_location"]

ENTRY_BYTES = 4


def geometry(config):
    """``(partitions, word_bytes, depth)``: ``pe_cols`` partitions of
    ``psum_banks * psum_bank_entries * 4`` bytes in words of ``dma_bus_bytes``."""
    word_bytes = config.dma_bus_bytes
    size = config.psum_banks * config.psum_bank_entries * ENTRY_BYTES
    return config.pe_cols, word_bytes, size // word_bytes


def write_cycles(config):
    """Cycles from the PSUM's acceptance of a tensor-engine result beat to the first cycle
    a read returns it: ``2 + psum_add_stages`` (read, add in ``psum_add_stages + 1``
    cycles, written back; hdl/psum.py). A matmul retires this long after its last beat."""
    return 2 + config.psum_add_stages


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

    def act_read_bits(self, bank, entry):
        """The 32 stored bits of entry ``(bank, entry)`` of every partition, unsigned:
        ``int64 [pe_cols]`` in ``[0, 2**32)`` (FP32 codes on the float path)."""
        raw = self.image[:, self._entry_bytes(bank, entry)].astype(np.int64)
        return raw @ (np.int64(1) << np.arange(0, 8 * ENTRY_BYTES, 8, dtype=np.int64))

    def act_read(self, bank, entry):
        """Entry ``(bank, entry)`` of every partition: ``int64 [pe_cols]``, ``acc_bits``
        signed."""
        return wrap(self.act_read_bits(bank, entry), self.config.acc_bits)

    def te_write(self, bank, entry, data, accumulate, *, float=False):
        """One tensor-engine result beat into entry ``(bank, entry)`` of every partition.

        Integer (``float`` false): ``data`` (``pe_cols`` signed ``acc_bits`` values)
        overwrites, or with ``accumulate`` is added to, the stored values, wrapping to
        ``acc_bits``. Float (ignored, as in the hardware, by a configuration without a float
        format): ``data`` are FP32 codes (integers in ``[0, 2**32)``) that overwrite, or with
        ``accumulate`` are added in FP32 to the stored codes, ``fp_add32(stored, data)``
        (golden ``fp_adder``).
        Returns the new values (signed integers, or codes)."""
        cfg = self.config
        span = self._entry_bytes(bank, entry)
        values = np.asarray(data)
        if float not in (0, 1, False, True):
            raise ValueError(f"float={float!r}: must be 0 or 1")
        # As the hardware: without a float format no FP32 adder is built, float is ignored.
        float = bool(float) and bool(numerics.float_formats(cfg))
        lo, hi = (0, (1 << 32) - 1) if float else \
            (-(1 << (cfg.acc_bits - 1)), (1 << (cfg.acc_bits - 1)) - 1)
        if values.shape != (cfg.pe_cols,):
            raise ValueError(f"data has shape {values.shape}: must be ({cfg.pe_cols},)")
        if not np.issubdtype(values.dtype, np.integer) or values.min() < lo \
                or values.max() > hi:
            what = "FP32 codes" if float else "integers"
            rule = " (float=1)" if float else f" (acc_bits={cfg.acc_bits})"
            raise ValueError(f"data must hold {what} in [{lo}, {hi}]{rule}")
        if accumulate not in (0, 1, False, True):
            raise ValueError(f"accumulate={accumulate!r}: must be 0 or 1")
        values = values.astype(np.int64)
        if accumulate and float:
            values = fp_adder.add(self.act_read_bits(bank, entry), values).astype(np.int64)
        elif accumulate:
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
