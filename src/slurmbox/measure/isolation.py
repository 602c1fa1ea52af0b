"""CPU isolation and kernel CPU accounting of a candidate's sandbox (cgroup v1 or v2).

runsc, run as root with ``linux.cgroupsPath`` and ``linux.resources.cpu.cpus``
in the OCI spec (runtime-spec config-linux.md "Control groups", "CPU"), puts
the whole sandbox (sentry, gofer, ptrace stubs) in that cgroup and restricts
it to the CPU set. The harness then reads the kernel's CPU time of the
sandbox (cgroup v1 ``cpuacct.usage`` in ns, kernel Documentation
admin-guide/cgroup-v1/cpuacct.rst; v2 ``cpu.stat`` ``usage_usec``,
admin-guide/cgroup-v2.rst) around every sample. The harness itself is
pinned to other CPUs with sched_setaffinity(2).
"""

import os
import signal
import time

CGROUP_ROOT = "/sys/fs/cgroup"
#: Parent cgroup of isolated measurement sandboxes (one child per candidate run). Its CPU
#: weight is the kernel's maximum (cpu.shares 262144, v1; cpu.weight 10000, v2) so a sandbox
#: competing for its CPU with the node's other, unconfined processes wins most of the time.
PARENT = "slurmbox-measure"
#: Parent of sandboxes measured without isolation (default weight), for comparisons.
PARENT_SHARED = "slurmbox-measure-shared"
MAX_SHARES_V1 = 262144
MAX_WEIGHT_V2 = 10000


class IsolationError(RuntimeError):
    """The requested CPUs do not exist or the cgroup hierarchy cannot be set up."""


def online_cpus():
    """Set of CPU numbers this process may run on (sched_getaffinity of the harness at import)."""
    return set(os.sched_getaffinity(0))


def parse_cpu_list(text):
    """``"0-2,5"`` -> {0, 1, 2, 5} (the kernel's cpulist format, cpuset(7)). Raises ValueError."""
    cpus = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        else:
            cpus.add(int(part))
    return cpus


def format_cpu_list(cpus):
    """{0, 1, 2, 5} -> ``"0-2,5"``."""
    ordered = sorted(cpus)
    ranges = []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


def cgroup_version():
    """2 when /sys/fs/cgroup is the unified (v2) hierarchy, else 1 (v1 or hybrid)."""
    return 2 if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")) else 1


def _v1_dir(controller):
    """Mount point of a v1 controller (``cpuacct`` may be co-mounted as ``cpu,cpuacct``)."""
    for name in (controller, "cpu,cpuacct", "cpuacct,cpu"):
        path = os.path.join(CGROUP_ROOT, name)
        if os.path.isdir(path):
            return path
    raise IsolationError("cgroup v1 controller %s is not mounted under %s" % (controller, CGROUP_ROOT))


def _write(path, value):
    with open(path, "w") as handle:
        handle.write(value)


def prepare_parent(parent=PARENT):
    """Create the parent cgroup ``parent`` so runsc can create children restricted to a CPU set.

    cgroup v1 cpuset children start with empty ``cpuset.cpus``/``cpuset.mems``
    unless the parent has them, so the parent gets the root's values. On v2,
    the cpu and cpuset controllers are enabled for the children. PARENT gets
    the maximum CPU weight (see its comment). Returns the cgroupsPath prefix
    ("/" + parent). Raises IsolationError.
    """
    heavy = parent == PARENT
    try:
        if cgroup_version() == 1:
            cpu = os.path.join(_v1_dir("cpu"), parent)
            os.makedirs(cpu, exist_ok=True)
            _write(os.path.join(cpu, "cpu.shares"), str(MAX_SHARES_V1 if heavy else 1024))
            cpuset = os.path.join(_v1_dir("cpuset"), parent)
            os.makedirs(cpuset, exist_ok=True)
            root = _v1_dir("cpuset")
            for name in ("cpuset.cpus", "cpuset.mems"):
                with open(os.path.join(cpuset, name)) as handle:
                    if not handle.read().strip():
                        with open(os.path.join(root, name)) as source:
                            _write(os.path.join(cpuset, name), source.read().strip())
        else:
            path = os.path.join(CGROUP_ROOT, parent)
            os.makedirs(path, exist_ok=True)
            _write(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "+cpu +cpuset")
            _write(os.path.join(path, "cgroup.subtree_control"), "+cpu +cpuset")
            _write(os.path.join(path, "cpu.weight"), str(MAX_WEIGHT_V2 if heavy else 100))
    except OSError as err:
        raise IsolationError("cannot prepare cgroup %s (%s); slurmbox measure needs root and a writable "
                             "cgroup hierarchy" % (parent, err))
    remove_stale_cgroups(parent)
    return "/" + parent


#: A measure-* cgroup with no process that is older than this (seconds) was left by a
#: harness that could not clean up (SIGKILL): a live candidate's cgroup holds its sandbox
#: from the start, within seconds of its creation.
STALE_AFTER_S = 300


def remove_stale_cgroups(parent, older_than_s=STALE_AFTER_S):
    """Remove ``parent``'s ``measure-*`` child cgroups that hold no process and were made more
    than ``older_than_s`` seconds ago (best effort; called as candidates start)."""
    base = os.path.join(_v1_dir("cpuacct") if cgroup_version() == 1 else CGROUP_ROOT, parent)
    try:
        names = [name for name in os.listdir(base) if name.startswith("measure-")]
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(base, name)
        try:
            if now - os.stat(path).st_mtime < older_than_s:
                continue
            with open(os.path.join(path, "cgroup.procs")) as handle:
                if handle.read().strip():
                    continue
        except OSError:
            continue
        remove_cgroup("/%s/%s" % (parent, name))


def validate_cpus(cpus, what):
    """Raise IsolationError unless every CPU in ``cpus`` is one this machine offers."""
    available = online_cpus()
    missing = set(cpus) - available
    if not cpus or missing:
        raise IsolationError("%s CPUs %s are not available here (this machine offers %s); choose others"
                             % (what, format_cpu_list(cpus) or "(none)", format_cpu_list(available)))


class CpuAccount:
    """Kernel-accounted CPU time of one cgroup (``cgroups_path`` as in the OCI spec), in ns.

    ``read()`` returns cumulative CPU ns of every task in the cgroup, or None
    when the cgroup does not exist (not yet created, or already removed).
    ``path``: the accounting file (``cpuacct.usage`` or ``cpu.stat``) when it
    is known already, instead of deriving it from ``cgroups_path``.
    """

    def __init__(self, cgroups_path, path=None):
        self.cgroups_path = cgroups_path
        self._fd = None
        if path is not None:  # the file itself, e.g. from a Slurm step's sandbox record (slurm_step.py)
            self.path, self._v2 = path, os.path.basename(path) == "cpu.stat"
            return
        relative = cgroups_path.lstrip("/")
        if cgroup_version() == 1:
            self.path = os.path.join(_v1_dir("cpuacct"), relative, "cpuacct.usage")
            self._v2 = False
        else:
            self.path = os.path.join(CGROUP_ROOT, relative, "cpu.stat")
            self._v2 = True
        self._fd = None

    def read(self):
        """Cumulative CPU time of the cgroup in ns, or None (see the class docstring)."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return None
        try:
            raw = os.pread(self._fd, 4096, 0).decode()
        except OSError:
            return None
        if not self._v2:
            return int(raw.strip())
        for line in raw.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
        return None

    def close(self):
        """Close the accounting file (read() reopens it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class NullAccount:
    """CPU accounting that is not available (Slurm mode without a known step cgroup): reads None."""

    cgroups_path = None

    def read(self):
        """Always None: no CPU time is known."""
        return None

    def close(self):
        """Nothing to close."""


def create_cgroup(cgroups_path, cpus):
    """Create ``cgroups_path`` restricted to ``cpus`` (for an unsandboxed baseline run). Raises IsolationError."""
    relative = cgroups_path.lstrip("/")
    parent = relative.split("/")[0]
    prepare_parent(parent)
    try:
        if cgroup_version() == 1:
            for controller in ("cpuset", "cpuacct", "cpu"):
                os.makedirs(os.path.join(_v1_dir(controller), relative), exist_ok=True)
            _write(os.path.join(_v1_dir("cpu"), relative, "cpu.shares"),
                   str(MAX_SHARES_V1 if parent == PARENT else 1024))
            cpuset = os.path.join(_v1_dir("cpuset"), relative)
            _write(os.path.join(cpuset, "cpuset.cpus"), format_cpu_list(cpus))
            with open(os.path.join(_v1_dir("cpuset"), parent, "cpuset.mems")) as handle:
                _write(os.path.join(cpuset, "cpuset.mems"), handle.read().strip())
        else:
            path = os.path.join(CGROUP_ROOT, relative)
            os.makedirs(path, exist_ok=True)
            _write(os.path.join(path, "cpuset.cpus"), format_cpu_list(cpus))
    except OSError as err:
        raise IsolationError("cannot create cgroup %s: %s" % (cgroups_path, err))


def attach(cgroups_path, pid):
    """Move process ``pid`` into ``cgroups_path`` (created by create_cgroup)."""
    relative = cgroups_path.lstrip("/")
    dirs = [os.path.join(_v1_dir(c), relative) for c in ("cpuset", "cpuacct", "cpu")] if cgroup_version() == 1 \
        else [os.path.join(CGROUP_ROOT, relative)]
    for directory in dirs:
        _write(os.path.join(directory, "cgroup.procs"), str(pid))


def kill_all(cgroups_path):
    """SIGKILL every process left in ``cgroups_path`` (children a candidate forked), then wait for it to empty."""
    relative = cgroups_path.lstrip("/")
    procs = os.path.join(_v1_dir("cpuacct") if cgroup_version() == 1 else CGROUP_ROOT, relative, "cgroup.procs")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(procs) as handle:
                pids = [int(line) for line in handle.read().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def remove_cgroup(cgroups_path):
    """Remove ``cgroups_path`` from every hierarchy where it exists and is empty (best effort)."""
    relative = cgroups_path.lstrip("/")
    if not (relative.startswith(PARENT + "/") or relative.startswith(PARENT_SHARED + "/")):
        return
    if cgroup_version() == 1:
        dirs = [os.path.join(CGROUP_ROOT, c, relative) for c in os.listdir(CGROUP_ROOT)]
    else:
        dirs = [os.path.join(CGROUP_ROOT, relative)]
    for directory in dirs:
        try:
            os.rmdir(directory)
        except OSError:
            pass


def pin_harness(cpus, realtime=False):
    """Pin the calling process to ``cpus``; with ``realtime``, also SCHED_FIFO priority 10
    (so the harness wakes at once when a response arrives even if a neighbour
    loads its CPU; the kernel's RT throttling, sched_rt_runtime_us, still
    bounds it). Returns a callable that restores the previous affinity and policy."""
    previous = os.sched_getaffinity(0)
    policy = os.sched_getscheduler(0)
    param = os.sched_getparam(0)
    os.sched_setaffinity(0, cpus)
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except (OSError, PermissionError):
            realtime = False

    def restore():
        if realtime:
            os.sched_setscheduler(0, policy, param)
        os.sched_setaffinity(0, previous)
    return restore
