"""hdl/activation_unit.py: PSUM or SBUF reads, the engine's pipeline, SBUF writes."""

from collections import deque

from opentrn import numerics
from opentrn.golden import sbuf
from opentrn.hdl.activation_engine import stages as activation_stages
from opentrn.hdl.activation_unit import input_slots

_OUT_BYTES = {code: numerics.format_of_code(code).bytes for code in range(8)}


def activate_overhead(config):
    """Cycles of an ACTIVATE beyond its vectors: hand-over to retire (docs/architecture.md:
    ``n + 3 +`` the engine's stages, ``n + 7`` with none of ``activation_input_stages``,
    ``activation_multiply_stages``, ``activation_add_stages``), and the cycle the next one
    is handed over in."""
    return 3 + activation_stages(config) + 1


class _ActivationUnitModel:
    """The activation unit's state and rules, a part of :class:`~opentrn.cycle_model.core._Core`."""

    def _init_activation(self, config):
        self.act_state = "IDLE"
        self.act_ins = None
        self.act_reads_left = 0
        self.act_slots = input_slots(config)
        self.act_sbuf_latency = sbuf.read_latency(config)
        self.act_vector_word = config.vector_word_bytes     # the SBUF's vector word
        # The cycles the reads in flight are answered in (1 after the grant from the PSUM,
        # sbuf.read_latency from the SBUF), oldest first; the bias read's.
        self.act_arrivals = deque()
        self.act_bias_arrival = None
        self.act_level = 0
        self.act_in_index = 0
        self.act_in_byte = 0
        # The last flag of the vector in each stage.
        self.act_pipe = [None] * activation_stages(config)
        self.act_out_index = 0
        self.act_out_address = 0
        # The write queue: each completed word's "last of the instruction" flag.
        self.act_writes = deque()

    def _act_commit(self, cycle, handed, sbuf_granted, psum_granted, take, result_take,
                    advance, write_done):
        width = self.act_vector_word              # the SBUF's vector word
        ins = self.act_ins
        state = self.act_state
        streaming = state == "STREAM"
        arrivals = self.act_arrivals
        response = bool(arrivals) and arrivals[0] == cycle
        if response:
            arrivals.popleft()
        if state == "IDLE":
            if handed is not None:
                f = handed.fields
                self.act_ins = handed
                shift = width.bit_length() - 1
                first_word = f["src_offset"] >> shift
                end_word = (f["src_offset"] + f["n"] - 1) >> shift
                self.act_reads_left = end_word - first_word + 1 if f["src"] else f["n"]
                self.act_in_index = 0
                self.act_in_byte = f["src_offset"] & (width - 1)
                self.act_out_index = 0
                self.act_out_address = f["dst_offset"]
                self.act_state = "BIAS" if f["bias"] else "STREAM"
            return
        if state == "BIAS":
            if sbuf_granted:
                self.act_state = "BIAS_RESPONSE"
                self.act_bias_arrival = cycle + self.act_sbuf_latency
            return
        if state == "BIAS_RESPONSE":
            if cycle == self.act_bias_arrival:
                self.act_state = "STREAM"
            return
        f = ins.fields
        last_index = f["n"] - 1
        granted = sbuf_granted if f["src"] else psum_granted
        if granted:
            self.act_reads_left -= 1
            arrivals.append(cycle + (self.act_sbuf_latency if f["src"] else 1))
        pop = take and (not f["src"] or self.act_in_byte == width - 1
                        or self.act_in_index == last_index)
        vector_last = take and self.act_in_index == last_index
        if take:
            self.act_in_index += 1
            self.act_in_byte = (self.act_in_byte + 1) & (width - 1)
        self.act_level += (response and streaming) - pop
        # engine pipeline -> assembly -> write queue
        out_bytes = _OUT_BYTES[f["out_format"]]
        retire = write_done and self.act_writes[0]
        if write_done:
            self.act_writes.popleft()
        if result_take:
            position = self.act_out_address & (width - 1)
            complete = (position + out_bytes == width) or self.act_out_index == last_index
            if complete:
                self.act_writes.append(self.act_out_index == last_index)
            self.act_out_index += 1
            self.act_out_address += out_bytes
        if advance:
            self.act_pipe = [vector_last if take else None] + self.act_pipe[:-1]
        if retire:
            self.act_state = "IDLE"
