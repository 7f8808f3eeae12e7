"""TensorUnit on Amaranth's simulator: random legal programs of LOAD_STATIONARY and MATMUL
(int8, and on tiny also BF16, FP8 E4M3 and FP8 E5M2 tiles) against the golden tensor engine
and PSUM, bit for bit, with the SBUF and PSUM modelled by the testbench (random SBUF grants,
PSUM back-pressure); retirement order and timing; the fault of every rule; and the array's
use on back-to-back matmuls."""

import random
from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from opentrn import config, isa, numerics
from opentrn.golden import psum as golden_psum
from opentrn.golden import sbuf as golden_sbuf
from opentrn.golden import tensor_engine as golden_te
from opentrn.hdl import psum as hdl_psum
from opentrn.hdl.tensor_unit import TensorUnit
from opentrn.sim.streams import PayloadCodec

from .conftest import MX_BUILDS

TINY = config.preset("tiny")
SMALL = config.preset("small")
TINY_INT8 = TINY.replace(dtypes=("int8",))
LOAD, MATMUL = isa.Opcode.LOAD_STATIONARY, isa.Opcode.MATMUL
CODE = {name: numerics.data_format(name).code for name in numerics.TENSOR_FORMATS}


def _word(opcode, **fields):
    return int.from_bytes(isa.encode(opcode, **fields), "little")


def _elements(image, offset, count, fmt):
    """``count`` elements of ``fmt`` from byte ``offset`` of every partition, as the raw
    bits the unit feeds the array (little-endian, zero-extended)."""
    size = fmt.bytes
    raw = image[:, offset:offset + count * size].astype(np.int64)
    return sum(raw[:, byte::size] << (8 * byte) for byte in range(size))


def _scales(cfg, image, rows, f, count):
    """An MX operand's E8M0 scales ``[blocks, count]`` (docs/isa.md): block ``b``'s from
    partition ``scale_partition + b`` at ``scale_offset`` for the blocks of the tile's
    ``rows``, 127 past them."""
    blocks = numerics.mx_blocks(cfg)
    scales = np.full((blocks, count), numerics.E8M0_BIAS, dtype=np.int64)
    used = -(-rows // numerics.MX_BLOCK)
    first, offset = f.get("scale_partition", 0), f["scale_offset"]
    scales[:used] = image[first:first + used, offset:offset + count]
    return scales


def _scale_partition(cfg, rng):
    """A legal ``scale_partition``: a multiple of the build's blocks, the blocks within the
    partitions; the first and the last group half of the time."""
    blocks = numerics.mx_blocks(cfg)
    groups = cfg.sbuf_partitions // blocks
    return blocks * rng.choice([0, groups - 1, rng.randrange(groups)])


def _reference(cfg, image, program):
    """The PSUM a program leaves, from the golden models: ``(psum image, total MACs)``."""
    k_rows, m_cols = cfg.pe_rows, cfg.pe_cols
    result = golden_psum.PSUM(cfg)
    tile, tile_macs, macs, fmt = None, 0, 0, None
    for opcode, f in program:
        off = f["sbuf_offset"]
        if opcode == LOAD:
            fmt = numerics.format_of_code(f.get("format", 0))
            tile = np.zeros((k_rows, m_cols), dtype=np.int64)
            tile[:f["rows"], :f["cols"]] = _elements(image, off, f["cols"], fmt)[:f["rows"]]
            tile_macs = f["rows"] * f["cols"]
            rows, cols = f["rows"], f["cols"]
            if fmt.mx:
                tile_scales = _scales(cfg, image, rows, f, m_cols)
                tile_scales[:, cols:] = numerics.E8M0_BIAS
        else:
            assert f.get("format", 0) == fmt.code
            # Outside the tile nothing contributes (docs/isa.md): partitions >= rows enter
            # as 0, PSUM partitions >= cols receive 0.
            moving = _elements(image, off, f["n"], fmt)
            moving[rows:] = 0
            if fmt.mx:
                out = golden_te.matmul_float(
                    tile, moving, fmt.name, scale_stationary=tile_scales,
                    scale_moving=_scales(cfg, image, rows, f, f["n"]))
            else:
                out = golden_te.matmul_bits(cfg, tile, moving, fmt.name)
            out[cols:] = 0
            for j in range(f["n"]):
                result.te_write(f["psum_bank"], f["psum_entry"] + j, out[:, j],
                                f["accumulate"], float=fmt.element is not None)
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
    _, word_bytes, depth = golden_sbuf.vector_geometry(cfg)
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
    # Every expected PSUM beat in order: (program index, bank, entry, accumulate, float,
    # last).
    beats = [(i, f["psum_bank"], f["psum_entry"] + j, f["accumulate"],
              int(f.get("format", 0) != CODE["int8"]), j == f["n"] - 1)
             for i, (opcode, f) in enumerate(program) if opcode == MATMUL
             for j in range(f["n"])]
    stats = {"busy": [], "macs": 0, "retired": 0, "cycles": 0, "max_active": 0}
    # The PSUM writes a beat back psum_add_stages cycles later than it reads its entry.
    stages = cfg.psum_add_stages

    async def bench(ctx):
        request, response = dut.sbuf_read.request, dut.sbuf_read.response
        write = dut.psum_write
        accepted = next_beat = 0
        presenting = False
        # The SBUF words granted in the last sbuf.read_latency cycles (None: no grant),
        # oldest first: the oldest answers this cycle.
        answers = deque([None] * golden_sbuf.read_latency(cfg))
        last_write = {}                # program index -> cycle of its last PSUM beat
        entry_written = {}             # (bank, entry) -> cycle of its last PSUM beat
        for cycle in range(cycles):
            # -- drive ---------------------------------------------------------------------
            if accepted < len(program) and (presenting or rng.random() < present):
                presenting = True      # held until accepted, as a stream requires
                ctx.set(dut.instruction.payload.as_value(), words[accepted])
            ctx.set(dut.instruction.valid, presenting)
            answer = answers.popleft()
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
            answers.append(ctx.get(request.payload.word) if granted else None)
            if ctx.get(write.valid) and ready:
                got = beat.decode(ctx.get(write.payload.as_value()))
                index, bank, entry, accumulate, is_float, last = beats[next_beat]
                assert (got["bank"], got["entry"], got["accumulate"], got["float"]) == \
                    (bank, entry, accumulate, is_float), (cycle, next_beat)
                values = np.array(got["data"], dtype=np.int64)
                if is_float:
                    values &= 0xFFFF_FFFF          # FP32 codes in the signed data field
                model.te_write(bank, entry, values, accumulate, float=is_float)
                if accumulate and (bank, entry) in entry_written:
                    # Never into a sum still in the PSUM's adder.
                    distance = cycle - entry_written[bank, entry]
                    assert distance > stages, (cycle, next_beat, distance)
                entry_written[bank, entry] = cycle
                next_beat += 1
                if last:
                    last_write[index] = cycle
            if ctx.get(dut.retire):
                index = stats["retired"]
                assert index < accepted, cycle
                if program[index][0] == MATMUL:
                    # Readable in the PSUM from 2 + psum_add_stages cycles after its last
                    # beat.
                    assert index in last_write and \
                        cycle >= last_write[index] + 2 + stages, cycle
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
    tile sizes, formats (of ``cfg.dtypes``), element-aligned offsets, lengths, destinations;
    tiles reused with probability ``reuse``."""
    size = cfg.sbuf_bytes_per_partition
    program = []
    fmt = None
    for index in range(matmuls):
        if index == 0 or rng.random() >= reuse:
            fmt = numerics.data_format(rng.choice(cfg.dtypes))
            rows = rng.choice([cfg.pe_rows, rng.randint(1, cfg.pe_rows)])
            cols = rng.choice([cfg.pe_cols, rng.randint(1, cfg.pe_cols)])
            program.append((LOAD, {
                "sbuf_offset": fmt.bytes * rng.randrange(size // fmt.bytes - cols + 1),
                "rows": rows, "cols": cols, "format": fmt.code,
                **({"scale_offset": rng.randrange(size - cols + 1),
                    "scale_partition": _scale_partition(cfg, rng)} if fmt.mx else {})}))
        n = rng.choice([rng.randint(1, cfg.moving_max), rng.randint(1, 4)])
        last = size // fmt.bytes - n
        program.append((MATMUL, {
            "sbuf_offset": fmt.bytes * rng.choice([rng.randrange(last + 1), last]),
            "n": n, "psum_bank": rng.randrange(cfg.psum_banks),
            "psum_entry": rng.randrange(cfg.psum_bank_entries - n + 1),
            "accumulate": rng.randrange(2), "format": fmt.code,
            **({"scale_offset": rng.choice([rng.randrange(size - n + 1), size - n]),
                "scale_partition": _scale_partition(cfg, rng)} if fmt.mx else {})}))
    return program


@pytest.mark.parametrize("cfg, seed, grant, psum_ready, present, matmuls", [
    (TINY, 1, 1.0, 1.0, 1.0, 60),
    (TINY, 2, 0.33, 1.0, 0.5, 40),
    (TINY, 3, 0.6, 0.7, 0.8, 40),
    (TINY_INT8.replace(acc_bits=16), 4, 0.5, 0.8, 1.0, 30),
    (SMALL, 5, 0.5, 0.8, 0.9, 25),
    (TINY.replace(dma_bus_bytes=4, psum_banks=2), 6, 0.5, 0.8, 1.0, 30),
    (TINY.replace(pe_cols=8, moving_max=12, sbuf_bytes_per_partition=128), 7, 0.5, 0.8, 1.0,
     30),
    # trn3's 64-byte bus: the engines read 32-byte vector words (Config.vector_word_bytes).
    (TINY.replace(dma_bus_bytes=64), 8, 0.6, 0.8, 1.0, 30),
    # Two stationary columns a beat (fast_weight_load 2): pairs that cross words, at every
    # column size (an MXFP8 column is half of tiny's word), with slow grants.
    (TINY.replace(fast_weight_load=2), 9, 1.0, 1.0, 1.0, 60),
    (TINY.replace(fast_weight_load=2), 10, 0.5, 0.8, 0.8, 40),
    (TINY.replace(fast_weight_load=2, pe_cols=8, moving_max=12, sbuf_bytes_per_partition=128),
     12, 0.6, 0.8, 1.0, 30),
    # Registers in the PSUM's accumulate: accumulates held off sums in its adder, the
    # retire later (_run checks both); two PSUM banks, so destinations meet often.
    (TINY.replace(psum_add_stages=4, psum_banks=2, psum_bank_entries=32), 13, 1.0, 1.0, 1.0,
     60),
    (TINY.replace(psum_add_stages=1, pe_add_stages=1), 14, 0.6, 0.8, 1.0, 40),
    # Registers at the SBUF's partitions: every word answered 2 or 3 cycles after its grant.
    (TINY.replace(sbuf_input_stages=1), 15, 1.0, 1.0, 1.0, 60),
    (TINY.replace(sbuf_input_stages=2, fast_weight_load=2), 16, 0.6, 0.8, 0.8, 40),
], ids=["tiny-full", "tiny-slow-sbuf", "tiny-backpressure", "tiny-acc16", "small",
        "tiny-narrow-bus", "4x8-short-moving", "tiny-wide-bus", "fast2-tiny-full",
        "fast2-tiny-slow", "fast2-4x8", "psum4-tiny-full", "psum1-tiny-backpressure",
        "sbuf1-tiny-full", "sbuf2-fast2-tiny-slow"])
def test_random_programs_match_golden(cfg, seed, grant, psum_ready, present, matmuls):
    program = _random_program(cfg, random.Random(seed), matmuls)
    stats = _run(cfg, program, seed=seed, grant=grant, psum_ready=psum_ready,
                 present=present)
    assert stats["retired"] == len(program)
    # Every format of the build was loaded and multiplied.
    used = {f["format"] for opcode, f in program if opcode == MATMUL}
    assert used == {CODE[name] for name in cfg.dtypes}


@pytest.mark.parametrize("fmt", ["bf16", "fp8e4m3", "fp8e5m2"])
def test_float_matmul_edge_values(fmt):
    """A float tile and moving vectors of the format's edge codes (zeros of both signs,
    subnormals, max finite, infinities, NaNs) in the SBUF, at offsets that start mid-word
    and cross words; accumulate and overwrite into one entry; bit for bit."""
    cfg = TINY
    data_format = numerics.data_format(fmt)
    size = data_format.bytes
    rng = np.random.default_rng(list(fmt.encode()))
    _, word_bytes, depth = golden_sbuf.vector_geometry(cfg)
    element = data_format.element
    man = element.man_bits
    edge = [0, 1, (1 << man) - 1, 1 << man, element.bias << man, element.max_finite_bits,
            element.canonical_nan, (1 << (element.bits - 1)) - 1]
    if element.has_inf:
        edge.append(element.exp_max_field << man)
    edge += [code | (1 << (element.bits - 1)) for code in edge]
    codes = np.where(rng.random((cfg.sbuf_partitions, depth * word_bytes // size)) < 0.5,
                     rng.choice(edge, (cfg.sbuf_partitions, depth * word_bytes // size)),
                     rng.integers(0, 1 << element.bits,
                                  (cfg.sbuf_partitions, depth * word_bytes // size)))
    image = np.stack([(codes >> (8 * b)) & 0xFF for b in range(size)], axis=2) \
        .reshape(cfg.sbuf_partitions, -1).astype(np.uint8)
    c = data_format.code
    program = [(LOAD, {"sbuf_offset": 3 * size, "rows": 4, "cols": 4, "format": c})]
    for i in range(6):
        program.append((MATMUL, {"sbuf_offset": (5 + 7 * i) * size, "n": 1 + 2 * i,
                                 "psum_bank": 2, "psum_entry": 1, "accumulate": int(i > 0),
                                 "format": c}))
    program.append((LOAD, {"sbuf_offset": 11 * size, "rows": 3, "cols": 2, "format": c}))
    program.append((MATMUL, {"sbuf_offset": 0, "n": 16, "psum_bank": 2, "psum_entry": 0,
                             "accumulate": 1, "format": c}))
    _run(cfg, program, seed=8, grant=0.7, psum_ready=0.8, image=image)

#: A 64-row array with an MX format: two blocks of 32 rows, so row k's scales come from
#: partition k // 32.
MX64 = MX_BUILDS["mx64"]


def _mx_image(cfg, rng, scale_region):
    """An SBUF image of FP8 codes of moderate values (a tenth random codes), with E8M0
    scales from byte ``scale_region`` on: mostly 117..137, some 0, 1, 254 and 255 (NaN)."""
    _, word_bytes, depth = golden_sbuf.vector_geometry(cfg)
    shape = (cfg.sbuf_partitions, depth * word_bytes)
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-4, 5, shape)
    image = numerics.to_bits(values.astype(np.float32), numerics.FP8E4M3).astype(np.int64)
    image = np.where(rng.random(shape) < 0.1, rng.integers(0, 256, shape), image)
    scales = np.where(rng.random(shape) < 0.9, rng.integers(117, 138, shape),
                      rng.choice([0, 1, 254, 255], shape))
    image[:, scale_region:] = scales[:, scale_region:]
    return image.astype(np.uint8)


@pytest.mark.parametrize("cfg", [TINY, MX64, TINY.replace(fast_weight_load=2),
                                 MX64.replace(fast_weight_load=2)],
                         ids=["tiny", "mx64", "fast2-tiny", "fast2-mx64"])
def test_mx_matmuls_take_their_scales(cfg):
    """MX loads and matmuls with scales at offsets that start mid-word and cross words,
    tiles of fewer rows than a block (its scales still apply) and, on the 64-row array,
    of one block (block 1 counts as 127) and of two; formats interleaved with FP8 and int8
    tiles that share the SBUF words; bit for bit against the golden engine."""
    rng = np.random.default_rng(cfg.pe_rows)
    half = cfg.sbuf_bytes_per_partition // 2
    image = _mx_image(cfg, rng, half)
    # Alternate the build's MX formats (tiny has both, the 64-row build one).
    e4, e5 = (CODE[name] for name in ("mxfp8e4m3", "mxfp8e5m2" if "mxfp8e5m2" in cfg.dtypes
                                      else "mxfp8e4m3"))
    k, m = cfg.pe_rows, cfg.pe_cols
    blocks = numerics.mx_blocks(cfg)
    groups = cfg.sbuf_partitions // blocks

    def partition(index):
        """Each instruction's scales in another group of partitions, the last among them."""
        return blocks * ((groups - 1 - 3 * index) % groups)

    program = []
    for i, (fmt, rows) in enumerate([(e4, k), (e5, k - 1), (e4, min(k, 20)), (CODE["int8"], k),
                                     (e5, min(k, 33)), (e4, 1)]):
        program.append((LOAD, {"sbuf_offset": 3 + 5 * i, "rows": rows, "cols": m,
                               "format": fmt, "scale_offset": half + 3 + 7 * i,
                               "scale_partition": partition(4 * i)}))
        for j in range(3):
            program.append((MATMUL, {"sbuf_offset": 11 * i + 7 * j, "n": 1 + 5 * j,
                                     "psum_bank": j, "psum_entry": i, "accumulate": j % 2,
                                     "format": fmt, "scale_offset": half + 13 * i + 9 * j,
                                     "scale_partition": partition(4 * i + j + 1)}))
    program = [(op, f if numerics.format_of_code(f["format"]).mx
                else {key: v for key, v in f.items()
                      if key not in ("scale_offset", "scale_partition")})
               for op, f in program]
    # Blocks past a tile's rows count as 127, whatever the SBUF holds: put NaN scales there.
    rows = None
    for op, f in program:
        rows = f["rows"] if op == LOAD else rows
        count = f["cols"] if op == LOAD else f["n"]
        if "scale_offset" in f:
            used = -(-rows // numerics.MX_BLOCK)
            first = f["scale_partition"]
            image[first + used:first + blocks, f["scale_offset"]:f["scale_offset"] + count] \
                = numerics.E8M0_NAN
    _run(cfg, program, seed=cfg.pe_rows, grant=0.7, psum_ready=0.8, image=image)


@pytest.mark.parametrize("stages", [0, 1, 4])
def test_accumulate_into_one_entry_back_to_back(stages):
    """Matmuls of one vector accumulating into one PSUM entry, back to back, with one tile
    and with a fresh tile each: the in-order PSUM read-modify-write loses nothing. With
    ``psum_add_stages`` such vectors enter ``stages + 1`` cycles apart, the closest the
    PSUM takes them (a 16-vector matmul first queues them up), and so does a matmul into
    the last entry of the one before."""
    cfg = TINY.replace(psum_add_stages=stages)
    program = [(LOAD, {"sbuf_offset": 3, "rows": 4, "cols": 4}),
               (MATMUL, {"sbuf_offset": 0, "n": 16, "psum_bank": 0, "psum_entry": 0,
                         "accumulate": 0}),
               (MATMUL, {"sbuf_offset": 1, "n": 1, "psum_bank": 0, "psum_entry": 15,
                         "accumulate": 1})]
    for i in range(12):
        if i % 3 == 2:
            program.append((LOAD, {"sbuf_offset": 7 * i, "rows": 1 + i % 4, "cols": 2}))
        program.append((MATMUL, {"sbuf_offset": 5 * i, "n": 1, "psum_bank": 1,
                                 "psum_entry": 9, "accumulate": int(i > 0)}))
    busy = _run(cfg, program, seed=7)["busy"]
    assert len(busy) == 16 + 1 + 12
    assert busy[16] - busy[15] == stages + 1
    # The one-vector matmuls into entry 9 with no load between them.
    single = busy[17:]
    assert [single[i + 1] - single[i] for i in range(11) if (i + 1) % 3 != 2] == \
        [stages + 1] * 7


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


@pytest.mark.parametrize("cfg", [TINY, SMALL, TINY.replace(sbuf_input_stages=2)],
                         ids=["tiny", "small", "tiny-sbuf2"])
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
@pytest.mark.parametrize("sbuf_stages", [0, 1, 2])
def test_reused_tile_issues_back_to_back(n, sbuf_stages):
    """Matmuls reusing one tile issue back to back: no idle cycle between them, however late
    the SBUF answers (its input stages: the buffers grow with them)."""
    cfg = TINY.replace(sbuf_input_stages=sbuf_stages)
    program = [(LOAD, {"sbuf_offset": 0, "rows": 4, "cols": 4})]
    program += [(MATMUL, {"sbuf_offset": 13 * i, "n": n, "psum_bank": i % 4,
                          "psum_entry": i % 8, "accumulate": 1}) for i in range(24)]
    stats = _run(cfg, program, seed=13)
    assert _idle(stats["busy"]) == 0


# (fast_weight_load, pe_cols, n). Not (2, 4, 1): a matmul every 2 cycles would need two
# SBUF words (its tile's and its vector's) every 2 cycles, the whole read port, which the
# readers' request-response turnaround does not sustain (about 2.4 cycles a matmul).
@pytest.mark.parametrize("fast, cols, n", [
    (fast, 4, n) for fast in (0, 1) for n in (1, 4, 7)] + [
    (2, 4, 4), (2, 4, 7), (2, 8, 1), (2, 8, 4), (2, 8, 7)])
@pytest.mark.parametrize("sbuf_stages", [0, 2])
def test_fresh_tiles_short_matmuls_at_the_engine_interval(n, fast, cols, sbuf_stages):
    """Below K + M vectors (M + 1 with the fast weight load, M / 2 with two columns a beat)
    a fresh tile per matmul sets the pace: one matmul every max(n, K + M), max(n, M + 1) or
    max(n, M / 2) cycles (docs/performance.md), nothing slower, also with the SBUF's
    answers two cycles later (its input stages)."""
    cfg = TINY.replace(fast_weight_load=fast, pe_cols=cols, sbuf_input_stages=sbuf_stages)
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
ILLEGAL = isa.Fault.ILLEGAL_OPCODE


#: (id, opcode, fields, fault) after an int8 load and matmul, on tiny.
FIELD_RULES = [
    ("load-ok", LOAD, _GOOD_LOAD, NONE),
    ("rows-0", LOAD, {**_GOOD_LOAD, "rows": 0}, BAD),
    ("rows-past-K", LOAD, {**_GOOD_LOAD, "rows": 5}, BAD),
    ("cols-0", LOAD, {**_GOOD_LOAD, "cols": 0}, BAD),
    ("cols-past-M", LOAD, {**_GOOD_LOAD, "cols": 5}, BAD),
    ("load-past-sbuf", LOAD, {**_GOOD_LOAD, "sbuf_offset": _B - 3}, RANGE),
    ("load-offset-huge", LOAD, {**_GOOD_LOAD, "sbuf_offset": 2**32 - 1}, RANGE),
    ("load-bad-before-range", LOAD, {"sbuf_offset": _B, "rows": 0, "cols": 4}, BAD),
    ("matmul-ok", MATMUL, _GOOD_MATMUL, NONE),
    ("n-0", MATMUL, {**_GOOD_MATMUL, "n": 0}, BAD),
    ("n-past-moving-max", MATMUL, {**_GOOD_MATMUL, "n": 17}, BAD),
    ("matmul-past-sbuf", MATMUL, {**_GOOD_MATMUL, "sbuf_offset": _B - 15}, RANGE),
    ("matmul-offset-huge", MATMUL, {**_GOOD_MATMUL, "sbuf_offset": 2**32 - 1}, RANGE),
    ("bank-past-banks", MATMUL, {**_GOOD_MATMUL, "psum_bank": 4}, RANGE),
    ("bank-255", MATMUL, {**_GOOD_MATMUL, "psum_bank": 255}, RANGE),
    ("entry-past-bank", MATMUL, {**_GOOD_MATMUL, "n": 4, "psum_entry": 13}, RANGE),
    ("entry-huge", MATMUL, {**_GOOD_MATMUL, "n": 1, "psum_entry": 65535}, RANGE),
    ("matmul-bad-before-range", MATMUL, {**_GOOD_MATMUL, "n": 17, "psum_bank": 4}, BAD),
    ("nop", isa.Opcode.NOP, {}, NONE),
    ("activate", isa.Opcode.ACTIVATE, {"n": 0}, NONE),     # another engine's rules
]


def _check_table(cfg, accept, table):
    """The fault of every ``(id, opcode, fields)`` check of ``table``, in one simulation
    (the unit is elaborated once: a tiny unit with its float PEs takes a second or two)."""
    got = _faults(cfg, accept, [(opcode, fields) for _, opcode, fields, _ in table])
    mismatches = [(name, want, fault) for (name, _, _, want), fault
                  in zip(table, got, strict=True) if fault != want]
    assert not mismatches, mismatches


def test_field_rules():
    _check_table(TINY, _LOADED, FIELD_RULES)


def test_matmul_needs_a_load_before_it():
    faults = _faults(TINY_INT8, [], [(MATMUL, {"n": 1}), (LOAD, {"rows": 1, "cols": 1}),
                                (MATMUL, {"n": 0})])
    assert faults == [BAD, NONE, BAD]


def test_no_two_loads_without_a_matmul_between():
    load, matmul = (LOAD, {"rows": 1, "cols": 1}), (MATMUL, {"n": 1})
    assert _faults(TINY_INT8, [load], [load, matmul]) == [BAD, NONE]
    assert _faults(TINY_INT8, [load, matmul], [load, matmul]) == [NONE, NONE]
    assert _faults(TINY_INT8, [load, matmul, matmul], [load]) == [NONE]


def _loaded(fmt):
    return [(LOAD, {"rows": 1, "cols": 1, "format": CODE[fmt]}),
            (MATMUL, {"n": 1, "format": CODE[fmt]})]


_MX_LOAD = {"sbuf_offset": 5, "rows": 4, "cols": 4, "format": CODE["mxfp8e4m3"]}
_MX_MATMUL = {**_GOOD_MATMUL, "format": CODE["mxfp8e4m3"]}
_MX64_LOAD = {"rows": 64, "cols": 2, "format": CODE["mxfp8e4m3"]}
_MX64_MATMUL = {"n": 1, "psum_bank": 0, "psum_entry": 0, "format": CODE["mxfp8e4m3"]}
_SWITCHED = _loaded("fp8e4m3") + [(LOAD, {"rows": 1, "cols": 1, "format": CODE["fp8e5m2"]})]
_ODD_BF16 = {"sbuf_offset": 3, "rows": 4, "cols": 4, "format": CODE["bf16"]}

#: (cfg, accepted instructions, [(id, opcode, fields, fault)]): the rules of the
#: instructions' ``format``, grouped by what was accepted before the checks.
FORMAT_RULES = {
    "small": (SMALL, _LOADED, [
        # ILLEGAL_OPCODE: a format the build lacks.
        ("load-bf16", LOAD, {**_GOOD_LOAD, "format": CODE["bf16"]}, ILLEGAL),
        ("load-fp8", LOAD, {**_GOOD_LOAD, "format": CODE["fp8e4m3"]}, ILLEGAL),
        ("matmul-bf16", MATMUL, {**_GOOD_MATMUL, "format": CODE["bf16"]}, ILLEGAL),
        ("matmul-fp8", MATMUL, {**_GOOD_MATMUL, "format": CODE["fp8e5m2"]}, ILLEGAL),
        ("load-mx", LOAD, {**_GOOD_LOAD, "format": CODE["mxfp8e4m3"]}, ILLEGAL),
        ("matmul-mx", MATMUL, {**_GOOD_MATMUL, "format": CODE["mxfp8e5m2"]}, ILLEGAL),
    ]),
    "tiny-int8-tile": (TINY, _LOADED, [
        # fp32 (6) and int32 (7) are no matmul formats.
        *[(f"load-code-{c}", LOAD, {**_GOOD_LOAD, "format": c}, ILLEGAL) for c in range(6, 8)],
        *[(f"matmul-code-{c}", MATMUL, {**_GOOD_MATMUL, "format": c}, ILLEGAL)
          for c in range(6, 8)],
        ("illegal-before-bad", LOAD, {"sbuf_offset": _B, "rows": 0, "cols": 4, "format": 6},
         ILLEGAL),
        # BF16 loads: 2-byte elements, even offsets, extents of 2 * cols bytes.
        ("bf16-load-ok", LOAD, {**_ODD_BF16, "sbuf_offset": _B - 8}, NONE),
        ("bf16-load-odd", LOAD, _ODD_BF16, BAD),
        ("bf16-load-past-sbuf", LOAD, {**_ODD_BF16, "sbuf_offset": _B - 6}, RANGE),
        ("bf16-load-odd-before-range", LOAD, {**_ODD_BF16, "sbuf_offset": _B - 7}, BAD),
        ("fp8-load-odd-ok", LOAD, {**_ODD_BF16, "format": CODE["fp8e4m3"]}, NONE),
        # A matmul's format must be its tile's (the latest accepted load's).
        ("int8-tile-bf16-matmul", MATMUL, {**_GOOD_MATMUL, "sbuf_offset": 0, "format": 1},
         BAD),
        ("int8-tile-fp8-matmul", MATMUL, {**_GOOD_MATMUL, "format": 2}, BAD),
    ]),
    "no-load": (TINY, [], [
        ("illegal-before-no-load", MATMUL, {"n": 0, "format": 7}, ILLEGAL),
        ("no-load", MATMUL, {"n": 1, "format": 1}, BAD),
    ]),
    "tiny-bf16-tile": (TINY, _loaded("bf16"), [
        ("bf16-matmul-ok", MATMUL, {**_GOOD_MATMUL, "sbuf_offset": _B - 32, "format": 1},
         NONE),
        ("bf16-matmul-odd", MATMUL, {**_GOOD_MATMUL, "sbuf_offset": 1, "format": 1}, BAD),
        ("bf16-matmul-past-sbuf", MATMUL,
         {**_GOOD_MATMUL, "sbuf_offset": _B - 30, "format": 1}, RANGE),
        ("bf16-matmul-2-bytes-each", MATMUL, {**_GOOD_MATMUL, "format": 1}, RANGE),
        ("bf16-tile-int8-matmul", MATMUL, {**_GOOD_MATMUL, "format": 0}, BAD),
        ("mismatch-before-range", MATMUL, {**_GOOD_MATMUL, "format": 0, "psum_bank": 9},
         BAD),
    ]),
    "tiny-fp8-tile": (TINY, _loaded("fp8e5m2"), [
        ("fp8-matmul-ok", MATMUL, {**_GOOD_MATMUL, "format": 3}, NONE),
        ("fp8-matmul-past-sbuf", MATMUL,
         {**_GOOD_MATMUL, "sbuf_offset": _B - 15, "format": 3}, RANGE),
        ("e5m2-tile-e4m3-matmul", MATMUL, {**_GOOD_MATMUL, "format": 2}, BAD),
    ]),
    # MX: the scales, one byte per column from scale_offset, must lie in the SBUF too.
    "tiny-mx-loads": (TINY, _LOADED, [
        ("mx-load-ok", LOAD, {**_MX_LOAD, "scale_offset": _B - 4}, NONE),
        ("mx-load-scales-past-sbuf", LOAD, {**_MX_LOAD, "scale_offset": _B - 3}, RANGE),
        ("mx-load-scales-huge", LOAD, {**_MX_LOAD, "scale_offset": 2**32 - 1}, RANGE),
        ("mx-load-cols-count", LOAD, {**_MX_LOAD, "cols": 2, "scale_offset": _B - 2}, NONE),
        ("mx-load-bad-before-scales", LOAD, {**_MX_LOAD, "rows": 0, "scale_offset": _B},
         BAD),
        ("mx-e5m2-load-scales-past", LOAD,
         {**_MX_LOAD, "format": CODE["mxfp8e5m2"], "scale_offset": _B - 1}, RANGE),
        ("fp8-load-ignores-scale-offset", LOAD,
         {**_MX_LOAD, "format": CODE["fp8e4m3"], "scale_offset": 2**32 - 1}, NONE),
        # ... and their partitions: one block a group on tiny, groups 0..3.
        ("mx-load-last-scale-partition", LOAD, {**_MX_LOAD, "scale_partition": 3}, NONE),
        ("mx-load-scale-partition-past", LOAD, {**_MX_LOAD, "scale_partition": 4}, RANGE),
        ("mx-load-scale-partition-huge", LOAD, {**_MX_LOAD, "scale_partition": 255}, RANGE),
        ("fp8-load-ignores-scale-partition", LOAD,
         {**_MX_LOAD, "format": CODE["fp8e4m3"], "scale_partition": 255}, NONE),
    ]),
    "tiny-mx-tile": (TINY, _loaded("mxfp8e4m3"), [
        ("mx-matmul-ok", MATMUL, {**_MX_MATMUL, "scale_offset": _B - 16}, NONE),
        ("mx-matmul-scales-past-sbuf", MATMUL, {**_MX_MATMUL, "scale_offset": _B - 15},
         RANGE),
        ("mx-matmul-scales-huge", MATMUL, {**_MX_MATMUL, "scale_offset": 2**32 - 16}, RANGE),
        ("mx-matmul-last-scale-partition", MATMUL, {**_MX_MATMUL, "scale_partition": 3},
         NONE),
        ("mx-matmul-scale-partition-past", MATMUL, {**_MX_MATMUL, "scale_partition": 4},
         RANGE),
        ("mx-matmul-bad-before-scales", MATMUL, {**_MX_MATMUL, "n": 0, "scale_offset": _B},
         BAD),
        ("mx-tile-fp8-matmul", MATMUL, {**_MX_MATMUL, "format": CODE["fp8e4m3"]}, BAD),
        ("mx-e4m3-tile-e5m2-matmul", MATMUL, {**_MX_MATMUL, "format": CODE["mxfp8e5m2"]},
         BAD),
    ]),
    # Two blocks a group on the 64-row build: an odd partition is misaligned (BAD_FIELD,
    # before the range rules), 62 the last group.
    "mx64-scale-partitions": (MX_BUILDS["mx64"], [
        (LOAD, {"rows": 64, "cols": 2, "format": CODE["mxfp8e4m3"]}),
        (MATMUL, {"n": 1, "format": CODE["mxfp8e4m3"]})], [
        ("mx64-load-partition-62", LOAD, {**_MX64_LOAD, "scale_partition": 62}, NONE),
        ("mx64-load-odd-partition", LOAD, {**_MX64_LOAD, "scale_partition": 1}, BAD),
        ("mx64-load-partition-64", LOAD, {**_MX64_LOAD, "scale_partition": 64}, RANGE),
        ("mx64-odd-before-range", LOAD,
         {**_MX64_LOAD, "scale_partition": 63, "scale_offset": 2**32 - 1}, BAD),
        ("mx64-matmul-partition-62", MATMUL, {**_MX64_MATMUL, "scale_partition": 62}, NONE),
        ("mx64-matmul-odd-partition", MATMUL, {**_MX64_MATMUL, "scale_partition": 7}, BAD),
        ("mx64-matmul-partition-64", MATMUL, {**_MX64_MATMUL, "scale_partition": 64},
         RANGE),
    ]),
    "tiny-latest-load": (TINY, _SWITCHED, [
        ("latest-load-counts", MATMUL, {**_GOOD_MATMUL, "format": 3}, NONE),
        ("earlier-load-does-not", MATMUL, {**_GOOD_MATMUL, "format": 2}, BAD),
    ]),
}


@pytest.mark.parametrize("group", list(FORMAT_RULES))
def test_format_rules(group):
    cfg, accept, table = FORMAT_RULES[group]
    _check_table(cfg, accept, table)


def test_refuses_what_the_hardware_cannot_build():
    """A column wider than an SBUF word, and MX formats of different MAC rates (every row
    takes one block's scales); a build without int8 is fine."""
    float_only = TINY.replace(dtypes=("bf16", "mxfp8e4m3"), acc_bits=32)
    Fragment.get(TensorUnit(config=float_only), None)
    with pytest.raises(ValueError, match=r"pe_macs_per_cycle=bf16:8: a column of bf16 is "
                                         r"8 x 2 = 16 bytes, more than one SBUF vector "
                                         r"word \(8 bytes: dma_bus_bytes=8, at most 32\)"):
        TensorUnit(config=float_only.replace(pe_macs_per_cycle=("bf16:8",)))
    with pytest.raises(ValueError, match=r"the MX formats must have one rate in the tensor "
                                         r"engine hardware \(not mxfp8e4m3:4, mxfp8e5m2:2\)"):
        TensorUnit(config=TINY.replace(pe_macs_per_cycle=("mxfp8e4m3:4", "mxfp8e5m2:2")))
