"""TensorUnit on Amaranth's simulator: random legal programs of LOAD_STATIONARY and MATMUL
against the golden tensor engine and PSUM, bit for bit, with the SBUF and PSUM modelled by
the testbench (random SBUF grants, PSUM back-pressure); retirement order and timing; the
fault of every rule; and the array's use on back-to-back matmuls."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import config, isa
from opentrn.golden import psum as golden_psum
from opentrn.golden import sbuf as golden_sbuf
from opentrn.golden import tensor_engine as golden_te
from opentrn.hdl import psum as hdl_psum
from opentrn.hdl.tensor_unit import TensorUnit
from opentrn.sim.streams import PayloadCodec

TINY = config.preset("tiny")
SMALL = config.preset("small")
LOAD, MATMUL = isa.Opcode.LOAD_STATIONARY, isa.Opcode.MATMUL


def _word(opcode, **fields):
    return int.from_bytes(isa.encode(opcode, **fields), "little")


def _reference(cfg, image, program):
    """The PSUM a program leaves, from the golden models: ``(psum image, total MACs)``."""
    k_rows, m_cols = cfg.pe_rows, cfg.pe_cols
    signed = image.astype(np.int8).astype(np.int64)
    result = golden_psum.PSUM(cfg)
    tile, tile_macs, macs = None, 0, 0
    for opcode, f in program:
        off = f["sbuf_offset"]
        if opcode == LOAD:
            tile = np.zeros((k_rows, m_cols), dtype=np.int64)
            tile[:f["rows"], :f["cols"]] = signed[:f["rows"], off:off + f["cols"]]
            tile_macs = f["rows"] * f["cols"]
        else:
            out = golden_te.matmul(cfg, tile, signed[:, off:off + f["n"]])
            for j in range(f["n"]):
                result.te_write(f["psum_bank"], f["psum_entry"] + j, out[:, j],
                                f["accumulate"])
            macs += f["n"] * tile_macs
    return result.image, macs


def _run(cfg, program, *, seed, grant=1.0, psum_ready=1.0, present=1.0, image=None,
         grant_every=None, cycles=20000):
    """Run ``program`` (``[(opcode, fields)]``) on a TensorUnit with a modelled SBUF and
    PSUM; check every PSUM beat's destination, the retire order and timing and ``active``;
    return the PSUM image and statistics.

    ``grant``: probability that a pending SBUF request is granted in a cycle (arbitration
    with the other readers); ``grant_every``: grant only every that many cycles instead.
    ``psum_ready``: probability that the PSUM accepts a beat. ``present``: probability that
    the sequencer presents the next instruction in a cycle."""
    rng = random.Random(seed)
    _, word_bytes, depth = golden_sbuf.geometry(cfg)
    if image is None:
        image = np.array([[rng.randrange(256) for _ in range(depth * word_bytes)]
                          for _ in range(cfg.sbuf_partitions)], dtype=np.uint8)
    # The raw bits of each vector response: partition p's word at bit p * 8W.
    vectors = [sum(int.from_bytes(image[p, w * word_bytes:(w + 1) * word_bytes].tobytes(),
                                  "little") << (p * 8 * word_bytes)
                   for p in range(cfg.sbuf_partitions)) for w in range(depth)]
    words = [_word(opcode, **f) for opcode, f in program]
    dut = TensorUnit(config=cfg)
    beat = PayloadCodec(hdl_psum.te_write_layout(cfg))
    model = golden_psum.PSUM(cfg)
    # Every expected PSUM beat in order: (program index, bank, entry, accumulate, last).
    beats = [(i, f["psum_bank"], f["psum_entry"] + j, f["accumulate"], j == f["n"] - 1)
             for i, (opcode, f) in enumerate(program) if opcode == MATMUL
             for j in range(f["n"])]
    stats = {"busy": [], "macs": 0, "retired": 0, "cycles": 0, "max_active": 0}

    async def bench(ctx):
        request, response = dut.sbuf_read.request, dut.sbuf_read.response
        write = dut.psum_write
        accepted = next_beat = 0
        presenting = False
        answer = None                  # the SBUF word answering this cycle
        last_write = {}                # program index -> cycle of its last PSUM beat
        for cycle in range(cycles):
            # -- drive ---------------------------------------------------------------------
            if accepted < len(program) and (presenting or rng.random() < present):
                presenting = True      # held until accepted, as a stream requires
                ctx.set(dut.instruction.payload.as_value(), words[accepted])
            ctx.set(dut.instruction.valid, presenting)
            ctx.set(response.valid, answer is not None)
            if answer is not None:
                ctx.set(response.payload.as_value(), vectors[answer])
            if grant_every is not None:
                granted = ctx.get(request.valid) and cycle % grant_every == 0
            else:
                granted = ctx.get(request.valid) and rng.random() < grant
            ctx.set(request.ready, granted)
            ready = rng.random() < psum_ready
            ctx.set(write.ready, ready)

            # -- sample: the transfers at the end of this cycle ----------------------------
            pending = accepted - stats["retired"]
            assert ctx.get(dut.active) == (pending > 0), cycle
            stats["max_active"] = max(stats["max_active"], pending)
            if presenting and ctx.get(dut.instruction.ready):
                accepted += 1
                presenting = False
            answer = ctx.get(request.payload.word) if granted else None
            if ctx.get(write.valid) and ready:
                got = beat.decode(ctx.get(write.payload.as_value()))
                index, bank, entry, accumulate, last = beats[next_beat]
                assert (got["bank"], got["entry"], got["accumulate"]) == \
                    (bank, entry, accumulate), (cycle, next_beat)
                model.te_write(bank, entry, np.array(got["data"]), accumulate)
                next_beat += 1
                if last:
                    last_write[index] = cycle
            if ctx.get(dut.retire):
                index = stats["retired"]
                assert index < accepted, cycle
                if program[index][0] == MATMUL:
                    # Readable in the PSUM from two cycles after its last beat.
                    assert index in last_write and cycle >= last_write[index] + 2, cycle
                stats["retired"] += 1
            if ctx.get(dut.busy):
                stats["busy"].append(cycle)
            stats["macs"] += ctx.get(dut.macs)
            assert ctx.get(dut.macs) == 0 or ctx.get(dut.busy)
            if stats["retired"] == len(program):
                stats["cycles"] = cycle + 1
                break
            await ctx.tick()
        else:
            raise AssertionError(f"not finished after {cycles} cycles: {accepted} accepted, "
                                 f"{stats['retired']} retired, {next_beat} PSUM beats")
        assert next_beat == len(beats)
        # Nothing more happens once everything retired.
        await ctx.tick()
        assert not ctx.get(dut.active) and not ctx.get(dut.retire)
        assert not ctx.get(write.valid) and not ctx.get(request.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    expected, macs = _reference(cfg, image, program)
    np.testing.assert_array_equal(model.image, expected)
    assert stats["macs"] == macs
    return stats


def _random_program(cfg, rng, matmuls, *, reuse=0.4):
    """Legal programs: a load before the first matmul, never two loads in a row; random
    tile sizes, offsets, lengths, destinations; tiles reused with probability ``reuse``."""
    size = cfg.sbuf_bytes_per_partition
    program = []
    for index in range(matmuls):
        if index == 0 or rng.random() >= reuse:
            rows = rng.choice([cfg.pe_rows, rng.randint(1, cfg.pe_rows)])
            cols = rng.choice([cfg.pe_cols, rng.randint(1, cfg.pe_cols)])
            program.append((LOAD, {"sbuf_offset": rng.randrange(size - cols + 1),
                                   "rows": rows, "cols": cols}))
        n = rng.choice([rng.randint(1, cfg.moving_max), rng.randint(1, 4)])
        program.append((MATMUL, {
            "sbuf_offset": rng.choice([rng.randrange(size - n + 1), size - n]),
            "n": n, "psum_bank": rng.randrange(cfg.psum_banks),
            "psum_entry": rng.randrange(cfg.psum_bank_entries - n + 1),
            "accumulate": rng.randrange(2)}))
    return program


@pytest.mark.parametrize("cfg, seed, grant, psum_ready, present, matmuls", [
    (TINY, 1, 1.0, 1.0, 1.0, 60),
    (TINY, 2, 0.33, 1.0, 0.5, 40),
    (TINY, 3, 0.6, 0.7, 0.8, 40),
    (TINY.replace(acc_bits=16), 4, 0.5, 0.8, 1.0, 30),
    (SMALL, 5, 0.5, 0.8, 0.9, 25),
    (TINY.replace(dma_bus_bytes=4, psum_banks=2), 6, 0.5, 0.8, 1.0, 30),
    (TINY.replace(pe_cols=8, moving_max=12, sbuf_bytes_per_partition=128), 7, 0.5, 0.8, 1.0,
     30),
], ids=["tiny-full", "tiny-slow-sbuf", "tiny-backpressure", "tiny-acc16", "small",
        "tiny-narrow-bus", "4x8-short-moving"])
def test_random_programs_match_golden(cfg, seed, grant, psum_ready, present, matmuls):
    program = _random_program(cfg, random.Random(seed), matmuls)
    stats = _run(cfg, program, seed=seed, grant=grant, psum_ready=psum_ready,
                 present=present)
    assert stats["retired"] == len(program)


def test_accumulate_into_one_entry_back_to_back():
    """Matmuls of one vector accumulating into one PSUM entry, back to back, with one tile
    and with a fresh tile each: the in-order PSUM read-modify-write loses nothing."""
    cfg = TINY
    program = [(LOAD, {"sbuf_offset": 3, "rows": 4, "cols": 4})]
    for i in range(12):
        if i % 3 == 2:
            program.append((LOAD, {"sbuf_offset": 7 * i, "rows": 1 + i % 4, "cols": 2}))
        program.append((MATMUL, {"sbuf_offset": 5 * i, "n": 1, "psum_bank": 1,
                                 "psum_entry": 9, "accumulate": int(i > 0)}))
    _run(cfg, program, seed=7)


def _idle(busy):
    """Cycles without a moving vector between the first and the last one."""
    return (busy[-1] - busy[0] + 1) - len(busy)


def _fresh_tiles(cfg, count, seed):
    """Back-to-back matmuls of n = psum_bank_entries, each with a fresh full tile, at
    random (mostly unaligned) SBUF offsets."""
    rng = random.Random(seed)
    program = []
    for i in range(count):
        program.append((LOAD, {"sbuf_offset": rng.randrange(200), "rows": cfg.pe_rows,
                               "cols": cfg.pe_cols}))
        program.append((MATMUL, {"sbuf_offset": rng.randrange(300),
                                 "n": cfg.psum_bank_entries,
                                 "psum_bank": i % cfg.psum_banks, "psum_entry": 0,
                                 "accumulate": 0}))
    return program


@pytest.mark.parametrize("cfg", [TINY, SMALL], ids=["tiny", "small"])
def test_fresh_tiles_keep_the_array_busy(cfg):
    """n = psum_bank_entries >= K + M with a fresh tile per matmul: the array takes a vector
    every cycle (issue interval n) when the SBUF grants every cycle, and when it grants only
    every third cycle (the read port shared with two always-requesting readers)."""
    assert cfg.psum_bank_entries >= cfg.pe_rows + cfg.pe_cols
    count = 12
    program = _fresh_tiles(cfg, count, seed=11)
    for grant_every in (None, 3):
        busy = _run(cfg, program, seed=12, grant_every=grant_every)["busy"]
        assert len(busy) == cfg.psum_bank_entries * count
        assert _idle(busy) == 0, (grant_every, _idle(busy))


@pytest.mark.parametrize("cfg, floor", [(TINY, 0.95), (SMALL, 0.98)], ids=["tiny", "small"])
def test_fresh_tiles_with_random_sbuf_grants(cfg, floor):
    """The same with the SBUF granting a third of the cycles at random: bursts without a
    grant cost some cycles (on tiny the two paths need up to 5 of the 5.3 words per matmul
    that a third of 16 cycles brings), but the array stays above ``floor`` busy."""
    program = _fresh_tiles(cfg, 20, seed=21)
    busy = _run(cfg, program, seed=22, grant=1 / 3)["busy"]
    assert len(busy) / (busy[-1] - busy[0] + 1) >= floor


@pytest.mark.parametrize("n", [1, 3])
def test_reused_tile_issues_back_to_back(n):
    """Matmuls reusing one tile issue back to back: no idle cycle between them."""
    cfg = TINY
    program = [(LOAD, {"sbuf_offset": 0, "rows": 4, "cols": 4})]
    program += [(MATMUL, {"sbuf_offset": 13 * i, "n": n, "psum_bank": i % 4,
                          "psum_entry": i % 8, "accumulate": 1}) for i in range(24)]
    stats = _run(cfg, program, seed=13)
    assert _idle(stats["busy"]) == 0


@pytest.mark.parametrize("n", [1, 4, 7])
def test_fresh_tiles_short_matmuls_at_the_engine_interval(n):
    """Below K + M vectors a fresh tile per matmul sets the pace: one matmul every
    max(n, K + M) cycles (docs/performance.md), nothing slower."""
    cfg = TINY
    count = 10
    program = []
    for i in range(count):
        program.append((LOAD, {"sbuf_offset": 8 * i, "rows": 4, "cols": 4}))
        program.append((MATMUL, {"sbuf_offset": 5 * i, "n": n, "psum_bank": 0,
                                 "psum_entry": 0, "accumulate": 1}))
    busy = _run(cfg, program, seed=14)["busy"]
    interval = golden_te.issue_interval(cfg, n, fresh=True)
    assert busy[-1] - busy[0] + 1 == (count - 1) * interval + n


# -- faults ---------------------------------------------------------------------------------

def _faults(cfg, accept, checks):
    """Accept the instructions ``accept`` (``[(opcode, fields)]``), then return the fault of
    each of ``checks`` presented on ``check``."""
    dut = TensorUnit(config=cfg)
    faults = []

    async def bench(ctx):
        for opcode, f in accept:
            ctx.set(dut.instruction.payload.as_value(), _word(opcode, **f))
            ctx.set(dut.instruction.valid, 1)
            while not ctx.get(dut.instruction.ready):
                await ctx.tick()
            await ctx.tick()
        ctx.set(dut.instruction.valid, 0)
        for opcode, f in checks:
            ctx.set(dut.check.as_value(), _word(opcode, **f))
            ctx.set(dut.check_valid, 1)
            faults.append(isa.Fault(ctx.get(dut.fault)))
            ctx.set(dut.check_valid, 0)
            assert ctx.get(dut.fault) == 0

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return faults


_B, _E = TINY.sbuf_bytes_per_partition, TINY.psum_bank_entries
_LOADED = [(LOAD, {"rows": 1, "cols": 1}), (MATMUL, {"n": 1})]
_GOOD_LOAD = {"sbuf_offset": _B - 4, "rows": 4, "cols": 4}
_GOOD_MATMUL = {"sbuf_offset": _B - 16, "n": 16, "psum_bank": 3, "psum_entry": 0}
BAD, RANGE, NONE = isa.Fault.BAD_FIELD, isa.Fault.OUT_OF_RANGE, isa.Fault.NONE


@pytest.mark.parametrize("opcode, fields, fault", [
    (LOAD, _GOOD_LOAD, NONE),
    (LOAD, {**_GOOD_LOAD, "rows": 0}, BAD),
    (LOAD, {**_GOOD_LOAD, "rows": 5}, BAD),
    (LOAD, {**_GOOD_LOAD, "cols": 0}, BAD),
    (LOAD, {**_GOOD_LOAD, "cols": 5}, BAD),
    (LOAD, {**_GOOD_LOAD, "sbuf_offset": _B - 3}, RANGE),
    (LOAD, {**_GOOD_LOAD, "sbuf_offset": 2**32 - 1}, RANGE),
    (LOAD, {"sbuf_offset": _B, "rows": 0, "cols": 4}, BAD),        # BAD_FIELD first
    (MATMUL, _GOOD_MATMUL, NONE),
    (MATMUL, {**_GOOD_MATMUL, "n": 0}, BAD),
    (MATMUL, {**_GOOD_MATMUL, "n": 17}, BAD),
    (MATMUL, {**_GOOD_MATMUL, "sbuf_offset": _B - 15}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "sbuf_offset": 2**32 - 1}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "psum_bank": 4}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "psum_bank": 255}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "n": 4, "psum_entry": 13}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "n": 1, "psum_entry": 65535}, RANGE),
    (MATMUL, {**_GOOD_MATMUL, "n": 17, "psum_bank": 4}, BAD),        # BAD_FIELD first
    (isa.Opcode.NOP, {}, NONE),
    (isa.Opcode.ACTIVATE, {"n": 0}, NONE),                 # another engine's rules
], ids=["load-ok", "rows-0", "rows-past-K", "cols-0", "cols-past-M", "load-past-sbuf",
        "load-offset-huge", "load-bad-before-range", "matmul-ok", "n-0", "n-past-moving-max",
        "matmul-past-sbuf", "matmul-offset-huge", "bank-past-banks", "bank-255",
        "entry-past-bank", "entry-huge", "matmul-bad-before-range", "nop", "activate"])
def test_field_rules(opcode, fields, fault):
    assert _faults(TINY, _LOADED, [(opcode, fields)]) == [fault]


def test_matmul_needs_a_load_before_it():
    faults = _faults(TINY, [], [(MATMUL, {"n": 1}), (LOAD, {"rows": 1, "cols": 1}),
                                (MATMUL, {"n": 0})])
    assert faults == [BAD, NONE, BAD]


def test_no_two_loads_without_a_matmul_between():
    load, matmul = (LOAD, {"rows": 1, "cols": 1}), (MATMUL, {"n": 1})
    assert _faults(TINY, [load], [load, matmul]) == [BAD, NONE]
    assert _faults(TINY, [load, matmul], [load, matmul]) == [NONE, NONE]
    assert _faults(TINY, [load, matmul, matmul], [load]) == [NONE]


def test_refuses_floating_point():
    with pytest.raises(ValueError, match="dtypes=bf16: the tensor unit drives the int8"):
        TensorUnit(config=TINY.replace(dtypes=("bf16",), acc_bits=32))
