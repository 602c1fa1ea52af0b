"""Noisy neighbour for benchmarks/measure_fidelity.py: on import, two processes hammer the
CPU (a spin loop) and memory bandwidth (copies of a 64 MiB array) until killed. Served by
the ordinary runner so it starts like any candidate; its run() is never called."""

import os

import numpy as np


def _hammer(kind):
    if kind == "cpu":
        x = 0
        while True:
            x += 1
    a = np.ones(8 * 1024 * 1024)
    b = np.empty_like(a)
    while True:
        np.copyto(b, a)
        np.copyto(a, b)


for _kind in ("cpu", "memory"):
    if os.fork() == 0:
        _hammer(_kind)


def run(**inputs):
    return next(iter(inputs.values()))
