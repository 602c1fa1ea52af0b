"""A task with a deliberately weak check (shape only): the harness's own guards
must still catch identity and constant answers."""

import numpy as np

NAME = "sort-weak"
TIMING_SHAPE = (4096,)


def make_inputs(rng, shape):
    return {"x": rng.standard_normal(shape)}


def reference(x):
    return np.sort(x)


def check(output, expected, inputs):
    return output.shape == expected.shape, "shape only"
