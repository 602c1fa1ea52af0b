"""Doctor checks of the node's devices: gres.conf device files, NVML, AMD SMI,
RDMA ports and permission to set GPU clocks.

A vendor counts as configured for the node when the site configuration's
node group or gres.conf says so. Missing libraries or hardware of a vendor
that is not configured is "not-present", never a failure; of a configured
one it is a failure.
"""

import os
import re
import stat

from slurmbox.doctor.hardware import FAILED, MISSING, OK
from slurmbox.doctor.report import FAIL, NOT_PRESENT, PASS, WARN, Check

GROUP = "devices"


def check_devices(ctx):
    """[Check] of this node's devices (see module doc)."""
    return [check_gres(ctx), check_vendor(ctx, "nvidia", "devices.nvml", ctx.nvidia),
            check_vendor(ctx, "amd", "devices.amdsmi", ctx.amd), check_rdma(ctx), check_clocks(ctx)]


def _char_device(path):
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def check_gres(ctx):
    """Every File= of gres.conf for this node exists as a character device; counts agree with the site."""
    name, group = ctx.node_group()
    expected = group is not None and group.vendor and group.count
    files = [f for line in ctx.gres or [] for f in line.files]
    if not files:
        summary = ("no gres.conf at %s" % ctx.gres_conf if ctx.gres is None
                   else "gres.conf has no device files for node %s" % ctx.node)
        if expected:  # the site gives this node accelerators that Slurm would never hand out
            return Check("devices.gres", GROUP, FAIL, "%s, but node group %s of the site configuration has %d %s "
                         "accelerators" % (summary, name, group.count, group.vendor),
                         "deploy the gres.conf that `slurmbox config render` writes to %s" % ctx.gres_conf)
        return Check("devices.gres", GROUP, NOT_PRESENT, summary,
                     "none, unless this node has accelerators: then deploy the gres.conf from "
                     "`slurmbox config render`")
    missing = [f for f in files if not _char_device(f)]
    if missing:
        return Check("devices.gres", GROUP, FAIL, "%d of %d gres.conf device files are missing or not character "
                     "devices: %s" % (len(missing), len(files), ", ".join(missing[:8])),
                     "load the accelerator driver (device nodes appear with it) or fix File= in %s" % ctx.gres_conf)
    if group is not None and group.count and len(files) != group.count:
        return Check("devices.gres", GROUP, FAIL, "gres.conf lists %d device files for %s but the site "
                     "configuration says %d" % (len(files), ctx.node, group.count),
                     "render gres.conf again from the site configuration and deploy it")
    return Check("devices.gres", GROUP, PASS, "%d device files of gres.conf present: %s"
                 % (len(files), ", ".join(os.path.basename(f) for f in files)))


_LIBRARY_HINT = {
    "nvidia": ("pip install nvidia-ml-py into slurmbox's virtual environment (extra slurmbox[nvidia])",
               "load the NVIDIA driver: `nvidia-smi` must list the GPUs"),
    "amd": ("install ROCm's amdsmi Python package into slurmbox's virtual environment (extra slurmbox[amd])",
            "load the amdgpu driver: `amd-smi list` must list the GPUs"),
}


def _gres_files(ctx, vendor):
    from slurmbox.sandbox.devices import vendor_of
    return [f for line in ctx.gres or [] for f in line.files if vendor_of(f) == vendor]


def check_vendor(ctx, vendor, check_id, probe):
    """NVML (vendor "nvidia") or AMD SMI ("amd") against what is configured for the node."""
    configured = vendor in ctx.vendors
    install, load = _LIBRARY_HINT[vendor]
    if probe is None or probe.state == MISSING:
        detail = probe.detail if probe is not None else "%s library not probed" % vendor
        if configured:
            return Check(check_id, GROUP, FAIL, "%s GPUs are configured for %s but %s" % (vendor, ctx.node, detail),
                         install)
        return Check(check_id, GROUP, NOT_PRESENT, "no %s GPUs configured; %s" % (vendor, detail))
    if probe.state == FAILED:
        if configured:
            return Check(check_id, GROUP, FAIL, "%s GPUs are configured but %s" % (vendor, probe.detail), load)
        return Check(check_id, GROUP, NOT_PRESENT, "no %s GPUs here (%s)" % (vendor, probe.detail))
    names = sorted({d.name for d in probe.devices})
    found = "%d x %s, driver %s" % (len(probe.devices), "/".join(names) or "?", probe.driver_version or "?")
    if not probe.devices:
        if configured:
            return Check(check_id, GROUP, FAIL, "%s GPUs are configured but %s sees none" % (vendor, probe.library),
                         load)
        return Check(check_id, GROUP, NOT_PRESENT, "%s sees no %s GPUs" % (probe.library, vendor))
    if not configured:
        return Check(check_id, GROUP, WARN, "%s present but not configured for %s in gres.conf or the site "
                     "configuration" % (found, ctx.node),
                     "add a node group for this node and render gres.conf, or the GPUs stay unused")
    gres = _gres_files(ctx, vendor)
    if gres and len(gres) != len(probe.devices):
        return Check(check_id, GROUP, FAIL, "%s, but gres.conf lists %d device files" % (found, len(gres)),
                     "make the node group's count and devices match the hardware and render gres.conf again")
    if vendor == "nvidia" and gres:
        listed = {int(m.group(1)) for m in (re.search(r"nvidia(\d+)$", f) for f in gres) if m}
        seen = {d.minor for d in probe.devices}
        if listed != seen:
            return Check(check_id, GROUP, FAIL, "%s; gres.conf names minors %s but NVML reports %s"
                         % (found, sorted(listed), sorted(seen)),
                         "fix File= in gres.conf so each /dev/nvidiaN is a GPU NVML reports")
    return Check(check_id, GROUP, PASS, found)


def check_rdma(ctx):
    """RDMA ports through pyverbs: state and link layer (InfiniBand, or Ethernet = RoCE)."""
    probe = ctx.rdma
    if probe is None or probe.state == MISSING:
        return Check("devices.rdma", GROUP, NOT_PRESENT, (probe.detail if probe else "pyverbs not probed"),
                     "none without RDMA NICs; with them, apt-get install python3-pyverbs so doctor can check them")
    if not probe.ports:
        if probe.state == FAILED and not probe.detail.startswith("no RDMA devices"):
            return Check("devices.rdma", GROUP, FAIL, probe.detail,
                         "check the RDMA driver (`ibv_devinfo` must list the devices)")
        return Check("devices.rdma", GROUP, NOT_PRESENT, probe.detail or "no RDMA devices")
    described = ", ".join("%s/%d %s %s" % (p.device, p.port, p.state, p.link_layer) for p in probe.ports)
    down = [p for p in probe.ports if p.state != "ACTIVE"]
    if probe.state == FAILED:
        return Check("devices.rdma", GROUP, FAIL, "%s; %s" % (probe.detail, described),
                     "check the RDMA driver (`ibv_devinfo` must list the devices)")
    if len(down) == len(probe.ports):
        return Check("devices.rdma", GROUP, FAIL, "no RDMA port is ACTIVE: %s" % described,
                     "check cables and the subnet manager (InfiniBand) or the switch port (RoCE); `ibstat`")
    if down:
        return Check("devices.rdma", GROUP, WARN, "%d of %d RDMA ports are not ACTIVE: %s"
                     % (len(down), len(probe.ports), described),
                     "bring the inactive ports up or exclude them (NCCL_IB_HCA) so jobs do not pick them")
    return Check("devices.rdma", GROUP, PASS, described)


def check_clocks(ctx):
    """Whether slurmbox (this user) may set GPU clocks, as clock_policy: locked needs."""
    locked = ctx.site is not None and ctx.site.measurement.clock_policy == "locked"
    gpus = [p for p in (ctx.nvidia, ctx.amd) if p is not None and p.state == OK and p.devices]
    if not gpus:
        return Check("devices.gpu-clocks", GROUP, NOT_PRESENT, "no GPUs to set clocks on")
    if ctx.euid == 0:
        return Check("devices.gpu-clocks", GROUP, PASS, "running as root: GPU clocks can be locked%s"
                     % (" (clock_policy: locked)" if locked else ""))
    nvidia = ctx.nvidia if ctx.nvidia is not None and ctx.nvidia.state == OK and ctx.nvidia.devices else None
    if nvidia is not None and nvidia.clocks_restricted is False:
        return Check("devices.gpu-clocks", GROUP, PASS, "NVIDIA application clocks are not restricted to root")
    return Check("devices.gpu-clocks", GROUP, FAIL if locked else WARN,
                 "only root may set GPU clocks here%s" % (" but the site asks for clock_policy: locked"
                                                          if locked else ""),
                 "run doctor and the measuring harness's clock setup as root, or allow it with "
                 "`nvidia-smi -acp UNRESTRICTED`")
