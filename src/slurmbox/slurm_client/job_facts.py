"""Trusted facts about a job, read so that no user-set text can pose as another field.

Job name, comment, working directory, std paths and similar fields are the
user's text: they may hold ``Key=Value`` pairs, spaces, newlines and any
UTF-8. ``scontrol show job`` prints them before the fields security decisions
need (partition, GRES per node, restart count), so slurmbox never tokenises
its text. Sources, in order of preference:

- ``squeue --json -j ID`` (Slurm 22.05: openapi v0.0.38; also 23.x-26.x):
  one JSON object per job; ``gres_detail[i]`` is the GRES of the job's i-th
  allocated node (``job_resources.allocated_nodes[i].nodename`` on v0.0.38,
  ``job_resources.nodes.allocation[i].name`` from v0.0.40). Only Slurm
  formats the ``gres_detail`` strings (``gpu:TYPE:N(IDX:0-1)``; names and
  types come from the admin's gres.conf).
  Slurm 22.05's ``squeue --json`` ignores ``-j`` and lists every job, so the
  record is picked by its ``job_id`` field, never by position.
- single-field formats (``squeue -h -j ID -o "%A %P"``, used by the C shim).

Environment variables count as trusted only where slurmstepd sets them for
this step whatever the user passed (verified on Slurm 22.05):
``SLURM_STEP_GPUS`` is overwritten for a step with GPU gres and removed for a
step without; ``SLURM_JOB_GPUS`` keeps a user-set value in ``srun`` steps and
is never used.
"""

import json
import re
from dataclasses import dataclass, field

from slurmbox.slurm_client.commands import SlurmCommandError, run_command

_GRES_GPU = re.compile(r"^gpu(?::([A-Za-z0-9_.\-]+))?:(\d+)\(IDX:([0-9,\-]+)\)$")


@dataclass(frozen=True)
class JobFacts:
    """What slurmctld records about one job, from structured output only.

    ``job_id``: int; ``partition``: the partition it runs in; ``user_id``,
    ``group_id``: ints; ``state``: e.g. "RUNNING"; ``nodes``: allocated node
    names in Slurm's node order; ``gres_by_node``: node -> list of GRES detail
    strings of that node; ``restart_count``: requeues so far; ``preempted``:
    slurmctld set a preemption time; ``requeue``/``batch``: the job may be
    requeued / is a batch job; ``node_count``: allocated nodes; ``hostlist``: Slurm's compact
    node list (``n[1-2]``).
    """

    job_id: int
    partition: str
    user_id: int
    group_id: int
    state: str
    nodes: tuple = ()
    gres_by_node: dict = field(default_factory=dict)
    restart_count: int = 0
    preempted: bool = False
    requeue: bool = False
    batch: bool = False
    node_count: int = 0
    batch_host: str = ""
    hostlist: str = ""


def _node_names(job, env):
    resources = job.get("job_resources") or {}
    allocated = resources.get("allocated_nodes")
    if isinstance(allocated, list) and allocated:
        return [str(n.get("nodename", "")) for n in allocated]
    nodes = resources.get("nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("allocation"), list):
        return [str(n.get("name", "")) for n in nodes["allocation"]]
    hostlist = job.get("nodes") or ""
    if not hostlist:
        return []
    return run_command(["scontrol", "show", "hostnames", hostlist], env=env).split()


def _number(value):
    """openapi v0.0.38 gives plain numbers; v0.0.40+ gives {"set": bool, "number": N}."""
    if isinstance(value, dict):
        return int(value.get("number", 0)) if value.get("set", True) else 0
    return int(value or 0)


def _state(value):
    if isinstance(value, list):  # v0.0.40+: a list of flags, the base state first
        return str(value[0]) if value else ""
    return str(value or "")


def parse_squeue_json(text, job_id, env=None):
    """JobFacts of ``job_id`` from ``squeue --json`` output ``text``.

    Raises SlurmCommandError when the output is not JSON or holds no record
    of exactly that job (never a neighbour's record).
    """
    try:
        jobs = json.loads(text).get("jobs", [])
    except (ValueError, AttributeError) as err:
        raise SlurmCommandError("squeue --json gave no JSON for job %s: %s" % (job_id, err)) from err
    matches = [j for j in jobs if str(j.get("job_id")) == str(job_id)]
    if len(matches) != 1:
        raise SlurmCommandError("squeue --json -j %s returned %d records of that job" % (job_id, len(matches)))
    job = matches[0]
    nodes = _node_names(job, env)
    details = list(job.get("gres_detail") or [])
    gres_by_node = {}
    for index, node in enumerate(nodes):
        entry = details[index] if index < len(details) else ""
        gres_by_node[node] = [part for part in _split_gres(str(entry)) if part]
    return JobFacts(
        job_id=int(job["job_id"]), partition=str(job.get("partition") or ""),
        user_id=_number(job.get("user_id")), group_id=_number(job.get("group_id")),
        state=_state(job.get("job_state")), nodes=tuple(nodes), gres_by_node=gres_by_node,
        restart_count=_number(job.get("restart_cnt")), preempted=_number(job.get("preempt_time")) > 0,
        requeue=bool(job.get("requeue")), batch=bool(job.get("batch_flag")),
        node_count=_number(job.get("node_count")), batch_host=str(job.get("batch_host") or ""),
        hostlist=str(job.get("nodes") or ""))


def _split_gres(entry):
    """``gpu:h100:2(IDX:0-1),nic:1(IDX:0)`` -> its comma-separated items, commas inside ``(...)`` kept."""
    items, depth, current = [], 0, ""
    for char in entry:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return items


def read_job_facts(job_id, env=None):
    """JobFacts of ``job_id`` from slurmctld (``squeue --json -j ID``).

    Raises SlurmCommandError when slurmctld cannot be asked or knows no such job.
    """
    return parse_squeue_json(run_command(["squeue", "--json", "-j", str(job_id)], env=env), job_id, env)


def gpu_allocation(facts, node):
    """``(indices, types)`` of the GPUs slurmctld allocated to the job on ``node``: sorted list of int,
    sorted list of gres type names (empty for untyped ``gpu:N``). A node outside the job gives none."""
    indices, types = set(), set()
    for item in facts.gres_by_node.get(node, []):
        match = _GRES_GPU.match(item.strip())
        if not match:
            continue
        if match.group(1) and not match.group(1).isdigit():
            types.add(match.group(1))
        indices.update(_indices(match.group(3)))
    return sorted(indices), sorted(types)


#: More device indices than any node has; bounds what a record may name.
MAX_INDEX = 1024


def parse_index_list(text):
    """``"0-2,5"`` -> [0, 1, 2, 5] (Slurm's index-list syntax, as in ``IDX:`` and ``SLURM_STEP_GPUS``).

    Raises ValueError on anything else or indices >= MAX_INDEX.
    """
    indices = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        low, high = int(low), int(high or low)
        if not 0 <= low <= high < MAX_INDEX:
            raise ValueError("index range %r out of bounds" % part)
        indices.extend(range(low, high + 1))
    return indices


def _indices(text):
    """Index set of a ``gres_detail`` ``IDX:`` list; raises SlurmCommandError when out of bounds."""
    try:
        return set(parse_index_list(text))
    except ValueError as err:
        raise SlurmCommandError("GRES %s" % err) from err
