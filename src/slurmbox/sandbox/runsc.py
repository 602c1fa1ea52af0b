"""The installed runsc (gVisor): where it is, what it supports, how to call it.

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
    listing = subprocess.run([runsc, "flags"], capture_output=True, text=True, check=False)
    flags = sorted(set(re.findall(r"^\s+-([a-z0-9][a-z0-9_-]*)", listing.stdout + listing.stderr, re.M)))
    version = subprocess.run([runsc, "--version"], capture_output=True, text=True, check=False).stdout
    first = version.splitlines()[0] if version else "unknown"
    platforms = subprocess.run([runsc, "help", "platforms"], capture_output=True, text=True, check=False).stdout
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
