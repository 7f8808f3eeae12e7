"""hdl/access_pattern.py: a walker of a DMA side's rows and bus words."""



from opentrn.hdl.axi4 import BOUNDARY_BYTES
from opentrn.hdl.dma import MAX_BURST


class _Walker:
    """hdl/access_pattern.py: the rows of one side of a descriptor, word by word (the
    partitions do not change the timing: only the byte addresses are kept)."""

    __slots__ = ("width", "shift", "n1", "n2", "row_bytes", "stride1", "stride2", "active",
                 "cur", "row_end", "i1", "i2", "plane_addr")

    def __init__(self, width):
        self.width = width
        self.shift = width.bit_length() - 1
        self.active = False

    def load(self, addr, stride1, stride2, n1, n2, row_bytes):
        self.n1, self.n2, self.row_bytes = n1, n2, row_bytes
        self.stride1, self.stride2 = stride1, stride2
        self.active = True
        self.plane_addr = addr
        self.i1 = self.i2 = 0
        self.cur, self.row_end = addr, addr + row_bytes

    def words_left(self):
        return ((self.row_end - 1) >> self.shift) - (self.cur >> self.shift) + 1

    def lanes(self):
        """Bytes of the current word that belong to the row."""
        first = self.cur & (self.width - 1)
        last = ((self.row_end - 1) & (self.width - 1)) if self.words_left() == 1 \
            else self.width - 1
        return last - first + 1

    def burst_words(self):
        boundary_words = BOUNDARY_BYTES >> self.shift
        to_boundary = boundary_words - ((self.cur >> self.shift) & (boundary_words - 1))
        return min(MAX_BURST, self.words_left(), to_boundary)

    def step(self, words):
        if not self.active:
            return
        if words < self.words_left():
            self.cur = ((self.cur >> self.shift) + words) << self.shift
        elif self.i1 + 1 < self.n1:
            self.i1 += 1
            start = self.row_end - self.row_bytes + self.stride1
            self.cur, self.row_end = start, start + self.row_bytes
        elif self.i2 + 1 < self.n2:
            self.i1 = 0
            self.i2 += 1
            self.plane_addr += self.stride2
            self.cur, self.row_end = self.plane_addr, self.plane_addr + self.row_bytes
        else:
            self.active = False
