"""Golden model of :mod:`opentrn.hdl.tensor_engine`: the results, bit for bit, and the cycle
of every result beat, from the formulas of docs/performance.md.

Notation: ``K = pe_rows``, ``M = pe_cols``, ``N`` the moving vectors of one matmul.
"""

from dataclasses import dataclass

import numpy as np

from .processing_element import wrap

__all__ = ["Matmul", "Schedule", "matmul", "latency", "load_cycles", "reload_guard",
           "issue_interval", "schedule"]


def _check(config, name, array, rows, cols_max):
    array = np.asarray(array)
    lo, hi = -(1 << (config.in_bits - 1)), (1 << (config.in_bits - 1)) - 1
    if array.ndim != 2 or array.shape[0] != rows or not 1 <= array.shape[1] <= cols_max:
        raise ValueError(f"{name} has shape {array.shape}: must be ({rows}, 1..{cols_max})")
    if array.size and (array.min() < lo or array.max() > hi):
        raise ValueError(f"{name} has values outside int8 range [{lo}, {hi}]")
    return array.astype(np.int64)


def matmul(config, stationary, moving):
    """``out[M, N] = stationary[K, M].T @ moving[K, N]`` with ``acc_bits`` wrap-around.

    The hardware wraps after every addition; two's-complement addition is exact modulo
    ``2**acc_bits``, so wrapping the exact sum once gives the same bits.
    """
    stationary = _check(config, "stationary", stationary, config.pe_rows, config.pe_cols)
    moving = _check(config, "moving", moving, config.pe_rows, config.moving_max)
    return wrap(stationary.T @ moving, config.acc_bits)


def latency(config):
    """Cycles from a moving vector's acceptance to its result beat: ``K + M - 1``."""
    return config.pe_rows + config.pe_cols - 1


def load_cycles(config):
    """Cycles of one stationary load: ``M`` (one tile column per cycle)."""
    return config.pe_cols


def reload_guard(config):
    """Cycles from a swap to the first beat of the next load into the retired bank: ``K``."""
    return config.pe_rows


def issue_interval(config, n, *, fresh):
    """Steady-state cycles between the starts of back-to-back matmuls of ``n`` vectors:
    ``max(N, K + M)`` when each takes a fresh stationary tile, ``N`` when it reuses one."""
    if fresh:
        return max(n, reload_guard(config) + load_cycles(config))
    return n


@dataclass(frozen=True)
class Matmul:
    """One matmul of a program: a fresh ``stationary`` tile ([K, M']; M' <= M columns, the
    rest zero) loaded and swapped in, or ``None`` to reuse the tile in use."""

    moving: np.ndarray
    stationary: np.ndarray | None = None


@dataclass(frozen=True)
class Schedule:
    """Predicted cycles, counted from the cycle the drivers first present their beats."""

    load_starts: list      # first beat of each stationary load
    starts: list           # first moving vector of each matmul
    result_cycles: list    # one list per matmul: the cycle of each result beat
    total_cycles: int      # up to and including the last result beat


def schedule(config, program):
    """Predict the cycle of every beat when the stationary and moving streams present their
    beats as early as possible and the result stream is always ready."""
    if not program or program[0].stationary is None:
        raise ValueError("the first matmul of a program must load a stationary tile")
    k_rows, lat = config.pe_rows, latency(config)
    load_starts, starts, results = [], [], []
    previous_swap = None
    next_free = 0                          # first cycle the moving stream is free
    for op in program:
        n = np.asarray(op.moving).shape[1]
        start = next_free
        if op.stationary is not None:
            load_start = 0 if previous_swap is None else previous_swap + k_rows
            load_starts.append(load_start)
            start = max(start, load_start + load_cycles(config))
            previous_swap = start
        starts.append(start)
        results.append([start + i + lat for i in range(n)])
        next_free = start + n
    return Schedule(load_starts, starts, results, results[-1][-1] + 1)
