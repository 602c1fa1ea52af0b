"""Slurm mode: each candidate runs as its own sandboxed Slurm step (``srun --sandbox``).

The harness runs as the job's user inside an allocation (a batch script or
``salloc``), outside any sandbox, and starts for every candidate::

    srun --sandbox --sandbox-network=none -N1 -n1 -u --chdir=STAGE/code \\
         --sandbox-mounts=STAGE/code:/candidate:ro,PYTHON_PREFIX:PYTHON_PREFIX:ro \\
         --sandbox-workdir=/tmp PYTHON -I /mnt/runner.py --stdio /mnt/candidate.py

slurmbox's SPANK plugin puts the step in a gVisor sandbox (see the README's
security model). The channel is the step's stdin/stdout, relayed by srun;
the runner moves it off fd 0/1 before importing the candidate, so the
candidate's prints go to stderr and never into the channel. ``--chdir``
makes the stage directory the step's working directory, which slurmbox binds
into the sandbox; the harness's own directory (task file, records) is
never bound. Everything else
is the local mode's harness: secret inputs, the separate reference process,
checks outside, the harness's clock around each request/response.

The kernel CPU-time cross-check (exploit 1: work left running after the
answer): the root supervisor of every sandboxed step puts the sandbox in its
own cgroup and writes that cgroup's CPU-time file (cgroup v1
``cpuacct.usage``, v2 ``cpu.stat``; sandbox/step_cgroup.py) into the record
the job's user can read (``sandbox.owner.json``, sandbox/registry.py). Each
candidate's step gets a random step name (``--job-name``); after the runner's
hello the harness asks Slurm (``squeue --steps``) which step id and node carry
that name, and when the step runs on the harness's own node
(``SLURMD_NODENAME``, else the short host name) reads the record and the
counter around every sample, as in local mode. When the harness runs on a
node of its allocation (a batch script), its steps are placed there
(``--nodelist``) unless ``srun_args`` choose nodes. Otherwise the record says
why there is no cross-check (``cpu_accounting: off`` and
``cpu_accounting_detail``, e.g. "step 12.3 runs on node n2, the harness on
login1") and ``cpu_ns`` is -1.

Not in this mode: slurmbox's own cpuset pinning; ask Slurm for the CPUs
instead (``--exclusive``, ``--cpu-bind``, task/affinity or task/cgroup on the
cluster). srun's stdio relay costs tens of ms per sample here and varies, so
small kernels are dominated by it and a claim below the harness's window is
not judged (one above it still is). The stage directory (candidate, runner)
is created under the current directory, readable by the job's user only.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile

from slurmbox.measure import candidate_sandbox as cs
from slurmbox.measure import isolation, protocol

#: srun options that choose the step's nodes; with none of them the harness's own node is asked for.
NODE_OPTIONS = ("-w", "--nodelist", "-x", "--exclude", "-r", "--relative", "-F", "--nodefile")
#: Names of the CPU-time files a step's record may point at (sandbox/step_cgroup.py).
ACCOUNTING_FILES = ("cpuacct.usage", "cpu.stat")


#: Single-threaded math libraries in the step, as in local mode (candidate_sandbox.py): an idle
#: OpenBLAS/OpenMP pool spins for ~0.1 s after each call, which the CPU cross-check would count as
#: work after the answer. A candidate may still start threads of its own.
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def step_environment():
    """The environment srun passes to a candidate's step: the harness's, with THREAD_ENV."""
    return dict(os.environ, **THREAD_ENV)


def harness_node():
    """The Slurm node name this process runs on: ``SLURMD_NODENAME`` (set by slurmd in batch scripts and
    steps), else the short host name (a login node, or ``salloc``'s shell)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def find_step(job, step_name, env=None):
    """(step id ``JOB.STEP``, [node names]) of the step of ``job`` named ``step_name``, from ``squeue --steps``.

    Returns None when no such step is listed. Raises slurm_client.scontrol.SlurmCommandError.
    """
    from slurmbox.slurm_client.scontrol import expand_hostlist, job_steps

    for step_id, name, nodes in job_steps(job, env=env):
        if name == step_name:
            return step_id, (expand_hostlist(nodes, env=env) if "[" in nodes else [n for n in nodes.split(",") if n])
    return None


def step_accounting(job, step_name, here=None, runtime_dir=None, uid=None):
    """Where the kernel's CPU time of the sandbox of ``job``'s step named ``step_name`` can be read from here.

    Returns ``(file or None, details dict)``: ``details`` has ``step``, ``node``,
    ``harness_node``, ``cpu_accounting`` ("on"/"off") and
    ``cpu_accounting_detail`` (what is read, or why nothing is). The file is
    the one the step's own sandbox record (``sandbox.owner.json`` in
    ``runtime_dir``/NODE/JOB.STEP, owned by ``uid``) names, and only when the
    step runs on this node (``here``, default :func:`harness_node`).
    ``runtime_dir`` defaults to slurmbox's plugstack setting. Never raises.
    """
    from slurmbox.sandbox import registry, step_cgroup

    here = here or harness_node()
    uid = os.getuid() if uid is None else uid
    details = {"step": "", "node": "", "harness_node": here, "cpu_accounting": "off", "cpu_accounting_detail": ""}

    def off(why):
        details["cpu_accounting_detail"] = "no kernel CPU-time cross-check: " + why
        return None, details

    try:
        found = find_step(job, step_name)
    except Exception as err:  # SlurmCommandError, or squeue missing: say so in the record
        return off("cannot ask Slurm for the step (%s)" % err)
    if found is None:
        return off("squeue does not list a step named %s in job %s" % (step_name, job))
    step_id, nodes = found
    details["step"], details["node"] = step_id, ",".join(nodes)
    if nodes != [here]:
        return off("step %s runs on node %s, the harness on %s (run the harness on a node of the allocation, "
                   "e.g. in the batch script, so that its steps run next to it)" % (step_id, ",".join(nodes), here))
    if runtime_dir is None:
        from slurmbox.settings.plugstack import PlugstackError, slurmbox_settings
        try:
            runtime_dir = slurmbox_settings()["runtime_dir"]
        except (PlugstackError, OSError, KeyError) as err:
            return off("slurmbox's runtime directory is not known here (%s)" % err)
    record_path = os.path.join(runtime_dir, here, step_id, registry.OWNER_RECORD_NAME)
    try:
        with open(record_path) as handle:
            owner = os.fstat(handle.fileno()).st_uid
            record = json.load(handle)
    except (OSError, ValueError) as err:
        return off("cannot read the step's sandbox record %s (%s)" % (record_path, err))
    if not isinstance(record, dict):
        return off("the step's sandbox record %s is not a JSON object" % record_path)
    account = record.get("cpu_accounting")
    job_id, _, step = step_id.partition(".")
    if owner != uid or record.get("id") != step_id or record.get("node") != here or record.get("uid") != uid:
        return off("the sandbox record %s is not this user's step %s on %s" % (record_path, step_id, here))
    if not isinstance(account, dict) or not account.get("file"):
        return off("the step's sandbox has no cgroup of its own (record %s)" % record_path)
    path = os.path.realpath(str(account["file"]))
    directory = os.path.basename(os.path.dirname(path))
    if not path.startswith(step_cgroup.CGROUP_ROOT + "/") or os.path.basename(path) not in ACCOUNTING_FILES or \
            directory != step_cgroup.cgroup_name(job_id, step, here, runtime_dir):
        return off("the record names %s, not a CPU-time file of the step's cgroup" % path)
    probe = isolation.CpuAccount(account.get("cgroups_path"), path=path)
    try:
        if probe.read() is None:
            return off("cannot read %s" % path)
    finally:
        probe.close()
    details["cpu_accounting"] = "on"
    details["cpu_accounting_detail"] = "kernel CPU time of step %s's sandbox on %s, cgroup v%s %s" % (
        step_id, here, account.get("version", "?"), path)
    details["cpu_accounting_file"] = path
    details["cgroups_path"] = account.get("cgroups_path", "")
    return path, details


class SlurmStepCandidate(cs._Candidate):
    """A candidate in a sandboxed Slurm step. ``srun_args``: extra srun options (list of str).

    Raises candidate_sandbox.SandboxStartError when srun is missing or the step does not come up.
    """

    def __init__(self, candidate_path, label, srun_args=(), start_timeout=120.0):
        super().__init__(candidate_path, label, os.getuid(), os.getgid(), start_timeout)
        self.srun_args = list(srun_args)
        self.cgroups_path = None
        self.accounting_file = None   # the sandbox cgroup's CPU-time file, when readable here (step_accounting)
        self.step_name = "slurmbox-measure-" + secrets.token_hex(6)
        self.workdir = tempfile.mkdtemp(prefix=".slurmbox-measure-", dir=os.getcwd())
        self.code_dir = os.path.join(self.workdir, "code")
        self.channel_dir = os.path.join(self.workdir, "channel")
        self.config = {}

    def _stage(self):
        os.chmod(self.workdir, 0o700)
        os.makedirs(self.code_dir, mode=0o755)
        here = os.path.dirname(os.path.abspath(__file__))
        for name in cs.RUNNER_FILES:
            shutil.copyfile(os.path.join(here, name), os.path.join(self.code_dir, name))
        shutil.copyfile(self.candidate_path, os.path.join(self.code_dir, "candidate.py"))

    def command(self):
        """The srun command line (list) of this candidate's step."""
        srun = shutil.which("srun")
        if not srun:
            raise cs.SandboxStartError("srun is not on PATH; Slurm mode runs inside a Slurm allocation")
        mounts = ["%s:%s:ro" % (self.code_dir, cs.SANDBOX_MOUNT)]
        for prefix in sorted({sys.prefix, sys.base_prefix}):
            if prefix not in ("/usr", "/"):
                mounts.append("%s:%s:ro" % (os.path.realpath(prefix), prefix))
        # --chdir: slurmbox binds the step's working directory into the sandbox read-write; it must
        # be this stage directory, never the harness's own (task file, records).
        placement = []
        if os.environ.get("SLURMD_NODENAME") and not any(a.split("=")[0] in NODE_OPTIONS or
                                                          (a[:2] in ("-w", "-x", "-r", "-F") and len(a) > 2)
                                                          for a in self.srun_args):
            placement = ["--nodelist=" + os.environ["SLURMD_NODENAME"]]  # next to the harness: CPU cross-check
        return [srun, "--sandbox", "--sandbox-network=none", "-N1", "-n1", "-u", "--chdir=" + self.code_dir,
                "--job-name=" + self.step_name, *placement,
                "--sandbox-mounts=" + ",".join(mounts), "--sandbox-workdir=/tmp", *self.srun_args,
                sys.executable, "-I", cs.SANDBOX_MOUNT + "/runner.py", "--stdio", cs.SANDBOX_MOUNT + "/candidate.py"]

    def start(self):
        """Stage the files, start the srun step and read the runner's hello. Raises SandboxStartError."""
        try:
            self._stage()
            argv = self.command()
            self.config = {"runtime": "slurm step (srun --sandbox)", "srun": argv[:-5], "uid": self.uid,
                           "job": os.environ.get("SLURM_JOB_ID", "")}
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=step_environment(),
                                         stderr=subprocess.PIPE, close_fds=True)
            self.drains = [cs._Drain(self.proc.stderr)]
            self.drains[0].start()
            self.conn = protocol.PipeChannel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
            self.conn.settimeout(self.start_timeout)
            try:
                hello = protocol.recv_header(self.conn)
            except (protocol.ProtocolError, OSError) as err:
                raise cs.SandboxStartError("the candidate's step did not greet the harness (%s):\n%s"
                                           % (err, self.stderr_text()))
            if hello["op"] != "hello":
                raise cs.SandboxStartError("the candidate failed to load:\n%s" % str(hello.get("error", ""))[-2000:])
            # The step runs (its sandbox record is written before the sandbox starts): find its CPU time.
            self.accounting_file, details = step_accounting(self.config["job"], self.step_name)
            self.config.update(details)
            self.cgroups_path = details.get("cgroups_path") or None
        except BaseException:
            self.stop()
            raise

    def cpu_account(self):
        """The harness's reader of the sandbox's kernel CPU time (isolation.CpuAccount), or a NullAccount."""
        if self.accounting_file is None:
            return isolation.NullAccount()
        return isolation.CpuAccount(self.cgroups_path, path=self.accounting_file)

    def stdout_text(self):
        return ""

    def stderr_text(self):
        return self.drains[0].text() if self.drains else ""

    def logs(self):
        return "--- stderr ---\n" + self.stderr_text()

    def channel_leftovers(self):
        return []

    def _stop(self):
        """Close the channel (the step ends), wait for srun, remove the stage directory."""
        if self.conn is not None:
            try:
                self.conn.settimeout(2)
                protocol.send(self.conn, {"op": "exit"})
            except OSError:
                pass
            self.conn = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._wait_drains()
        shutil.rmtree(self.workdir, ignore_errors=True)
