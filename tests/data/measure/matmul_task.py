"""Example trusted task: C = A @ B in float64 (tolerance rtol 1e-9).

Timed samples use 128x128 matrices; correctness probes use hidden shapes
drawn with the harness's secret seed.
"""


NAME = "matmul"
TIMING_SHAPE = (128, 128)
RTOL = 1e-9
ATOL = 1e-9


def make_inputs(rng, shape):
    n, m = shape
    return {"a": rng.standard_normal((n, m)), "b": rng.standard_normal((m, n))}


def reference(a, b):
    return a @ b


def hidden_shape(rng):
    return (int(rng.integers(40, 120)), int(rng.integers(40, 120)))
