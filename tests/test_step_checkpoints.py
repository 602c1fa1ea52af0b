"""Checkpoints of `srun --sandbox` steps launched from an ordinary (not sandboxed) batch script.

The common pattern on spot partitions: the batch script is plain shell and its
work runs in `srun --sandbox` steps. On preemption each node's sandbox of the
running step is checkpointed; after the requeue the script runs again from the
top, launches the same step, and each node's sandbox is restored from the
checkpoint of the same step id and node rank (slurmbox.migrate.step_checkpoint),
so a counter kept only in memory continues exactly where it stopped.
"""

import json
import os
import random
import re
import subprocess

import pytest

from test_migrate_preemption import (assert_exact_sequence, job_record, lines, preempt, running_node, submit,
                                     wait_done)

from slurmbox.migrate import step_checkpoint
from slurmbox.migrate.restore import select_checkpoint
from slurmbox.migrate.store import CheckpointError, CheckpointStore

COUNT = 400
COUNTER = 'i=0; while [ "$i" -lt %d ]; do i=$((i+1)); echo "%s$i"; sleep 0.05; done'


def step_script(path, body, sbatch="-p spot -N1 -n1"):
    """A plain (not sandboxed) batch script on the spot partition whose work is ``body``."""
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH %s --requeue --open-mode=append\nset -e\n%s\n" % (sbatch, body))
    os.chmod(path, 0o755)
    return path


def srun_counter(count=COUNT, prefix="", srun_args=""):
    return "srun %s--sandbox /bin/sh -c '%s'" % (srun_args, COUNTER % (count, prefix))


def store_dir(cluster, job, *parts):
    return os.path.join(cluster.dev.dir, "checkpoints", job, *parts)


def _slurmbox(cluster, *args):
    return subprocess.run(["/opt/slurmbox/venv/bin/slurmbox"] + list(args), capture_output=True, text=True,
                          env=cluster.env(), timeout=120)


def _leftovers(cluster, job):
    cluster.wait_for(lambda: not cluster.sandbox_processes(job), timeout=30, what="sandboxes of the job to end")


@pytest.mark.parametrize("seed", [3, 4])
def test_preempted_srun_step_restores_and_counts_exactly_once(cluster, workdir, seed):
    moment = random.Random(seed * 104729).randint(20, 200)  # lines printed before the preemption
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), srun_counter()))
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= moment, timeout=120, what="%d lines" % moment)
    preempt(cluster, workdir, node)
    record = wait_done(cluster, job, out, count=COUNT)
    errors = open(err).read()
    assert_exact_sequence(out, COUNT)
    assert int(record.get("Restarts", "0")) >= 1, record
    assert re.search(r"preemption: checkpointed job %s as \S+/0\.node0/ckpt-000001" % job, errors), errors
    assert "restoring job %s step 0.node0 from checkpoint ckpt-000001" % job in errors, errors
    # The step finished on its own: its checkpoints are history.
    assert not os.path.exists(store_dir(cluster, job, "0.node0", "ckpt-000001"))
    _leftovers(cluster, job)


def test_migrate_moves_an_srun_step_to_the_other_node(cluster, workdir):
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), srun_counter(count=300)))
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 40, timeout=120, what="40 lines")
    try:
        result = _slurmbox(cluster, "migrate", "--node", node, "--reason", "kernel update", "--runtime-dir",
                           cluster.runtime_dir, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert [(s["job"], s["step"], s["outcome"]) for s in report["steps"]] == [(job, "0", "requeued")], report
        other = cluster.wait_for(lambda: running_node(cluster, job), timeout=120, what="job to run again")
        assert other != node
        wait_done(cluster, job, out, count=300)
    finally:
        cluster.run(["scontrol", "update", "NodeName=%s" % node, "State=RESUME"], user="root")
    assert_exact_sequence(out, 300)
    errors = open(err).read()
    assert re.search(r"checkpointed job %s as \S+/0\.node0/ckpt-000001" % job, errors), errors
    assert "restoring job %s step 0.node0 from checkpoint ckpt-000001 (taken on %s" % (job, node) in errors, errors
    _leftovers(cluster, job)


def test_a_different_command_line_after_requeue_starts_fresh(cluster, workdir):
    # Step 0 is the counter on the first run and another program after the requeue: the counter's
    # checkpoint must not be restored into it.
    body = ('if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then srun --sandbox /bin/echo other-program; '
            'else %s; fi' % srun_counter())
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body))
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 20, timeout=120, what="20 lines")
    preempt(cluster, workdir, node)

    def finished():
        return job_record(cluster, job).get("JobState") == "COMPLETED" and "other-program" in lines(out)
    cluster.wait_for(finished, timeout=240, what=lambda: "job %s to complete: %s"
                     % (job, job_record(cluster, job).get("JobState")))
    errors = open(err).read()
    assert re.search(r"preemption: checkpointed job %s as \S+/0\.node0/ckpt-000001" % job, errors), errors
    assert re.search(r"checkpoint\(s\) ckpt-000001 of job %s step 0\.node0 were taken of a different command "
                     r"line" % job, errors), errors
    assert "restoring job" not in errors
    seen = lines(out)
    assert seen[-1] == "other-program" and seen[:-1] == [str(i) for i in range(1, len(seen))], seen[-5:]
    _leftovers(cluster, job)


def test_periodic_step_checkpoints_are_listed_and_verified(cluster, workdir):
    # A checkpoint every 6 s (0.1 minutes, environment fallback of --sandbox-checkpoint-interval).
    body = "export SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL=0.1\n" + srun_counter(count=250)
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body, "-p ondemand"))
    cluster.wait_for(lambda: os.path.isdir(store_dir(cluster, job, "0.node0"))
                     and any(n.startswith("ckpt-") for n in os.listdir(store_dir(cluster, job, "0.node0"))),
                     timeout=120, what="a periodic checkpoint of step 0")
    listed = _slurmbox(cluster, "checkpoint", "ls", job, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    rows = rows if isinstance(rows, list) else rows.get("checkpoints", rows)
    assert any(r["job"] == job and r["step"] == "0.node0" and r["reason"] == "periodic" for r in rows), rows
    verified = _slurmbox(cluster, "checkpoint", "verify", job)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "0.node0" in verified.stdout
    wait_done(cluster, job, out, count=250)
    # Pauses for periodic checkpoints lose and repeat nothing.
    assert_exact_sequence(out, 250)
    _leftovers(cluster, job)


def test_rank_is_the_nodes_index_in_the_step_not_in_the_job(cluster, workdir):
    # The step runs on the job's second node only (srun -r1): it is rank 0 of its step.
    body = ("export SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL=0.1\n"
            + srun_counter(count=200, prefix="$SLURM_NODEID:", srun_args="-N1 -n1 -r1 "))
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body,
                                                         "-p ondemand -N2 -n2"))
    rank0 = store_dir(cluster, job, "0.node0")
    cluster.wait_for(lambda: os.path.isdir(rank0) and any(n.startswith("ckpt-") for n in os.listdir(rank0)),
                     timeout=120, what=lambda: "a periodic checkpoint of step 0 rank 0: %s" % open(err).read())
    with open(os.path.join(rank0, sorted(n for n in os.listdir(rank0) if n.startswith("ckpt-"))[-1],
                           "manifest.json")) as handle:
        manifest = json.load(handle)
    assert manifest["node_rank"] == 0 and manifest["step_nodes"] == 1 and manifest["node"] == "n2", manifest
    assert os.listdir(store_dir(cluster, job)) == ["0.node0"]
    wait_done(cluster, job, out, count=200)
    assert lines(out) == ["0:%d" % i for i in range(1, 201)], lines(out)[:3]
    _leftovers(cluster, job)


def test_several_tasks_per_node_explicit_checkpoints_are_refused(cluster, workdir):
    result = cluster.srun("-p", "spot", "-N1", "-n2", "--sandbox", "/bin/true", cwd=workdir,
                          env={"SLURMBOX_SANDBOX_CHECKPOINT": "transparent"})
    assert result.returncode != 0
    assert "runs 2 tasks on this node; checkpoints need one task per node" in result.stderr, result.stderr
    # From the site default (no option), the same step runs without checkpoints.
    result = cluster.srun("-p", "spot", "-N1", "-n2", "--sandbox", "/bin/echo", "ok", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "ok"]


def test_two_node_step_each_rank_continues(cluster, workdir):
    body = srun_counter(count=300, prefix="$SLURM_NODEID:", srun_args="-N2 -n2 ")
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body,
                                                         "-p spot -N2 -n2"))
    cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    moment = random.Random(11).randint(40, 200)
    cluster.wait_for(lambda: len(lines(out)) >= moment, timeout=120, what="%d lines" % moment)
    preempt(cluster, workdir, "n1")
    _assert_every_rank_continued(cluster, job, out, err, "preemption")
    _leftovers(cluster, job)


def _assert_every_rank_continued(cluster, job, out, err, reason):
    """Both ranks of the two-node counter printed exactly 1..300, each restored from its first checkpoint."""
    wait_done(cluster, job, out, count=600)
    errors = open(err).read()
    for rank in (0, 1):
        seen = [line.split(":", 1)[1] for line in lines(out) if line.startswith("%d:" % rank)]
        assert seen == [str(i) for i in range(1, 301)], (rank, len(seen), seen[:3], seen[-3:])
        assert re.search(r"%s: checkpointed job %s as \S+/0\.node%d/ckpt-000001" % (reason, job, rank), errors), \
            errors
        assert "restoring job %s step 0.node%d from checkpoint ckpt-000001" % (job, rank) in errors, errors
    return errors


def test_migrating_one_node_of_a_two_node_step_checkpoints_every_rank(cluster, workdir):
    """Maintenance on n1 reaches only n1's supervisor; rank 1 on n2 must be saved by the same evacuation."""
    body = srun_counter(count=300, prefix="$SLURM_NODEID:", srun_args="-N2 -n2 ")
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body,
                                                         "-p spot -N2 -n2"))
    cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 60, timeout=120, what="60 lines")
    # --no-drain: the two-node job needs both nodes of the dev cluster to run again.
    result = _slurmbox(cluster, "migrate", "--node", "n1", "--no-drain", "--reason", "firmware", "--runtime-dir",
                       cluster.runtime_dir, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [(s["job"], s["step"], s["outcome"]) for s in report["steps"]] == [(job, "0", "requeued")], report
    errors = _assert_every_rank_continued(cluster, job, out, err, "firmware")
    assert "firmware: asked the other 1 rank(s) of step 0 to checkpoint too" in errors, errors
    assert "firmware: rank 1 of step 0 checkpointed at another rank's request" in errors, errors
    assert "published no checkpoint" not in errors, errors
    _leftovers(cluster, job)


def test_migrating_one_node_of_a_two_node_signal_mode_step_signals_every_rank(cluster, workdir):
    """Signal mode: each rank's program gets its signal, saves its own state, and resumes from it."""
    body = "srun -N2 -n2 --sandbox --sandbox-checkpoint=signal /bin/sh -c '%s'" % SAVING_PROGRAM.replace("'", "'\\''")
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body, "-p spot -N2 -n2"))
    cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 60, timeout=120, what="60 lines")
    result = _slurmbox(cluster, "migrate", "--node", "n1", "--no-drain", "--reason", "firmware", "--runtime-dir",
                       cluster.runtime_dir, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    wait_done(cluster, job, out, count=500, timeout=300)
    errors = _assert_each_rank_resumed_its_own_state(out, err)
    assert "firmware: asked the other 1 rank(s) of step 0 to checkpoint too" in errors, errors
    assert "firmware: rank 1 of step 0 saved its state at another rank's request" in errors, errors
    assert "did not report" not in errors and "checkpointed job" not in errors, errors
    _leftovers(cluster, job)


# Each rank counts to 250, saves its count on SIGUSR1 and resumes from it after the requeue.
SAVING_PROGRAM = ('i=0; f=state.$SLURM_NODEID; [ -f "$f" ] && i=$(cat "$f") && echo "rank $SLURM_NODEID resumed at $i" >&2; '
                  'trap \'echo $i > "$f"; echo "rank $SLURM_NODEID saved $i" >&2; exit 0\' USR1; '
                  'while [ "$i" -lt 250 ]; do i=$((i+1)); echo "$SLURM_NODEID:$i"; sleep 0.05; done')


def _assert_each_rank_resumed_its_own_state(out, err):
    errors = open(err).read()
    for rank in (0, 1):
        seen = [line.split(":", 1)[1] for line in lines(out) if line.startswith("%d:" % rank)]
        assert seen == [str(i) for i in range(1, 251)], (rank, len(seen), seen[:3], seen[-3:])
        saved = re.search(r"rank %d saved (\d+)" % rank, errors)
        assert saved and "rank %d resumed at %s" % (rank, saved.group(1)) in errors, errors
    return errors


def test_two_node_step_in_signal_mode_saves_its_own_state_on_each_rank(cluster, workdir):
    # Each rank's program saves its counter on SIGUSR1 and resumes from it; no rank may requeue the job
    # while the other is still saving, so Slurm requeues it when GraceTime ends.
    body = "srun -N2 -n2 --sandbox --sandbox-checkpoint=signal /bin/sh -c '%s'" % SAVING_PROGRAM.replace("'", "'\\''")
    job, out, err = submit(cluster, workdir, step_script(os.path.join(workdir, "job.sh"), body, "-p spot -N2 -n2"))
    cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 60, timeout=120, what="60 lines")
    preempt(cluster, workdir, "n1")
    wait_done(cluster, job, out, count=500, timeout=300)
    errors = _assert_each_rank_resumed_its_own_state(out, err)
    assert "Slurm requeues job %s when its GraceTime ends" % job in errors, errors
    assert "checkpointed job" not in errors
    _leftovers(cluster, job)


# -- without a cluster: identity and selection -------------------------------------------------------------
def test_step_identity_from_the_task_environment():
    env = {"SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_RESTART_COUNT": "3"}
    assert step_checkpoint.node_rank(env) == 1
    assert step_checkpoint.step_key("0", 1) == "0.node1" and step_checkpoint.step_key("batch", 0) == "batch"
    assert step_checkpoint.parse_key("12.node3") == ("12", 3) and step_checkpoint.parse_key("batch") == ("batch", None)
    assert step_checkpoint.restart_count(env) == 3 and step_checkpoint.restart_count({}) == 0
    digest = step_checkpoint.command_sha256(["./train", "--lr", "1"], env)
    assert digest == step_checkpoint.command_sha256(["./train", "--lr", "1"], dict(env, SLURM_NODEID="0"))
    assert digest != step_checkpoint.command_sha256(["./train", "--lr", "2"], env)
    assert digest != step_checkpoint.command_sha256(["./train", "--lr", "1"], dict(env, SLURM_STEP_NUM_NODES="4"))
    for bad in ({}, {"SLURM_NODEID": "x"}, {"SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "2"}):
        with pytest.raises(step_checkpoint.StepIdentityError):
            step_checkpoint.node_rank(bad)


def test_srun_step_settings_refuse_explicit_and_silence_defaults():
    from slurmbox.migrate.policy import CheckpointOptionError, CheckpointSettings

    env = {"SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1"}
    default, explicit = CheckpointSettings("transparent"), CheckpointSettings("transparent", explicit=True)
    settings, key, fields, note = step_checkpoint.srun_step_settings(default, "0", 1, env, ["a"], False)
    assert settings.mode == "transparent" and key == "0.node0" and note is None
    assert fields["node_rank"] == 0 and fields["step_nodes"] == 1 and fields["restart_count"] == 0
    settings, key, fields, note = step_checkpoint.srun_step_settings(default, "0", 4, env, ["a"], False)
    assert settings.mode == "none" and fields == {} and "4 tasks on this node" in note
    with pytest.raises(CheckpointOptionError, match="4 tasks on this node"):
        step_checkpoint.srun_step_settings(explicit, "0", 4, env, ["a"], False)
    with pytest.raises(CheckpointOptionError, match="terminal"):
        step_checkpoint.srun_step_settings(explicit, "0", 1, env, ["a"], True)
    # Inside a sandboxed batch script the batch step's checkpoint is the job's: never refused.
    settings, _, _, note = step_checkpoint.srun_step_settings(explicit, "0", 4, dict(env, SLURMBOX_STEP_BROKER="/b"),
                                                              ["a"], False)
    assert settings.mode == "none" and "sandboxed batch script" in note


def _publish(store, job, key, fields, uid):
    pending = store.begin(job, key, uid)
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(os.urandom(64))
    return pending.publish(dict(fields, node="n1", reason="preemption"), {"mounts": []})


def test_selection_skips_other_command_lines_and_peers_barrier(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    uid = os.getuid()
    train = dict(step_checkpoint.manifest_fields("0", 0, 2, "a" * 64, 1))
    _publish(store, "7", "0.node0", train, uid)
    assert select_checkpoint(store, "7", "0.node0", uid, None, "a" * 64).checkpoint.name == "ckpt-000001"
    other = select_checkpoint(store, "7", "0.node0", uid, None, "b" * 64)
    assert other.checkpoint is None and not other.skipped and [c.name for c in other.foreign] == ["ckpt-000001"]
    assert "different command line" in other.messages()[0]
    # The barrier: rank 1 has not published yet, then has.
    ticks = iter(range(100))
    missing = step_checkpoint.wait_for_peers(store, "7", "0", 2, 1, "a" * 64, timeout=3,
                                             clock=lambda: next(ticks), sleep=lambda _s: None)
    assert missing == [1]
    _publish(store, "7", "0.node1", dict(train, node_rank=1), uid)
    assert step_checkpoint.wait_for_peers(store, "7", "0", 2, 1, "a" * 64, timeout=0) == []
    # A checkpoint of an earlier run (another restart count) does not count for this one.
    assert step_checkpoint.peers_saved(store, "7", "0", 2, 2, "a" * 64) == set()


def test_peer_requests_are_private_taken_once_and_belong_to_one_run_and_command(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    request = {"reason": "spot: aws", "evacuation_id": "e1", "restart_count": 2, "command_sha256": "a" * 64,
               "from_rank": 0}

    def put():
        return store.write_private("7", "0.node1", step_checkpoint.PEER_REQUEST, json.dumps(request).encode(),
                                   os.getuid())

    path = put()
    assert os.stat(path).st_mode & 0o777 == 0o600
    # The request is not a checkpoint: listing and gc leave it alone.
    assert store.checkpoints("7", "0.node1") == [] and store.gc() == [] and os.path.exists(path)
    assert step_checkpoint.take_peer_request(store, "7", "0.node1", 2, "a" * 64) == request
    assert not os.path.exists(path)  # taken: a later SIGTERM of this run is no request
    assert step_checkpoint.take_peer_request(store, "7", "0.node1", 2, "a" * 64) is None
    put()
    assert step_checkpoint.take_peer_request(store, "7", "0.node1", 3, "a" * 64) is None  # another run
    put()
    assert step_checkpoint.take_peer_request(store, "7", "0.node1", 2, "b" * 64) is None  # another command line
    assert step_checkpoint.take_peer_request(store, "7", "0.node0", 2, "a" * 64) is None  # not asked
    with pytest.raises(CheckpointError, match="must start with '.'"):
        store.write_private("7", "0.node1", "evacuate.json", b"{}", os.getuid())


class _FakeSupervisor:
    """What step_checkpoint needs of a step supervisor: rank 0 of a step of ``nodes`` nodes."""

    def __init__(self, store, nodes=2, rank=0):
        import types
        self.step_manifest = step_checkpoint.manifest_fields("0", rank, nodes, "a" * 64, 0)
        self.args = types.SimpleNamespace(job="7", uid=os.getuid())
        self._store, self.said = store, []

    def store(self):
        return self._store

    def _slurm_env(self):
        return {}

    def say(self, fd, message):
        self.said.append(message)


def _evacuation(reason):
    from slurmbox.migrate.sandbox_task import Evacuation
    return Evacuation(reason)


@pytest.fixture
def fake_slurm(monkeypatch):
    from slurmbox.slurm_client import scontrol
    state = {"job": {"BatchFlag": "1", "Requeue": "1", "NumNodes": "2", "JobState": "RUNNING"}, "signals": []}
    monkeypatch.setattr(scontrol, "show_job", lambda job, env=None, details=False: dict(state["job"]))
    monkeypatch.setattr(scontrol, "signal_step", lambda job, step, signum, env=None: state["signals"].append(
        (job, step, signum)))
    return state


def test_request_peers_asks_every_other_rank_and_signals_the_step(tmp_path, fake_slurm):
    import signal
    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=2)
    evacuation = _evacuation("firmware")
    assert step_checkpoint.request_peers(sup, evacuation, None) == 1
    assert fake_slurm["signals"] == [("7", "0", signal.SIGTERM)]
    taken = step_checkpoint.take_peer_request(store, "7", "0.node1", 0, "a" * 64)
    assert taken["reason"] == "firmware" and taken["evacuation_id"] == evacuation.evacuation_id
    assert not os.path.exists(store.step_dir("7", "0.node0") + "/" + step_checkpoint.PEER_REQUEST)
    assert sup.said == ["firmware: asked the other 1 rank(s) of step 0 to checkpoint too"]


def test_request_peers_trusts_the_jobs_node_count_not_the_task_environment(tmp_path, fake_slurm):
    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=1000000)  # SLURM_STEP_NUM_NODES as a user could set it
    evacuation = _evacuation("spot")
    assert step_checkpoint.request_peers(sup, evacuation, None) == 1 and evacuation.peer_nodes == 2
    assert store.steps("7") == ["0.node1"]  # one request, for the one other rank the job has


@pytest.mark.parametrize("job", [{"BatchFlag": "0", "Requeue": "1", "NumNodes": "2"},
                                 {"BatchFlag": "1", "Requeue": "0", "NumNodes": "2"}])
def test_request_peers_leaves_the_other_ranks_alone_when_the_job_cannot_be_requeued(tmp_path, fake_slurm, job):
    fake_slurm["job"] = job
    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=2)
    assert step_checkpoint.request_peers(sup, _evacuation("firmware"), None) == 0
    assert fake_slurm["signals"] == [] and store.steps("7") == []
    assert "cannot be requeued" in sup.said[0]


def test_preemptions_and_periodic_checkpoints_ask_no_peers(tmp_path, fake_slurm):
    sup = _FakeSupervisor(CheckpointStore(str(tmp_path / "store")), nodes=2)
    for reason in ("preemption", "periodic"):
        assert step_checkpoint.request_peers(sup, _evacuation(reason), None) == 0
    asked = _evacuation("spot")
    asked.from_peer = True
    assert step_checkpoint.request_peers(sup, asked, None) == 0 and fake_slurm["signals"] == []


def test_a_rank_asked_by_a_peer_does_not_requeue_and_reports_its_evacuation_done(tmp_path, fake_slurm):
    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=2, rank=1)
    evacuation = _evacuation("firmware")
    evacuation.from_peer, evacuation.evacuation_id, evacuation.signalled = True, "e7", True
    assert step_checkpoint.before_requeue(sup, evacuation, None, None) is False
    assert evacuation.outcome == "requeued"
    assert "rank 1 of step 0 saved its state at another rank's request" in evacuation.message
    # signal mode: no checkpoint of ours, but the rank that asked sees the evacuation done
    assert step_checkpoint.peers_saved(store, "7", "0", 2, 0, "a" * 64, evacuation_id="e7") == {1}
    assert step_checkpoint.peers_saved(store, "7", "0", 2, 0, "a" * 64, evacuation_id="e8") == set()


def test_the_evacuated_rank_waits_for_the_ranks_it_asked_even_without_its_own_checkpoint(tmp_path, fake_slurm,
                                                                                        monkeypatch):
    waited = []
    monkeypatch.setattr(step_checkpoint, "wait_for_peers", lambda *a, **k: waited.append((a, k)) or [])
    sup = _FakeSupervisor(CheckpointStore(str(tmp_path / "store")), nodes=2)
    evacuation = _evacuation("firmware")
    evacuation.peers_asked, evacuation.peer_nodes, evacuation.evacuation_id = 1, 2, "e1"
    assert step_checkpoint.before_requeue(sup, evacuation, None, None) is True
    assert len(waited) == 1 and waited[0][1]["evacuation_id"] == "e1" and waited[0][0][3] == 2


def test_in_signal_mode_the_evacuated_rank_counts_itself_done_once_its_program_exited(tmp_path, fake_slurm):
    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=2)
    evacuation = _evacuation("firmware")
    evacuation.peers_asked, evacuation.peer_nodes, evacuation.evacuation_id, evacuation.signalled = 1, 2, "e9", True
    store.write_private("7", "0.node1", step_checkpoint.PEER_DONE, json.dumps({"evacuation_id": "e9"}).encode(),
                        os.getuid())  # rank 1's program has saved its state
    assert step_checkpoint.before_requeue(sup, evacuation, None, None) is True
    assert not any("did not report" in line for line in sup.said), sup.said  # no wait: both ranks are done


def test_peers_saved_counts_only_this_evacuation(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    uid = os.getuid()
    fields = dict(step_checkpoint.manifest_fields("0", 1, 2, "a" * 64, 0))
    _publish(store, "7", "0.node1", dict(fields, evacuation_id="old"), uid)  # an earlier evacuation of this run
    assert step_checkpoint.peers_saved(store, "7", "0", 2, 0, "a" * 64, evacuation_id="new") == set()
    _publish(store, "7", "0.node1", dict(fields, evacuation_id="new"), uid)
    assert step_checkpoint.peers_saved(store, "7", "0", 2, 0, "a" * 64, evacuation_id="new") == {1}


def test_checkpoint_ls_verify_gc_cover_step_checkpoints(tmp_path):
    from click.testing import CliRunner

    from slurmbox.cli.main import cli

    root = str(tmp_path / "store")
    store = CheckpointStore(root)
    uid = os.getuid()
    for rank in (0, 1):
        _publish(store, "9", step_checkpoint.step_key("0", rank),
                 step_checkpoint.manifest_fields("0", rank, 2, "c" * 64, 1), uid)
    stale = os.path.join(store.step_dir("9", "0.node1"), ".tmp-000002-999999999-abcd1234")
    os.mkdir(stale)  # a writer that died mid-checkpoint (no such pid)
    runner = CliRunner()
    listed = runner.invoke(cli, ["checkpoint", "ls", "9", "--store", root, "--json"])
    assert listed.exit_code == 0, listed.output
    assert sorted((r["step"], r["name"]) for r in json.loads(listed.output)) == [
        ("0.node0", "ckpt-000001"), ("0.node1", "ckpt-000001")]
    table = runner.invoke(cli, ["checkpoint", "ls", "9", "--store", root])
    assert "0.node1" in table.output and table.exit_code == 0
    with open(os.path.join(store.step_dir("9", "0.node1"), "ckpt-000001", "checkpoint.img"), "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0xFF]))  # corrupt rank 1: one flipped byte
    verified = runner.invoke(cli, ["checkpoint", "verify", "9", "--store", root])
    assert verified.exit_code == 1
    assert "9 0.node0 ckpt-000001: ok" in verified.output and "9 0.node1 ckpt-000001: BAD" in verified.output
    collected = runner.invoke(cli, ["checkpoint", "gc", "--store", root, "--json"])
    assert collected.exit_code == 0, collected.output
    assert json.loads(collected.output)["removed"] == [stale] and not os.path.exists(stale)


@pytest.mark.parametrize("asked, fails", [(True, False), (False, False), (True, True)])
def test_a_peer_request_during_a_periodic_checkpoint_is_answered_with_that_checkpoint(tmp_path, fake_slurm,
                                                                                     monkeypatch, asked, fails):
    """A SIGTERM that arrives while a periodic checkpoint is taken is a peer's request when one is in the
    store (the checkpoint counts for that evacuation; no requeue here), else Slurm ending the step."""
    import signal
    import types
    from slurmbox.migrate import sandbox_task
    from slurmbox.migrate.policy import CheckpointSettings
    from slurmbox.slurm_client import scontrol

    store = CheckpointStore(str(tmp_path / "store"))
    sup = _FakeSupervisor(store, nodes=2, rank=1)
    sup.checkpoint_step, sup.container_id, sup.node_dir = "0.node1", "sbx-7", str(tmp_path)
    sup.args = types.SimpleNamespace(job="7", uid=os.getuid(), node="n2", partition="spot", batch_script=None)
    sup.batch_script_sha256 = lambda: None
    sup._kill = lambda prefix, ids, signum: None
    requeues = []
    monkeypatch.setattr(scontrol, "requeue", lambda job, env=None: requeues.append(job))
    task = sandbox_task.CheckpointableTask(sup, CheckpointSettings(mode="transparent", interval_s=60), ["runsc"],
                                           {"hostname": "n2"}, [], None)
    request = {"reason": "spot: aws", "evacuation_id": "e5", "restart_count": 0, "command_sha256": "a" * 64,
               "from_rank": 0}

    def checkpoint_sandbox(prefix, container_id, pending, fields, spec, flags, cache_dir=None):
        # Rank 0's node gets a spot notice mid-checkpoint: it writes its request, then signals the step.
        if asked:
            store.write_private("7", "0.node1", step_checkpoint.PEER_REQUEST, json.dumps(request).encode(),
                                os.getuid())
        assert task.on_signal(signal.SIGTERM) is True  # swallowed: the checkpoint goes on
        if fails:
            pending.abort()
            raise sandbox_task.CheckpointFailed("runsc checkpoint failed (exit 128): boom")
        with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
            handle.write(os.urandom(64))
        return pending.publish(fields, spec), 0.1

    monkeypatch.setattr(sandbox_task, "checkpoint_sandbox", checkpoint_sandbox)
    evacuation = task.evacuation = sandbox_task.Evacuation("periodic")
    task._evacuate(evacuation, requeue=False)
    assert requeues == []  # the rank that asked requeues the job; the sandbox here stays stopped
    saved = step_checkpoint.peers_saved(store, "7", "0", 2, 0, "a" * 64, evacuation_id="e5")
    if fails:  # no checkpoint to report: the rank that asked waits for it, then requeues (not this one, now)
        assert store.checkpoints("7", "0.node1") == [] and saved == set()
        assert evacuation.outcome == "requeued" and "that rank requeues job 7" in evacuation.message
        return
    assert store.checkpoints("7", "0.node1")[0].manifest["reason"] == "periodic"
    if asked:
        assert evacuation.outcome == "requeued" and saved == {1}
        assert "checkpointed at another rank's request" in evacuation.message
        assert step_checkpoint.take_peer_request(store, "7", "0.node1", 0, "a" * 64) is None  # taken once
    else:
        assert evacuation.outcome == "interrupted" and evacuation.interrupted == signal.SIGTERM and saved == set()


def test_a_sigterm_during_a_local_resume_is_passed_on_once_the_sandbox_runs(tmp_path, monkeypatch):
    """A SIGTERM that lands after a periodic checkpoint decided to resume here, before the resumed sandbox is
    followed again, is not lost: it is handled again (here: not a preemption, so passed to the program)."""
    import signal
    import threading
    import types
    from slurmbox.migrate import sandbox_task, triggers
    from slurmbox.migrate.policy import CheckpointSettings

    sup = _FakeSupervisor(CheckpointStore(str(tmp_path / "store")), nodes=1)
    sup.container_id = "sbx-7"
    killed, delivered = [], threading.Event()
    sup._kill = lambda prefix, ids, signum: (killed.append((ids, signum)), delivered.set())
    monkeypatch.setattr(triggers, "preempted", lambda job, env=None: False)
    # "runsc state" of the resumed sandbox: running.
    task = sandbox_task.CheckpointableTask(sup, CheckpointSettings(mode="transparent", interval_s=60),
                                           ["/bin/echo", '{"status": "running"}'], {}, [], None)
    task.proc = types.SimpleNamespace(poll=lambda: None)
    evacuation = task.evacuation = sandbox_task.Evacuation("periodic")
    evacuation.finish("resumed", "periodic checkpoint taken; the program continues")
    assert task.on_signal(signal.SIGTERM) is True  # the resume is under way: held, not dropped
    assert task.after_exit() == "resumed" and task.evacuation is not evacuation
    assert delivered.wait(30), "the SIGTERM was never passed on"
    assert killed == [(["sbx-7"], signal.SIGTERM)]
