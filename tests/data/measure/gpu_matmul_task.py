"""Trusted GPU task: C = A @ B in float32 (reference on the CPU with numpy, float64 accumulate)."""

import numpy as np

NAME = "gpu-matmul"
TIMING_SHAPE = (2048, 2048)
RTOL = 2e-3
ATOL = 2e-3


def make_inputs(rng, shape):
    n, m = shape
    return {"a": rng.standard_normal((n, m), dtype=np.float32), "b": rng.standard_normal((m, n), dtype=np.float32)}


def reference(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def hidden_shape(rng):
    return (int(rng.integers(256, 2048)), int(rng.integers(256, 2048)))
