"""The testbench's HBM (sim/hbm.py; the HBM in hardware, hdl/axi4_memory.py, times
the same)."""

from collections import deque

# The timing of the testbench's memory, which has no named constant in the RTL.
# The RTL's structure constants come from its blocks (above); these are the timing of the
# testbench's memory and of one FIFO, which have no named constant there.
HBM_READ_CYCLES = 2             # sim/hbm.py: address accepted in t, first beat taken in t + 2
HBM_WRITE_RESPONSE_CYCLES = 2   # sim/hbm.py: last beat in t, response taken in t + 2


class _Hbm:
    """The testbench's HBM (sim/hbm.py) with a fixed ``latency``: read bursts answered in
    address order, one beat per cycle, the first no earlier than ``HBM_READ_CYCLES +
    latency`` after the address; a write burst answered ``HBM_WRITE_RESPONSE_CYCLES +
    latency`` after its last beat."""

    def __init__(self, latency=0):
        self.read_cycles = HBM_READ_CYCLES + latency
        self.write_cycles = HBM_WRITE_RESPONSE_CYCLES + latency
        self.beats = deque()          # [available_cycle, manager, last]
        # Write addresses: cocotbext-axi's AW sink queues at most 2 not yet taken by the
        # memory's write process, which takes one when it has finished the previous burst.
        self.aw_queued = 0
        self.aw_ready = True
        self.aw_asleep = False        # ready low until the write process takes one
        self.aw_wake = None           # cycle whose edge recomputes ready after a take
        self.writing = False          # the write process holds a burst

    def write_edge(self, cycle, aw_sent, w_last):
        """The AW sink and the write process at the clock edge that ends ``cycle``."""
        if aw_sent:
            self.aw_queued += 1
        if self.aw_wake == cycle or not self.aw_asleep:
            self.aw_wake = None
            self.aw_ready = self.aw_queued < 2
            self.aw_asleep = not self.aw_ready
        if w_last:
            self.writing = False
        if not self.writing and self.aw_queued:
            self.aw_queued -= 1
            self.writing = True
            if self.aw_asleep and self.aw_wake is None:
                self.aw_wake = cycle + 1

    def read_burst(self, cycle, manager, beats):
        at = cycle + self.read_cycles
        for beat in range(beats):
            self.beats.append((at, manager, beat == beats - 1))
