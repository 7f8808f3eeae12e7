"""The kernel API's errors and its argument checks."""

import numpy as np


class KernelError(ValueError):
    """A kernel argument that breaks a rule: the message names the argument, its value and
    the rule."""


def _fail(name, value, rule):
    raise KernelError(f"{name}={value!r}: {rule}")


def _int(name, value, lo=None, hi=None):
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        _fail(name, value, "must be an integer")
    value = int(value)
    if lo is not None and value < lo or hi is not None and value > hi:
        rule = (f"must be between {lo} and {hi}" if lo is not None and hi is not None
                else f"must be at least {lo}" if lo is not None else f"must be at most {hi}")
        _fail(name, value, rule)
    return value


class KernelRunError(RuntimeError):
    """A run that ended with a fault; ``outcome`` has the details."""

    def __init__(self, message, outcome):
        super().__init__(message)
        self.outcome = outcome
