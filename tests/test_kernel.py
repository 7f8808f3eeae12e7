"""The kernel API (opentrn.kernel) and the library kernels (opentrn.kernels): results
against numpy and the golden machine, bit for bit; semaphore waits checked by a race checker
that runs the streams in random interleavings; argument errors; build time."""

import random
import re
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from opentrn import config, cycle_model, isa, kernels, numerics, schedule
from opentrn.golden.core import Core
from opentrn.kernel import FORMAT_DTYPES, Kernel, KernelError, Pattern, Program, same_bits

from .conftest import float_inputs

TINY = config.preset("tiny")
SMALL = config.preset("small")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "kernels.md"


def _int8(rng, *shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _a_columns_fetched(M, P, m_block, blocks):
    """Columns of A (along M) the GEMM fetches: every M tile once per block of columns, but
    a block's first two stationary fetches (``m_block`` M tiles each), which are the block
    before's last two and still in their slots (``schedule.m_tile_order``)."""
    assert M % (m_block * P) == 0, "whole stationary fetches only"
    return blocks * M - (blocks - 1) * min(2, M // (m_block * P)) * m_block * P


def _check_golden(program, expected):
    outputs, outcome = program.run()
    assert outcome.fault == isa.Fault.NONE
    assert outcome.counters["macs"] == program.macs
    assert set(outputs) == set(expected)
    for name, value in expected.items():
        assert outputs[name].dtype == value.dtype and outputs[name].shape == value.shape
        assert same_bits(outputs[name], value), name
    return outputs, outcome


# -- race checker --------------------------------------------------------------------------------


class RaceChecker:
    """An independent machine of docs/isa.md that runs the three streams of a program in one
    random interleaving honouring only the waits and the documented order guarantees:

    * an instruction *starts* (reads its inputs) once its wait holds and the instructions
      before it on its stream have started; the DMA engine starts a descriptor only after
      the previous one completed; the tensor and activation engines may have up to ``depth``
      instructions started and not completed (their pipelines);
    * it *completes* (writes its results, then signals) in program order.

    Between a start and its completion any other engine may run, so a missing wait shows
    as a read of a stale or a too-new value: outputs that change with the seed.

    The float formats (MX included) compute with the kernels' numpy references: one
    ``MATMUL`` is one K tile of ``reference_matmul_float`` (+0, then the products row by
    row, MX scales from their SBUF partitions), accumulated in float32; the float
    ``ACTIVATE`` is ``reference_activation_float``."""

    def __init__(self, program, seed, depth=6):
        self.cfg = cfg = program.config
        self.program = program
        self.rng = np.random.default_rng(seed)
        self.depth = depth
        self.hbm = program.hbm.copy()
        self.sbuf = np.zeros((cfg.sbuf_partitions, cfg.sbuf_bytes_per_partition), np.uint8)
        self.psum = np.zeros((cfg.pe_cols, cfg.psum_banks * cfg.psum_bank_entries * 4),
                             np.uint8)
        self.streams = [self._decode(start) for start in program.programs]
        self.sem = [0] * cfg.semaphores
        self.stationary = None
        # Each event kind of each engine gets a random weight: engines race ahead or lag.
        self.weights = self.rng.uniform(0.02, 1.0, size=(3, 2))

    def _decode(self, pc):
        stream = []
        while True:
            opcode, fields = isa.decode(self.program.hbm, pc)
            stream.append((opcode, fields))
            pc += isa.instruction_bytes(opcode)
            if opcode == isa.Opcode.END:
                return stream

    # -- memories --

    def _buffer(self, space):
        return {1: self.sbuf, 2: self.psum}[space]

    def _rows(self, f, side):
        row = f["n0"] << f["elem_log2"]
        for i2 in range(f["n2"]):
            for i1 in range(f["n1"]):
                yield (f[f"{side}_partition"] + i1 * f[f"{side}_pstep1"]
                       + i2 * f[f"{side}_pstep2"],
                       f[f"{side}_addr"] + i1 * f[f"{side}_stride1"]
                       + i2 * f[f"{side}_stride2"], row)

    def _dma(self, f):
        chunks = []
        for part, addr, row in self._rows(f, "src"):
            mem = self.hbm[addr:addr + row] if f["src_space"] == 0 else \
                self._buffer(f["src_space"])[part, addr:addr + row]
            assert len(mem) == row, "DMA source out of range"
            chunks.append(mem.copy())

        def write():
            for (part, addr, row), chunk in zip(self._rows(f, "dst"), chunks, strict=True):
                if f["dst_space"] == 0:
                    assert addr + row <= len(self.hbm)
                    self.hbm[addr:addr + row] = chunk
                else:
                    self._buffer(f["dst_space"])[part, addr:addr + row] = chunk
        return write

    def _psum_entries(self, bank, entry, n):
        start = (bank * self.cfg.psum_bank_entries + entry) * 4
        return start, start + 4 * n

    def _elements(self, fmt, rows, offset, count):
        """``count`` columns of ``fmt`` at ``offset`` of partitions ``0..rows-1``, in K order:
        ``[rows * r, count]``, element ``p * r + j`` the ``j``-th of partition ``p``'s column
        (``r`` elements of K per column, ``Config.pe_macs_per_cycle``)."""
        rate = self.cfg.macs_per_pe_cycle(fmt.name)
        dtype = FORMAT_DTYPES[fmt.element.name] if fmt.element is not None else np.int8
        codes = self.sbuf[:rows, offset:offset + count * rate * fmt.bytes].copy()
        values = codes.view(dtype).reshape(rows, count, rate)
        return values.transpose(0, 2, 1).reshape(rows * rate, count)

    def _scales(self, fmt, rows, f, count):
        """An MX instruction's scales: ``[ceil(rows / 32), count]`` bytes from
        ``scale_offset`` of partitions ``scale_partition ..``; ``None`` for the other
        formats."""
        if not fmt.mx:
            return None
        blocks = -(-(rows * self.cfg.macs_per_pe_cycle(fmt.name)) // numerics.MX_BLOCK)
        first = f["scale_partition"]
        return self.sbuf[first:first + blocks,
                         f["scale_offset"]:f["scale_offset"] + count].copy()

    def _matmul_float(self, f, fmt):
        cfg = self.cfg
        values, scales, rows = self.stationary
        n = f["n"]
        moving = self._elements(fmt, rows, f["sbuf_offset"], n)
        block_scales = None if scales is None else (scales, self._scales(fmt, rows, f, n))
        out = np.zeros((cfg.pe_cols, n), np.float32)
        out[:values.shape[1]] = kernels.reference_matmul_float(
            values, moving, kt_rows=len(values), block_scales=block_scales)
        b0, b1 = self._psum_entries(f["psum_bank"], f["psum_entry"], n)

        def write():
            total = out
            if f["accumulate"]:
                with np.errstate(all="ignore"):
                    total = self.psum[:, b0:b1].copy().view("<f4") + out
            self.psum[:, b0:b1] = total.astype("<f4").view(np.uint8)
        return write

    def _matmul(self, f):
        cfg = self.cfg
        fmt = numerics.format_of_code(f["format"])
        if fmt.element is not None:
            return self._matmul_float(f, fmt)
        n, offset = f["n"], f["sbuf_offset"]
        moving = self._elements(fmt, cfg.pe_rows, offset, n).astype(np.int64)
        out = self.stationary.T @ moving
        b0, b1 = self._psum_entries(f["psum_bank"], f["psum_entry"], n)

        def write():
            if f["accumulate"]:
                total = out + self.psum[:, b0:b1].copy().view("<i4").astype(np.int64)
            else:
                total = out
            bits = cfg.acc_bits
            total = ((total + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
            self.psum[:, b0:b1] = total.astype("<i4").view(np.uint8)
        return write

    def _activate_float(self, f, fmt):
        lanes, n = self.cfg.pe_cols, f["n"]
        b0, b1 = self._psum_entries(f["psum_bank"], f["psum_entry"], n)
        x = self.psum[:lanes, b0:b1].copy().view("<f4")
        bias = (self.sbuf[:lanes, f["bias_offset"]:f["bias_offset"] + 4].copy().view("<f4")
                .ravel() if f["bias"] else None)
        scale = np.uint32(f["multiplier"] & 0xFFFFFFFF).view(np.float32)
        y = kernels.reference_activation_float(x, scale=scale, bias=bias,
                                               relu=f["function"] == 1, out=fmt.name)
        data = np.ascontiguousarray(y).view(np.uint8)
        offset = f["dst_offset"]

        def write():
            self.sbuf[:lanes, offset:offset + data.shape[1]] = data
        return write

    def _activate(self, f):
        lanes, n = self.cfg.pe_cols, f["n"]
        fmt = numerics.format_of_code(f["out_format"])
        if fmt.element is not None:
            return self._activate_float(f, fmt)
        if f["src"]:
            x = self.sbuf[:lanes, f["src_offset"]:f["src_offset"] + n].view(np.int8)
        else:
            b0, b1 = self._psum_entries(f["psum_bank"], f["psum_entry"], n)
            x = self.psum[:lanes, b0:b1].copy().view("<i4")
        bias = (self.sbuf[:lanes, f["bias_offset"]:f["bias_offset"] + 4].copy().view("<i4")
                .ravel() if f["bias"] else None)
        y = kernels.reference_activation(
            x, multiplier=f["multiplier"], shift=f["shift"], bias=bias,
            relu=f["function"] == 1, out="int32" if f["out_format"] == 7 else "int8")
        data = (y.astype("<i4") if f["out_format"] == 7 else y.astype(np.int8)).view(np.uint8)
        offset = f["dst_offset"]

        def write():
            self.sbuf[:lanes, offset:offset + data.shape[1]] = data
        return write

    def _start(self, opcode, f):
        cfg = self.cfg
        if opcode == isa.Opcode.DMA:
            return self._dma(f)
        if opcode == isa.Opcode.LOAD_STATIONARY:
            rows, cols, offset = f["rows"], f["cols"], f["sbuf_offset"]
            fmt = numerics.format_of_code(f["format"])
            if fmt.element is not None:
                self.stationary = (self._elements(fmt, rows, offset, cols),
                                   self._scales(fmt, rows, f, cols), rows)
                return lambda: None
            rate = cfg.macs_per_pe_cycle(fmt.name)
            tile = np.zeros((cfg.pe_rows * rate, cfg.pe_cols), np.int64)
            tile[:rows * rate, :cols] = self._elements(fmt, rows, offset, cols)
            self.stationary = tile
        elif opcode == isa.Opcode.MATMUL:
            return self._matmul(f)
        elif opcode == isa.Opcode.ACTIVATE:
            return self._activate(f)
        return lambda: None

    # -- the interleaving --

    def run(self):
        pcs = [0, 0, 0]
        pending = [deque() for _ in range(3)]
        done = [False] * 3
        while not all(done):
            events = []
            for e in range(3):
                if done[e]:
                    continue
                opcode, f = self.streams[e][pcs[e]]
                if opcode == isa.Opcode.END:
                    if not pending[e]:
                        events.append((e, "end"))
                else:
                    limit = 1 if e == isa.Engine.DMA else self.depth
                    ready = not f["wait"] or self.sem[f["wait_sem"]] >= f["wait_value"]
                    if ready and len(pending[e]) < limit and not (
                            e == isa.Engine.DMA and pending[e]):
                        events.append((e, "start"))
                if pending[e]:
                    events.append((e, "complete"))
            assert events, f"deadlock at pcs {pcs}, semaphores {self.sem}"
            weights = np.array([1.0 if kind == "end" else
                                self.weights[e, int(kind == "complete")] for e, kind in events])
            e, kind = events[self.rng.choice(len(events), p=weights / weights.sum())]
            if kind == "end":
                done[e] = True
            elif kind == "start":
                opcode, f = self.streams[e][pcs[e]]
                pending[e].append((f, self._start(opcode, f)))
                pcs[e] += 1
            else:
                f, write = pending[e].popleft()
                write()
                if f["signal"]:
                    self.sem[f["signal_sem"]] += 1
        return self.program.read_outputs(self.hbm)


def _race_free(program, expected, seeds=8):
    for seed in range(seeds):
        outputs = RaceChecker(program, seed).run()
        for name, value in expected.items():
            # Floats by their bytes: NaN equals NaN, -0 differs from +0.
            same = (np.array_equal(outputs[name], value) if value.dtype.kind in "iu"
                    else same_bits(outputs[name], value))
            assert same, f"seed {seed}: {name} differs"


def _without_waits(program, engine):
    """A copy of ``program`` with every wait of ``engine``'s stream removed."""
    hbm = program.hbm.copy()
    pc = program.programs[engine]
    while True:
        opcode, _ = isa.decode(hbm, pc)
        hbm[pc + 1] &= 0xFE      # header bit 8: wait
        pc += isa.instruction_bytes(opcode)
        if opcode == isa.Opcode.END:
            break
    return Program(**{**program.__dict__, "hbm": hbm})


# -- the builder on a hand-written kernel -------------------------------------------------------


def _a_seed_notices(broken, expected, seeds=12):
    """Some interleaving of the race checker runs ``broken`` (a program with waits removed)
    into a stale read or an output ``c`` other than ``expected``'s."""
    for seed in range(seeds):
        try:
            outputs = RaceChecker(broken, seed).run()
        except AssertionError:
            return True
        if not same_bits(outputs["c"], expected["c"]):
            return True
    return False


def _docs_example(marker="example"):
    """A complete kernel of docs/kernels.md, executed as written there."""
    text = DOCS.read_text()
    match = re.search(rf"<!-- {marker}: start -->\s*```python\n(.*?)```\s*<!-- {marker}: end -->",
                      text, re.S)
    assert match, f"docs/kernels.md lost its {marker} markers"
    scope = {}
    exec(compile(match.group(1), str(DOCS), "exec"), scope)
    return scope


def test_docs_example_runs_on_golden_and_is_race_free():
    scope = _docs_example()
    program, outputs, expected = scope["program"], scope["outputs"], scope["expected"]
    assert np.array_equal(outputs["y"], expected)
    _race_free(program, {"y": expected})


def test_docs_float_example_runs_on_golden():
    scope = _docs_example("float example")
    program, outputs, expected = scope["program"], scope["outputs"], scope["expected"]
    assert same_bits(outputs["y"], expected)
    assert program.opcode_counts["tensor"] == {"LOAD_STATIONARY": 1, "MATMUL": 1, "END": 1}


def test_docs_mx_example_runs_on_golden():
    scope = _docs_example("mx example")
    program, outputs, expected = scope["program"], scope["outputs"], scope["expected"]
    assert same_bits(outputs["c"], expected["c"])
    assert np.isfinite(expected["c"]).all()
    assert program.opcode_counts["tensor"]["LOAD_STATIONARY"] == 18 * 2   # K tiles x M tiles


def test_handwritten_matmul_and_wait_placement():
    rng = np.random.default_rng(3)
    a_t, b = _int8(rng, 4, 4), _int8(rng, 4, 8)
    k = Kernel(TINY, "mm")
    A, B = k.input("a_t", a_t), k.input("b", b)
    C = k.output("c", (4, 8), np.int32)
    ta, tb, to, p = k.sbuf(4, 4), k.sbuf(4, 8), k.sbuf(4, 32), k.psum(8)
    k.dma(ta, A)
    k.dma(tb, B)
    k.load_stationary(ta)
    k.matmul(p, tb)
    k.activation(to, p, out="int32")
    k.dma(C, to)
    program = k.build()
    expected = a_t.T.astype(np.int64) @ b.astype(np.int64)
    _check_golden(program, {"c": expected.astype(np.int32)})
    # The waits: the load after DMA #0, the matmul after DMA #1, the activation after the
    # matmul (tensor #1), the store after the activation; nothing else, and no NOP.
    streams = RaceChecker(program, 0).streams
    waits = [[(f["wait_sem"], f["wait_value"]) if f["wait"] else None for _, f in s]
             for s in streams]
    assert waits == [[None, None, (2, 1), None], [(0, 1), (0, 2), None], [(1, 2), None]]
    assert all(f["signal"] and f["signal_sem"] == e for e, s in enumerate(streams)
               for op, f in s if op != isa.Opcode.END)
    assert program.instruction_counts == {"dma": 4, "tensor": 3, "activation": 2}


def test_two_engines_to_wait_for_use_a_nop():
    """A DMA that overwrites bytes the tensor engine and, independently, the activation
    engine read: two waits, one of them in a NOP before it. A free()d tile's reuse is
    ordered after the instructions that used it."""
    rng = np.random.default_rng(4)
    a_t, b, x, w = _int8(rng, 4, 4), _int8(rng, 4, 4), _int8(rng, 4, 4), _int8(rng, 4, 8)
    bias = rng.integers(-99, 99, (4, 1), dtype=np.int32)
    k = Kernel(TINY, "nop")
    A, B, X, W, BIAS = (k.input(n, v) for n, v in
                        (("a_t", a_t), ("b", b), ("x", x), ("w", w), ("bias", bias)))
    Y1, Y2, Z = (k.output(n, (4, 4), np.int8) for n in ("y1", "y2", "z"))
    shared = k.sbuf(4, 8)        # bytes 0..3: the stationary tile; 4..7: the bias
    tb, tx, o1, o2, p = k.sbuf(4, 4), k.sbuf(4, 4), k.sbuf(4, 4), k.sbuf(4, 4), k.psum(4)
    k.dma(shared[:, 0:4], A)
    k.dma(shared[:, 4:8], BIAS)
    k.dma(tb, B)
    k.dma(tx, X)
    k.load_stationary(shared[:, 0:4])
    k.matmul(p, tb)
    k.activation(o1, tx, function="relu", shift=1, bias=shared[:, 4:8])
    k.dma(shared, W)             # after the load (tensor) and the bias read (activation)
    k.activation(o2, p, shift=3)
    k.dma(Y1, o1)
    k.dma(Y2, o2)
    k.free(o1)
    again = k.sbuf(4, 4)         # o1's bytes: written only after the DMA of Y1 read them
    assert again.offset == o1.offset
    k.activation(again, shared[:, 0:4])
    k.dma(Z, again)
    program = k.build()
    acc = a_t.T.astype(np.int64) @ b.astype(np.int64)
    expected = {
        "y1": kernels.reference_activation(x, shift=1, bias=bias.ravel(), relu=True),
        "y2": kernels.reference_activation(acc, shift=3), "z": w[:, 0:4]}
    expected = {n: v.astype(np.int8) for n, v in expected.items()}
    _check_golden(program, expected)
    assert program.opcode_counts["dma"].get("NOP") == 1
    _race_free(program, expected, seeds=12)


# -- library kernels ------------------------------------------------------------------------------


GEMM_SHAPES = [  # (M, K, N)
    (1, 1, 1), (7, 13, 29), (4, 4, 4), (16, 16, 16),
    (5, 7, 19), (9, 6, 35), (3, 17, 50),          # every dimension a non-multiple
]


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_tiny(shape):
    M, K, N = shape
    rng = np.random.default_rng(M * 10000 + K * 100 + N)
    a_t, b = _int8(rng, K, M), _int8(rng, K, N)
    program, expected = kernels.gemm(TINY, a_t, b)
    direct = (a_t.T.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    assert np.array_equal(expected["c"], direct)
    _check_golden(program, expected)
    assert program.macs == M * K * N
    _race_free(program, expected, seeds=3)


#: The float formats without block scales (the MX formats have their own tests below,
#: whether or not tiny's dtypes name them).
FLOAT_FORMATS = tuple(f for f in numerics.float_formats(TINY) if not numerics.data_format(f).mx)


def _float32_matmul(a_t, b, kt_rows):
    """The FP32 matmul with a plain loop, one output at a time: ``+0``, then the products of
    each K tile in order, then the tiles' sums in order (docs/numerics.md)."""
    a, x = a_t.astype(np.float32), b.astype(np.float32)
    out = np.zeros((a.shape[1], x.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for m in range(a.shape[1]):
            for n in range(x.shape[1]):
                total = None
                for k0 in range(0, a.shape[0], kt_rows):
                    acc = np.float32(0)
                    for k in range(k0, min(k0 + kt_rows, a.shape[0])):
                        acc = np.float32(acc + np.float32(a[k, m] * x[k, n]))
                    total = acc if total is None else np.float32(total + acc)
                out[m, n] = total
    return out


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 29), (5, 9, 40), (6, 300, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_float_gemm_is_bit_exact(fmt, shape):
    """Float GEMMs on the golden machine equal the kernel's numpy reference and a plain
    float32 loop bit for bit, edge values included; K beyond one SBUF pass (6x300x40 in
    bf16) keeps accumulating in the PSUM in K order."""
    M, K, N = shape
    rng = np.random.default_rng(M * 10000 + K * 100 + N)
    a_t, b = float_inputs(rng, (K, M), fmt), float_inputs(rng, (K, N), fmt, specials=False)
    program, expected = kernels.gemm(TINY, a_t, b)
    loop = _float32_matmul(a_t, b, TINY.pe_rows)
    # x * 1.0 + 0.0 on the way out of the PSUM: -0 becomes +0, NaN the canonical one.
    loop = np.where(loop == 0, np.float32(0), loop)
    loop = np.where(np.isnan(loop), np.uint32(numerics.CANONICAL_NAN32).view(np.float32), loop)
    assert same_bits(expected["c"], loop.astype(np.float32))
    outputs, _ = _check_golden(program, expected)
    assert program.macs == M * K * N
    assert program.opcode_counts["tensor"]["MATMUL"] >= 1


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_float_gemm_bias_relu_and_mlp_are_bit_exact(fmt):
    rng = np.random.default_rng(5)
    a_t, b = float_inputs(rng, (6, 9), fmt, specials=False), float_inputs(rng, (6, 35), fmt)
    bias = rng.standard_normal(9).astype(np.float32)
    for out in (fmt, "fp32"):
        program, expected = kernels.gemm_bias_relu(TINY, a_t, b, bias, scale=0.375, out=out)
        assert expected["y"].dtype == FORMAT_DTYPES[out]
        y = expected["y"].astype(np.float32)
        assert not np.any(np.signbit(y) & ~np.isnan(y))     # relu: no negative, no -0
        _check_golden(program, expected)
    x_t, w1 = float_inputs(rng, (9, 10), fmt), float_inputs(rng, (9, 12), fmt)
    w2 = float_inputs(rng, (12, 5), fmt)
    b1 = rng.standard_normal(12).astype(np.float32)
    b2 = rng.standard_normal(5).astype(np.float32)
    program, expected = kernels.mlp(TINY, x_t, w1, b1, w2, b2, scales=(0.5, 2.0))
    _check_golden(program, expected)


def outside_the_tile_kernel(cfg):
    """A bf16 kernel whose SBUF holds infinities and NaN in the partitions and columns just
    outside a 2-row, 3-column tile: ``(program, expected)``; the results must not see them
    (0 * inf is NaN in float arithmetic, so the hardware must keep them out)."""
    K, M, N = cfg.pe_rows, cfg.pe_cols, 5
    rows, cols = K // 2, M - 1
    rng = np.random.default_rng(8)
    w = float_inputs(rng, (K, M), "bf16", specials=False)
    x = float_inputs(rng, (K, N), "bf16", specials=False)
    w[rows:, :] = np.float32("inf")
    w[:, cols:] = np.float32("nan")
    x[rows:, :] = np.float32("-inf")
    x[0, 2] = np.float32("inf")          # inside: column 2 of the results is not finite
    k = Kernel(cfg, name="outside_the_tile")
    W, X = k.input("w", w), k.input("x", x)
    C = k.output("c", (M, N), np.float32)
    tw, tx, tc, acc = k.sbuf(K, 2 * M), k.sbuf(K, 2 * N), k.sbuf(M, 4 * N), k.psum(N)
    k.dma(tw, W)
    k.dma(tx, X)
    k.load_stationary(tw[0:rows, 0:2 * cols], dtype="bf16")
    k.matmul(acc[:, 0:N], tx[0:rows, :])
    k.activation(tc, acc[:, 0:N], out="fp32")
    k.dma(C, tc)
    c = kernels.reference_matmul_float(w[:rows, :cols], x[:rows], kt_rows=K)
    c = kernels.reference_activation_float(c, out="fp32")
    expected = np.zeros((M, N), np.float32)
    expected[:cols] = c
    return k.build(), {"c": expected}


def test_nothing_outside_the_tile_contributes_in_float():
    program, expected = outside_the_tile_kernel(TINY)
    c = expected["c"]
    assert not np.isfinite(c[:TINY.pe_cols - 1, 2]).any()
    assert np.isfinite(np.delete(c, 2, axis=1)).all()
    assert same_bits(c[TINY.pe_cols - 1:], np.zeros((1, 5), np.float32))    # +0, not NaN
    _check_golden(program, expected)


MX_FORMATS = ("mxfp8e4m3", "mxfp8e5m2")


def _mx_config(base):
    """``base`` with the MX formats and int8, every format at one MAC per PE per cycle (one
    element of K per partition: 32 rows per block; the packed formats of ``trn3`` itself
    are tested below, "Several MACs per cycle")."""
    cfg = config.preset(base)
    dtypes = tuple(dict.fromkeys(("int8", *cfg.dtypes, *MX_FORMATS)))
    return cfg.replace(dtypes=dtypes, hbm_bytes=min(cfg.hbm_bytes, 1 << 24),
                       pe_macs_per_cycle=())


def _mx_reference(a, b, sa, sb, kt_rows=None):
    """The MX matmul with a plain loop (docs/numerics.md): per output and per K tile of
    ``kt_rows`` rows (default: one tile) ``+0``, then for each k the exact product times
    ``2**(sa + sb - 254)`` (NaN when a scale is 255), rounded once to float32, added in
    float32; the tiles' sums added in K order."""
    K, M = a.shape
    N = b.shape[1]
    kt_rows = kt_rows or K
    out = np.zeros((M, N), np.float32)
    with np.errstate(all="ignore"):
        for m in range(M):
            for n in range(N):
                total = None
                for k0 in range(0, K, kt_rows):
                    acc = np.float32(0)
                    for k in range(k0, min(K, k0 + kt_rows)):
                        s1, s2 = int(sa[k // 32, m]), int(sb[k // 32, n])
                        scale = np.nan if 255 in (s1, s2) else 2.0 ** (s1 + s2 - 254)
                        acc = np.float32(acc + np.float32(np.float64(a[k, m])
                                                          * np.float64(b[k, n]) * scale))
                    total = acc if total is None else np.float32(total + acc)
                out[m, n] = total
    return out


def mx_matmul_kernel(cfg, fmt, K, M, N, rng):
    """A hand-written MX matmul (scales of extreme, NaN and ordinary values):
    ``(program, expected)``."""
    element = FORMAT_DTYPES[numerics.data_format(fmt).element.name]
    blocks = -(-K // 32)
    a = float_inputs(rng, (K, M), numerics.data_format(fmt).element.name, specials=False)
    b = float_inputs(rng, (K, N), numerics.data_format(fmt).element.name, specials=False)
    assert a.dtype == element
    sa = rng.integers(117, 138, (blocks, M)).astype(np.uint8)
    sb = rng.integers(117, 138, (blocks, N)).astype(np.uint8)
    sa[0, 0] = 255                         # E8M0 NaN: column 0 of the result is NaN
    sa[-1, 1], sb[-1, N - 1] = 254, 254     # 2**254: the products overflow
    sa[0, 2], sb[0, 1] = 0, 0               # 2**-254 and 2**-127: subnormal or zero
    k = Kernel(cfg, name="mx_matmul")
    A, B = k.input("a", a), k.input("b", b)
    SA, SB = k.input("sa", sa), k.input("sb", sb)
    C = k.output("c", (M, N), np.float32)
    ta, tb, tsa, tsb = k.sbuf(K, M), k.sbuf(K, N), k.sbuf(blocks, M), k.sbuf(blocks, N)
    tc, acc = k.sbuf(M, 4 * N), k.psum(N)
    for tile, tensor in ((ta, A), (tb, B), (tsa, SA), (tsb, SB)):
        k.dma(tile, tensor)
    k.load_stationary(ta, dtype=fmt, scales=tsa)
    k.matmul(acc[:, 0:N], tb, scales=tsb)
    k.activation(tc, acc[:, 0:N], out="fp32")
    k.dma(C, tc)
    expected = kernels.reference_activation_float(_mx_reference(a, b, sa, sb), out="fp32")
    return k.build(), {"c": expected}


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize("base, K, M", [("tiny", 4, 4), ("trn3", 100, 5)],
                         ids=["tiny-one-block", "trn3-four-blocks"])
def test_mx_matmul_on_the_golden_machine(fmt, base, K, M):
    """The MX formats through the golden ISA machine: E8M0 scales per block of 32 rows,
    from SBUF partition b for block b; on trn3's 128-row array K = 100 takes three full
    blocks and a partial one."""
    cfg = _mx_config(base)
    program, expected = mx_matmul_kernel(cfg, fmt, K, M, 7, np.random.default_rng(K))
    c = expected["c"]
    assert np.isnan(c[0]).all() and not np.isfinite(c[1, 6])
    _check_golden(program, expected)


def test_mx_kernel_errors():
    cfg = _mx_config("tiny")
    k = Kernel(cfg)
    tile, scales, psum = k.sbuf(4, 16), k.sbuf(1, 16), k.psum(4)
    with pytest.raises(KernelError, match=r"scales=None: are required for mxfp8e4m3"):
        k.load_stationary(tile[:, 0:4], dtype="mxfp8e4m3")
    with pytest.raises(KernelError, match=r"must be 1 partition\(s\) from a multiple of 1 "
                                          r"\(one per block of 32 elements of K: 32 rows\) x "
                                          r"4 bytes"):
        k.load_stationary(tile[:, 0:4], dtype="mxfp8e4m3", scales=scales[:, 0:3])
    with pytest.raises(KernelError, match=r"are for the MX formats, not fp8e4m3"):
        k.load_stationary(tile[:, 0:4], dtype="fp8e4m3", scales=scales[:, 0:4])
    k.load_stationary(tile[:, 0:4], dtype="mxfp8e4m3", scales=scales[:, 0:4])
    with pytest.raises(KernelError, match=r"scales=None: are required for mxfp8e4m3"):
        k.matmul(psum, tile[:, 4:8])
    plain = TINY.replace(dtypes=("int8", "bf16", "fp8e4m3", "fp8e5m2"))
    with pytest.raises(KernelError, match=r"dtype='mxfp8e4m3': must be one of this build's "
                                          r"matmul formats: int8, bf16, fp8e4m3, fp8e5m2 "):
        Kernel(plain).load_stationary(Kernel(plain).sbuf(4, 4), dtype="mxfp8e4m3")
    # A 32-row array at 4 MACs per PE per cycle: 4 blocks a K tile, whose scales start at a
    # multiple of 4 partitions (scale_partition).
    cfg = config.resolve("trn3", overrides=["pe_rows=32", "pe_cols=32", "sbuf_partitions=32"])
    k = Kernel(cfg)
    tile, scales = k.sbuf(32, 256), k.sbuf(32, 64)
    with pytest.raises(KernelError, match=r"must be 4 partition\(s\) from a multiple of 4 "):
        k.load_stationary(tile[:, 0:128], dtype="mxfp8e4m3", scales=scales[2:6, 0:32])
    k.load_stationary(tile[:, 0:128], dtype="mxfp8e4m3", scales=scales[28:32, 0:32])


# -- MX library kernels --------------------------------------------------------------------------


def _mx_inputs(rng, fmt, shape, *, specials=False):
    """FP8 elements of the MX format ``fmt``."""
    return float_inputs(rng, shape, numerics.data_format(fmt).element.name, specials=specials)


def _mx_scales(rng, rows, cols, spread=5):
    """E8M0 codes ``[ceil(rows / 32), cols]`` from ``127 - spread`` to ``127 + spread``
    (``2**-spread .. 2**spread``)."""
    return rng.integers(127 - spread, 128 + spread, (-(-rows // 32), cols)).astype(np.uint8)


def _canonical_out(c):
    """What the identity ``ACTIVATE`` (``x * 1.0 + 0.0``) makes of FP32 sums: -0 is +0,
    every NaN the canonical one."""
    c = np.where(c == 0, np.float32(0), c)
    return np.where(np.isnan(c), np.uint32(numerics.CANONICAL_NAN32).view(np.float32),
                    c).astype(np.float32)


def test_mx_tile_scales_relayout():
    """The scales re-laid per K tile: Bt = ceil(R / 32) rows per K tile, block
    (kt * R) // 32 + b in row kt * Bt + b, 127 past the last block."""
    sa = np.arange(10 * 3, dtype=np.uint8).reshape(10, 3)       # K = 300: 10 blocks
    tiled = kernels._tile_scales(sa[:3], 70, 4)                  # tiny: one block per tile
    assert tiled.shape == (18, 3)
    assert [int(r[0]) // 3 for r in tiled] == [0] * 8 + [1] * 8 + [2] * 2
    tiled = kernels._tile_scales(sa, 300, 128)                   # trn3: 4 blocks per tile
    assert tiled.shape == (12, 3)
    assert same_bits(tiled[:10], sa) and (tiled[10:] == 127).all()
    tiled = kernels._tile_scales(sa[:3], 70, 64)                 # 2 blocks per tile
    assert same_bits(tiled, np.vstack([sa[:3], np.full((1, 3), 127, np.uint8)]))


MX_GEMM_CASES = {   # (base, M, K, N)
    # 3 blocks along K, 8 K tiles of 4 rows per block and a partial last one; 2 M tiles,
    # 2 column blocks (a partial one).
    "tiny-5x70x37": ("tiny", 5, 70, 37),
    # 4 K tiles per block; 2 M tiles; 2 column blocks.
    "small-9x70x40": ("small", 9, 70, 40),
    # 4 blocks per K tile of 128 rows and a partial last tile of 2 blocks (44 rows), 2 M
    # tiles (a partial one).
    "trn3-130x300x20": ("trn3", 130, 300, 20),
}


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize("case", MX_GEMM_CASES)
def test_mx_gemm_is_bit_exact(fmt, case):
    """MX GEMMs on the golden machine equal the numpy reference and a plain loop bit for
    bit (NaN, overflow, underflow and edge elements included), with scales re-laid per K
    tile and fetched with the elements."""
    base, M, K, N = MX_GEMM_CASES[case]
    cfg = _mx_config(base)
    rng = np.random.default_rng(M * 10000 + K * 100 + N + len(fmt))
    a_t, b = _mx_inputs(rng, fmt, (K, M)), _mx_inputs(rng, fmt, (K, N), specials=True)
    sa, sb = _mx_scales(rng, K, M), _mx_scales(rng, K, N)
    sa[1, 0] = 255                        # E8M0 NaN: row 0 of C is NaN
    sa[-1, 1], sb[-1, 2] = 254, 254       # C[1, 2]: 2**254 products overflow
    sa[0, 2], sb[0, 3] = 0, 0             # C[2, 3]: products of 2**-254, subnormal or 0
    program, expected = kernels.gemm(cfg, a_t, b, block_scales=(sa, sb))
    assert set(program.inputs) == {"a_t", "b", "a_t_scales", "b_scales"}
    c = expected["c"]
    assert np.isnan(c[0]).all() and not np.isfinite(c[1, 2])
    assert np.isfinite(c).mean() > 0.5
    # The plain loop, on the output rows with special scales and the last ones.
    rows = sorted({0, 1, 2, 3, M - 2, M - 1})
    loop = _mx_reference(a_t[:, rows], b, sa[:, rows], sb, kt_rows=cfg.pe_rows)
    assert same_bits(c[rows], _canonical_out(loop))
    _check_golden(program, expected)
    assert program.macs == M * K * N
    if base == "tiny":
        _race_free(program, expected, seeds=2)


def test_mx_gemm_several_sbuf_passes():
    """MX with K cut into parts (the scale slots count in the SBUF budget): each part's
    scales come with its elements; the PSUM keeps accumulating in K order. (K = 300 now
    fits in one pass: four K tiles' scales share a byte range on tiny.)"""
    cfg = _mx_config("tiny")
    rng = np.random.default_rng(13)
    M, K, N = 6, 600, 40
    a_t, b = _mx_inputs(rng, "mxfp8e5m2", (K, M)), _mx_inputs(rng, "mxfp8e5m2", (K, N))
    sa, sb = _mx_scales(rng, K, M), _mx_scales(rng, K, N)
    program, expected = kernels.gemm(cfg, a_t, b, block_scales=(sa, sb))
    assert np.isfinite(expected["c"]).all()
    # B's scales are fetched per M tile and K part, not once per column block (2).
    addr, shape, _ = program.inputs["b_scales"]
    fetches = sum(1 for op, f in RaceChecker(program, 0).streams[isa.Engine.DMA]
                  if op == isa.Opcode.DMA and f["src_space"] == 0
                  and addr <= f["src_addr"] < addr + shape[0] * shape[1])
    assert fetches >= 2 * 2 * 2
    _check_golden(program, expected)
    _race_free(program, expected, seeds=1)


def test_mx_scales_of_several_k_tiles_share_a_byte_range():
    """The GEMM's scale slots put G = partitions / mx_blocks K tiles' scales in one byte
    range (scale_partition): on tiny a 6x300x40 GEMM takes all 75 K tiles in one step,
    where a byte range per K tile would fit 26; the MX instructions use every group of
    partitions, and the program is bit-exact and race-free."""
    cfg = _mx_config("tiny")
    args = dict(columns=40, k_tiles=75, m_tiles=2, moving_from_hbm=True, staging_out=4,
                fixed_bytes=0, resident_tiles=0, element=1, mx=True)
    assert schedule.scale_groups(cfg) == 4
    assert schedule.schedule_shape(cfg, **args)[1] == 75
    assert schedule.schedule_shape(cfg, **args, groups=1)[1] == 26
    rng = np.random.default_rng(31)
    M, K, N = 6, 300, 40
    a_t, b = _mx_inputs(rng, "mxfp8e4m3", (K, M)), _mx_inputs(rng, "mxfp8e4m3", (K, N))
    program, expected = kernels.gemm(cfg, a_t, b, block_scales=(_mx_scales(rng, K, M),
                                                               _mx_scales(rng, K, N)))
    partitions = {f["scale_partition"] for op, f in RaceChecker(program, 0).streams[
        isa.Engine.TENSOR] if op in (isa.Opcode.LOAD_STATIONARY, isa.Opcode.MATMUL)}
    assert partitions == {0, 1, 2, 3}
    _check_golden(program, expected)
    _race_free(program, expected, seeds=2)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_gemm_bias_relu_is_bit_exact(fmt):
    cfg = _mx_config("tiny")
    rng = np.random.default_rng(14 + len(fmt))
    M, K, N = 7, 45, 21
    a_t, b = _mx_inputs(rng, fmt, (K, M)), _mx_inputs(rng, fmt, (K, N))
    sa, sb = _mx_scales(rng, K, M), _mx_scales(rng, K, N)
    sb[1, 4] = 255
    bias = rng.standard_normal(M).astype(np.float32)
    element = numerics.data_format(fmt).element.name
    for out in (None, "fp32"):
        program, expected = kernels.gemm_bias_relu(cfg, a_t, b, bias, scale=0.25, out=out,
                                                   block_scales=(sa, sb))
        y = expected["y"]
        assert y.dtype == FORMAT_DTYPES[out or element]
        acc = _mx_reference(a_t, b, sa, sb, kt_rows=cfg.pe_rows)
        assert same_bits(y, kernels.reference_activation_float(acc, scale=0.25, bias=bias,
                                                               relu=True, out=out or element))
        values = y.astype(np.float32)
        assert np.isnan(values[:, 4]).all() and (values == 0).any() and (values > 0).any()
        _check_golden(program, expected)
        _race_free(program, expected, seeds=2)


MX_MLP_CASES = {    # (base, d_in, hidden, d_out, batch)
    # Layer 1: 2 blocks along d_in, 8 K tiles each; layer 2: K tiles of 4 hidden rows.
    "tiny": (_mx_config("tiny"), 40, 10, 5, 21),
    # Layer 2's K tiles (pe_cols = 2 rows) narrower than layer 1's (4 rows).
    "tiny-4x2": (_mx_config("tiny").replace(pe_cols=2), 36, 7, 3, 9),
    # 4 blocks per K tile; hidden 150: layer 2 has a full K tile and a partial one.
    "trn3": (_mx_config("trn3"), 100, 150, 20, 9),
}


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize("case", MX_MLP_CASES)
def test_mx_mlp_is_bit_exact(fmt, case):
    """The MX MLP: layer 1 with x_t's and w1's scales; the hidden activations, cast to
    the FP8 element format, enter layer 2 with unit scales (127) against w2's."""
    cfg, d_in, hidden, d_out, batch = MX_MLP_CASES[case]
    rng = np.random.default_rng(15 + d_in + len(fmt))
    x_t, w1 = _mx_inputs(rng, fmt, (d_in, batch)), _mx_inputs(rng, fmt, (d_in, hidden))
    w2 = _mx_inputs(rng, fmt, (hidden, d_out))
    b1 = rng.standard_normal(hidden).astype(np.float32)
    b2 = rng.standard_normal(d_out).astype(np.float32)
    # Scales that keep most sums within FP8 range (E4M3 overflows to NaN beyond 464).
    s_x, s_w1, s_w2 = (_mx_scales(rng, d_in, batch, 3), _mx_scales(rng, d_in, hidden, 3),
                       _mx_scales(rng, hidden, d_out, 3))
    s_w2[-1, 1] = 255                     # out_t row 1 is NaN
    element = numerics.data_format(fmt).element.name
    program, expected = kernels.mlp(cfg, x_t, w1, b1, w2, b2, scales=(0.125, 1 / 64),
                                    block_scales=(s_x, s_w1, s_w2))
    assert {"x_t_scales", "w1_scales", "w2_scales", "h_scales"} <= set(program.inputs)
    assert (program.read_inputs()["h_scales"] == 127).all()
    y = expected["out_t"]
    assert y.dtype == FORMAT_DTYPES[element]
    if case != "trn3":
        h = kernels.reference_activation_float(
            _mx_reference(w1, x_t, s_w1, s_x, kt_rows=cfg.pe_rows), scale=0.125, bias=b1,
            relu=True, out=element)
        unit = np.full((-(-hidden // 32), batch), 127, np.uint8)
        loop = kernels.reference_activation_float(
            _mx_reference(w2, h, s_w2, unit, kt_rows=cfg.pe_cols), scale=1 / 64, bias=b2,
            out=element)
        assert same_bits(y, loop)
    values = y.astype(np.float32)
    assert np.isnan(values[1]).all() and np.isfinite(np.delete(values, 1, axis=0)).mean() > 0.8
    _check_golden(program, expected)
    if case == "tiny-4x2":
        _race_free(program, expected, seeds=2)


def test_mx_kernel_argument_errors():
    cfg = _mx_config("tiny")
    rng = np.random.default_rng(16)
    a_t, b = _mx_inputs(rng, "mxfp8e4m3", (70, 5)), _mx_inputs(rng, "mxfp8e4m3", (70, 6))
    sa, sb = _mx_scales(rng, 70, 5), _mx_scales(rng, 70, 6)
    assert {"mxfp8e4m3", "mxfp8e5m2"} <= set(kernels.MATMUL_DTYPES)
    with pytest.raises(KernelError, match=r"block_scales: given with a_t.dtype=int8 \(int8\): "
                                          r"block scales make an MX format, whose elements are "
                                          r"FP8: float8_e4m3fn \(mxfp8e4m3\) or float8_e5m2"):
        kernels.gemm(cfg, _int8(rng, 70, 5), _int8(rng, 70, 6), block_scales=(sa, sb))
    bf = float_inputs(rng, (70, 5), "bf16")
    with pytest.raises(KernelError, match=r"block_scales: given with a_t.dtype=bfloat16 "
                                          r"\(bf16\)"):
        kernels.gemm_bias_relu(cfg, bf, bf, np.zeros(5, np.float32), block_scales=(sa, sa))
    with pytest.raises(KernelError, match=r"block_scales=<array uint8 \(3, 5\)>: must be a "
                                          r"tuple \(sa, sb\) of 2 uint8 arrays"):
        kernels.gemm(cfg, a_t, b, block_scales=sa)
    with pytest.raises(KernelError, match=r"block_scales\[0\] \(sa\).dtype=int64: must be "
                                          r"uint8 \(E8M0 scale codes"):
        kernels.gemm(cfg, a_t, b, block_scales=(sa.astype(np.int64), sb))
    with pytest.raises(KernelError, match=r"block_scales\[1\] \(sb\).shape=\(2, 6\): must be "
                                          r"\(3, 6\): one scale per block of 32 of the 70 rows "
                                          r"of b and per column"):
        kernels.gemm(cfg, a_t, b, block_scales=(sa, sb[:2]))
    with pytest.raises(KernelError, match=r"b.dtype=float8_e5m2: must be float8_e4m3fn"):
        kernels.gemm(cfg, a_t, b.astype(np.float32).astype(FORMAT_DTYPES["fp8e5m2"]),
                     block_scales=(sa, sb))
    with pytest.raises(KernelError, match=r"out='bf16': must be one of fp32, fp8e4m3 for "
                                          r"mxfp8e4m3 inputs"):
        kernels.gemm_bias_relu(cfg, a_t, b, np.zeros(5, np.float32), out="bf16",
                               block_scales=(sa, sb))
    with pytest.raises(KernelError, match=r"multiplier=1, shift=0: are for int8 inputs; "
                                          r"mxfp8e4m3 takes scale"):
        kernels.gemm_bias_relu(cfg, a_t, b, np.zeros(5, np.float32), multiplier=1, shift=0,
                               block_scales=(sa, sb))
    # A build without the MX formats refuses them by name.
    plain = cfg.replace(dtypes=("int8", "fp8e4m3"))
    with pytest.raises(KernelError, match=r"dtype='mxfp8e4m3': must be one of this build's "
                                          r"matmul formats: int8, fp8e4m3 "):
        kernels.gemm(plain, a_t, b, block_scales=(sa, sb))
    x_t, w1, w2 = a_t[:, 0:4], a_t, b[0:5]
    b1, b2 = np.zeros(5, np.float32), np.zeros(6, np.float32)
    s_x, s_w1, s_w2 = _mx_scales(rng, 70, 4), sa, _mx_scales(rng, 5, 6)
    with pytest.raises(KernelError, match=r"must be a tuple \(s_x, s_w1, s_w2\) of 3"):
        kernels.mlp(cfg, x_t, w1, b1, w2, b2, block_scales=(s_x, s_w1))
    with pytest.raises(KernelError, match=r"block_scales\[2\] \(s_w2\).shape=\(3, 6\): must "
                                          r"be \(1, 6\): one scale per block of 32 of the 5 "
                                          r"rows of w2"):
        kernels.mlp(cfg, x_t, w1, b1, w2, b2, block_scales=(s_x, s_w1, sb))
    with pytest.raises(KernelError, match=r"block_scales: given with x_t.dtype=int8"):
        kernels.mlp(cfg, _int8(rng, 70, 4), _int8(rng, 70, 5), np.zeros(5, np.int32),
                    _int8(rng, 5, 6), np.zeros(6, np.int32), requant=((1, 0), (1, 0)),
                    block_scales=(s_x, s_w1, s_w2))
    program, _ = kernels.mlp(cfg, x_t, w1, b1, w2, b2, block_scales=(s_x, s_w1, s_w2))
    assert program.outputs["out_t"][2] == "float8_e4m3fn"


def test_float_kernel_errors():
    rng = np.random.default_rng(1)
    bf = float_inputs(rng, (4, 3), "bf16")
    with pytest.raises(KernelError, match=r"b.dtype=int8: must be bfloat16"):
        kernels.gemm(TINY, bf, _int8(rng, 4, 3))
    with pytest.raises(KernelError, match=r"multiplier=1, shift=0: are for int8 inputs; bf16 "
                                          r"takes scale"):
        kernels.gemm_bias_relu(TINY, bf, bf, np.zeros(3, np.float32), multiplier=1, shift=0)
    with pytest.raises(KernelError, match=r"bias: int32 \(3,\): must be float32"):
        kernels.gemm_bias_relu(TINY, bf, bf, np.zeros(3, np.int32))
    with pytest.raises(KernelError, match=r"out='int8': must be one of fp32, bf16 for bf16"):
        kernels.gemm_bias_relu(TINY, bf, bf, np.zeros(3, np.float32), out="int8")
    with pytest.raises(KernelError, match=r"scale=inf: must be a finite number"):
        kernels.gemm_bias_relu(TINY, bf, bf, np.zeros(3, np.float32), scale=float("inf"))
    with pytest.raises(KernelError, match=r"scales=\(1.0,\): must be \(scale1, scale2\)"):
        kernels.mlp(TINY, bf, bf, np.zeros(3, np.float32), bf[:3], np.zeros(3, np.float32),
                    scales=(1.0,))
    k = Kernel(SMALL)
    tile = k.sbuf(4, 64)
    with pytest.raises(KernelError, match=r"dtype='bf16': must be one of this build's matmul "
                                          r"formats: int8 \(Config.dtypes=int8\)"):
        k.load_stationary(tile[:, 0:8], dtype="bf16")
    k = Kernel(TINY)
    tile, psum = k.sbuf(4, 64), k.psum(4)
    with pytest.raises(KernelError, match=r"view bytes=\(1, 5\): must be whole bf16 elements"):
        k.load_stationary(tile[:, 1:5], dtype="bf16")
    k.load_stationary(tile[:, 0:8], dtype="bf16")
    with pytest.raises(KernelError, match=r"psum entries=4: must equal the moving columns "
                                          r"\(5\)"):
        k.matmul(psum[:, 0:4], tile[:, 0:10])      # 10 bytes: 5 bf16 columns
    with pytest.raises(KernelError, match=r"psum entries=4: must equal the moving columns "
                                          r"\(2\)"):
        k.matmul(psum[:, 0:4], tile[:, 8:12])
    k.matmul(psum[:, 0:4], tile[:, 8:16])
    with pytest.raises(KernelError, match=r"out='mxfp8e4m3': must be one of this build's "
                                          r"activation outputs: int8, bf16, fp8e4m3, fp8e5m2, "
                                          r"fp32, int32"):
        k.activation(tile[:, 16:20], psum[:, 0:4], out="mxfp8e4m3")
    with pytest.raises(KernelError, match=r"the float path \(out=bf16\) takes scale="):
        k.activation(tile[:, 16:24], psum[:, 0:4], out="bf16", multiplier=3)
    with pytest.raises(KernelError, match=r"must be a PSUM view for the float path"):
        k.activation(tile[:, 16:24], tile[:, 24:28], out="bf16")
    with pytest.raises(KernelError, match=r"scale=0.5: is for the float path"):
        k.activation(tile[:, 16:20], psum[:, 0:4], out="int8", scale=0.5)
    with pytest.raises(KernelError, match=r"dst bytes=4: must be 8: 4 results of 2 bytes"):
        k.activation(tile[:, 16:20], psum[:, 0:4], out="bf16")


def test_gemm_several_sbuf_passes():
    """K x (M + N) bytes far beyond the tiny SBUF (4 x 4 KiB): K is cut into parts, the
    moving data fetched per M tile and part, PSUM accumulating across parts."""
    M, K, N = 6, 600, 40
    assert K * (M + N) > TINY.sbuf_partitions * TINY.sbuf_bytes_per_partition
    rng = np.random.default_rng(5)
    a_t, b = _int8(rng, K, M), _int8(rng, K, N)
    program, expected = kernels.gemm(TINY, a_t, b)
    _check_golden(program, expected)
    _race_free(program, expected, seeds=2)


OTHER_BUILDS = {
    "small": SMALL,
    "tiny-acc16": TINY.replace(dtypes=("int8",), acc_bits=16),
    "tiny-1bank": TINY.replace(psum_banks=1),           # no PSUM double-buffering
    "tiny-4x2": TINY.replace(pe_cols=2),                # M tiles narrower than K tiles
    "tiny-n8": TINY.replace(moving_max=8, sbuf_bytes_per_partition=256),
}


@pytest.mark.parametrize("build", OTHER_BUILDS)
def test_gemm_other_configs(build):
    cfg = OTHER_BUILDS[build]
    rng = np.random.default_rng(6)
    a_t, b = _int8(rng, 21, 11), _int8(rng, 21, 70)
    if build == "tiny-acc16":
        a_t[:], b[:] = 127, 127          # 21 * 127 * 127 wraps in 16 bits
    program, expected = kernels.gemm(cfg, a_t, b)
    _check_golden(program, expected)
    _race_free(program, expected, seeds=2)
    if build == "tiny-acc16":
        assert expected["c"][0, 0] == ((21 * 127 * 127 + 2**15) % 2**16) - 2**15
    if build in ("tiny-4x2", "tiny-n8"):
        rng = np.random.default_rng(7)
        b1, b2 = (rng.integers(-3000, 3000, n, dtype=np.int32) for n in (9, 5))
        program, expected = kernels.mlp(cfg, _int8(rng, 11, 19), _int8(rng, 11, 9), b1,
                                        _int8(rng, 9, 5), b2, requant=((3, 8), (5, 7)))
        _check_golden(program, expected)
        _race_free(program, expected, seeds=2)


def test_gemm_bias_relu():
    rng = np.random.default_rng(7)
    M, K, N = 7, 13, 21
    a_t, b = _int8(rng, K, M), _int8(rng, K, N)
    bias = rng.integers(-30000, 30000, M, dtype=np.int32)
    program, expected = kernels.gemm_bias_relu(TINY, a_t, b, bias, multiplier=3, shift=9)
    y = expected["y"]
    acc = a_t.T.astype(np.int64) @ b.astype(np.int64)
    # The definition, element by element in Python ints.
    for m in range(M):
        for n in range(N):
            pre = int(acc[m, n]) * 3 + int(bias[m])
            q, r = pre >> 9, pre - ((pre >> 9) << 9)
            value = q + (r > 256 or (r == 256 and q % 2 == 1))
            assert y[m, n] == min(max(value, 0), 127)
    assert (y == 0).any() and (y == 127).any() and ((y > 0) & (y < 127)).any()
    _check_golden(program, expected)
    _race_free(program, expected, seeds=6)


@pytest.mark.parametrize("out", ["int8", "int32"])
def test_mlp(out):
    """d_in and hidden larger than the 4x4 array, batch over two column blocks."""
    rng = np.random.default_rng(8)
    d_in, hidden, d_out, batch = 13, 10, 7, 37
    x_t, w1, w2 = _int8(rng, d_in, batch), _int8(rng, d_in, hidden), _int8(rng, hidden, d_out)
    b1 = rng.integers(-5000, 5000, hidden, dtype=np.int32)
    b2 = rng.integers(-5000, 5000, d_out, dtype=np.int32)
    requant = ((3, 8), (5, 7))
    program, expected = kernels.mlp(TINY, x_t, w1, b1, w2, b2, requant=requant, out=out)
    h = kernels.reference_activation(w1.T.astype(np.int64) @ x_t.astype(np.int64),
                                     multiplier=3, shift=8, bias=b1, relu=True)
    assert ((h > 0) & (h < 127)).any()
    y = kernels.reference_activation(w2.T.astype(np.int64) @ h, multiplier=5, shift=7,
                                     bias=b2, out=out)
    assert np.array_equal(expected["out_t"], y)
    assert len(np.unique(y)) > 10
    _check_golden(program, expected)
    _race_free(program, expected, seeds=3)


@pytest.mark.parametrize("fmt", ["int8", "mxfp8e4m3"])
def test_race_checker_catches_missing_waits(fmt):
    """The checker is not blind: with the waits of one stream removed, some interleaving
    gives different outputs (or reads stale data); in int8 and in an MX format (its float
    model, and the scale slots)."""
    rng = np.random.default_rng(9)
    if fmt == "int8":
        program, expected = kernels.gemm(TINY, _int8(rng, 9, 6), _int8(rng, 9, 35))
    else:
        a_t, b = _mx_inputs(rng, fmt, (40, 6)), _mx_inputs(rng, fmt, (40, 35))
        program, expected = kernels.gemm(_mx_config("tiny"), a_t, b, block_scales=(
            _mx_scales(rng, 40, 6), _mx_scales(rng, 40, 35)))
    _race_free(program, expected, seeds=4)
    for engine in isa.Engine:
        assert _a_seed_notices(_without_waits(program, engine), expected), \
            f"waits of engine {engine.name} removed, no seed noticed"


def test_first_fetch_k_tiles_cuts_where_a_k_tile_outweighs_its_descriptors():
    """``schedule.first_fetch_k_tiles``: K tiles of a few bus words stay in one piece (each
    piece costs its descriptors' start-up and instruction fetches, more than a tile's
    words); K tiles of 128 rows of hundreds of bytes come one at a time, where the
    matmuls of one take as long as the next one's fetch or less."""
    assert schedule.first_fetch_k_tiles(TINY, kts=4, rows=4, columns=[16, 16], element=1,
                                        width=16, chunks=1) == 4
    trn3 = config.preset("trn3").replace(dma_engines=1)
    assert schedule.first_fetch_k_tiles(trn3, kts=8, rows=128, columns=[512, 512],
                                        element=4, scale_rows=4, groups=4, width=512,
                                        chunks=1) == 1
    # Past the first, a piece of MX scales starts a group's byte range, or is one K tile.
    sizes = {kts: schedule.first_fetch_k_tiles(TINY, kts=kts, rows=4, columns=[16, 16],
                                               element=1, scale_rows=1, groups=4, width=16,
                                               chunks=1) for kts in range(1, 80)}
    assert all(size in (1, kts) or size % 4 == 0 for kts, size in sizes.items()), sizes
    assert any(1 < size < kts for kts, size in sizes.items()), sizes


def test_gemm_first_step_tiles_come_in_pieces():
    """int8 32x256x32 on tiny: the first step's 64 K tiles come in pieces of
    ``schedule.gemm_first_fetch_k_tiles`` K tiles, each piece's stationary tiles then its
    moving block, so that the first load waits for the first descriptor and the first
    matmul for the second, not for the whole step's tiles. Bit-exact on the golden machine
    and race-free."""
    cfg, (M, K, N) = TINY, (32, 256, 32)
    tiling = schedule.gemm_tiling(cfg, M, K, N, "int8")
    width, kts, mb, _ = tiling
    size = schedule.gemm_first_fetch_k_tiles(cfg, M, K, N, "int8", tiling)
    assert 1 < size < kts, (size, tiling)
    rng = np.random.default_rng(5)
    a, b = (kernels.random_inputs(rng, shape, "int8") for shape in ((M, K), (K, N)))
    program, expected = kernels.gemm(cfg, a.T.copy(), b)
    streams = RaceChecker(program, 0).streams
    R, P = cfg.pe_rows, cfg.pe_cols
    a_addr, b_addr = program.inputs["a_t"][0], program.inputs["b"][0]
    pieces = range(0, kts, size)
    expected_fetches = [(base + kt * R * pitch, min(size, kts - kt))
                        for kt in pieces for base, pitch in ((a_addr, M), (b_addr, N))]
    fetches = [(f["src_addr"], f["n2"]) for _, f in streams[isa.Engine.DMA][:2 * len(pieces)]]
    assert fetches == expected_fetches
    assert streams[isa.Engine.DMA][0][1]["n0"] == min(M, mb * P)
    assert streams[isa.Engine.DMA][1][1]["n0"] == min(N, width)
    (load, first_load), (matmul, first_matmul) = streams[isa.Engine.TENSOR][:2]
    assert (load, matmul) == (isa.Opcode.LOAD_STATIONARY, isa.Opcode.MATMUL)
    assert (first_load["wait_sem"], first_load["wait_value"]) == (isa.Engine.DMA, 1)
    assert (first_matmul["wait_sem"], first_matmul["wait_value"]) == (isa.Engine.DMA, 2)
    _check_golden(program, expected)
    _race_free(program, expected, seeds=3)


@pytest.mark.parametrize("fmt", ["int8", "bf16", "mxfp8e4m3"])
def test_gemm_with_one_moving_slot_refilled_a_k_tile_at_a_time(fmt):
    """32x256x64 on tiny (MXFP8 32x384x64: four K tiles' scales share a byte range, so
    256 fits twice): the moving block's K tiles fit the SBUF once, not twice, so the
    schedule keeps one moving slot (rather than cutting K and fetching B once per M tile)
    and refills it for the next block one K tile at a time, each descriptor waiting only
    for the matmuls of its K tile. Bit-exact on the golden machine, race-free, and the
    refill's waits are needed (without the DMA stream's waits some interleaving differs).
    B crosses the bus once: the DMA moves A once per block (but the M tiles a block
    starts with), B once and C once."""
    mx = numerics.data_format(fmt).mx
    M, K, N = 32, 384 if mx else 256, 64
    cfg = TINY
    rate = cfg.macs_per_pe_cycle(fmt)
    e = numerics.column_bytes(cfg, fmt)
    width, kts, mb, buffers = schedule.gemm_tiling(cfg, M, K, N, fmt)
    assert buffers == 1 and kts == K // rate // cfg.pe_rows and width < N, (width, kts)
    rng = np.random.default_rng(21)
    a, b = (kernels.random_inputs(rng, shape, fmt) for shape in ((M, K), (K, N)))
    extra = ({"block_scales": (kernels.random_scales(rng, K, M),
                               kernels.random_scales(rng, K, N))} if mx else {})
    program, expected = kernels.gemm(cfg, a.T.copy(), b, **extra)
    blocks = -(-N // width)             # MXFP8: 24 columns, the last block 16
    # The first block's moving data in the first step's pieces of K tiles, then one
    # descriptor per K tile for each later block.
    size = schedule.gemm_first_fetch_k_tiles(cfg, M, K, N, fmt, (width, kts, mb, buffers))
    addr, shape, _ = program.inputs["b"]
    moving_fetches = sum(1 for op, f in RaceChecker(program, 0).streams[isa.Engine.DMA]
                         if op == isa.Opcode.DMA and f["src_space"] == 0
                         and addr <= f["src_addr"] < addr + shape[0] * shape[1] * e)
    assert moving_fetches == -(-kts // size) + (blocks - 1) * kts
    a_columns = _a_columns_fetched(M, cfg.pe_cols, mb, blocks)
    scale_bytes = (numerics.mx_blocks(cfg) * (K // rate // cfg.pe_rows) * (a_columns + N)
                   if mx else 0)
    assert cycle_model.predict(program)["dma_bytes"] == \
        K * e // rate * (a_columns + N) + scale_bytes + M * N * 4
    _check_golden(program, expected)
    _race_free(program, expected, seeds=3)
    assert _a_seed_notices(_without_waits(program, isa.Engine.DMA), expected), \
        "the DMA stream's waits removed, no seed noticed"


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_gemm_in_blocks_of_three_matmuls(fmt):
    """With 4 PSUM banks a group (tiny with 8 banks, as trn3), blocks may be 3 matmuls wide
    (3 x moving_max = 48 columns), between the halvings: 24x32x128 takes blocks of 48, 48
    and 32 columns, A fetched once per block (but the M tiles a block starts with, still in
    their slots). Bit-exact on the golden machine, race-free, and the cycle model's DMA
    bytes are those."""
    cfg = TINY.replace(psum_banks=8)
    M, K, N = 24, 32, 128
    width, kts, mb, _ = schedule.gemm_tiling(cfg, M, K, N, fmt)
    assert (width, kts) == (3 * cfg.moving_max, K // cfg.pe_rows)
    _check_blocks(cfg, fmt, (M, K, N), mb, -(-N // width), seed=33)


def _check_blocks(cfg, fmt, shape, mb, blocks, *, seed):
    """The library GEMM of ``shape`` in ``blocks`` column blocks, ``mb`` M tiles per
    stationary descriptor: the DMA moves A once per block (but the M tiles a block starts
    with), B and C once, by the exact model and the fast path; bit-exact on the golden
    machine and race-free."""
    M, K, N = shape
    rng = np.random.default_rng(seed)
    a, b = (kernels.random_inputs(rng, s, fmt) for s in ((M, K), (K, N)))
    program, expected = kernels.gemm(cfg, a.T.copy(), b)
    column = K * numerics.column_bytes(cfg, fmt)     # bytes of one K x 1 column of A or B
    dma_bytes = column * (_a_columns_fetched(M, cfg.pe_cols, mb, blocks) + N) + M * N * 4
    assert cycle_model.predict(program)["dma_bytes"] == dma_bytes
    assert cycle_model.gemm(cfg, M, K, N, dtype=fmt).dma_bytes == dma_bytes
    _check_golden(program, expected)
    _race_free(program, expected, seeds=3)


@pytest.mark.parametrize("fmt, shape, width", [("int8", (16, 224, 36), 24),
                                                ("bf16", (8, 108, 34), 20)])
def test_gemm_in_balanced_blocks(fmt, shape, width):
    """Blocks balanced over the columns: on tiny the halvings of a 32-column group give
    16 columns, 3 blocks for 36 or 34 columns, the last of 4 or 2, which takes about as
    long as a full one (a stationary load per K tile); 2 blocks of 24 or 20 columns fit
    the SBUF as well, with all K tiles per step. By the exact model 16x224x36 takes 9,273
    cycles instead of 10,946 and 8x108x34 3,156 instead of 3,558 (the RTL the same).
    Bit-exact on the golden machine, race-free, and the DMA moves A once per block (but
    the M tiles a block starts with: here all of them), B and C once."""
    M, K, N = shape
    cfg = TINY
    k_tiles = -(-K // cfg.macs_per_pe_cycle(fmt) // cfg.pe_rows)
    got, kts, mb, _ = schedule.gemm_tiling(cfg, M, K, N, fmt)
    assert (got, kts) == (width, k_tiles)
    halving = cfg.psum_banks // 2 * cfg.moving_max // 2      # half a PSUM group's columns
    blocks = -(-N // width)
    assert blocks == 2 and -(-N // halving) == 3
    _check_blocks(cfg, fmt, shape, mb, blocks, seed=35)


def test_gemm_tiling_is_timed_by_the_fast_path(monkeypatch):
    """The library GEMM times the estimate's first tilings with the cycle model's fast
    path: MXFP8 5x227x23 on tiny, whose 57 K tiles fit the SBUF once but not twice, takes
    one moving slot of all of them where the estimate (schedule_shape) cuts K into 56 and
    1 K tiles with two slots, and runs 4,424 cycles instead of 5,728 by the exact model.
    Bit-exact on the golden machine and race-free."""
    M, K, N, fmt = 5, 227, 23, "mxfp8e4m3"
    rng = np.random.default_rng(36)
    a, b = (kernels.random_inputs(rng, s, fmt) for s in ((M, K), (K, N)))
    scales = (kernels.random_scales(rng, K, M), kernels.random_scales(rng, K, N))
    k_rows = -(-K // TINY.macs_per_pe_cycle(fmt))
    estimated = schedule.schedule_shape(
        TINY, columns=N, k_tiles=-(-k_rows // TINY.pe_rows), m_tiles=-(-M // TINY.pe_cols),
        moving_from_hbm=True, staging_out=4, fixed_bytes=0, resident_tiles=0,
        element=numerics.column_bytes(TINY, fmt), mx=True)
    timed = schedule.gemm_tiling(TINY, M, K, N, fmt)
    assert timed[3] == 1 and estimated[3] == 2 and timed[1] > estimated[1], (timed, estimated)
    program, expected = kernels.gemm(TINY, a.T.copy(), b, block_scales=scales)
    with monkeypatch.context() as patch:
        patch.setattr(schedule, "gemm_tiling", lambda *args: estimated)
        before, _ = kernels.gemm(TINY, a.T.copy(), b, block_scales=scales)
    faster, slower = cycle_model.predict(program)["cycles"], cycle_model.predict(before)["cycles"]
    assert faster < 0.8 * slower, (faster, slower)
    _check_golden(program, expected)
    _race_free(program, expected, seeds=3)


def test_schedule_refuses_a_tiling_it_does_not_cost():
    k = Kernel(TINY, name="t")
    with pytest.raises(KernelError, match=r"tiling=\(3, 1, 1, 2\): not one of this "
                                          r"schedule's tilings, \(16, 1, 2, 2\)"):
        schedule.Schedule(k, columns=16, k_tiles=1, m_tiles=2, moving_from_hbm=True,
                          staging_out=4, fixed_bytes=0, resident_tiles=0, tiling=(3, 1, 1, 2))


def test_gemm_128_cubed_builds_fast_with_the_planned_schedule_and_is_exact():
    rng = np.random.default_rng(10)
    a_t, b = _int8(rng, 128, 128), _int8(rng, 128, 128)
    start = time.perf_counter()
    program, expected = kernels.gemm(TINY, a_t, b)
    seconds = time.perf_counter() - start
    counts = program.opcode_counts
    print(f"\n128x128x128 gemm on tiny: built in {seconds:.2f} s; {program.instruction_counts};"
          f" {counts}")
    assert seconds < 5
    # 32 K tiles x 32 M tiles x 8 chunks of 16; blocks of 2 chunks (2 of the 4 PSUM banks):
    # one stationary load per block, K tile and M tile.
    assert counts["tensor"] == {"MATMUL": 32 * 32 * 8, "LOAD_STATIONARY": 32 * 32 * 4,
                                "END": 1}
    assert counts["activation"]["ACTIVATE"] == 32 * 8
    # Per block of 32 columns: the moving block, the stationary tiles of 2 M tiles per
    # descriptor (16: an M tile's row is 4 bytes, half a bus word; the first two of the
    # last three blocks are the block before's last two, still in their slots), one store
    # per M tile (32): few, large descriptors. The first step's tiles come in pieces of K
    # tiles, a stationary and a moving descriptor each (schedule.first_fetch_k_tiles).
    size = schedule.gemm_first_fetch_k_tiles(TINY, 128, 128, 128, "int8",
                                             schedule.gemm_tiling(TINY, 128, 128, 128, "int8"))
    assert counts["dma"] == {"DMA": 4 * (1 + 16 + 32) - 3 * 2 + 2 * (-(-32 // size) - 1),
                             "END": 1}
    # Waits are placed only where needed: the DMA and the tensor engine need no NOP.
    assert "NOP" not in counts["tensor"] and "NOP" not in counts["dma"]
    assert program.macs == 128 ** 3
    assert np.array_equal(expected["c"], a_t.T.astype(np.int64) @ b.astype(np.int64))
    _, outcome = _check_golden(program, expected)
    # Every byte is moved once per use: A once per block (but the 4 M tiles of 4 rows a
    # block starts with), B once, C once.
    assert outcome.counters["dma_bytes"] == (
        128 * _a_columns_fetched(128, 4, 2, 4) + 128 * 128 + 4 * 128 * 128)
    _race_free(program, expected, seeds=1)


def test_program_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(11)
    program, expected = kernels.gemm(TINY, _int8(rng, 5, 3), _int8(rng, 5, 6))
    assert len(program.hbm) % 4096 == 0 and all(p % 4096 == 0 for p in program.programs)
    assert all(addr % 64 == 0 for addr, _, _ in [*program.inputs.values(),
                                                  *program.outputs.values()])
    base = program.save(tmp_path / "gemm.npz")
    assert base.with_suffix(".npz").exists() and base.with_suffix(".json").exists()
    loaded = Program.load(base)
    assert loaded.config == program.config and loaded.programs == program.programs
    assert np.array_equal(loaded.hbm, program.hbm)
    assert loaded.outputs == program.outputs and loaded.inputs == program.inputs
    assert loaded.instruction_counts == program.instruction_counts
    outputs, _ = loaded.run(backend=lambda p: Core(p.config).run(p.hbm, p.programs))
    assert np.array_equal(outputs["c"], expected["c"])
    assert np.array_equal(loaded.read_inputs()["b"], program.read_inputs()["b"])


# -- errors ------------------------------------------------------------------------------------


def _fresh():
    k = Kernel(TINY, "errors")
    return k, k.input("a", np.zeros((8, 8), np.int8)), k.sbuf(4, 64), k.psum(16)


@pytest.mark.parametrize("case, message", [
    (lambda k, a, t, p: k.sbuf(4, 5000), r"nbytes=5000: must be between 1 and 4096"),
    (lambda k, a, t, p: k.sbuf(5, 8), r"partitions=5: must be between 1 and 4"),
    (lambda k, a, t, p: [k.sbuf(4, 2048), k.sbuf(4, 2048)], r"nbytes=2048: no free SBUF"),
    (lambda k, a, t, p: k.psum(17), r"entries=17: must be between 1 and 16"),
    (lambda k, a, t, p: t[0:5, 0:4], r"index\[0\]=slice\(0, 5, None\): must be a non-empty"),
    (lambda k, a, t, p: t[:, 60:70], r"index\[1\]=slice\(60, 70, None\)"),
    (lambda k, a, t, p: k.dma(t[0:4, 0:8], a[0:3, :]), r"dst rows=4: must equal the src rows"),
    (lambda k, a, t, p: k.dma(t[0:4, 0:4], a[0:4, :]), r"dst row bytes=4: must equal"),
    (lambda k, a, t, p: k.load_stationary(t[:, 0:5]), r"view columns=5: must be at most "
                                                     r"pe_cols=4"),
    (lambda k, a, t, p: k.matmul(p[:, 0:4], t[:, 0:4]), r"matmul: no load_stationary"),
    (lambda k, a, t, p: [k.load_stationary(t[:, 0:4]), k.matmul(p[:, 0:16], t[:, 0:17])],
     r"moving columns=17: must be at most moving_max=16"),
    (lambda k, a, t, p: [k.load_stationary(t[:, 0:4]), k.matmul(p[:, 0:8], t[:, 0:4])],
     r"psum entries=8: must equal the moving columns \(4\)"),
    (lambda k, a, t, p: [k.load_stationary(t[:, 0:4]), k.load_stationary(t[:, 0:4])],
     r"previous stationary tile has not been used"),
    (lambda k, a, t, p: [k.load_stationary(t[0:3, 0:4]), k.matmul(p[:, 0:4], t[:, 0:4])],
     r"moving rows=\(0, 4\): must be partitions 0..2"),
    (lambda k, a, t, p: k.activation(t[:, 2:6], p[:, 0:1], out="int32"),
     r"dst offset=2: must be a multiple of 4"),
    (lambda k, a, t, p: k.activation(t[:, 0:4], p[:, 0:4], bias=t[:, 2:6]),
     r"bias offset=2: must be a multiple of 4"),
    (lambda k, a, t, p: k.activation(t[:, 0:4], p[:, 0:4], shift=64), r"shift=64"),
    (lambda k, a, t, p: k.activation(t[:, 0:4], p[:, 0:4], function="gelu"),
     r"function='gelu': must be one of identity, relu"),
    (lambda k, a, t, p: k.activation(t[:, 0:8], t[:, 4:12]), r"must not overlap src"),
    (lambda k, a, t, p: k.activation(t[1:4, 0:4], p[1:4, 0:4]), r"must start at partition 0"),
    (lambda k, a, t, p: k.dma(t[:, 0:8], t[:, 4:12]), r"shares bytes with src"),
    (lambda k, a, t, p: k.dma_pattern(Pattern(t, stride2=60, pstep1=1), Pattern(a, stride1=8),
                                      n0=8, n1=4, n2=2), r"reaches byte 67 of SBUF tile"),
    (lambda k, a, t, p: k.dma_pattern(Pattern(t, pstep1=2), Pattern(a, stride1=8), n0=8, n1=4),
     r"reaches partition 6"),
    (lambda k, a, t, p: [k.free(t), k.dma(t[:, 0:8], a[0:4, :])], r"freed tile"),
    (lambda k, a, t, p: k.input("a", np.zeros((2, 2), np.int8)), r"name='a': already names"),
    (lambda k, a, t, p: k.input("f", np.zeros((2, 2), np.float64)), r"f.dtype='float64'"),
    (lambda k, a, t, p: k.output("o", (2, 2, 2), np.int8), r"o.shape=\(2, 2, 2\)"),
    (lambda k, a, t, p: k.build(), r"has no output tensor"),
])
def test_builder_errors(case, message):
    k, a, t, p = _fresh()
    with pytest.raises(KernelError, match=message):
        case(k, a, t, p)


def test_kernel_errors():
    with pytest.raises(KernelError, match=r"config.semaphores=2: must be at least 3"):
        Kernel(TINY.replace(semaphores=2))
    rng = np.random.default_rng(12)
    with pytest.raises(KernelError, match=r"b.shape=\(5, 3\): must have 4 rows"):
        kernels.gemm(TINY, _int8(rng, 4, 3), _int8(rng, 5, 3))
    with pytest.raises(KernelError, match=r"a_t.dtype=int32: must be one of int8, bfloat16, "
                       r"float8_e4m3fn, float8_e5m2"):
        kernels.gemm(TINY, np.zeros((4, 3), np.int32), _int8(rng, 4, 3))
    with pytest.raises(KernelError, match=r"bias: int32 \(4,\): must be int32 of shape \(3,\)"):
        kernels.gemm_bias_relu(TINY, _int8(rng, 4, 3), _int8(rng, 4, 3),
                               np.zeros(4, np.int32), multiplier=1, shift=0)
    with pytest.raises(KernelError, match=r"shift=70"):
        kernels.gemm_bias_relu(TINY, _int8(rng, 4, 3), _int8(rng, 4, 3),
                               np.zeros(3, np.int32), multiplier=1, shift=70)
    with pytest.raises(KernelError, match=r"requant=\(1, 2\): must be"):
        kernels.mlp(TINY, _int8(rng, 4, 3), _int8(rng, 4, 5), np.zeros(5, np.int32),
                    _int8(rng, 5, 2), np.zeros(2, np.int32), requant=(1, 2))
    with pytest.raises(KernelError, match=r"w2.shape=\(4, 2\): must have 5 rows"):
        kernels.mlp(TINY, _int8(rng, 4, 3), _int8(rng, 4, 5), np.zeros(5, np.int32),
                    _int8(rng, 4, 2), np.zeros(2, np.int32), requant=((1, 0), (1, 0)))


# -- several MACs per cycle (Config.pe_macs_per_cycle) --------------------------------------------

def _trainium(name, **changes):
    """A Trainium preset with the formats and MAC rates it publishes (trn3: MXFP8 4 per PE
    per cycle, 16 blocks of 8 partitions x 4 elements; trn2: FP8 2), a 16 MiB HBM for the
    golden machine's image, and ``changes``."""
    return config.preset(name).replace(hbm_bytes=1 << 24, **changes)


PACKED_GEMM_CASES = {   # (config, format, M, K, N)
    # K = 600: a full K tile of 512 elements (128 rows x 4) and a partial one of 88 (22
    # rows); 2 M tiles (a partial one).
    "trn3-mx-130x600x9": (_trainium("trn3"), "mxfp8e4m3", 130, 600, 9),
    "trn3-mx-3x13x4": (_trainium("trn3"), "mxfp8e5m2", 3, 13, 4),       # K not a multiple
    # The trn3 preset scaled to 8 x 8 with a 4 KiB SBUF: K cut into parts by the budget.
    "trn3-8x8-mx-20x300x70": (_trainium("trn3", pe_rows=8, pe_cols=8, sbuf_partitions=8,
                                        sbuf_bytes_per_partition=4096, moving_max=64,
                                        psum_bank_entries=64, psum_banks=4),
                              "mxfp8e4m3", 20, 300, 70),
    "trn3-bf16-20x200x9": (_trainium("trn3"), "bf16", 20, 200, 9),       # one element per row
    "trn2-fp8-9x301x17": (_trainium("trn2"), "fp8e4m3", 9, 301, 17),     # FP8 "double row"
    "trn2-fp8-4x2x3": (_trainium("trn2", pe_rows=8, pe_cols=8, sbuf_partitions=8),
                       "fp8e5m2", 4, 2, 3),
}


@pytest.mark.parametrize("case", PACKED_GEMM_CASES)
def test_packed_gemm_is_bit_exact(case):
    """A format of ``r`` MACs per PE per cycle takes ``r`` consecutive elements of K per
    partition: the library GEMM packs its operands (``[ceil(K / r), cols * r]``), every K
    tile is ``r x pe_rows`` elements, and the result equals the numpy reference in the
    hardware's order (per K tile of ``r x pe_rows`` elements) and, for MX, a plain loop,
    bit for bit. The ``macs`` counter counts ``rows x r x cols`` per vector."""
    cfg, fmt, M, K, N = PACKED_GEMM_CASES[case]
    rate = cfg.macs_per_pe_cycle(fmt)
    rng = np.random.default_rng(M + K + N)
    element = numerics.data_format(fmt).element.name
    a_t = float_inputs(rng, (K, M), element, specials=False)
    b = float_inputs(rng, (K, N), element, specials=False)
    extra = {}
    if numerics.data_format(fmt).mx:
        sa, sb = _mx_scales(rng, K, M), _mx_scales(rng, K, N)
        sa[-1, 0] = 255                   # E8M0 NaN in the last block: row 0 of C is NaN
        extra = {"block_scales": (sa, sb)}
    program, expected = kernels.gemm(cfg, a_t, b, **extra)
    # The operands as the SBUF takes them: r rows of K side by side per column.
    packed = program.read_inputs()["a_t"]
    assert packed.shape == (-(-K // rate), M * rate)
    assert same_bits(packed[0, :rate], a_t[:rate, 0]) if K >= rate else True
    c = expected["c"]
    if extra:
        assert np.isnan(c[0]).all() and np.isfinite(c[1:]).mean() > 0.5
        loop = _mx_reference(a_t[:, :3], b, sa[:, :3], sb, kt_rows=cfg.pe_rows * rate)
        assert same_bits(c[:3], _canonical_out(loop))
    else:
        ref = kernels.reference_matmul_float(a_t, b, kt_rows=cfg.pe_rows * rate)
        assert same_bits(c, kernels.reference_activation_float(ref, out="fp32"))
    _check_golden(program, expected)
    assert program.macs == M * (-(-K // rate) * rate) * N
    if cfg.pe_rows <= 8:
        _race_free(program, expected, seeds=2)


def test_packed_columns_by_hand():
    """The ISA's order of a packed column, without the library's packing: on trn2 (FP8 at
    2 MACs per PE per cycle) byte ``2 c + j`` of partition ``p`` is element ``k = 2 p + j``
    of column ``c``, and the sum runs over k in order; a column is 2 bytes, so views must
    be whole columns."""
    cfg = _trainium("trn2", pe_rows=8, pe_cols=8, sbuf_partitions=8)
    rng = np.random.default_rng(3)
    K, M, N = 6, 3, 2                                  # 3 partitions of 2 elements
    a = float_inputs(rng, (K, M), "fp8e4m3", specials=False)
    b = float_inputs(rng, (K, N), "fp8e4m3", specials=False)
    k = Kernel(cfg, name="packed")
    # Row p of the HBM tensors holds elements 2p and 2p + 1 of each column, side by side.
    A = k.input("a", a.reshape(3, 2, M).transpose(0, 2, 1).reshape(3, 2 * M))
    B = k.input("b", b.reshape(3, 2, N).transpose(0, 2, 1).reshape(3, 2 * N))
    C = k.output("c", (M, N), np.float32)
    ta, tb, tc, acc = k.sbuf(3, 2 * M), k.sbuf(3, 2 * N), k.sbuf(M, 4 * N), k.psum(N)
    k.dma(ta, A)
    k.dma(tb, B)
    with pytest.raises(KernelError, match=r"view bytes=\(0, 5\): must be whole fp8e4m3 "
                                          r"columns \(2 elements of K each\): an offset and a "
                                          r"length that are multiples of 2"):
        k.load_stationary(ta[:, 0:5], dtype="fp8e4m3")
    k.load_stationary(ta, dtype="fp8e4m3")
    k.matmul(acc[:, 0:N], tb)
    k.activation(tc, acc[:, 0:N], out="fp32")
    k.dma(C, tc)
    program = k.build()
    assert program.macs == 3 * 2 * M * N
    loop = np.zeros((M, N), np.float32)
    for m in range(M):
        for n in range(N):
            acc_value = np.float32(0)
            for kk in range(K):
                acc_value = np.float32(acc_value + np.float32(a[kk, m]) * np.float32(b[kk, n]))
            loop[m, n] = acc_value
    _check_golden(program, {"c": kernels.reference_activation_float(loop, out="fp32")})


def test_packed_mlp_is_refused():
    cfg = _trainium("trn3")
    x = np.zeros((4, 2), FORMAT_DTYPES["fp8e4m3"])
    scales = np.full((1, 2), 127, np.uint8)
    with pytest.raises(KernelError, match=r"dtype='mxfp8e4m3': 4 MACs per PE per cycle on this "
                                          r"build \(pe_macs_per_cycle\): its matmuls take that "
                                          r"many elements of K per partition"):
        kernels.mlp(cfg, x, x[:, :2], np.zeros(2, np.float32), x[:2], np.zeros(2, np.float32),
                    block_scales=(scales, scales, scales))
    # The same MLP in BF16 (one element per partition) builds.
    bf = np.zeros((4, 2), FORMAT_DTYPES["bf16"])
    kernels.mlp(cfg, bf, bf, np.zeros(2, np.float32), bf[:2], np.zeros(2, np.float32))


def test_library_kernels_refuse_a_non_config_and_oversize_shapes_up_front():
    """A dict is not a configuration (it was an AttributeError deep inside); a GEMM whose
    operands alone exceed the HBM is refused before an instruction is generated (a
    300000 x 64 x 64 GEMM on tiny took minutes to generate before the image was checked)."""
    a_t, b = np.ones((4, 4), np.int8), np.ones((4, 4), np.int8)
    for kernel in (lambda cfg: kernels.gemm(cfg, a_t, b),
                   lambda cfg: kernels.gemm_bias_relu(cfg, a_t, b, np.zeros(4, np.int32),
                                                      multiplier=1, shift=0),
                   lambda cfg: kernels.mlp(cfg, a_t, b, np.zeros(4, np.int32), b,
                                           np.zeros(4, np.int32), requant=((1, 7), (1, 7)))):
        with pytest.raises(KernelError, match=r"config=\{'pe_rows': 4\}: must be an "
                                              r"opentrn.config.Config"):
            kernel({"pe_rows": 4})
    tiny = config.preset("tiny")
    started = time.monotonic()
    with pytest.raises(KernelError, match=r"a_t 64 x 300000, b 64 x 64, c 300000 x 64: the "
                                          r"operands and results need at least 96,004,096 "
                                          r"bytes of HBM, more than hbm_bytes=16,777,216"):
        kernels.gemm(tiny, np.zeros((64, 300000), np.int8), np.zeros((64, 64), np.int8))
    assert time.monotonic() - started < 1.0
    with pytest.raises(KernelError, match="more than hbm_bytes"):
        kernels.check_fits(tiny, "bf16", {"a": (4097, 2048, None)})   # 16 MiB + 4 KiB
    kernels.check_fits(tiny, "bf16", {"a": (2048, 2048, None)})       # 8 MiB: fits
    # 3 MiB of data, but at least 256 x 256 x 64 MATMULs of 32 bytes (was minutes of
    # generation before the HBM check at the end).
    started = time.monotonic()
    square = np.zeros((1024, 1024), np.int8)
    with pytest.raises(KernelError, match=r"a_t 1024 x 1024, b 1024 x 1024, c 1024 x 1024: "
                                          r"the operands and results \(6,291,456 bytes\) "
                                          r"and the program \(at least 4,194,304 MATMUL "
                                          r"instructions: 134,217,728 bytes\) need more "
                                          r"than hbm_bytes=16,777,216"):
        kernels.gemm(tiny, square, square)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("cfg", [config.preset("tiny"), config.preset("small")],
                         ids=["tiny", "small"])
def test_least_matmuls_is_a_lower_bound_of_every_kernel(cfg):
    """check_fits refuses a kernel whose least program does not fit HBM: the bound must
    never exceed what a kernel emits, or a legitimate kernel would be refused."""
    rng, draw = np.random.default_rng(7), random.Random(7)
    sizes = (1, 3, 4, 7, 16, 33, 64, 100, 128, 200)
    for _ in range(40):
        dtype = draw.choice(cfg.dtypes)
        m, k, n = (draw.choice(sizes) for _ in range(3))
        program = kernels.random_gemm(cfg, rng, m, k, n, dtype)
        emitted = program.opcode_counts["tensor"]["MATMUL"]
        assert kernels.least_matmuls(cfg, dtype, k, m, n) <= emitted, (dtype, m, k, n)
    for _ in range(10):
        batch, d_in, hidden, d_out = (draw.choice(sizes) for _ in range(4))
        x_t, w1, w2 = (kernels.random_inputs(rng, shape, "int8")
                       for shape in ((d_in, batch), (d_in, hidden), (hidden, d_out)))
        program, _ = kernels.mlp(cfg, x_t, w1, np.zeros(hidden, np.int32), w2,
                                 np.zeros(d_out, np.int32), requant=((1, 7), (1, 7)))
        least = (kernels.least_matmuls(cfg, "int8", d_in, hidden, batch)
                 + kernels.least_matmuls(cfg, "int8", hidden, d_out, batch))
        assert least <= program.opcode_counts["tensor"]["MATMUL"], (batch, d_in, hidden, d_out)
