"""Trusted task definitions: input generator, reference, tolerance, hidden shapes.

A task is a Python file the site or the trainer writes (never a candidate's
code) defining::

    NAME = "matmul"                       # optional, default: file stem
    TIMING_SHAPE = (256, 256)             # the shape every timed sample uses
    def make_inputs(rng, shape) -> dict   # name -> numpy array; rng: numpy.random.Generator
    def reference(**inputs) -> ndarray    # the trusted result
    RTOL = 1e-5; ATOL = 1e-8              # optional tolerance of numpy.allclose
    def hidden_shape(rng) -> tuple        # optional: shapes for correctness probes
    def check(output, expected, inputs) -> (bool, str)   # optional stricter/other check

The task file is read by the harness and by the reference process only; it
is never mounted into a candidate's sandbox.
"""

import importlib.machinery
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Optional


class TaskError(ValueError):
    """The task file is missing, fails to import or lacks a required name."""


@dataclass
class Task:
    """A loaded task. ``path``: the task file; other fields as in the module doc."""

    path: str
    name: str
    timing_shape: tuple
    make_inputs: Callable
    reference: Callable
    rtol: float = 1e-5
    atol: float = 1e-8
    hidden_shape: Optional[Callable] = None
    check: Optional[Callable] = None


def load_task(path):
    """Import the task file at ``path`` and return a Task. Raises TaskError saying what is missing."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise TaskError("task file %s does not exist" % path)
    module_name = "slurmbox_measure_task_%d" % (abs(hash(path)) % 10 ** 9)
    # A path not ending in .py gets no loader from importlib; name the source loader explicitly.
    spec = importlib.util.spec_from_file_location(module_name, path,
                                                  loader=importlib.machinery.SourceFileLoader(module_name, path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise TaskError("task file %s fails to import: %s: %s" % (path, type(err).__name__, err))
    missing = [name for name in ("TIMING_SHAPE", "make_inputs", "reference") if not hasattr(module, name)]
    if missing:
        raise TaskError("task file %s lacks %s (see slurmbox.measure.task for the interface)"
                        % (path, ", ".join(missing)))
    return Task(path=path, name=getattr(module, "NAME", os.path.splitext(os.path.basename(path))[0]),
                timing_shape=tuple(module.TIMING_SHAPE), make_inputs=module.make_inputs,
                reference=module.reference, rtol=float(getattr(module, "RTOL", 1e-5)),
                atol=float(getattr(module, "ATOL", 1e-8)), hidden_shape=getattr(module, "hidden_shape", None),
                check=getattr(module, "check", None))
