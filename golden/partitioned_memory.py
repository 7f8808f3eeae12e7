"""Golden model of :mod:`opentrn.hdl.partitioned_memory`: the memory image, byte for byte,
and the round-robin arbiter, grant for grant.

The image is a ``uint8`` array ``[partitions, depth * word_bytes]``: row ``p`` is partition
``p``'s bytes, word ``w`` at byte offset ``w * word_bytes``, vector word ``v`` (the vector
ports' unit, ``vector_bytes``) at ``v * vector_bytes``. Strobes are given as the hardware
takes them: one integer per partition (or one for a word write), bit ``b`` enabling byte
``b`` of the word.
"""

import numpy as np

__all__ = ["PartitionedMemory", "RoundRobin"]


def _check_index(name, value, limit):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) \
            or not 0 <= value < limit:
        raise ValueError(f"{name}={value!r}: must be an integer in 0..{limit - 1}")
    return int(value)


def _check_bytes(name, values, shape):
    array = np.asarray(values)
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}: must be {shape}")
    if array.size and (not np.issubdtype(array.dtype, np.integer)
                       or array.min() < 0 or array.max() > 255):
        raise ValueError(f"{name} must hold bytes (integers 0..255)")
    return array.astype(np.uint8)


def _check_strobe(name, value, word_bytes):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) \
            or not 0 <= value < 1 << word_bytes:
        raise ValueError(f"{name}={value!r}: must be a {word_bytes}-bit byte-enable mask")
    return np.array([(int(value) >> b) & 1 for b in range(word_bytes)], dtype=bool)


class PartitionedMemory:
    """``partitions`` x ``depth`` words of ``word_bytes`` bytes, all zero at first; the vector
    ports see vector words of ``vector_bytes`` (default ``word_bytes``)."""

    def __init__(self, *, partitions, word_bytes, depth, vector_bytes=None):
        vector_bytes = word_bytes if vector_bytes is None else vector_bytes
        for name, value in (("partitions", partitions), ("word_bytes", word_bytes),
                            ("depth", depth), ("vector_bytes", vector_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if word_bytes % vector_bytes:
            raise ValueError(f"vector_bytes={vector_bytes}: must divide "
                             f"word_bytes={word_bytes}")
        self.partitions, self.word_bytes, self.depth = partitions, word_bytes, depth
        self.vector_bytes = vector_bytes
        self.vector_depth = depth * word_bytes // vector_bytes
        self.image = np.zeros((partitions, depth * word_bytes), dtype=np.uint8)

    def _span(self, word):
        word = _check_index("word", word, self.depth)
        return slice(word * self.word_bytes, (word + 1) * self.word_bytes)

    def _vector_span(self, word):
        word = _check_index("word", word, self.vector_depth)
        return slice(word * self.vector_bytes, (word + 1) * self.vector_bytes)

    def vector_read(self, word):
        """The vector word at index ``word`` of every partition:
        ``uint8 [partitions, vector_bytes]``."""
        return self.image[:, self._vector_span(word)].copy()

    def vector_write(self, word, data, strobe=None):
        """Write ``data`` (``[partitions, vector_bytes]`` bytes) at vector word ``word`` of
        every partition, only the bytes that ``strobe`` (one mask per partition; default
        all) enables."""
        span = self._vector_span(word)
        width = self.vector_bytes
        data = _check_bytes("data", data, (self.partitions, width))
        if strobe is None:
            enable = np.ones((self.partitions, width), dtype=bool)
        else:
            if len(strobe) != self.partitions:
                raise ValueError(f"strobe has {len(strobe)} masks: must have one per "
                                 f"partition ({self.partitions})")
            enable = np.array([_check_strobe(f"strobe[{p}]", mask, width)
                               for p, mask in enumerate(strobe)])
        target = self.image[:, span]
        target[enable] = data[enable]

    def word_read(self, partition, word):
        """One word of one partition: ``uint8 [word_bytes]``."""
        partition = _check_index("partition", partition, self.partitions)
        return self.image[partition, self._span(word)].copy()

    def word_write(self, partition, word, data, strobe=None):
        """Write the bytes of ``data`` (``[word_bytes]``) that ``strobe`` (default all)
        enables into one word of one partition."""
        partition = _check_index("partition", partition, self.partitions)
        span = self._span(word)
        data = _check_bytes("data", data, (self.word_bytes,))
        enable = (np.ones(self.word_bytes, dtype=bool) if strobe is None
                  else _check_strobe("strobe", strobe, self.word_bytes))
        target = self.image[partition, span]
        target[enable] = data[enable]


class RoundRobin:
    """The arbiter of one port group: ``grant(requesting)`` returns the winner among the
    requester indices ``requesting`` (or ``None``), the one first after the last winner in
    cyclic order (before any grant, 0 first)."""

    def __init__(self, count):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count={count!r}: must be an integer >= 1")
        self.count = count
        self.last = count - 1

    def grant(self, requesting):
        requesting = set(requesting)
        for index in requesting:
            _check_index("requesting", index, self.count)
        for step in range(1, self.count + 1):
            index = (self.last + step) % self.count
            if index in requesting:
                self.last = index
                return index
        return None
