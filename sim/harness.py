"""What every cocotb testbench here shares: its settings, from the environment that
:func:`opentrn.sim.runner.run` sets, and the statistics it reports back.

``OPENTRN_CONFIG`` carries the :class:`~opentrn.config.Config` as JSON; ``OPENTRN_REPORT``
names the JSON file that :func:`report` rewrites with every record (a list, in test order),
which the runner returns as ``SimResult.reports``. Other ``OPENTRN_*`` variables are each
testbench's own, read with :func:`setting`.
"""

import json
import os

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge

from opentrn.config import Config

from .streams import ClockDomain

__all__ = ["CLOCK_PERIOD_NS", "config", "setting", "report", "last_report", "start_clock",
           "reset"]

#: The simulated clock: 100 MHz (the cycle counts, not the period, are what the tests check).
CLOCK_PERIOD_NS = 10

_records = []


def config():
    return Config.from_dict(json.loads(os.environ["OPENTRN_CONFIG"]))


def setting(name, default, kind=int):
    """``OPENTRN_<NAME>`` converted by ``kind``, or ``default``."""
    value = os.environ.get(f"OPENTRN_{name.upper()}")
    return default if value is None else kind(value)


def report(record):
    _records.append(record)
    if path := os.environ.get("OPENTRN_REPORT"):
        with open(path, "w") as f:
            json.dump(_records, f, indent=1)


def last_report():
    return _records[-1]


def start_clock(dut):
    """Start ``dut.clk`` and return a :class:`~opentrn.sim.streams.ClockDomain` on it."""
    Clock(dut.clk, CLOCK_PERIOD_NS, unit="ns").start()
    return ClockDomain(dut.clk)


async def reset(dut, cycles=2):
    """Hold ``dut.rst`` for ``cycles`` rising edges of ``dut.clk``; release it at a falling
    edge and return after the next rising edge."""
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
