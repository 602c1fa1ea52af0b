"""The installed runsc (gVisor): where it is, what it supports, and the one door through
which slurmbox runs it.

Every runsc command slurmbox starts goes through :func:`call` (waits, output
captured) or :func:`spawn` (a process the caller relays). Both give runsc
pipes, never the caller's stdio or ``/dev/null``: runsc re-owns the stdio
descriptors it is given to its own unprivileged user (seen with the Debian 12
build: it re-owned a job's output file and ``/dev/null``). A command is a
prefix (:func:`global_args`: binary and global flags) plus a verb and its
arguments (``runsc help``).

Supported flags are read from ``runsc flags`` (gVisor's own listing) and
cached per binary (path, size, mtime) so the step start path runs it once per
runsc install, not per step.
"""

import json
import os
import re
import shutil
import subprocess

RUNSC_STATE_SUBDIR = "runsc"


class RunscError(RuntimeError):
    """runsc is missing or failed; the message says which command and why."""


def find_runsc():
    """Absolute path of runsc on the fixed root PATH. Raises RunscError if absent."""
    path = shutil.which("runsc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if not path:
        raise RunscError("runsc (gVisor) is not installed on this node; install the 'runsc' package")
    return path


def call(argv, timeout=None, env=None, text=True):
    """Run the runsc command ``argv`` (list: prefix + verb + arguments) to its end; returns the
    subprocess.CompletedProcess (stdout/stderr captured, stdin an empty pipe, never raises for
    a non-zero status). Raises OSError when runsc cannot start, subprocess.TimeoutExpired."""
    return subprocess.run(argv, capture_output=True, text=text, env=env, timeout=timeout,
                          input="" if text else b"", check=False)


def spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_kwargs):
    """Start the runsc command ``argv`` and return its subprocess.Popen. The caller's own
    descriptors are never inherited as stdio: pipes by default, or the descriptors the caller
    chose for the sandbox (a relay's pipe or pty ends)."""
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, **popen_kwargs)


def kill(prefix, container, signal="KILL", all_processes=False, pid=None):
    """``runsc kill [--all|--pid PID] CONTAINER SIGNAL``; returns the CompletedProcess."""
    extra = ["--all"] if all_processes else (["--pid", str(pid)] if pid is not None else [])
    return call(list(prefix) + ["kill", *extra, container, str(signal)])


def delete(prefix, container):
    """``runsc delete --force CONTAINER``; returns the CompletedProcess."""
    return call(list(prefix) + ["delete", "--force", container])


def state(prefix, container, timeout=10):
    """runsc's ``state`` of ``container`` (dict: ``status``, ``pid``...) or None when runsc has none."""
    try:
        proc = call(list(prefix) + ["state", container], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return None


def help_text(binary, *words, env=None, timeout=15):
    """stdout and stderr of ``runsc WORDS...`` (e.g. ``checkpoint --help``, ``--version``,
    ``help platforms``) as one str; "" when runsc cannot run."""
    try:
        proc = call([binary, *words], env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def capabilities(runsc, cache_dir):
    """``{"version": str, "flags": [names], "platforms": [names]}`` for the runsc binary at ``runsc``."""
    info = os.stat(runsc)
    key = "%s:%d:%d" % (runsc, info.st_size, info.st_mtime_ns)
    cache = os.path.join(cache_dir, "runsc-capabilities.json")
    try:
        with open(cache) as handle:
            data = json.load(handle)
        if data.get("key") == key:
            return data
    except (OSError, ValueError):
        pass
    listing = help_text(runsc, "flags", timeout=None)
    flags = sorted(set(re.findall(r"^\s+-([a-z0-9][a-z0-9_-]*)", listing, re.M)))
    version = call([runsc, "--version"]).stdout
    first = version.splitlines()[0] if version else "unknown"
    platforms = call([runsc, "help", "platforms"]).stdout
    data = {"key": key, "version": first.replace("runsc version ", ""), "flags": flags,
            "platforms": [p.strip() for p in platforms.splitlines() if p.strip()]}
    os.makedirs(cache_dir, exist_ok=True)
    tmp = "%s.%d" % (cache, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, cache)
    return data


def global_args(runsc, state_root, platform, network, extra_flags=()):
    """The runsc command prefix: binary and global flags (runsc(8) ``runsc flags``)."""
    return [runsc, "--root", state_root, "--platform", platform, "--network", network, *extra_flags]


#: Preferred platforms when a profile says "auto": systrap (gVisor's default since
#: 2023) where this runsc has it, else ptrace. KVM needs /dev/kvm and is opt-in.
AUTO_PLATFORMS = ("systrap", "ptrace")


def choose_platform(requested, caps):
    """The runsc platform for a profile's ``requested`` one ("auto" or a name).

    Raises RunscError when the named platform is not in this runsc.
    """
    known = caps.get("platforms") or ["ptrace"]
    if requested == "auto":
        for name in AUTO_PLATFORMS:
            if name in known:
                return name
        return known[0]
    if requested not in known:
        raise RunscError("the site profile asks for runsc platform %r, which runsc %s does not have (it has: %s)"
                         % (requested, caps.get("version", "?"), ", ".join(known)))
    return requested
