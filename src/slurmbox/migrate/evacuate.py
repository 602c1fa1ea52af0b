"""Evacuate a node: checkpoint every sandboxed job step on it, requeue its jobs, drain it.

Used by ``slurmbox spot-watch`` (on a reclaim notice) and ``slurmbox migrate``
(maintenance). Runs as root on the node itself (or anywhere that sees the
node's slurmbox runtime directory): each step supervisor is asked over its
control socket (slurmbox.migrate.triggers) to checkpoint (or signal) its
sandbox and requeue the job; jobs still running on the node afterwards are
requeued with ``scontrol requeue``. The node is drained first, so requeued
jobs start elsewhere; a requeued job's begin-time hold is lifted
(slurmbox.migrate.release).
"""

import os
import threading
from dataclasses import asdict, dataclass, field

from slurmbox.migrate import triggers
from slurmbox.migrate.release import release_when_pending
from slurmbox.sandbox import step_dirs
from slurmbox.slurm_client import scontrol
from slurmbox.migrate.outcomes import Outcome



@dataclass
class StepOutcome:
    """What one step's supervisor answered: ``job``, ``step``, ``outcome``, ``message``, ``checkpoint``."""

    job: str
    step: str
    outcome: str
    message: str = ""
    checkpoint: str = None


@dataclass
class Evacuation:
    """Report of one node evacuation (JSON-ready through ``as_dict``)."""

    node: str
    reason: str
    drained: bool = False
    steps: list = field(default_factory=list)
    requeued: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def as_dict(self):
        data = asdict(self)
        data["steps"] = [asdict(s) for s in self.steps]
        return data


def local_steps(runtime_dir, node):
    """(job, step, step_dir) of every sandboxed step with a runtime directory on ``node``."""
    node_dir = os.path.join(runtime_dir, node)
    found = []
    for name in sorted(os.listdir(node_dir)) if os.path.isdir(node_dir) else []:
        parsed = step_dirs.parse(name)
        if parsed and parsed.incarnation and os.path.exists(os.path.join(node_dir, name, triggers.CONTROL_SOCKET)):
            found.append((parsed.job, parsed.step, os.path.join(node_dir, name)))
    return found


def evacuate_node(node, reason, runtime_dir, env=None, drain=True, requeue_all=True, release=True,
                  timeout=120.0):
    """Evacuate ``node`` (see module docstring); returns an Evacuation report.

    ``drain``: drain the node first with ``reason``; ``requeue_all``: also
    requeue jobs on the node that no supervisor requeued (non-sandboxed, or
    checkpoint mode none); ``release``: lift the begin-time hold of requeued
    jobs; ``timeout``: seconds each supervisor may take. Errors are collected
    in the report, never raised, so one bad job does not stop the rest.
    """
    report = Evacuation(node, reason)
    if drain:
        try:
            scontrol.drain_node(node, reason, env=env)
            report.drained = True
        except scontrol.SlurmCommandError as err:
            report.errors.append("drain: %s" % err)
    steps = local_steps(runtime_dir, node)
    answers = {}

    def ask(job, step, step_dir):
        answers[(job, step)] = triggers.request_checkpoint(step_dir, reason, timeout=timeout)

    threads = [threading.Thread(target=ask, args=s) for s in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    requeued = set()
    for job, step, _ in steps:
        answer = answers.get((job, step), {})
        report.steps.append(StepOutcome(job, step, answer.get("outcome", Outcome.FAILED), answer.get("message", ""),
                                        answer.get("checkpoint")))
        if answer.get("outcome") == Outcome.REQUEUED:
            requeued.add(job)
    if requeue_all:
        try:
            running = scontrol.running_jobs_on_node(node, env=env)
        except scontrol.SlurmCommandError as err:
            running = []
            report.errors.append("list jobs: %s" % err)
        for job in running:
            if job in requeued:
                continue
            try:
                scontrol.requeue(job, env=env)
                requeued.add(job)
            except scontrol.SlurmCommandError as err:
                report.errors.append("requeue %s: %s" % (job, err))
    report.requeued = sorted(requeued, key=lambda j: int(j) if j.isdigit() else 0)
    if release and (report.drained or not drain):  # never back onto the node it left (see release)
        waiters = [threading.Thread(target=release_when_pending, args=(job, env)) for job in report.requeued]
        for thread in waiters:
            thread.start()
        for thread in waiters:
            thread.join()
    return report


def node_needs_evacuation(node, env=None):
    """True when ``node`` is draining or in maintenance (``scontrol show node`` State has DRAIN or MAINT)."""
    state = scontrol.show_node(node, env=env).get("State", "")
    return any(flag in state.split("+") for flag in ("DRAIN", "DRAINING", "DRAINED", "MAINT")) or \
        "DRAIN" in state or "MAINT" in state
