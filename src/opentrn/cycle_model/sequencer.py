"""hdl/sequencer.py: an engine's instruction stream fetched, checked, waited on,
handed over and retired."""

from collections import deque
from dataclasses import dataclass

from opentrn import isa
from opentrn.hdl.sequencer import FETCH_BUFFER_BYTES, fetch_unit
from opentrn.isa import Opcode

from .errors import ModelError

_IDLE, _FETCH, _READY = 0, 1, 2


@dataclass
class _Instruction:
    opcode: Opcode
    fields: dict
    size: int
    pc: int


def _stream(hbm, pc, engine):
    """The instructions of one engine's stream, up to its ``END``."""
    result = []
    while True:
        opcode, fields = isa.decode(hbm, pc)
        if not isinstance(opcode, Opcode) or opcode not in isa.ENGINE_OPCODES[engine]:
            raise ModelError(f"engine {engine.name}: illegal opcode at pc={pc} (the model "
                             "covers programs that do not fault)")
        size = isa.instruction_bytes(opcode)
        result.append(_Instruction(opcode, fields, size, pc))
        if opcode == Opcode.END:
            return result
        pc += size


class _Sequencer:
    """hdl/sequencer.py: fetch, assemble (one bus beat per cycle), check and wait (the READY
    state), hand over, retire in order."""

    def __init__(self, config, engine, program, instructions):
        self.engine = engine
        bus = config.dma_bus_bytes
        self.bus = bus
        self.buffer_beats = FETCH_BUFFER_BYTES // bus
        self.burst_beats = self.buffer_beats // 2
        unit = fetch_unit(config)
        self.units_per_word = isa.WORD_BYTES // unit
        self.units_per_beat = bus // unit
        self.slot = program % bus // unit     # the unit of the head beat assembled next
        self.hbm_bytes = config.hbm_bytes
        self.instructions = instructions
        self.index = 0                  # the instruction being fetched / waiting
        self.state = _FETCH             # begin() at start: FETCH from the next cycle
        self.fetching = True
        self.fetch_addr = program - program % bus       # bursts fetch whole beats
        self.in_flight = 0
        self.ar_valid = False
        self.ar_len = 0
        self.level = 0                  # beats in the fetch buffer
        self.have = 0
        self.ended = False
        self.retiring = deque()         # (self_retiring, signal index or None)
        self.unit_done = 0
        self.waiting = False
        # This cycle's decisions, applied at the clock edge.
        self.pop = False
        self.push = None
        self.next_unit_done = 0

    def quiet(self):
        return self.in_flight == 0 and not self.ar_valid

    def finished(self):
        return self.ended and not self.retiring and self.quiet()

    def current(self):
        return self.instructions[self.index]
