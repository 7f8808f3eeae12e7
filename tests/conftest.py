import os

import pytest

from opentrn.sim import runner


def require_simulator(sim):
    """Skip a test when ``sim`` cannot run here, with the reason; in CI, fail instead:
    CI must run both simulators."""
    reason = runner.available(sim)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{sim} is required in CI: {reason}")
    pytest.skip(reason)
