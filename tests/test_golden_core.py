"""The golden ISA machine (golden/core.py) on hand-assembled programs: results against
numpy, semaphores, counters and every fault it can reach (docs/isa.md)."""

from fractions import Fraction

import numpy as np
import pytest

from opentrn import config, isa, numerics
from opentrn.config import ConfigError
from opentrn.golden.core import COUNTERS, Core, run
from opentrn.hdl.dma import ErrorCode, Space, _addr_bits

TINY = config.preset("tiny")
K, M = TINY.pe_rows, TINY.pe_cols
B = TINY.sbuf_bytes_per_partition
E, BANKS, NMAX = TINY.psum_bank_entries, TINY.psum_banks, TINY.moving_max
SEMS = TINY.semaphores
Op, Engine, Fault = isa.Opcode, isa.Engine, isa.Fault
enc = isa.encode

#: Program pointers of the three streams, and where the tests put data in HBM.
BASES = (0x0000, 0x0800, 0x1000)
DATA = 0x2000
END = enc(Op.END)


def _machine(streams, *, data=(), size=0x4000):
    """An HBM image with the three streams (lists of encoded instructions) at ``BASES`` and
    ``data`` (``{address: bytes}``)."""
    hbm = np.zeros(size, np.uint8)
    for base, stream in zip(BASES, streams, strict=True):
        code = b"".join(stream)
        hbm[base:base + len(code)] = np.frombuffer(code, np.uint8)
    for addr, payload in dict(data).items():
        payload = np.frombuffer(bytes(payload), np.uint8)
        hbm[addr:addr + len(payload)] = payload
    return hbm


def _run(streams, *, cfg=TINY, data=(), **kw):
    return run(cfg, _machine(streams, data=data), list(BASES), **kw)


def _dma(src=Space.HBM, dst=Space.SBUF, **fields):
    """A DMA instruction; ``n1`` and ``n2`` default to 1 (one row)."""
    return enc(Op.DMA, src_space=int(src), dst_space=int(dst), **{"n1": 1, "n2": 1, **fields})


def _wrap(values, bits):
    values = np.asarray(values, dtype=np.int64)
    return ((values + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))


def _reference_activation(x, *, multiplier, shift, bias, relu, out_bits):
    """Exact rational arithmetic: Python's round() of a Fraction rounds half to even."""
    lo, hi = -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1
    out = np.empty(x.shape, np.int64)
    for (p, j), value in np.ndenumerate(x):
        r = round(Fraction(int(value) * multiplier + int(bias[p]), 1 << shift))
        out[p, j] = min(max(max(r, 0) if relu else r, lo), hi)
    return out


def _psum_entries(image, bank, entry, n, cfg=TINY):
    """The 32-bit (sign-extended) entries ``entry .. entry+n-1`` of ``bank``: [pe_cols, n]."""
    start = (bank * cfg.psum_bank_entries + entry) * 4
    return image[:, start:start + 4 * n].copy().view("<i4").astype(np.int64)


def _assert_clean(outcome):
    assert outcome.fault == Fault.NONE, (outcome.fault, outcome.engine, outcome.pc)
    assert outcome.engine is None and outcome.pc is None and outcome.dma_error_code == 0


# -- whole chains ------------------------------------------------------------------------------

def test_dma_load_matmul_activate_dma_chain():
    rng = np.random.default_rng(1)
    n, multiplier, shift = 6, 3, 4
    w = rng.integers(-128, 128, (K, M), dtype=np.int8)
    x = rng.integers(-128, 128, (K, n), dtype=np.int8)
    bias = rng.integers(-(1 << 20), 1 << 20, M).astype("<i4")
    w_at, x_at, bias_at, out_at = DATA, DATA + 0x100, DATA + 0x200, DATA + 0x300
    dma_stream = [
        _dma(src_addr=w_at, src_stride1=M, dst_addr=0, dst_pstep1=1, n0=M, n1=K,
             signal_sem=0),
        _dma(src_addr=x_at, src_stride1=n, dst_addr=64, dst_pstep1=1, n0=n, n1=K,
             signal_sem=0),
        _dma(src_addr=bias_at, src_stride1=4, dst_addr=128, dst_pstep1=1, n0=1, elem_log2=2,
             n1=M, signal_sem=1),
        _dma(Space.SBUF, Space.HBM, src_addr=192, src_pstep1=1, dst_addr=out_at,
             dst_stride1=n, n0=n, n1=M, wait_sem=2, wait_value=1),
        END,
    ]
    tensor_stream = [
        enc(Op.LOAD_STATIONARY, sbuf_offset=0, rows=K, cols=M, wait_sem=0, wait_value=2),
        enc(Op.MATMUL, sbuf_offset=64, n=n, psum_bank=1, psum_entry=3, signal_sem=3),
        END,
    ]
    activation_stream = [
        enc(Op.NOP, wait_sem=1, wait_value=1),          # the bias is in
        enc(Op.ACTIVATE, src=0, psum_bank=1, psum_entry=3, n=n, bias=1, bias_offset=128,
            multiplier=multiplier, shift=shift, function=1, dst_offset=192,
            wait_sem=3, wait_value=1, signal_sem=2),
        END,
    ]
    outcome = _run([dma_stream, tensor_stream, activation_stream],
                   data={w_at: w.tobytes(), x_at: x.tobytes(), bias_at: bias.tobytes()})
    _assert_clean(outcome)
    acc = w.astype(np.int64).T @ x.astype(np.int64)
    assert np.array_equal(_psum_entries(outcome.psum, 1, 3, n), acc)
    expected = _reference_activation(acc, multiplier=multiplier, shift=shift, bias=bias,
                                     relu=True, out_bits=8)
    result = outcome.hbm[out_at:out_at + M * n].view(np.int8).reshape(M, n)
    assert np.array_equal(result, expected)
    assert outcome.semaphores == [2, 1, 1, 1] + [0] * (SEMS - 4)
    assert outcome.retired == {Engine.DMA: 5, Engine.TENSOR: 3, Engine.ACTIVATION: 3}
    assert set(outcome.counters) == set(COUNTERS)
    assert outcome.counters["dma_bytes"] == K * M + K * n + 4 * M + M * n
    assert outcome.counters["macs"] == K * M * n
    assert all(outcome.counters[name] is None for name in COUNTERS
               if name not in ("dma_bytes", "macs"))


def test_partial_tile_contributes_only_its_rows_and_columns():
    rng = np.random.default_rng(2)
    rows, cols, n, w_at, x_at = 2, 3, 5, 10, 100
    sbuf = rng.integers(0, 256, (K, B), dtype=np.uint8)       # garbage around the tile
    psum = rng.integers(0, 256, (M, BANKS * E * 4), dtype=np.uint8)
    outcome = run(TINY, _machine([[END], [
        enc(Op.LOAD_STATIONARY, sbuf_offset=w_at, rows=rows, cols=cols),
        enc(Op.MATMUL, sbuf_offset=x_at, n=n, psum_bank=2, psum_entry=4),
        END], [END]]), BASES, sbuf=sbuf, psum=psum)
    _assert_clean(outcome)
    w = sbuf[:rows, w_at:w_at + cols].view(np.int8).astype(np.int64)
    x = sbuf[:rows, x_at:x_at + n].view(np.int8).astype(np.int64)
    expected = np.zeros((M, n), np.int64)
    expected[:cols] = w.T @ x
    assert np.array_equal(_psum_entries(outcome.psum, 2, 4, n), expected)
    assert not expected[cols:].any() and expected[:cols].any()
    # Nothing else of the PSUM changed, and the SBUF is as given.
    untouched = np.ones(psum.shape, bool)
    start = (2 * E + 4) * 4
    untouched[:, start:start + 4 * n] = False
    assert np.array_equal(outcome.psum[untouched], psum[untouched])
    assert np.array_equal(outcome.sbuf, sbuf)
    assert outcome.counters["macs"] == rows * cols * n


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(dtypes=("int8",), acc_bits=16)],
                         ids=["acc32", "acc16"])
def test_accumulate_over_k_tiles(cfg):
    rng = np.random.default_rng(3)
    tiles, n, bank, entry = 3, 7, 3, 5
    w = rng.integers(-128, 128, (tiles * K, M), dtype=np.int8)
    x = rng.integers(-128, 128, (tiles * K, n), dtype=np.int8)
    w[:, 0], x[:, 0] = -128, -128             # 12 * 2**14: past a 16-bit accumulator
    sbuf = np.zeros((K, B), np.uint8)
    tensor_stream = []
    for t in range(tiles):
        sbuf[:, 16 * t:16 * t + M] = w[t * K:(t + 1) * K].view(np.uint8)
        sbuf[:, 64 + 16 * t:64 + 16 * t + n] = x[t * K:(t + 1) * K].view(np.uint8)
        tensor_stream += [
            enc(Op.LOAD_STATIONARY, sbuf_offset=16 * t, rows=K, cols=M),
            enc(Op.MATMUL, sbuf_offset=64 + 16 * t, n=n, psum_bank=bank, psum_entry=entry,
                accumulate=int(t > 0)),
        ]
    psum = np.random.default_rng(4).integers(0, 256, (M, BANKS * E * 4), dtype=np.uint8)
    outcome = run(cfg, _machine([[END], tensor_stream + [END], [END]]), BASES, sbuf=sbuf,
                  psum=psum)
    _assert_clean(outcome)
    exact = w.astype(np.int64).T @ x.astype(np.int64)
    expected = _wrap(exact, cfg.acc_bits)
    if cfg.acc_bits < 32:
        assert not np.array_equal(expected, exact)     # the case really wraps
    assert np.array_equal(_psum_entries(outcome.psum, bank, entry, n, cfg), expected)
    assert outcome.counters["macs"] == tiles * K * M * n
    assert outcome.retired[Engine.TENSOR] == 2 * tiles + 1


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(pe_cols=2)], ids=["4x4", "4x2"])
def test_activate_from_sbuf_int32_and_in_place(cfg):
    rng = np.random.default_rng(5)
    lanes, n, src, wide, bias_at = cfg.pe_cols, 7, 200, 400, 600
    sbuf = rng.integers(0, 256, (cfg.sbuf_partitions, B), dtype=np.uint8)
    bias = rng.integers(-2000, 2000, cfg.sbuf_partitions).astype("<i4")
    sbuf[:, bias_at:bias_at + 4] = bias.view(np.uint8).reshape(-1, 4)
    x = sbuf[:lanes, src:src + n].view(np.int8).astype(np.int64)
    outcome = run(cfg, _machine([[END], [END], [
        enc(Op.ACTIVATE, src=1, src_offset=src, n=n, multiplier=-1000, shift=3, out_format=7,
            dst_offset=wide),
        enc(Op.ACTIVATE, src=1, src_offset=src, dst_offset=src, n=n, multiplier=5, shift=1,
            function=1, bias=1, bias_offset=bias_at),
        END]]), BASES, sbuf=sbuf)
    _assert_clean(outcome)
    expected_wide = _reference_activation(x, multiplier=-1000, shift=3, bias=np.zeros(lanes),
                                          relu=False, out_bits=32)
    got_wide = outcome.sbuf[:lanes, wide:wide + 4 * n].copy().view("<i4")
    assert np.array_equal(got_wide, expected_wide)
    expected = _reference_activation(x, multiplier=5, shift=1, bias=bias, relu=True,
                                     out_bits=8)
    assert np.array_equal(outcome.sbuf[:lanes, src:src + n].view(np.int8), expected)
    assert (expected == 127).any() and (expected == 0).any()    # saturation and relu seen
    # Lanes past pe_cols and bytes outside the outputs are untouched.
    untouched = np.ones(sbuf.shape, bool)
    untouched[:lanes, wide:wide + 4 * n] = False
    untouched[:lanes, src:src + n] = False
    assert np.array_equal(outcome.sbuf[untouched], sbuf[untouched])
    assert outcome.counters == {name: 0 if name in ("dma_bytes", "macs") else None
                                for name in COUNTERS}


# -- semaphores --------------------------------------------------------------------------------

def test_semaphores_count_every_signal():
    outcome = _run([
        [enc(Op.NOP, signal_sem=0), enc(Op.NOP, signal_sem=0), enc(Op.END, signal_sem=0)],
        [enc(Op.NOP, wait_sem=0, wait_value=3, signal_sem=5), enc(Op.NOP, signal_sem=5),
         enc(Op.NOP, wait_sem=7, wait_value=0), END],
        [enc(Op.NOP, wait_sem=5, wait_value=2), enc(Op.NOP, signal_sem=0),
         enc(Op.END, wait_sem=0, wait_value=4, signal_sem=SEMS - 1)],
    ])
    _assert_clean(outcome)
    expected = [0] * SEMS
    expected[0], expected[5], expected[SEMS - 1] = 4, 2, 1
    assert outcome.semaphores == expected
    assert outcome.retired == {Engine.DMA: 3, Engine.TENSOR: 4, Engine.ACTIVATION: 3}


def test_unset_wait_and_signal_ignore_their_indices():
    outcome = _run([[enc(Op.NOP, wait=0, wait_sem=255, wait_value=7),
                     enc(Op.NOP, signal=0, signal_sem=SEMS), END], [END], [END]])
    _assert_clean(outcome)
    assert outcome.semaphores == [0] * SEMS


def test_end_signal_releases_a_waiter():
    outcome = _run([[enc(Op.NOP, wait_sem=2, wait_value=1), END],
                    [END],
                    [enc(Op.END, signal_sem=2)]])
    _assert_clean(outcome)
    assert outcome.semaphores[2] == 1


# -- faults: checks -----------------------------------------------------------------------------

LOAD = enc(Op.LOAD_STATIONARY, rows=K, cols=M)
BF16 = numerics.data_format("bf16").code
LOAD_BF16 = enc(Op.LOAD_STATIONARY, rows=K, cols=M, format=BF16)
ADDR_BITS = _addr_bits(TINY)
A_DMA = dict(src_addr=DATA, dst_addr=0, n0=1)      # a fine HBM -> SBUF descriptor


def _activate(**fields):
    return enc(Op.ACTIVATE, **{"n": 1, **fields})


FAULT_CASES = {
    # ILLEGAL_OPCODE: unknown codes, and valid opcodes on the wrong engine.
    "unknown-opcode": (Engine.DMA, [bytes([0x7F]) + bytes(31)], Fault.ILLEGAL_OPCODE),
    "unknown-after-nop": (Engine.TENSOR, [enc(Op.NOP), bytes([0x22]) + bytes(31)],
                          Fault.ILLEGAL_OPCODE),
    "matmul-on-dma": (Engine.DMA, [enc(Op.MATMUL, n=1)], Fault.ILLEGAL_OPCODE),
    "dma-on-tensor": (Engine.TENSOR, [_dma(**A_DMA)], Fault.ILLEGAL_OPCODE),
    "activate-on-tensor": (Engine.TENSOR, [_activate()], Fault.ILLEGAL_OPCODE),
    "load-on-activation": (Engine.ACTIVATION, [LOAD], Fault.ILLEGAL_OPCODE),
    "dma-on-activation": (Engine.ACTIVATION, [_dma(**A_DMA)], Fault.ILLEGAL_OPCODE),
    "illegal-before-bad-sem": (Engine.DMA, [enc(Op.MATMUL, n=1, wait_sem=SEMS)],
                               Fault.ILLEGAL_OPCODE),
    # Semaphore indices.
    "wait-sem": (Engine.DMA, [enc(Op.NOP, wait_sem=SEMS)], Fault.BAD_FIELD),
    "signal-sem": (Engine.TENSOR, [enc(Op.END, signal_sem=SEMS)], Fault.BAD_FIELD),
    "signal-sem-activate": (Engine.ACTIVATION, [_activate(signal_sem=255)], Fault.BAD_FIELD),
    "bad-sem-before-range": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=M,
                                                 sbuf_offset=B, signal_sem=SEMS)],
                             Fault.BAD_FIELD),
    # Checks come before the wait: a wait that would never hold does not hide the fault.
    "check-before-wait": (Engine.TENSOR, [enc(Op.MATMUL, n=1, wait_sem=0, wait_value=9)],
                          Fault.BAD_FIELD),
    # DMA: address and stride fields wider than the build's descriptor.
    **{f"dma-wide-{side}_{name}": (Engine.DMA, [_dma(**{**A_DMA, f"{side}_{name}":
                                                          1 << ADDR_BITS})],
                                   Fault.OUT_OF_RANGE)
       for side in ("src", "dst") for name in ("addr", "stride1", "stride2")},
    "dma-wide-before-dma-error": (Engine.DMA, [_dma(n0=0, dst_stride2=(1 << 48) - 1)],
                                  Fault.OUT_OF_RANGE),
    # LOAD_STATIONARY.
    "load-pending": (Engine.TENSOR, [LOAD, LOAD], Fault.BAD_FIELD),
    "load-rows-0": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=0, cols=M)], Fault.BAD_FIELD),
    "load-rows-big": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K + 1, cols=M)],
                      Fault.BAD_FIELD),
    "load-cols-0": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=0)], Fault.BAD_FIELD),
    "load-cols-big": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=M + 1)],
                      Fault.BAD_FIELD),
    "load-sbuf-end": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, sbuf_offset=B - M + 1, rows=K,
                                          cols=M)], Fault.OUT_OF_RANGE),
    "load-bad-before-range": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, sbuf_offset=B, rows=0,
                                                  cols=M)], Fault.BAD_FIELD),
    # MATMUL.
    "matmul-no-load": (Engine.TENSOR, [enc(Op.MATMUL, n=1)], Fault.BAD_FIELD),
    "matmul-n-0": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=0)], Fault.BAD_FIELD),
    "matmul-n-big": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=NMAX + 1)], Fault.BAD_FIELD),
    "matmul-sbuf-end": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=2, sbuf_offset=B - 1)],
                        Fault.OUT_OF_RANGE),
    "matmul-bank": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=1, psum_bank=BANKS)],
                    Fault.OUT_OF_RANGE),
    "matmul-entry": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=2, psum_entry=E - 1)],
                     Fault.OUT_OF_RANGE),
    "matmul-bad-before-range": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=0, psum_bank=BANKS)],
                                Fault.BAD_FIELD),
    # ACTIVATE.
    "activate-n-0": (Engine.ACTIVATION, [_activate(n=0)], Fault.BAD_FIELD),
    "activate-n-big": (Engine.ACTIVATION, [_activate(n=NMAX + 1)], Fault.BAD_FIELD),
    "activate-dst-align": (Engine.ACTIVATION, [_activate(out_format=7, dst_offset=2)],
                           Fault.BAD_FIELD),
    "activate-bias-align": (Engine.ACTIVATION, [_activate(bias=1, bias_offset=6)],
                            Fault.BAD_FIELD),
    "activate-overlap": (Engine.ACTIVATION, [_activate(src=1, src_offset=0, dst_offset=1, n=4)],
                         Fault.BAD_FIELD),
    "activate-overlap-below": (Engine.ACTIVATION, [_activate(src=1, src_offset=3,
                                                             dst_offset=0, n=4)],
                               Fault.BAD_FIELD),
    "activate-same-int32": (Engine.ACTIVATION, [_activate(src=1, out_format=7)],
                            Fault.BAD_FIELD),
    "activate-overlap-int32": (Engine.ACTIVATION, [_activate(src=1, src_offset=4, dst_offset=0,
                                                             out_format=7, n=2)],
                               Fault.BAD_FIELD),
    "activate-bank": (Engine.ACTIVATION, [_activate(psum_bank=BANKS)], Fault.OUT_OF_RANGE),
    "activate-entry": (Engine.ACTIVATION, [_activate(psum_entry=E - 1, n=2)],
                       Fault.OUT_OF_RANGE),
    "activate-src-end": (Engine.ACTIVATION, [_activate(src=1, src_offset=B - 1, n=2,
                                                       dst_offset=0)], Fault.OUT_OF_RANGE),
    "activate-dst-end": (Engine.ACTIVATION, [_activate(dst_offset=B - 1, n=2)],
                         Fault.OUT_OF_RANGE),
    "activate-dst-end-int32": (Engine.ACTIVATION, [_activate(dst_offset=B - 4, n=2,
                                                             out_format=7)], Fault.OUT_OF_RANGE),
    "activate-bias-end": (Engine.ACTIVATION, [_activate(bias=1, bias_offset=B)],
                          Fault.OUT_OF_RANGE),
    "activate-bad-before-range": (Engine.ACTIVATION, [_activate(out_format=7,
                                                                dst_offset=B + 2)],
                                  Fault.BAD_FIELD),
    # Formats: a format that is no matmul format (fp32, int32) comes first, before the other
    # rules of the instruction (test_an_int8_build_refuses_the_float_formats: those the
    # build leaves out).
    **{f"load-format-{code}": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=0, cols=M,
                                                   format=code)], Fault.ILLEGAL_OPCODE)
       for code in (6, 7)},
    **{f"matmul-format-{code}": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=0, format=code)],
                                 Fault.ILLEGAL_OPCODE) for code in (6, 7)},
    **{f"activate-format-{code}": (Engine.ACTIVATION, [_activate(n=0, out_format=code)],
                                   Fault.ILLEGAL_OPCODE) for code in (4, 5)},
    "load-bf16-odd-offset": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=1,
                                                 sbuf_offset=1, format=BF16)], Fault.BAD_FIELD),
    "load-bf16-sbuf-end": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=2,
                                               sbuf_offset=B - 2, format=BF16)],
                           Fault.OUT_OF_RANGE),
    "matmul-format-differs": (Engine.TENSOR, [LOAD, enc(Op.MATMUL, n=1, format=BF16)],
                              Fault.BAD_FIELD),
    "matmul-fp8-after-fp8": (Engine.TENSOR, [enc(Op.LOAD_STATIONARY, rows=K, cols=M,
                                                 format=2),
                                             enc(Op.MATMUL, n=1, format=3)], Fault.BAD_FIELD),
    "matmul-bf16-odd-offset": (Engine.TENSOR, [LOAD_BF16, enc(Op.MATMUL, n=1, sbuf_offset=3,
                                                              format=BF16)], Fault.BAD_FIELD),
    "matmul-bf16-sbuf-end": (Engine.TENSOR, [LOAD_BF16, enc(Op.MATMUL, n=2, format=BF16,
                                                            sbuf_offset=B - 2)],
                             Fault.OUT_OF_RANGE),
    "activate-float-from-sbuf": (Engine.ACTIVATION, [_activate(src=1, out_format=6,
                                                               dst_offset=64)],
                                 Fault.BAD_FIELD),
    "activate-float-shift": (Engine.ACTIVATION, [_activate(shift=1, out_format=BF16)],
                             Fault.BAD_FIELD),
    "activate-bf16-align": (Engine.ACTIVATION, [_activate(out_format=BF16, dst_offset=1)],
                            Fault.BAD_FIELD),
    "activate-fp32-align": (Engine.ACTIVATION, [_activate(out_format=6, dst_offset=2)],
                            Fault.BAD_FIELD),
    "activate-bf16-dst-end": (Engine.ACTIVATION, [_activate(out_format=BF16, n=2,
                                                            dst_offset=B - 2)],
                              Fault.OUT_OF_RANGE),
}


@pytest.mark.parametrize("engine, stream, fault", FAULT_CASES.values(), ids=FAULT_CASES)
def test_fault(engine, stream, fault):
    streams = [[END], [END], [END]]
    streams[engine] = stream + [END]
    outcome = _run(streams)
    assert (outcome.fault, outcome.engine) == (fault, engine)
    assert outcome.pc == BASES[engine] + sum(len(i) for i in stream[:-1])
    assert outcome.dma_error_code == 0
    # The faulting instruction and everything after it did not complete.
    assert outcome.retired[engine] == len(stream) - 1
    assert outcome.semaphores == [0] * SEMS


@pytest.mark.parametrize("engine, instruction", [
    *[(Engine.TENSOR, enc(Op.LOAD_STATIONARY, rows=K, cols=1, format=code))
      for code in (1, 2, 3, 4, 5)],
    *[(Engine.ACTIVATION, _activate(out_format=code)) for code in (1, 2, 3, 6)],
], ids=["load-bf16", "load-fp8e4m3", "load-fp8e5m2", "load-mxfp8e4m3", "load-mxfp8e5m2",
        "act-bf16", "act-fp8e4m3", "act-fp8e5m2", "act-fp32"])
def test_an_int8_build_refuses_the_float_formats(engine, instruction):
    small = config.preset("small")
    assert small.dtypes == ("int8",)
    streams = [[END], [END], [END]]
    streams[engine] = [instruction, END]
    outcome = _run(streams, cfg=small)
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.ILLEGAL_OPCODE, engine,
                                                           BASES[engine])


@pytest.mark.parametrize("stream, fault", [
    ([enc(Op.LOAD_STATIONARY, rows=K, cols=M, format=4, scale_offset=B - M + 1)],
     Fault.OUT_OF_RANGE),
    ([enc(Op.LOAD_STATIONARY, rows=K, cols=M, format=4, scale_offset=B - M),
      enc(Op.MATMUL, n=2, format=4, scale_offset=B - 1)], Fault.OUT_OF_RANGE),
    ([enc(Op.LOAD_STATIONARY, rows=K, cols=M, format=4),
      enc(Op.MATMUL, n=1, format=5)], Fault.BAD_FIELD),
    ([enc(Op.LOAD_STATIONARY, rows=K, cols=M, format=4, scale_offset=B - M),
      enc(Op.MATMUL, n=2, format=4, scale_offset=B - 2), END], Fault.NONE),
], ids=["load-scales-past-the-sbuf", "matmul-scales-past-the-sbuf", "mx-format-differs",
        "scales-end-at-the-sbuf-end"])
def test_mx_scale_rules(stream, fault):
    """The MX formats (tiny builds them): their scales must lie in the SBUF."""
    assert {"mxfp8e4m3", "mxfp8e5m2"} <= set(TINY.dtypes)
    outcome = _run([[END], stream if fault == Fault.NONE else stream + [END], [END]],
                   cfg=TINY)
    assert outcome.fault == fault
    if fault != Fault.NONE:
        assert (outcome.engine, outcome.pc) == (Engine.TENSOR,
                                                BASES[1] + 32 * (len(stream) - 1))


def test_rules_admit_their_limits():
    """Accesses that end exactly at their buffer's end, adjacent source and destination, and
    the fields that the other source ignores, all pass their checks."""
    n = 4                                       # keeps the int32 destinations aligned
    outcome = _run([
        [END],
        [enc(Op.LOAD_STATIONARY, sbuf_offset=B - M, rows=K, cols=M),
         enc(Op.MATMUL, sbuf_offset=B - n, n=n, psum_bank=BANKS - 1, psum_entry=E - n),
         enc(Op.LOAD_STATIONARY, rows=1, cols=1),
         enc(Op.MATMUL, n=NMAX),
         END],
        [_activate(psum_bank=BANKS - 1, psum_entry=E - n, n=n, dst_offset=B - 4 * n,
                   out_format=7, bias=1, bias_offset=B - 4, src_offset=(1 << 32) - 1),
         _activate(src=1, src_offset=B - n, n=n, dst_offset=B - 5 * n, out_format=7,
                   psum_bank=255, psum_entry=(1 << 16) - 1),
         _activate(src=1, src_offset=0, dst_offset=n, n=n),
         _activate(src=1, src_offset=4 * n, dst_offset=0, n=n, out_format=7),
         END],
    ])
    _assert_clean(outcome)
    assert outcome.retired == {Engine.DMA: 1, Engine.TENSOR: 5, Engine.ACTIVATION: 5}
    assert outcome.counters["macs"] == K * M * n + NMAX


def test_float_rules_admit_their_limits():
    """bf16 tiles and moving columns that end at the SBUF's end, every float output format
    ending there too, and fp8 tiles at odd offsets (one byte per element)."""
    n = 4
    outcome = _run([
        [END],
        [enc(Op.LOAD_STATIONARY, sbuf_offset=B - 2 * M, rows=K, cols=M, format=BF16),
         enc(Op.MATMUL, sbuf_offset=B - 2 * n, n=n, format=BF16, accumulate=1),
         enc(Op.LOAD_STATIONARY, sbuf_offset=B - M, rows=K, cols=M, format=2),
         enc(Op.MATMUL, sbuf_offset=B - n, n=n, format=2),
         enc(Op.LOAD_STATIONARY, sbuf_offset=1, rows=K, cols=M, format=3),
         enc(Op.MATMUL, sbuf_offset=3, n=n, format=3),
         END],
        [*[_activate(n=n, out_format=code, dst_offset=B - n * size, bias=1, bias_offset=B - 4,
                     multiplier=0x3F800000)
           for code, size in ((6, 4), (BF16, 2), (2, 1), (3, 1))],
         END],
    ])
    _assert_clean(outcome)
    assert outcome.retired == {Engine.DMA: 1, Engine.TENSOR: 7, Engine.ACTIVATION: 5}


def test_dma_fields_that_fit_the_build_go_to_the_dma():
    # The widest address that fits is no OUT_OF_RANGE: the DMA itself finds the row leaving
    # HBM.
    assert TINY.hbm_bytes <= 1 << ADDR_BITS
    outcome = _run([[_dma(src_addr=(1 << ADDR_BITS) - 1, n0=2), END], [END], [END]])
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.DMA_ERROR, Engine.DMA, 0)
    assert outcome.dma_error_code == ErrorCode.SRC_BOUNDS


# -- faults: deadlock, fetch, DMA errors --------------------------------------------------------

def test_deadlock_reports_the_lowest_waiting_engine():
    outcome = _run([
        [enc(Op.NOP, signal_sem=1), END],
        [enc(Op.NOP), enc(Op.NOP, wait_sem=1, wait_value=2), END],
        [enc(Op.NOP, wait_sem=2, wait_value=1), END],
    ])
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.DEADLOCK, Engine.TENSOR,
                                                           BASES[1] + 32)
    assert outcome.retired == {Engine.DMA: 2, Engine.TENSOR: 1, Engine.ACTIVATION: 0}
    assert outcome.semaphores[1] == 1


def test_deadlock_of_the_last_engine():
    outcome = _run([[END], [END], [enc(Op.NOP), enc(Op.ACTIVATE, n=1, wait_sem=SEMS - 1,
                                                    wait_value=1)]])
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.DEADLOCK, Engine.ACTIVATION,
                                                           BASES[2] + 32)


def test_misaligned_pointer_faults_before_anything_runs():
    hbm = _machine([[_dma(src_addr=DATA, dst=Space.HBM, dst_addr=DATA + 64, n0=8), END],
                    [END], [END]])
    hbm[DATA:DATA + 8] = 7
    programs = [BASES[0], BASES[1] + 8, BASES[2]]
    outcome = run(TINY, hbm, programs)
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.FETCH_ERROR, Engine.TENSOR,
                                                           BASES[1] + 8)
    assert outcome.retired == dict.fromkeys(Engine, 0)
    assert not outcome.hbm[DATA + 64:DATA + 72].any()


@pytest.mark.parametrize("pointer", [TINY.hbm_bytes, TINY.hbm_bytes + 4096, 1 << 40])
def test_pointer_past_hbm(pointer):
    outcome = run(TINY, _machine([[END], [END], [END]]), [BASES[0], BASES[1], pointer])
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.FETCH_ERROR,
                                                           Engine.ACTIVATION, pointer)


def test_fetch_at_the_end_of_hbm():
    last = TINY.hbm_bytes - 32
    hbm = np.zeros(TINY.hbm_bytes, np.uint8)

    def outcome_with(engine, instruction):
        image = hbm.copy()
        image[last:] = np.frombuffer(instruction[:32], np.uint8)
        programs = list(BASES)
        programs[engine] = last
        return run(TINY, image, programs)

    # A two-word DMA in the last word: its second word is past HBM.
    outcome = outcome_with(Engine.DMA, _dma(**A_DMA))
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.FETCH_ERROR, Engine.DMA, last)
    # Other engines take one word of the DMA opcode and refuse it.
    outcome = outcome_with(Engine.TENSOR, _dma(**A_DMA))
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.ILLEGAL_OPCODE, Engine.TENSOR,
                                                           last)
    # A stream that runs off the end of HBM.
    outcome = outcome_with(Engine.ACTIVATION, enc(Op.NOP))
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.FETCH_ERROR,
                                                           Engine.ACTIVATION, TINY.hbm_bytes)
    assert outcome.retired[Engine.ACTIVATION] == 1


@pytest.mark.parametrize("bad, code", [
    (_dma(src_addr=DATA, dst_addr=0, n0=0), ErrorCode.ZERO_SIZE),
    (_dma(src=3, src_addr=0, dst_addr=0, n0=1), ErrorCode.BAD_SPACE),
    (_dma(src_addr=TINY.hbm_bytes - 1, n0=2), ErrorCode.SRC_BOUNDS),
    (_dma(src_addr=DATA, dst_partition=K - 1, dst_pstep1=1, n0=1, n1=2), ErrorCode.DST_BOUNDS),
    (_dma(dst=Space.PSUM, src_addr=DATA, dst_addr=BANKS * E * 4 - 1, n0=2),
     ErrorCode.DST_BOUNDS),
    (_dma(dst=Space.HBM, src_addr=DATA, dst_addr=DATA + 4, n0=8), ErrorCode.OVERLAP),
], ids=lambda v: v.name if isinstance(v, ErrorCode) else "")
def test_dma_error(bad, code):
    payload = bytes(range(1, 17))
    first = _dma(src_addr=DATA, dst_addr=32, dst_partition=1, n0=16, signal_sem=0)
    after = _dma(src_addr=DATA, dst_addr=64, dst_partition=2, n0=16)
    outcome = _run([[first, enc(Op.NOP), bad, after, END],
                    [enc(Op.NOP, wait_sem=0, wait_value=1), END], [END]],
                   data={DATA: payload})
    assert (outcome.fault, outcome.engine) == (Fault.DMA_ERROR, Engine.DMA)
    assert outcome.pc == BASES[0] + 64 + 32
    assert outcome.dma_error_code == code
    # The first DMA completed; the faulting one did not retire, nothing after it ran.
    assert bytes(outcome.sbuf[1, 32:48]) == payload
    assert not outcome.sbuf[2].any()
    assert outcome.retired[Engine.DMA] == 2
    assert outcome.counters["dma_bytes"] == len(payload)
    assert outcome.semaphores[0] == 1


def test_first_fault_ends_the_run():
    # The activation engine faults in round 2; the DMA engine's third instruction never runs.
    outcome = _run([
        [enc(Op.NOP), enc(Op.NOP),
         _dma(src_addr=DATA, dst=Space.HBM, dst_addr=DATA + 64, n0=4), END],
        [END],
        [enc(Op.NOP), _activate(n=0)],
    ], data={DATA: b"abcd"})
    assert (outcome.fault, outcome.engine, outcome.pc) == (Fault.BAD_FIELD, Engine.ACTIVATION,
                                                           BASES[2] + 32)
    assert outcome.retired == {Engine.DMA: 2, Engine.TENSOR: 1, Engine.ACTIVATION: 1}
    assert not outcome.hbm[DATA + 64:DATA + 68].any()
    assert outcome.counters["dma_bytes"] == 0


# -- the interface ------------------------------------------------------------------------------

def test_inputs_are_copied_and_hbm_zero_extended():
    hbm = _machine([[_dma(src_addr=DATA, dst=Space.HBM, dst_addr=DATA + 16, n0=4),
                     _dma(src_addr=DATA, dst=Space.SBUF, dst_addr=0, n0=4),
                     _dma(src_addr=DATA, dst=Space.PSUM, dst_addr=0, n0=4), END], [END], [END]],
                   data={DATA: b"wxyz"})
    sbuf = np.zeros((K, B), np.uint8)
    psum = np.zeros((M, BANKS * E * 4), np.uint8)
    before = hbm.copy()
    outcome = Core(TINY).run(hbm, BASES, sbuf=sbuf, psum=psum)
    _assert_clean(outcome)
    assert np.array_equal(hbm, before) and not sbuf.any() and not psum.any()
    assert outcome.hbm.shape == (TINY.hbm_bytes,) and outcome.hbm.dtype == np.uint8
    assert bytes(outcome.hbm[DATA + 16:DATA + 20]) == b"wxyz"
    assert not outcome.hbm[len(hbm):].any()
    assert bytes(outcome.sbuf[0, :4]) == b"wxyz" and bytes(outcome.psum[0, :4]) == b"wxyz"
    assert outcome.counters["dma_bytes"] == 12


def test_bad_arguments():
    hbm = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="programs"):
        run(TINY, hbm, [0, 0])
    with pytest.raises(ValueError, match="hbm"):
        run(TINY, np.zeros(TINY.hbm_bytes + 1, np.uint8), [0, 0, 0])
    with pytest.raises(ValueError, match="sbuf"):
        run(TINY, hbm, [0, 0, 0], sbuf=np.zeros((K, B + 1), np.uint8))
    with pytest.raises(ConfigError, match="pe_cols"):
        Core(TINY.replace(pe_cols=8))
    # Every preset has a golden core, those without int8 included.
    assert Core(config.preset("trn2")).config.dtypes == ("bf16", "fp8e4m3", "fp8e5m2")
    with pytest.raises(RuntimeError, match="max_instructions"):
        run(TINY, _machine([[enc(Op.NOP)] * 4 + [END], [END], [END]]), BASES,
            max_instructions=3)
