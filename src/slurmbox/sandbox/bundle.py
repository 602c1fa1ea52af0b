"""Build the OCI runtime bundle (config.json) of a step's sandbox.

Format: OCI runtime-spec 1.0 (github.com/opencontainers/runtime-spec,
config.md and config-linux.md). The sandbox root is the requested image
directory, or the host root read-only with private areas masked by empty
tmpfs mounts so host paths that were not mounted are not visible.
"""

import os
import pwd
import resource
import stat

#: Host directories hidden (empty tmpfs) when the host root is the image.
#: OCI annotation listing the host paths of the sandbox's devices (comma-separated).
DEVICES_ANNOTATION = "org.slurmbox.devices"
MASKED_HOST_DIRS = ("/root", "/home", "/tmp", "/var/tmp", "/run", "/var/run", "/var/spool", "/var/lib",
                    "/var/log", "/var/mail", "/etc/munge", "/etc/slurm", "/srv", "/mnt", "/media", "/opt",
                    "/work", "/boot", "/lost+found")
_RLIMITS = (("RLIMIT_NOFILE", resource.RLIMIT_NOFILE), ("RLIMIT_NPROC", resource.RLIMIT_NPROC),
            ("RLIMIT_STACK", resource.RLIMIT_STACK), ("RLIMIT_CORE", resource.RLIMIT_CORE),
            ("RLIMIT_MEMLOCK", resource.RLIMIT_MEMLOCK), ("RLIMIT_AS", resource.RLIMIT_AS))
#: Variables of the launcher/shim that must not reach the sandboxed program.
INTERNAL_VARIABLES = ("SLURMBOX_SUPERVISOR_SOCKET", "SLURMBOX_TASK_ARGV0")


class CommandNotFound(LookupError):
    """argv[0] does not resolve to an executable inside the sandbox root."""


def _inside(root, path):
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


def resolve_command(argv0, env_path, root, cwd):
    """Resolve ``argv0`` against ``env_path`` (PATH) inside sandbox ``root``.

    Returns the absolute in-sandbox path. Names containing ``/`` are taken
    relative to ``cwd``. Raises CommandNotFound. Symlinks inside an image are
    judged by the host's view of the image directory, which is read-only.
    """
    candidates = [argv0 if argv0.startswith("/") else os.path.join(cwd, argv0)] if "/" in argv0 else \
        [os.path.join(d or ".", argv0) for d in (env_path or "/usr/bin:/bin").split(":")]
    for candidate in candidates:
        host = _inside(root, candidate)
        try:
            info = os.stat(host)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o111:
            return os.path.normpath(candidate)
    raise CommandNotFound(argv0)


def user_identity(uid, gid):
    """``(uid, gid, supplementary gids)`` of the job user from the node's user database."""
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = sorted(set(os.getgrouplist(name, gid)) - {gid})
    except KeyError:
        groups = []
    return uid, gid, groups


def process_rlimits(pid):
    """The rlimits of process ``pid`` (the task's launcher) as OCI ``process.rlimits``."""
    limits = []
    for name, which in _RLIMITS:
        try:
            soft, hard = resource.prlimit(pid, which)
        except OSError:
            soft, hard = resource.getrlimit(which)
        maximum = 2 ** 64 - 1
        limits.append({"type": name, "soft": maximum if soft < 0 else soft, "hard": maximum if hard < 0 else hard})
    return limits


def process_spec(argv, env, cwd, uid, gid, groups, tty, rlimits):
    """OCI ``process`` object. ``env``: dict; returns a dict."""
    return {
        "terminal": bool(tty),
        "user": {"uid": uid, "gid": gid, "additionalGids": list(groups)},
        "args": list(argv),
        "env": ["%s=%s" % kv for kv in sorted(env.items()) if kv[0] not in INTERNAL_VARIABLES],
        "cwd": cwd,
        "rlimits": rlimits,
        "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
        "noNewPrivileges": True,
    }


def build_spec(process, request, hostname, bind_dirs, devices, extra_mounts=(), network=None):
    """The OCI config.json dict for a step sandbox.

    ``process``: from process_spec; ``request``: options.SandboxRequest;
    ``bind_dirs``: binds before the user's, e.g. the working directory: a
    str (read-write, host path == sandbox path) or an options.Mount; ``devices``: list of devices.Device;
    ``extra_mounts``: slurmbox's own binds (options.Mount) after the user's;
    ``network``: runsc network mode (default: the request's).
    """
    host_root = request.image is None
    network = network or request.network
    # --network=host shares the node's network namespace; otherwise a new, empty one.
    namespaces = ("pid", "ipc", "uts", "mount") if network == "host" else ("pid", "network", "ipc", "uts", "mount")
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    if host_root:
        for directory in MASKED_HOST_DIRS:
            if os.path.isdir(directory) and not os.path.islink(directory):
                mounts.append({"destination": directory, "type": "tmpfs", "source": "tmpfs",
                               "options": ["nosuid", "nodev", "mode=755"]})
    mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
    for bind in bind_dirs:
        if isinstance(bind, str):
            mounts.append({"destination": bind, "type": "bind", "source": bind, "options": ["rbind", "rw"]})
        else:
            mounts.append({"destination": bind.destination, "type": "bind", "source": bind.source,
                           "options": ["rbind", "ro" if bind.read_only else "rw"]})
    for mount in list(request.mounts) + list(extra_mounts):
        mounts.append({"destination": mount.destination, "type": "bind", "source": mount.source,
                       "options": ["rbind", "ro" if mount.read_only else "rw"]})
    return {
        "ociVersion": "1.0.2",
        "process": process,
        "root": {"path": getattr(request, "image_bind", None) or request.image or "/", "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in namespaces],
            "devices": [{"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor,
                         "fileMode": 0o666, "uid": 0, "gid": 0} for d in devices],
            "resources": {"devices": [{"allow": False, "access": "rwm"}] + [
                {"allow": True, "type": d.kind, "major": d.major, "minor": d.minor, "access": "rwm"}
                for d in devices]},
        },
        "annotations": {DEVICES_ANNOTATION: ",".join(d.host_path for d in devices)},
    }


def apply_profile_limits(spec, profile):
    """Put a profile's resource limits into ``spec`` (OCI config dict, changed in place).

    ``profile.memory_limit_mb`` (MB, 0 = none) becomes ``linux.resources.memory.limit``
    in bytes and ``profile.pids_limit`` (0 = none) ``linux.resources.pids.limit``
    (OCI runtime spec, config-linux.md "Memory" and "PIDs"); runsc applies both
    to the cgroup holding the whole sandbox, so a sandbox over its memory limit
    is killed as a whole. The wall limit is the supervisor's to enforce.
    """
    resources = spec.setdefault("linux", {}).setdefault("resources", {})
    if getattr(profile, "memory_limit_mb", 0):
        resources["memory"] = {"limit": profile.memory_limit_mb * 1024 * 1024}
    if getattr(profile, "pids_limit", 0):
        resources["pids"] = {"limit": profile.pids_limit}
    return spec


def apply_step_cgroup(spec, job, step, node, runtime_dir, create=True):
    """Put the sandbox of step ``job``.``step`` on ``node`` in its own cgroup (``spec`` changed in place).

    Sets ``linux.cgroupsPath`` (OCI runtime spec, config-linux.md "Control
    groups") to sandbox/step_cgroup.cgroups_path: runsc then applies the
    profile's ``linux.resources`` there and removes it when the sandbox ends;
    the kernel accounts the whole sandbox's CPU time in the step cgroup above
    it (the record's ``cpu_accounting``). With ``create`` (not for a dry run)
    the step cgroup is created, readable by everyone (step_cgroup.prepare);
    the step's cleanup removes it. ``runtime_dir``: slurmbox's runtime
    directory (part of the name). Where the node's cgroup tree cannot be
    written (e.g. a read-only /sys/fs/cgroup), the sandbox runs without a
    cgroup of its own, as runsc does without a cgroupsPath, and the message
    is returned. Returns None when the cgroup is set up.
    """
    from slurmbox.sandbox import step_cgroup

    linux = spec.setdefault("linux", {})
    try:
        path = step_cgroup.cgroups_path(step_cgroup.cgroup_name(job, step, node, runtime_dir))
        account = step_cgroup.accounting(path) if create else None
        if account is not None:
            step_cgroup.prepare(account)
    except OSError as err:
        linux.pop("cgroupsPath", None)
        return "the sandbox has no cgroup of its own (no kernel CPU accounting for it): %s" % err
    linux["cgroupsPath"] = path
    return None


def mount_point_problem(root, destination, source_is_dir):
    """Why bind destination ``destination`` cannot be used in sandbox root ``root``, or None.

    runsc's gofer runs as root and creates a missing bind destination on the
    root file system it serves: with the host root as image that is the
    node's own ``/`` (``/etc/probe``, ``/x/sub/deeper`` were left behind), and
    with a custom image the user's image directory. So a destination must
    already exist in ``root`` as the same kind of file as the source (a
    directory for a directory), reached without any symlink: then runsc
    creates nothing. ``root``: host path of the sandbox root; ``destination``:
    absolute, normalised.
    """
    current = root.rstrip("/") or "/"
    parts = [p for p in destination.split("/") if p]
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except OSError:
            return ("%s does not exist in the sandbox's root file system, and slurmbox never creates mount points "
                    "on the node; mount at an existing %s (e.g. /mnt)%s"
                    % ("/" + "/".join(parts[:index + 1]), "directory" if source_is_dir else "file",
                       "" if root == "/" else " or create it in the image"))
        if stat.S_ISLNK(info.st_mode):
            return ("%s is a symbolic link in the sandbox's root file system; give the path it points to"
                    % ("/" + "/".join(parts[:index + 1])))
    if source_is_dir != stat.S_ISDIR(info.st_mode):
        return "%s is %s in the sandbox's root file system, but the source is %s" % (
            destination, "a directory" if stat.S_ISDIR(info.st_mode) else "not a directory",
            "a directory" if source_is_dir else "not a directory")
    return None


def path_reachable(path, uid, gids, write=False):
    """True when ``uid`` (with groups ``gids``) may reach ``path`` by the mode bits.

    Every ancestor directory needs search (x) permission and the path itself
    read (and, with ``write``, write) permission. Used so a root-run bind
    mount never exposes what the user could not open on the host.
    """
    if uid == 0:
        return True
    path = os.path.realpath(path)
    parts = path.split("/")
    checks = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
    for directory in checks:
        if not _allowed(directory, uid, gids, 0o1):
            return False
    return _allowed(path, uid, gids, 0o4 | (0o2 if write else 0))


def _allowed(path, uid, gids, bits):
    try:
        info = os.stat(path)
    except OSError:
        return False
    if info.st_uid == uid:
        mode = (info.st_mode >> 6) & 7
    elif info.st_gid in gids:
        mode = (info.st_mode >> 3) & 7
    else:
        mode = info.st_mode & 7
    return mode & bits == bits


def home_of(uid):
    """Home directory of ``uid`` or None."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None
