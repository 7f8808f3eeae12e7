"""hdl/tensor_unit.py: the load and matmul paths, their SBUF readers, the array's
weight banks and fill."""

from collections import deque

from amaranth.utils import exact_log2

from opentrn import numerics
from opentrn.golden import sbuf, tensor_engine
from opentrn.hdl.tensor_unit import load_jobs, load_words, matmul_jobs, matmul_words
from opentrn.isa import Opcode


class _Reader:
    """One column reader of the tensor unit (hdl/tensor_unit.py ``_ColumnReader``)."""

    __slots__ = ("jobs", "words", "width", "columns", "queue", "gen_pos", "gen_index",
                 "reserved", "stored", "col")

    def __init__(self, jobs, words, width, columns=1):
        self.jobs, self.words, self.width, self.columns = jobs, words, width, columns
        self.queue = []        # jobs: dicts with first_word, last_word, lane, count, size, seq
        self.gen_pos = 0       # jobs of the queue whose words have all been requested
        self.gen_index = 0
        self.reserved = 0
        self.stored = 0
        self.col = 0

    def gen_sequence(self):
        return self.queue[self.gen_pos]["seq"]

    def grant(self):
        job = self.queue[self.gen_pos]
        if job["first_word"] + self.gen_index == job["last_word"]:
            self.gen_index = 0
            self.gen_pos += 1
        else:
            self.gen_index += 1

    def space(self):
        return len(self.queue) != self.jobs

    def _lanes(self, job):
        """``(lane, j)`` of the current take's columns ``col + j`` that are in the job."""
        return [((job["lane"] + ((self.col + j) << job["size"])) & (self.width - 1), j)
                for j in range(self.columns) if self.col + j < job["count"]]

    def word_ready(self):
        """The words of the current take's columns are held (``word_ready``): one, or two
        when a second column starts the next word."""
        if self.stored == 0:
            return False
        if self.columns == 1 or self.stored > 1:
            return True
        job = self.queue[0]
        return not any(lane == 0 and j for lane, j in self._lanes(job))

    def pops(self):
        """Words the current take finishes: one per column in the data that ends its word
        or the job."""
        job = self.queue[0]
        last = self.width - (1 << job["size"])
        if self.columns == 1:               # _lanes() below, for one column a take
            if self.col >= job["count"]:
                return 0
            lane = (job["lane"] + (self.col << job["size"])) & (self.width - 1)
            return int(lane == last or self.col == job["count"] - 1)
        return sum(1 for lane, j in self._lanes(job)
                   if lane == last or self.col + j == job["count"] - 1)


def _place(offset, count, size, width, seq, **extra):
    """A reader's job: ``count`` columns of ``2 ** size`` bytes from byte ``offset``."""
    shift = width.bit_length() - 1
    return {"first_word": offset >> shift,
            "last_word": (offset + (count << size) - 1) >> shift,
            "lane": offset & (width - 1), "count": count, "size": size, "seq": seq, **extra}


class _TensorUnitModel:
    """The tensor unit's state and rules, a part of :class:`~opentrn.cycle_model.core._Core`."""

    def _init_tensor(self, config):
        width = config.vector_word_bytes          # the SBUF's vector word
        self.K, self.M = config.pe_rows, config.pe_cols
        self.latency = tensor_engine.latency(config)    # a vector to its result
        self.per_beat = config.load_columns
        load = (load_jobs(config), load_words(config))
        matmul = (matmul_jobs(config), matmul_words(config))
        self.loads = _Reader(*load, width, self.per_beat)
        self.matmuls = _Reader(*matmul, width)
        self.mx = bool(numerics.mx_blocks(config))
        self.scales = {}
        if self.mx:
            self.scales = {"load": _Reader(*load, width, self.per_beat),
                           "matmul": _Reader(*matmul, width)}
        self.readers = [self.loads, self.matmuls, *self.scales.values()]
        self.te_locked = False
        self.te_owner = 0
        # The reader granted the SBUF in each of the last sbuf.read_latency cycles (-1:
        # none), oldest first: the oldest's word arrives now.
        self.te_responding = deque([-1] * sbuf.read_latency(config))
        self.sequence = 0
        self.load_pending = False
        self.tile_macs = 0
        # The array: weight banks used in turn (the active one, tiles waiting for their
        # swap, the one loads write), the cycle each bank's guard runs out (the RTL counts
        # it down), results in flight.
        self.banks = config.weight_banks
        self.active = self.banks - 1
        self.pending = 0
        self.active_valid = False
        self.free_from = [0] * self.banks
        # Advances from a swap to the next load into the retired bank (hdl/tensor_engine.py).
        self.reload_guard = tensor_engine.reload_guard(config)
        self.load_beat = 0
        self.results = deque()          # (cycle the result is written, last)
        self.results_fifo = 0           # matmuls with results in flight (FIFO latency + 1)
        self.order = deque()            # True: a load
        # As hdl/tensor_unit.py's: the array's rows are 1 + pe_add_stages cycles apart.
        self.order_depth = (2 * (self.K * (1 + config.pe_add_stages) + self.M)
                            + load[0] + matmul[0])
        self.loads_done = 0
        self.matmuls_done = 0
        # The PSUM writes a result back 1 + psum_add_stages cycles after it takes it: per
        # cycle of that span, oldest first, whether a matmul's last result / any result was
        # taken (the completion and the DMA's PSUM write wait for the write-back).
        stages = config.psum_add_stages
        self.last_taken = deque([False] * (1 + stages))
        self.te_taken = deque([False] * (1 + stages))
        # The PSUM entries the vectors of the last psum_add_stages cycles went to (None: no
        # vector), oldest first: a vector that accumulates waits while its entry is there.
        self.entered = deque([None] * stages)

    def _load_ready(self, cycle):
        """The array takes a load beat in ``cycle`` (hdl/tensor_engine.py
        ``stationary.ready``): a bank is free and its guard has run out."""
        if self.pending == self.banks - 1:
            return False
        return cycle >= self.free_from[(self.active + 1 + self.pending) % self.banks]

    def _psum_hazard(self, job, col):
        """Vector ``col`` of matmul ``job`` accumulates into a PSUM entry a vector of the
        last ``psum_add_stages`` cycles went to (hdl/tensor_unit.py ``hazard``)."""
        return (bool(self.entered) and bool(job["accumulate"])
                and (job["bank"], job["entry"] + col) in self.entered)

    def _psum_write_free(self):
        """The PSUM's write port is free for the DMA this cycle: no result is written back
        (taken ``1 + psum_add_stages`` cycles ago)."""
        return not self.te_taken[0]

    def _tensor_ready(self, ins):
        if len(self.order) >= self.order_depth:
            return False
        if ins.opcode == Opcode.LOAD_STATIONARY:
            fmt = numerics.format_of_code(ins.fields["format"])
            return self.loads.space() and (not fmt.mx or self.scales["load"].space())
        fmt = numerics.format_of_code(ins.fields["format"])
        return self.matmuls.space() and (not fmt.mx or self.scales["matmul"].space())

    def _tensor_accept(self, ins):
        f, width, seq = ins.fields, self.config.vector_word_bytes, self.sequence
        fmt = numerics.format_of_code(f["format"])
        size = exact_log2(numerics.column_bytes(self.config, fmt.name))
        if ins.opcode == Opcode.LOAD_STATIONARY:
            self.loads.queue.append(_place(f["sbuf_offset"], f["cols"], size, width, seq,
                                           mx=fmt.mx))
            if fmt.mx:
                self.scales["load"].queue.append(_place(f["scale_offset"], f["cols"], 0,
                                                        width, seq))
            self.load_pending = True
            self.tile_macs = f["rows"] * self.config.macs_per_pe_cycle(fmt.name) * f["cols"]
            self.order.append(True)
        else:
            self.matmuls.queue.append(_place(f["sbuf_offset"], f["n"], size, width, seq,
                                             mx=fmt.mx, swap=self.load_pending,
                                             macs=self.tile_macs, bank=f["psum_bank"],
                                             entry=f["psum_entry"],
                                             accumulate=f["accumulate"]))
            if fmt.mx:
                self.scales["matmul"].queue.append(_place(f["scale_offset"], f["n"], 0,
                                                          width, seq))
            self.load_pending = False
            self.order.append(False)
        self.sequence += 1

    def _te_owner(self):
        """The reader that has the SBUF port (hdl/tensor_unit.py: oldest first; a path's two
        readers by fewer words reserved); -1 when none wants it."""
        if self.te_locked:
            return self.te_owner
        readers = self.readers
        # A reader wants the port while a job has words not yet requested and it has room.
        wanting = [i for i, r in enumerate(readers)
                   if r.gen_pos < len(r.queue) and r.reserved != r.words]
        if len(wanting) < 2:
            return wanting[0] if wanting else -1
        owner = -1
        for i in wanting:
            a = readers[i]
            wins = True
            for j in wanting:
                if j == i:
                    continue
                b = readers[j]
                sa, sb = a.gen_sequence(), b.gen_sequence()
                if sa == sb:
                    first = a.reserved <= b.reserved if i < j else a.reserved < b.reserved
                else:
                    first = sa < sb
                if not first:
                    wins = False
                    break
            if wins:
                owner = i
        return owner

    def _tensor_commit(self, cycle, owner, request_valid, port_granted, load_take, mm_take,
                       te_write, te_write_last, retire, head_is_load):
        M = self.M
        loads, matmuls = self.loads, self.matmuls
        responding = self.te_responding.popleft()
        # which readers take and finish
        load_finish = load_take and loads.col == M - self.per_beat
        mm_job = matmuls.queue[0] if matmuls.queue else None
        mm_first = mm_take and matmuls.col == 0
        mm_last = mm_take and matmuls.col == mm_job["count"] - 1
        mm_entry = (mm_job["bank"], mm_job["entry"] + matmuls.col) if mm_take else None
        # (take, finish) of each reader, in the order of self.readers: a path's scale
        # reader follows its path for the MX jobs.
        takes = [(load_take, load_finish), (mm_take, mm_last)]
        if self.mx:
            load_mx = bool(loads.queue) and loads.queue[0]["mx"]
            mm_mx = mm_job is not None and mm_job["mx"]
            takes += [(load_take and load_mx, load_finish and load_mx),
                      (mm_take and mm_mx, mm_last and mm_mx)]
        swap = mm_first and mm_job["swap"]
        granted = owner if port_granted else -1
        readers = self.readers
        for index, (take, finish) in enumerate(takes):
            # Most cycles leave most readers as they are: commit only those that change.
            if take or finish or granted == index or responding == index:
                self._reader_commit(readers[index], granted == index, responding == index,
                                    take, finish)
        self.te_locked = request_valid and not port_granted
        self.te_owner = owner
        self.te_responding.append(owner if port_granted else -1)
        # the array
        complete = False
        if load_take:
            if self.load_beat == M // self.per_beat - 1:
                self.load_beat = 0
                complete = True
            else:
                self.load_beat += 1
        if mm_take and swap:
            # The retired bank's guard: reload_guard cycles from the swap.
            self.free_from[self.active] = cycle + self.reload_guard
            self.active = (self.active + 1) % self.banks
            self.active_valid = True
        self.pending += complete - (mm_take and swap)
        if mm_take:
            self.results.append((cycle + self.latency, mm_last))
            if mm_first:
                self.results_fifo += 1
        if te_write:
            self.results.popleft()
            if te_write_last:
                self.results_fifo -= 1
        # retire in program order
        if retire:
            self.order.popleft()
        self.loads_done += load_finish - (retire and head_is_load)
        self.matmuls_done += self.last_taken.popleft() - (retire and not head_is_load)
        self.last_taken.append(te_write_last)
        self.te_taken.popleft()
        self.te_taken.append(te_write)
        if self.entered:
            self.entered.popleft()
            self.entered.append(mm_entry)

    def _reader_commit(self, reader, granted, response, take, finish):
        """One column reader's clock edge: ``granted`` its request, ``response`` its word
        arrived, ``take`` its columns consumed, ``finish`` its job done."""
        pop = reader.pops() if take and reader.queue else 0
        if granted:
            reader.grant()
        reader.stored += response - pop
        reader.reserved += granted - pop
        if finish:
            reader.col = 0
            reader.queue.pop(0)
            reader.gen_pos -= 1
        elif take:
            reader.col += reader.columns
