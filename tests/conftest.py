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


#: Random vectors of the FP unit testbenches per run, by simulator. Icarus evaluates the wide
#: combinational lane vectors about ten times slower than Verilator (a million FP32 sums take
#: over two minutes there), so within the suite's time budget it runs a tenth of them;
#: ``OPENTRN_FULL_FP=1`` runs a million on both (docs/numerics.md gives those runs).
FP_VECTORS = {"verilator": 10**6,
              "icarus": 10**6 if os.environ.get("OPENTRN_FULL_FP") == "1" else 10**5}
