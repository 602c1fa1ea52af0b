"""What the submit-time GPU checkpoint check (slurmbox.spank_plugin.submit_check) adds to sbatch.

Submits held ``--wrap true`` jobs to a dev cluster (whose ``secure`` partition
requires sandboxing, so the shim runs the check for every sbatch), interleaved
so drift hits all kinds alike, and prints the median wall time of each kind
and its difference to the baseline:

- baseline: ``--sandbox-checkpoint=none`` (the shim skips the check in C),
- silent: a plain job without GPUs (Python starts, reads argv, says nothing),
- gpu-default: ``-p secure --gpus=1`` (also reads the compiled site policy;
  the site default there is never refused, so runsc is not asked),
- refused: ``--sandbox --gpus=1 --sandbox-checkpoint=transparent`` (the whole
  path: policy, default partition from scontrol, ``runsc checkpoint --help``).

Needs root and an installed slurmbox (scripts/install.sh).

    python benchmarks/submit_check_overhead.py --runs 20
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time

KINDS = {
    "baseline": ["--sandbox-checkpoint=none"],
    "silent": [],
    "gpu-default": ["-p", "secure", "--gpus=1"],
    "refused": ["--sandbox", "--gpus=1", "--sandbox-checkpoint=transparent"],
}


def submit(kind, env):
    """Wall seconds of one sbatch of ``kind``; raises RuntimeError when its exit status is unexpected."""
    start = time.perf_counter()
    result = subprocess.run(["sbatch", "--hold", "-J", "submit-bench"] + KINDS[kind] + ["--wrap", "true"],
                            env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if (result.returncode != 0) != (kind == "refused"):
        raise RuntimeError("sbatch %s: exit %d: %s" % (kind, result.returncode, result.stderr.strip()))
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    from slurmbox.dev_cluster.cluster import DevCluster, claim_free_subnet

    directory = tempfile.mkdtemp(prefix="sbxbench-", dir="/tmp")
    os.rmdir(directory)
    cluster = DevCluster(directory, nodes=1, gpus_per_node=2, subnet=claim_free_subnet(20, 199))
    conf = cluster.up()
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "SLURM_CONF": conf, "HOME": os.environ.get("HOME", "/root")}
    times = {kind: [] for kind in KINDS}
    try:
        for kind in KINDS:  # warm-up: the first GPU job compiles the site policy cache (pydantic)
            submit(kind, env)
        for _ in range(args.runs):
            for kind in KINDS:
                times[kind].append(submit(kind, env))
        subprocess.run(["scancel", "-n", "submit-bench"], env=env, check=False)
    finally:
        cluster.down()
    base = statistics.median(times["baseline"])
    print("%-12s %10s %12s %8s" % ("kind", "median ms", "+ms vs base", "ratio"))
    for kind, values in times.items():
        median = statistics.median(values)
        print("%-12s %10.1f %12.1f %8.2f" % (kind, median * 1e3, (median - base) * 1e3, median / base))


if __name__ == "__main__":
    main()
