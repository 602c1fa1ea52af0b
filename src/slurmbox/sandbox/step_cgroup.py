"""The cgroup of one step's sandbox on one node, and where its kernel CPU time is read.

The supervisor sets ``linux.cgroupsPath`` in the step's OCI spec (runtime-spec
config-linux.md "Control groups") to ``<step cgroup>/sandbox``, so runsc puts
the whole sandbox (sentry, gofer, ptrace stubs and every task) into one cgroup
per step and node and applies the profile's ``linux.resources`` to it. The step
cgroup is named ``slurmbox-<job>.<step>-<node>-<8 hex of the runtime
directory>`` (dev clusters sharing one kernel reuse job ids and node names) and
sits next to or below the cgroup the supervisor (slurmstepd's) runs in, so
Slurm's own job and step cgroups keep confining the sandbox:

- cgroup v1 (and hybrid): a relative path; runsc joins it to its own path in
  every hierarchy (``/proc/self/cgroup``), i.e. it nests inside Slurm's
  step/task cgroup of each controller.
- cgroup v2: the sibling of the supervisor's own cgroup (a v2 cgroup that holds
  processes may not have children with controllers, the "no internal processes"
  rule of admin-guide/cgroup-v2.rst), as an absolute path.

Why the extra ``sandbox`` level: runsc creates its cgroup with the supervisor's
umask 077 (mode 0700, nobody else may enter it) and applies resource limits only
to a cgroup it created itself. So the supervisor creates the step cgroup of the
CPU-accounting hierarchy first, mode 0755 (:func:`prepare`), and runsc creates
``sandbox`` inside it. The step cgroup's CPU-time file, cgroup v1
``cpuacct.usage`` (ns, hierarchical: kernel admin-guide/cgroup-v1/cpuacct.rst)
or v2 ``cpu.stat`` ``usage_usec`` (admin-guide/cgroup-v2.rst), counts exactly
the sandbox, and every user may read it (the kernel's modes 0644/0444; the same
CPU times are in /proc/PID/stat of the sandbox's processes anyway). The
sandbox's record (sandbox/registry.py) carries :func:`accounting`, so the job's
user can cross-check a measurement (slurmbox.measure.slurm_step). runsc removes
``sandbox`` when the sandbox ends; :func:`remove` removes the step cgroups at
the step's end (sandbox/cleanup.py).
"""

import hashlib
import os
import re
import signal
import time

CGROUP_ROOT = "/sys/fs/cgroup"
PREFIX = "slurmbox-"
#: The cgroup runsc creates (and removes) for the sandbox, inside the step cgroup.
LEAF = "sandbox"


def cgroup_name(job, step, node, runtime_dir):
    """``slurmbox-<job>.<step>-<node>-<hash>``: the step cgroup's name (``hash``: 8 hex of ``runtime_dir``)."""
    tag = hashlib.sha256(os.path.realpath(str(runtime_dir)).encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "%s%s.%s-%s-%s" % (PREFIX, job, step, node, tag))


def is_v2(root=CGROUP_ROOT):
    """True when ``root`` is the unified (v2 only) hierarchy, as runsc decides; v1 and hybrid give False."""
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def _read(path):
    with open(path) as handle:
        return handle.read()


def parse_proc_cgroup(text):
    """``/proc/PID/cgroup`` text (cgroups(7)) -> {frozenset of controllers: path}; v2's entry has key frozenset()."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[frozenset(c for c in parts[1].split(",") if c)] = parts[2]
    return paths


def parse_mountinfo(text):
    """``/proc/PID/mountinfo`` text (proc(5)) -> list of (fstype, root, mount point, set of super options)
    for cgroup (v1) and cgroup2 mounts."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((tail[0], fields[3], fields[4].replace("\\040", " "), set(tail[2].split(","))))
    return mounts


def _under_mount(mount_point, mount_root, path):
    """Host directory of cgroup ``path`` (as /proc/self/cgroup gives it) in a hierarchy mounted at ``mount_point``."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    return os.path.normpath(os.path.join(mount_point, path.lstrip("/")))


def cgroups_path(name, proc_cgroup=None, v2=None):
    """The ``linux.cgroupsPath`` of the sandbox of step cgroup ``name`` (see the module docstring).

    ``proc_cgroup``: text of the caller's /proc/self/cgroup (read when None);
    ``v2``: the hierarchy kind (detected when None).
    """
    v2 = is_v2() if v2 is None else v2
    if not v2:
        return "%s/%s" % (name, LEAF)
    own = parse_proc_cgroup(proc_cgroup if proc_cgroup is not None else _read("/proc/self/cgroup")).get(frozenset(), "/")
    parent = os.path.dirname(own.rstrip("/")) or "/"
    return os.path.join(parent, name, LEAF)


def accounting(path, proc_cgroup=None, mountinfo=None, v2=None):
    """Where the step cgroup of sandbox cgroup ``path`` (from :func:`cgroups_path`) lives on this node -> dict.

    ``{"cgroups_path", "name" (the step cgroup's name), "version" (1 or 2), "file" (the step cgroup's
    CPU-time file: v1 cpuacct.usage in ns, v2 cpu.stat with usage_usec), "dirs" (the step cgroup in every
    hierarchy)}``, resolved against the calling process's cgroups (runsc's parent: call it in the
    supervisor), or None when ``path`` is empty or not of that form, or no hierarchy accounts CPU time.
    """
    if not path or os.path.basename(path) != LEAF:
        return None
    step_path = os.path.dirname(path)
    v2 = is_v2() if v2 is None else v2
    own = parse_proc_cgroup(proc_cgroup if proc_cgroup is not None else _read("/proc/self/cgroup"))
    mounts = parse_mountinfo(mountinfo if mountinfo is not None else _read("/proc/self/mountinfo"))
    dirs, accounting_file = [], None
    for fstype, root, point, opts in mounts:
        if (fstype == "cgroup2") != v2:
            continue
        if v2:
            base = "/"
        else:
            key = next((k for k in own if k and k <= opts), None)
            if key is None:
                continue
            base = own[key]
        directory = _under_mount(point, root, step_path if step_path.startswith("/") else
                                 os.path.join(base, step_path))
        if directory in dirs:
            continue
        dirs.append(directory)
        if v2 and accounting_file is None:
            accounting_file = os.path.join(directory, "cpu.stat")
        elif not v2 and "cpuacct" in opts and accounting_file is None:
            accounting_file = os.path.join(directory, "cpuacct.usage")
    if accounting_file is None:
        return None
    return {"cgroups_path": path, "name": os.path.basename(step_path), "version": 2 if v2 else 1,
            "file": accounting_file, "dirs": sorted(dirs)}


def prepare(account):
    """Create the step cgroup that holds the CPU-time file of ``account`` (from :func:`accounting`), mode 0755,
    so the job's user can read that file once runsc has put the sandbox below it. Raises OSError."""
    directory = os.path.dirname(account["file"])
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        pass
    os.chmod(directory, 0o755)  # mkdir's mode is cut by the supervisor's umask 077


def remove(dirs, name, timeout=5.0):
    """Remove the step cgroup directories ``dirs`` (from :func:`accounting`) that are left; best effort.

    Only directories under /sys/fs/cgroup whose last component is ``name`` (the
    step's :func:`cgroup_name`) are touched, with their child cgroups, deepest
    first; processes still in one (a sandbox whose runsc died) get SIGKILL.
    Returns the directories that could not be removed within ``timeout`` seconds.
    """
    wanted = []
    for directory in dirs or ():
        real = os.path.realpath(str(directory))
        if real.startswith(CGROUP_ROOT + "/") and os.path.basename(real) == name and os.path.isdir(real):
            wanted.append(real)
    deadline = time.monotonic() + timeout
    left = wanted
    while left:
        left = [d for d in left if not _remove_tree(d)]
        if not left or time.monotonic() > deadline:
            break
        for directory in left:
            _kill_members(directory)
        time.sleep(0.05)  # the kernel frees a cgroup only after its last task has exited; nothing to wait on
    return left


def _remove_tree(directory):
    """rmdir ``directory`` and any child cgroups (deepest first); True when it is gone."""
    for current, subdirs, _files in os.walk(directory, topdown=False):
        for sub in subdirs:
            try:
                os.rmdir(os.path.join(current, sub))
            except OSError:
                pass
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _kill_members(directory):
    for current, _subdirs, files in os.walk(directory):
        if "cgroup.procs" not in files:
            continue
        try:
            pids = [int(p) for p in _read(os.path.join(current, "cgroup.procs")).split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
