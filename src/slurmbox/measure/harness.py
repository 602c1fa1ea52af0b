"""The measurement loop: one candidate, one task, samples until the stopping rule says so.

Per sample the harness (outside the sandbox, pinned to its own CPUs):

1. draws fresh inputs from a generator seeded with a secret seed (warm-up,
   timed samples and probes all look alike on the wire);
2. has the trusted reference process compute the expected output from its
   own pristine copy;
3. reads the sandbox's kernel CPU time and its own monotonic clock, sends
   the request, waits for the whole response, reads both again: the
   sample's time is that request/response window;
4. checks the output (checks.verify_output) and the CPU accounting of the
   window and of the quiet time after it (checks.cpu_flags).

Hidden-shape probes and repeats of one earlier input (three, so that one repeat
slowed by the machine does not hide a cache) are slipped in among the timed
samples at secret positions. Any flag withholds the reward.
"""

import hashlib
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from slurmbox.measure import checks, isolation, protocol, stats
from slurmbox.measure.checks import Flag

KIND_WARMUP, KIND_TIMED, KIND_HIDDEN, KIND_REPEAT = 0, 1, 2, 3
KIND_NAMES = {KIND_WARMUP: "warmup", KIND_TIMED: "timed", KIND_HIDDEN: "hidden_shape_probe",
              KIND_REPEAT: "repeat_probe"}
#: Reasons that end a candidate's measurement at once (nothing more can be learned).
FATAL = {"candidate_error", "candidate_crashed", "timeout", "protocol_violation", "wrong_output_shape"}


@dataclass
class MeasureOptions:
    """How to measure. CPUs are sets of ints; times in seconds unless named _ns.

    ``gpus``: device files (e.g. "/dev/nvidia0") passed into the sandbox
    through runsc's proxy; ``gpu_indices``: their NVML indices, read for
    throttle reasons after every sample (throttled samples are kept in the
    record but left out of the statistics and counted).
    ``isolation``: pin the harness to ``harness_cpus`` (SCHED_FIFO when
    ``realtime``) and the sandbox to ``sandbox_cpus``; off: no pinning
    (benchmark comparison only). ``sandbox``: "runsc" or "bare" (no
    sandbox; benchmark baseline only) or "slurm" (each candidate is a
    sandboxed Slurm step, ``srun --sandbox``, see slurm_step.py; ``srun_args``
    are added to its srun). ``seed``: None draws a secret seed
    (secrets.randbits); only its SHA-256 is recorded.
    """

    rule: stats.StoppingRule = field(default_factory=stats.StoppingRule)
    isolation: bool = True
    harness_cpus: Optional[set] = None
    sandbox_cpus: Optional[set] = None
    realtime: bool = True
    quiet_fraction: float = 0.1
    quiet_min_ns: int = 2_000_000
    quiet_max_ns: int = 20_000_000
    final_quiet_ns: int = 50_000_000
    hidden_probes: int = 2
    repeat_probes: int = 3
    sample_timeout: float = 60.0
    max_flagged_samples: int = 3
    sandbox: str = "runsc"
    platform: str = "auto"
    uid: int = 65534
    gid: int = 65534
    seed: Optional[int] = None
    max_output_bytes: int = 1 << 31
    calibrate: bool = True
    verify: bool = True
    gpus: tuple = ()
    gpu_indices: tuple = ()
    srun_args: tuple = ()


@dataclass
class CandidateResult:
    """Everything measured about one candidate. ``samples``: dict of equal-length numpy arrays
    (kind, wall_ns, cpu_ns, quiet_wall_ns, quiet_cpu_ns, claimed_ns, correct, throttle, sm_clock_mhz); ``summary``:
    stats.summarize of the timed samples; ``reward_ns``: the median, or None when withheld."""

    label: str
    candidate_path: str
    candidate_sha256: str
    task_name: str
    samples: dict
    summary: dict
    converged: bool
    flags: list
    verdict: str
    reward_ns: Optional[float]
    fingerprint: dict
    sandbox_config: dict
    stdout: str = ""
    stderr: str = ""
    overhead_ns: Optional[float] = None
    seed_sha256: str = ""
    wall_s: float = 0.0

    def to_json(self, with_samples=False):
        """JSON-ready summary (``with_samples``: also the raw per-sample lists)."""
        data = {"label": self.label, "candidate": self.candidate_path, "candidate_sha256": self.candidate_sha256,
                "task": self.task_name, "verdict": self.verdict, "reward_ns": self.reward_ns,
                "converged": self.converged, "summary": self.summary,
                "flags": [f.to_json() for f in self.flags], "flag_reasons": sorted({f.reason for f in self.flags}),
                "overhead_ns": self.overhead_ns, "seed_sha256": self.seed_sha256, "wall_s": self.wall_s,
                "fingerprint": self.fingerprint, "sandbox": self.sandbox_config}
        if with_samples:
            data["samples"] = {k: v.tolist() for k, v in self.samples.items()}
        return data


class _Sampler:
    """State of one candidate's measurement (one sandbox, one channel)."""

    def __init__(self, task, reference, candidate, options, rng_inputs, rng_schedule):
        self.task = task
        self.reference = reference
        self.candidate = candidate
        self.options = options
        self.rng_inputs = rng_inputs
        self.rng_schedule = rng_schedule
        self.flags = []
        self.rows = []
        self.history = checks.OutputHistory()
        if hasattr(candidate, "cpu_account"):  # Slurm mode: the step's sandbox record names the file
            self.account = candidate.cpu_account()
        else:
            self.account = isolation.CpuAccount(candidate.cgroups_path) if candidate.cgroups_path \
                else isolation.NullAccount()
        self.ncpus = len(options.sandbox_cpus) if (options.isolation and options.sandbox_cpus) \
            else len(isolation.online_cpus())
        self.thresholds = checks.CpuThresholds()
        self.last_t1 = None
        self.last_u1 = None
        self.saved_repeat = None
        self.flagged_samples = 0
        self.cpu_events = []
        from slurmbox.measure import gpu
        self.throttle = gpu.ThrottleMonitor(tuple(options.gpu_indices))

    def calibrate_idle(self, wall_ns=30_000_000):
        """Measure the idle sandbox's CPU rate (the runner waiting on its socket)."""
        u0, t0 = self.account.read(), time.perf_counter_ns()
        time.sleep(wall_ns / 1e9)
        u1, t1 = self.account.read(), time.perf_counter_ns()
        if u0 is not None and u1 is not None:
            self.thresholds.idle_rate = max(0.0, (u1 - u0) / (t1 - t0))

    def _quiet_target(self, last_wall):
        option = self.options
        return int(min(max(option.quiet_fraction * last_wall, option.quiet_min_ns), option.quiet_max_ns))

    def _pending_data(self):
        conn = self.candidate.conn
        if hasattr(conn, "pending"):
            return conn.pending()
        conn.settimeout(0.0)
        try:
            return len(conn.recv(1, socket.MSG_PEEK)) >= 0  # data, or end of stream (b"")
        except BlockingIOError:
            return False
        except OSError:
            return True

    def sample(self, index, kind, inputs, expected):
        """Run one sample; appends its row and flags. Returns False when measurement must stop."""
        conn = self.candidate.conn
        if self.last_t1 is not None:
            wait = self._quiet_target(self.rows[-1]["wall_ns"]) - (time.perf_counter_ns() - self.last_t1)
            if wait > 0:
                time.sleep(wait / 1e9)
        if self._pending_data():
            self.flags.append(Flag("protocol_violation", index, "unsolicited data on the channel before request"))
            return False
        u0 = self.account.read()
        t0 = time.perf_counter_ns()
        if self.last_t1 is not None:
            quiet_cpu = None if (u0 is None or self.last_u1 is None) else u0 - self.last_u1
            self.rows[-1]["quiet_wall_ns"] = t0 - self.last_t1
            self.rows[-1]["quiet_cpu_ns"] = -1 if quiet_cpu is None else quiet_cpu
            self.cpu_events.extend(checks.cpu_flags(index - 1, 0, None, t0 - self.last_t1, quiet_cpu, self.ncpus,
                                                    self.thresholds))
        conn.settimeout(self.options.sample_timeout)
        try:
            protocol.send(conn, {"op": "run", "id": index}, sorted(inputs.items()))
            header = protocol.recv_header(conn)
            arrays = protocol.recv_arrays(conn, header, self.options.max_output_bytes)
        except socket.timeout:
            self.flags.append(Flag("timeout", index, "no answer within %.0f s" % self.options.sample_timeout))
            return False
        except protocol.PeerClosed as err:
            self.flags.append(Flag("candidate_crashed", index, str(err)))
            return False
        except protocol.ProtocolError as err:
            self.flags.append(Flag("protocol_violation", index, str(err)))
            return False
        except OSError as err:
            self.flags.append(Flag("candidate_crashed", index, "channel error: %s" % err))
            return False
        t1 = time.perf_counter_ns()
        u1 = self.account.read()
        self.last_t1, self.last_u1 = t1, u1
        wall = t1 - t0
        window_cpu = None if (u0 is None or u1 is None) else u1 - u0
        row = {"kind": kind, "wall_ns": wall, "cpu_ns": -1 if window_cpu is None else window_cpu,
               "quiet_wall_ns": -1, "quiet_cpu_ns": -1, "claimed_ns": -1, "correct": 0,
               "throttle": self.throttle.read(), "sm_clock_mhz": self.throttle.last_sm_mhz}
        self.rows.append(row)
        if header.get("id") != index or header["op"] not in ("result", "error"):
            self.flags.append(Flag("protocol_violation", index, "expected result %d, got op %r id %r"
                                   % (index, header["op"], header.get("id"))))
            return False
        if header["op"] == "error":
            self.flags.append(Flag("candidate_error", index, str(header.get("error", ""))[-1500:]))
            return False
        if len(arrays) != 1:
            self.flags.append(Flag("protocol_violation", index, "result carries %d arrays, expected 1" % len(arrays)))
            return False
        claimed = header.get("claimed_ns")
        if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
            row["claimed_ns"] = int(claimed)
        output = arrays[0][1]
        if not self.options.verify:  # overhead calibration with the trusted null candidate only
            return True
        sample_flags = checks.verify_output(output, expected, inputs, self.task, self.history, index)
        self.cpu_events.extend(checks.cpu_flags(index, wall, window_cpu, 0, None, self.ncpus, self.thresholds))
        row["correct"] = 0 if any(f.reason in ("incorrect_output", "wrong_output_shape", "non_finite_output",
                                               "constant_output", "identity_output") for f in sample_flags) else 1
        if kind == KIND_HIDDEN and not row["correct"]:
            sample_flags.append(Flag("hidden_shape_failed", index, "probe shape %s" % (expected.shape,)))
        if kind in (KIND_WARMUP, KIND_TIMED) and self.saved_repeat is None and row["correct"]:
            self.saved_repeat = (index, inputs, expected, np.array(output, copy=True))
        if kind == KIND_REPEAT and self.saved_repeat is not None:
            earlier = self.saved_repeat[3]
            if earlier.shape != output.shape or not np.allclose(earlier, output, rtol=self.task.rtol,
                                                                 atol=self.task.atol):
                sample_flags.append(Flag("nondeterministic_output", index,
                                         "differs from sample %d's output for the same input" % self.saved_repeat[0]))
        self.history.add(np.asarray(expected))
        self.flags.extend(sample_flags)
        if sample_flags:
            self.flagged_samples += 1
        return not any(f.reason in FATAL for f in sample_flags) and \
            self.flagged_samples < self.options.max_flagged_samples

    def finish(self):
        """Final quiet window after the last sample (work left running shows here)."""
        if self.last_t1 is None or not self.rows:
            return
        deadline = self.last_t1 + max(self.options.final_quiet_ns, self._quiet_target(self.rows[-1]["wall_ns"]))
        now = time.perf_counter_ns()
        if deadline > now:
            time.sleep((deadline - now) / 1e9)
        u2, t2 = self.account.read(), time.perf_counter_ns()
        quiet_cpu = None if (u2 is None or self.last_u1 is None) else u2 - self.last_u1
        self.rows[-1]["quiet_wall_ns"] = t2 - self.last_t1
        self.rows[-1]["quiet_cpu_ns"] = -1 if quiet_cpu is None else quiet_cpu
        final = checks.cpu_flags(len(self.rows) - 1, 0, None, t2 - self.last_t1, quiet_cpu, self.ncpus,
                                 self.thresholds)
        for flag in final:
            flag.detail += " (final quiet window)"
        self.flags.extend(final)

    def cpu_flags(self):
        """Aggregate the per-window CPU events: a reason is flagged when it occurred in at least
        max(3, 5%) of the windows (a runtime hiccup, such as the sentry's garbage collector, shows
        once; a background thread or child shows in nearly every window)."""
        out = []
        for reason in sorted({e.reason for e in self.cpu_events}):
            events = [e for e in self.cpu_events if e.reason == reason]
            if len(events) >= max(3, 0.05 * len(self.rows)):
                first = events[0]
                out.append(Flag(reason, first.sample, "%d of %d windows; first: %s"
                                % (len(events), len(self.rows), first.detail)))
        return out


def _schedule(rng, count, span, first=1, taken=()):
    """``count`` distinct secret positions in [first, span), none of them in ``taken``."""
    span = max(span, first + count + len(taken))
    free = np.array([p for p in range(first, span) if p not in taken])
    return set(int(x) for x in rng.choice(free, size=min(count, free.size), replace=False))


def _claim_flags(rows, overhead_ns):
    """timing_claim_mismatch: the candidate's median time claim above the harness's median
    window, or far below it beyond what the measured per-sample overhead (handshake and
    transfers, the null candidate's median) explains. Medians, so one delayed sample is no
    evidence."""
    pairs = [(r["claimed_ns"], r["wall_ns"]) for r in rows if r["kind"] == KIND_TIMED and r["claimed_ns"] >= 0]
    if len(pairs) < 3:
        return []
    claimed = float(np.median([p[0] for p in pairs]))
    wall = float(np.median([p[1] for p in pairs]))
    if claimed > wall + 500_000:
        return [Flag("timing_claim_mismatch", -1, "median claim %.3f ms exceeds the harness's median %.3f ms"
                     % (claimed / 1e6, wall / 1e6))]
    if overhead_ns is not None and wall - claimed - overhead_ns > 0.2 * wall + 1_000_000:
        return [Flag("timing_claim_mismatch", -1, "median claim %.3f ms; the harness measured %.3f ms with "
                     "%.3f ms overhead" % (claimed / 1e6, wall / 1e6, overhead_ns / 1e6))]
    return []


def _make_candidate(options, path, label):
    from slurmbox.measure import candidate_sandbox as cs
    cpus = options.sandbox_cpus if options.isolation else None
    if options.sandbox == "slurm":
        from slurmbox.measure.slurm_step import SlurmStepCandidate
        return SlurmStepCandidate(path, label, srun_args=options.srun_args)
    if options.sandbox == "bare":
        return cs.BareCandidate(path, label, cpus=cpus, uid=options.uid, gid=options.gid)
    return cs.SandboxedCandidate(path, label, cpus=cpus, platform=options.platform, uid=options.uid,
                                 gid=options.gid, gpus=options.gpus)


def file_sha256(path):
    """Hex SHA-256 of the file at ``path``."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def measure_candidate(task, reference, candidate_path, label, options, fingerprint=None, overhead_ns=None):
    """Measure one candidate file against ``task`` (task.Task) with ``reference`` (ReferenceProcess).

    Returns a CandidateResult. A candidate that cannot start is a result
    with the flag ``candidate_crashed`` (its log in ``stderr``), never an
    exception; harness-side failures (no runsc, bad CPUs, the task's own
    reference failing) raise.
    """
    started = time.monotonic()
    seed = options.seed if options.seed is not None else secrets.randbits(128)
    root = np.random.SeedSequence(seed)
    rng_inputs, rng_schedule, rng_shapes = (np.random.default_rng(s) for s in root.spawn(3))
    candidate = None
    try:
        candidate = _make_candidate(options, candidate_path, label)
        return _sample_candidate(task, reference, candidate, candidate_path, label, options, fingerprint,
                                 overhead_ns, seed, started, (rng_inputs, rng_schedule, rng_shapes))
    finally:
        # Idempotent; here so a SIGTERM (SystemExit) between any two statements below still
        # tears the sandbox down.
        if candidate is not None:
            candidate.stop()


def _sample_candidate(task, reference, candidate, candidate_path, label, options, fingerprint, overhead_ns,
                      seed, started, rngs):
    """measure_candidate once ``candidate`` exists (``rngs``: inputs, schedule and shapes
    generators); the caller always stops the candidate."""
    rng_inputs, rng_schedule, rng_shapes = rngs
    rule = options.rule
    flags, rows, stdout, stderr, converged = [], [], "", "", False
    throttle_histogram = {}
    config = {}
    try:
        candidate.start()
    except Exception as err:  # the candidate's failure to start is its verdict
        from slurmbox.measure.candidate_sandbox import SandboxStartError
        if not isinstance(err, SandboxStartError):
            raise
        flags.append(Flag("candidate_crashed", -1, str(err)[:4000]))
        stderr = str(err)
    else:
        config = dict(candidate.config)
        try:
            sampler = _Sampler(task, reference, candidate, options, rng_inputs, rng_schedule)
        except BaseException:
            candidate.stop()
            raise
        restore = None
        try:
            sampler.calibrate_idle()
            if options.isolation and options.harness_cpus:
                restore = isolation.pin_harness(options.harness_cpus, options.realtime)
            hidden = _schedule(rng_schedule, options.hidden_probes if task.hidden_shape else 0, rule.min_samples)
            # Repeats come after at least one answered sample, so there is an input to repeat.
            repeats = _schedule(rng_schedule, options.repeat_probes, rule.min_samples, first=2, taken=hidden)
            index = 0
            timed = []
            loop_start = time.monotonic()
            ok = True
            for _ in range(rule.warmup_samples):
                inputs = task.make_inputs(rng_inputs, task.timing_shape)
                ok = sampler.sample(index, KIND_WARMUP, inputs, reference.expected(inputs))
                index += 1
                if not ok:
                    break
            position = 0
            while ok:
                position += 1
                before = len(sampler.rows)
                if position in hidden:
                    inputs = task.make_inputs(rng_inputs, tuple(task.hidden_shape(rng_shapes)))
                    ok = sampler.sample(index, KIND_HIDDEN, inputs, reference.expected(inputs))
                elif position in repeats and sampler.saved_repeat is not None:
                    _, inputs, expected, _ = sampler.saved_repeat
                    ok = sampler.sample(index, KIND_REPEAT, {k: v.copy() for k, v in inputs.items()}, expected)
                else:
                    inputs = task.make_inputs(rng_inputs, task.timing_shape)
                    ok = sampler.sample(index, KIND_TIMED, inputs, reference.expected(inputs))
                    if len(sampler.rows) > before and not sampler.rows[-1]["throttle"]:
                        timed.append(sampler.rows[-1]["wall_ns"])
                index += 1
                stop, converged = rule.done(timed, time.monotonic() - loop_start)
                if stop:
                    break
            if ok:
                sampler.finish()
        finally:
            if restore is not None:
                restore()
            sampler.account.close()
            throttle_histogram = dict(sampler.throttle.histogram)
            sampler.throttle.close()
            flags = sampler.flags + sampler.cpu_flags()
            rows = sampler.rows
            leftovers = candidate.channel_leftovers()
            candidate.stop()
            stdout, stderr = candidate.stdout_text(), candidate.stderr_text()
        if leftovers:
            flags.append(Flag("unexpected_files", -1, "channel directory holds %s" % ", ".join(leftovers[:5])))
        forged = checks.forged_lines(stdout + "\n" + stderr)
        if forged:
            flags.append(Flag("forged_output_text", -1, " | ".join(forged)[:500]))
    # Slurm mode: srun's stdio relay costs too much, too unevenly, per sample to judge claims
    # below the harness's window; claims above it are still flagged.
    flags += _claim_flags(rows, overhead_ns if options.sandbox != "slurm" else None)
    kinds = np.array([r["kind"] for r in rows], dtype=np.int8)
    correct = np.array([r["correct"] for r in rows], dtype=np.int8)
    if correct.size and correct.any() and not correct.all() and not any(f.reason in FATAL for f in flags):
        flags.append(Flag("intermittent_incorrect", -1, "%d of %d samples correct" % (int(correct.sum()), correct.size)))
    samples = {key: np.array([r[key] for r in rows], dtype=np.int64)
               for key in ("wall_ns", "cpu_ns", "quiet_wall_ns", "quiet_cpu_ns", "claimed_ns", "throttle",
                           "sm_clock_mhz")}
    samples["kind"] = kinds
    samples["correct"] = correct
    clean = (kinds == KIND_TIMED) & (samples["throttle"] == 0) if rows else np.zeros(0, dtype=bool)
    timed_ns = samples["wall_ns"][clean] if rows else np.zeros(0)
    summary = stats.summarize(timed_ns)
    summary["throttled_discarded"] = int(((kinds == KIND_TIMED) & (samples["throttle"] != 0)).sum()) if rows else 0
    summary["throttle_histogram"] = throttle_histogram
    repeat_rows = samples["wall_ns"][kinds == KIND_REPEAT] if rows else np.zeros(0)
    # Faster than half the median AND than every fresh sample: one quick answer through a noisy
    # channel is not enough evidence, one quicker than all fresh inputs is.
    if repeat_rows.size and timed_ns.size >= 3 and repeat_rows.min() < 0.5 * summary["median_ns"] and \
            repeat_rows.min() < 0.8 * timed_ns.min():
        flags.append(Flag("repeat_input_faster", int(np.nonzero(kinds == KIND_REPEAT)[0][0]),
                          "repeat answered in %.3f ms, median of fresh inputs %.3f ms"
                          % (repeat_rows.min() / 1e6, summary["median_ns"] / 1e6)))
    if not rows and not flags:
        flags.append(Flag("candidate_crashed", -1, "no sample completed"))
    withheld = bool(flags) or summary.get("count", 0) == 0
    return CandidateResult(
        label=label, candidate_path=os.path.abspath(candidate_path), candidate_sha256=file_sha256(candidate_path),
        task_name=task.name, samples=samples, summary=summary, converged=bool(converged), flags=flags,
        verdict="rejected" if withheld else "accepted",
        reward_ns=None if withheld else summary["median_ns"], fingerprint=dict(fingerprint or {}),
        sandbox_config=config, stdout=stdout, stderr=stderr, overhead_ns=overhead_ns,
        seed_sha256=hashlib.sha256(str(seed).encode()).hexdigest(), wall_s=time.monotonic() - started)
