"""Golden model of :mod:`opentrn.hdl.sbuf`: the SBUF image with the operations of its ports."""

from .partitioned_memory import PartitionedMemory

__all__ = ["SBUF", "geometry", "vector_geometry", "read_latency"]


def geometry(config):
    """``(partitions, word_bytes, depth)`` of the SBUF of ``config`` (words of one DMA bus
    beat)."""
    word_bytes = config.dma_bus_bytes
    return (config.sbuf_partitions, word_bytes,
            config.sbuf_bytes_per_partition // word_bytes)


def vector_geometry(config):
    """``(partitions, vector_bytes, vector_depth)``: the engines' view, vector words of
    ``Config.vector_word_bytes``."""
    vector_bytes = config.vector_word_bytes
    return (config.sbuf_partitions, vector_bytes,
            config.sbuf_bytes_per_partition // vector_bytes)


def read_latency(config):
    """Cycles from an SBUF read's grant to its response: 1, and one per register at each
    partition's SRAM (``sbuf_input_stages``). Reads and writes pass the same registers, so
    the image's order of operations is the order of the grants."""
    return 1 + config.sbuf_input_stages


class SBUF(PartitionedMemory):
    """``image[p, b]`` is byte ``b`` of partition ``p``. The engine ports read and write
    vectors (one vector word index, every partition); the DMA ports single words."""

    def __init__(self, config):
        partitions, word_bytes, depth = geometry(config)
        super().__init__(partitions=partitions, word_bytes=word_bytes, depth=depth,
                         vector_bytes=config.vector_word_bytes)
        self.config = config

    def te_read(self, word):
        return self.vector_read(word)

    def act_read(self, word):
        return self.vector_read(word)

    def act_write(self, word, data, strobe=None):
        self.vector_write(word, data, strobe)

    def dma_read(self, partition, word):
        return self.word_read(partition, word)

    def dma_write(self, partition, word, data, strobe=None):
        self.word_write(partition, word, data, strobe)
