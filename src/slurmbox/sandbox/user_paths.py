"""Host paths a step's user names, opened as that user and bound where the user cannot change them.

Root-run code that checks a user's path and later hands the *path* to runsc
races the user: between the check and runsc's bind, the user can rename a
component (``renameat2(RENAME_EXCHANGE)`` of a directory and a symlink) and
root's gofer binds whatever the name then leads to, e.g. another user's file
under a 0700 home. So every user-named bind source (``--sandbox-mounts``,
``--sandbox-image``, the task's working directory) is:

1. opened by a fresh thread whose *file-system* credentials are the user's
   (``setfsuid``/``setfsgid`` and the ``setgroups`` system call, all per
   thread on Linux; glibc's ``setgroups`` wrapper would change every thread,
   so the raw system call is used). The kernel checks every path component
   with the user's permissions, exactly as the user's own ``open`` would;
   root's file capabilities leave that thread's effective set when its fsuid
   becomes non-zero (capabilities(7), "Effect of user ID changes");
2. checked on the descriptor (kind, device directories, write permission):
   a descriptor names one inode and cannot be renamed away;
3. bound (``mount --bind /proc/self/fd/N``) onto an entry of the step's
   root-only ``mounts/`` directory, inside the supervisor's own mount
   namespace (``enter_private_mount_namespace``), and runsc gets that path.

The staging mounts exist only in the supervisor's namespace (and the
sandbox's copies of it), so they vanish with the supervisor and runsc; the
host's view of ``mounts/`` holds only empty mount points. Removal never
recurses into a staging entry (``remove_staging``): a still-mounted entry
would lead into the user's files.
"""

import ctypes
import errno
import os
import platform
import stat
import threading

#: setgroups(2) and capset(2) system call numbers (Linux asm-generic/unistd.h and
#: arch/x86/entry/syscalls/syscall_64.tbl); openat2(2) is 437 on every architecture.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_SYS_OPENAT2 = 437
_LINUX_CAPABILITY_VERSION_3 = 0x20080522  # linux/capability.h
_RESOLVE_NO_MAGICLINKS = 0x02             # linux/openat2.h
_AT_FDCWD = -100
_CLONE_NEWNS = 0x00020000       # linux/sched.h
_MS_BIND = 4096                 # linux/mount.h
_MS_REC = 16384
_MS_SLAVE = 1 << 19
_MS_REMOUNT = 32
_MS_RDONLY = 1
_MNT_DETACH = 2
STAGING_SUBDIR = "mounts"

_libc = ctypes.CDLL(None, use_errno=True)


class UserPathError(ValueError):
    """The user's path cannot be used; the message says why (for the step's stderr)."""


def _errno_error(what):
    code = ctypes.get_errno()
    return OSError(code, "%s: %s" % (what, os.strerror(code)))


def as_user(function, uid, gids):
    """``function()`` run in a fresh thread with the file-system identity ``uid``/``gids``
    (``gids[0]``: primary group, the rest supplementary). Returns its result or raises what
    it raised. Only file permission checks change; the thread ends afterwards, so nothing
    else in the process ever runs with those credentials."""
    outcome = {}

    def run():
        try:
            groups = (ctypes.c_uint * max(len(gids), 1))(*gids)
            machine = platform.machine()
            if machine not in _SYS_SETGROUPS:
                raise OSError(errno.ENOSYS, "no setgroups system call number for %s" % machine)
            if _libc.syscall(ctypes.c_long(_SYS_SETGROUPS[machine]), ctypes.c_size_t(len(gids)), groups) != 0:
                raise _errno_error("setgroups")
            _libc.setfsgid(gids[0])
            _libc.setfsuid(uid)
            # setfs[ug]id report no errors; reading the value back is how to check (setfsuid(2)).
            if _libc.setfsuid(-1) != uid or _libc.setfsgid(-1) != gids[0]:
                raise OSError(errno.EPERM, "could not take the file-system identity of uid %d" % uid)
            _drop_capabilities(machine)
            outcome["value"] = function()
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="as-uid-%d" % uid)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(machine):
    """Empty this thread's capability sets (capset(2) acts on the calling thread only).
    setfsuid clears only the file capabilities; CAP_SYS_PTRACE would still let /proc/PID/cwd
    of another user's process resolve (the red team's probe)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.syscall(ctypes.c_long(_SYS_CAPSET[machine]), ctypes.byref(header), data) != 0:
        raise _errno_error("capset")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _open_no_magic_links(path, flags):
    """openat2(2) of ``path`` with RESOLVE_NO_MAGICLINKS: /proc/PID/{fd/N,cwd,root,exe} would jump
    to whatever that process holds, past every directory permission on the way. Raises OSError."""
    how = _OpenHow(flags, 0, _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def write_allowed(info, uid, gids):
    """Mode bits of ``info`` give ``uid``/``gids`` write permission (ACLs are not consulted: stricter)."""
    if info.st_uid == uid:
        return bool(info.st_mode & 0o200)
    if info.st_gid in gids:
        return bool(info.st_mode & 0o020)
    return bool(info.st_mode & 0o002)


def open_source(path, uid, gids, write):
    """Open the user's bind source ``path`` as the user; returns (fd, os.stat_result).

    Directories are opened ``O_RDONLY|O_DIRECTORY`` (the user needs read and
    search permission), regular files ``O_RDONLY`` or ``O_RDWR`` with
    ``write``; for a writable directory the mode bits on the opened inode must
    grant the user write. Device nodes, sockets and pipes are refused without
    being opened (``O_PATH`` first). Raises UserPathError.
    """
    def opened():
        try:
            probe = _open_no_magic_links(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as err:
            raise UserPathError("the job's user cannot open %s (%s)" % (path, err.strerror))
        try:
            info = os.fstat(probe)
            if stat.S_ISDIR(info.st_mode):
                flags = os.O_RDONLY | os.O_DIRECTORY
            elif stat.S_ISREG(info.st_mode):
                flags = os.O_RDWR if write else os.O_RDONLY
            else:
                raise UserPathError("%s is neither a directory nor a regular file (device nodes, sockets and "
                                    "pipes cannot be mounted)" % path)
            try:  # re-opening the same inode checks the user's permission on it
                fd = os.open("/proc/self/fd/%d" % probe, flags | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as err:
                raise UserPathError("the job's user may not %s %s (%s)"
                                    % ("write" if write else "read", path, err.strerror))
        finally:
            os.close(probe)
        return fd, os.fstat(fd)

    fd, info = as_user(opened, uid, gids)
    if write and stat.S_ISDIR(info.st_mode) and not write_allowed(info, uid, gids):
        os.close(fd)
        raise UserPathError("the job's user may not write %s" % path)
    return fd, info


#: statfs(2) f_type of kernel interface file systems (linux/magic.h): never bound, whatever the path says.
PSEUDO_FILESYSTEMS = {0x9fa0: "proc", 0x62656572: "sysfs", 0x1cd1: "devpts", 0x27e0eb: "cgroup",
                      0x63677270: "cgroup2", 0x73636673: "securityfs", 0x64626720: "debugfs",
                      0x74726163: "tracefs", 0xcafe4a11: "bpf", 0x19800202: "mqueue", 0x62656570: "configfs",
                      0x65735543: "fusectl", 0xde5e81e4: "efivarfs", 0x42494e4d: "binfmt_misc",
                      0x6165676c: "pstore", 0x958458f6: "hugetlbfs", 0x0187: "autofs", 0x1373: "devfs",
                      0x50495045: "pipefs", 0x534f434b: "sockfs", 0x6e736673: "nsfs"}


class _StatFs(ctypes.Structure):
    # struct statfs (bits/statfs.h, 64-bit Linux): only f_type is read; the rest is room.
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def pseudo_filesystem(fd):
    """Name of the kernel interface file system ``fd`` lies on (``proc``, ``sysfs``...), or None."""
    buf = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        raise _errno_error("fstatfs")
    return PSEUDO_FILESYSTEMS.get(buf.f_type & 0xffffffff)


def opened_path(fd):
    """The kernel's path of the file ``fd`` refers to (``/proc/self/fd/N``): what was really opened."""
    return os.readlink("/proc/self/fd/%d" % fd)


def enterable_as_user(path, uid, gids):
    """True when the user could ``cd`` into the directory ``path``: ``path/.`` resolves with
    the user's file identity (resolving a name inside a directory needs its search permission)."""
    def check():
        try:
            os.close(os.open(os.path.join(path, "."), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            return True
        except OSError:
            return False
    return as_user(check, uid, gids)


def enter_private_mount_namespace():
    """Move this (single-threaded) process into a new mount namespace that receives the
    node's later mounts but sends none back (``unshare(CLONE_NEWNS)``, then ``/`` made
    recursively a slave). Call before starting threads: unshare changes only the caller.
    Raises OSError."""
    if threading.active_count() != 1:
        raise OSError(errno.EINVAL, "enter_private_mount_namespace needs a single-threaded process")
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise _errno_error("unshare(CLONE_NEWNS)")
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        raise _errno_error("mount --make-rslave /")


class Staging:
    """The step's root-only ``<step_dir>/mounts`` directory and the binds made in it.

    ``stage(fd, read_only)`` returns the path runsc should mount. Raises OSError.
    """

    def __init__(self, step_dir):
        self.directory = os.path.join(step_dir, STAGING_SUBDIR)
        self.count = 0

    def stage(self, fd, read_only):
        """Bind the inode behind ``fd`` (from open_source) at a new entry; returns its path."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        target = os.path.join(self.directory, str(self.count))
        self.count += 1
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target, 0o700)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        source = ("/proc/self/fd/%d" % fd).encode()
        if _libc.mount(source, target.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            raise _errno_error("bind %s" % target)
        if read_only and _libc.mount(b"none", target.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) != 0:
            raise _errno_error("read-only remount of %s" % target)
        return target


def remove_staging(step_dir):
    """Detach and remove every entry of ``<step_dir>/mounts`` without ever descending into
    one (an entry still mounted here would lead into the user's files); then the directory.
    Returns the entries that could not be removed (list of str)."""
    directory = os.path.join(step_dir, STAGING_SUBDIR)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    left = []
    for name in names:
        path = os.path.join(directory, name)
        _libc.umount2(path.encode(), _MNT_DETACH)  # not mounted in this namespace: EINVAL, harmless
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)  # never rmtree: refuses a directory with anything in it
            else:
                os.unlink(path)
        except OSError:
            left.append(path)
    try:
        os.rmdir(directory)
    except OSError:
        pass
    return left
