"""A real multi-node Slurm cluster on one machine, for trying and testing slurmbox.

Each node is a real ``slurmd`` in its own network namespace and UTS namespace
(hostname ``n1``, ``n2`` ...), joined by a bridge to the real ``slurmctld`` in
the root namespace; ``munged`` authenticates. Nodes get fake GPU device nodes
(char devices with NVIDIA's major number, never opened) declared in
``gres.conf``, the installed slurmbox SPANK shim in ``plugstack.conf``, and
three partitions: ``ondemand`` (default), ``spot`` (preemptible, requeue with
grace time) and ``secure`` (sandbox required). Everything lives under one
directory and ``down`` removes it all.
"""

import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

from slurmbox.settings.slurm_syntax import SyntaxProblem, expand_hostlist
from slurmbox.slurm_client import scontrol
from slurmbox.settings.plugstack import plugstack_line

NVIDIA_MAJOR = 195          # Documentation/admin-guide/devices.txt: NVIDIA char devices
DEFAULT_PREFIX = "/opt/slurmbox"
STATE_FILE = "cluster.json"


_SUBNET_LOCKS = []


def claim_free_subnet(first=20, last=249):
    """A dev-cluster subnet number (``first``..``last``) no other cluster on this machine uses.

    A subnet is taken when its bridge ``sbx<N>br`` exists or another process
    holds its lock file ``/run/lock/slurmbox-dev-subnet-<N>.lock``; the lock
    is kept (open and flocked) until this process exits, so concurrent test
    sessions and benchmarks never pick the same one. Raises DevClusterError
    when none is free.
    """
    import fcntl

    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for number in range(first, last + 1):
        if " sbx%dbr:" % number in links or " sbx%dbr@" % number in links:
            continue
        lock = open("/run/lock/slurmbox-dev-subnet-%d.lock" % number, "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _SUBNET_LOCKS.append(lock)
        return number
    raise DevClusterError("no free dev-cluster subnet between %d and %d" % (first, last))


class DevClusterError(RuntimeError):
    """The dev cluster could not be started or stopped; the message says what to do."""


def _run(cmd, check=True, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise DevClusterError("%s failed (exit %d): %s" % (" ".join(cmd), result.returncode,
                                                           (result.stderr or result.stdout).strip()))
    return result


class DevCluster:
    """One dev cluster rooted at ``directory``.

    ``nodes``: number of slurmd nodes; ``gpus_per_node``: fake GPUs each;
    ``subnet``: third octet of the private 10.213.X.0/24 bridge network and
    port offset, so two clusters on one machine do not collide.

    Booting from other files (all default to the built-in cluster):

    - ``nodes_conf``: slurm.conf text that replaces the built-in GresTypes,
      PreemptType/PreemptMode, node and partition lines, e.g. what
      ``slurmbox config render`` wrote. Its nodes must be named n1..nN and
      use NodeAddr=address(i) (node i's namespace address).
    - ``extra_slurm_conf``: text appended to slurm.conf as is (e.g.
      ``TopologyPlugin=topology/tree``).
    - ``extra_files``: {file name: text} written into the etc directory next
      to slurm.conf (e.g. ``topology.conf``); a name the cluster writes itself
      (gres.conf, cgroup.conf, plugstack.conf, site.yaml) is replaced by the
      given text, as is.

    Raises DevClusterError, before anything starts, when ``nodes_conf`` names
    other nodes or a given plugstack.conf names another ``site_config=`` or
    ``runtime_dir=`` than this cluster's (the message says what to set in the
    site file).
    """

    def __init__(self, directory, nodes=2, gpus_per_node=2, subnet=7, prefix=DEFAULT_PREFIX,
                 nodes_conf=None, extra_slurm_conf="", extra_files=None):
        self.dir = os.path.abspath(directory)
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.subnet = subnet
        self.prefix = prefix
        self.tag = "sbx%d" % subnet
        self.bridge = "%sbr" % self.tag
        self.ctld_port = 16817 + 10 * subnet
        self.slurmd_port = self.ctld_port + 1
        self.node_names = ["n%d" % (i + 1) for i in range(nodes)]
        self.nodes_conf = nodes_conf
        self.extra_slurm_conf = extra_slurm_conf or ""
        self.extra_files = dict(extra_files or {})
        for name in self.extra_files:
            if "/" in name or name in ("", ".", "..", "slurm.conf", STATE_FILE):
                raise DevClusterError("extra file name %r: give a plain file name other than slurm.conf" % name)
        problems = self._given_files_problems()
        if problems:
            raise DevClusterError("the rendered files do not fit this dev cluster:\n  " + "\n  ".join(problems))

    def _given_files_problems(self):
        """What in ``nodes_conf`` and a given plugstack.conf this cluster cannot boot from (list of str)."""
        problems = []
        for match in re.finditer(r"^\s*NodeName=(\S+)", self.nodes_conf or "", re.M):
            try:
                names = expand_hostlist(match.group(1))
            except SyntaxProblem as err:
                problems.append("slurm-nodes.conf: NodeName=%s: %s" % (match.group(1), err))
                continue
            stray = [name for name in names if name not in self.node_names]
            if stray:
                problems.append("slurm-nodes.conf names node(s) %s; the dev cluster's nodes are %s (name the site's "
                                "nodes n1..n%d, with node_addr 10.213.%d.11, .12, ...)"
                                % (",".join(stray[:4]) + (",..." if len(stray) > 4 else ""),
                                   ",".join(self.node_names), self.nodes, self.subnet))
        plugstack = dict(re.findall(r"(site_config|runtime_dir)=(\S+)", self.extra_files.get("plugstack.conf", "")))
        for key, want, setting in (("site_config", self.site_config, "slurmbox.settings"),
                                   ("runtime_dir", self.runtime_dir, "slurmbox.runtime_dir")):
            if key in plugstack and plugstack[key] != want:
                problems.append("plugstack.conf has %s=%s; this dev cluster needs %s (set %s: %s in the site file "
                                "and render again)" % (key, plugstack[key], want, setting, want))
        return problems

    # -- paths ---------------------------------------------------------------------
    @property
    def conf(self):
        """Path of slurm.conf; export it as SLURM_CONF."""
        return os.path.join(self.dir, "etc", "slurm.conf")

    @property
    def runtime_dir(self):
        """slurmbox's runtime directory for this cluster's nodes."""
        return os.path.join(self.dir, "run", "slurmbox")

    @property
    def site_config(self):
        """The site configuration the plugin reads."""
        return os.path.join(self.dir, "etc", "site.yaml")

    def netns(self, node):
        """Network namespace name of ``node``."""
        return "%s-%s" % (self.tag, node)

    def address(self, index):
        """IPv4 address of node ``index`` (1-based; 0 is the controller)."""
        return "10.213.%d.%d" % (self.subnet, 1 if index == 0 else 10 + index)

    def env(self):
        """Environment for Slurm clients talking to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = self.conf
        return env

    # -- up --------------------------------------------------------------------------
    def up(self):
        """Create and start everything; returns the SLURM_CONF path."""
        if os.geteuid() != 0:
            raise DevClusterError("slurmbox dev-cluster must run as root (it starts daemons and namespaces)")
        for tool in ("slurmctld", "slurmd", "munged", "runsc", "ip", "nsenter", "unshare"):
            if not shutil.which(tool):
                raise DevClusterError("%s is not installed; run the README's install command first" % tool)
        plugin = os.path.join(self.prefix, "lib", "slurmbox_spank.so")
        if not os.path.exists(plugin):
            raise DevClusterError("%s is missing; run 'slurmbox plugin install' first" % plugin)
        if os.path.exists(os.path.join(self.dir, STATE_FILE)):
            raise DevClusterError("a dev cluster already uses %s; run 'slurmbox dev-cluster down --dir %s'"
                                  % (self.dir, self.dir))
        if os.path.lexists(self.dir):
            info = os.lstat(self.dir)
            if not os.path.isdir(self.dir) or os.path.islink(self.dir) or info.st_uid != 0 or info.st_mode & 0o022:
                raise DevClusterError("%s exists and is not a root-owned directory writable only by root; "
                                      "remove it or choose another --dir" % self.dir)
        for sub in ("etc", "state", "log", "pid", "dev", "run/slurmbox", "checkpoints"):  # checkpoints: site.yaml's store
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        for path in (self.dir, os.path.join(self.dir, "etc"), os.path.join(self.dir, "run"), self.runtime_dir,
                     os.path.join(self.dir, "checkpoints")):
            os.chmod(path, 0o755)
        self._save_state()
        try:
            self._start_munge()
            self._make_devices()
            self._write_configs(plugin)
            self._make_network()
            self._start_daemons()
            self.wait_idle()
        except BaseException:
            self.down()
            raise
        return self.conf

    def _save_state(self):
        state = {"dir": self.dir, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                 "subnet": self.subnet, "prefix": self.prefix, "nodes_conf": self.nodes_conf,
                 "extra_slurm_conf": self.extra_slurm_conf, "extra_files": self.extra_files}
        with open(os.path.join(self.dir, STATE_FILE), "w") as handle:
            json.dump(state, handle)

    @classmethod
    def load(cls, directory):
        """The DevCluster recorded in ``directory``. Raises DevClusterError if none."""
        try:
            with open(os.path.join(directory, STATE_FILE)) as handle:
                state = json.load(handle)
        except OSError:
            raise DevClusterError("no dev cluster in %s" % directory)
        return cls(state["dir"], state["nodes"], state["gpus_per_node"], state["subnet"], state["prefix"],
                   state.get("nodes_conf"), state.get("extra_slurm_conf", ""), state.get("extra_files"))

    def _start_munge(self):
        if _run(["sh", "-c", "munge -n | unmunge"], check=False).returncode == 0:
            return
        if not os.path.exists("/etc/munge/munge.key"):
            _run(["mungekey", "--create"], check=False)
        os.makedirs("/run/munge", exist_ok=True)
        _run(["chown", "munge:munge", "/run/munge"], check=False)
        _run(["runuser", "-u", "munge", "--", "munged"])
        _run(["sh", "-c", "munge -n | unmunge"])

    def _make_devices(self):
        devdir = os.path.join(self.dir, "dev")
        for index in range(self.gpus_per_node):
            path = os.path.join(devdir, "nvidia%d" % index)
            if not os.path.exists(path):
                os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
        for name, minor in (("nvidiactl", 255),):
            path = os.path.join(devdir, name)
            if not os.path.exists(path):
                os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))

    def _write_configs(self, plugin):
        d = self.dir
        host = socket.gethostname()
        gres = "Gres=gpu:h100:%d " % self.gpus_per_node if self.gpus_per_node else ""
        node_lines = "".join("NodeName=%s NodeAddr=%s CPUs=2 RealMemory=2000 %sState=UNKNOWN\n"
                             % (n, self.address(i + 1), gres) for i, n in enumerate(self.node_names))
        nodes = "n[1-%d]" % self.nodes if self.nodes > 1 else "n1"
        builtin = f"""GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{node_lines}PartitionName=ondemand Nodes={nodes} Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=spot Nodes={nodes} PriorityTier=1 PreemptMode=REQUEUE GraceTime=30 MaxTime=INFINITE State=UP
PartitionName=secure Nodes={nodes} PriorityTier=10 MaxTime=INFINITE State=UP
"""
        node_section = builtin if self.nodes_conf is None else self.nodes_conf
        if node_section and not node_section.endswith("\n"):
            node_section += "\n"
        extra = self.extra_slurm_conf
        if extra and not extra.endswith("\n"):
            extra += "\n"
        conf = f"""# Generated by slurmbox dev-cluster; removed by 'slurmbox dev-cluster down'.
ClusterName=slurmbox-dev{self.subnet}
SlurmctldHost={host}({self.address(0)})
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/state/slurmd-%n
SlurmctldPidFile={d}/pid/slurmctld.pid
SlurmdPidFile={d}/pid/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
PlugStackConfig={d}/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
AuthInfo=cred_expire=20
MinJobAge=30
InactiveLimit=0
SlurmdTimeout=60
{node_section}{extra}"""
        gres_conf = "".join("NodeName=%s Name=gpu Type=h100 File=%s/dev/nvidia[0-%d]\n"
                            % (n, d, self.gpus_per_node - 1) for n in self.node_names) if self.gpus_per_node else ""
        site = f"""# slurmbox site configuration of the dev cluster.
cluster: slurmbox-dev{self.subnet}
checkpoint_store:
  path: {d}/checkpoints
profiles:
  default:
    network: none
    allowed_networks: [none, sandbox, host]
  strict:
    network: none
    allowed_networks: [none]
    allow_custom_image: false
  limited:
    network: none
    memory_limit_mb: 192
    wall_limit: "0:08"
partitions:
  secure:
    sandbox: required
    default_profile: strict
    allowed_profiles: [strict]
"""
        python = os.path.join(self.prefix, "venv", "bin", "python3")
        launcher = os.path.join(self.prefix, "libexec", "slurmbox-launch")
        files = {
            "slurm.conf": conf,
            "gres.conf": gres_conf,
            "cgroup.conf": "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n",
            "plugstack.conf": plugstack_line(plugin, python, launcher, self.runtime_dir, self.site_config,
                                             ["secure"]),
            "site.yaml": site,
        }
        files.update(self.extra_files)
        for name, text in files.items():
            path = os.path.join(d, "etc", name)
            with open(path, "w") as handle:
                handle.write(text)
            os.chmod(path, 0o644)

    def _make_network(self):
        self._remove_network()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", self.address(0) + "/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i, node in enumerate(self.node_names, start=1):
            ns, host_end = self.netns(node), "%sv%d" % (self.tag, i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", host_end, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", self.address(i) + "/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _start_daemons(self):
        env = self.env()
        _run(["slurmctld", "-c", "-f", self.conf], env=env)
        for node in self.node_names:
            _run(["nsenter", "--net=/var/run/netns/%s" % self.netns(node), "unshare", "--uts", "sh", "-c",
                  'hostname "$0" && exec slurmd -f "$1" -N "$0"', node, self.conf], env=env)

    def wait_idle(self, timeout=60.0):
        """Wait until every node reports idle (polls sinfo; Slurm offers no event). Raises on timeout."""
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            try:
                rows = scontrol.node_states(env=self.env())
            except scontrol.SlurmCommandError as err:
                rows, states = [], str(err)
            else:
                states = "; ".join(" ".join(row) for row in rows)
            seen = {node: state for node, _partition, state in rows}
            if sorted(seen) == sorted(self.node_names) and all(s == "idle" for s in seen.values()):
                return
            time.sleep(0.25)
        raise DevClusterError("nodes did not become idle within %.0f s (sinfo: %r); see %s/log"
                              % (timeout, states, self.dir))

    # -- down / status ---------------------------------------------------------------
    def _pids(self):
        pids = {}
        piddir = os.path.join(self.dir, "pid")
        for name in sorted(os.listdir(piddir)) if os.path.isdir(piddir) else []:
            try:
                with open(os.path.join(piddir, name)) as handle:
                    pids[name[:-4]] = int(handle.read().strip())
            except (OSError, ValueError):
                continue
        return pids

    def down(self):
        """Stop the daemons, remove sandboxes, namespaces, bridge and the directory."""
        pids = self._pids()
        for pid in pids.values():
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in pids.values():
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal(pid, signal.SIGKILL)
        for pid in self._step_processes():  # slurmstepd outlives slurmd: kill this cluster's steps
            _signal(pid, signal.SIGKILL)
        if os.path.isdir(self.runtime_dir):
            from slurmbox.sandbox.cleanup import remove_step
            for node in os.listdir(self.runtime_dir):
                node_dir = os.path.join(self.runtime_dir, node)
                for entry in os.listdir(node_dir) if os.path.isdir(node_dir) else []:
                    if entry not in ("runsc", "log") and os.path.isdir(os.path.join(node_dir, entry)):
                        remove_step(os.path.join(node_dir, entry), self.runtime_dir)
        self._remove_network()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _step_processes(self):
        """Pids of this cluster's slurmstepd processes (environment names our slurm.conf) and their descendants."""
        needle = ("SLURM_CONF=%s" % self.conf).encode()
        parents, stepds = {}, set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % entry, "rb") as handle:
                    if not handle.read().startswith(b"slurmstepd"):
                        continue
                with open("/proc/%s/environ" % entry, "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        stepds.add(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        found = set(stepds)
        grew = True
        while grew:
            children = {pid for pid, parent in parents.items() if parent in found} - found
            found |= children
            grew = bool(children)
        return sorted(found)

    def _remove_network(self):
        for index, node in enumerate(self.node_names, start=1):
            _run(["ip", "link", "delete", "%sv%d" % (self.tag, index)], check=False)
            _run(["ip", "netns", "delete", self.netns(node)], check=False)
        _run(["ip", "link", "delete", self.bridge], check=False)

    def status(self):
        """Dict: directory, SLURM_CONF, daemons and whether each runs, sinfo lines."""
        daemons = {name: _alive(pid) for name, pid in self._pids().items()}
        try:
            nodes = [" ".join(row) for row in scontrol.node_states(env=self.env())]
        except scontrol.SlurmCommandError as err:
            nodes = ["sinfo: %s" % err]
        return {"dir": self.dir, "slurm_conf": self.conf, "daemons": daemons, "nodes": nodes}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def default_user():
    """Name of the invoking user (for messages)."""
    return getpass.getuser()
