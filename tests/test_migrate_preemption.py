"""Preemption of sandboxed batch jobs through the real cluster: checkpoint, requeue, restore.

The job keeps a counter only in the memory of its shell and prints it every
50 ms; a higher-priority job preempts it (spot: PreemptMode=REQUEUE,
GraceTime=30); after requeue and restore on whichever node Slurm picks, the
printed sequence must be exactly 1..N.
"""

import os
import random
import re

import pytest

from slurmbox.slurm_client import scontrol

COUNT = 500


def counter_script(path, count=COUNT, extra_sbatch="", body=None):
    """A batch script printing 1..count every 50 ms from a shell variable."""
    loop = body or ('i=0\nwhile [ "$i" -lt %d ]; do i=$((i+1)); echo "$i"; sleep 0.05; done\n' % count)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox\n#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n%s%s"
                     % (extra_sbatch, loop))
    os.chmod(path, 0o755)
    return path


def submit(cluster, workdir, script, *args):
    out, err = os.path.join(workdir, "job.out"), os.path.join(workdir, "job.err")
    result = cluster.run(["sbatch", "--parsable", "-o", out, "-e", err] + list(args) + [script], cwd=workdir)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0], out, err


def job_record(cluster, job):
    try:
        return scontrol.show_job(job, env=cluster.env())
    except scontrol.SlurmCommandError:
        return {}


def lines(path):
    try:
        with open(path) as handle:
            return handle.read().split()
    except OSError:
        return []


def running_node(cluster, job):
    record = job_record(cluster, job)
    return record.get("NodeList") if record.get("JobState") == "RUNNING" else None


def wait_done(cluster, job, out, count=COUNT, timeout=240):
    def done():
        record = job_record(cluster, job)
        return record.get("JobState") == "COMPLETED" and len(lines(out)) >= count
    cluster.wait_for(done, timeout=timeout, what=lambda: "job %s to complete: %s, %d lines"
                     % (job, job_record(cluster, job).get("JobState"), len(lines(out))))
    return job_record(cluster, job)


def preempt(cluster, workdir, node):
    """Submit an ondemand job that needs all of ``node``: slurmctld preempts what runs there."""
    result = cluster.run(["sbatch", "--parsable", "-p", "ondemand", "-w", node, "--exclusive", "-o", "/dev/null",
                          "--wrap", "sleep 2"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def assert_exact_sequence(out, count=COUNT):
    seen = lines(out)
    assert seen == [str(i) for i in range(1, count + 1)], _describe(seen)


def _describe(seen):
    numbers = [int(x) for x in seen if x.isdigit()]
    gaps = [(a, b) for a, b in zip(numbers, numbers[1:]) if b != a + 1]
    return "%d lines, first %s last %s, breaks %s" % (len(seen), seen[:3], seen[-3:], gaps[:5])


@pytest.mark.parametrize("seed", [1, 2])
def test_preempted_job_restores_and_counts_exactly_once(cluster, workdir, seed):
    moment = random.Random(seed * 7919).randint(20, 250)  # lines printed before the preemption
    job, out, err = submit(cluster, workdir, counter_script(os.path.join(workdir, "count.sh")))
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= moment, timeout=120, what="%d lines" % moment)
    preempt(cluster, workdir, node)
    record = wait_done(cluster, job, out)
    errors = open(err).read()
    assert_exact_sequence(out)
    assert int(record.get("Restarts", "0")) >= 1, record
    assert re.search(r"preemption: checkpointed job %s as \S+ckpt-000001" % job, errors), errors
    assert "restoring job %s step batch from checkpoint ckpt-000001" % job in errors, errors
    # The job finished on its own: its checkpoints are gone, and nothing is left running.
    assert not os.path.exists(os.path.join(cluster.dev.dir, "checkpoints", job, "batch", "ckpt-000001"))
    cluster.wait_for(lambda: not cluster.sandbox_processes(job), timeout=30, what="sandbox of the job to end")


def test_scancel_is_not_a_preemption(cluster, workdir):
    job, out, err = submit(cluster, workdir, counter_script(os.path.join(workdir, "count.sh")))
    cluster.wait_for(lambda: len(lines(out)) >= 5, timeout=120, what="output")
    assert cluster.run(["scancel", job]).returncode == 0
    cluster.wait_for(lambda: job_record(cluster, job).get("JobState") in ("CANCELLED", ""), timeout=60,
                     what="job cancelled")
    assert "checkpointed" not in open(err).read()
    assert not os.path.exists(os.path.join(cluster.dev.dir, "checkpoints", job, "batch"))
    cluster.wait_for(lambda: not cluster.sandbox_processes(job), timeout=30, what="sandbox of the job to end")
