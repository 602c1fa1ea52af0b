"""Doctor checks of the sandbox runtime: runsc present, its version, a trivial
sandbox starting, and the device proxy the node's accelerators need.

gVisor facts used (gVisor documentation, "GPU support" and "TPU support"):
NVIDIA GPUs need runsc ``--nvproxy`` and a host driver version that the
runsc release supports exactly (newer runsc lists them with ``runsc nvproxy
list-supported-drivers``); TPUs need ``--tpuproxy``; AMD and Trainium
devices have no gVisor proxy.
"""

import os
import re
import shutil
import subprocess
import tempfile

from slurmbox.doctor.report import FAIL, NOT_PRESENT, PASS, WARN, Check
from slurmbox.sandbox import runsc

GROUP = "runtime"
#: Releases before this date lack systrap and have known bugs slurmbox works around (statx, tty).
OLD_RELEASE = 20230601
_PROXY = {"nvidia": "nvproxy", "tpu": "tpuproxy"}


def release_date(version):
    """YYYYMMDD int of a runsc version string ("0.0~20221219.0", "release-20240708.0"), or None."""
    match = re.search(r"(20\d{6})", version or "")
    return int(match.group(1)) if match else None


def check_runtime(ctx, runsc_path=None, caps=None):
    """[Check] for runsc on this node. ``runsc_path``/``caps`` override discovery (tests)."""
    checks = []
    if runsc_path is None:
        try:
            runsc_path = runsc.find_runsc()
        except runsc.RunscError as err:
            checks.append(Check("runsc.present", GROUP, FAIL, str(err),
                                "install gVisor: apt-get install runsc (or a gVisor release from gvisor.dev)"))
            for name in ("runsc.version", "runsc.sandbox-start", "runsc.device-proxy"):
                checks.append(Check(name, GROUP, FAIL, "runsc is missing", "install runsc first"))
            return checks
    checks.append(Check("runsc.present", GROUP, PASS, "runsc at %s" % runsc_path))
    scratch = tempfile.mkdtemp(prefix="slurmbox-doctor-")
    try:
        if caps is None:
            caps = runsc.capabilities(runsc_path, scratch)
        checks.append(_version(caps))
        checks.append(_sandbox_start(runsc_path, caps, scratch))
        checks.append(check_device_proxy(ctx, runsc_path, caps))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return checks


def _version(caps):
    version = caps.get("version", "unknown")
    date = release_date(version)
    if date is None:
        return Check("runsc.version", GROUP, WARN, "cannot tell the release of runsc version %r" % version,
                     "check `runsc --version`; slurmbox is tested with releases 20221219 and 2024")
    platforms = ", ".join(caps.get("platforms") or []) or "unknown"
    if date < OLD_RELEASE:
        return Check("runsc.version", GROUP, WARN,
                     "runsc release %d (platforms: %s) predates systrap and has known bugs (statx fails inside, "
                     "ptys have no name)" % (date, platforms),
                     "upgrade to a 2024 or newer gVisor release for speed (systrap) and GPU proxy support")
    return Check("runsc.version", GROUP, PASS, "runsc release %d (platforms: %s)" % (date, platforms))


def _sandbox_start(runsc_path, caps, scratch):
    from slurmbox.sandbox.runsc import RunscError, choose_platform

    try:
        platform = choose_platform("auto", caps)
    except RunscError as err:
        return Check("runsc.sandbox-start", GROUP, FAIL, str(err), "reinstall runsc")
    rootless = ["--rootless"] if os.geteuid() != 0 else []  # runsc do needs it when not root
    argv = [runsc_path, "--root", scratch, *rootless, "--network=none", "--platform=%s" % platform, "do",
            "/bin/true"]
    status, output = _runsc_status(argv, timeout=60)
    if status == 0:
        return Check("runsc.sandbox-start", GROUP, PASS, "a trivial sandbox started and exited 0 (platform %s)"
                     % platform)
    return Check("runsc.sandbox-start", GROUP, FAIL,
                 "`runsc do /bin/true` failed (exit %d): %s" % (status, output.splitlines()[-1] if output else ""),
                 "run `runsc --debug --debug-log=/tmp/runsc/ --platform=%s do true` as root and read the log"
                 % platform)


def _runsc_status(argv, timeout=20):
    """``(exit status, output)`` of a runsc command through sandbox.runsc.call; never raises."""
    try:
        proc = runsc.call(argv, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 126, "%s: %s" % (" ".join(argv), err)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def check_device_proxy(ctx, runsc_path, caps):
    """Check of the gVisor device proxy (and NVIDIA driver match) this node's accelerators need."""
    vendors = sorted(ctx.vendors)
    if not vendors:
        return Check("runsc.device-proxy", GROUP, NOT_PRESENT, "no accelerators are configured for node %s"
                     % ctx.node)
    flags = set(caps.get("flags") or [])
    problems, notes = [], []
    for vendor in vendors:
        proxy = _PROXY.get(vendor)
        if proxy is None:
            notes.append("%s: gVisor has no proxy; steps need a profile with allow_unproxied_devices" % vendor)
        elif proxy not in flags:
            problems.append("%s devices need runsc --%s, which runsc %s lacks" % (vendor, proxy, caps.get("version")))
        elif vendor == "nvidia":
            status, output = _runsc_status([runsc_path, "nvproxy", "list-supported-drivers"])
            driver = ctx.nvidia.driver_version if ctx.nvidia is not None else ""
            if status != 0:
                notes.append("nvproxy present; this runsc cannot list the driver versions it supports, and "
                             "nvproxy needs an exact match (host driver %s)" % (driver or "unknown"))
            elif driver and driver not in output.split():
                problems.append("host NVIDIA driver %s is not among the versions this runsc's nvproxy supports "
                                "(%s)" % (driver, ", ".join(output.split()[-5:])))
            else:
                notes.append("nvproxy supports host driver %s" % (driver or "(driver version unknown)"))
        else:
            notes.append("%s: runsc --%s available" % (vendor, proxy))
    if problems:
        return Check("runsc.device-proxy", GROUP, FAIL, "; ".join(problems + notes),
                     "install a gVisor release whose proxy supports this node's accelerators and driver")
    unproxied = [n for n in notes if "no proxy" in n or "cannot list" in n]
    if unproxied:
        return Check("runsc.device-proxy", GROUP, WARN, "; ".join(notes),
                     "check the driver against gVisor's nvproxy list, and that partitions on these nodes use a "
                     "profile with allow_unproxied_devices where gVisor has no proxy")
    return Check("runsc.device-proxy", GROUP, PASS, "; ".join(notes))
