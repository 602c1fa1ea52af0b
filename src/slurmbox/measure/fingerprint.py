"""The environment a measurement ran in: node, CPUs, GPUs, software, sandbox.

Stored with every candidate's record so two records can be compared only
when their conditions match. Sources: uname(2), /proc/cpuinfo, sysfs
``/sys/devices/system/cpu/cpuN/{cpufreq/scaling_governor,topology/thread_siblings_list}``,
NVML through slurmbox.measure.gpu, Slurm's step environment variables.
"""

import os
import platform
import socket
import sys
import time

from slurmbox.measure import gpu, isolation


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def cpu_model():
    """The first ``model name`` of /proc/cpuinfo, or the machine name."""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def collect(harness_cpus, sandbox_cpus, isolation_on, policy=None):
    """Fingerprint dict (JSON-ready; nested values are dicts/lists).

    ``harness_cpus``/``sandbox_cpus``: sets or None; ``policy``: the
    measurement policy dict in force (policy.py).
    """
    import numpy
    cpus = sorted(sandbox_cpus or isolation.online_cpus())
    return {
        "node": socket.gethostname(),
        "kernel": platform.release(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_model": cpu_model(),
        "online_cpus": isolation.format_cpu_list(isolation.online_cpus()),
        "harness_cpus": isolation.format_cpu_list(harness_cpus) if harness_cpus else "",
        "sandbox_cpus": isolation.format_cpu_list(sandbox_cpus) if sandbox_cpus else "",
        "isolation": bool(isolation_on),
        "cgroup_version": isolation.cgroup_version(),
        "governors": {str(c): _read("/sys/devices/system/cpu/cpu%d/cpufreq/scaling_governor" % c) or "n/a"
                      for c in cpus},
        "smt_siblings": {str(c): _read("/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list" % c) or "n/a"
                         for c in cpus},
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "slurm": {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_PARTITION",
                                             "SLURMD_NODENAME") if k in os.environ},
        "gpu": gpu.fingerprint(),
        "policy": dict(policy or {}),
    }
