"""Slurm through its commands: ``scontrol``/``squeue``/``sinfo`` run as subprocesses.

Slurm 22.05's ``scontrol`` has no ``--json`` (``squeue``/``sinfo`` do, openapi
v0.0.38), and PyPI's pyslurm does not match Debian's Slurm, so records are read
from ``scontrol -o show ...`` one-line output: ``Key=Value`` pairs separated by
spaces, where a value may itself contain spaces (``Reason=Not responding``).
Format: scontrol(1), "show ENTITY ID" with ``-o``/``--oneliner``.

All functions honour ``SLURM_CONF`` from ``env`` (default: this process's
environment) and raise :class:`SlurmCommandError` when a command fails.
"""

import os
import re

from slurmbox.slurm_client.commands import SlurmCommandError, run_command, run_status  # noqa: F401 (re-exported)
from slurmbox.slurm_client.job_facts import read_job_facts

# A key starts a new field when preceded by a space: "Key=" where Key is word characters
# (Slurm also uses "/" and ":" in a few keys, e.g. "Socks/Node", "MinCPUsNode").
_FIELD_START = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_/:.]*)=")


def parse_oneliner(line):
    """``Key=Value ...`` text of one ``scontrol -o show`` record -> dict of str to str.

    Values keep inner spaces; a repeated key keeps its last value.
    """
    line = line.strip()
    matches = list(_FIELD_START.finditer(line))
    record = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end():end].strip()
    return record


def show(entity, ident=None, env=None, details=False):
    """Records of ``scontrol -o [-d] show ENTITY [ID]`` -> list of dicts (one per line)."""
    argv = ["scontrol", "-o"] + (["-d"] if details else []) + ["show", entity]
    if ident is not None:
        argv.append(str(ident))
    out = run_command(argv, env=env)
    return [parse_oneliner(line) for line in out.splitlines() if "=" in line]


def show_job(job_id, env=None, details=False):
    """The job record of ``job_id`` as a dict with ``scontrol show job`` key names, built from
    structured facts (slurmbox.slurm_client.job_facts: ``squeue --json``), never from scontrol's text,
    where a job name or comment can pose as any field. Keys: JobId, JobState, Partition, UserId,
    GroupId, NodeList (Slurm's hostlist), NumNodes, BatchHost, Restarts, Requeue, BatchFlag ("1"/"0"),
    PreemptTime ("None" or "set"). ``details`` is accepted for callers of the old interface and ignored.
    Raises SlurmCommandError when unknown."""

    facts = read_job_facts(job_id, env=env)
    return {"JobId": str(facts.job_id), "JobState": facts.state, "Partition": facts.partition,
            "UserId": str(facts.user_id), "GroupId": str(facts.group_id), "NodeList": facts.hostlist,
            "NumNodes": str(facts.node_count), "BatchHost": facts.batch_host, "Restarts": str(facts.restart_count),
            "Requeue": "1" if facts.requeue else "0", "BatchFlag": "1" if facts.batch else "0",
            "PreemptTime": "set" if facts.preempted else "None"}


def show_node(node, env=None):
    """The node record of ``node`` (dict)."""
    records = show("node", node, env=env)
    if not records:
        raise SlurmCommandError("scontrol show node %s returned no record" % node)
    return records[0]


def expand_hostlist(hostlist, env=None):
    """``n[1-3],x`` -> ["n1", "n2", "n3", "x"] through ``scontrol show hostnames``."""
    if not hostlist or hostlist == "(null)":
        return []
    return run_command(["scontrol", "show", "hostnames", hostlist], env=env).split()


def requeue(job_id, env=None, hold=False):
    """``scontrol requeue[hold] JOB``: put a running job back in the queue."""
    run_command(["scontrol", "requeuehold" if hold else "requeue", str(job_id)], env=env)


def drain_node(node, reason, env=None):
    """``scontrol update NodeName=NODE State=DRAIN Reason=...``; ``reason`` must be non-empty."""
    if not reason:
        raise ValueError("a drain needs a reason")
    run_command(["scontrol", "update", "NodeName=%s" % node, "State=DRAIN", "Reason=%s" % reason], env=env)


def running_jobs_on_node(node, env=None):
    """Ids (str) of jobs RUNNING on ``node`` (``squeue -h -w NODE -t R -o %A``)."""
    out = run_command(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A"], env=env)
    return [line.strip() for line in out.splitlines() if line.strip()]


def slurm_env(slurm_conf=None):
    """An environment for Slurm commands, with ``SLURM_CONF`` set when given."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


def show_partition(partition, env=None):
    """The partition record of ``partition`` (dict), e.g. ``GraceTime``, ``PreemptMode``."""
    records = show("partition", partition, env=env)
    if not records:
        raise SlurmCommandError("scontrol show partition %s returned no record" % partition)
    return records[0]


def release_begin_time(job_id, env=None):
    """``scontrol update JobId=JOB StartTime=now``: lift the begin-time hold Slurm puts on a requeued job."""
    run_command(["scontrol", "update", "JobId=%s" % job_id, "StartTime=now"], env=env)


def signal_step(job_id, step, signum, env=None):
    """``scancel --signal=NUM JOB.STEP``: deliver signal ``signum`` (int) to every task of a job step,
    on all of its nodes (scancel(1) ``-s``; without ``--full``/``--batch`` the batch shell is not signalled)."""
    run_command(["scancel", "--signal=%d" % int(signum), "%s.%s" % (job_id, step)], env=env)


def _pairs(text, fields):
    """Lines of ``fields`` space-separated words (list of tuples); other lines are skipped."""
    rows = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == fields:
            rows.append(tuple(words))
    return rows


def user_running_jobs(user, env=None):
    """``[(job id, node hostlist)]`` of ``user``'s RUNNING jobs (``squeue -h -u USER -t RUNNING -o "%A %N"``)."""
    return _pairs(run_command(["squeue", "-h", "-u", user, "-t", "RUNNING", "-o", "%A %N"], env=env), 2)


def user_steps(user, env=None):
    """``[(step id JOB.STEP, node hostlist)]`` of ``user``'s steps (``squeue -h -s -u USER -o "%i %N"``)."""
    return _pairs(run_command(["squeue", "-h", "-s", "-u", user, "-o", "%i %N"], env=env), 2)


def job_steps(job_id, env=None):
    """``[(step id, step name, node hostlist)]`` of job ``job_id`` (``squeue -h --steps -j JOB -o "%i|%j|%N"``;
    ``|``-separated because a step name may hold spaces)."""
    out = run_command(["squeue", "-h", "--steps", "-j", str(job_id), "-o", "%i|%j|%N"], env=env)
    return [tuple(p.strip() for p in line.split("|")) for line in out.splitlines() if line.count("|") == 2]


def all_job_ids(env=None):
    """Ids (set of str) of every job slurmctld still knows, in any state (``squeue -h -a -t all -o %A``)."""
    out = run_command(["squeue", "-h", "-a", "-t", "all", "-o", "%A"], env=env)
    return {line.strip() for line in out.splitlines() if line.strip()}


def idle_nodes(env=None):
    """Names (sorted list) of idle nodes (``sinfo -h -N -t idle -o %N``)."""
    return sorted(set(run_command(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env).split()))


def node_states(env=None):
    """``[(node, partition, state)]``, one per node and partition (``sinfo -h -N -o "%N %P %T"``)."""
    return _pairs(run_command(["sinfo", "-h", "-N", "-o", "%N %P %T"], env=env), 3)


def default_partition(env=None, timeout=15):
    """Name of the cluster's default partition (``scontrol -o show partition``, ``Default=YES``) or None.
    Raises SlurmCommandError."""
    for record in show("partition", env=env):
        if record.get("Default") == "YES" and record.get("PartitionName"):
            return record["PartitionName"]
    return None


def ping_text(env=None):
    """``(exit status, output)`` of ``scontrol ping`` (never raises: the status is the answer)."""
    return run_status(["scontrol", "ping"], env=env)


def slurmd_text(env=None):
    """``(exit status, output)`` of ``scontrol show slurmd`` (the local slurmd); never raises."""
    return run_status(["scontrol", "show", "slurmd"], env=env)
