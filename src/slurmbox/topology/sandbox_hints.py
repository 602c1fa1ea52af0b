"""What a sandboxed step gets from the node's topology: the NCCL topology XML bind-mounted
read-only, and the NCCL variables pointing at it.

Inside gVisor ``/sys/bus/pci`` is not visible, so NCCL cannot discover the PCI tree and
pairs GPUs with NICs blindly. An admin writes each node's file once::

    slurmbox topology generate --format nccl-xml --local \\
        --out /etc/slurmbox/topology/$(hostname -s)/nccl-topo.xml

The file is looked up next to the site configuration (``<site dir>/topology/<node>/
nccl-topo.xml``, then ``<site dir>/topology/nccl-topo.xml`` for nodes that are all alike).
It is used only when it is a regular file owned by root and writable by nobody else (it
reaches every job on the node); otherwise it is ignored with a warning on stderr.

The step's own ``NCCL_*`` variables win: a user who sets NCCL_TOPO_FILE or NCCL_IB_HCA
keeps them. Stdlib only (runs in the supervisor on every step start).
"""

import os
import stat
import sys

TOPO_MOUNT = "/run/nccl-topo.xml"
IMAGE_TOPO_MOUNT = "/tmp/nccl-topo.xml"
FILE_NAME = "nccl-topo.xml"


def hints_path(site_config, node):
    """The node's NCCL topology XML path, or None when there is none."""
    base = os.path.join(os.path.dirname(site_config) if site_config else "/etc/slurmbox", "topology")
    for path in (os.path.join(base, node, FILE_NAME), os.path.join(base, FILE_NAME)):
        if os.path.lexists(path):
            return path
    return None


def _safe(path):
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022


def _step_gpus(env):
    text = env.get("SLURM_STEP_GPUS") or ""  # set by slurmstepd; a user-set SLURM_JOB_GPUS is never used
    try:
        return [int(x) for x in text.split(",") if x.strip()] or None
    except ValueError:
        return None


def destination(request=None):
    """Where the file appears inside: TOPO_MOUNT with the host root as image (``/run`` is a
    private tmpfs there), IMAGE_TOPO_MOUNT with a custom image (the private ``/tmp`` tmpfs
    exists in every sandbox; a custom image may lack ``/run``). None when one of the
    step's own mounts covers that directory: the mount point would be created in the
    user's host directory, so the file is not mounted."""
    dest = TOPO_MOUNT if request is None or request.image is None else IMAGE_TOPO_MOUNT
    parent = os.path.dirname(dest)
    for mount in getattr(request, "mounts", None) or ():
        target = os.path.normpath(mount.destination)
        if parent == target or parent.startswith(target.rstrip("/") + "/"):
            return None
    return dest


def for_step(site_config, node, env, request=None):
    """(mounts, variables) for one step: ``mounts`` a list of sandbox.options.Mount
    (read-only bind of the node's XML, see :func:`destination`), ``variables`` the NCCL
    variables the step's environment ``env`` does not already set. ``request``: the step's
    options.SandboxRequest (image, mounts). ([], {}) when the node has no file."""
    path = hints_path(site_config, node)
    if path is None:
        return [], {}
    dest = destination(request)
    if dest is None:
        sys.stderr.write("slurmbox: note: %s not mounted: the step mounts its own directory over %s\n"
                         % (path, os.path.dirname(TOPO_MOUNT if request.image is None else IMAGE_TOPO_MOUNT)))
        return [], {}
    if not _safe(path):
        sys.stderr.write("slurmbox: warning: ignoring %s: not a regular file owned by root and writable only by "
                         "root\n" % path)
        return [], {}
    from slurmbox.sandbox.options import Mount

    variables = {"NCCL_TOPO_FILE": dest}
    try:
        from . import nccl_hints, nccl_xml
        node_topo = nccl_xml.read(path, node)
        variables.update(nccl_hints.step_hints(node_topo, _step_gpus(env)))
    except Exception as err:  # a bad file must not stop the step; NCCL still gets the file
        sys.stderr.write("slurmbox: warning: %s: no NCCL hints derived (%s)\n" % (path, err))
    variables = {k: v for k, v in variables.items() if k not in env}
    return [Mount(path, dest, True)], variables
