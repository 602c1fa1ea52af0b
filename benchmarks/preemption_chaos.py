"""Chaos benchmark: Slurm preemption at random moments never loses or repeats work.

A sandboxed batch job on the dev cluster's ``spot`` partition (PreemptMode=
REQUEUE, GraceTime) keeps a counter only in its shell's memory and prints it
every 50 ms, COUNT times. At a random moment a higher-priority ``ondemand``
job takes its node, slurmbox checkpoints the sandbox within the grace time,
Slurm requeues the job and slurmbox restores it on whichever node Slurm picks.
Each round passes when the job's output is exactly 1..COUNT (no gap, no
repeat) and Slurm counted at least one restart. Printed per round and as a
summary (rounds exact / rounds, and the median time from the preemption until
the job printed again), measured in one run.

    python benchmarks/preemption_chaos.py --rounds 10 [--seed 7] [--slurm-conf CONF]

Needs root and an installed slurmbox (scripts/install.sh); starts and stops
its own two-node dev cluster unless --slurm-conf names a running one.
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from polling import wait_until  # benchmarks/polling.py, beside this script

USER = "sbxuser"
COUNT = 600  # 30 s of printing at 50 ms


def _numbers(path):
    try:
        with open(path) as handle:
            return handle.read().split()
    except OSError:
        return []


def one_round(slurm_conf, work, index, delay):
    """Run one preempted job; returns (exact: bool, restarts: int, seconds until printing again)."""
    from slurmbox.slurm_client import scontrol

    env = dict(os.environ, SLURM_CONF=slurm_conf)
    script = os.path.join(work, "count.sh")
    out = os.path.join(work, "round-%d.out" % index)

    def as_user(*cmd):
        return subprocess.run(["runuser", "-u", USER, "--", "env", "SLURM_CONF=%s" % slurm_conf] + list(cmd),
                              capture_output=True, text=True, cwd=work, check=True, input="").stdout.strip()

    def record(job):
        try:
            return scontrol.show_job(job, env=env)
        except scontrol.SlurmCommandError:
            return {}

    job = as_user("sbatch", "--parsable", "-o", out, "-e", out + ".err", script).split(";")[0]
    node = wait_until(lambda: record(job).get("NodeList") if record(job).get("JobState") == "RUNNING" else None,
                      120, "job %s to start" % job)
    wait_until(lambda: len(_numbers(out)) >= 1, 60, "job %s to print" % job)
    time.sleep(delay)  # the random moment of the preemption is the point of this benchmark
    as_user("sbatch", "--parsable", "-p", "ondemand", "-w", node, "--exclusive", "-o", "/dev/null",
            "--wrap", "sleep 2")
    preempted = time.monotonic()
    wait_until(lambda: record(job).get("Restarts", "0") != "0", 120, "job %s to be requeued" % job)
    at_requeue = len(_numbers(out))  # the sandbox was checkpointed and stopped before Slurm requeued the job
    wait_until(lambda: len(_numbers(out)) > at_requeue or record(job).get("JobState") == "COMPLETED", 300,
               "job %s to print again" % job)
    again = time.monotonic() - preempted
    wait_until(lambda: record(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 300,
               "job %s to end" % job)
    exact = _numbers(out) == [str(i) for i in range(1, COUNT + 1)]
    return exact, int(record(job).get("Restarts", "0")), again


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="seed of the random moments (default: random)")
    parser.add_argument("--slurm-conf", default=None, help="a running dev cluster's slurm.conf")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (starts a dev cluster and submits as %s)" % USER)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    cluster, conf = None, args.slurm_conf
    if not conf:
        from slurmbox.dev_cluster.cluster import DevCluster, claim_free_subnet
        directory = tempfile.mkdtemp(prefix="sbxchaos-", dir="/tmp")
        os.rmdir(directory)
        cluster = DevCluster(directory, nodes=2, gpus_per_node=0, subnet=claim_free_subnet(200, 249))
        conf = cluster.up()
    work = tempfile.mkdtemp(prefix="sbx-chaos-", dir=os.path.expanduser("~%s" % USER))
    subprocess.run(["chown", USER, work], check=True)
    with open(os.path.join(work, "count.sh"), "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox\n#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n"
                     "i=0\nwhile [ \"$i\" -lt %d ]; do i=$((i+1)); echo \"$i\"; sleep 0.05; done\n" % COUNT)
    results = []
    try:
        print("preemption chaos: %d rounds, seed %d, counter 1..%d every 50 ms" % (args.rounds, seed, COUNT))
        for index in range(args.rounds):
            delay = rng.uniform(0.2, 20.0)
            exact, restarts, again = one_round(conf, work, index, delay)
            results.append((exact, restarts, again))
            print("round %2d: preempted %5.2f s after the first line: %s, restarts %d, printing again after %.1f s"
                  % (index + 1, delay, "exact 1..N" if exact else "WRONG SEQUENCE", restarts, again), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cluster:
            cluster.down()
    exact_rounds = sum(1 for exact, restarts, _ in results if exact and restarts >= 1)
    print("summary: %d/%d rounds exact with a restore; preemption until printing again: median %.1f s"
          % (exact_rounds, len(results), statistics.median(r[2] for r in results) if results else float("nan")))
    sys.exit(0 if exact_rounds == len(results) else 1)


if __name__ == "__main__":
    main()
