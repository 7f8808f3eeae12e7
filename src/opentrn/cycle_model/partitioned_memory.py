"""The round-robin grant of hdl/partitioned_memory.py's ports, which the HBM read
arbiter
(hdl/axi4_read_arbiter.py) shares."""





class _RoundRobin:
    """hdl/partitioned_memory.py's arbiter: after requester ``i`` wins, ``i+1, i+2, ...``
    come first (before any grant: ``0, 1, ...``)."""

    def __init__(self, count):
        self.count = count
        self.last = count - 1

    def grant(self, valids):
        if not any(valids):
            return -1
        count, index = self.count, self.last
        for _ in range(count):
            index = index + 1 if index + 1 < count else 0
            if valids[index]:
                self.last = index
                return index
        return -1
