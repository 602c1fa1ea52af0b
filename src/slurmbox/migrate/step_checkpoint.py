"""Checkpoints of ``srun`` steps: which sandbox a checkpoint belongs to, and when to requeue.

A batch step has one sandbox, stored under the step name ``batch``. An
``srun --sandbox`` step has one sandbox per node; each is checkpointed and
restored on its own, stored under ``<step>.node<rank>`` (e.g. ``0.node1``),
where rank is the node's index within the step (``SLURM_NODEID``, which
slurmstepd sets relative to the step's node list; environ(7) of the task,
srun(1) "OUTPUT ENVIRONMENT VARIABLES"). After a requeue Slurm may pick other
nodes, so the node *name* never identifies a checkpoint; the batch script runs
again from the top and launches the same step id again, and rank N of that
step restores the checkpoint of rank N. The sandboxes of a step run with no
shared state across nodes (network mode ``none`` by default), so restoring
them independently is consistent as long as every rank was saved by the same
evacuation: a preemption reaches every rank, a spot notice or maintenance
reaches one node and its rank asks the others (``request_peers``), and the
rank that requeues the job first waits for every rank's checkpoint
(``wait_for_peers``). In ``signal`` mode the ranks asked signal their own
programs, report when they have exited (``PEER_DONE``), and the rank that
asked requeues once all have.

A checkpoint also records ``command_sha256``: the step's argv and shape
(nodes, tasks). A step whose command line differs (the script took another
branch after the requeue) does not restore it and starts fresh.

Only steps with one task per node (the sandbox's init is the task) can be
checkpointed; several tasks per node join a holder init with ``runsc exec``,
which runsc cannot restore as such. Standard library only (step start path).
"""

import hashlib
import json
import os
import signal
import time
from slurmbox.migrate.outcomes import Outcome

#: Step-shape variables in the task environment that a checkpoint must match (srun(1)).
SHAPE_VARIABLES = ("SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS")
#: Seconds a preempted rank waits for the other ranks' checkpoints before requeueing anyway.
PEER_WAIT_S = 20.0
#: Seconds the rank of an evacuated node waits, in signal mode, for the other ranks' programs to save their
#: state and exit (as long as slurmbox.migrate.sandbox_task waits for its own program).
PEER_SIGNAL_WAIT_S = 60.0
#: Seconds between looks at the store while waiting for the other ranks.
PEER_POLL_S = 0.2


class StepIdentityError(ValueError):
    """The task environment does not say which rank of the step this node is."""


def step_key(step, rank):
    """Store step name of rank ``rank`` (int) of step ``step`` (str): ``"0.node1"``; ``"batch"`` stays."""
    return "batch" if step == "batch" else "%s.node%d" % (step, int(rank))


def parse_key(key):
    """(step, rank or None) of a store step name made by ``step_key``: ``"0.node1"`` -> ("0", 1)."""
    head, dot, tail = str(key).rpartition(".node")
    if dot and head and tail.isdigit():
        return head, int(tail)
    return str(key), None


def node_rank(task_env):
    """This node's rank within the step (int, 0-based) from ``SLURM_NODEID``.

    Raises StepIdentityError when it is missing or not an index below
    ``SLURM_STEP_NUM_NODES``.
    """
    text = str(task_env.get("SLURM_NODEID", ""))
    nodes = str(task_env.get("SLURM_STEP_NUM_NODES", "") or task_env.get("SLURM_NNODES", ""))
    if not text.isdigit():
        raise StepIdentityError("SLURM_NODEID=%r is not a node index" % text)
    if nodes.isdigit() and int(text) >= int(nodes):
        raise StepIdentityError("SLURM_NODEID=%s is not below the step's %s nodes" % (text, nodes))
    return int(text)


def step_nodes(task_env):
    """Number of nodes of the step (int, at least 1) from ``SLURM_STEP_NUM_NODES``."""
    text = str(task_env.get("SLURM_STEP_NUM_NODES", "") or task_env.get("SLURM_NNODES", ""))
    return int(text) if text.isdigit() and int(text) > 0 else 1


def restart_count(task_env):
    """``SLURM_RESTART_COUNT`` of this run (int; 0 when unset: never requeued)."""
    text = str(task_env.get("SLURM_RESTART_COUNT", ""))
    return int(text) if text.isdigit() else 0


def command_sha256(argv, task_env):
    """sha256 (hex) of the step's command line ``argv`` (list of str, as the user gave it) and shape.

    Two runs of "the same step" (same script line after a requeue) give the
    same digest; another program, other arguments, or another number of
    nodes or tasks give another.
    """
    shape = {name: str(task_env.get(name, "")) for name in SHAPE_VARIABLES}
    data = json.dumps({"argv": [str(a) for a in argv], "shape": shape}, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def manifest_fields(step, rank, nodes, digest, restarts):
    """Manifest entries of an srun step's checkpoint (dict): ``slurm_step``, ``node_rank``,
    ``step_nodes``, ``command_sha256``, ``restart_count`` (the run that took it)."""
    return {"slurm_step": str(step), "node_rank": int(rank), "step_nodes": int(nodes), "command_sha256": digest,
            "restart_count": int(restarts)}


def peers_saved(store, job, step, nodes, restarts, digest, evacuation_id=None):
    """Ranks (set of int) of ``step`` whose newest checkpoint was taken by this evacuation.

    A rank counts when its newest published checkpoint has this run's
    ``restart_count``, the same ``command_sha256`` and: with
    ``evacuation_id`` (a spot notice or maintenance that one rank passed on,
    request_peers), that ``evacuation_id``; without, reason ``preemption``
    (Slurm preempts a job once per run). With ``evacuation_id`` a rank also
    counts when it reported that evacuation done (``PEER_DONE``: in signal
    mode its program saved its own state and exited; no checkpoint of ours).
    """
    done = set()
    for rank in range(nodes):
        if evacuation_id and _reported_done(store, job, step_key(step, rank), evacuation_id):
            done.add(rank)
            continue
        try:
            found = store.checkpoints(job, step_key(step, rank))
        except OSError:
            continue
        manifest = (found[0].manifest or {}) if found else {}
        same = (manifest.get("evacuation_id") == evacuation_id if evacuation_id
                else manifest.get("reason") == "preemption")
        if same and manifest.get("restart_count") == restarts and manifest.get("command_sha256") == digest:
            done.add(rank)
    return done


def wait_for_peers(store, job, step, nodes, restarts, digest, timeout=PEER_WAIT_S, clock=time.monotonic,
                   sleep=time.sleep, evacuation_id=None):
    """Wait until every rank of an evacuated step has published its checkpoint; returns the missing ranks.

    Requeueing the job ends every step at once, so the first rank to finish
    must not requeue while others are still writing. Each rank waits here
    after publishing its own checkpoint; whichever sees all ranks saved
    requeues (the others' requeue is then refused, which the caller treats as
    "requeued by Slurm"). After ``timeout`` seconds the job is requeued anyway
    (a rank that could not checkpoint must not hold the job past GraceTime);
    the missing ranks (sorted list of int) are returned for the log.
    ``evacuation_id``: see peers_saved.
    """
    deadline = clock() + timeout
    while True:
        missing = sorted(set(range(nodes)) - peers_saved(store, job, step, nodes, restarts, digest, evacuation_id))
        if not missing or clock() >= deadline:
            return missing
        sleep(PEER_POLL_S)


def srun_step_settings(settings, step, local_tasks, task_env, argv, terminal):
    """Checkpoint settings of an ``srun`` step's sandbox on this node.

    ``settings``: the resolved slurmbox.migrate.policy.CheckpointSettings;
    ``step``: the Slurm step id (str); ``local_tasks``: tasks of the step on
    this node; ``task_env``: the task's environment (dict); ``argv``: the
    task's command line as the user gave it; ``terminal``: ``srun --pty``.
    Returns (settings, store step name, manifest entries, note): mode "none"
    (and a note for the slurmbox log) for a step that cannot be checkpointed
    when the mode came from a site default. Raises
    policy.CheckpointOptionError when the user asked for checkpoints
    (``--sandbox-checkpoint``) of such a step, naming what to change.
    """
    from slurmbox.migrate.policy import CheckpointOptionError, CheckpointSettings

    if settings.mode == "none":
        return settings, step, {}, None
    if task_env.get("SLURMBOX_STEP_BROKER"):
        # Launched from a sandboxed batch script: the batch step's checkpoint is the job's checkpoint (an
        # option given there is inherited by every srun), so this step is never refused.
        return CheckpointSettings(), step, {}, ("step %s was started from a sandboxed batch script: only the "
                                                "batch step is checkpointed" % step)
    problem = None
    if local_tasks != 1:
        problem = ("step %s runs %d tasks on this node; checkpoints need one task per node (srun "
                   "--ntasks-per-node=1, one sandbox per node)" % (step, local_tasks))
    elif terminal:
        problem = "step %s has a terminal (srun --pty), which runsc cannot checkpoint" % step
    else:
        try:
            rank = node_rank(task_env)
        except StepIdentityError as err:
            problem = "cannot tell this node's rank in step %s: %s" % (step, err)
    if problem is not None:
        if settings.explicit:
            raise CheckpointOptionError("checkpoint", settings.mode, "%s; use --sandbox-checkpoint=none or change "
                                        "the step" % problem)
        return CheckpointSettings(), step, {}, "no checkpoints (site default %s): %s" % (settings.mode, problem)
    nodes = step_nodes(task_env)
    fields = manifest_fields(step, rank, nodes, command_sha256(argv, task_env), restart_count(task_env))
    return settings, step_key(step, rank), fields, None


#: File in a rank's store directory by which another rank asks it to checkpoint (root only, JSON).
PEER_REQUEST = ".evacuate.json"
#: File in a rank's store directory saying it finished the evacuation a peer asked for (root only, JSON).
PEER_DONE = ".evacuated.json"


def _reported_done(store, job, key, evacuation_id):
    try:
        with open(os.path.join(store.step_dir(job, key), PEER_DONE)) as handle:
            return json.load(handle).get("evacuation_id") == evacuation_id
    except (OSError, ValueError, AttributeError):
        return False


def job_allows_requeue(record):
    """Whether Slurm will requeue the job of ``record`` (``scontrol show job`` dict): a batch job
    (``BatchFlag=1``; scontrol requeue refuses others, ESLURM_BATCH_ONLY) with ``Requeue=1``."""
    return record.get("BatchFlag") == "1" and record.get("Requeue") == "1"


def _trusted_nodes(fields, record):
    """The step's node count, at most the job's ``NumNodes``: the task environment it came from is the user's."""
    nodes = int(fields.get("step_nodes", 1))
    allocated = str(record.get("NumNodes", "")).split("-")[0]
    return min(nodes, int(allocated)) if allocated.isdigit() else 1


def request_peers(sup, evacuation, err_fd):
    """Ask the other ranks of this multi-node srun step to checkpoint too, at the start of an evacuation.

    A spot notice or maintenance (``slurmbox spot-watch``/``migrate``)
    reaches only the supervisors of one node, but requeueing the job ends
    every rank: without this the other ranks would be killed and restart
    from an older checkpoint. For each other rank a request (reason, a new
    ``evacuation_id``, this run's ``restart_count`` and ``command_sha256``)
    is written into its directory in the shared store (``PEER_REQUEST``),
    then every task of the step gets SIGTERM (``scancel --signal``): each
    rank's supervisor takes the request (take_peer_request) and checkpoints
    with that id in its manifest. Sets ``evacuation.evacuation_id`` and
    ``evacuation.peer_nodes`` (the step's node count, capped by the job's).
    Returns the number of ranks asked: 0 for a batch step, a one-node step,
    a preemption (which reaches every rank already), a periodic checkpoint,
    or a job Slurm would not requeue (job_allows_requeue: the other ranks
    would be stopped for nothing). Problems are reported on ``err_fd`` (the
    job's stderr), never raised: the evacuation of this rank goes on.
    """
    from slurmbox.slurm_client import scontrol

    fields = sup.step_manifest
    if not fields or fields.get("step_nodes", 1) <= 1 or evacuation.reason in ("preemption", "periodic") \
            or evacuation.from_peer:
        return 0
    step, rank = fields["slurm_step"], fields["node_rank"]
    try:
        record = scontrol.show_job(sup.args.job, env=sup._slurm_env())
        if not job_allows_requeue(record):
            sup.say(err_fd, "%s: job %s cannot be requeued (not a batch job, or --no-requeue): the other ranks of "
                    "step %s are not asked to checkpoint" % (evacuation.reason, sup.args.job, step))
            return 0
        nodes = _trusted_nodes(fields, record)
        evacuation.evacuation_id, evacuation.peer_nodes = os.urandom(8).hex(), nodes
        request = {"reason": evacuation.reason, "evacuation_id": evacuation.evacuation_id,
                   "restart_count": fields["restart_count"], "command_sha256": fields["command_sha256"],
                   "from_rank": rank}
        store = sup.store()
        for peer in range(nodes):
            if peer != rank:
                store.write_private(sup.args.job, step_key(step, peer), PEER_REQUEST, json.dumps(request).encode(),
                                    sup.args.uid)
        scontrol.signal_step(sup.args.job, step, signal.SIGTERM, env=sup._slurm_env())
    except Exception as err:  # CheckpointError, OSError, SlurmCommandError: this rank still checkpoints
        sup.say(err_fd, "%s: cannot ask the other ranks of step %s to checkpoint (%s); they restart from an older "
                "checkpoint or from the beginning" % (evacuation.reason, step, err))
        return 0
    sup.say(err_fd, "%s: asked the other %d rank(s) of step %s to checkpoint too" % (evacuation.reason, nodes - 1,
                                                                                    step))
    return nodes - 1


def take_peer_request(store, job, key, restarts, digest):
    """Take (read and remove) another rank's request that rank ``key`` (store step name) of this run
    checkpoint (request_peers). Returns the request (dict with ``reason`` and ``evacuation_id``), or
    None: no request, or one of another run or command line (removed too: it can never apply)."""
    directory = store.step_dir(job, key)
    path = os.path.join(directory, PEER_REQUEST)
    try:
        # The request was written by another node just before its SIGTERM. On NFS, a lookup of a name this
        # client last saw missing can be answered from its cached negative entry (nfs(5), lookupcache=all,
        # the default); opening and reading the directory revalidates it (close-to-open coherence), so the
        # directory is listed before the file is opened.
        if PEER_REQUEST not in os.listdir(directory):
            return None
        with open(path) as handle:
            request = json.load(handle)
    except (OSError, ValueError):
        return None
    try:
        os.unlink(path)  # acted on once: a later SIGTERM of this run (scancel, time limit) is not a request
    except OSError:
        pass
    if (not isinstance(request, dict) or request.get("restart_count") != restarts
            or request.get("command_sha256") != digest or not request.get("reason")
            or not request.get("evacuation_id")):
        return None
    return request


def before_requeue(sup, evacuation, ckpt, err_fd):
    """Called by an evacuation about to ``scontrol requeue`` the job; True to go ahead.

    ``sup``: the step's supervisor (its ``step_manifest`` describes an srun
    step); ``evacuation``: migrate.sandbox_task.Evacuation; ``ckpt``: this
    rank's new Checkpoint or None. Batch steps, one-node steps and other
    reasons than preemption requeue at once. A preempted multi-node step whose
    checkpoint was published waits for the other ranks' checkpoints
    (``wait_for_peers``) first. Without a checkpoint of its own (signal mode,
    or the checkpoint failed) a preempted rank does not requeue: that would
    end the other ranks mid-checkpoint; the evacuation is decided as
    "requeued" and Slurm requeues the job when GraceTime ends
    (PreemptMode=REQUEUE). Of a spot or maintenance evacuation, the rank on
    the evacuated node waits for the ranks it asked (request_peers), with or
    without a checkpoint of its own, and requeues; the ranks it asked only
    checkpoint.
    """
    fields = sup.step_manifest
    if not fields or fields.get("step_nodes", 1) <= 1 or evacuation.reason == "periodic":
        return True
    step = fields["slurm_step"]
    if evacuation.from_peer:
        _report_done(sup, evacuation, fields, err_fd)  # the rank that asked waits for this (peers_saved)
        evacuation.finish(Outcome.REQUEUED, "%s: rank %d of step %s %s at another rank's request; that rank requeues job "
                          "%s" % (evacuation.reason, fields["node_rank"], step,
                                  "saved its state" if evacuation.signalled else "checkpointed", sup.args.job))
        sup.say(err_fd, evacuation.message)
        return False
    if evacuation.reason != "preemption":
        if evacuation.peers_asked:
            if evacuation.signalled:
                _report_done(sup, evacuation, fields, err_fd)  # its own rank counts too: no checkpoint of ours
            _wait_and_report(sup, evacuation, fields, evacuation.peer_nodes, err_fd,
                             PEER_SIGNAL_WAIT_S if evacuation.signalled else PEER_WAIT_S)
        return True
    if ckpt is None:
        evacuation.finish(Outcome.REQUEUED, "rank %d of step %s has stopped; Slurm requeues job %s when its GraceTime "
                          "ends" % (fields["node_rank"], step, sup.args.job))
        sup.say(err_fd, evacuation.message)
        return False
    _wait_and_report(sup, evacuation, fields, _preempted_nodes(sup, fields), err_fd)
    return True


def _report_done(sup, evacuation, fields, err_fd):
    """Write this rank's PEER_DONE for ``evacuation`` (its program saved its state, or it checkpointed)."""
    try:
        sup.store().write_private(sup.args.job, step_key(fields["slurm_step"], fields["node_rank"]), PEER_DONE,
                                  json.dumps({"evacuation_id": evacuation.evacuation_id}).encode(), sup.args.uid)
    except Exception as err:  # the rank that asked then waits its full timeout
        sup.say(err_fd, "cannot report the end of this rank's evacuation: %s" % err)


def _preempted_nodes(sup, fields):
    from slurmbox.slurm_client import scontrol

    try:
        return _trusted_nodes(fields, scontrol.show_job(sup.args.job, env=sup._slurm_env()))
    except Exception:  # slurmctld unreachable: the step's own count (waiting is bounded by PEER_WAIT_S)
        return int(fields.get("step_nodes", 1))


def _wait_and_report(sup, evacuation, fields, nodes, err_fd, timeout=PEER_WAIT_S):
    step = fields["slurm_step"]
    missing = wait_for_peers(sup.store(), sup.args.job, step, nodes, fields["restart_count"],
                             fields["command_sha256"], timeout=timeout, evacuation_id=evacuation.evacuation_id)
    if missing:
        sup.say(err_fd, "%s: ranks %s of step %s %s within %.0f s; requeueing job %s anyway (they restart from "
                "an older checkpoint or from the beginning)"
                % (evacuation.reason, ",".join(map(str, missing)), step,
                   "did not report their state saved" if evacuation.signalled else "published no checkpoint",
                   timeout, sup.args.job))


#: Seconds an srun step whose job was requeued keeps its task (srun) waiting for Slurm to end it.
HOLD_AFTER_REQUEUE_S = 300.0


def hold_until_ended(task, timeout=HOLD_AFTER_REQUEUE_S, sleep=time.sleep, clock=time.monotonic):
    """Keep a requeued srun step's task from reporting until Slurm ends it (its launcher is killed).

    If the step reported its end at once, ``srun`` would return to the batch
    script, which would go on to its next command before Slurm's requeue
    reaches it. ``task``: migrate.sandbox_task.CheckpointableTask (``gone``
    is set when the launcher disconnects). Returns True when the launcher went
    away, False after ``timeout`` seconds.
    """
    deadline = clock() + timeout
    while not task.gone:
        if clock() >= deadline:
            return False
        sleep(0.2)
    return True
