"""Signal mode, a full checkpoint store and checkpoint privacy, through the real cluster."""

import os
import subprocess

from test_migrate_preemption import job_record, lines, running_node, submit, wait_done
from test_migrate_spot import _slurmbox


def _evacuate(cluster, node):
    return _slurmbox(cluster, "migrate", "--node", node, "--reason", "test", "--runtime-dir", cluster.runtime_dir)


def _log(cluster, node, job):
    try:
        with open(os.path.join(cluster.runtime_dir, node, "log", "%s.batch.log" % job)) as handle:
            return "\nslurmbox log:\n" + handle.read()
    except OSError:
        return ""


def _resume(cluster, node):
    cluster.run(["scontrol", "update", "NodeName=%s" % node, "State=RESUME"], user="root")


def test_signal_mode_program_saves_and_resumes_its_own_state(cluster, workdir):
    script = os.path.join(workdir, "selfsave.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox --sandbox-checkpoint=signal\n"
                     "#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n"
                     "i=0\n[ -f state ] && i=$(cat state) && echo \"resumed at $i\" >&2\n"
                     "trap 'echo $i > state; echo \"saved $i\" >&2; exit 0' USR1\n"
                     "while [ \"$i\" -lt 250 ]; do i=$((i+1)); echo \"$i\"; sleep 0.05; done\n")
    os.chmod(script, 0o755)
    job, out, err = submit(cluster, workdir, script)
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 30, timeout=120, what="30 lines")
    try:
        result = _evacuate(cluster, node)
        assert result.returncode == 0, result.stdout + result.stderr
        wait_done(cluster, job, out, count=250)
    finally:
        _resume(cluster, node)
    errors = open(err).read()
    assert "sending signal 10 to the program" in errors, errors
    saved = [line for line in errors.splitlines() if line.startswith("saved ")]
    assert saved and "resumed at %s" % saved[0].split()[1] in errors, errors
    assert lines(out) == [str(i) for i in range(1, 251)]
    assert "checkpointed job" not in errors  # signal mode never takes a runsc image


def test_full_store_fails_clearly_and_the_last_good_checkpoint_still_works(cluster, workdir):
    store = os.path.join(cluster.dev.dir, "checkpoints")
    os.makedirs(store, exist_ok=True)
    # Room for one small sandbox image (about 120 KB), not for two.
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k,mode=0755", "tmpfs", store]).returncode == 0
    nodes = []
    try:
        script = os.path.join(workdir, "count.sh")
        with open(script, "w") as handle:
            handle.write("#!/bin/sh\n#SBATCH --sandbox\n#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n"
                         "i=0\nwhile [ \"$i\" -lt 300 ]; do i=$((i+1)); echo \"$i\"; sleep 0.05; done\n")
        job, out, err = submit(cluster, workdir, script)
        for round_ in (1, 2):
            node = cluster.wait_for(lambda: running_node(cluster, job), timeout=120, what="job to run")
            before = len(lines(out))
            cluster.wait_for(lambda: len(lines(out)) >= before + 30, timeout=120, what="30 more lines")
            nodes.append(node)
            result = _evacuate(cluster, node)
            assert result.returncode == 0, result.stdout + result.stderr + _log(cluster, node, job)
            _resume(cluster, node)
        wait_done(cluster, job, out, count=300)
        errors = open(err).read()
        assert "checkpoint of job %s failed" % job in errors and "no space left on device" in errors, errors
        assert errors.count("restoring job %s step batch from checkpoint ckpt-000001" % job) == 2, errors
        numbers = [int(x) for x in lines(out)]
        drop = next(k for k in range(1, len(numbers)) if numbers[k] <= numbers[k - 1])
        first, again = numbers[:drop], numbers[drop:]
        assert first == list(range(1, len(first) + 1))
        assert again == list(range(again[0], 301)) and 1 < again[0] <= len(first), (first[-3:], again[:3])
        assert int(job_record(cluster, job).get("Restarts", 0)) == 2
    finally:
        for node in nodes:
            _resume(cluster, node)
        subprocess.run(["umount", store])


def test_periodic_checkpoints_bound_the_work_lost_without_notice(cluster, workdir):
    script = os.path.join(workdir, "count.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox --sandbox-checkpoint-interval=0.1\n"
                     "#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n"
                     "i=0\nwhile [ \"$i\" -lt 300 ]; do i=$((i+1)); echo \"$i\"; sleep 0.05; done\n")
    job, out, err = submit(cluster, workdir, script)
    cluster.wait_for(lambda: os.path.exists(err) and open(err).read().count("periodic: checkpointed job") >= 2,
                     timeout=120, what=lambda: "two periodic checkpoints: %r" % (open(err).read()
                                                                                if os.path.exists(err) else ""))
    # A node lost with no notice: Slurm requeues the job; nothing is saved at that moment.
    assert cluster.run(["scontrol", "requeue", job], user="root").returncode == 0
    wait_done(cluster, job, out, count=300)
    errors = open(err).read()
    assert "restoring job %s step batch from checkpoint ckpt-" % job in errors, errors
    numbers = [int(x) for x in lines(out)]
    drop = next((k for k in range(1, len(numbers)) if numbers[k] <= numbers[k - 1]), None)
    if drop is None:
        # The requeue met a checkpoint in progress: that checkpoint was restored and nothing was redone.
        assert numbers == list(range(1, 301))
        return
    first, again = numbers[:drop], numbers[drop:]
    assert first == list(range(1, len(first) + 1))
    # Work since the last periodic checkpoint is done again, never more than one interval's worth.
    assert again == list(range(again[0], 301)) and 1 < again[0] <= len(first), (first[-3:], again[:3])
    assert len(first) - again[0] < 200
