"""Benchmark task: iterate the logistic map x <- r x (1 - x) on a small vector.

Compute-bound and cache-resident (a few KB), with no system calls in the
loop, so the sandbox's own cost shows only in the handshake. Used by
benchmarks/measure_fidelity.py.
"""

import numpy as np

NAME = "logistic-map"
TIMING_SHAPE = (512,)
ITERATIONS = 20000
RTOL = 0.0
ATOL = 0.0


def make_inputs(rng, shape):
    return {"x": rng.uniform(0.1, 0.9, shape), "r": rng.uniform(3.5, 3.9, shape)}


def reference(x, r):
    x = x.copy()
    tmp = np.empty_like(x)
    for _ in range(ITERATIONS):
        np.subtract(1.0, x, out=tmp)
        np.multiply(tmp, x, out=tmp)
        np.multiply(tmp, r, out=x)
    return x
