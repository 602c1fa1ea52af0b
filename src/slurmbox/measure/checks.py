"""Verdicts on one sample's output and the named reasons a candidate is flagged.

Every check runs in the harness, outside the sandbox, on data the harness
owns: the expected output from the trusted reference process, the pristine
inputs, the harness's own clock and the kernel's CPU accounting of the
sandbox. Any flag withholds the reward.
"""

import re
from dataclasses import dataclass, field

import numpy as np

#: Named reasons (the record's ``flags`` use these names).
REASONS = {
    "incorrect_output": "an output differs from the trusted reference beyond the task's tolerance",
    "wrong_output_shape": "an output's shape differs from the reference's (hard-coded shapes?)",
    "non_finite_output": "an output holds NaN or infinity where the reference does not",
    "tolerance_exceeded": "an output is close to the reference but outside the tolerance (lowered precision?)",
    "stale_output": "an output equals an earlier sample's expected output (cached across calls)",
    "identity_output": "an output equals one of the inputs (identity/no-op)",
    "constant_output": "an output is constant where the reference is not",
    "intermittent_incorrect": "some samples were correct and others not (behaves differently across calls)",
    "hidden_shape_failed": "the candidate failed a probe at a hidden shape",
    "nondeterministic_output": "a repeated input gave a different output",
    "repeat_input_faster": "a repeated input was answered much faster than fresh ones (keyed on the input)",
    "work_after_done": "the sandbox kept using CPU after answering (background thread or child process)",
    "cpu_exceeds_wall": "the sandbox used more CPU time than its CPUs could give in the timed window",
    "timing_claim_mismatch": "the candidate's own time claim disagrees with the harness's clock (patched timer?)",
    "protocol_violation": "the candidate sent a malformed, unsolicited or mismatched message",
    "forged_output_text": "the candidate printed lines that imitate harness results",
    "unexpected_files": "the candidate left files in its channel directory",
    "candidate_error": "the candidate raised an error",
    "candidate_crashed": "the candidate's sandbox ended or closed the channel",
    "timeout": "a sample did not answer within the time limit",
}

#: Printed text that imitates a harness verdict or timing line.
FORGERY_PATTERN = re.compile(r"(?i)(slurmbox|verdict|reward|\b(median|mean|runtime|time)_?(ns|us|ms|s)?\"?\s*[:=]\s*[\d.])")


@dataclass
class Flag:
    """One flagged problem: ``reason`` (a REASONS key), ``sample`` index or -1, ``detail`` text."""

    reason: str
    sample: int = -1
    detail: str = ""

    def to_json(self):
        """JSON-ready dict: ``reason``, ``sample`` (index, -1 for the whole run), ``detail``."""
        return {"reason": self.reason, "sample": self.sample, "detail": self.detail}


@dataclass
class OutputHistory:
    """Expected outputs of the last few samples, to recognise stale (cached) answers."""

    keep: int = 4
    expected: list = field(default_factory=list)

    def add(self, array):
        """Remember ``array`` (a sample's expected output), keeping only the last ``keep``."""
        self.expected.append(array)
        del self.expected[:-self.keep]


def _close(a, b, rtol, atol):
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False))


def verify_output(output, expected, inputs, task, history, sample):
    """Flags (list of Flag) for one sample's ``output`` against ``expected``.

    ``inputs``: the pristine inputs (dict); ``task``: task.Task (tolerance,
    optional check); ``history``: OutputHistory of earlier expected outputs
    (not yet containing ``expected``). An empty list means correct.
    """
    expected = np.asarray(expected)
    if output.shape != expected.shape:
        return [Flag("wrong_output_shape", sample, "got shape %s, expected %s" % (output.shape, expected.shape))]
    flags = []
    if expected.size and np.issubdtype(output.dtype, np.inexact):
        if not np.all(np.isfinite(output)) and np.all(np.isfinite(expected)):
            flags.append(Flag("non_finite_output", sample, "%d non-finite values" % int((~np.isfinite(output)).sum())))
    if task.check is not None:
        try:
            ok, detail = task.check(output, expected, inputs)
        except Exception as err:  # a task check failing on odd output is a failed check
            ok, detail = False, "task check raised %s: %s" % (type(err).__name__, err)
    else:
        ok = _close(output.astype(np.float64) if output.dtype.kind == "c" else output, expected, task.rtol, task.atol)
        detail = "" if ok else _error_detail(output, expected)
    # Degenerate answers are flagged even where a task's own check is weak.
    degenerate = []
    if expected.size > 1:
        flat = output.reshape(-1)
        if np.all(flat == flat[0]) and not np.all(expected.reshape(-1) == expected.reshape(-1)[0]):
            degenerate.append(Flag("constant_output", sample, "every element equals %r" % (flat[0].item(),)))
        for name, array in inputs.items():
            if array.shape == output.shape and np.array_equal(array, output) and not np.array_equal(array, expected):
                degenerate.append(Flag("identity_output", sample, "output equals input %r" % name))
    if not ok:
        flags.append(Flag("incorrect_output", sample, detail))
        for old in history.expected:
            if old.shape == output.shape and np.array_equal(old, output):
                flags.append(Flag("stale_output", sample, "equals the expected output of an earlier sample"))
                break
        if output.size and _relative_error(output, expected) < 1e-2:
            flags.append(Flag("tolerance_exceeded", sample, detail))
    return flags + degenerate


def _relative_error(output, expected):
    out = output.astype(np.complex128 if output.dtype.kind == "c" else np.float64)
    ref = expected.astype(np.complex128 if expected.dtype.kind == "c" else np.float64)
    with np.errstate(all="ignore"):
        scale = np.max(np.abs(ref)) or 1.0
        value = float(np.max(np.abs(out - ref)) / scale)
    return value if np.isfinite(value) else float("inf")


def _error_detail(output, expected):
    try:
        out = output.astype(np.float64) if output.dtype.kind != "c" else output
        with np.errstate(all="ignore"):
            diff = np.abs(out - expected)
        return "max abs error %.3g, max relative error %.3g" % (float(np.nanmax(diff)) if diff.size else 0.0,
                                                                 _relative_error(output, expected))
    except (TypeError, ValueError) as err:
        return "not comparable: %s" % err


def forged_lines(text, limit=3):
    """Lines of the candidate's printed ``text`` that imitate harness results (at most ``limit``)."""
    hits = [line.strip() for line in text.splitlines() if FORGERY_PATTERN.search(line)]
    return hits[:limit]


@dataclass
class CpuThresholds:
    """Tolerances of the CPU-accounting cross-checks (all in ns or fractions).

    ``idle_rate``: the idle sandbox's CPU ns per wall ns, measured at start.
    ``slack_ns``: CPU the runtime may spend around a response (gVisor's
    sentry finishing the write and returning to the read).
    """

    idle_rate: float = 0.0
    slack_ns: float = 500_000
    slack_fraction: float = 0.25

    def allowed_quiet(self, wall_ns):
        """CPU ns an honest, idle sandbox may use in a quiet window of ``wall_ns``."""
        return self.idle_rate * wall_ns + self.slack_ns + self.slack_fraction * wall_ns


def cpu_flags(sample, window_wall_ns, window_cpu_ns, quiet_wall_ns, quiet_cpu_ns, ncpus, thresholds):
    """Flags from the kernel's CPU time of the sandbox around one sample.

    ``window_*``: the request/response window; ``quiet_*``: the window after
    the response (and before the next request). ``ncpus``: CPUs the sandbox
    may use. None values (accounting unavailable) give no flags.
    """
    flags = []
    if window_cpu_ns is not None and window_cpu_ns > ncpus * window_wall_ns * 1.05 + thresholds.slack_ns:
        flags.append(Flag("cpu_exceeds_wall", sample, "%.3f ms CPU in a %.3f ms window on %d CPU(s)"
                          % (window_cpu_ns / 1e6, window_wall_ns / 1e6, ncpus)))
    if quiet_cpu_ns is not None and quiet_cpu_ns > thresholds.allowed_quiet(quiet_wall_ns):
        flags.append(Flag("work_after_done", sample, "%.3f ms CPU in the %.3f ms after answering"
                          % (quiet_cpu_ns / 1e6, quiet_wall_ns / 1e6)))
    return flags
