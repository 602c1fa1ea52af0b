"""Doctor checks of the node's services and storage: site configuration,
node resources against `slurmd -C`, munge, slurmd and slurmctld reachable, cgroup version,
checkpoint store space."""

import os
import re

from slurmbox.doctor.context import TOOL_PATH, run_tool
from slurmbox.slurm_client import scontrol
from slurmbox.doctor.report import FAIL, NOT_PRESENT, PASS, WARN, Check

GROUP = "node"


def check_node(ctx, mounts_path="/proc/self/mounts"):
    """[Check] of this node's services and storage."""
    return [check_site(ctx), check_resources(ctx), check_munge(), check_slurmd(ctx), check_slurmctld(ctx),
            check_cgroup(mounts_path), check_checkpoint_store(ctx)]


def check_site(ctx):
    """The site configuration named in plugstack.conf (or given) loads and lists this node."""
    if ctx.site_problem:
        return Check("node.site-config", GROUP, FAIL, ctx.site_problem,
                     "fix it (`slurmbox config validate %s`)" % ctx.site_source)
    if ctx.site is None:
        return Check("node.site-config", GROUP, WARN, "no site configuration (no slurmbox line in the "
                     "plugstack.conf of %s, or it sets no site_config=)" % ctx.slurm_conf,
                     "deploy the plugstack.conf from `slurmbox config render`, or pass --site-config")
    name, _ = ctx.node_group()
    wanted = ctx.site.required_partitions()
    if ctx.plugstack_required is not None and ctx.plugstack_required != wanted:
        return Check("node.site-config", GROUP, FAIL,
                     "plugstack.conf says required_partitions=%s but %s marks %s as sandbox: required; the shim "
                     "and the supervisor would disagree" % (",".join(ctx.plugstack_required) or "(none)",
                                                            ctx.site_source, ",".join(wanted) or "none"),
                     "deploy the plugstack.conf that `slurmbox config render %s` writes" % ctx.site_source)
    if ctx.site.node_groups and name is None:
        return Check("node.site-config", GROUP, WARN, "%s is valid but no node group holds node %s"
                     % (ctx.site_source, ctx.node), "add the node to a node group, or pass --node NAME")
    return Check("node.site-config", GROUP, PASS, "%s valid (cluster %s%s)"
                 % (ctx.site_source, ctx.site.cluster, ", node group %s" % name if name else ""))


def parse_slurmd_c(text):
    """{key: value} of the first line of `slurmd -C` output ("NodeName=vm CPUs=2 ... RealMemory=24105")."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return dict(item.split("=", 1) for item in first.split() if "=" in item)


def check_resources(ctx, slurmd_c=None):
    """The site's CPUs and real_memory_mb for this node against what slurmd detects (`slurmd -C`).

    slurmd registers a node with fewer CPUs or less memory than slurm.conf
    says as invalid and Slurm drains it (slurm.conf(5), RealMemory)."""
    name, group = ctx.node_group()
    if group is None:
        return Check("node.resources", GROUP, NOT_PRESENT, "no node group of the site configuration holds %s; "
                     "nothing to compare" % ctx.node)
    if slurmd_c is None:
        status, slurmd_c = run_tool(["slurmd", "-C"])
        if status != 0:
            return Check("node.resources", GROUP, WARN, "`slurmd -C` failed (exit %d): %s" % (status, slurmd_c),
                         "install slurmd on this node")
    found = parse_slurmd_c(slurmd_c)
    try:
        cpus, memory = int(found["CPUs"]), int(found["RealMemory"])
    except (KeyError, ValueError):
        return Check("node.resources", GROUP, WARN, "cannot read `slurmd -C` output: %r" % slurmd_c[:200],
                     "run `slurmd -C` by hand")
    problems = []
    if group.cpus > cpus:
        problems.append("node group %s says cpus: %d but slurmd detects %d" % (name, group.cpus, cpus))
    if group.real_memory_mb > memory:
        problems.append("node group %s says real_memory_mb: %d but slurmd detects RealMemory=%d"
                        % (name, group.real_memory_mb, memory))
    if problems:
        return Check("node.resources", GROUP, FAIL, "; ".join(problems) + " (Slurm would drain the node)",
                     "correct the node group (or the hardware) and render slurm-nodes.conf again")
    return Check("node.resources", GROUP, PASS, "node group %s (cpus %d, real_memory_mb %d) fits what slurmd "
                 "detects (CPUs=%d RealMemory=%d)" % (name, group.cpus, group.real_memory_mb, cpus, memory))


def check_munge():
    """A munge credential can be made and decoded (munge(1), unmunge(1))."""
    status, output = run_tool(["sh", "-c", "munge -n | unmunge"])
    if status == 0 and "STATUS:" in output and "Success" in output:
        return Check("node.munge", GROUP, PASS, "munged answers: a credential was encoded and decoded")
    # When munge cannot reach munged, unmunge then only says "No credential specified": name
    # every error line, munge's (the cause) first.
    errors = [line.strip() for line in output.splitlines() if "Error:" in line]
    return Check("node.munge", GROUP, FAIL, "munge -n | unmunge failed (exit %d): %s"
                 % (status, "; ".join(errors) or (output.splitlines()[-1] if output else "no output")),
                 "start munged (systemctl start munge) with the cluster's /etc/munge/munge.key")


def _no_slurm_conf(ctx, check_id, daemon):
    if os.path.isfile(ctx.slurm_conf):
        return None
    return Check(check_id, GROUP, FAIL, "no slurm.conf at %s, so %s cannot be asked" % (ctx.slurm_conf, daemon),
                 "install the cluster's slurm.conf there, or pass --slurm-conf / set SLURM_CONF")


def _slurm_env(ctx):
    return {"PATH": TOOL_PATH, "LANG": "C.UTF-8", "SLURM_CONF": ctx.slurm_conf}


def check_slurmd(ctx):
    """The node's slurmd answers (`scontrol show slurmd` asks the local slurmd)."""
    missing = _no_slurm_conf(ctx, "node.slurmd", "slurmd")
    if missing:
        return missing
    status, output = scontrol.slurmd_text(env=_slurm_env(ctx))
    if status == 0 and output:
        state = next((l.split("=", 1)[1].strip() for l in output.splitlines() if "Slurmd PID" in l), "")
        return Check("node.slurmd", GROUP, PASS, "slurmd answers%s" % (" (pid %s)" % state if state else ""))
    return Check("node.slurmd", GROUP, FAIL, "slurmd does not answer with SLURM_CONF=%s (exit %d): %s"
                 % (ctx.slurm_conf, status, output.splitlines()[-1] if output else "no output"),
                 "start slurmd on this node (systemctl start slurmd) and check its log")


#: One controller line of `scontrol ping`: role (primary, backup, backupN), host, state
#: (Slurm src/scontrol/scontrol.c _ping_slurmctld: "Slurmctld(%s) at %s is %s"; exit 0 when any is UP).
_PING_LINE = re.compile(r"^Slurmctld\((\w+)\) at (\S+) is (UP|DOWN)\s*$", re.M)


def check_slurmctld(ctx):
    """slurmctld answers (`scontrol ping`): pass when every controller is UP, warn when one answers
    and another (primary or backup) is DOWN, fail when none answers."""
    missing = _no_slurm_conf(ctx, "node.slurmctld", "slurmctld")
    if missing:
        return missing
    status, output = scontrol.ping_text(env=_slurm_env(ctx))
    # scontrol ping prints one "Slurmctld(primary) at HOST is UP|DOWN" line per controller, and a
    # "** RESTORE SLURMCTLD DAEMON TO SERVICE **" banner of asterisks when one is down.
    said = "; ".join(l.strip() for l in output.splitlines() if l.strip() and not l.strip().startswith("*"))
    states = _PING_LINE.findall(output)
    down = ["%s (%s)" % (host, role) for role, host, state in states if state == "DOWN"]
    up = any(state == "UP" for _role, _host, state in states) or (not states and "is UP" in output)
    if status == 0 and up:
        if down:  # another controller answers: jobs run, with fewer controllers than slurm.conf lists
            return Check("node.slurmctld", GROUP, WARN, said,
                         "restore slurmctld on %s; until then the cluster runs on fewer controllers than "
                         "slurm.conf lists (SlurmctldHost)" % ", ".join(down))
        return Check("node.slurmctld", GROUP, PASS, said)
    return Check("node.slurmctld", GROUP, FAIL, "slurmctld is not reachable with SLURM_CONF=%s (exit %d): %s"
                 % (ctx.slurm_conf, status, said or "no output"),
                 "check SlurmctldHost in slurm.conf, the network and that slurmctld runs")


def cgroup_layout(mounts_text):
    """"v2", "hybrid", "v1" or "none" from /proc/mounts text."""
    at = {}
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            at.setdefault(fields[2], set()).add(fields[1])
    if "/sys/fs/cgroup" in at.get("cgroup2", set()):
        return "v2"
    if at.get("cgroup"):
        return "hybrid" if at.get("cgroup2") else "v1"
    return "none"


def check_cgroup(mounts_path="/proc/self/mounts"):
    """The cgroup layout Slurm's task/cgroup and ConstrainDevices will use."""
    try:
        with open(mounts_path) as handle:
            layout = cgroup_layout(handle.read())
    except OSError as err:
        return Check("node.cgroup", GROUP, FAIL, "cannot read %s: %s" % (mounts_path, err.strerror),
                     "run doctor on a Linux node with /proc mounted")
    if layout == "v2":
        return Check("node.cgroup", GROUP, PASS, "cgroup v2 (unified) at /sys/fs/cgroup")
    if layout == "none":
        return Check("node.cgroup", GROUP, FAIL, "no cgroup file system is mounted",
                     "mount cgroup2 at /sys/fs/cgroup; Slurm's ConstrainDevices needs cgroups")
    return Check("node.cgroup", GROUP, WARN, "cgroup %s: controllers on v1 hierarchies" % layout,
                 "boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2 (Slurm's cgroup/v2 plugin); "
                 "v1 works with CgroupPlugin=cgroup/v1")


def check_checkpoint_store(ctx):
    """The checkpoint store exists, is a directory, and has min_free_mb free (statvfs)."""
    from slurmbox.settings.compiled import CheckpointStore

    store = ctx.site.checkpoint_store if ctx.site is not None else CheckpointStore()
    path, floor = store.path, store.min_free_mb
    if not os.path.isdir(path):
        uses = ctx.site is not None and any(p.checkpoint.mode != "none" for p in ctx.site.partitions.values())
        return Check("node.checkpoint-store", GROUP, FAIL if uses else WARN,
                     "checkpoint store %s does not exist on this node" % path,
                     "mount the shared checkpoint file system at %s (or create the directory)" % path)
    try:
        info = os.statvfs(path)
    except OSError as err:
        return Check("node.checkpoint-store", GROUP, FAIL, "cannot stat %s: %s" % (path, err.strerror),
                     "check the mount of %s" % path)
    free_mb = info.f_bavail * info.f_frsize // (1024 * 1024)
    total_mb = info.f_blocks * info.f_frsize // (1024 * 1024)
    summary = "%s: %d MB free of %d MB (floor %d MB)" % (path, free_mb, total_mb, floor)
    if free_mb < floor:
        return Check("node.checkpoint-store", GROUP, FAIL, summary,
                     "free space in %s or lower checkpoint_store.min_free_mb; checkpoints are refused below it"
                     % path)
    if free_mb < 2 * floor or (total_mb and free_mb * 10 < total_mb):
        return Check("node.checkpoint-store", GROUP, WARN, summary,
                     "free space in %s soon (keep_last=%d images per job)" % (path, store.keep_last))
    return Check("node.checkpoint-store", GROUP, PASS, summary)
