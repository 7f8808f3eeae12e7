"""Checks of a block's constructor parameters, refusing with the name, the value and the
rule (``word_bytes=6: must be a power of two``)."""

import contextlib

__all__ = ["check_positive", "check_power_of_two", "refusing"]


def check_positive(**values):
    """Each value is an integer of at least 1 (not a bool)."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a positive integer")


def check_power_of_two(**values):
    """Each value is a positive integer and a power of two."""
    check_positive(**values)
    for name, value in values.items():
        if value & (value - 1):
            raise ValueError(f"{name}={value}: must be a power of two")


@contextlib.contextmanager
def refusing(component):
    """Around a constructor's checks: a refused component is marked used before the error
    propagates, so Amaranth does not also warn that it was never elaborated."""
    try:
        yield
    except (TypeError, ValueError):
        component._MustUse__silence = True
        raise
