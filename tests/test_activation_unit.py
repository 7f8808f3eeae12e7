"""The activation unit (hdl/activation_unit.py) on Amaranth's simulator, between models of
the PSUM and SBUF that grant at random: random legal ACTIVATE programs (integer and, in
builds with float formats, float output formats mixed) leave the SBUF bit for bit as the
golden activation engine applied instruction by instruction; retires come one per
instruction, in order, each when its last write is in; float results packed into SBUF
words (bf16 2 bytes, fp8 1, fp32 4) against numpy and ml_dtypes; the fault code of every
ACTIVATE rule; and the cycles of one full-size instruction with memories always granting."""

import random
from collections import deque

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from opentrn import config, isa, numerics
from opentrn.golden import activation_engine as golden
from opentrn.golden import psum as golden_psum
from opentrn.golden import sbuf as golden_sbuf
from opentrn.hdl.activation_unit import ActivationUnit
from opentrn.sim.streams import PayloadCodec

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

#: The random runs: presets tiny (int8 and the float formats) and small (int8 only), and
#: builds with fewer lanes than SBUF partitions (their strobes must stay 0) and 4-byte SBUF
#: words: one int8-only with 16-bit accumulators, one with the float formats (bf16 pairs
#: and fp32 words in 4-byte SBUF words); and 32-byte SBUF vector words.
BUILDS = {
    "tiny": config.preset("tiny"),
    "small": config.preset("small"),
    "narrow": config.preset("tiny").replace(pe_rows=8, sbuf_partitions=8, dma_bus_bytes=4,
                                            dtypes=("int8",), acc_bits=16),
    "narrow-float": config.preset("tiny").replace(pe_rows=8, sbuf_partitions=8,
                                                  dma_bus_bytes=4),
    # trn3's 64-byte bus: 32-byte SBUF vector words (Config.vector_word_bytes).
    "wide": config.preset("tiny").replace(dma_bus_bytes=64),
    # Every format with the lanes' input registered (the fpga preset's register), and with
    # a multiply stage alone (the FP32 multiplier cut after its product, the integer
    # product delayed).
    "staged": config.preset("tiny").replace(activation_input_stages=1),
    "multiply-staged": config.preset("tiny").replace(activation_multiply_stages=1),
    # Registers at the SBUF's partitions: its words (and the bias) answered 3 cycles after
    # their grant, the PSUM's still after 1.
    "sbuf-staged": config.preset("tiny").replace(sbuf_input_stages=2),
}
#: (instructions, read grant probability, write grant probability) per build.
RUNS = {"tiny": (150, 0.6, 0.5), "small": (100, 0.7, 0.6), "narrow": (80, 0.5, 0.4),
        "narrow-float": (80, 0.5, 0.4), "wide": (80, 0.6, 0.5), "staged": (80, 0.6, 0.5),
        "multiply-staged": (60, 0.6, 0.5), "sbuf-staged": (60, 0.6, 0.5)}

#: FP32 codes the float inputs, scales and biases are weighted toward: zeros of both signs,
#: infinities, NaNs (quiet, signalling, negative), the largest finite value, subnormals,
#: 1.0, a bf16 tie (1 + 2**-8), fp8 overflow thresholds (448, 464, 480, 57344, 61440).
FP32_EDGES = (0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
              0xFFC12345, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x807FFFFF, 0x00400000,
              0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000, 0x43E00000, 0x43E80000,
              0xC3F00000, 0x47600000, 0x47700000, 0x3C800000, 0x3B800000)


def _s32(code):
    """An FP32 code as the signed 32-bit value an s32 field or a PSUM entry holds."""
    code = int(code) & 0xFFFF_FFFF
    return code - (1 << 32) if code >> 31 else code


def _random_fp32(rng):
    """A random FP32 code, weighted to the edges and to moderate magnitudes."""
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(FP32_EDGES)
    if roll < 0.8:
        value = np.float32(rng.gauss(0, 1) * 2.0 ** rng.randint(-12, 12))
        return int(value.view(np.uint32))
    return rng.getrandbits(32)


def _formats(cfg):
    """The output formats of ``cfg`` by code."""
    return {fmt.code: fmt for fmt in numerics.activation_formats(cfg)}


# -- the rules of docs/isa.md, "ACTIVATE", written out independently ------------------------

def expected_fault(cfg, f):
    b = cfg.sbuf_bytes_per_partition
    if f["out_format"] not in _formats(cfg):
        return isa.Fault.ILLEGAL_OPCODE
    fmt = _formats(cfg)[f["out_format"]]
    n, size, is_float = f["n"], fmt.bytes, fmt.element is not None
    src_lo, src_hi = f["src_offset"], f["src_offset"] + n
    dst_lo, dst_hi = f["dst_offset"], f["dst_offset"] + n * size
    overlap = src_lo < dst_hi and dst_lo < src_hi
    same = src_lo == dst_lo and fmt.name == "int8"
    if (not 1 <= n <= cfg.moving_max or dst_lo % size
            or (f["bias"] and f["bias_offset"] % 4)
            or (f["src"] and overlap and not same)
            or (is_float and (f["src"] or f["shift"]))):
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
    fmt = _formats(cfg)[f["out_format"]]
    y = golden.activate(cfg, x, function=f["function"], multiplier=f["multiplier"],
                        shift=f["shift"], bias=bias, out_format=fmt.name)
    size = fmt.bytes
    u = y & 0xFFFF_FFFF
    out = np.stack([(u >> (8 * k)) & 0xFF for k in range(size)], axis=2).reshape(lanes,
                                                                                 size * n)
    image[:lanes, f["dst_offset"]:f["dst_offset"] + size * n] = out
    return y


# -- random workloads -------------------------------------------------------------------------

def _signed_bits(rng, bits):
    """A signed value of magnitude about 2**k, k random below ``bits``."""
    k = rng.randrange(bits)
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, rng.randint(-(1 << k), 1 << k)))


def _float_banks(cfg):
    """The PSUM banks :func:`initial_memories` fills with FP32 codes in a float build."""
    return range(cfg.psum_banks // 2, cfg.psum_banks) if golden.FLOAT_FORMATS[0] in \
        golden.out_formats(cfg) else range(0)


def _is_float_word(k):
    """SBUF 4-byte words ``k`` that :func:`initial_memories` fills with FP32 codes in a float
    build (pairs of words, so bias reads of either kind lie everywhere)."""
    return (k // 2) % 2 == 1


def random_instruction(cfg, rng):
    """Random legal ACTIVATE fields, weighted to edges: n 1 and moving_max, offsets at 0
    and at the end of the partition, in-place, shift 0 and 63, extreme multipliers; in a
    float build, half of them float (every float output format, FP32 scales and biases
    from the edge values, PSUM banks of FP32 codes)."""
    b, w = cfg.sbuf_bytes_per_partition, cfg.vector_word_bytes
    floats = [fmt for fmt in _formats(cfg).values() if fmt.element is not None]
    while True:
        n = rng.choice([1, cfg.moving_max, rng.randint(1, cfg.moving_max)])
        if floats and rng.random() < 0.5:
            fmt = rng.choice(floats)
        else:
            fmt = numerics.data_format("int32" if rng.random() < 0.4 else "int8")
        is_float = fmt.element is not None
        span = n * fmt.bytes

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
             "out_format": fmt.code, "bias": int(rng.random() < 0.5), "n": n,
             "psum_bank": rng.randrange(cfg.psum_banks),
             "psum_entry": rng.randrange(cfg.psum_bank_entries - n + 1),
             "shift": rng.choice([0, 63, rng.randrange(64), rng.randrange(8, 40)]),
             "multiplier": rng.choice([0, 1, -1, INT32_MIN, INT32_MAX,
                                       _signed_bits(rng, 32), _signed_bits(rng, 12)])}
        if is_float:
            f.update(src=0, shift=0, multiplier=_s32(_random_fp32(rng)))
            if rng.random() < 0.8:
                f["psum_bank"] = rng.choice(_float_banks(cfg))
        f["dst_offset"] = offset(span, fmt.bytes)
        f["src_offset"] = (f["dst_offset"] if fmt.name == "int8" and rng.random() < 0.3
                           else offset(n, 1, near=f["dst_offset"]))
        f["bias_offset"] = offset(4, 4, near=f["dst_offset"])
        if is_float and rng.random() < 0.8:
            # The FP32 words of the image (8 and 12 of every 16 bytes).
            word = f["bias_offset"] // 16 * 4 + 2 + rng.randrange(2)
            f["bias_offset"] = 4 * word if 4 * word + 4 <= b else 4 * word - 16
        if not f["src"]:
            f["src_offset"] = rng.randrange(1 << 32)     # ignored
        if not f["bias"] and rng.random() < 0.5:
            f["bias_offset"] = rng.randrange(1 << 32)    # ignored
        assert is_float == bool(f["out_format"] in [g.code for g in floats])
        if expected_fault(cfg, f) == isa.Fault.NONE:
            return f


def initial_memories(cfg, rng):
    """SBUF int32 words of random magnitude (bias values of every size; their bytes as int8
    inputs), PSUM entries of random magnitude; in a float build, FP32 codes (random and
    edge values) in the SBUF words of :func:`_is_float_word` and the PSUM banks of
    :func:`_float_banks`."""
    floats = bool(_float_banks(cfg))
    image = np.zeros((cfg.sbuf_partitions, cfg.sbuf_bytes_per_partition), dtype=np.uint8)
    for p in range(cfg.sbuf_partitions):
        values = [_random_fp32(rng) if floats and _is_float_word(k)
                  else _signed_bits(rng, 32) & 0xFFFF_FFFF
                  for k in range(cfg.sbuf_bytes_per_partition // 4)]
        image[p] = np.frombuffer(np.array(values, dtype="<u4").tobytes(), dtype=np.uint8)
    psum = golden_psum.PSUM(cfg)
    for bank in range(cfg.psum_banks):
        for entry in range(cfg.psum_bank_entries):
            if bank in _float_banks(cfg):
                values = [_s32(_random_fp32(rng)) for _ in range(cfg.pe_cols)]
            else:
                values = [_signed_bits(rng, cfg.acc_bits) for _ in range(cfg.pe_cols)]
            psum.te_write(bank, entry, np.array(values), 0)
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
        self.word_bits = 8 * cfg.vector_word_bytes
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
            # The answers granted in the last read latency's cycles (None: no grant), oldest
            # first: the oldest is due this cycle (the PSUM after 1 cycle, the SBUF after
            # sbuf.read_latency).
            answers = {"psum": deque([None]),
                       "sbuf": deque([None] * golden_sbuf.read_latency(self.cfg))}
            held = [None] * len(outgoing)          # (payload) offered but not taken
            for cycle in range(max_cycles):
                for name, port in (("psum", dut.psum_read), ("sbuf", dut.sbuf_read)):
                    answer = answers[name].popleft()
                    ctx.set(port.response.valid, answer is not None)
                    if answer is not None:
                        ctx.set(port.response.payload.as_value(), answer)
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
                for name, response in responses.items():
                    answers[name].append(response)
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
    formats = _formats(cfg)

    def outputs(*names):
        chosen = [y.ravel() for y, f in zip(results, program, strict=True)
                  if formats[f["out_format"]].name in names]
        return np.concatenate(chosen) if chosen else np.zeros(0, np.int64)

    values, int8_values = outputs("int8", "int32"), outputs("int8")
    # The workload is not degenerate: results inside the range and at both int8 bounds.
    assert (np.abs(values) < 100).mean() > 0.2
    assert (int8_values == 127).any() and (int8_values == -128).any()
    kinds = {(f["src"], f["out_format"], f["bias"], f["function"]) for f in program}
    assert len(kinds) >= 12, kinds
    assert any(f["src"] and formats[f["out_format"]].name == "int8"
               and f["src_offset"] == f["dst_offset"] for f in program), "an in-place one"
    for fmt in formats.values():
        if fmt.element is not None:
            # Every float output format, with NaN, infinite (fp8e4m3: no infinities) and
            # zero results among ordinary ones.
            codes = outputs(fmt.name)
            element = fmt.element
            magnitude = codes & ((1 << (element.bits - 1)) - 1)
            top = element.exp_max_field << element.man_bits
            assert (magnitude > top).any() or (element.name == "fp8e4m3"
                                               and (magnitude == 0x7F).any()), fmt.name
            assert (magnitude == 0).any() and ((magnitude > 0) & (magnitude < top)).any()
            if element.has_inf:
                assert (magnitude == top).any(), fmt.name

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
    w = cfg.vector_word_bytes
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


# -- float results in SBUF words ------------------------------------------------------------------

def test_float_results_packed_in_sbuf_words():
    """Float instructions on ``tiny`` (8-byte SBUF words) write bf16 codes as 2-byte pairs,
    fp8 codes as single bytes and fp32 codes as 4 bytes, little-endian, at offsets that
    start and end mid-word and cross words, leaving every other byte as it was. The
    expected bytes come from numpy float32 arithmetic and ml_dtypes casts, not from the
    golden model (which must agree as well)."""
    cfg = BUILDS["tiny"]
    lanes, n = cfg.pe_cols, 7
    rng = random.Random(11)
    image = np.array([[rng.randrange(256) for _ in range(cfg.sbuf_bytes_per_partition)]
                      for _ in range(cfg.sbuf_partitions)], dtype=np.uint8)
    # PSUM bank 1: FP32 values per lane and entry, edges among them; SBUF bias at byte 40.
    values = np.array([[1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, np.nan],
                       [3.0e38, -1.0e-40, 1.00390625, 465.0, 57344.0, 1.0e-3, -7.0],
                       [2.0 ** -130, 100.0, -100.0, 0.3, 1.0e30, -1.0e30, 448.0],
                       [0.5, -0.5, 65504.0, 1.5e-5, 240.0, -3.25, 12345.678]], np.float32)
    codes = values.view(np.uint32)
    psum = golden_psum.PSUM(cfg)
    for entry in range(n):
        psum.te_write(1, entry, np.array([_s32(c) for c in codes[:, entry]]), 0)
    bias = np.array([0.25, -1.0, 0.0, 1.0e38], np.float32)
    image[:lanes, 40:44] = bias.view(np.uint8).reshape(lanes, 4)
    scale = np.float32(1.5)
    common = {"src": 0, "psum_bank": 1, "psum_entry": 0, "n": n,
              "multiplier": _s32(scale.view(np.uint32))}
    # (fields, numpy type of the format, relu, with bias)
    program = [
        ({**common, "out_format": _CODES["bf16"], "dst_offset": 6}, ml_dtypes.bfloat16,
         False, False),
        ({**common, "out_format": _CODES["bf16"], "dst_offset": 100, "function": 1, "bias": 1,
          "bias_offset": 40}, ml_dtypes.bfloat16, True, True),
        ({**common, "out_format": _CODES["fp8e4m3"], "dst_offset": 203, "bias": 1,
          "bias_offset": 40}, ml_dtypes.float8_e4m3fn, False, True),
        ({**common, "out_format": _CODES["fp8e5m2"], "dst_offset": 301, "function": 1},
         ml_dtypes.float8_e5m2, True, False),
        ({**common, "out_format": _CODES["fp32"], "dst_offset": 404, "bias": 1,
          "bias_offset": 40}, np.float32, False, True),
    ]
    expected = image.copy()
    state = image.copy()
    for f, numpy_type, relu, with_bias in program:
        with np.errstate(all="ignore"):
            y = values * scale + (bias[:, None] if with_bias else np.float32(0))
        # NaN results are the canonical 0x7FC00000 (sign 0), which the cast keeps positive.
        y = np.where(np.isnan(y), np.uint32(0x7FC00000).view(np.float32), y)
        if relu:
            y = np.where(np.signbit(y) & ~np.isnan(y), np.float32(0), y)
        with np.errstate(all="ignore"):
            raw = y.astype(np.dtype(numpy_type).newbyteorder("<"))
        data = raw.view(np.uint8).reshape(lanes, -1)
        expected[:lanes, f["dst_offset"]:f["dst_offset"] + data.shape[1]] = data
        reference_step(cfg, state, psum, f)
        assert np.array_equal(state, expected), f
    # bf16: 2 bytes per result, little-endian (1.0 * 1.5 -> 0x3FC0 -> bytes C0 3F).
    assert list(expected[0, 6:8]) == [0xC0, 0x3F]
    bench = Bench(cfg, image, psum, read_grant=0.7, write_grant=0.6, seed=4)
    bench.run([f for f, *_ in program], max_cycles=2000)
    diff = np.argwhere(bench.sbuf.image != expected)
    assert not diff.size, f"bytes differ at (partition, byte) {diff[:8].tolist()}"


# -- faults --------------------------------------------------------------------------------------

_BASE = {"src": 0, "n": 4, "psum_bank": 0, "psum_entry": 0, "dst_offset": 0}


_CODES = {name: fmt.code for name, fmt in numerics.DATA_FORMATS.items()}


def _fault_cases(cfg):
    b, e, top = cfg.sbuf_bytes_per_partition, cfg.psum_bank_entries, cfg.moving_max
    bad, oor, ok = isa.Fault.BAD_FIELD, isa.Fault.OUT_OF_RANGE, isa.Fault.NONE
    illegal = isa.Fault.ILLEGAL_OPCODE
    int32, bf16, fp32 = _CODES["int32"], _CODES["bf16"], _CODES["fp32"]
    fp8e4m3, fp8e5m2 = _CODES["fp8e4m3"], _CODES["fp8e5m2"]
    cases = [
        # ILLEGAL_OPCODE: the MX codes are never an output format
        ("out_format mxfp8e4m3", {"out_format": _CODES["mxfp8e4m3"]}, illegal),
        ("out_format mxfp8e5m2", {"out_format": _CODES["mxfp8e5m2"]}, illegal),
        ("illegal before bad field", {"out_format": _CODES["mxfp8e5m2"], "n": 0}, illegal),
        # BAD_FIELD, one per rule
        ("n = 0", {"n": 0}, bad),
        ("n > moving_max", {"n": top + 1}, bad),
        ("int32 dst misaligned", {"out_format": int32, "dst_offset": 2}, bad),
        ("bias misaligned", {"bias": 1, "bias_offset": 6}, bad),
        ("src overlaps dst", {"src": 1, "src_offset": 10, "dst_offset": 12}, bad),
        ("in place with int32", {"src": 1, "src_offset": 16, "dst_offset": 16,
                                 "out_format": int32}, bad),
        # OUT_OF_RANGE, one per rule
        ("psum bank", {"psum_bank": cfg.psum_banks}, oor),
        ("psum entry + n", {"psum_entry": e - 3}, oor),
        ("src_offset + n", {"src": 1, "src_offset": b - 3, "dst_offset": 0}, oor),
        ("dst_offset + n (int8)", {"dst_offset": b - 3}, oor),
        ("dst_offset + 4n (int32)", {"out_format": int32, "dst_offset": b - 12}, oor),
        ("bias_offset + 4", {"bias": 1, "bias_offset": b}, oor),
        ("no wrap at 2**32", {"dst_offset": (1 << 32) - 2}, oor),
        # BAD_FIELD rules come first
        ("bad before out of range", {"n": 0, "psum_bank": cfg.psum_banks}, bad),
        ("misaligned past the end", {"bias": 1, "bias_offset": b + 2}, bad),
        # legal edges, and fields the instruction does not use
        ("in place int8", {"src": 1, "src_offset": b - 4, "dst_offset": b - 4}, ok),
        ("adjacent", {"src": 1, "src_offset": 0, "dst_offset": 4}, ok),
        ("last psum entries", {"psum_bank": cfg.psum_banks - 1, "psum_entry": e - 4}, ok),
        ("last int32 bytes", {"out_format": int32, "dst_offset": b - 16}, ok),
        ("last bias", {"bias": 1, "bias_offset": b - 4}, ok),
        ("n = moving_max", {"n": top}, ok),
        ("src=1 ignores psum", {"src": 1, "src_offset": 100, "psum_bank": 255,
                                "psum_entry": 65535}, ok),
        ("src=0 ignores src_offset", {"src_offset": (1 << 32) - 1}, ok),
        ("bias=0 ignores bias_offset", {"bias_offset": 7}, ok),
        ("int path: any shift", {"shift": 63}, ok),
    ]
    floats = {"bf16": bf16, "fp8e4m3": fp8e4m3, "fp8e5m2": fp8e5m2, "fp32": fp32}
    if "bf16" not in cfg.dtypes:
        # An int8-only build has no float path: every float output format is illegal.
        return cases + [(f"out_format {name} (no float path)", {"out_format": code},
                         illegal) for name, code in floats.items()]
    return cases + [
        # BAD_FIELD: element alignment, and the float path reads PSUM only, without shift
        ("bf16 dst odd", {"out_format": bf16, "dst_offset": 3}, bad),
        ("fp32 dst misaligned", {"out_format": fp32, "dst_offset": 6}, bad),
        ("float from SBUF", {"out_format": fp8e4m3, "src": 1, "src_offset": 100,
                             "dst_offset": 0}, bad),
        ("float in place", {"out_format": fp8e5m2, "src": 1, "src_offset": 64,
                            "dst_offset": 64}, bad),
        ("float shift", {"out_format": bf16, "shift": 1}, bad),
        ("float shift 63", {"out_format": fp32, "shift": 63}, bad),
        ("misaligned bf16 past the end", {"out_format": bf16, "dst_offset": b + 1}, bad),
        # OUT_OF_RANGE with 2- and 4-byte extents
        ("dst_offset + 2n (bf16)", {"out_format": bf16, "dst_offset": b - 6}, oor),
        ("dst_offset + 4n (fp32)", {"out_format": fp32, "dst_offset": b - 12}, oor),
        ("dst_offset + n (fp8)", {"out_format": fp8e4m3, "dst_offset": b - 3}, oor),
        # legal edges
        ("last bf16 bytes", {"out_format": bf16, "dst_offset": b - 8}, ok),
        ("last fp32 bytes", {"out_format": fp32, "dst_offset": b - 16, "bias": 1,
                             "bias_offset": b - 4}, ok),
        ("fp8 at an odd offset", {"out_format": fp8e5m2, "dst_offset": b - 5}, ok),
        ("bf16 at 2 mod 4", {"out_format": bf16, "dst_offset": 2, "function": 1}, ok),
        ("float ignores src_offset", {"out_format": fp32, "src_offset": 0}, ok),
    ]


@pytest.mark.parametrize("build", ["tiny", "small"])
def test_fault_codes(build):
    """Every rule of docs/isa.md "Errors" for ACTIVATE, in order, on a float build and on
    an int8-only one; then random fields near every limit against the rules written out
    in :func:`expected_fault`."""
    cfg = BUILDS[build]
    dut = ActivationUnit(config=cfg)
    cases = _fault_cases(cfg)
    rng = random.Random(3)

    def random_fields():
        b, w = cfg.sbuf_bytes_per_partition, cfg.vector_word_bytes

        def near(limit, bits=32):
            # Below, at and just past the limit; now and then anything the field holds.
            return max(0, rng.choice([rng.randrange(limit + 8), limit - rng.randrange(8),
                                      rng.randrange(1 << bits) if rng.random() < 0.1 else 0]))
        legal = list(_formats(cfg))
        return {"src": rng.randrange(2),
                "out_format": rng.choice(legal) if rng.random() < 0.7 else rng.randrange(8),
                "shift": rng.choice([0, 0, 0, 1, rng.randrange(64)]),
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
            assert expected_fault(cfg, {**{k: 0 for k in ("src_offset", "out_format", "bias",
                                                         "bias_offset", "shift")},
                                        **f}) == code, name
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
        for _ in range(2000):
            f = random_fields()
            ctx.set(dut.check.as_value(), _bits(**f))
            code = expected_fault(cfg, f)
            assert ctx.get(dut.fault) == code, f
            seen[code] = seen.get(code, 0) + 1
        assert min(seen.get(c, 0) for c in (0, 1, 2, 3)) > 100, seen

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def test_float_only_build_refuses_integer_outputs():
    """A build without int8 has no integer path: int8 and int32 outputs are
    ``ILLEGAL_OPCODE``, as the MX codes are; its float outputs are legal, and an SBUF source
    (integer path only) is ``BAD_FIELD``."""
    cfg = config.preset("tiny").replace(dtypes=("bf16", "mxfp8e4m3"))
    dut = ActivationUnit(config=cfg)
    cases = [(name, {"out_format": _CODES[name]}, isa.Fault.ILLEGAL_OPCODE)
             for name in ("int8", "int32", "mxfp8e4m3")]
    cases += [(name, {"out_format": _CODES[name]}, isa.Fault.NONE)
              for name in ("fp32", "bf16", "fp8e4m3")]
    cases.append(("bf16 from the SBUF", {"out_format": _CODES["bf16"], "src": 1,
                                         "src_offset": 64}, isa.Fault.BAD_FIELD))

    async def bench(ctx):
        ctx.set(dut.check_valid, 1)
        for name, fields, code in cases:
            f = {**_BASE, **fields}
            assert expected_fault(cfg, {**{k: 0 for k in ("src_offset", "bias", "bias_offset",
                                                         "shift")}, **f}) == code, name
            ctx.set(dut.check.as_value(), _bits(**f))
            assert ctx.get(dut.fault) == code, name

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


# -- throughput --------------------------------------------------------------------------------

#: Cycles from an instruction's transfer to its retire, memories always granting: one
#: cycle to read, one to buffer the response, the engine's STAGES, one to write; plus one
#: read and its response for the bias; an SBUF read's input stages on an SBUF source and on
#: the bias.
def _expected_cycles(cfg, f):
    late = golden_sbuf.read_latency(cfg) - 1        # the SBUF's input stages
    bias = f.get("bias", 0)
    return f["n"] + golden.latency(cfg) + 3 + 2 * bias + late * (f["src"] + bias)


@pytest.mark.parametrize("build", ["tiny", "small", "staged", "sbuf-staged"])
def test_throughput(build, capsys):
    cfg = BUILDS[build]
    rng = random.Random(7)
    image, psum = initial_memories(cfg, rng)
    n, b = cfg.moving_max, cfg.sbuf_bytes_per_partition
    common = {"n": n, "multiplier": 3, "shift": 1, "function": 1}
    program = [
        {**common, "src": 0, "psum_bank": 1, "dst_offset": 0},
        {**common, "src": 0, "psum_bank": 2, "out_format": _CODES["int32"], "dst_offset": 64,
         "bias": 1, "bias_offset": 8},
        {**common, "src": 1, "src_offset": 3, "dst_offset": b // 2},
        {**common, "src": 1, "src_offset": 200, "dst_offset": 200},      # in place
    ]
    if "bf16" in cfg.dtypes:
        # The float path at the same rate, for each result size.
        scale = {**common, "shift": 0, "multiplier": _s32(0x3FC00000), "src": 0}   # 1.5
        program += [
            {**scale, "psum_bank": 3, "out_format": _CODES["bf16"], "dst_offset": 1024,
             "bias": 1, "bias_offset": 8},
            {**scale, "psum_bank": 2, "out_format": _CODES["fp8e4m3"], "dst_offset": 1101},
            {**scale, "psum_bank": 3, "out_format": _CODES["fp32"], "dst_offset": 2048,
             "bias": 1, "bias_offset": 12},
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
        name = numerics.format_of_code(f.get("out_format", 0)).name
        lines.append(f"{build}: ACTIVATE src={f['src']} out_format={name} "
                     f"bias={f.get('bias', 0)} n={n}: {cycles} cycles transfer to retire, "
                     f"{n} vectors in {busy[-1] - busy[0] + 1} consecutive cycles")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="pe_cols=8: must be at most sbuf_partitions=4"):
        ActivationUnit(config=config.preset("tiny").replace(pe_cols=8))
    # A build without int8 has no integer path (its output formats are ILLEGAL_OPCODE:
    # test_float_only_build_refuses_integer_outputs), and builds.
    Fragment.get(ActivationUnit(config=config.preset("tiny").replace(dtypes=("bf16",))), None)
    with pytest.raises(TypeError, match="must be an opentrn.config.Config"):
        ActivationUnit(config={})
