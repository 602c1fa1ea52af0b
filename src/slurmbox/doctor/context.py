"""What the doctor knows about the node it checks, gathered once."""

import os
import socket
from dataclasses import dataclass, field

from slurmbox.settings import slurm_syntax

#: Fixed PATH for the tools the doctor runs (as the step supervisor uses).
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class GresLine:
    """One gres.conf line that applies to this node: ``name`` (gpu...), ``type`` and device ``files``."""

    name: str
    type: str
    files: list


@dataclass
class NodeContext:
    """Inputs of every check.

    ``node``: Slurm node name; ``slurm_conf``: slurm.conf path; ``site``: the
    validated SiteModel or None, ``site_source``/``site_problem``: where it
    came from / why it could not be loaded; ``gres_conf``: gres.conf path and
    ``gres``: its GresLine entries for this node (None when the file is
    missing); ``vendors``: accelerator vendors configured for this node (site
    node group and gres.conf device names); ``nvidia``/``amd``/``rdma``:
    hardware probes (slurmbox.doctor.hardware); ``runtime_dir``: slurmbox's
    runtime directory and ``plugstack_required``: its required_partitions=
    list, both from plugstack.conf (None when there is no slurmbox line).
    """

    node: str
    slurm_conf: str
    site: object = None
    site_source: str = ""
    site_problem: str = ""
    gres_conf: str = ""
    gres: list = None
    vendors: set = field(default_factory=set)
    nvidia: object = None
    amd: object = None
    rdma: object = None
    runtime_dir: str = "/run/slurmbox"
    plugstack_required: list = None
    euid: int = field(default_factory=os.geteuid)

    def node_group(self):
        """(name, NodeGroupModel) of the site's group holding this node, or (None, None)."""
        if self.site is None:
            return None, None
        for name, group in self.site.node_groups.items():
            if self.node in group.names():
                return name, group
        return None, None


def run_tool(argv, env=None, timeout=20, input=None):
    """Run a command on the fixed PATH -> (exit status, combined output). Never raises.

    stdin is always a pipe (``input``, or empty), never the caller's: runsc
    re-owns the stdio it is given to the sandbox's user, which would turn an
    inherited /dev/null into nobody's file (see slurmbox.sandbox.stdio_relay).
    """
    from slurmbox.slurm_client.commands import run_status

    full_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8"}
    full_env.update(env or {})
    return run_status(argv, env=full_env, timeout=timeout, input="" if input is None else input)


def parse_gres_conf(text, node):
    """GresLine entries of gres.conf ``text`` (gres.conf(5)) that apply to ``node``.

    Lines without NodeName apply to every node; ``File=`` ranges are expanded.
    Lines slurmbox cannot read (bad ranges) are skipped."""
    lines = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                fields[key.lower()] = value
        if "name" not in fields:
            continue
        try:
            if "nodename" in fields and node not in slurm_syntax.expand_hostlist(fields["nodename"]):
                continue
            files = slurm_syntax.expand_hostlist(fields["file"]) if "file" in fields else []
        except slurm_syntax.SyntaxProblem:
            continue
        lines.append(GresLine(fields["name"], fields.get("type", ""), files))
    return lines


def gather(node=None, slurm_conf=None, site_config=None, gres_conf=None, probes=None):
    """Build the NodeContext of this machine.

    Defaults: ``node`` = short host name; ``slurm_conf`` = $SLURM_CONF or
    /etc/slurm/slurm.conf; ``site_config`` and the runtime directory from the
    slurmbox line of plugstack.conf; ``gres_conf`` = gres.conf next to
    slurm.conf. ``probes``: {"nvidia"|"amd"|"rdma": probe} to use instead of
    the real libraries (tests). Never raises for missing files: they become
    what the checks report.
    """
    from slurmbox.doctor import hardware
    from slurmbox.sandbox.devices import vendor_of

    node = node or socket.gethostname().split(".")[0]
    slurm_conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    ctx = NodeContext(node=node, slurm_conf=slurm_conf)
    settings = None
    try:
        from slurmbox.settings.plugstack import PlugstackError, slurmbox_settings
        settings = slurmbox_settings(slurm_conf)
    except (PlugstackError, OSError, ValueError):
        settings = None
    if settings:
        ctx.runtime_dir = settings.get("runtime_dir") or ctx.runtime_dir
        ctx.plugstack_required = sorted(p for p in (settings.get("required_partitions") or "").split(",") if p)
    site_config = site_config or (settings or {}).get("site_config") or ""
    ctx.site_source = site_config
    if site_config:
        from slurmbox.settings.model import SiteConfigError, load_site_file
        try:
            ctx.site = load_site_file(site_config)
        except SiteConfigError as err:
            ctx.site_problem = "; ".join(err.lines()[:3]) + (" (and %d more)" % (len(err.lines()) - 3)
                                                              if len(err.lines()) > 3 else "")
    ctx.gres_conf = gres_conf or os.path.join(os.path.dirname(slurm_conf), "gres.conf")
    try:
        with open(ctx.gres_conf, errors="replace") as handle:  # Slurm reads bytes: a Latin-1 comment is fine
            ctx.gres = parse_gres_conf(handle.read(), node)
    except OSError:
        ctx.gres = None
    _, group = ctx.node_group()
    if group is not None and group.vendor and group.count:
        ctx.vendors.add(group.vendor)
    for line in ctx.gres or []:
        ctx.vendors.update(v for v in (vendor_of(f) for f in line.files) if v)
    probes = dict(probes or {})
    ctx.nvidia = probes["nvidia"] if "nvidia" in probes else hardware.probe_nvidia(hardware.import_nvml())
    ctx.amd = probes["amd"] if "amd" in probes else hardware.probe_amd(hardware.import_amdsmi())
    ctx.rdma = probes["rdma"] if "rdma" in probes else hardware.probe_rdma(hardware.import_pyverbs())
    return ctx
