"""Waiting for a condition in the benchmarks (standalone scripts, run as ``python benchmarks/NAME.py``)."""

import time


def wait_until(predicate, timeout, what, interval=0.05):
    """Call ``predicate`` every ``interval`` seconds until it returns a true value, and return that value.

    Raises TimeoutError naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def became_true(predicate, timeout, interval=0.05):
    """Like wait_until, but returns False instead of raising when ``timeout`` seconds pass."""
    try:
        return wait_until(predicate, timeout, "", interval)
    except TimeoutError:
        return False
