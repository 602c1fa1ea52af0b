"""An honest candidate: matrix product with numpy."""

import numpy as np


def run(a, b):
    return np.matmul(a, b)
