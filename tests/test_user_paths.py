"""sandbox/user_paths.py: a user's bind sources are opened with the user's own permissions
and bound by descriptor, so renaming a path after the check changes nothing that is mounted.
Root only (it takes other users' file identities); the mount tests run in a child process
that enters its own mount namespace, so the node's mount table is never touched."""

import os
import pwd
import subprocess
import sys
import textwrap

import pytest

from slurmbox.sandbox import user_paths

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' file identities; run as root")


def _ids(name):
    entry = pwd.getpwnam(name)
    return entry.pw_uid, [entry.pw_gid]


@pytest.fixture
def tmp_path():
    """A directory every user may traverse (pytest's own base directory is root's 0700)."""
    import pathlib
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix="slurmbox-user-paths-", dir="/tmp")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def private_dir(tmp_path):
    """A 0644 file in a directory only sbxother may enter (another user's home, in the attack)."""
    uid, gids = _ids("sbxother")
    secret_dir = tmp_path / "other-home"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text("other user's data\n")
    os.chmod(secret_dir / "secret.txt", 0o644)
    os.chown(secret_dir, uid, gids[0])
    os.chmod(secret_dir, 0o700)
    os.chmod(tmp_path, 0o755)
    return secret_dir


def test_a_path_through_a_directory_the_user_cannot_enter_is_refused(private_dir):
    uid, gids = _ids("sbxuser")
    with pytest.raises(user_paths.UserPathError, match="cannot open"):
        user_paths.open_source(str(private_dir / "secret.txt"), uid, gids, write=False)
    fd, _ = user_paths.open_source(str(private_dir / "secret.txt"), *_ids("sbxother"), write=False)
    os.close(fd)


def test_a_symlink_the_user_planted_is_followed_with_the_users_permissions(private_dir, tmp_path):
    uid, gids = _ids("sbxuser")
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, uid, gids[0])
    os.symlink(str(private_dir), str(mine / "link"))
    with pytest.raises(user_paths.UserPathError):
        user_paths.open_source(str(mine / "link"), uid, gids, write=False)


def test_write_needs_the_users_write_permission(tmp_path):
    uid, gids = _ids("sbxuser")
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)
    fd, _ = user_paths.open_source(str(readable), uid, gids, write=False)
    os.close(fd)
    with pytest.raises(user_paths.UserPathError, match="may not write"):
        user_paths.open_source(str(readable), uid, gids, write=True)
    (readable / "f").write_text("x")
    os.chmod(readable / "f", 0o644)
    with pytest.raises(user_paths.UserPathError, match="may not write"):
        user_paths.open_source(str(readable / "f"), uid, gids, write=True)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_pipes_and_device_nodes_are_refused_without_being_opened(tmp_path, kind):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path, 0o666)  # opening it for reading would block: refused from O_PATH
    else:
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    with pytest.raises(user_paths.UserPathError, match="neither a directory nor a regular file"):
        user_paths.open_source(str(path), *_ids("sbxuser"), write=False)


def test_the_user_identity_is_only_the_helper_threads():
    uid, gids = _ids("sbxuser")
    with pytest.raises(PermissionError):
        user_paths.as_user(lambda: open("/etc/shadow").read(), uid, gids)
    with open("/etc/shadow") as handle:  # this thread is still root
        assert handle.read(1)


def test_enterable_as_user_answers_with_the_users_search_permission(private_dir):
    (private_dir / "sub").mkdir()
    assert user_paths.enterable_as_user(str(private_dir / "sub"), *_ids("sbxother"))
    assert not user_paths.enterable_as_user(str(private_dir / "sub"), *_ids("sbxuser"))
    assert not user_paths.enterable_as_user(str(private_dir), *_ids("sbxuser"))  # 0700: stat works, cd does not


STAGING_CHILD = textwrap.dedent("""
    import os, sys
    from slurmbox.sandbox import user_paths
    work, victim, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    user_paths.enter_private_mount_namespace()
    step = os.path.join(work, "step")
    os.mkdir(step, 0o700)
    source = os.path.join(work, "data")
    fd, _ = user_paths.open_source(source, uid, [gid], write=False)
    # The attack: after root's check, the user swaps the checked directory for a symlink.
    os.rename(source, os.path.join(work, "data.orig"))
    os.symlink(victim, source)
    staged = user_paths.Staging(step).stage(fd, read_only=True)
    os.close(fd)
    print(sorted(os.listdir(staged)))
    try:
        open(os.path.join(staged, "new"), "w")
        print("writable")
    except OSError:
        print("read-only")
    print(user_paths.remove_staging(step))
    print(os.path.exists(os.path.join(work, "data.orig", "mine.txt")))
""")


def test_a_staged_bind_keeps_what_was_checked_after_the_path_is_swapped(tmp_path, private_dir):
    uid, gids = _ids("sbxuser")
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, uid, gids[0])
    data = work / "data"
    data.mkdir()
    (data / "mine.txt").write_text("mine\n")
    os.chown(data, uid, gids[0])
    child = subprocess.run([sys.executable, "-c", STAGING_CHILD, str(work), str(private_dir), str(uid),
                            str(gids[0])], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    listing, writable, left, kept = child.stdout.splitlines()
    assert listing == "['mine.txt']"  # the checked directory, not the victim's
    assert writable == "read-only"
    assert left == "[]"
    assert kept == "True"  # removal never went into the user's files
    assert not (work / "step" / "mounts").exists() or not os.listdir(work / "step" / "mounts")


def test_the_opened_descriptor_tells_its_file_system_and_real_path(tmp_path):
    """What a symlink swap cannot fake: the kernel's answers about the opened inode."""
    os.symlink("/proc", str(tmp_path / "looks-harmless"))
    fd, _ = user_paths.open_source(str(tmp_path / "looks-harmless"), *_ids("sbxuser"), write=False)
    try:
        assert user_paths.pseudo_filesystem(fd) == "proc"
        assert user_paths.opened_path(fd) == "/proc"
    finally:
        os.close(fd)
    fd, _ = user_paths.open_source(str(tmp_path), *_ids("sbxuser"), write=False)
    try:
        assert user_paths.pseudo_filesystem(fd) is None
        assert user_paths.opened_path(fd) == str(tmp_path)
    finally:
        os.close(fd)
    sysfs = os.open("/sys", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert user_paths.pseudo_filesystem(sysfs) == "sysfs"
    finally:
        os.close(sysfs)


def test_magic_links_and_other_users_processes_are_not_a_way_in(private_dir):
    """/proc/PID/cwd of another user's process: the helper thread has no CAP_SYS_PTRACE and
    opens without magic links, so the user gets what their own open would give."""
    child = subprocess.Popen(["/usr/sbin/runuser", "-u", "sbxother", "--", "sleep", "60"], cwd=str(private_dir))
    try:
        import time
        deadline = time.monotonic() + 10
        sleeper = None
        while sleeper is None and time.monotonic() < deadline:  # runuser forks sleep: find it
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open("/proc/%s/cmdline" % pid, "rb") as handle:
                            if handle.read() == b"sleep\x0060\x00" and os.stat("/proc/" + pid).st_uid == \
                                    pwd.getpwnam("sbxother").pw_uid:
                                sleeper = pid
                    except OSError:
                        pass
        assert sleeper, "the sleeper did not start"
        for path in ("/proc/%s/cwd" % sleeper, "/proc/%s/root" % sleeper, "/proc/self/cwd", "/proc/self/fd/0"):
            with pytest.raises(user_paths.UserPathError):
                user_paths.open_source(path, *_ids("sbxuser"), write=False)
        assert user_paths.as_user(lambda: open("/proc/thread-self/status").read(), *_ids("sbxuser")).count("CapEff:\t0000000000000000") == 1
    finally:
        child.kill()
        child.wait()
