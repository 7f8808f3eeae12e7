"""The state buffer (SBUF): the core's on-chip working memory, one partition per array row."""

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In

from .partitioned_memory import (
    PartitionedMemory,
    read_signature,
    vector_request_layout,
    vector_response_layout,
    vector_write_layout,
    word_request_layout,
    word_response_layout,
    word_write_layout,
)

__all__ = ["SBUF", "geometry", "vector_geometry", "read_latency"]


def read_latency(config):
    """Cycles from an SBUF read's grant to its response: 1, and one per
    ``sbuf_input_stages`` (registers at each partition's SRAM)."""
    return 1 + config.sbuf_input_stages


def geometry(config):
    """``(partitions, word_bytes, depth)``: words of one DMA bus beat (``dma_bus_bytes``)."""
    word_bytes = config.dma_bus_bytes
    return (config.sbuf_partitions, word_bytes,
            config.sbuf_bytes_per_partition // word_bytes)


def vector_geometry(config):
    """``(partitions, vector_bytes, vector_depth)``: the engines' view, vector words of
    ``Config.vector_word_bytes``."""
    vector_bytes = config.vector_word_bytes
    return (config.sbuf_partitions, vector_bytes,
            config.sbuf_bytes_per_partition // vector_bytes)


class SBUF(wiring.Component):
    """``sbuf_partitions`` partitions of ``sbuf_bytes_per_partition`` bytes, stored as words
    of ``dma_bus_bytes`` bytes, each of ``dma_bus_bytes / V`` vector words of
    ``V = Config.vector_word_bytes`` bytes (the whole word up to 32 bytes).

    The engines read and write vectors: the vector word at one index in every partition
    (vector word ``v`` is bytes ``v * V ..`` of the partition). One index for all partitions
    is Trainium's rule that all active partitions of an access use the same free-axis
    offset; it lets every partition's SRAM share one address. The DMA engine reads and
    writes single words of one partition.

    Arbitration (:class:`~opentrn.hdl.partitioned_memory.PartitionedMemory`): one read and
    one write per cycle, in parallel. Reads are round-robin among ``te_read``, ``act_read``,
    ``dma_read`` (in that order before the first grant), so a waiting reader is granted
    within 2 cycles; writes are round-robin between ``act_write`` and ``dma_write``, so a
    waiting writer is granted within 1 cycle. ``ready`` is high only in the granted cycle.

    Timing: a read granted in cycle ``t`` answers in cycle ``t + L`` (:func:`read_latency`:
    ``L = 1 + Config.sbuf_input_stages``; the response streams are always ready: the
    requester must take it then); a read granted after a write's grant sees the write; a
    read of a word written in the same cycle returns the old data.

    Members
    -------
    te_read, act_read : ``In(read_signature(vector_request_layout, vector_response_layout))``
        Vector reads of the tensor engine and the activation engine: ``request.payload.word``
        (a vector word) → ``response.payload.data``:
        ``ArrayLayout(ArrayLayout(8, V), sbuf_partitions)``.
    act_write : ``In(stream.Signature(vector_write_layout))``
        Vector writes of the activation engine: ``word``, ``data`` (as above), ``strobe``:
        ``ArrayLayout(V, sbuf_partitions)`` byte enables.
    dma_read : ``In(read_signature(word_request_layout, word_response_layout))``
        ``request.payload.{partition, word}`` → ``response.payload.data``:
        ``ArrayLayout(8, W)``, ``W = dma_bus_bytes``.
    dma_write : ``In(stream.Signature(word_write_layout))``
        ``partition``, ``word``, ``data``: ``ArrayLayout(8, W)``, ``strobe``: W bits.
    """

    def __init__(self, *, config):
        self._config = config
        partitions, word_bytes, depth = geometry(config)
        _, vector_bytes, vector_depth = vector_geometry(config)
        self._geometry = partitions, word_bytes, depth
        vector_read = read_signature(vector_request_layout(vector_depth),
                                     vector_response_layout(partitions, vector_bytes))
        super().__init__({
            "te_read": In(vector_read),
            "act_read": In(vector_read),
            "act_write": In(stream.Signature(vector_write_layout(partitions, vector_bytes,
                                                                 vector_depth))),
            "dma_read": In(read_signature(word_request_layout(partitions, depth),
                                          word_response_layout(word_bytes))),
            "dma_write": In(stream.Signature(word_write_layout(partitions, depth,
                                                               word_bytes))),
        })

    def elaborate(self, platform):
        partitions, word_bytes, depth = self._geometry
        m = Module()
        m.submodules.memory = memory = PartitionedMemory(
            partitions=partitions, word_bytes=word_bytes, depth=depth,
            vector_bytes=self._config.vector_word_bytes, vector_readers=2, vector_writers=1,
            input_stages=self._config.sbuf_input_stages)
        flipped = wiring.flipped
        wiring.connect(m, flipped(self.te_read), memory.vector_read[0])
        wiring.connect(m, flipped(self.act_read), memory.vector_read[1])
        wiring.connect(m, flipped(self.act_write), memory.vector_write[0])
        wiring.connect(m, flipped(self.dma_read), memory.word_read)
        wiring.connect(m, flipped(self.dma_write), memory.word_write)
        return m
