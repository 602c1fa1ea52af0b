"""Cold-start benchmark: what slurmbox adds on top of a bare gVisor start.

Measures, in one run and interleaved (so drift hits all three alike), the
median wall time of:

1. ``srun true`` (plain Slurm step),
2. ``srun --sandbox true`` (slurmbox step),
3. ``runsc run`` of ``/bin/true`` with the bundle slurmbox generates for that
   step (taken from ``--sandbox-dry-run``), outside Slurm.

and prints the ratios. Goal: slurmbox's overhead, ``(2) - (1)``, is at most
110% of ``(3)``, i.e. slurmbox adds no more than 10% on top of the bare runsc
cold start. Needs root and an installed slurmbox; starts a one-node dev
cluster unless ``--slurm-conf`` points at a running one.

    python benchmarks/cold_start.py --runs 30
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def timed(cmd, env, cwd):
    """Wall seconds of one run of ``cmd``; raises CalledProcessError on failure."""
    start = time.perf_counter()
    # Pipes, not /dev/null: runsc re-owns the stdio it is given (see slurmbox.sandbox.stdio_relay).
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   stdin=subprocess.PIPE)
    return time.perf_counter() - start


def bare_bundle(env, cwd, directory):
    """Write slurmbox's bundle for ``true`` (via --sandbox-dry-run) to ``directory``."""
    spec = json.loads(subprocess.run(["srun", "--sandbox", "--sandbox-dry-run", "true"], env=env, cwd=cwd,
                                     check=True, capture_output=True, text=True).stdout)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(spec, handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slurm-conf", help="use this running cluster instead of starting one")
    args = parser.parse_args()

    cluster = None
    if args.slurm_conf:
        conf = args.slurm_conf
    else:
        from slurmbox.dev_cluster.cluster import DevCluster
        cluster = DevCluster(tempfile.mkdtemp(prefix="sbxbench-", dir="/tmp"), nodes=1, gpus_per_node=0, subnet=11)
        shutil.rmtree(cluster.dir)
        conf = cluster.up()
    env = dict(os.environ, SLURM_CONF=conf)
    work = tempfile.mkdtemp(prefix="sbxbench-work-", dir="/tmp")
    bundle = tempfile.mkdtemp(prefix="sbxbench-bundle-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="sbxbench-runsc-", dir="/tmp")
    try:
        bare_bundle(env, work, bundle)
        runsc = shutil.which("runsc")
        commands = {
            "srun true": ["srun", "true"],
            "srun --sandbox true": ["srun", "--sandbox", "true"],
            "bare runsc run true": [runsc, "--root", state, "--platform", "ptrace", "--network", "none", "run",
                                    "--bundle", bundle, "bench"],
        }
        samples = {name: [] for name in commands}
        for name, cmd in commands.items():  # warm-up: page cache, capability caches
            timed(cmd, env, work)
        for _ in range(args.runs):
            for name, cmd in commands.items():
                samples[name].append(timed(cmd, env, work))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        for name, value in medians.items():
            print("%-22s median %7.1f ms  (min %.1f, max %.1f, n=%d)" % (
                name, value * 1e3, min(samples[name]) * 1e3, max(samples[name]) * 1e3, len(samples[name])))
        slurmbox_overhead = medians["srun --sandbox true"] - medians["srun true"]
        bare = medians["bare runsc run true"]
        print("srun --sandbox / srun            = %.2fx" % (medians["srun --sandbox true"] / medians["srun true"]))
        print("(srun --sandbox - srun) / runsc  = %.2fx   (goal <= 1.10x)" % (slurmbox_overhead / bare))
        print("slurmbox's own cost beyond runsc = %.1f ms" % ((slurmbox_overhead - bare) * 1e3))
    finally:
        for path in (work, bundle, state):
            shutil.rmtree(path, ignore_errors=True)
        if cluster:
            cluster.down()


if __name__ == "__main__":
    main()
