import os

import pytest

from opentrn import config
from opentrn.sim import runner

#: The builds every block's simulation tests run on: the two simulation presets, and 16-bit
#: accumulators (int8 sums that wrap, narrower activation inputs).
SIM_BUILDS = {
    "tiny": config.preset("tiny"),
    "small": config.preset("small"),
    "tiny-acc16": config.preset("tiny").replace(acc_bits=16),
}


def require_simulator(sim):
    """Skip a test when ``sim`` cannot run here, with the reason; in CI, fail instead:
    CI must run both simulators."""
    reason = runner.available(sim)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{sim} is required in CI: {reason}")
    pytest.skip(reason)


def pytest_collection_modifyitems(config, items):
    """Run the simulator tests first: they take minutes where the others take seconds, so
    started last they would leave one test worker busy while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("sim") is None)
