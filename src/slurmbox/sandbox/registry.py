"""The sandboxes running on this machine: records, listing, inspection, kill.

Each sandboxed step has a runtime directory ``<runtime_dir>/<node>/<job>.<step>``
(created by the SPANK shim). When the step's sandbox starts, the supervisor
writes two copies of a record there (:func:`write_record`):

- ``sandbox.json``: root-owned, mode 0600; what root's tools trust.
- ``sandbox.owner.json``: owned by the job's user, mode 0400, so that user can
  see their own sandboxes (the node directory is 0711 and the step directory
  0710 root:<job gid>, so nobody else can list or read it). The owner could
  rewrite this copy, which is why root's view never reads it.

A record: ``{"id": "<job>.<step>", "job", "step", "node", "uid", "user",
"partition", "profile", "container", "created" (Unix seconds), "local_tasks",
"network", "platform", "image", "devices": [host paths], "mounts": [...],
"spec": OCI config without process.env, "cpu_accounting": the sandbox cgroup's CPU-time file
(sandbox/step_cgroup.accounting: ``{"cgroups_path", "version", "file", "dirs"}``) or null}``.
"""

import json
import os
import pwd
import time
from dataclasses import asdict, dataclass

from slurmbox.sandbox import cleanup, runsc, step_dirs

RECORD_NAME = "sandbox.json"
OWNER_RECORD_NAME = "sandbox.owner.json"
LOG_SUBDIR = "log"


class SandboxError(RuntimeError):
    """A sandbox id is unknown, or the caller may not see or act on it."""


def _spec_without_env(spec):
    process = dict(spec.get("process", {}))
    process.pop("env", None)  # may hold the user's secrets; `inspect` shows the sandbox, not the job
    return dict(spec, process=process)


def build_record(args, request, plan, spec, runsc_prefix):
    """The record of a sandbox that is about to start (dict, see module docstring).

    ``args``: the supervisor's parsed arguments; ``request``: options.SandboxRequest;
    ``plan``: devices.DevicePlan; ``spec``: the OCI config; ``runsc_prefix``: the runsc argv prefix.
    """
    try:
        user = pwd.getpwuid(args.uid).pw_name
    except KeyError:
        user = str(args.uid)
    platform = runsc_prefix[runsc_prefix.index("--platform") + 1] if "--platform" in runsc_prefix else ""
    return {
        "id": "%s.%s" % (args.job, args.step), "job": str(args.job), "step": str(args.step), "node": args.node,
        "uid": args.uid, "user": user, "partition": args.partition, "profile": request.profile,
        "container": cleanup.container_id_of(args.step_dir), "created": round(time.time(), 3),
        "local_tasks": args.local_tasks, "network": request.network, "platform": platform,
        "image": request.image or "/", "devices": [d.host_path for d in plan.devices],
        "device_env": dict(plan.env), "mounts": [m for m in spec.get("mounts", [])],
        "spec": _spec_without_env(spec), "cpu_accounting": _cpu_accounting(spec),
    }


def _cpu_accounting(spec):
    """sandbox/step_cgroup.accounting of the spec's cgroupsPath, resolved here (the supervisor: runsc's parent)."""
    from slurmbox.sandbox import step_cgroup

    try:
        return step_cgroup.accounting(spec.get("linux", {}).get("cgroupsPath"))
    except OSError:
        return None


def write_record(step_dir, record, uid):
    """Write ``record`` as ``sandbox.json`` (root, 0600) and ``sandbox.owner.json`` (``uid``, 0400).

    Each file is written under a temporary name and renamed, so readers never see half a record.
    """
    data = json.dumps(record, indent=2, sort_keys=True) + "\n"
    for name, owner, mode in ((RECORD_NAME, 0, 0o600), (OWNER_RECORD_NAME, uid, 0o400)):
        tmp = os.path.join(step_dir, "." + name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data.encode())
            os.fchown(fd, owner, -1)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(step_dir, name))


@dataclass
class SandboxEntry:
    """One sandbox as ``slurmbox sandbox ls`` shows it; ``age_s`` in seconds; ``uid`` -1 when not known yet.

    ``state``: runsc's container status (``running``, ``created``, ``stopped``)
    when root asks, ``starting`` before the sandbox has a record, ``ending``
    once its supervisor is gone, ``running`` for the owner's own steps (which
    Slurm reports as running).
    """

    id: str
    job: str
    step: str
    node: str
    user: str
    uid: int
    age_s: float
    state: str
    step_dir: str

    def to_json(self):
        """JSON-ready dict of this entry."""
        return asdict(self)


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _in_node_netns(step_dir, argv):
    """``argv`` run in the network namespace of the step's supervisor when it differs from ours.

    runsc reaches a sandbox through an abstract unix socket, which lives in the
    network namespace of the ``runsc run`` that created it (slurmd's). On a
    real node that is ours; on a machine running several dev-cluster nodes it
    is the node's namespace. Returns None when the supervisor is gone.
    """
    pid = cleanup.supervisor_pid(os.path.realpath(step_dir), step_dir)
    if pid is None:
        return None
    netns = "/proc/%d/ns/net" % pid
    try:
        if os.stat(netns).st_ino == os.stat("/proc/self/ns/net").st_ino:
            return argv
    except OSError:
        return None
    return ["nsenter", "--net=%s" % netns, "--"] + argv


def _runsc_argv(step_dir, *args):
    try:
        binary = runsc.find_runsc()
    except runsc.RunscError:
        return None
    state_root = os.path.join(os.path.dirname(step_dir), runsc.RUNSC_STATE_SUBDIR)
    return _in_node_netns(step_dir, [binary, "--root", state_root] + list(args))


def runsc_status(step_dir, container):
    """runsc's status of ``container`` of the step in ``step_dir`` (``running``...), or None (root only)."""
    argv = _runsc_argv(step_dir, "state", container)
    if argv is None:
        return None
    proc = runsc.call(argv)  # nsenter then runsc: pipes only (runsc re-owns the stdio it is given)
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout).get("status", "").lower() or None
    except ValueError:
        return None


def _entry(step_dir, node, as_root):
    parsed = step_dirs.parse(os.path.basename(step_dir))
    if parsed is None:
        return None
    name, job, step = parsed.step_id, parsed.job, parsed.step
    record = _read_json(os.path.join(step_dir, RECORD_NAME if as_root else OWNER_RECORD_NAME))
    try:
        info = os.stat(step_dir)
    except OSError:
        return None
    if record is None:
        uid, user, created = -1, "?", info.st_mtime  # root learns the owner from the socket below
        state = "starting"
    else:
        uid, user, created = record["uid"], record["user"], record["created"]
        state = (runsc_status(step_dir, record["container"]) or "ending") if as_root \
            else "running"
    if as_root and record is None:
        try:  # the socket is owned by the job's user (the shim chowns it)
            uid = os.stat(os.path.join(step_dir, "supervisor.sock")).st_uid
            user = pwd.getpwuid(uid).pw_name
        except (OSError, KeyError):
            pass
    return SandboxEntry(id=name, job=job, step=step, node=node, user=user, uid=uid,
                        age_s=round(max(0.0, time.time() - created), 1), state=state, step_dir=step_dir)


def _root_step_dirs(runtime_dir):
    try:
        nodes = sorted(os.listdir(runtime_dir))
    except OSError:
        return
    for node in nodes:
        node_dir = os.path.join(runtime_dir, node)
        if not os.path.isdir(node_dir) or node == LOG_SUBDIR:
            continue
        for entry in sorted(os.listdir(node_dir)):
            path = os.path.join(node_dir, entry)
            if step_dirs.is_incarnation_dir(entry) and os.path.isdir(path) and not os.path.islink(path):
                yield node, path


def _owner_step_dirs(runtime_dir, user, slurm_env):
    """Step directories of ``user``'s running jobs, found through Slurm (the user cannot list nodes)."""
    from slurmbox.slurm_client.scontrol import SlurmCommandError, expand_hostlist, user_running_jobs, user_steps

    candidates = set()
    try:
        for job, nodes in user_running_jobs(user, env=slurm_env):
            candidates.update((node, "%s.batch" % job) for node in expand_hostlist(nodes, env=slurm_env)[:1])
        for step_id, nodes in user_steps(user, env=slurm_env):
            candidates.update((node, step_id) for node in expand_hostlist(nodes, env=slurm_env))
    except SlurmCommandError as err:
        raise SandboxError("cannot list your jobs: %s" % err)
    for node, name in sorted(candidates):
        path = os.path.join(runtime_dir, node, name)
        if os.path.isfile(os.path.join(path, OWNER_RECORD_NAME)):
            yield node, path


def list_sandboxes(runtime_dir, uid=None, slurm_env=None):
    """Sandboxes under ``runtime_dir`` that the caller (``uid``, default: this process) may see.

    Root sees every node directory; any other user sees only the sandboxes of
    their own running jobs (found through ``squeue``). Returns a list of
    SandboxEntry sorted by node and id. Raises SandboxError when Slurm cannot be asked.
    """
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        found = (_entry(path, node, True) for node, path in _root_step_dirs(runtime_dir))
    else:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise SandboxError("uid %d has no user name (passwd/NSS); Slurm lists jobs by user name" % uid)
        found = (_entry(path, node, False) for node, path in _owner_step_dirs(runtime_dir, user, slurm_env))
    return [entry for entry in found if entry is not None and (uid == 0 or entry.uid == uid)]


def find(runtime_dir, sandbox_id, node=None, uid=None, slurm_env=None):
    """The sandboxes ``sandbox_id`` (``JOB.STEP``, optionally ``--node``) names -> list of SandboxEntry.

    A multi-node step has one sandbox per node; on a machine running several
    nodes (the dev cluster) the id can match several. Raises SandboxError when
    nothing the caller may see matches.
    """
    if "." not in sandbox_id or "/" in sandbox_id:
        raise SandboxError("sandbox ids look like JOB.STEP (e.g. 1234.0 or 1234.batch), not %r; "
                           "see `slurmbox sandbox ls`" % sandbox_id)
    matches = [entry for entry in list_sandboxes(runtime_dir, uid, slurm_env)
               if entry.id == sandbox_id and (node is None or entry.node == node)]
    if not matches:
        raise SandboxError("no sandbox %s%s that you may see; see `slurmbox sandbox ls`"
                           % (sandbox_id, " on node %s" % node if node else ""))
    return matches


def read_record(entry, as_root):
    """The record of ``entry`` (dict), from root's copy when ``as_root``; raises SandboxError if absent."""
    record = _read_json(os.path.join(entry.step_dir, RECORD_NAME if as_root else OWNER_RECORD_NAME))
    if record is None:
        raise SandboxError("sandbox %s on %s has not started yet (no record)" % (entry.id, entry.node))
    return record


def kill(entry, reason="killed by an administrator"):
    """Kill every process of ``entry``'s sandbox with SIGKILL (root only).

    The tasks end as if killed by SIGKILL, which the job sees as an ordinary
    failure; the supervisor then tears the sandbox down as after any task end.
    The kill is written to the step's slurmbox log. Raises SandboxError when
    runsc refuses (e.g. the sandbox already stopped).
    """
    if os.geteuid() != 0:
        raise SandboxError("only root may kill sandboxes; to end your own job use scancel")
    node_dir = os.path.dirname(entry.step_dir)
    argv = _runsc_argv(entry.step_dir, "kill", "--all", cleanup.container_id_of(os.path.realpath(entry.step_dir)),
                       "KILL")
    if argv is None:
        raise SandboxError("sandbox %s on %s is not running (its supervisor is gone)" % (entry.id, entry.node))
    proc = runsc.call(argv)  # nsenter then runsc: pipes only (runsc re-owns the stdio it is given)
    if proc.returncode != 0:
        raise SandboxError("runsc could not kill %s on %s: %s" % (entry.id, entry.node,
                                                                  proc.stderr.strip() or "no running sandbox"))
    log_dir = os.path.join(node_dir, LOG_SUBDIR)
    if os.path.isdir(log_dir):
        with open(os.path.join(log_dir, entry.id + ".log"), "a") as log:
            log.write("%s slurmbox sandbox kill: %s (by uid 0)\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), reason))
