"""cocotb testbench of the PSUM (:mod:`opentrn.hdl.psum`), on the memory bench of
:mod:`opentrn.sim.tb_sbuf` with the golden model :mod:`opentrn.golden.psum`.

A ``te_write`` accepted in cycle ``t`` writes back at the end of cycle ``t + 1 + N``
(``N = psum_add_stages``: the documented read-modify-write latency), so the scoreboard
replays it there; the arbitrated ``dma_write`` must get nothing in those cycles. Besides the
checks of the SBUF bench, the statistics count the hazards the run met: accumulates whose
read cycle saw a write to their word (a ``te_write``'s write-back, ``forwarded_te``, or a
``dma_write``, ``forwarded_dma``), accumulates that read their entry in the cycle of its
previous write-back (``back_to_back_same_entry``: one cycle apart with ``N = 0``, ``N + 1``
with ``N`` stages, the closest the tensor unit sends them), and accumulates that wrapped.
With ``N > 0`` the PSUM cannot forward a sum still in its adder: every test keeps an
accumulate ``N + 1`` cycles or more behind the previous beat into its entry, and no
``dma_write`` into its word between its read and its write-back (the random mix keeps the
DMA's words apart from the ``te_write`` entries); ``unforwarded`` counts the accumulates
that broke this, and must be 0.
On a build with float formats half the random ``te_write`` beats carry FP32 codes
(``float = 1``: accumulated by the FP32 adder), and ``test_float_accumulate`` checks FP32
accumulation with the adder testbench's corner pairs (NaN, infinities, cancellation, ties,
overflow), each pair back to back into one entry.

Environment as for :mod:`opentrn.sim.tb_sbuf` (``OPENTRN_OPS``, ``OPENTRN_SEED``, ...).
"""

import cocotb
import numpy as np

from opentrn import numerics
from opentrn.golden import fp_adder
from opentrn.golden import psum as golden
from opentrn.golden.processing_element import wrap
from opentrn.hdl.partitioned_memory import (
    word_request_layout,
    word_response_layout,
    word_write_layout,
)
from opentrn.hdl.psum import act_request_layout, act_response_layout, te_write_layout

from .tb_fp_adder import SPECIAL_CODES, directed_pairs, random_pairs
from .tb_sbuf import MemoryBench, check, report, settings, workload_rng


def te_write_latency(config):
    """Cycles from a te_write's transfer to the end of the cycle its write-back is
    committed in."""
    return 1 + config.psum_add_stages


class PSUMBench(MemoryBench):
    _golden = None          # the memories outlive a test (reset does not clear them)

    def __init__(self, dut, config, *, seed, gaps):
        if PSUMBench._golden is None:
            PSUMBench._golden = golden.PSUM(config)
        super().__init__(dut, PSUMBench._golden, seed=seed)
        self.config = config
        parts, width, depth = golden.geometry(config)
        self.geometry = parts, width, depth

        def act_read(model, request):
            return {"data": [int(v) for v in model.act_read(request["bank"],
                                                            request["entry"])]}

        def dma_read(model, request):
            return {"data": [int(b) for b in model.dma_read(request["partition"],
                                                            request["word"])]}

        self.read_port("act_read", act_request_layout(config), act_response_layout(config),
                       act_read, gaps=gaps)
        self.read_port("dma_read", word_request_layout(parts, depth),
                       word_response_layout(width), dma_read, gaps=gaps)
        self.write_port("te_write", te_write_layout(config),
                        lambda model, r: model.te_write(
                            r["bank"], r["entry"],
                            # FP32 codes travel in the signed acc_bits data field.
                            np.asarray(r["data"], np.int64) & 0xFFFF_FFFF if r["float"]
                            else r["data"], r["accumulate"], float=r["float"]),
                        gaps=gaps, delay=te_write_latency(config), arbitrated=False)
        self.write_port("dma_write", word_write_layout(parts, depth, width),
                        lambda model, r: model.dma_write(r["partition"], r["word"],
                                                         r["data"], r["strobe"]),
                        gaps=gaps)

    def word_of(self, bank, entry):
        return golden.entry_location(self.config, bank, entry)[0]

    def score(self):
        config = self.config
        latency = te_write_latency(config)
        te_entries = {}         # write-back cycle -> the te_write's (bank, entry)

        def blocked(events):
            return {cycle for cycle, kind, name, _, _ in events if name == "te_write"}

        def on_write(cycle, name, payload, write_words, stats):
            if name != "te_write":
                return
            entry = (payload["bank"], payload["entry"])
            if payload["accumulate"]:
                # Read in the transfer cycle, written back ``latency`` cycles later.
                read_cycle = cycle - latency
                if write_words.get(read_cycle) == payload["word"]:
                    if read_cycle in te_entries:
                        stats["forwarded_te"] += 1
                        if te_entries[read_cycle] == entry:
                            stats["back_to_back_same_entry"] += 1
                    else:
                        stats["forwarded_dma"] += 1
                # A write into its word after the read and before this write-back would be
                # lost: a te_write of its entry, or any dma_write (the tests keep both out).
                stats["unforwarded"] += sum(
                    1 for between in range(read_cycle + 1, cycle)
                    if write_words.get(between) == payload["word"]
                    and te_entries.get(between, entry) == entry)
                if payload["float"]:
                    stats["float_accumulates"] += 1
                else:
                    old = self.golden.act_read(payload["bank"], payload["entry"])
                    exact = old + np.asarray(payload["data"], dtype=np.int64)
                    stats["wrapped"] += int(np.any(wrap(exact, config.acc_bits) != exact))
                stats["accumulates"] += 1
            te_entries[cycle] = entry

        # te_write and act_read name an entry, not a word: add it for the bookkeeping.
        for name in ("te_write", "act_read"):
            port = self.writes.get(name) or self.reads[name]
            for (_, payload) in port.request.accepted:
                payload.setdefault("word", self.word_of(payload["bank"], payload["entry"]))
        stats = super().score(blocked_writes=blocked, on_write=on_write)
        for key in ("forwarded_te", "forwarded_dma", "back_to_back_same_entry", "wrapped",
                    "accumulates", "float_accumulates", "unforwarded"):
            stats.setdefault(key, 0)
        return stats


def _values(config, rng, count):
    """``count`` signed acc_bits values: uniform, or (a fifth of the beats) all extremes,
    so that accumulation wraps."""
    lo, hi = -(1 << (config.acc_bits - 1)), (1 << (config.acc_bits - 1)) - 1
    if rng.random() < 0.2:
        return [int(v) for v in rng.choice([lo, hi, hi // 2 + 1], count)]
    return [int(v) for v in rng.integers(lo, hi + 1, count)]


def _signed32(codes):
    """FP32 codes as the signed 32-bit lanes of the data field."""
    return [int(c) - (1 << 32) if int(c) >> 31 else int(c) for c in codes]


def _float_values(rng, count):
    """``count`` FP32 codes: a third the adder's special codes of either sign, a third
    any code, a third values of moderate size (sums that round and cancel)."""
    specials = np.array(SPECIAL_CODES, np.int64)
    roll = rng.random(count)
    moderate = numerics.to_bits(rng.standard_normal(count).astype(np.float32), "fp32")
    codes = np.select([roll < 1 / 3, roll < 2 / 3],
                      [rng.choice(specials, count) | (rng.integers(0, 2, count) << 31),
                       rng.integers(0, 1 << 32, count)], moderate.astype(np.int64))
    return _signed32(codes)


def te_beat(config, rng, bank, entry, accumulate, *, float_beat=False):
    data = _float_values(rng, config.pe_cols) if float_beat else \
        _values(config, rng, config.pe_cols)
    return {"bank": int(bank), "entry": int(entry), "accumulate": int(accumulate),
            "float": int(float_beat), "data": data}


def dma_write_beat(bench, rng, word, *, partition=None):
    parts, width, _ = bench.geometry
    return {"partition": int(rng.integers(parts)) if partition is None else partition,
            "word": int(word), "data": [int(b) for b in rng.integers(0, 256, width)],
            "strobe": nonzero_mask(rng, width)}


def nonzero_mask(rng, bits):
    """A random mask of ``bits`` bits, not 0 (built from bytes: a 64-byte word's strobe
    does not fit numpy's int64)."""
    mask = int.from_bytes(rng.integers(0, 256, (bits + 7) // 8).astype("uint8").tobytes(),
                          "little") & ((1 << bits) - 1)
    return mask or 1 << int(rng.integers(bits))


def random_requests(bench, rng, ops):
    """``ops`` requests on every port; half the te_writes on two hot entries that share a
    word, accumulate 60% of the time; with float formats half the te_writes float. With
    ``psum_add_stages = N > 0``: an accumulate into an entry among the last ``N``
    te_writes' becomes an overwrite (it would come fewer than ``N + 1`` cycles after
    them), and the te_writes take the first half of the entries, the dma_writes the words
    of the second half."""
    config = bench.config
    floats = bool(numerics.float_formats(config))
    parts, width, depth = bench.geometry
    banks, entries = config.psum_banks, config.psum_bank_entries
    stages = config.psum_add_stages
    te_slots, dma_words = banks * entries, range(depth)
    if stages:
        te_slots //= 2
        dma_words = range(bench.word_of(*divmod(te_slots, entries)), depth)
    hot = [divmod(0, entries), divmod(min(1, te_slots - 1), entries)]
    hot_word = bench.word_of(*hot[0])
    recent = []             # the last N te_writes' entries
    for _ in range(ops):
        roll = rng.random()
        if roll < 0.4:
            entry = (hot[int(rng.integers(2))] if rng.random() < 0.5
                     else divmod(int(rng.integers(te_slots)), entries))
            accumulate = rng.random() < 0.6 and entry not in recent
            bench.writes["te_write"].request.send(
                te_beat(config, rng, *entry, accumulate,
                        float_beat=floats and rng.random() < 0.5))
            recent = (recent + [entry])[-stages:] if stages else []
        elif roll < 0.6:
            word = (hot_word if rng.random() < 0.5 and not stages
                    else dma_words[int(rng.integers(len(dma_words)))])
            bench.writes["dma_write"].request.send(dma_write_beat(bench, rng, word))
        elif roll < 0.8:
            bench.reads["act_read"].request.send({"bank": int(rng.integers(banks)),
                                                  "entry": int(rng.integers(entries))})
        else:
            bench.reads["dma_read"].request.send({"partition": int(rng.integers(parts)),
                                                  "word": int(rng.integers(depth))})


async def read_back(bench):
    """Every word of every partition through ``dma_read`` and every entry through
    ``act_read``; return the byte image the DMA port shows."""
    config = bench.config
    parts, width, depth = bench.geometry
    dma = bench.reads["dma_read"]
    first = len(dma.response.received)
    for p in range(parts):
        for word in range(depth):
            dma.request.send({"partition": p, "word": word})
    for bank in range(config.psum_banks):
        for entry in range(config.psum_bank_entries):
            bench.reads["act_read"].request.send({"bank": bank, "entry": entry})
    await bench.drain(budget=4 * (parts * depth + config.psum_banks *
                                  config.psum_bank_entries) + 100)
    image = np.zeros((parts, depth * width), dtype=np.uint8)
    for index, (_, got) in enumerate(dma.response.received[first:]):
        p, word = divmod(index, depth)
        image[p, word * width:(word + 1) * width] = np.array(got["data"], dtype=np.uint8)
    return image


async def _start(dut, gaps=0.0):
    config, ops, seed = settings()
    bench = PSUMBench(dut, config, seed=seed, gaps=gaps)
    await bench.reset()
    bench.begin()
    return bench, config, ops, seed


@cocotb.test()
async def test_random_mix(dut):
    """All four ports at once with random gaps, then the whole PSUM read back: every
    response and the final image bit-exact."""
    bench, config, ops, seed = await _start(dut, gaps=0.3)
    random_requests(bench, workload_rng(seed, "random_mix"), ops)
    await bench.drain(budget=4 * ops + 200)
    bench.set_gaps(0.0)
    image = await read_back(bench)
    stats = bench.score()
    stats["image_equal"] = bool(np.array_equal(image, bench.golden.image))
    stats["cycles"] = bench.domain.now
    report({"test": "random_mix", "seed": seed, "ops": ops, "acc_bits": config.acc_bits,
            **stats})
    check(stats, "random_mix")
    assert stats["image_equal"], "the PSUM read back differs from the golden image"
    assert stats["max_read_wait"] <= 1


@cocotb.test()
async def test_back_to_back_accumulate(dut):
    """One te_write per cycle into ``N + 1`` entries in turn (``N = psum_add_stages``; one
    entry without stages), each overwritten once and then accumulated every ``N + 1``
    cycles, the closest the PSUM takes them: one beat accepted every cycle and no
    accumulation lost."""
    bench, config, _, seed = await _start(dut)
    rng = workload_rng(seed, "back_to_back")
    count = 4 * config.psum_bank_entries
    turn = 1 + config.psum_add_stages
    bank = config.psum_banks - 1
    te = bench.writes["te_write"].request
    for index in range(count):
        entry = config.psum_bank_entries - 1 - index % turn
        te.send(te_beat(config, rng, bank, entry, accumulate=index >= turn))
    await bench.drain(budget=4 * count + 100)
    for index in range(turn):
        bench.reads["act_read"].request.send(
            {"bank": bank, "entry": config.psum_bank_entries - 1 - index})
    await bench.drain(budget=100)
    cycles = [cycle for cycle, _ in te.accepted[-count:]]
    stats = bench.score()
    stats["te_idle_cycles"] = cycles[-1] - cycles[0] + 1 - count
    report({"test": "back_to_back_accumulate", "seed": seed, "beats": count,
            "entries": turn, **stats})
    check(stats, "back_to_back_accumulate")
    assert stats["te_idle_cycles"] == 0, "te_write did not sustain one beat per cycle"
    assert stats["back_to_back_same_entry"] == count - turn
    assert stats["unforwarded"] == 0


@cocotb.test()
async def test_accumulate_meets_dma_write(dut):
    """A dma_write to the word of an accumulate, granted in the cycle the accumulate reads
    it: te_write every ``N + 2`` cycles (``N = psum_add_stages``) into one entry, dma_write
    every cycle without stages (each waits out the write-backs), else in the te_writes'
    cycles (none between a read and its write-back), so each dma_write lands in a read
    cycle. Both survive, in commit order."""
    bench, config, _, seed = await _start(dut)
    rng = workload_rng(seed, "meets_dma_write")
    count = 2 * config.psum_bank_entries
    period = 2 + config.psum_add_stages
    bank, entry = 0, config.psum_bank_entries // 2
    word = bench.word_of(bank, entry)
    te = bench.writes["te_write"].request
    dma = bench.writes["dma_write"].request
    for index in range(count):
        idle = (period - 1) * int(index > 0)
        te.send(te_beat(config, rng, bank, entry, accumulate=True), idle=idle)
        dma.send(dma_write_beat(bench, rng, word),
                 idle=idle if config.psum_add_stages else 0)
    await bench.drain(budget=(4 + period) * count + 100)
    bench.reads["act_read"].request.send({"bank": bank, "entry": entry})
    await bench.drain(budget=100)
    stats = bench.score()
    report({"test": "accumulate_meets_dma_write", "seed": seed, "beats": count, **stats})
    check(stats, "accumulate_meets_dma_write")
    assert stats["forwarded_dma"] == count, stats
    assert stats["unforwarded"] == 0


@cocotb.test()
async def test_write_latency(dut):
    """A te_write accepted in cycle t is returned by a read granted in t + 2 + N, not by one
    granted in t + 1 + N (``N = psum_add_stages``; an act_read answers in the next
    cycle)."""
    bench, config, _, seed = await _start(dut)
    rng = workload_rng(seed, "latency")
    te = bench.writes["te_write"].request
    act = bench.reads["act_read"].request
    stages = config.psum_add_stages
    pairs = 8
    for index in range(pairs):
        bank, entry = index % config.psum_banks, (3 * index) % config.psum_bank_entries
        # Beat at cycle c; reads at c + 1 + N (old value) and c + 2 + N (new value). Both
        # sources start together; then each pair takes 5 cycles on either.
        te.send(te_beat(config, rng, bank, entry, accumulate=index % 2), idle=4)
        act.send({"bank": bank, "entry": entry}, idle=5 + stages if index == 0 else 3)
        act.send({"bank": bank, "entry": entry})
    await bench.drain(budget=20 * pairs + 100)
    stats = bench.score()
    te_cycles = [cycle for cycle, _ in te.accepted[-pairs:]]
    read_cycles = [cycle for cycle, _ in act.accepted[-2 * pairs:]]
    stats["read_offsets"] = sorted({r - t for t, r0, r1 in zip(
        te_cycles, read_cycles[::2], read_cycles[1::2], strict=True) for r in (r0, r1)})
    report({"test": "write_latency", "seed": seed, **stats})
    check(stats, "write_latency")
    assert stats["read_offsets"] == [1 + stages, 2 + stages], stats["read_offsets"]


@cocotb.test()
async def test_float_accumulate(dut):
    """FP32 accumulation (a build with float formats only): for each operand pair of the
    FP32 adder's testbench (every pair of its special codes, both signs: NaNs,
    infinities, zeros, subnormals, max finite; hand-picked ties and cancellations; random
    corner pairs), a float overwrite with ``a`` and, ``N + 1`` cycles later (``N =
    psum_add_stages``: the overwrites of ``N + 1`` entries, then their accumulates), a float
    accumulate of ``b`` into the same entry (so the read-modify-write forwards ``a``); every
    entry read back through ``act_read`` after each round: ``fp_add32(a, b)`` bit for
    bit."""
    config, _, seed = settings()
    if not numerics.float_formats(config):
        return
    bench = PSUMBench(dut, config, seed=seed, gaps=0.0)
    await bench.reset()
    bench.begin()
    rng = workload_rng(seed, "float_accumulate")
    a, b = directed_pairs()
    ra, rb = random_pairs(rng, 256)
    a = np.concatenate([a, ra]).astype(np.int64)
    b = np.concatenate([b, rb]).astype(np.int64)
    lanes, slots = config.pe_cols, config.psum_banks * config.psum_bank_entries
    pad = -len(a) % lanes
    a, b = np.pad(a, (0, pad)), np.pad(b, (0, pad))
    te, act = bench.writes["te_write"].request, bench.reads["act_read"].request
    beats = len(a) // lanes
    turn = 1 + config.psum_add_stages
    for first in range(0, beats, slots):
        round_end = min(first + slots, beats)
        for group in range(first, round_end, turn):
            members = range(group, min(group + turn, round_end))
            for accumulate, codes in ((0, a), (1, b)):
                for index in members:
                    bank, entry = divmod(index - first, config.psum_bank_entries)
                    lane = slice(index * lanes, (index + 1) * lanes)
                    # A short last group: the accumulates still N + 1 cycles behind.
                    idle = turn - len(members) if accumulate and index == group else 0
                    te.send({"bank": bank, "entry": entry, "accumulate": accumulate,
                             "float": 1, "data": _signed32(codes[lane])}, idle=idle)
        await bench.drain(budget=8 * slots + 100)
        for index in range(first, min(first + slots, beats)):
            bank, entry = divmod(index - first, config.psum_bank_entries)
            act.send({"bank": bank, "entry": entry})
        await bench.drain(budget=4 * slots + 100)
    stats = bench.score()
    sums = fp_adder.add(a, b).astype(np.int64)
    exponent, fraction = (sums >> 23) & 0xFF, sums & 0x7F_FFFF
    nonzero = ((a | b) & 0x7FFF_FFFF) != 0
    stats.update({
        "pairs": int(len(a)),
        "nan": int(np.sum((exponent == 0xFF) & (fraction != 0))),
        "inf": int(np.sum((exponent == 0xFF) & (fraction == 0))),
        "cancelled": int(np.sum(nonzero & (sums == 0))),
        "subnormal": int(np.sum((exponent == 0) & (fraction != 0))),
    })
    report({"test": "float_accumulate", "seed": seed, **stats})
    check(stats, "float_accumulate")
    assert stats["float_accumulates"] == beats
    assert stats["back_to_back_same_entry"] == beats
    assert stats["unforwarded"] == 0
