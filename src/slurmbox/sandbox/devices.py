"""Map the accelerators Slurm allocated to a step onto sandbox devices.

Only devices of the step's allocation become visible inside: the gres indices
slurmstepd sets for the step (``SLURM_STEP_GPUS``) are intersected with the
job's allocation on this node as slurmctld records it (structured:
slurmbox.slurm_client.job_facts), and indices are mapped to
device files through this node's ``gres.conf`` ``File=`` entries
(gres.conf(5)). Per vendor:

- NVIDIA: ``/dev/nvidiaN`` plus ``nvidiactl``, ``nvidia-uvm``,
  ``nvidia-uvm-tools`` from the same directory; needs runsc ``--nvproxy``.
- AMD: ``/dev/kfd`` and the allocated ``/dev/dri/renderD*``; gVisor has no AMD
  proxy, so only a profile with ``allow_unproxied_devices`` accepts them.
- TPU: ``/dev/accel*`` (and ``/dev/vfio/*``); needs runsc ``--tpuproxy``.
- Trainium: ``/dev/neuron*``; no gVisor proxy (same rule as AMD).
"""

import os
import re
import stat
from dataclasses import dataclass, field

from slurmbox.slurm_client.job_facts import MAX_INDEX, parse_index_list  # noqa: F401 (re-exported)

_VENDOR_PATTERNS = (
    ("nvidia", re.compile(r"^nvidia\d+$")),
    ("amd", re.compile(r"^renderD\d+$")),
    ("tpu", re.compile(r"^(accel\d+|vfio\d+)$")),
    ("trainium", re.compile(r"^neuron\d+$")),
)
_VISIBLE_VARIABLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES",
                     "tpu": "TPU_VISIBLE_CHIPS", "trainium": "NEURON_RT_VISIBLE_CORES"}
_PROXY_FLAG = {"nvidia": "nvproxy", "tpu": "tpuproxy"}


class DeviceError(RuntimeError):
    """The allocated devices cannot be given to the sandbox; the message says why and what to do."""


@dataclass
class Device:
    """One device node: ``host_path`` on the node, ``path`` inside, char/block ``kind``, major, minor."""

    host_path: str
    path: str
    kind: str
    major: int
    minor: int


@dataclass
class DevicePlan:
    """Devices for the OCI spec, runsc flags they need, and environment to set inside."""

    vendor: str = None
    devices: list = field(default_factory=list)
    runsc_flags: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


def _problem(plan, strict, message):
    if strict:
        raise DeviceError(message)
    plan.problems.append(message)


def vendor_of(path):
    """Vendor name of a device file path (by its base name), or None."""
    base = os.path.basename(path)
    for vendor, pattern in _VENDOR_PATTERNS:
        if pattern.match(base):
            return vendor
    return None


def accelerators(plan, models=()):
    """``{"vendor": str, "count": int, "models": [str]}`` of the accelerators in ``plan`` (a DevicePlan), or None
    when it has none.

    Only the per-device files count (``nvidia0``, ``renderD128``, ...), not
    shared control nodes such as ``nvidiactl``. ``models``: the gres types
    Slurm allocated them as (job_facts.gpu_allocation; empty for untyped gres).
    Recorded in checkpoint manifests (slurmbox.migrate.restore.select_checkpoint).
    """
    count = sum(1 for d in plan.devices if vendor_of(d.host_path))
    if not plan.vendor or not count:
        return None
    return {"vendor": plan.vendor, "count": count, "models": sorted(set(models))}


def expand_hostlist_files(text):
    """Expand a gres.conf File= value such as ``/dev/nvidia[0-3,5]`` into paths."""
    match = re.match(r"^(.*)\[([0-9,\-]+)\](.*)$", text)
    if not match:
        return [p for p in text.split(",") if p]
    prefix, ranges, suffix = match.groups()
    paths = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            paths.append("%s%0*d%s" % (prefix, width, number, suffix))
    return paths


def _node_matches(spec, node):
    for name in expand_hostlist_files(spec):
        if name == node:
            return True
    return False


def gres_gpu_files(gres_conf_text, node):
    """Ordered GPU device files for ``node`` from gres.conf text (index order = gres index)."""
    files = []
    for raw in gres_conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if fields.get("Name") != "gpu" or "File" not in fields:
            continue
        if "NodeName" in fields and not _node_matches(fields["NodeName"], node):
            continue
        files.extend(expand_hostlist_files(fields["File"]))
    return files


#: More device indices than any node has; bounds what untrusted text may ask for.
MAX_DEVICE_INDEX = MAX_INDEX


def expand_node_list(text):
    """Expand a Slurm hostlist such as ``n[1-3],gpu7`` (one bracket per name)."""
    names = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        names.extend(expand_hostlist_files(item))
    return names


def _device(host_path, inside_path):
    info = os.stat(host_path)
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        raise DeviceError("%s is not a device node; check File= in gres.conf" % host_path)
    return Device(host_path, inside_path, kind, os.major(info.st_rdev), os.minor(info.st_rdev))


def plan_devices(device_files, runsc_flags_supported, allow_unproxied=False, strict=True):
    """Build the DevicePlan for the allocated ``device_files`` (host paths).

    ``runsc_flags_supported``: set of runsc flag names the installed runsc
    knows. Raises DeviceError when the vendor needs a proxy this runsc lacks,
    or has no gVisor proxy and the profile does not allow unproxied devices;
    with ``strict`` False (dry runs) those problems are listed in
    ``plan.problems`` instead, so the would-be bundle can still be shown.
    """
    plan = DevicePlan()
    if not device_files:
        return plan
    vendors = {vendor_of(path) for path in device_files}
    if None in vendors or len(vendors) != 1:
        raise DeviceError("cannot tell the accelerator vendor of %s; slurmbox knows nvidia*, renderD*, "
                          "accel*, neuron* device names" % ", ".join(device_files))
    vendor = vendors.pop()
    plan.vendor = vendor
    proxy = _PROXY_FLAG.get(vendor)
    if proxy:
        if proxy not in runsc_flags_supported:
            _problem(plan, strict, "the installed runsc has no --%s, so %s devices cannot be passed into a gVisor "
                              "sandbox; install a gVisor release with %s support or run this step without "
                              "accelerators" % (proxy, vendor, proxy))
        plan.runsc_flags.append("--%s" % proxy)
    elif not allow_unproxied:
        _problem(plan, strict, "gVisor has no %s device proxy; this sandbox profile does not allow the weaker "
                          "unproxied-device mode (allow_unproxied_devices in the site configuration)" % vendor)
    extra = []
    if vendor == "nvidia":
        directory = os.path.dirname(device_files[0])
        extra = [os.path.join(directory, n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    elif vendor == "amd":
        extra = [os.path.join(os.path.dirname(os.path.dirname(device_files[0])), "kfd")]
    for path in extra:
        if os.path.exists(path):
            plan.devices.append(_device(path, "/dev/" + os.path.basename(path)))
    for path in device_files:
        inside = "/dev/dri/" + os.path.basename(path) if vendor == "amd" else "/dev/" + os.path.basename(path)
        plan.devices.append(_device(path, inside))
    plan.env[_VISIBLE_VARIABLE[vendor]] = ",".join(str(i) for i in range(len(device_files)))
    return plan
