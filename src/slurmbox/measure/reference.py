"""The trusted reference, computed in a separate process on a pristine copy of the inputs.

The harness generates each sample's inputs, sends one copy here (through a
multiprocessing pipe between two trusted processes) and another to the
candidate's sandbox. The expected output therefore never depends on anything
the candidate did to its copy, and never enters the sandbox.
"""

import os
import pickle
import struct
import subprocess
import sys
import traceback


class ReferenceFailed(RuntimeError):
    """The task's reference raised or the reference process died; the message carries its traceback."""


def _write(stream, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("!Q", len(data)) + data)
    stream.flush()


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("reference channel closed")
    (size,) = struct.unpack("!Q", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("reference channel closed")
    return pickle.loads(data)


def worker_main(task_path):
    """Body of the reference process: read input dicts on stdin, answer on stdout.

    Both ends are the trusted harness (pickle is used between these two
    trusted processes only; nothing from a candidate passes here).
    """
    from slurmbox.measure.task import load_task
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a task printing must not corrupt the channel
    task = load_task(task_path)
    import numpy as np
    while True:
        try:
            inputs = _read(source)
        except EOFError:
            return 0
        try:
            _write(sink, ("ok", np.asarray(task.reference(**inputs))))
        except Exception:
            _write(sink, ("error", traceback.format_exc(limit=5)))


class ReferenceProcess:
    """A long-lived reference process for one task file, pinned to ``cpus`` (set of ints or None).

    Use as a context manager; ``expected(inputs)`` returns the reference
    output (ndarray) or raises ReferenceFailed.
    """

    def __init__(self, task_path, cpus=None):
        cpus = set(cpus or ())
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "slurmbox.measure.reference", task_path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def expected(self, inputs):
        """Reference output for ``inputs`` (dict name -> ndarray)."""
        try:
            _write(self._proc.stdin, inputs)
            status, value = _read(self._proc.stdout)
        except (EOFError, OSError) as err:
            raise ReferenceFailed("the reference process died (%s); exit code %s; its stderr is above"
                                  % (err, self._proc.poll()))
        if status != "ok":
            raise ReferenceFailed("the task's reference failed:\n%s" % value)
        return value

    def close(self):
        """Stop the process (idempotent)."""
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
