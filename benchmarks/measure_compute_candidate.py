"""Benchmark candidate: the logistic map with in-place numpy operations (no allocation in the loop)."""

import numpy as np

ITERATIONS = 20000


def run(x, r):
    x = x.copy()
    tmp = np.empty_like(x)
    for _ in range(ITERATIONS):
        np.subtract(1.0, x, out=tmp)
        np.multiply(tmp, x, out=tmp)
        np.multiply(tmp, r, out=x)
    return x
