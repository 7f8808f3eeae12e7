"""The activation unit (hdl/activation_unit.py) on Amaranth's simulator, between models of
the PSUM and SBUF that grant at random: random legal ACTIVATE programs leave the SBUF bit
for bit as the golden activation engine applied instruction by instruction; retires come
one per instruction, in order, each when its last write is in; the fault code of every
ACTIVATE rule; and the cycles of one full-size instruction with memories always granting."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from opentrn import config, isa
from opentrn.golden import activation_engine as golden
from opentrn.golden import psum as golden_psum
from opentrn.golden import sbuf as golden_sbuf
from opentrn.hdl.activation_unit import ActivationUnit
from opentrn.sim.streams import PayloadCodec

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

#: The random runs: presets tiny and small, and a build with fewer lanes than SBUF
#: partitions (their strobes must stay 0), 4-byte SBUF words and 16-bit accumulators.
BUILDS = {
    "tiny": config.preset("tiny"),
    "small": config.preset("small"),
    "narrow": config.preset("tiny").replace(pe_rows=8, sbuf_partitions=8, dma_bus_bytes=4,
                                            acc_bits=16),
}
#: (instructions, read grant probability, write grant probability) per build.
RUNS = {"tiny": (150, 0.6, 0.5), "small": (100, 0.7, 0.6), "narrow": (80, 0.5, 0.4)}


# -- the rules of docs/isa.md, "ACTIVATE", written out independently ------------------------

def expected_fault(cfg, f):
    b = cfg.sbuf_bytes_per_partition
    n, size = f["n"], 4 if f["out_int32"] else 1
    src_lo, src_hi = f["src_offset"], f["src_offset"] + n
    dst_lo, dst_hi = f["dst_offset"], f["dst_offset"] + n * size
    overlap = src_lo < dst_hi and dst_lo < src_hi
    same = src_lo == dst_lo and not f["out_int32"]
    if (not 1 <= n <= cfg.moving_max or (f["out_int32"] and dst_lo % 4)
            or (f["bias"] and f["bias_offset"] % 4)
            or (f["src"] and overlap and not same)):
        return isa.Fault.BAD_FIELD
    if f["src"]:
        if src_hi > b:
            return isa.Fault.OUT_OF_RANGE
    elif f["psum_bank"] >= cfg.psum_banks or f["psum_entry"] + n > cfg.psum_bank_entries:
        return isa.Fault.OUT_OF_RANGE
    if dst_hi > b or (f["bias"] and f["bias_offset"] + 4 > b):
        return isa.Fault.OUT_OF_RANGE
    return isa.Fault.NONE


def _bits(opcode=isa.Opcode.ACTIVATE, **fields):
    return int.from_bytes(isa.encode(opcode, **fields), "little")


# -- the reference: the golden engine applied instruction by instruction ---------------------

def reference_step(cfg, image, psum, f):
    """Apply one ACTIVATE to ``image`` (``uint8 [sbuf_partitions, bytes]``) in place (fields
    not in ``f`` are 0, as :func:`opentrn.isa.encode` makes them)."""
    f = {field.name: 0 for field in isa.FORMATS[isa.Opcode.ACTIVATE]} | f
    lanes, n = cfg.pe_cols, f["n"]
    if f["src"]:
        x = image[:lanes, f["src_offset"]:f["src_offset"] + n].astype(np.int8).astype(np.int64)
    else:
        x = np.stack([psum.act_read(f["psum_bank"], f["psum_entry"] + j) for j in range(n)],
                     axis=1)
    bias = np.zeros(lanes, dtype=np.int64)
    if f["bias"]:
        raw = image[:lanes, f["bias_offset"]:f["bias_offset"] + 4].astype(np.int64)
        bias = raw @ (np.int64(1) << np.arange(0, 32, 8, dtype=np.int64))
        bias = np.where(bias >= 1 << 31, bias - (1 << 32), bias)
    y = golden.activate(cfg, x, function=f["function"], multiplier=f["multiplier"],
                        shift=f["shift"], bias=bias, out_int32=f["out_int32"])
    if f["out_int32"]:
        u = y & 0xFFFF_FFFF
        out = np.stack([(u >> (8 * k)) & 0xFF for k in range(4)], axis=2).reshape(lanes, 4 * n)
        image[:lanes, f["dst_offset"]:f["dst_offset"] + 4 * n] = out
    else:
        image[:lanes, f["dst_offset"]:f["dst_offset"] + n] = y & 0xFF
    return y


# -- random workloads -------------------------------------------------------------------------

def _signed_bits(rng, bits):
    """A signed value of magnitude about 2**k, k random below ``bits``."""
    k = rng.randrange(bits)
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, rng.randint(-(1 << k), 1 << k)))


def random_instruction(cfg, rng):
    """Random legal ACTIVATE fields, weighted to edges: n 1 and moving_max, offsets at 0
    and at the end of the partition, in-place, shift 0 and 63, extreme multipliers."""
    b, w = cfg.sbuf_bytes_per_partition, cfg.dma_bus_bytes
    while True:
        n = rng.choice([1, cfg.moving_max, rng.randint(1, cfg.moving_max)])
        out_int32 = int(rng.random() < 0.4)
        span = n * (4 if out_int32 else 1)

        def offset(length, align, near=None):
            choice = rng.random()
            if near is not None and choice < 0.25:      # close to another operand
                value = near + rng.randint(-2 * w, 2 * w)
            elif choice < 0.45:
                value = rng.randrange(4 * w)            # the first words
            elif choice < 0.6:
                value = b - length - rng.randrange(w)   # the end of the partition
            else:
                value = rng.randrange(b)
            value -= value % align
            return min(max(value, 0), (b - length) - (b - length) % align)

        f = {"src": int(rng.random() < 0.5), "function": rng.randrange(2),
             "out_int32": out_int32, "bias": int(rng.random() < 0.5), "n": n,
             "psum_bank": rng.randrange(cfg.psum_banks),
             "psum_entry": rng.randrange(cfg.psum_bank_entries - n + 1),
             "shift": rng.choice([0, 63, rng.randrange(64), rng.randrange(8, 40)]),
             "multiplier": rng.choice([0, 1, -1, INT32_MIN, INT32_MAX,
                                       _signed_bits(rng, 32), _signed_bits(rng, 12)])}
        f["dst_offset"] = offset(span, 4 if out_int32 else 1)
        f["src_offset"] = (f["dst_offset"] if not out_int32 and rng.random() < 0.3
                           else offset(n, 1, near=f["dst_offset"]))
        f["bias_offset"] = offset(4, 4, near=f["dst_offset"])
        if not f["src"]:
            f["src_offset"] = rng.randrange(1 << 32)     # ignored
        if not f["bias"] and rng.random() < 0.5:
            f["bias_offset"] = rng.randrange(1 << 32)    # ignored
        if expected_fault(cfg, f) == isa.Fault.NONE:
            return f


def initial_memories(cfg, rng):
    """SBUF int32 words of random magnitude (bias values of every size; their bytes as int8
    inputs), PSUM entries of random magnitude."""
    image = np.zeros((cfg.sbuf_partitions, cfg.sbuf_bytes_per_partition), dtype=np.uint8)
    for p in range(cfg.sbuf_partitions):
        values = [_signed_bits(rng, 32) & 0xFFFF_FFFF
                  for _ in range(cfg.sbuf_bytes_per_partition // 4)]
        image[p] = np.frombuffer(np.array(values, dtype="<u4").tobytes(), dtype=np.uint8)
    psum = golden_psum.PSUM(cfg)
    for bank in range(cfg.psum_banks):
        for entry in range(cfg.psum_bank_entries):
            psum.te_write(bank, entry, np.array([_signed_bits(rng, cfg.acc_bits)
                                                 for _ in range(cfg.pe_cols)]), 0)
    return image, psum


# -- the testbench ----------------------------------------------------------------------------

class Bench:
    """The unit with PSUM and SBUF models answering its ports; one call of :meth:`run`
    feeds a program and returns when every instruction has retired."""

    def __init__(self, cfg, image, psum, *, read_grant, write_grant, seed):
        self.cfg = cfg
        self.dut = ActivationUnit(config=cfg)
        self.sbuf = golden_sbuf.SBUF(cfg)
        self.sbuf.image[:] = image
        self.psum = psum
        self.read_grant, self.write_grant = read_grant, write_grant
        self.rng = random.Random(seed)
        dut = self.dut
        self.write_codec = PayloadCodec(dut.sbuf_write.payload.shape())
        self.psum_codec = PayloadCodec(dut.psum_read.request.payload.shape())
        self.word_bits = 8 * cfg.dma_bus_bytes
        self.events = []        # (cycle, kind, detail)
        self.busy = []          # cycles with a vector entering the engine
        self.writes = 0

    def _sbuf_response(self, word):
        data = self.sbuf.vector_read(word)
        return sum(int.from_bytes(data[p].tobytes(), "little") << (p * self.word_bits)
                   for p in range(data.shape[0]))

    def _psum_response(self, bank, entry):
        bits, mask = self.cfg.acc_bits, (1 << self.cfg.acc_bits) - 1
        return sum((int(v) & mask) << (p * bits)
                   for p, v in enumerate(self.psum.act_read(bank, entry)))

    def run(self, program, *, max_cycles, on_retire=None):
        dut, rng = self.dut, self.rng
        outgoing = [dut.psum_read.request, dut.sbuf_read.request, dut.sbuf_write]

        async def bench(ctx):
            queue = list(program)
            accepted, retired = 0, 0
            responses = {"psum": None, "sbuf": None}
            held = [None] * len(outgoing)          # (payload) offered but not taken
            for cycle in range(max_cycles):
                for name, port in (("psum", dut.psum_read), ("sbuf", dut.sbuf_read)):
                    ctx.set(port.response.valid, responses[name] is not None)
                    if responses[name] is not None:
                        ctx.set(port.response.payload.as_value(), responses[name])
                ctx.set(dut.instruction.valid, bool(queue))
                if queue:
                    ctx.set(dut.instruction.payload.as_value(), _bits(**queue[0]))
                ctx.set(dut.psum_read.request.ready, rng.random() < self.read_grant)
                ctx.set(dut.sbuf_read.request.ready, rng.random() < self.read_grant)
                ctx.set(dut.sbuf_write.ready, rng.random() < self.write_grant)

                # Stream rules: an offered payload stays until it is taken.
                for index, stream in enumerate(outgoing):
                    valid = ctx.get(stream.valid)
                    payload = ctx.get(stream.payload.as_value())
                    if held[index] is not None:
                        assert valid and payload == held[index], (cycle, index)
                    held[index] = payload if valid and not ctx.get(stream.ready) else None

                responses = {"psum": None, "sbuf": None}
                psum_request = dut.psum_read.request
                if ctx.get(psum_request.valid) and ctx.get(psum_request.ready):
                    request = self.psum_codec.decode(ctx.get(psum_request.payload.as_value()))
                    responses["psum"] = self._psum_response(request["bank"], request["entry"])
                    self.events.append((cycle, "psum_read", request))
                sbuf_request = dut.sbuf_read.request
                if ctx.get(sbuf_request.valid) and ctx.get(sbuf_request.ready):
                    word = ctx.get(sbuf_request.payload.word)
                    # Read before this cycle's write: the old data, as the SBUF does.
                    responses["sbuf"] = self._sbuf_response(word)
                    self.events.append((cycle, "sbuf_read", word))
                if ctx.get(dut.sbuf_write.valid) and ctx.get(dut.sbuf_write.ready):
                    write = self.write_codec.decode(ctx.get(dut.sbuf_write.payload.as_value()))
                    for p in range(self.cfg.pe_cols, self.cfg.sbuf_partitions):
                        assert write["strobe"][p] == 0, (cycle, p)
                    self.sbuf.act_write(write["word"], write["data"], write["strobe"])
                    self.writes += 1
                if ctx.get(dut.busy):
                    self.busy.append(cycle)

                if ctx.get(dut.instruction.valid) and ctx.get(dut.instruction.ready):
                    queue.pop(0)
                    self.events.append((cycle, "accept", accepted))
                    accepted += 1
                # Active from the cycle of the transfer through the retire cycle.
                assert ctx.get(dut.active) == (retired < accepted), cycle
                if ctx.get(dut.retire):
                    assert retired < accepted, f"cycle {cycle}: a retire with nothing accepted"
                    self.events.append((cycle, "retire", retired))
                    if on_retire is not None:
                        on_retire(retired, self.sbuf.image)
                    retired += 1
                    if retired == len(program):
                        break
                await ctx.tick()
            assert retired == len(program), f"{retired} of {len(program)} retired"

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(bench)
        sim.run()


# -- random programs ----------------------------------------------------------------------------

@pytest.mark.parametrize("build", list(BUILDS))
def test_random_programs(build):
    cfg = BUILDS[build]
    count, read_grant, write_grant = RUNS[build]
    rng = random.Random(f"activation-unit-{build}")
    image, psum = initial_memories(cfg, rng)
    program = [random_instruction(cfg, rng) for _ in range(count)]

    # The reference image after each instruction, and how much of the run saturates.
    expected, results = [], []
    state = image.copy()
    for f in program:
        results.append(reference_step(cfg, state, psum, f))
        expected.append(state.copy())
    values = np.concatenate([y.ravel() for y in results])
    int8_values = np.concatenate([y.ravel() for y, f in zip(results, program, strict=True)
                                  if not f["out_int32"]])
    # The workload is not degenerate: results inside the range and at both int8 bounds.
    assert (np.abs(values) < 100).mean() > 0.2
    assert (int8_values == 127).any() and (int8_values == -128).any()
    kinds = {(f["src"], f["out_int32"], f["bias"], f["function"]) for f in program}
    assert len(kinds) >= 12, kinds
    assert any(f["src"] and not f["out_int32"] and f["src_offset"] == f["dst_offset"]
               for f in program), "an in-place instruction"

    bench = Bench(cfg, image, psum, read_grant=read_grant, write_grant=write_grant, seed=1)
    checked = []

    def on_retire(index, sbuf_image):
        # Retire k: its last write is in (and no later instruction's).
        diff = np.argwhere(sbuf_image != expected[index])
        assert not diff.size, f"instruction {index} {program[index]}: bytes differ at " \
                              f"(partition, byte) {diff[:8].tolist()}"
        checked.append(index)

    bench.run(program, max_cycles=40 * sum(f["n"] + 10 for f in program),
              on_retire=on_retire)
    assert checked == list(range(len(program)))
    assert np.array_equal(bench.sbuf.image, expected[-1])

    # In order, one at a time: accept k, retire k, accept k + 1.
    order = [(kind, index) for _, kind, index in bench.events if kind in ("accept", "retire")]
    assert order == [(kind, k) for k in range(len(program)) for kind in ("accept", "retire")]
    # Each SBUF source word read once per instruction, each PSUM entry once.
    w = cfg.dma_bus_bytes
    reads = [detail for _, kind, detail in bench.events if kind in ("psum_read", "sbuf_read")]
    expected_reads = []
    for f in program:
        if f["bias"]:
            expected_reads.append(f["bias_offset"] // w)
        if f["src"]:
            first, last = f["src_offset"] // w, (f["src_offset"] + f["n"] - 1) // w
            expected_reads += list(range(first, last + 1))
        else:
            expected_reads += [{"bank": f["psum_bank"], "entry": f["psum_entry"] + j}
                               for j in range(f["n"])]
    assert reads == expected_reads
    assert len(bench.busy) == sum(f["n"] for f in program)
    # Results of one word merged: fewer writes than vectors.
    assert bench.writes < sum(f["n"] for f in program)


# -- faults --------------------------------------------------------------------------------------

_BASE = {"src": 0, "n": 4, "psum_bank": 0, "psum_entry": 0, "dst_offset": 0}


def _fault_cases(cfg):
    b, e, top = cfg.sbuf_bytes_per_partition, cfg.psum_bank_entries, cfg.moving_max
    bad, oor, ok = isa.Fault.BAD_FIELD, isa.Fault.OUT_OF_RANGE, isa.Fault.NONE
    return [
        # BAD_FIELD, one per rule
        ("n = 0", {"n": 0}, bad),
        ("n > moving_max", {"n": top + 1}, bad),
        ("int32 dst misaligned", {"out_int32": 1, "dst_offset": 2}, bad),
        ("bias misaligned", {"bias": 1, "bias_offset": 6}, bad),
        ("src overlaps dst", {"src": 1, "src_offset": 10, "dst_offset": 12}, bad),
        ("in place with int32", {"src": 1, "src_offset": 16, "dst_offset": 16,
                                 "out_int32": 1}, bad),
        # OUT_OF_RANGE, one per rule
        ("psum bank", {"psum_bank": cfg.psum_banks}, oor),
        ("psum entry + n", {"psum_entry": e - 3}, oor),
        ("src_offset + n", {"src": 1, "src_offset": b - 3, "dst_offset": 0}, oor),
        ("dst_offset + n (int8)", {"dst_offset": b - 3}, oor),
        ("dst_offset + 4n (int32)", {"out_int32": 1, "dst_offset": b - 12}, oor),
        ("bias_offset + 4", {"bias": 1, "bias_offset": b}, oor),
        ("no wrap at 2**32", {"dst_offset": (1 << 32) - 2}, oor),
        # BAD_FIELD rules come first
        ("bad before out of range", {"n": 0, "psum_bank": cfg.psum_banks}, bad),
        ("misaligned past the end", {"bias": 1, "bias_offset": b + 2}, bad),
        # legal edges, and fields the instruction does not use
        ("in place int8", {"src": 1, "src_offset": b - 4, "dst_offset": b - 4}, ok),
        ("adjacent", {"src": 1, "src_offset": 0, "dst_offset": 4}, ok),
        ("last psum entries", {"psum_bank": cfg.psum_banks - 1, "psum_entry": e - 4}, ok),
        ("last int32 bytes", {"out_int32": 1, "dst_offset": b - 16}, ok),
        ("last bias", {"bias": 1, "bias_offset": b - 4}, ok),
        ("n = moving_max", {"n": top}, ok),
        ("src=1 ignores psum", {"src": 1, "src_offset": 100, "psum_bank": 255,
                                "psum_entry": 65535}, ok),
        ("src=0 ignores src_offset", {"src_offset": (1 << 32) - 1}, ok),
        ("bias=0 ignores bias_offset", {"bias_offset": 7}, ok),
    ]


@pytest.mark.parametrize("build", ["tiny", "small"])
def test_fault_codes(build):
    cfg = BUILDS[build]
    dut = ActivationUnit(config=cfg)
    cases = _fault_cases(cfg)
    rng = random.Random(3)

    def random_fields():
        b, w = cfg.sbuf_bytes_per_partition, cfg.dma_bus_bytes

        def near(limit, bits=32):
            # Below, at and just past the limit; now and then anything the field holds.
            return max(0, rng.choice([rng.randrange(limit + 8), limit - rng.randrange(8),
                                      rng.randrange(1 << bits) if rng.random() < 0.1 else 0]))
        return {"src": rng.randrange(2), "out_int32": rng.randrange(2),
                "bias": rng.randrange(2), "n": rng.randrange(cfg.moving_max + 3),
                "psum_bank": rng.randrange(cfg.psum_banks + 2),
                "psum_entry": near(cfg.psum_bank_entries, 16),
                "src_offset": near(b) if rng.random() < 0.5 else rng.randrange(4 * w),
                "dst_offset": near(b) if rng.random() < 0.5 else rng.randrange(4 * w),
                "bias_offset": near(b)}

    async def bench(ctx):
        seen = {}
        for name, fields, code in cases:
            f = {**_BASE, **fields}
            assert expected_fault(cfg, {**{k: 0 for k in ("src_offset", "out_int32", "bias",
                                                         "bias_offset")}, **f}) == code, name
            ctx.set(dut.check_valid, 1)
            ctx.set(dut.check.as_value(), _bits(**f))
            assert ctx.get(dut.fault) == code, name
            # Only an ACTIVATE is checked, and only when valid.
            ctx.set(dut.check.as_value(), _bits(**f) & ~0xFF | isa.Opcode.MATMUL)
            assert ctx.get(dut.fault) == 0, name
            ctx.set(dut.check.as_value(), _bits(**f))
            ctx.set(dut.check_valid, 0)
            assert ctx.get(dut.fault) == 0, name
        ctx.set(dut.check_valid, 1)
        for _ in range(1500):
            f = random_fields()
            ctx.set(dut.check.as_value(), _bits(**f))
            code = expected_fault(cfg, f)
            assert ctx.get(dut.fault) == code, f
            seen[code] = seen.get(code, 0) + 1
        assert min(seen.get(c, 0) for c in (0, 2, 3)) > 100, seen

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


# -- throughput --------------------------------------------------------------------------------

#: Cycles from an instruction's transfer to its retire, memories always granting: one
#: cycle to read, one to buffer the response, the engine's STAGES, one to write; plus one
#: read and its response for the bias.
def _expected_cycles(cfg, f):
    return f["n"] + golden.latency(cfg) + 3 + 2 * f.get("bias", 0)


@pytest.mark.parametrize("build", ["tiny", "small"])
def test_throughput(build, capsys):
    cfg = BUILDS[build]
    rng = random.Random(7)
    image, psum = initial_memories(cfg, rng)
    n, b = cfg.moving_max, cfg.sbuf_bytes_per_partition
    common = {"n": n, "multiplier": 3, "shift": 1, "function": 1}
    program = [
        {**common, "src": 0, "psum_bank": 1, "dst_offset": 0},
        {**common, "src": 0, "psum_bank": 2, "out_int32": 1, "dst_offset": 64, "bias": 1,
         "bias_offset": 8},
        {**common, "src": 1, "src_offset": 3, "dst_offset": b // 2},
        {**common, "src": 1, "src_offset": 200, "dst_offset": 200},      # in place
    ]
    bench = Bench(cfg, image, psum, read_grant=1.0, write_grant=1.0, seed=0)
    bench.run(program, max_cycles=10 * len(program) * (n + 20))
    state = image.copy()
    for f in program:
        reference_step(cfg, state, psum, f)
    assert np.array_equal(bench.sbuf.image, state)

    accepts = [c for c, kind, _ in bench.events if kind == "accept"]
    retires = [c for c, kind, _ in bench.events if kind == "retire"]
    lines = []
    for k, f in enumerate(program):
        busy = [c for c in bench.busy if accepts[k] <= c <= retires[k]]
        # One vector per cycle within the instruction.
        assert busy == list(range(busy[0], busy[0] + n)), (k, busy)
        cycles = retires[k] - accepts[k]
        assert cycles == _expected_cycles(cfg, f), (k, cycles)
        if k:
            assert accepts[k] == retires[k - 1] + 1     # the next starts right after
        lines.append(f"{build}: ACTIVATE src={f['src']} out_int32={f.get('out_int32', 0)} "
                     f"bias={f.get('bias', 0)} n={n}: {cycles} cycles transfer to retire, "
                     f"{n} vectors in {busy[-1] - busy[0] + 1} consecutive cycles")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="pe_cols=8: must be at most sbuf_partitions=4"):
        ActivationUnit(config=config.preset("tiny").replace(pe_cols=8))
    with pytest.raises(ValueError, match="dtypes=bf16,"):
        ActivationUnit(config=config.preset("trn3"))
    with pytest.raises(TypeError, match="must be an opentrn.config.Config"):
        ActivationUnit(config={})
