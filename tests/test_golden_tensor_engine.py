import numpy as np
import pytest

from opentrn import config
from opentrn.golden import tensor_engine as golden
from opentrn.golden.processing_element import mac, wrap

TINY = config.preset("tiny")
TINY16 = TINY.replace(acc_bits=16)


def systolic_reference(cfg, stationary, moving):
    """The array, PE by PE: partial sums flow down each column through ``mac``, wrapping at
    every step as the hardware does."""
    k_rows, m_cols = stationary.shape
    out = np.zeros((m_cols, moving.shape[1]), dtype=np.int64)
    for n in range(moving.shape[1]):
        for m in range(m_cols):
            psum = 0
            for k in range(k_rows):
                psum = int(mac(psum, moving[k, n], stationary[k, m], cfg.acc_bits))
            out[m, n] = psum
    return out


@pytest.mark.parametrize("cfg", [TINY, TINY16, config.preset("small")])
def test_matmul_equals_the_systolic_order(cfg):
    rng = np.random.default_rng(7)
    for _ in range(50):
        stationary = rng.integers(-128, 128, (cfg.pe_rows, cfg.pe_cols))
        moving = rng.integers(-128, 128, (cfg.pe_rows, int(rng.integers(1, cfg.moving_max + 1))))
        assert np.array_equal(golden.matmul(cfg, stationary, moving),
                              systolic_reference(cfg, stationary, moving))


def test_wrap_around():
    k = TINY16.pe_rows
    full = np.full((k, 1), -128)
    # K * (-128 * -128) = 65536 wraps to 0 in 16 bits; K * 127 * 127 = 64516 wraps to -1020.
    assert golden.matmul(TINY16, np.full((k, 4), -128), full)[0, 0] == 0
    assert golden.matmul(TINY16, np.full((k, 4), 127), np.full((k, 1), 127))[0, 0] == -1020
    assert golden.matmul(TINY, np.full((k, 4), 127), np.full((k, 1), 127))[0, 0] == 64516
    assert list(wrap([2**31, -2**31 - 1, 5], 32)) == [-2**31, 2**31 - 1, 5]


def test_matmul_rejects_bad_operands():
    with pytest.raises(ValueError, match=r"moving has shape \(4, 17\): must be \(4, 1..16\)"):
        golden.matmul(TINY, np.zeros((4, 4)), np.zeros((4, 17)))
    with pytest.raises(ValueError, match=r"stationary has shape \(3, 4\)"):
        golden.matmul(TINY, np.zeros((3, 4)), np.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"outside int8 range \[-128, 127\]"):
        golden.matmul(TINY, np.full((4, 4), 128), np.zeros((4, 1)))


def test_formulas():
    small = config.preset("small")
    assert golden.latency(TINY) == 7 and golden.latency(small) == 15
    assert golden.load_cycles(small) == 8
    assert golden.issue_interval(small, 4, fresh=True) == 16
    assert golden.issue_interval(small, 32, fresh=True) == 32
    assert golden.issue_interval(small, 4, fresh=False) == 4


def _program(cfg, ns, fresh):
    k, m = cfg.pe_rows, cfg.pe_cols
    return [golden.Matmul(np.zeros((k, n), dtype=np.int64),
                          np.zeros((k, m), dtype=np.int64) if f else None)
            for n, f in zip(ns, fresh, strict=True)]


def test_schedule_single_matmul():
    # Load in cycles 0..M-1, vectors from cycle M, results K + M - 1 later.
    timing = golden.schedule(TINY, _program(TINY, [3], [True]))
    assert timing.load_starts == [0]
    assert timing.starts == [4]
    assert timing.result_cycles == [[11, 12, 13]]
    assert timing.total_cycles == 14


def test_schedule_steady_state_intervals():
    cfg = config.preset("small")
    fresh = golden.schedule(cfg, _program(cfg, [2] * 6, [True] * 6))
    assert np.diff(fresh.starts).tolist()[1:] == [16] * 4       # max(N, K + M)
    long = golden.schedule(cfg, _program(cfg, [20] * 6, [True] * 6))
    assert np.diff(long.starts).tolist() == [20] * 5            # N >= K + M: no idle cycle
    reuse = golden.schedule(cfg, _program(cfg, [3] * 6, [True] + [False] * 5))
    assert np.diff(reuse.starts).tolist() == [3] * 5


def test_schedule_needs_a_first_tile():
    with pytest.raises(ValueError, match="first matmul of a program must load"):
        golden.schedule(TINY, _program(TINY, [1], [False]))
