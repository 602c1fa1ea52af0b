"""A campaign: one task, several candidates, one HDF5 record file. The Python API of
``slurmbox measure run``.

Example::

    from slurmbox.measure.campaign import run_campaign
    from slurmbox.measure.harness import MeasureOptions
    campaign = run_campaign("matmul_task.py", [("mine", "cand.py")], MeasureOptions(), out="c.h5")
    campaign.results[0].verdict, campaign.results[0].reward_ns
"""

import dataclasses
import os
from dataclasses import dataclass

from slurmbox.measure import fingerprint, harness, isolation, policy as site_policy, records, stats
from slurmbox.measure.reference import ReferenceProcess
from slurmbox.measure.task import load_task

NULL_CANDIDATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "null_candidate.py")


@dataclass
class Campaign:
    """Results of run_campaign: ``task`` (task.Task), ``results`` (list of CandidateResult),
    ``overhead`` (CandidateResult of the null candidate, or None), ``path`` of the record file."""

    task: object
    results: list
    overhead: object
    path: str


def exit_on_sigterm():
    """Make SIGTERM (scancel, kill) raise SystemExit in the main thread, so every sandbox,
    cgroup and staging directory is torn down by the harness's ``finally`` blocks."""
    import signal

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the teardown short
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def visible_in_sandbox(path, uid, gid):
    """True when the host file ``path`` could be read by ``uid`` inside a measurement sandbox:
    not under a directory the sandbox masks (sandbox.bundle.MASKED_HOST_DIRS) or under the
    Python environment bound into it, and readable by the mode bits along its path."""
    import sys

    from slurmbox.sandbox import bundle
    real = os.path.realpath(path)
    bound = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)} - {"/usr", "/"}
    if any(real.startswith(os.path.realpath(p) + "/") for p in bound):
        return True
    if any(real == d or real.startswith(d + "/") for d in bundle.MASKED_HOST_DIRS):
        return False
    return bundle.path_reachable(real, uid, [gid])


def changeable_by_others(path):
    """The first of ``path`` (symlinks resolved) and the directories above it that a user
    other than root may change, or None when there is none.

    Changeable: owned by a non-root user, or writable by a group other than root's or by
    others (a directory with the sticky bit, such as /tmp, only guards its entries). The
    root-run harness imports the task file, and its reference process imports it again, so
    such a file would run that user's code as root. Mode bits as in stat(2) and chmod(2).
    """
    import stat

    real = os.path.realpath(path)
    chain = [real]
    while chain[-1] != "/":
        chain.append(os.path.dirname(chain[-1]))
    for index, entry in enumerate(chain):
        info = os.stat(entry)
        guarded = index > 0 and info.st_mode & stat.S_ISVTX and info.st_uid == 0
        if info.st_uid != 0:
            return entry
        if not guarded and (info.st_mode & 0o002 or (info.st_mode & 0o020 and info.st_gid != 0)):
            return entry
    return None


def resolve_cpus(options, measurement_policy):
    """Fill ``options.harness_cpus``/``sandbox_cpus`` from the policy or the defaults; validate them.

    Returns a new MeasureOptions. Raises isolation.IsolationError when the CPUs overlap or do not exist.
    """
    default_harness, default_sandbox = site_policy.default_cpus()
    harness_cpus = options.harness_cpus or measurement_policy.get("harness_cpus") or default_harness
    sandbox_cpus = options.sandbox_cpus or measurement_policy.get("sandbox_cpus") or default_sandbox
    if options.isolation:
        isolation.validate_cpus(harness_cpus, "harness")
        isolation.validate_cpus(sandbox_cpus, "sandbox")
        if harness_cpus & sandbox_cpus and len(isolation.online_cpus()) > 1:
            raise isolation.IsolationError("harness CPUs %s and sandbox CPUs %s overlap; give them separate CPUs"
                                           % (isolation.format_cpu_list(harness_cpus),
                                              isolation.format_cpu_list(sandbox_cpus)))
    return dataclasses.replace(options, harness_cpus=set(harness_cpus), sandbox_cpus=set(sandbox_cpus))


def measure_overhead(task, reference, options, fp):
    """Measure the trusted null candidate (no work) at the task's timing shape: the harness's own
    per-sample cost (handshake, transfers, sandbox I/O). Returns its CandidateResult."""
    quick = dataclasses.replace(options, verify=False, hidden_probes=0, repeat_probes=0,
                                rule=stats.StoppingRule(min_samples=20, min_time=0.0, max_noise=0.02,
                                                        max_wall=min(5.0, options.rule.max_wall), warmup_samples=3))
    return harness.measure_candidate(task, reference, NULL_CANDIDATE, "null (harness overhead)", quick, fp)


def run_campaign(task_path, candidates, options=None, out=None, measurement_policy=None):
    """Measure every ``(label, candidate_path)`` in ``candidates`` against the task at ``task_path``.

    ``out``: HDF5 path to write (None: no file). ``measurement_policy``: a
    dict as from policy.load() (None: read the site's). Raises
    task.TaskError, isolation.IsolationError, candidate_sandbox.SandboxStartError
    (for the trusted null candidate: the sandbox itself does not work here) and
    OSError; a candidate's own failures are results, not exceptions.
    """
    options = options or harness.MeasureOptions()
    if os.geteuid() == 0:  # root imports the task: only a file no other user can change, by its resolved path
        task_path = os.path.realpath(task_path)
        changeable = changeable_by_others(task_path)
        if changeable is not None:
            raise ValueError("the task file %s runs as root here, but %s can be changed by a user other than root; "
                             "keep trusted task files in root-owned directories that only root can write"
                             % (task_path, changeable))
    # Slurm mode: the candidate's step runs as this user, so only the sandbox's masking hides the task.
    uid, gid = (options.uid, options.gid) if options.sandbox == "runsc" else (os.getuid(), os.getgid())
    if options.sandbox in ("runsc", "slurm") and visible_in_sandbox(task_path, uid, gid):
        raise ValueError("the task file %s would be readable inside the candidates' sandboxes (uid %d); move it "
                         "under a private directory such as /root, /home or /srv%s"
                         % (os.path.abspath(task_path), uid,
                            ", or make it unreadable to others" if options.sandbox == "runsc" else ""))
    task = load_task(task_path)
    labels = [label for label, _ in candidates]
    if len(set(records.group_name(label) for label in labels)) != len(labels):
        raise ValueError("candidate labels must be distinct: %s" % ", ".join(labels))
    measurement_policy = measurement_policy if measurement_policy is not None else site_policy.load()
    options = resolve_cpus(options, measurement_policy)
    fp = fingerprint.collect(options.harness_cpus, options.sandbox_cpus, options.isolation,
                             site_policy.to_json(measurement_policy))
    if options.gpu_indices and measurement_policy.get("exclusive_gpus", True):
        from slurmbox.measure import gpu
        busy = gpu.foreign_processes(list(options.gpu_indices))
        if busy:
            raise isolation.IsolationError(
                "the site measures on exclusive GPUs, but other processes use them: %s; wait for them or "
                "measure on other GPUs" % "; ".join("GPU %d: pids %s" % (i, p) for i, p in sorted(busy.items())))
    locked = None
    if measurement_policy.get("clock_policy") == "locked" and options.gpu_indices:
        from slurmbox.measure import gpu
        locked = gpu.lock_clocks(list(options.gpu_indices), int(measurement_policy.get("locked_sm_clock_mhz") or 0))
        fp["locked_sm_clock_mhz"] = locked
    try:
        return _measure_all(task, candidates, options, out, fp)
    finally:
        if locked:
            from slurmbox.measure import gpu
            gpu.reset_clocks(list(locked))


def _measure_all(task, candidates, options, out, fp):
    with ReferenceProcess(task.path, options.harness_cpus if options.isolation else None) as reference:
        overhead = None
        if options.calibrate:
            overhead = measure_overhead(task, reference, options, fp)
            if not overhead.summary.get("count"):
                from slurmbox.measure.candidate_sandbox import SandboxStartError
                raise SandboxStartError("the trusted null candidate could not be measured, so the sandbox does "
                                        "not work on this node: %s" % "; ".join(
                                            f.detail for f in overhead.flags)[:3000])
        overhead_ns = overhead.summary["median_ns"] if overhead else None
        results = [harness.measure_candidate(task, reference, path, label, options, fp, overhead_ns)
                   for label, path in candidates]
    if out:
        records.write_campaign(out, task, results, harness.file_sha256(task.path))
    return Campaign(task=task, results=results, overhead=overhead, path=out or "")
